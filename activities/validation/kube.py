"""Kubernetes side of the validation activities (verdict rules: :mod:`activities.validation.base`).

Placement: the node is cordoned with the repair taint ``autorepair.io/repair:NoSchedule``
(value = the run id; an existing cordon is kept as it is), then a ``batch/v1`` Job
``autorepair-validate-<run>`` is created in ``ValidationConfig.namespace`` with
``spec.template.spec.nodeName`` = the node (pinned, no scheduling), a toleration for the
repair taint, ``backoffLimit: 0`` and ``activeDeadlineSeconds`` = the run's bound. The
node's prior state is kept in the Job's ``autorepair.io/prior-state`` annotation, so a
retried placement finds it. The result is the last JSON line of the pod's log.

Verdicts: ``failed`` and ``spare`` keep the node cordoned (``failed`` also annotates it
with :data:`ANN_TICKET`); ``aborted`` restores the prior cordon marker exactly and
uncordons only a cordon this run placed.

Whose cordon: the run's own cordon marker (``autorepair.io/repair-id`` = the run id)
decides, not whoever holds the node. Placement takes over the marker of the repair that
started the run (or of a repair no longer in flight) so that cordon is returned with the
machine; a cordon of someone else stays on every verdict, and a node with another repair in
flight is neither placed on nor uncordoned.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.scheduler.kube import (
    ANN_CORDONED_BY,
    ANN_REPAIR_ID,
    CORDONED_BY_US,
    TAINT_EFFECT,
    TAINT_KEY,
    KubeScheduler,
    _requests_gpu,
    _taint_dict,
)
from activities.validation.base import (
    COLLECT_POLL_S,
    JobOutput,
    ValidationBackend,
    aborted,
    heartbeat,
    parse_result_text,
    run_slug,
)
from workflows.activity_api import (
    ERR_UNKNOWN_NODE,
    CollectInput,
    CollectResult,
    PlacementResult,
    ReturnMachineInput,
    ValidationPlacement,
)
from workflows.config import ClusterConfig, ValidationConfig
from workflows.models import Verdict

#: Annotation on the Job holding the node's state before placement (JSON).
ANN_PRIOR = "autorepair.io/prior-state"
#: Annotation on the Job holding the run id; label selecting the run's pods.
ANN_RUN = "autorepair.io/validation-run"
LABEL_RUN = "autorepair.io/validation"
#: Annotation on the node naming the hardware ticket of a failed run.
ANN_TICKET = "autorepair.io/validation-ticket"
#: Annotation on the node, written before placement first cordons it (or takes its cordon
#: over): ``{"run": <run id>, "prior": <snapshot>}``. A retried placement that finds the
#: node held by its own run takes the prior state from here, never from what it did
#: itself; the release removes it.
ANN_NODE_PRIOR = "autorepair.io/validation-prior"


class KubeValidation(KubeScheduler, ValidationBackend):
    """Validation placement on one Kubernetes cluster (pinned Job tolerating our taint).

    ``JOB_PREFIX`` / ``CONTAINER`` / ``APP`` name the Job, its container and its
    ``app.kubernetes.io/name`` label (the GPU reset Job reuses this class with its own)."""

    JOB_PREFIX = "autorepair-validate"
    CONTAINER = "validate"
    APP = "autorepair-validate"

    def __init__(self, cluster: ClusterConfig, api_client: k8s.ApiClient | None = None) -> None:
        super().__init__(cluster, api_client=api_client)
        self.v: ValidationConfig = cluster.validation

    async def _batch(self) -> k8s.BatchV1Api:
        await self._api()
        return k8s.BatchV1Api(self._client)

    def job_name(self, run_id: str) -> str:
        """``{JOB_PREFIX}-<slug>`` (≤ 63 characters, DNS-1123)."""
        return f"{self.JOB_PREFIX}-{run_slug(run_id)}"

    @staticmethod
    def snapshot(n: k8s.V1Node) -> dict[str, Any]:
        """The restorable part of a node's state."""
        ann = n.metadata.annotations or {}
        return {
            "scheduler": "kubernetes",
            "unschedulable": bool(n.spec.unschedulable),
            "holder": ann.get(ANN_REPAIR_ID),
            "cordoned_by": ann.get(ANN_CORDONED_BY),
        }

    async def _read_job(self, name: str) -> Any:
        batch = await self._batch()
        try:
            return await batch.read_namespaced_job(name, self.v.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _job_body(self, p: ValidationPlacement, prior: dict[str, Any]) -> dict[str, Any]:
        name = self.job_name(p.run_id)
        env: list[dict[str, Any]] = [
            {"name": k, "value": val} for k, val in sorted(self.v.env.items())
        ]
        env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        container: dict[str, Any] = {
            "name": self.CONTAINER, "image": self.v.image, "command": list(self.v.command),
            "env": env, "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if self.v.gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(self.v.gpus)}}
        labels = {LABEL_RUN: run_slug(p.run_id), "app.kubernetes.io/name": self.APP}
        return {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": self.v.namespace, "labels": labels,
                         "annotations": {ANN_RUN: p.run_id, ANN_PRIOR: json.dumps(prior)}},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": int(self.v.timeout_s),
                "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": p.node, "restartPolicy": "Never",
                        "tolerations": [{"key": TAINT_KEY, "operator": "Exists",
                                         "effect": TAINT_EFFECT}],
                        "containers": [container],
                    },
                },
            },
        }

    async def place(self, p: ValidationPlacement) -> PlacementResult:
        """Cordon (if needed) and create the pinned Job; ``placed=False`` + reason when the
        node is unknown, not Ready, or runs GPU pods (machine reallocated)."""
        timing = {"timeout_s": self.v.timeout_s, "poll_s": self.v.poll_s}
        name = self.job_name(p.run_id)
        job = await self._read_job(name)
        if job is not None:
            prior = json.loads((job.metadata.annotations or {}).get(ANN_PRIOR) or "{}")
            return PlacementResult(placed=True, job_id=name, prior_state=prior, **timing)
        try:
            n = await self._read(p.node)
        except ApplicationError as e:
            if e.type == ERR_UNKNOWN_NODE:
                return PlacementResult(placed=False, reason=str(e), **timing)
            raise
        prior = self.own_prior(n, p.run_id) or self.snapshot(n)
        others = await self.other_repairs(p.node, p.run_id)
        if others:
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"repair {', '.join(others)} in flight on {p.node}: validation "
                "leaves the node to it", **timing,
            )
        ready = any(c.type == "Ready" and c.status == "True"
                    for c in (n.status.conditions if n.status else None) or [])
        if not ready:
            return PlacementResult(placed=False, prior_state=prior,
                                   reason=f"node {p.node} not Ready", **timing)
        gpu_pods = [f"{q.metadata.namespace}/{q.metadata.name}" for q in await self._pods_on(p.node)
                    if _requests_gpu(q)
                    and (q.metadata.labels or {}).get(LABEL_RUN) != run_slug(p.run_id)]
        if gpu_pods:
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"machine reallocated: GPU pods {', '.join(sorted(gpu_pods))} on {p.node}",
                **timing,
            )
        if (n.metadata.annotations or {}).get(ANN_REPAIR_ID) != p.run_id:
            # recorded before the node is touched: a retry after a failed Job create
            # restores this, not the run's own cordon
            await self._annotate(p.node, {ANN_NODE_PRIOR: json.dumps(
                {"run": p.run_id, "prior": prior})})
        if not n.spec.unschedulable:
            await self.cordon(p.node, p.run_id, "validation run")
        else:
            holder = prior.get("holder")
            if (holder and holder != p.run_id and prior.get("cordoned_by") == CORDONED_BY_US
                    and await self.may_take_over(str(holder), p.node, p.run_id)):
                await self._set_marker(p.node, str(holder), p.run_id)
        batch = await self._batch()
        try:
            body: Any = self._job_body(p, prior)  # the client accepts plain dicts
            await batch.create_namespaced_job(self.v.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise
        return PlacementResult(placed=True, job_id=name, prior_state=prior, **timing)

    async def _pod_log(self, slug: str) -> str:
        api = await self._api()
        pods = await api.list_namespaced_pod(self.v.namespace, label_selector=f"{LABEL_RUN}={slug}")
        mine = [q for q in pods.items if (q.metadata.labels or {}).get(LABEL_RUN) == slug]
        if not mine:
            return ""
        mine.sort(key=lambda q: q.metadata.creation_timestamp or 0)
        pod = mine[-1]
        try:
            # Raw body: with preloading the client json-decodes a log that is one JSON
            # object and hands back its Python repr (kubernetes-client deserialisation).
            resp: Any = await api.read_namespaced_pod_log(pod.metadata.name, self.v.namespace,
                                                     container=self.CONTAINER,
                                                     _preload_content=False)
            try:
                raw = await resp.read()
            finally:
                resp.release()
            return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        except ApiException as e:
            if e.status != 404:
                raise
        for cs in (pod.status.container_statuses if pod.status else None) or []:
            term = cs.state.terminated if cs.state else None
            if term is not None and term.message:
                return str(term.message)
        return ""

    async def job_output(self, c: CollectInput) -> JobOutput | None:
        """Wait up to ``c.wait_s`` for the Job to finish; its pod's log, or ``None`` while
        it runs. A deleted Job is ``taken``."""
        deadline = time.monotonic() + c.wait_s
        while True:
            job = await self._read_job(c.job_id)
            if job is None:
                return JobOutput(state="Deleted", text="", taken=True,
                                 why=f"Job {c.job_id} was deleted")
            st = job.status
            conds = {x.type: x for x in (st.conditions if st else None) or [] if x.status == "True"}
            done = bool(st and ((st.succeeded or 0) > 0 or (st.failed or 0) > 0)) or bool(
                {"Complete", "Failed"} & set(conds))
            if done:
                break
            heartbeat({"job": c.job_id, "active": st.active if st else None})
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(COLLECT_POLL_S)
        failed = conds.get("Failed")
        text = await self._pod_log(run_slug(c.run_id))
        return JobOutput(state="Failed" if failed else "Complete", text=text,
                         why=f"{failed.reason}: {failed.message}" if failed else "")

    async def collect(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` for the Job to finish, then read the pod's result."""
        out = await self.job_output(c)
        if out is None:
            return CollectResult(finished=False)
        if out.taken:
            return CollectResult(finished=True, result=aborted(
                c.machine, f"validation Job {c.job_id} was deleted (machine taken away)"))
        result = parse_result_text(out.text, c.machine)
        if result is None:
            why = out.why or "no result printed"
            return CollectResult(finished=True, result=aborted(
                c.machine, f"validation Job {c.job_id} ended without a result ({why}): "
                f"{out.text[-2000:]!r}"))
        return CollectResult(finished=True, result=result)

    @staticmethod
    def own_prior(n: k8s.V1Node, run_id: str) -> dict[str, Any] | None:
        """The prior state recorded by an earlier try of ``run_id``'s placement
        (:data:`ANN_NODE_PRIOR`) when the node is held by that run; else None."""
        if (n.metadata.annotations or {}).get(ANN_REPAIR_ID) != run_id \
                or _recorded_run(n) != run_id:
            return None
        prior = _prior_record(n).get("prior")
        return prior if isinstance(prior, dict) else None

    async def release(self, c: CollectInput) -> None:
        """Delete the Job and its pods, and the run's prior-state record on the node
        (:data:`ANN_NODE_PRIOR`; all idempotent). A run whose Job was never created (every
        create refused: ``job_id`` empty) that still holds the node has the node's prior
        state restored here, as an ``aborted`` verdict would."""
        try:
            n = await self._read(c.node)
        except ApplicationError as e:
            if e.type != ERR_UNKNOWN_NODE:
                raise
        else:
            prior = self.own_prior(n, c.run_id)
            if not c.job_id and prior is not None:
                # placement cordoned (or took over) the node for the run and never
                # created its Job: the state before the run goes back now, since no
                # verdict will be applied (the run ends aborted without placement)
                await self._restore_prior(ReturnMachineInput(
                    cluster=c.cluster, machine=c.machine, node=c.node, run_id=c.run_id,
                    verdict=Verdict.aborted, prior_state=prior), n)
            if _recorded_run(n) == c.run_id:
                await self._annotate(c.node, {ANN_NODE_PRIOR: None})
        if not c.job_id:
            return
        batch = await self._batch()
        try:
            await batch.delete_namespaced_job(c.job_id, self.v.namespace,
                                              propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    async def _annotate(self, node: str, ann: dict[str, str | None]) -> None:
        def build(n: k8s.V1Node) -> dict[str, Any] | None:
            cur = n.metadata.annotations or {}
            if all(cur.get(k) == v for k, v in ann.items()):
                return None
            return {"metadata": {"annotations": ann}}

        await self._patch(node, build)

    # -- verdict hooks (ValidationBackend.return_machine) --------------------------------
    async def _read_target(self, node: str) -> k8s.V1Node:
        return await self._read(node)

    async def _set_marker(self, node: str, old: str, new: str) -> None:
        """Move this project's cordon marker (annotation + taint value) from repair/run
        ``old`` to ``new``; nothing when ``old`` no longer holds the node."""

        if old == new:
            return

        def build(n: k8s.V1Node) -> dict[str, Any] | None:
            ann = n.metadata.annotations or {}
            if ann.get(ANN_REPAIR_ID) != old:
                return None
            taints = [_taint_dict(t) for t in (n.spec.taints or [])]
            for t in taints:
                if t["key"] == TAINT_KEY and t.get("value") == old:
                    t["value"] = new
            return {"metadata": {"annotations": {ANN_REPAIR_ID: new}},
                    "spec": {"taints": taints}}

        await self._patch(node, build)

    async def _restore_prior(self, r: ReturnMachineInput, n: k8s.V1Node) -> str:
        prior = r.prior_state or {}
        holder = (n.metadata.annotations or {}).get(ANN_REPAIR_ID)
        if holder != r.run_id:
            return "restored: cordon as before" if holder == prior.get("holder") else (
                f"kept: cordon of {holder or 'someone else'}")
        if prior.get("unschedulable"):
            if prior.get("holder"):  # the marker taken over at placement goes back
                await self._set_marker(r.node, r.run_id, str(prior["holder"]))
            return "restored: cordon as before"
        others = await self.other_repairs(r.node, r.run_id)
        if others:
            return f"kept cordoned: repair {', '.join(others)} in flight on {r.node}"
        await self.rejoin(r.node, r.run_id)
        return "restored: schedulable"

    async def _keep_out(self, r: ReturnMachineInput, n: k8s.V1Node) -> str:
        if not n.spec.unschedulable:
            await self.cordon(r.node, r.run_id, f"validation failed ticket {r.ticket_id}")
        await self._annotate(r.node, {ANN_TICKET: r.ticket_id or r.run_id})
        return f"kept out (cordoned), ticket {r.ticket_id}"

    async def _hold_as_spare(self, r: ReturnMachineInput, n: k8s.V1Node) -> str | None:
        holder = (n.metadata.annotations or {}).get(ANN_REPAIR_ID)
        if n.spec.unschedulable and holder != r.run_id:
            return (f"kept out: cordoned by {holder or 'someone else'}; not added to the "
                    "spare pool")
        others = await self.other_repairs(r.node, r.run_id)
        if others:
            return (f"kept: repair {', '.join(others)} in flight on {r.node}; not added to "
                    "the spare pool")
        if not n.spec.unschedulable:
            await self.cordon(r.node, r.run_id, "spare (validated)")
        return None

    async def _return_to_pool(self, r: ReturnMachineInput, n: k8s.V1Node) -> str:
        ann = n.metadata.annotations or {}
        holder = ann.get(ANN_REPAIR_ID)
        ours = holder == r.run_id and ann.get(ANN_CORDONED_BY) == CORDONED_BY_US
        if ours:
            others = await self.other_repairs(r.node, r.run_id)
            if others:
                detail = f"kept cordoned: repair {', '.join(others)} in flight on {r.node}"
            else:
                await self.rejoin(r.node, r.run_id)
                detail = "returned to pool: uncordoned"
        elif n.spec.unschedulable:
            detail = f"kept out: cordoned by {holder or 'someone else'}"
        else:
            detail = "returned to pool: already schedulable"
        await self._annotate(r.node, {ANN_TICKET: None})
        return detail

    async def _placement_state(self, node: str) -> tuple[list[str], bool]:
        after = await self._read(node)
        unschedulable = bool(after.spec.unschedulable)
        return (["SchedulingDisabled"] if unschedulable else ["Schedulable"]), not unschedulable


def _prior_record(n: k8s.V1Node) -> dict[str, Any]:
    """The node's :data:`ANN_NODE_PRIOR` record; ``{}`` when absent or unreadable."""
    try:
        rec = json.loads((n.metadata.annotations or {}).get(ANN_NODE_PRIOR) or "{}")
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _recorded_run(n: k8s.V1Node) -> str | None:
    """The run whose prior state the node's :data:`ANN_NODE_PRIOR` record holds."""
    run = _prior_record(n).get("run")
    return run if isinstance(run, str) else None
