"""The transport-independent core of ingest: decoded OTLP → score map, alerts, forwarding.

:class:`Ingestor` is shared by the gRPC and HTTP receivers, the API app and the admin
endpoint. It owns the :class:`~ingest.threshold.ScoreMap`, the per-node info (identity
and latest signals), the Prometheus metrics, and hands alerts to an
:class:`~ingest.handoff.AlertSink`. Everything runs on one event loop; nothing here
blocks on I/O but the hand-off of a push's alerts: they are collected while the push is
decoded and handed over together at its end (:meth:`AlertSink.submit_many` when the sink
has it: one outbox round trip per push, :mod:`ingest.handoff`), so a push is answered only
once its alerts are stored.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.auth import ROLE_COLLECTOR, Identity
from ingest.forward import OtlpForwarder, stamp_providers
from ingest.handoff import AlertSink, HandoffRefused, IdentityShareFull
from ingest.inventory import NodeInventory, UnknownNodeGate
from ingest.levels import FaultShape, fault_shape
from ingest.limits import cap_alert
from ingest.metrics import IngestMetrics
from ingest.nccl import NCCL_OWNER_REFUSED, NcclEdge, NcclEngine
from ingest.nccl_wire import decode_nccl
from ingest.otlp import Decoded, FaultRecord, Limits, Resource, decode_logs, decode_metrics
from ingest.quota import (
    COHORT,
    NCCL_COMMUNICATOR,
    QUEUED_ALERTS,
    SENDER,
    SENDER_IS_COLLECTOR,
    UNKNOWN_NODE,
    SenderQuota,
)
from ingest.threshold import (
    DEFAULT_COHORT,
    CohortResult,
    NodeState,
    ScoreMap,
    StragglerEvent,
)
from ingest.unreachable import OpenAlerts, UnreachableTracker
from workflows.catalogue.vocabulary import KNOWN_KINDS
from workflows.config import AutorepairConfig
from workflows.models import Alert
from workflows.policy.bmc import BmcProbe
from workflows.providers import ATTR_PROVIDER, NodeFacts, ProviderInfo, ProviderResolver

log = logging.getLogger("autorepair.ingest")


PANIC_KIND = "straggler_panic"
"""Kind of the cluster-level alert raised when a cohort enters panic mode (docs/design.md §5)."""
REPORTED_HOST_ID = "reported_host_id"
"""Evidence key of the sender's ``host.id`` (evidence only: the alert's machine comes from
configuration and the ledger's bindings)."""
EVIDENCE_BOOT_ID = "boot_id"
"""Evidence key of the boot an agent's fault was reported from (the sender's resource
attribute ``autorepair.host.boot_id``; read by the node and the repair, I20)."""
REPORTED_BY = "reported_by"
"""Evidence key ingest stamps on a sender's alert: the role of its verified identity."""
UNAUTHENTICATED = "unauthenticated"
"""``evidence["reported_by"]`` when the receivers run without authentication."""
NCCL_KIND = "nccl_slow_rank"
"""Kind of the alert naming the node that hosts a persistently late NCCL rank."""


