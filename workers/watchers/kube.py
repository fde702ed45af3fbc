"""Kubernetes watcher: node-annotation repair requests, node-problem-detector conditions,
and NotReady combined with a BMC power check.

**Annotation requests** (documented in ``docs/detectors.md``): a detector with RBAC to
patch node metadata sets the label :data:`REQUEST_LABEL` = ``"true"`` and the annotation
:data:`REQUEST_ANNOTATION` = JSON ``{"detector", "request_id", "mode", "detected_at",
"reason"[, "evidence_alert", "evidence_run"]}``. The watcher records it through
:class:`workers.repairs.intake.RepairIntake` with the detector as an external requester
(never a user), skipping the approval queue but not the evidence gate, the guard lease or
the budgets; ``remove`` is refused (human-only); detector + request id is the idempotency
key forever and the per-cluster and per-detector caps apply — keyed by (detector, source)
(``workers.repairs.intake.request_key``: ``NAME#annotation``), so an annotation under a
detector's name can neither pre-claim that detector's API request ids nor spend its API
cap. Only detectors listed in the
cluster's ``detectors.allowed`` open repairs this way: the annotation names its detector
itself and ``nodes/patch`` is held by many components (the kubelet for its own Node), so
any other request is recorded as an observed alert (``RepairIntake.observe_request``)
and the result says ``"observed": true`` with its ``alert_id``. It then removes the label and
writes :data:`RESULT_ANNOTATION` = JSON ``{"repair_id", "request_id", "stage", "refused",
"reason", "recorded_at"}`` (or ``{"error", "request_id", "recorded_at"}`` for a malformed
request). A request re-asserted on every scan maps to the same repair.

**Conditions**: node-problem-detector's :data:`NPD_CONDITIONS` with status ``True``
become alerts (KernelDeadlock → ``hung_task``, ReadonlyFilesystem → ``ext4_readonly`` in
the catalogue; the restart conditions are observations), cleared when they turn False.
A condition is **observed only** (``actionable=False``, ``evidence["confirmation"] =
"unconfirmed"``) unless it is confirmed by a node-bound source — the node's own agent
reported the same fault family (:data:`CONDITION_FAMILIES`) through a per-node identity
within ``clusters[].kubernetes.confirm_window_s`` of the condition's transition
(``confirm``: ``Ledger.node_bound_alert``) — or its type is listed in
``clusters[].kubernetes.actionable_conditions``: anyone who may patch ``nodes/status``
(every node running node-problem-detector holds that right cluster-wide) writes
conditions, and ``managedFields`` names are client-chosen, so a condition alone
authenticates nothing. An unconfirmed condition is checked again on every scan; once
confirmed it is raised again (a new alert id naming the confirming alert) as actionable.

**NotReady** (Ready ``False``/``Unknown``) alone is only observed (``node_not_ready``,
never a repair). The watcher then asks the node's BMC (``activities.power``): power
``Off`` or a host the BMC reports dead (``Status.State`` ``UnavailableOffline`` or
``Status.Health`` ``Critical``) is actionable evidence for ``power_cycle``; a healthy
powered-on host is not. During a long episode the BMC is asked again every
``worker.bmc_reprobe_s`` until it confirms (:class:`workers.watchers.bmc.BmcChecks`).

Restarts do not replay old events: each alert's observation time is the condition's
``lastTransitionTime``, so one episode always has one ``alert_id`` (the NodeWorkflow
de-duplicates), and the annotation path is idempotent through the ledger. Restarts do not
lose clears either: before its first scan the watcher re-opens the level faults it raised
that the ledger still holds open (``open_alerts``), so a condition that ended while the
worker was down gets its clear on the first scan; a fault the ledger holds cleared gets its
next raise stamped after that clear (:class:`workers.watchers.edges.EdgeTimes`). A node
deleted from the cluster has its open faults cleared and is forgotten; the watcher's memory
is bounded by the node count.
The node list is polled every ``interval_s`` (a list per poll survives API-server restarts and
resourceVersion expiry without a watch cache).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client as k8s
from pydantic import ValidationError

from ingest.handoff import AlertSink
from workers.repairs.intake import ANNOTATION_SOURCE, IntakeError, RepairIntake
from workers.repairs.models import RepairCreate
from workers.watchers.bmc import BmcChecks, BmcProbe, OpenAlerts, bmc_verdict
from workers.watchers.edges import EdgeTimes
from workers.watchers.slurm import MaintenanceSync
from workflows.alerts import alert_from_fault
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.maintenance import MAINTENANCE_ANNOTATION, MaintenanceWindow
from workflows.models import Action, Alert, Requester, RequesterKind, Severity

log = logging.getLogger("autorepair.watchers.kube")

REQUEST_LABEL = "autorepair.io/repair-request"
"""Label a detector sets to ``"true"`` to open a repair (label selectors find it fast)."""
REQUEST_ANNOTATION = "autorepair.io/repair-request"
"""Annotation carrying the request JSON."""
RESULT_ANNOTATION = "autorepair.io/repair-result"
"""Annotation the watcher writes back: the repair id (or the refusal / error)."""
NPD_CONDITIONS: dict[str, str] = {
    "KernelDeadlock": "hung_task",
    "ReadonlyFilesystem": "ext4_readonly",
    "FrequentKubeletRestart": "k8s_frequent_kubelet_restart",
    "FrequentContainerdRestart": "k8s_frequent_containerd_restart",
}
"""node-problem-detector condition type → alert kind (catalogue kinds where one fits)."""
CONDITION_FAMILIES: dict[str, frozenset[str]] = {
    "KernelDeadlock": frozenset({"hung_task"}),
    "ReadonlyFilesystem": frozenset({"ext4_readonly", "xfs_shutdown"}),
}
"""Condition type → the agent's fault kinds of the same family (the kernel lines
node-problem-detector itself reads for these conditions: ``task … blocked for more than``;
``Remounting filesystem read-only`` / XFS shutdown)."""
NOT_READY_KIND = "node_not_ready"
DEFAULT_INTERVAL_S = 15.0
"""Poll interval, seconds (kubelet reports status every 10 s by default)."""
SOURCE = "kube_watcher"

#: Finds the node agent's own report of one of ``kinds`` on ``node`` since a time:
#: ``(cluster, node, kinds, since) → alert id or None`` (``Ledger.node_bound_alert``).
ConfirmSource = Callable[[str, str, frozenset[str], datetime], Awaitable[str | None]]

@dataclass
class _Cond:
    type: str
    status: str
    since: datetime | None
    reason: str
    message: str


def _conditions(node: k8s.V1Node) -> dict[str, _Cond]:
    out: dict[str, _Cond] = {}
    for c in (node.status.conditions if node.status and node.status.conditions else []):
        since = c.last_transition_time
        if isinstance(since, str):
            since = datetime.fromisoformat(since.replace("Z", "+00:00"))
        out[c.type] = _Cond(c.type, c.status, since, c.reason or "", c.message or "")
    return out


class KubeWatcher:
    """Polls the nodes of one Kubernetes cluster (see module docstring).

    ``api_client``: a ``kubernetes_asyncio`` ApiClient. ``intake``: where annotation
    requests go (``None``: annotations are ignored). ``bmc_probe``: NotReady check
    (``None``: NotReady stays an observation without BMC evidence). ``open_alerts``: the
    ledger's last edge of each level fault this watcher raised (``Ledger.last_level_edges``;
    ``Ledger.open_level_alerts`` also works, without the floor that clears give), read once
    before the first scan (``None``: no reconciliation). ``clock``: monotonic seconds, for
    the BMC re-probe interval. ``confirm``: the node agent's confirmation of a condition
    (``Ledger.node_bound_alert``; ``None``: only ``kubernetes.actionable_conditions``
    repair). ``maintenance``: stores the nodes annotated ``autorepair.io/maintenance`` as
    maintenance windows (:meth:`maintenance_windows`; ``None``: the annotation is not
    read).
    """

    def __init__(
        self, config: AutorepairConfig, cluster: ClusterConfig, sink: AlertSink,
        api_client: k8s.ApiClient, *, intake: RepairIntake | None = None,
        bmc_probe: BmcProbe | None = None, interval_s: float = DEFAULT_INTERVAL_S,
        open_alerts: OpenAlerts | None = None, clock: Callable[[], float] = time.monotonic,
        confirm: ConfirmSource | None = None,
        maintenance: MaintenanceSync | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.sink = sink
        self.api = k8s.CoreV1Api(api_client)
        self.intake = intake
        self.bmc_probe = bmc_probe
        self.interval_s = interval_s
        self._open: dict[tuple[str, str], Alert] = {}
        self._bmc = BmcChecks(config.worker.bmc_reprobe_s)
        self._edges = EdgeTimes()
        self.open_alerts = open_alerts
        self._reconciled = open_alerts is None
        self.clock = clock
        self._machines = {n.name: n.machine for n in cluster.nodes}
        self._pools = {n.name: n.pool for n in cluster.nodes}
        self.confirm = confirm
        self.maintenance = maintenance
        #: when this watcher first saw each node's maintenance annotation
        self._maint_since: dict[str, datetime] = {}

    # -- alerts ----------------------------------------------------------------------
    def _alert(self, node: str, kind: str, text: str, evidence: dict[str, Any],
               at: datetime, active: bool = True) -> Alert:
        return alert_from_fault(
            cluster=self.cluster.name, node=node, kind=kind, code=None, gpu=None,
            evidence_text=text, evidence={**evidence, "watcher": SOURCE}, observed_at=at,
            catalogue=self.config.policy.catalogue, machine_id=self._machines.get(node),
            node_pool=self._pools.get(node), active=active, level=True, source=SOURCE,
        )

    async def _raise(self, node: str, key: str, alert: Alert, sent: list[Alert]) -> None:
        prev = self._open.get((node, key))
        if prev is not None and prev.alert_id == alert.alert_id:
            return
        await self.sink.submit(alert)
        self._open[(node, key)] = alert
        self._edges.raised((node, key), alert.observed_at)
        sent.append(alert)
        log.info("event=kube_alert cluster=%s node=%s kind=%s actionable=%s alert_id=%s",
                 self.cluster.name, node, alert.kind, alert.actionable, alert.alert_id)

    async def _clear(self, node: str, key: str, now: datetime, sent: list[Alert]) -> None:
        prev = self._open.pop((node, key), None)
        if prev is None:
            return
        clear = self._alert(node, prev.kind, prev.evidence_text + " (cleared)",
                            dict(prev.evidence), self._edges.clear_at((node, key), now),
                            active=False)
        await self.sink.submit(clear)
        sent.append(clear)

    async def _trusted(self, node: str, ctype: str, alert: Alert, since: datetime) -> Alert:
        """``alert`` as raised when its condition is opted in or confirmed by the node's
        own agent (evidence ``confirmation``: ``"opted_in"`` / ``"agent"`` with
        ``confirmed_by``); else its observed-only copy (``"unconfirmed"``). An alert the
        catalogue does not make actionable is returned unchanged."""
        if not alert.actionable:
            return alert
        kc = self.cluster.kubernetes
        if ctype in kc.actionable_conditions:
            return alert.model_copy(update={"evidence": {**alert.evidence,
                                                         "confirmation": "opted_in"}})
        found: str | None = None
        kinds = CONDITION_FAMILIES.get(ctype)
        if kinds and self.confirm is not None:
            try:
                found = await self.confirm(self.cluster.name, node, kinds,
                                           since - timedelta(seconds=kc.confirm_window_s))
            except Exception as e:  # the ledger is down: stays observed, asked next scan
                log.warning("event=condition_confirm_failed cluster=%s node=%s error=%s",
                            self.cluster.name, node, type(e).__name__)
        if found is not None:
            text = f"{alert.evidence_text} (confirmed by node agent alert {found})"
            return self._alert(node, alert.kind, text, {
                **{k: v for k, v in alert.evidence.items() if k != "watcher"},
                "confirmation": "agent", "confirmed_by": found}, alert.observed_at)
        return alert.model_copy(update={
            "actionable": False, "action": Action.none,
            "evidence": {**alert.evidence, "confirmation": "unconfirmed"},
            "description": (f"{alert.description} Observed only: node condition {ctype} "
                            "is not confirmed by the node's own agent and not listed in "
                            f"clusters[{self.cluster.name}].kubernetes.actionable_conditions."),
        })

    async def _conditions(self, name: str, conds: dict[str, _Cond], now: datetime,
                          sent: list[Alert]) -> None:
        for ctype, kind in NPD_CONDITIONS.items():
            c = conds.get(ctype)
            if c is not None and c.status == "True":
                at = self._edges.raise_at((name, ctype), c.since or now)
                text = f"node condition {ctype}=True reason={c.reason}: {c.message}"
                cev = {"condition": ctype, "reason": c.reason, "message": c.message,
                       "since": (c.since or at).isoformat(),
                       "detector": "node-problem-detector"}
                alert = await self._trusted(name, ctype, self._alert(name, kind, text, cev, at),
                                            c.since or at)
                await self._raise(name, ctype, alert, sent)
            else:
                await self._clear(name, ctype, now, sent)
        ready = conds.get("Ready")
        if ready is None or ready.status == "True":
            await self._clear(name, "Ready", now, sent)
            await self._clear(name, "Ready+bmc", now, sent)
            self._bmc.end(name)
            return
        at = self._edges.raise_at((name, "Ready"), ready.since or now)
        text = f"node NotReady (Ready={ready.status} reason={ready.reason}): {ready.message}"
        ev: dict[str, Any] = {"condition": "Ready", "status": ready.status,
                              "reason": ready.reason, "since": (ready.since or at).isoformat()}
        observed = self._alert(name, NOT_READY_KIND, text, ev, at)
        # NotReady / unreachable alone is never a repair (docs/design.md §1 rule zero).
        observed = observed.model_copy(update={"actionable": False, "action": Action.none})
        await self._raise(name, "Ready", observed, sent)
        mono = self.clock()
        if self.bmc_probe is None or not self._bmc.due(name, ready.since, mono):
            return
        try:
            bmc = await self.bmc_probe(self.cluster.name, name)
        except Exception as e:  # an unreachable BMC is not evidence; retried next scan
            log.warning("event=bmc_check_failed cluster=%s node=%s error=%s",
                        self.cluster.name, name, type(e).__name__)
            return
        why = bmc_verdict(bmc)
        self._bmc.record(name, ready.since, mono, why is not None)
        log.info("event=bmc_checked cluster=%s node=%s power=%s health=%s actionable=%s",
                 self.cluster.name, name, bmc.get("power_state"), bmc.get("health"), bool(why))
        if why is None:
            return
        a = self._alert(name, NOT_READY_KIND, f"{text}; {why}", {**ev, "bmc": bmc}, at)
        a = a.model_copy(update={
            "actionable": True, "action": Action.power_cycle, "severity": Severity.critical,
            "description": (f"The node is NotReady and {why}: power-cycle the host "
                            "through the BMC."),
        })
        await self._raise(name, "Ready+bmc", a, sent)

    # -- annotation requests -----------------------------------------------------------
    async def _request(self, node: k8s.V1Node, now: datetime) -> dict[str, Any] | None:
        meta = node.metadata
        if (meta.labels or {}).get(REQUEST_LABEL) != "true" or self.intake is None:
            return None
        raw = (meta.annotations or {}).get(REQUEST_ANNOTATION)
        result: dict[str, Any] = {"recorded_at": now.isoformat()}
        try:
            if raw is None:
                raise ValueError(f"annotation {REQUEST_ANNOTATION}: missing")
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"annotation {REQUEST_ANNOTATION}: not a JSON object")
            result["request_id"] = doc.get("request_id")
            if not doc.get("detector"):
                raise ValueError(f"annotation {REQUEST_ANNOTATION}: field 'detector' missing")
            req = RepairCreate.model_validate(
                {**doc, "node": meta.name, "cluster": self.cluster.name})
            detector = str(doc["detector"])
            if detector not in self.cluster.detectors.allowed:
                # Anyone holding nodes/patch (the kubelet for its own Node too) can write
                # this annotation: only the cluster's allowed detectors open repairs.
                why = (f"detector {detector!r} is not in clusters[{self.cluster.name}]"
                       ".detectors.allowed")
                seen = await self.intake.observe_request(req, detector, why)
                result.update({
                    "observed": True, "alert_id": seen.alert_id, "repair_id": None,
                    "refused": True,
                    "reason": (f"{why}: recorded as observed alert {seen.alert_id}; an "
                               "operator may open the repair citing it (autorepair repairs "
                               f"create --evidence-alert {seen.alert_id})"),
                })
            else:
                res = await self.intake.create(
                    req, Requester(kind=RequesterKind.detector, name=detector),
                    skip_approval=True, refuse_remove=True, source=ANNOTATION_SOURCE,
                )
                result.update({"repair_id": res.repair.repair_id, "stage": res.repair.stage,
                               "refused": res.refused, "reason": res.refused_reason})
        except (ValueError, ValidationError) as e:
            result["error"] = str(e)[:1000]
        except IntakeError as e:
            result["error"] = (f"{e.field}: {e.message}" if e.field else e.message)[:1000]
        log.info("event=annotation_request cluster=%s node=%s result=%s",
                 self.cluster.name, meta.name, json.dumps(result))
        # Record first, then drop the label: a crash in between only re-reads an
        # idempotent request.
        await self.api.patch_node(
            meta.name,
            {"metadata": {"labels": {REQUEST_LABEL: None},
                          "annotations": {RESULT_ANNOTATION: json.dumps(result)}}},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
        return result

    @staticmethod
    def _key_of(alert: Alert) -> str | None:
        """The watcher's key of one of its alerts (``Ready``, ``Ready+bmc``, a condition)."""
        if alert.kind == NOT_READY_KIND:
            return "Ready+bmc" if isinstance(alert.evidence.get("bmc"), dict) else "Ready"
        cond = alert.evidence.get("condition")
        return cond if isinstance(cond, str) and cond in NPD_CONDITIONS else None

    async def reconcile(self) -> int:
        """Re-open the level faults this watcher raised that the ledger holds open (a
        restart lost them); returns how many. A clear among ``open_alerts``'s answer (the
        ledger's last edge of a fault that ended) floors the stamp of its next raise.
        Raises what ``open_alerts`` raises."""
        if self.open_alerts is None:
            return 0
        alerts = await self.open_alerts(self.cluster.name, SOURCE)
        n = 0
        for a in alerts:
            key = self._key_of(a)
            if key is None:
                continue
            # Both NotReady alerts (with and without BMC evidence) are stamped from the
            # ``Ready`` key's edges, and the ledger keeps them as one fault: whichever of
            # the two it returns sets the ``Ready`` edges too.
            edge_keys = (key, "Ready") if key == "Ready+bmc" else (key,)
            if not a.active:  # the fault ended: its next raise is stamped after this clear
                for k in edge_keys:
                    self._edges.cleared_before((a.node, k), a.observed_at)
                continue
            if (a.node, key) not in self._open:
                self._open[(a.node, key)] = a
                for k in edge_keys:
                    self._edges.reopened((a.node, k), a.observed_at)
                n += 1
        self._reconciled = True
        self._edges.floor = None
        log.info("event=watcher_reconciled cluster=%s source=%s open=%d",
                 self.cluster.name, SOURCE, n)
        return n

    async def scan_once(self, now: datetime | None = None) -> list[Alert]:
        """One poll of every node; returns the alerts delivered."""
        now = now or datetime.now(UTC)
        if not self._reconciled:
            try:
                await self.reconcile()
            except Exception as e:  # the ledger is down: scan anyway, reconcile next time
                if self._edges.floor is None:
                    self._edges.floor = now  # after every clear the previous run sent
                log.warning("event=watcher_reconcile_failed cluster=%s error=%s",
                            self.cluster.name, e)
        nodes = await self.api.list_node()
        await self._sync_maintenance(nodes.items, now)
        sent: list[Alert] = []
        names: set[str] = set()
        for node in nodes.items:
            name = node.metadata.name
            names.add(name)
            try:
                await self._request(node, now)
            except Exception as e:  # one bad node never stops the scan
                log.warning("event=annotation_request_failed cluster=%s node=%s error=%s",
                            self.cluster.name, name, e)
            await self._conditions(name, _conditions(node), now, sent)
        # A node deleted from the cluster: its conditions ended with it.
        for node_name, key in [k for k in self._open if k[0] not in names]:
            await self._clear(node_name, key, now, sent)
        self._bmc.retain(names)
        self._edges.retain(names, now)
        return sent

    def maintenance_windows(self, nodes: list[k8s.V1Node], now: datetime
                            ) -> list[MaintenanceWindow]:
        """One window per node annotated ``autorepair.io/maintenance`` (value: the reason;
        id ``k8s:CLUSTER:NODE``), from when this watcher first saw the annotation, for at
        most ``policy.maintenance.max_s``: the annotation's writer is as untrusted as any
        annotation's, so it only pauses repair, never for good (issue 29)."""
        max_s = self.config.policy.maintenance.max_s
        seen: set[str] = set()
        out: list[MaintenanceWindow] = []
        for node in nodes:
            meta = node.metadata
            raw = (meta.annotations or {}).get(MAINTENANCE_ANNOTATION)
            if raw is None or not isinstance(meta.name, str):
                continue
            seen.add(meta.name)
            since = self._maint_since.setdefault(meta.name, now)
            end = since + timedelta(seconds=max_s)
            if end <= now:
                continue  # held longer than max_s: repair resumes
            why = " ".join(str(raw).split())[:200] or "maintenance"
            try:
                out.append(MaintenanceWindow(
                    window_id=f"k8s:{self.cluster.name}:{meta.name}",
                    cluster=self.cluster.name, scope="nodes", nodes=[meta.name],
                    source="kubernetes", created_by=f"annotation {MAINTENANCE_ANNOTATION}",
                    reason=f"node annotation: {why}", starts_at=since, ends_at=end))
            except ValueError as e:  # a node name the window model refuses: not paused
                log.warning("event=maintenance_annotation_refused cluster=%s node=%r "
                            "error=%s", self.cluster.name, meta.name, e)
        for name in [n for n in self._maint_since if n not in seen]:
            del self._maint_since[name]
        return out

    async def _sync_maintenance(self, nodes: list[k8s.V1Node], now: datetime) -> None:
        if self.maintenance is None:
            return
        try:
            await self.maintenance(self.cluster.name, "kubernetes",
                                   self.maintenance_windows(nodes, now), now)
        except Exception as e:  # the ledger failed: the next poll tries again
            log.warning("event=watcher_maintenance_sync_failed cluster=%s error=%s",
                        self.cluster.name, e)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Poll until ``stop`` is set (or cancelled); errors are logged and retried."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.scan_once()
            except Exception as e:
                log.warning("event=kube_watch_error cluster=%s error=%s", self.cluster.name, e)
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass
