"""Kubernetes implementation of :class:`activities.scheduler.base.Scheduler`.

- cordon = ``spec.unschedulable: true`` + taint ``autorepair.io/repair=<repair_id>:NoSchedule``
  + annotations ``autorepair.io/repair-id``, ``autorepair.io/reason`` and, only when this
  repair set ``unschedulable``, ``autorepair.io/cordoned-by: autorepair``. Written as a JSON
  merge patch carrying the ``resourceVersion`` read just before (optimistic concurrency):
  a ``409 Conflict`` is retried with a fresh read;
- idle = no running/pending pod on the node requests ``nvidia.com/gpu``, a MIG slice
  (``nvidia.com/mig-*``) or a shared GPU (``nvidia.com/gpu.*``);
- drain = cordon again when the node lost this repair's cordon (deleted and re-registered),
  then the Eviction API for every evictable pod (DaemonSet and mirror pods are left
  alone, as ``kubectl drain`` does); ``429`` from a PodDisruptionBudget and evictions the
  API server refuses (5xx, e.g. a pod under two PDBs) are retried with backoff and
  reported in heartbeats; after the deadline every pod still there (evicted but still
  Terminating included) is listed in a non-retryable ``ERR_DRAIN_DEADLINE`` failure;
- rejoin = remove only our taint and annotations; ``unschedulable`` goes back to false only
  when ``autorepair.io/cordoned-by`` says we set it (someone else's cordon stays);
- powered-off node (Kubernetes *non-graceful node shutdown*, KEP-2268, GA in 1.28): GPU
  pods left ``Running``/``Terminating`` on a node that is NotReady and whose BMC reports
  power ``Off`` never leave by themselves (the kubelet that would stop them is dead), so
  idle and drain would wait forever. After the BMC's confirmation the idle check and the
  drain taint the node ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``, then
  force-delete (grace period 0) the pods that do not tolerate it, and record it on the
  node (annotation :data:`ANN_OUT_OF_SERVICE`: repair id, BMC answer, pods, time) and in
  their result's ``detail``. Rejoin removes that taint when this repair set it;
- node health = the ``Ready`` condition and ``status.nodeInfo.bootID``.

Errors: 401/403 → non-retryable ``ERR_AUTH``; 404 on the node → ``ERR_UNKNOWN_NODE``;
5xx, 429 and connection errors are retried (raised as is).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from activities.scheduler.base import Heartbeat, no_heartbeat
from workflows.activity_api import (
    ERR_AUTH,
    ERR_DRAIN_DEADLINE,
    ERR_UNKNOWN_NODE,
    CordonResult,
    DrainResult,
    IdleStatus,
    NodeHealth,
    RejoinResult,
    permanent,
)
from workflows.config import ClusterConfig
from workflows.policy.bmc import BmcProbe

#: Taint key written on cordon; value = repair id, effect NoSchedule (validation Jobs
#: tolerate it, ``activities/validation/kube.py``).
TAINT_KEY = "autorepair.io/repair"
TAINT_EFFECT = "NoSchedule"
#: Annotations naming the repair (read back by rejoin and by operators).
ANN_REPAIR_ID = "autorepair.io/repair-id"
ANN_CORDONED_BY = "autorepair.io/cordoned-by"
ANN_REASON = "autorepair.io/reason"
CORDONED_BY_US = "autorepair"
#: Extended resource name of NVIDIA GPUs (NVIDIA device plugin).
GPU_RESOURCE = "nvidia.com/gpu"
#: Prefix of the MIG slices the device plugin advertises under its ``mixed`` strategy.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
#: Mirror (static) pod annotation (kubelet).
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: Non-graceful node shutdown taint (Kubernetes docs, "Non-graceful node shutdown").
OUT_OF_SERVICE_KEY = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_VALUE = "nodeshutdown"
OUT_OF_SERVICE_EFFECT = "NoExecute"
#: Annotation recording the non-graceful shutdown this project applied (JSON).
ANN_OUT_OF_SERVICE = "autorepair.io/out-of-service"
#: Attempts of a read-modify-patch cycle on 409 Conflict.
CONFLICT_ATTEMPTS = 8
#: Eviction backoff after a PDB 429: first, cap (seconds).
EVICT_BACKOFF_S = (0.5, 10.0)
#: Poll interval while waiting for evicted pods to go, seconds.
DRAIN_POLL_S = 0.5
#: How often a drain asks the BMC whether a NotReady node's host is powered off, seconds
#: (once at the start, then at this pace: never on every poll of a fragile BMC).
RELEASE_RECHECK_S = 60.0


def _taint_dict(t: k8s.V1Taint) -> dict[str, Any]:
    d: dict[str, Any] = {"key": t.key, "effect": t.effect}
    if t.value is not None:
        d["value"] = t.value
    if t.time_added is not None:
        d["timeAdded"] = t.time_added.isoformat()
    return d


def _pod_name(p: k8s.V1Pod) -> str:
    return f"{p.metadata.namespace}/{p.metadata.name}"


def is_gpu_resource(name: str) -> bool:
    """Whether extended resource ``name`` is (a share of) an NVIDIA GPU: ``nvidia.com/gpu``,
    a MIG slice of the device plugin's ``mixed`` strategy (``nvidia.com/mig-1g.10gb``) or
    a renamed time-sliced / MPS GPU (``nvidia.com/gpu.shared``)."""
    return (name == GPU_RESOURCE or name.startswith(GPU_RESOURCE + ".")
            or name.startswith(MIG_RESOURCE_PREFIX))


def _requests_gpu(p: k8s.V1Pod) -> bool:
    for c in [*(p.spec.containers or []), *(p.spec.init_containers or [])]:
        r = c.resources
        if r is None:
            continue
        for d in (r.requests or {}, r.limits or {}):
            for k, v in d.items():
                if is_gpu_resource(k) and v not in (None, "0", 0):
                    return True
    return False


def _active(p: k8s.V1Pod) -> bool:
    phase: str = (p.status.phase if p.status else None) or ""
    return phase not in ("Succeeded", "Failed")


def _tolerates_out_of_service(p: k8s.V1Pod) -> bool:
    for t in (p.spec.tolerations if p.spec else None) or []:
        key_ok = t.key == OUT_OF_SERVICE_KEY or (t.key in (None, "") and t.operator == "Exists")
        effect_ok = t.effect in (None, "", OUT_OF_SERVICE_EFFECT)
        if key_ok and effect_ok:
            return True
    return False


def _out_of_service_by(ann: dict[str, str], repair_id: str) -> bool:
    """Whether this repair applied the node's out-of-service taint (its annotation)."""
    try:
        return bool(json.loads(ann.get(ANN_OUT_OF_SERVICE) or "{}").get("repair_id")
                    == repair_id)
    except (ValueError, AttributeError):
        return False