@dataclass(slots=True)
class ThresholdHint:
    """What goes back in the push response headers / gRPC initial metadata."""

    threshold: float = 0.0
    quorum_met: bool = False
    ingero: bool = False

    def http_headers(self) -> list[tuple[bytes, bytes]]:
        """``X-Autorepair-Threshold`` / ``-Quorum-Met`` (+ ``X-Ingero-*`` for Ingero agents)."""
        t = f"{self.threshold:.6f}".encode()
        q = b"true" if self.quorum_met else b"false"
        h = [(b"x-autorepair-threshold", t), (b"x-autorepair-quorum-met", q)]
        if self.ingero:
            h += [(b"x-ingero-threshold", t), (b"x-ingero-quorum-met", q)]
        return h

    def grpc_metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC initial metadata ``autorepair-threshold`` / ``autorepair-quorum-met``."""
        return (
            ("autorepair-threshold", f"{self.threshold:.6f}"),
            ("autorepair-quorum-met", "true" if self.quorum_met else "false"),
        )


@dataclass(slots=True)
class NodeInfo:
    """Latest identity, score and signals of one node (for the state snapshot)."""

    resource: Resource
    score: float | None = None
    state: str = "active"
    last_seen: float = 0.0
    signals: dict[str, float] = field(default_factory=dict)
    straggler: bool = False


@dataclass(slots=True)
class ClusterAlert:
    """A cluster-level alert (panic mode), kept for the state snapshot and logged."""

    cluster: str
    cohort: str
    kind: str
    summary: str
    at: float
    active: bool


@dataclass(slots=True)
class _Staged:
    """An alert of the push being handled; ``on_refused`` undoes what produced it when the
    hand-off refuses the push (so the next push produces it again)."""

    alert: Alert
    on_refused: Callable[[], None] | None = None


#: Alerts of the push the current task is handling (set by ``handle_logs`` /
#: ``handle_metrics``; each request runs in its own task), handed off together at its end.
_PUSH: ContextVar[list[_Staged] | None] = ContextVar("ingest_push_alerts", default=None)


class Ingestor:
    """Core of the ingest service (see module docstring).

    ``clock``: seconds since the epoch (default ``time.time``); tests pass their own.
    ``alert_from_fault``: the function building an :class:`Alert` (default
    ``workflows.alerts.alert_from_fault``). ``bmc_probe`` / ``open_alerts``: the BMC check
    and the ledger's open alerts of the ``node_unreachable`` tracker
    (:mod:`ingest.unreachable`; ``None``: observed only / no reconciliation).
    """

    def __init__(
        self,
        config: AutorepairConfig,
        *,
        alert_sink: AlertSink | None = None,
        forwarder: OtlpForwarder | None = None,
        metrics: IngestMetrics | None = None,
        clock: Callable[[], float] = time.time,
        alert_from_fault: Callable[..., Alert] | None = None,
        temporal_ready: Callable[[], Awaitable[bool]] | None = None,
        bmc_probe: BmcProbe | None = None,
        open_alerts: OpenAlerts | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or IngestMetrics()
        self.metrics.configure_labels(
            known_kinds=KNOWN_KINDS | set(config.policy.catalogue.kinds),
            known_clusters=[c.name for c in config.clusters],
            max_label_values=config.ingest.max_label_values,
            per_identity=config.ingest.limits.label_values_per_identity)
        self.limits = Limits.from_config(config.ingest)
        self.alert_sink = alert_sink
        self.forwarder = forwarder
        self.clock = clock
        self.temporal_ready = temporal_ready
        self._alert_from_fault = alert_from_fault
        self.scores = ScoreMap(
            config.threshold,
            expected_nodes={c.name: c.gpu_node_count for c in config.clusters},
        )
        self.nodes: dict[tuple[str, str], NodeInfo] = {}
        lim = config.ingest.limits
        #: per-identity bounds on sender-chosen values (ingest.quota, ingest.limits)
        self.quota = SenderQuota({
            UNKNOWN_NODE: (lim.unknown_nodes_per_identity, self.scores.ttl_s),
            COHORT: (lim.cohorts_per_identity, self.scores.ttl_s)})
        #: identity whose score opened each cohort (its gauges' labels are charged to it)
        self.cohort_owner: dict[tuple[str, str], str | None] = {}
        #: Nodes of each cluster (config + scheduler lists, :meth:`NodeInventory.update`).
        self.inventory = NodeInventory(config.clusters)
        self.unknown_nodes = UnknownNodeGate(
            self.inventory, burst=config.ingest.unknown_node_burst,
            per_minute=config.ingest.unknown_nodes_per_minute)
        self.cluster_alerts: list[ClusterAlert] = []
        self.alerts_submitted = 0
        self.alerts_refused = 0
        self.last_compute_s: float | None = None
        self.max_future_s = config.ingest.max_future_s
        self.nccl = NcclEngine(config.nccl)
        self.metrics.watch_nccl(self.nccl)
        self.providers = ProviderResolver(config.providers)
        t = config.threshold
        self.unreachable = UnreachableTracker(
            config.ingest.unreachable_after_s or (t.ttl_multiplier + 3) * t.push_interval_s,
            self._unreachable_alert, self._submit_or_defer, bmc_probe=bmc_probe,
            reprobe_s=config.worker.bmc_reprobe_s, open_alerts=open_alerts,
            clusters=[c.name for c in config.clusters],
        )
        start = clock()
        for c in config.clusters:
            for n in c.nodes:
                self.unreachable.expect(self._resource_for(c.name, n.name), start)

    # ------------------------------------------------------------------ alerts
    def _builder(self) -> Callable[..., Alert]:
        if self._alert_from_fault is None:
            from workflows.alerts import alert_from_fault

            self._alert_from_fault = alert_from_fault
        return self._alert_from_fault

    def provider_of(self, res: Resource) -> ProviderInfo:
        """Provider facts of the node behind ``res`` (rules, then its agent's attributes)."""
        return self.providers.resolve(NodeFacts.from_resource(res.cluster, res.node, res.attrs))

    def _stamped(self, res: Resource, evidence: dict[str, Any]) -> dict[str, Any]:
        return {**evidence, ATTR_PROVIDER: None, **self.provider_of(res).attributes()}

    def _forward(self, signal: Literal["metrics", "logs"], req: Any, raw: bytes | None) -> None:
        """Queue ``req`` for forwarding, with provider resource attributes when rules exist."""
        assert self.forwarder is not None
        if self.providers.enabled and stamp_providers(req, self.providers):
            raw = None
        self.forwarder.enqueue(signal, raw if raw is not None else req.SerializeToString())

    def build_alert(
        self, res: Resource, *, kind: str, code: int | None, gpu: str | None,
        evidence_text: str, evidence: dict[str, Any], observed_at: float, active: bool,
        level: bool, source: str,
    ) -> Alert:
        """An :class:`Alert` through ``workflows.alerts.alert_from_fault`` (catalogue
        applied); its evidence carries the node's provider facts (``autorepair.provider``…).

        ``machine_id`` is stamped from configuration and the ledger's bindings
        (:meth:`NodeInventory.machine`), never from the sender: its ``host.id`` is kept as
        ``evidence["reported_host_id"]`` only, so a node cannot put its alerts on another
        machine's migrate gate or ladder history. ``received_at`` is stamped with the
        control plane's clock (I17), not the sender's.

        A fault the agent reported (``source`` ``agent``) carries the boot it was
        reported from, the sender's resource attribute ``autorepair.host.boot_id``, as
        ``evidence["boot_id"]`` (replacing any evidence key of that name the record
        had): the node and the repair tell a report of the boot an action replaced from
        one of the boot it brought by it (I20, the grace after maintenance). Alerts the
        control plane raises (``node_unreachable``, ``straggler``) carry none."""
        if res.machine_id is not None:
            evidence = {**evidence, REPORTED_HOST_ID: res.machine_id}
        if source == "agent" and res.boot_id:
            evidence = {**evidence, EVIDENCE_BOOT_ID: res.boot_id}
        alert = self._builder()(
            cluster=res.cluster, node=res.node, kind=kind, code=code, gpu=gpu,
            evidence_text=evidence_text, evidence=self._stamped(res, evidence),
            observed_at=datetime.fromtimestamp(observed_at, UTC),
            catalogue=self.config.policy.catalogue,
            machine_id=self.inventory.machine(res.cluster, res.node),
            node_pool=self.inventory.pool(res.cluster, res.node, res.node_pool),
            active=active, level=level, source=source,
        )
        # I17: the control plane's receipt time judges recurrence, persistence and edge
        # order; the sender's observed_at is evidence only (its clock may be off)
        return alert.model_copy(
            update={"received_at": datetime.fromtimestamp(self.clock(), UTC)})

    def _resource_for(self, cluster: str, node: str) -> Resource:
        """A node identity from the configuration (for nodes known before they push)."""
        ncfg = next((n for c in self.config.clusters if c.name == cluster for n in c.nodes
                     if n.name == node), None)
        return Resource(cluster=cluster, node=node, cohort=DEFAULT_COHORT,
                        machine_id=ncfg.machine if ncfg else None, boot_id=None,
                        node_pool=ncfg.pool if ncfg else None, k8s_node=None, ingero=False,
                        attrs={})

    def _unreachable_alert(self, res: Resource, kind: str, text: str, evidence: dict[str, Any],
                           at: float, active: bool) -> Alert:
        return self.build_alert(res, kind=kind, code=None, gpu=None, evidence_text=text,
                                evidence=evidence, observed_at=at, active=active, level=True,
                                source="ingest")

    async def _submit_or_defer(self, alert: Alert) -> bool:
        """Submit now (outside any push's batch); False when the hand-off refused it (the
        caller retries later)."""
        token = _PUSH.set(None)
        try:
            await self._submit(alert)
        except HandoffRefused:
            return False
        finally:
            _PUSH.reset(token)
        return True

    async def _submit(self, alert: Alert, on_refused: Callable[[], None] | None = None
                      ) -> None:
        """Gate and cap ``alert``, then stage it with the current push's alerts (handed off
        at the push's end) or, outside a push, hand it off now. Raises
        :class:`HandoffRefused` only in the latter case (after ``on_refused``)."""
        # A node outside the inventory is observed, not repaired, and the workflows
        # started for such nodes are rate-limited per cluster (ingest.inventory).
        gated = self.unknown_nodes.admit(alert, self.clock(), SENDER.get())
        if gated is None:
            label = self.unknown_nodes.label(alert.cluster)
            self.metrics.unknown_nodes_limited_total.labels(label).inc()
            n = self.unknown_nodes.limited[label]
            if n & (n - 1) == 0:  # 1, 2, 4, 8, …: a flood cannot flood the log
                log.warning("event=unknown_node_limited cluster=%s node=%s alert_id=%s "
                            "dropped=%d", alert.cluster, alert.node, alert.alert_id, n)
            return
        if gated is not alert:
            self.metrics.unknown_node_alerts_total.labels(
                self.unknown_nodes.label(alert.cluster)).inc()
            alert = gated
        lim = self.config.ingest
        alert, cut = cap_alert(alert, max_value_chars=lim.max_evidence_value_chars,
                               max_bytes=lim.max_alert_bytes)
        if cut:
            # the cut keys are sender-chosen: quoted (%r), never a forged log line
            log.warning("event=alert_capped cluster=%s node=%s kind=%s alert_id=%s cut=%r",
                        alert.cluster, alert.node, alert.kind, alert.alert_id, ",".join(cut))
        staged = _Staged(alert, on_refused)
        batch = _PUSH.get()
        if batch is not None:
            batch.append(staged)
            return
        await self._commit([staged])

    async def _commit(self, staged: list[_Staged]) -> None:
        """Hand ``staged`` to the sink, all or none (``submit_many``; a sink without it
        gets one ``submit`` each). On :class:`HandoffRefused` every ``on_refused`` runs and
        the error propagates."""
        if not staged:
            return
        if self.alert_sink is None:
            for st in staged:
                a = st.alert
                log.info("event=alert_no_sink cluster=%s node=%s kind=%s alert_id=%s",
                         a.cluster, a.node, a.kind, a.alert_id)
        else:
            try:
                many = getattr(self.alert_sink, "submit_many", None)
                if many is not None:
                    await many([st.alert for st in staged])
                else:
                    for st in staged:
                        await self.alert_sink.submit(st.alert)
            except HandoffRefused as e:
                if isinstance(e, IdentityShareFull):
                    self.metrics.identity_limited_total.labels(QUEUED_ALERTS).inc()
                self.alerts_refused += len(staged)
                for st in staged:
                    if st.on_refused is not None:
                        st.on_refused()
                raise
        for st in staged:
            alert = st.alert
            self.alerts_submitted += 1
            self.metrics.alerts_total.labels(
                alert.kind, alert.severity.value, "true" if alert.actionable else "false"
            ).inc()
            if alert.kind not in KNOWN_KINDS or alert.evidence.get("unmapped"):
                # observed, not decided: an unknown kind, or a known kind whose code or
                # condition the catalogue cannot map (a new Xid, an unlisted SXid)
                self.metrics.unmapped_alerts_total.labels(alert.kind).inc()

    # ----------------------------------------------------------------- metrics
    async def handle_metrics(
        self, req: ExportMetricsServiceRequest, transport: str, raw: bytes | None = None,
        *, identity: Identity | None = None,
    ) -> tuple[ExportMetricsServiceResponse, ThresholdHint]:
        """Apply one metrics export. ``raw``: the serialized request when already at hand
        (saves re-serializing for forwarding). ``identity``: the sender's verified
        identity (``None``: authentication off), whose per-identity bounds apply
        (``ingest.limits``, :meth:`bound`). Returns the response (with
        ``partial_success`` when anything was rejected) and the threshold hint."""
        now = self.clock()
        d = decode_metrics(req, now, max_future_s=self.max_future_s, ttl_s=self.scores.ttl_s,
                           limits=self.limits)
        sender = SENDER.set(identity.id if identity is not None else None)
        collector = SENDER_IS_COLLECTOR.set(
            identity is not None and identity.role == ROLE_COLLECTOR)
        try:
            self.bound(d, identity, now)
            batch: list[_Staged] = []
            token = _PUSH.set(batch)
            try:
                hint = await self._apply_metrics(d, req, now, identity)
            finally:
                _PUSH.reset(token)
            try:
                await self._commit(batch)
            except HandoffRefused as e:
                # derived alerts (stragglers, NCCL): undone by on_refused, raised again by
                # a later push; the push itself was applied, so it is answered
                log.warning("event=derived_alerts_deferred alerts=%d error=%r", len(batch),
                            str(e))
        finally:
            SENDER_IS_COLLECTOR.reset(collector)
            SENDER.reset(sender)
        self._contact(req, now)
        await self.unreachable.flush(now)
        self._count_rejected(d, transport, "metrics")
        if self.forwarder is not None:
            self._forward("metrics", req, raw)
        resp = ExportMetricsServiceResponse()
        if d.rejected:
            resp.partial_success.CopyFrom(ExportMetricsPartialSuccess(
                rejected_data_points=d.rejected, error_message=d.error_message()))
        return resp, hint

    def bound(self, d: Decoded, identity: Identity | None, now: float) -> None:
        """Apply the per-identity bounds (``ingest.limits``, :mod:`ingest.quota`) to a
        decoded push, in place: points and records about a node outside the inventory
        beyond ``unknown_nodes_per_identity`` distinct ones, and scores of a cohort beyond
        ``cohorts_per_identity``, are rejected (reason code ``limit``), each refusal
        counted in ``autorepair_identity_limited_total{what}``. ``identity`` ``None``: no
        bound. Other identities' state is never touched."""
        if identity is None:
            return
        owner = identity.id
        seen: dict[tuple[str, str], bool] = {}

        def node_ok(r: Resource) -> bool:
            key = (r.cluster, r.node)
            ok = seen.get(key)
            if ok is None:
                ok = (self.inventory.known(r.cluster, r.node)
                      or self.quota.admit(owner, UNKNOWN_NODE, key, now))
                if not ok:
                    self.metrics.identity_limited_total.labels(UNKNOWN_NODE).inc()
                seen[key] = ok
            return ok

        def keep(items: list[Any], res: Callable[[Any], Resource], count: Callable[[Any], int],
                 code_msg: str) -> list[Any]:
            out = []
            for it in items:
                if node_ok(res(it)):
                    out.append(it)
                else:
                    d.reject("limit", code_msg, count(it))
            return out

        unknown = (f"host.name: over {self.config.ingest.limits.unknown_nodes_per_identity} "
                   "nodes outside the inventory for this identity "
                   "(ingest.limits.unknown_nodes_per_identity)")
        d.scores = keep(d.scores, lambda p: p.resource, lambda p: 1, unknown)
        d.signals = keep(d.signals, lambda p: p.resource, lambda p: len(p.values), unknown)
        d.faults = keep(d.faults, lambda f: f.resource, lambda f: 1, unknown)
        d.nccl = keep(d.nccl, lambda x: x[0], lambda x: _points(x[1]), unknown)
        scores = []
        for p in d.scores:
            key = (p.resource.cluster, p.resource.cohort)
            if self.quota.admit(owner, COHORT, key, now):
                scores.append(p)
                self.cohort_owner.setdefault(key, owner)
            else:
                self.metrics.identity_limited_total.labels(COHORT).inc()
                d.reject("limit", f"autorepair.workload_type: over "
                         f"{self.config.ingest.limits.cohorts_per_identity} cohorts for this "
                         "identity (ingest.limits.cohorts_per_identity)")
        d.scores = scores
        if d.rejected and d.codes.get("limit"):
            n = sum(self.quota.refused.values())
            if n & (n - 1) == 0:  # 1, 2, 4, …: a flood cannot flood the log
                log.warning("event=identity_limited identity=%r refused=%d", owner, n)

    async def _apply_metrics(self, d: Decoded, req: Any, now: float,
                             identity: Identity | None = None) -> ThresholdHint:
        """Scores, signals and NCCL points of one decoded metrics push; returns the hint."""
        hint = ThresholdHint()
        hint_set = False
        for p in d.scores:
            r = p.resource
            obs = self.scores.observe(r.cluster, r.cohort, r.node, p.score, p.state, now)
            info = self._info(r, now)
            info.score = p.score
            info.state = p.state.name.lower()
            if not hint_set:
                hint = ThresholdHint(obs.threshold, obs.quorum_met, r.ingero)
                hint_set = True
            if obs.event is not None:
                info.straggler = obs.event is StragglerEvent.RAISED
                await self._straggler_alert(r, p.score, obs.event, now)
        for s in d.signals:
            self._info(s.resource, now).signals.update(s.values)
        if d.nccl:
            await self._nccl_points(d, now, identity)
        if not hint_set:
            hint = self._hint_for_request(d, req)
        return hint

    async def _nccl_points(self, d: Decoded, now: float,
                           identity: Identity | None = None) -> None:
        """Feed NCCL timing points to the engine; rejections join the request's. A new
        communicator beyond the identity's ``ingest.limits.nccl_communicators_per_*`` is
        refused (reason code ``limit``)."""
        lim = self.config.ingest.limits
        owner = identity.id if identity is not None else None
        cap = None if identity is None else (
            lim.nccl_communicators_per_collector if identity.role == ROLE_COLLECTOR
            else lim.nccl_communicators_per_identity)
        for res, m in d.nccl:
            if not self.config.nccl.enabled:
                d.ignored_metrics += _points(m)
                continue
            for cols in decode_nccl(m, lambda why: d.reject("nccl", why)):
                before = self.nccl.owner_refused
                for reason, k in self.nccl.observe_batch(
                        res.cluster, res.node, cols.comm, cols.nranks, cols.seq, cols.rank,
                        cols.dur, cols.op_type, now, owner=owner, owner_cap=cap):
                    d.reject("limit" if reason.startswith(NCCL_OWNER_REFUSED) else "nccl",
                             reason, k)
                if self.nccl.owner_refused != before:
                    self.metrics.identity_limited_total.labels(NCCL_COMMUNICATOR).inc(
                        self.nccl.owner_refused - before)
        await self._nccl_alerts()

    async def _nccl_alerts(self) -> None:
        """Hand the engine's ``nccl_slow_rank`` raise/clear edges to the node's workflow,
        through the same path as stragglers. A refused hand-off defers the edge (the next
        op raises it again)."""
        for edge in self.nccl.drain():
            log.info("event=nccl_slow_rank_%s cluster=%s comm=%s node=%s share=%.2f "
                     "median_lag_ms=%.3f", "raised" if edge.active else "cleared",
                     edge.cluster, edge.comm, edge.node, edge.share, edge.median_lag_ms)
            alert = self._nccl_alert(edge)

            def defer(edge: NcclEdge = edge) -> None:
                self.nccl.defer(edge)
                log.warning("event=nccl_alert_deferred cluster=%s node=%s", edge.cluster,
                            edge.node)

            with contextlib.suppress(HandoffRefused):
                await self._submit(alert, on_refused=defer)

    def _nccl_alert(self, edge: NcclEdge) -> Alert:
        info = self.nodes.get((edge.cluster, edge.node))
        r = info.resource if info is not None else None
        return self._builder()(
            cluster=edge.cluster, node=edge.node, kind=NCCL_KIND, code=None, gpu=None,
            evidence_text=edge.text(),
            evidence=self._stamped(r, edge.evidence()) if r is not None else edge.evidence(),
            observed_at=datetime.fromtimestamp(edge.at, UTC),
            catalogue=self.config.policy.catalogue,
            machine_id=self.inventory.machine(edge.cluster, edge.node),
            node_pool=self.inventory.pool(edge.cluster, edge.node,
                                          r.node_pool if r is not None else None),
            active=edge.active, level=True, source="ingest",
        )

    def _hint_for_request(self, d: Decoded, req: Any) -> ThresholdHint:
        """Hint when the request had no accepted score: from its first identified resource."""
        from ingest.otlp import attributes, decode_resource

        blocks = getattr(req, "resource_metrics", None) or getattr(req, "resource_logs", [])
        for b in blocks:
            r = decode_resource(attributes(b.resource.attributes))
            if not isinstance(r, str):
                thr, q = self.scores.published(r.cluster, r.cohort)
                return ThresholdHint(thr, q, r.ingero)
        return ThresholdHint()

    def _contact(self, req: Any, now: float) -> None:
        """Every node a push names is in contact (``node_unreachable``), whatever the
        push carried: a score, signals, faults, NCCL points, nothing the control plane
        keeps (an agent's empty window sends its detection-mode gauge only), or points
        refused as too far ahead. The receivers refuse (403) a push whose identity may
        not speak for a node it names, so a node named here is one the sender speaks
        for; nodes outside the inventory count only once already tracked (an accepted
        score or fault), so a sender cannot grow the tracker with made-up names."""
        from ingest.otlp import attributes, decode_resource

        blocks = getattr(req, "resource_metrics", None) or getattr(req, "resource_logs", [])
        for b in blocks:
            r = decode_resource(attributes(b.resource.attributes))
            if isinstance(r, str):
                continue  # no usable identity: rejected with its reason by the decoder
            if self.inventory.known(r.cluster, r.node) or self.unreachable.tracks(r):
                self.unreachable.seen(r, now)

    def _info(self, r: Resource, now: float) -> NodeInfo:
        key = (r.cluster, r.node)
        info = self.nodes.get(key)
        if info is None:
            info = NodeInfo(r)
            self.nodes[key] = info
        else:
            info.resource = r
        info.last_seen = now
        self.unreachable.seen(r, now)
        return info

    def _count_rejected(self, d: Decoded, transport: str, signal: str) -> None:
        if d.rejected:
            for code, n in d.codes.items():
                self.metrics.otlp_rejected_total.labels(transport, signal, code).inc(n)
            log.info("event=otlp_rejected transport=%s signal=%s count=%d reasons=%r",
                     transport, signal, d.rejected, dict(d.reasons.most_common(3)))

    async def _straggler_alert(
        self, r: Resource, score: float, event: StragglerEvent, now: float
    ) -> None:
        c = self.scores.cohorts.get((r.cluster, r.cohort))
        res = c.last_result if c is not None else None
        thr = c.published.threshold if c is not None else 0.0
        pushes = (self.config.threshold.straggler_pushes if event is StragglerEvent.RAISED
                  else self.config.threshold.recovery_pushes)
        relation = "below" if event is StragglerEvent.RAISED else "at or above"
        text = (f"health score {score:.4f} {relation} straggler threshold {thr:.4f} for "
                f"{pushes} consecutive pushes (cohort {r.cohort})")
        evidence: dict[str, Any] = {
            "score": score, "threshold": thr, "cohort": r.cohort, "pushes": pushes,
            "median": None if res is None or math.isnan(res.median) else res.median,
            "mad": None if res is None or math.isnan(res.mad) else res.mad,
            "active_nodes": None if res is None else res.active_nodes,
            "classified_by": "ingest",
        }
        log.info("event=straggler_%s cluster=%s node=%s score=%.4f threshold=%.4f",
                 event.value, r.cluster, r.node, score, thr)
        alert = self.build_alert(
            r, kind="straggler", code=None, gpu=None, evidence_text=text, evidence=evidence,
            observed_at=now, active=event is StragglerEvent.RAISED, level=True,
            source="ingest",
        )

        def undo() -> None:
            # The edge would be lost; undo it so the next push re-raises it.
            if c is not None and r.node in c.index:
                c.straggler[c.index[r.node]] = event is StragglerEvent.CLEARED
            log.warning("event=straggler_alert_deferred cluster=%s node=%s", r.cluster, r.node)

        with contextlib.suppress(HandoffRefused):
            await self._submit(alert, on_refused=undo)

    # -------------------------------------------------------------------- logs
    async def handle_logs(
        self, req: ExportLogsServiceRequest, transport: str, raw: bytes | None = None,
        *, reporter: str | None = None, identity: Identity | None = None,
    ) -> tuple[ExportLogsServiceResponse, ThresholdHint]:
        """Apply one logs export: each fault / straggler record becomes an alert.

        ``reporter``: the role of the sender's verified identity (``"node"``: a per-node
        token or certificate, bound to the one node it reports for; ``"collector"``;
        ``None``: authentication off). Stamped on every alert as
        ``evidence["reported_by"]`` (:data:`REPORTED_BY`; ``"unauthenticated"`` for
        ``None``), replacing any value the sender put there: what confirms a Kubernetes
        node condition (``workers.watchers.kube``) is the node's own report.
        ``identity``: the verified identity itself (its role is the ``reporter`` when
        ``reporter`` is not given); its per-identity bounds apply (:meth:`bound`).

        The push's alerts are handed off together once all are built (stored in one round
        trip with an outbox). Raises :class:`HandoffRefused` when the hand-off cannot take
        them (queue full, PostgreSQL unreachable): nothing of the push was taken and the
        receiver answers 503 / UNAVAILABLE (retryable); the re-sent push is de-duplicated
        by the stable ``alert_id``s.
        """
        now = self.clock()
        d = decode_logs(req, now, max_future_s=self.max_future_s, limits=self.limits)
        if reporter is None and identity is not None:
            reporter = identity.role
        sender = SENDER.set(identity.id if identity is not None else None)
        collector = SENDER_IS_COLLECTOR.set(
            identity is not None and identity.role == ROLE_COLLECTOR)
        try:
            self.bound(d, identity, now)
            batch: list[_Staged] = []
            token = _PUSH.set(batch)
            try:
                for f in d.faults:
                    self.unreachable.seen(f.resource, now)
                    why = await self._fault_alert(f, reporter or UNAUTHENTICATED)
                    if why is not None:
                        d.reject("fault", f"log record: {why}")
            finally:
                _PUSH.reset(token)
            await self._commit(batch)
        finally:
            SENDER_IS_COLLECTOR.reset(collector)
            SENDER.reset(sender)
        self._contact(req, now)
        await self.unreachable.flush(now)
        self._count_rejected(d, transport, "logs")
        if self.forwarder is not None:
            self._forward("logs", req, raw)
        resp = ExportLogsServiceResponse()
        if d.rejected:
            resp.partial_success.CopyFrom(ExportLogsPartialSuccess(
                rejected_log_records=d.rejected, error_message=d.error_message()))
        return resp, self._hint_for_request(d, req)

    async def _fault_alert(
        self, f: FaultRecord, reporter: str = "unauthenticated",
    ) -> str | None:
        """Build and submit the alert of ``f``; returns why no alert could be built from
        it (the record is counted rejected in the response's ``partial_success``,
        docs/wire-contract.md), None when it was submitted."""
        # Level fault or event, and which raise a clear ends (ingest.levels).
        shape = fault_shape(f.kind, f.gpu, f.active, f.evidence)
        if f.kind == "straggler":
            shape = FaultShape(f.kind, f.gpu, f.active, True)
        try:
            alert = self.build_alert(
                f.resource, kind=shape.kind, code=f.code, gpu=shape.gpu,
                evidence_text=f.evidence_text,
                evidence={**f.evidence, **({"pci": shape.pci} if shape.pci else {}),
                          REPORTED_BY: reporter},
                observed_at=f.time_s, active=shape.active, level=shape.level, source="agent",
            )
        except (ValueError, TypeError) as e:
            # the error may quote sender text: %r, never a forged log line
            log.warning("event=alert_build_failed cluster=%s node=%s kind=%s error=%r",
                        f.resource.cluster, f.resource.node, f.kind, str(e))
            return str(e)[:200]
        await self._submit(alert)
        return None

    # ----------------------------------------------------------------- compute
    async def compute(self) -> list[CohortResult]:
        """One recompute of every cohort: expiry, thresholds, metrics, panic alerts."""
        now = self.clock()
        t0 = time.perf_counter()
        results = self.scores.compute(now)
        self.metrics.threshold_compute_seconds.observe(time.perf_counter() - t0)
        for key in [k for k in self.cohort_owner if k not in self.scores.cohorts]:
            del self.cohort_owner[key]
        self.metrics.publish(results, lambda cl, co: self.cohort_owner.get((cl, co)))
        cutoff = now - self.scores.ttl_s
        for key in [k for k, v in self.nodes.items() if v.last_seen < cutoff]:
            del self.nodes[key]
        self.nccl.sweep(now)
        await self._nccl_alerts()
        await self.unreachable.check(now, self._resource_for)
        for res in results:
            edge = self._panic_edges(res, now)
            if edge is not None:
                await self._panic_alert(res, edge, now)
        self.last_compute_s = now
        return results

    async def _panic_alert(self, res: CohortResult, edge: ClusterAlert, now: float) -> None:
        """Hand the panic raise/clear to Temporal as a cluster-level alert (node ``*``),
        delivered to the cluster's guard: recorded in the ledger, notified. A full hand-off
        queue drops it with a warning (it stays in the snapshot and the metrics)."""
        alert = self._builder()(
            cluster=res.cluster, node="*", kind=PANIC_KIND, code=None, gpu=None,
            evidence_text=edge.summary,
            evidence={"cohort": res.cohort, "flagged": res.flagged,
                      "active_nodes": res.active_nodes, "threshold": res.threshold},
            observed_at=datetime.fromtimestamp(edge.at, UTC),
            catalogue=self.config.policy.catalogue, active=edge.active, level=True,
            source="ingest",
        )
        if self.alert_sink is None:
            return
        try:
            await self.alert_sink.submit(alert)
        except Exception as exc:
            log.warning("event=panic_alert_not_delivered cluster=%s error=%s", res.cluster,
                        type(exc).__name__)

    def _panic_edges(self, res: CohortResult, now: float) -> ClusterAlert | None:
        """Record panic start / end for ``res``; returns the new edge, if any."""
        active = [a for a in self.cluster_alerts if a.active and a.kind == PANIC_KIND
                  and a.cluster == res.cluster and a.cohort == res.cohort]
        if res.panic_started:
            summary = (f"panic: {res.flagged} of {res.active_nodes} active nodes below the "
                       f"threshold; threshold frozen at {res.threshold:.4f}")
            edge = ClusterAlert(res.cluster, res.cohort, PANIC_KIND, summary, now, True)
            self.cluster_alerts.append(edge)
            self.metrics.alerts_total.labels(PANIC_KIND, "critical", "false").inc()
            log.error("event=panic_mode cluster=%s cohort=%s flagged=%d active=%d threshold=%.4f",
                      res.cluster, res.cohort, res.flagged, res.active_nodes, res.threshold)
        elif not res.panic and active:
            for a in active:
                a.active = False
            edge = ClusterAlert(res.cluster, res.cohort, PANIC_KIND, "panic cleared", now, False)
            self.cluster_alerts.append(edge)
            log.warning("event=panic_cleared cluster=%s cohort=%s", res.cluster, res.cohort)
        else:
            edge = None
        del self.cluster_alerts[:-100]
        return edge

    # ------------------------------------------------------------------- views
    def threshold_view(self, cluster_id: str, cohort: str | None = None) -> dict[str, Any]:
        """``GET /api/v1/threshold`` body (docs/design.md §4.3) for ``cluster_id``.

        Top-level fields describe ``cohort`` when given, else the cluster's only cohort, else
        the cohort with most active nodes (``DEFAULT_COHORT`` first on ties); ``cohorts``
        maps every cohort to its own answer. An unknown cluster gets the cold-start shape
        (``threshold`` 0, ``quorum_met`` false).
        """
        per = {r.cohort: r for r in self.scores.results() if r.cluster == cluster_id}
        chosen: CohortResult | None
        if cohort is not None:
            chosen = per.get(cohort)
        elif per:
            chosen = max(per.values(),
                         key=lambda r: (r.active_nodes, r.cohort == DEFAULT_COHORT))
        else:
            chosen = None
        body: dict[str, Any] = {
            "cluster_id": cluster_id, "cohort": cohort or (chosen.cohort if chosen else None),
            "threshold": 0.0, "quorum_met": False, "median": None, "mad": None,
            "active_nodes": 0, "panic": False, "computed_at": None,
        }
        if chosen is not None:
            body.update(chosen.as_api())
            body["computed_at"] = datetime.fromtimestamp(chosen.computed_at, UTC).isoformat()
        body["cohorts"] = {name: r.as_api() for name, r in sorted(per.items())}
        return body

    def snapshot(self, cluster_id: str | None = None) -> dict[str, Any]:
        """Read-only state: cohorts, nodes (score, state, signals, straggler, provider facts
        ``{"provider", "region", "gpu_type", "gpus_per_node", "hourly_rate", "currency"}``),
        cluster alerts, NCCL slow ranks.

        Shape: ``{"computed_at", "cohorts": [...], "nodes": [...], "cluster_alerts": [...],
        "alerts": {"submitted", "refused", "queue_depth"}, "nccl": {"communicators",
        "pending_ops", "slow_ranks": [...]}}``; times in epoch seconds.
        """
        strag: set[tuple[str, str]] = set()
        for (cl, _), c in self.scores.cohorts.items():
            strag.update((cl, n) for n in c.stragglers())
        nodes = []
        for (cl, node), info in sorted(self.nodes.items()):
            if cluster_id is not None and cl != cluster_id:
                continue
            r = info.resource
            nodes.append({
                "cluster": cl, "node": node, "cohort": r.cohort, "machine_id": r.machine_id,
                "boot_id": r.boot_id, "node_pool": r.node_pool, "k8s_node": r.k8s_node,
                "score": info.score, "state": info.state, "signals": dict(info.signals),
                "straggler": (cl, node) in strag, "last_seen": info.last_seen,
                "provider": self.provider_of(r).model_dump(),
            })
        depth = 0
        if self.alert_sink is not None and hasattr(self.alert_sink, "depth"):
            depth = int(self.alert_sink.depth())
        return {
            "computed_at": self.last_compute_s,
            "cohorts": [
                {"cluster_id": r.cluster, "cohort": r.cohort, **r.as_api()}
                for r in self.scores.results()
                if cluster_id is None or r.cluster == cluster_id
            ],
            "nodes": nodes,
            "cluster_alerts": [
                {"cluster_id": a.cluster, "cohort": a.cohort, "kind": a.kind,
                 "summary": a.summary, "at": a.at, "active": a.active}
                for a in self.cluster_alerts
                if cluster_id is None or a.cluster == cluster_id
            ],
            "alerts": {"submitted": self.alerts_submitted, "refused": self.alerts_refused,
                       "queue_depth": depth},
            "nccl": {
                "communicators": len(self.nccl.comms), "pending_ops": self.nccl.pending_ops(),
                "slow_ranks": [
                    {"cluster_id": cl, "comm": comm, "node": node, "ranks": list(a.ranks),
                     "share": a.share, "median_lag_ms": a.median_lag_ms, "alerted": a.alerted}
                    for cl, comm, node, a in self.nccl.attributions()
                    if cluster_id is None or cl == cluster_id
                ],
            },
        }

    async def readiness(self) -> tuple[bool, dict[str, bool]]:
        """Ready once the first recompute ran and Temporal answers (when a check is set)."""
        computed = self.last_compute_s is not None
        temporal = True
        if self.temporal_ready is not None:
            try:
                temporal = bool(await self.temporal_ready())
            except Exception:
                temporal = False
        return computed and temporal, {"threshold_computed": computed, "temporal": temporal}


def _points(m: Any) -> int:
    """Data points of one OTLP ``Metric`` (any data type)."""
    return len(getattr(m, m.WhichOneof("data") or "gauge").data_points)


def node_state_name(state: NodeState) -> str:
    """``NodeState.ACTIVE`` → ``"active"``."""
    return state.name.lower()