def _refusal(e: ApiException) -> str:
    """Why the API server refused an eviction: ``PodDisruptionBudget: ...`` for a 429,
    else ``HTTP <status> <reason>: <the Status message>``."""
    try:
        message = str(json.loads(e.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    if e.status == 429:
        return "PodDisruptionBudget: " + (message or e.reason or "429")
    return f"HTTP {e.status} {e.reason or ''}".rstrip() + (f": {message}" if message else "")


def _node_ready(n: k8s.V1Node) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in (n.status.conditions if n.status else None) or [])


def _evictable(p: k8s.V1Pod) -> bool:
    ann = p.metadata.annotations or {}
    if MIRROR_ANNOTATION in ann:
        return False
    return not any(o.kind == "DaemonSet" for o in (p.metadata.owner_references or []))


class KubeScheduler:
    """Scheduler backed by the Kubernetes API (``kubernetes_asyncio``).

    ``api_client`` (tests, the worker) takes precedence; otherwise the client is built
    from ``ClusterConfig.kubeconfig`` or, when that is empty, the in-cluster config.
    ``bmc_probe``: the BMC's view of a node (``activities.power.redfish_probe``); without
    it a powered-off node's pods are never force-deleted.
    """

    def __init__(self, cluster: ClusterConfig, api_client: k8s.ApiClient | None = None,
                 bmc_probe: BmcProbe | None = None) -> None:
        self.cluster = cluster
        self._client = api_client
        self._own_client = api_client is None
        self.bmc_probe = bmc_probe

    async def _api(self) -> k8s.CoreV1Api:
        if self._client is None:
            conf = k8s.Configuration()
            if self.cluster.kubeconfig:
                await k8s_config.load_kube_config(
                    config_file=self.cluster.kubeconfig, client_configuration=conf
                )
            else:
                k8s_config.load_incluster_config(client_configuration=conf)
            self._client = k8s.ApiClient(conf)
        return k8s.CoreV1Api(self._client)

    async def close(self) -> None:
        """Close the client when this scheduler built it."""
        if self._own_client and self._client is not None:
            await self._client.close()
            self._client = None

    def _classify(self, e: ApiException, node: str) -> Exception:
        if e.status in (401, 403):
            return permanent(
                ERR_AUTH,
                f"cluster {self.cluster.name}: Kubernetes API refused access "
                f"({e.status} {e.reason}) for node {node}",
            )
        if e.status == 404:
            return permanent(
                ERR_UNKNOWN_NODE,
                f"cluster {self.cluster.name}: Kubernetes has no node {node!r}",
            )
        return e

    async def _read(self, node: str) -> k8s.V1Node:
        api = await self._api()
        try:
            return await api.read_node(node)
        except ApiException as e:
            raise self._classify(e, node) from e

    async def _patch(self, node: str, build: Any) -> tuple[k8s.V1Node, bool]:
        """Read → ``build(node) -> patch | None`` → merge patch with resourceVersion.

        Retries on 409 with a fresh read. Returns (node after, patched?).
        """
        api = await self._api()
        for attempt in range(CONFLICT_ATTEMPTS):
            cur = await self._read(node)
            body = build(cur)
            if body is None:
                return cur, False
            body.setdefault("metadata", {})["resourceVersion"] = cur.metadata.resource_version
            try:
                opts: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
                after = await api.patch_node(node, body, **opts)
                return after, True
            except ApiException as e:
                if e.status == 409 and attempt < CONFLICT_ATTEMPTS - 1:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                raise self._classify(e, node) from e
        raise RuntimeError("unreachable")  # pragma: no cover

    # ---- Scheduler -----------------------------------------------------------------
    async def cordon(self, node: str, repair_id: str, reason: str) -> CordonResult:
        """Set unschedulable + our taint + annotations; no-op when already ours."""
        state: dict[str, Any] = {}

        def build(n: k8s.V1Node) -> dict[str, Any] | None:
            ann = n.metadata.annotations or {}
            taints = list(n.spec.taints or [])
            holder = ann.get(ANN_REPAIR_ID)
            if holder and holder != repair_id:
                state["other_repair"] = holder
                return None
            ours = [t for t in taints if t.key == TAINT_KEY]
            already_unsched = bool(n.spec.unschedulable)
            cordoned_by_us = ann.get(ANN_CORDONED_BY) == CORDONED_BY_US and holder == repair_id
            state["by_other"] = already_unsched and not cordoned_by_us
            if holder == repair_id and ours and already_unsched:
                state["noop"] = True
                return None
            new_ann: dict[str, Any] = {ANN_REPAIR_ID: repair_id, ANN_REASON: reason[:500]}
            if not already_unsched or cordoned_by_us:
                new_ann[ANN_CORDONED_BY] = CORDONED_BY_US
            spec: dict[str, Any] = {"unschedulable": True}
            if not ours:
                spec["taints"] = [
                    *[_taint_dict(t) for t in taints],
                    {"key": TAINT_KEY, "value": repair_id, "effect": TAINT_EFFECT},
                ]
            return {"metadata": {"annotations": new_ann}, "spec": spec}

        await self._patch(node, build)
        if "other_repair" in state:
            return CordonResult(
                cordoned_by_us=False, by_other=True, held_by_repair=state["other_repair"],
                detail=f"node held by repair {state['other_repair']}",
            )
        by_other = bool(state.get("by_other"))
        detail = "already cordoned by this repair" if state.get("noop") else "cordoned"
        if by_other:
            detail += " (node was already unschedulable: someone else's cordon is kept)"
        return CordonResult(cordoned_by_us=not by_other, by_other=by_other, detail=detail)

    async def _pods_on(self, node: str) -> list[k8s.V1Pod]:
        api = await self._api()
        try:
            lst = await api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        except ApiException as e:
            raise self._classify(e, node) from e
        return [p for p in lst.items if _active(p)]

    async def _bmc_says_off(self, n: k8s.V1Node) -> dict[str, str | None] | None:
        """The BMC's answer when ``n`` is NotReady and its host is powered Off; else None
        (Ready, no probe, BMC unreachable or on: nothing is forced)."""
        if _node_ready(n) or self.bmc_probe is None:
            return None
        try:
            bmc = await self.bmc_probe(self.cluster.name, n.metadata.name)
        except Exception:  # an unreachable BMC confirms nothing
            return None
        return bmc if (bmc.get("power_state") or "").lower() == "off" else None

    async def release_powered_off(self, node: str, repair_id: str) -> str:
        """Kubernetes non-graceful node shutdown of a NotReady node whose BMC reports power
        Off: taint ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` (idempotent),
        then force-delete (grace period 0) every pod on the node that does not tolerate it
        (mirror pods excepted: the kubelet owns them). Returns what was done ("" when the
        node is Ready, has no BMC probe or the BMC does not report Off)."""
        n = await self._read(node)
        bmc = await self._bmc_says_off(n)
        if bmc is None:
            return ""
        # the idle check knows no repair id: the repair holding the node's cordon acts
        repair_id = repair_id or (n.metadata.annotations or {}).get(ANN_REPAIR_ID) or ""
        pods = [p for p in await self._pods_on(node)
                if MIRROR_ANNOTATION not in (p.metadata.annotations or {})
                and not _tolerates_out_of_service(p)]
        names = sorted(_pod_name(p) for p in pods)
        record = {"repair_id": repair_id, "bmc": bmc, "pods": names,
                  "at": datetime.now(UTC).isoformat()}

        def build(cur: k8s.V1Node) -> dict[str, Any] | None:
            taints = list(cur.spec.taints or [])
            if any(t.key == OUT_OF_SERVICE_KEY for t in taints):
                return None
            return {
                "metadata": {"annotations": {ANN_OUT_OF_SERVICE: json.dumps(record)}},
                "spec": {"taints": [*[_taint_dict(t) for t in taints],
                                    {"key": OUT_OF_SERVICE_KEY, "value": OUT_OF_SERVICE_VALUE,
                                     "effect": OUT_OF_SERVICE_EFFECT}]},
            }

        await self._patch(node, build)
        api = await self._api()
        for p in pods:
            try:
                await api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace,
                                                grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise self._classify(e, node) from e
        return (f"non-graceful node shutdown: BMC reports power Off on NotReady node {node}; "
                f"tainted {OUT_OF_SERVICE_KEY}={OUT_OF_SERVICE_VALUE}:{OUT_OF_SERVICE_EFFECT}"
                f" and force-deleted {', '.join(names) or 'no pods'}")

    async def check_idle(self, node: str, repair_id: str = "") -> IdleStatus:
        """Idle = no running/pending pod on ``node`` requests a GPU (:func:`is_gpu_resource`).

        GPU pods on a NotReady node whose BMC reports power Off are released by
        :meth:`release_powered_off` first (``detail`` says so)."""
        await self._read(node)  # unknown node → ERR_UNKNOWN_NODE
        gpu_pods = [_pod_name(p) for p in await self._pods_on(node) if _requests_gpu(p)]
        detail = ""
        if gpu_pods:
            detail = await self.release_powered_off(node, repair_id)
            if detail:
                gpu_pods = [_pod_name(p) for p in await self._pods_on(node)
                            if _requests_gpu(p)]
        return IdleStatus(idle=not gpu_pods, running=sorted(gpu_pods), detail=detail)

    async def drain(
        self, node: str, repair_id: str, deadline_s: float, heartbeat: Heartbeat = no_heartbeat
    ) -> DrainResult:
        """Evict every evictable pod; retry PDB 429s with backoff until ``deadline_s``.

        Heartbeats ``{"remaining": [...], "blocked": {pod: message}}``. Raises
        non-retryable ``ERR_DRAIN_DEADLINE`` naming the remaining pods after the deadline.
        """
        cur = await self._read(node)
        ann = cur.metadata.annotations or {}
        holder = ann.get(ANN_REPAIR_ID)
        if holder is None or (holder == repair_id and not (
                cur.spec.unschedulable
                and any(t.key == TAINT_KEY for t in cur.spec.taints or []))):
            # the node lost this repair's cordon (deleted and re-registered, or edited):
            # cordon again before evicting, as `kubectl drain` does, or the evicted work
            # (and new work) lands right back on it
            await self.cordon(node, repair_id, ann.get(ANN_REASON) or
                              "drain: re-cordoned (the node had lost this repair's cordon)")
        api = await self._api()
        deadline = time.monotonic() + deadline_s
        backoff: dict[str, float] = {}
        next_try: dict[str, float] = {}
        blocked: dict[str, str] = {}  # pod → why its last eviction was refused
        evicted: list[str] = []
        released = ""
        next_release_check = 0.0
        while True:
            pods = [p for p in await self._pods_on(node) if _evictable(p)]
            if pods and not released and time.monotonic() >= next_release_check:
                # pods on a powered-off host never go: non-graceful node shutdown. The BMC
                # is asked once, then every RELEASE_RECHECK_S, never on every poll.
                next_release_check = time.monotonic() + RELEASE_RECHECK_S
                released = await self.release_powered_off(node, repair_id)
                if released:
                    heartbeat({"released": released})
                    continue
            if not pods:
                done = f"evicted {evicted}" if evicted else "no pods to evict"
                return DrainResult(
                    drained=True, detail=f"{released}; {done}" if released else done
                )
            now = time.monotonic()
            present = {_pod_name(p) for p in pods}
            for gone in set(blocked) - present:
                del blocked[gone]
            for p in pods:
                name = _pod_name(p)
                if next_try.get(name, 0.0) > now or p.metadata.deletion_timestamp:
                    continue
                body = k8s.V1Eviction(
                    metadata=k8s.V1ObjectMeta(name=p.metadata.name, namespace=p.metadata.namespace)
                )
                try:
                    await api.create_namespaced_pod_eviction(
                        p.metadata.name, p.metadata.namespace, body
                    )
                    evicted.append(name)
                    blocked.pop(name, None)
                except ApiException as e:
                    if e.status == 404:
                        continue  # already gone
                    if e.status in (401, 403):
                        raise self._classify(e, node) from e
                    # 429 (a PodDisruptionBudget), or an eviction the API server refuses
                    # (500 "more than one PodDisruptionBudget", 5xx): retried with backoff
                    # until the deadline, then reported with the remaining pods
                    b = min(backoff.get(name, EVICT_BACKOFF_S[0] / 2) * 2, EVICT_BACKOFF_S[1])
                    backoff[name] = b
                    next_try[name] = time.monotonic() + b
                    blocked[name] = _refusal(e)
            # every pod still there counts, evicted or not: one that accepted its eviction
            # but stays Terminating (finalizer, long grace period) blocks the drain too
            remaining = sorted(present)
            terminating = sorted(_pod_name(p) for p in pods if p.metadata.deletion_timestamp)
            heartbeat({"remaining": remaining, "blocked": dict(blocked)})
            if time.monotonic() >= deadline and remaining:
                raise permanent(
                    ERR_DRAIN_DEADLINE,
                    f"cluster {self.cluster.name} node {node}: pods still there after the "
                    f"{deadline_s:.0f}s drain deadline: {', '.join(remaining)}"
                    + (f" (terminating: {', '.join(terminating)})" if terminating else "")
                    + (f" (blocked: {blocked})" if blocked else ""),
                    DrainResult(drained=False, remaining=remaining).model_dump(),
                )
            await asyncio.sleep(DRAIN_POLL_S)

    async def rejoin(self, node: str, repair_id: str) -> RejoinResult:
        """Remove our taint/annotations; uncordon only when we cordoned (a foreign cordon stays)."""
        state: dict[str, Any] = {}

        def build(n: k8s.V1Node) -> dict[str, Any] | None:
            ann = n.metadata.annotations or {}
            taints = list(n.spec.taints or [])
            holder = ann.get(ANN_REPAIR_ID)
            ours = [t for t in taints if t.key == TAINT_KEY and t.value == repair_id]
            if holder not in (None, repair_id):
                state["kept"] = f"node held by repair {holder}"
                return None
            we_cordoned = holder == repair_id and ann.get(ANN_CORDONED_BY) == CORDONED_BY_US
            state["uncordoned"] = we_cordoned or not n.spec.unschedulable
            if not n.spec.unschedulable:
                state["uncordoned"] = True
            elif not we_cordoned:
                state["kept"] = "node was cordoned by someone else; left unschedulable"
            if holder is None and not ours:
                return None  # nothing of ours left (a retried rejoin)
            oos = _out_of_service_by(ann, repair_id)
            body: dict[str, Any] = {
                "metadata": {"annotations": {ANN_REPAIR_ID: None, ANN_CORDONED_BY: None,
                                             ANN_REASON: None}},
                "spec": {"taints": [
                    _taint_dict(t) for t in taints
                    if not (t.key == TAINT_KEY and t.value == repair_id)
                    and not (oos and t.key == OUT_OF_SERVICE_KEY)
                ] or None},
            }
            if oos:
                body["metadata"]["annotations"][ANN_OUT_OF_SERVICE] = None
            if we_cordoned:
                body["spec"]["unschedulable"] = None
            return body

        await self._patch(node, build)
        return RejoinResult(
            uncordoned=bool(state.get("uncordoned")), kept_reason=state.get("kept", "")
        )

    async def node_names(self) -> list[str]:
        """Names of every Node of the cluster (its inventory). Raises ``ApiException``
        (or a non-retryable ``ERR_AUTH`` when the API refuses access)."""
        api = await self._api()
        try:
            nodes = await api.list_node()
        except ApiException as e:
            raise self._classify(e, "*") from e
        return sorted(n.metadata.name for n in nodes.items)

    async def node_domains(self, label_keys: list[str], prefix: str) -> dict[str, list[str]]:
        """node → its failure domains (issue 29 item 2): the values of its labels named
        by ``label_keys`` (``policy.domains.label_keys``), sorted; nodes with none are left
        out (``prefix`` is Slurm's and unused here). Raises ``ApiException`` (or a
        non-retryable ``ERR_AUTH``) like :meth:`node_names`."""
        api = await self._api()
        try:
            nodes = await api.list_node()
        except ApiException as e:
            raise self._classify(e, "*") from e
        out: dict[str, list[str]] = {}
        for n in nodes.items:
            labels = n.metadata.labels or {}
            ds = sorted({labels[k] for k in label_keys if labels.get(k)})
            if ds:
                out[n.metadata.name] = ds
        return dict(sorted(out.items()))

    async def node_health(self, node: str) -> NodeHealth:
        """Ready condition, ``[Ready|NotReady, SchedulingDisabled?]``, bootID (None while
        the kubelet has reported none)."""
        n = await self._read(node)
        ready = False
        reason = ""
        for c in (n.status.conditions if n.status else None) or []:
            if c.type == "Ready":
                ready = c.status == "True"
                reason = c.reason or ""
        state = ["Ready" if ready else "NotReady"]
        if n.spec.unschedulable:
            state.append("SchedulingDisabled")
        info = n.status.node_info if n.status else None
        # "" until the kubelet posts status (a Node object created again): no identity,
        # never a boot other than the one read before
        return NodeHealth(
            ready=ready, state=state, boot_id=(info.boot_id or None) if info else None,
            reason=reason,
        )
