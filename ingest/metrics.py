"""Prometheus metrics of the ingest service (docs/design.md §4.5), on a per-service registry.

Each :class:`IngestMetrics` owns its own ``CollectorRegistry`` so several services in one
process (tests) never collide. Names of docs/design.md §4.5 are kept exactly; the extra series
(``autorepair_otlp_rejected_total``, ``autorepair_alert_handoff_total``, …) are this
service's own and documented here. ``autorepair_unknown_nodes_limited_total{cluster}`` and
``autorepair_unknown_node_alerts_total{cluster}`` count alerts about nodes outside the
inventory (:mod:`ingest.inventory`), labelled by configured cluster or ``other``.

``autorepair_repairs_total``, ``autorepair_breaker_open`` and the downtime series
(``autorepair_repair_downtime_gpu_hours_total``,
``autorepair_repair_idle_wait_gpu_hours_total``, ``autorepair_repair_cost_total``, labels
``cluster``, ``action``, ``fault_kind``) belong to the repair path;
they are registered here because docs/design.md §4.5 serves every series on the API port's
``/metrics``, and kept current from Temporal by :mod:`ingest.repair_metrics`.

Bounded cardinality: label values chosen by whoever pushes (fault kinds, cluster ids,
cohorts) pass through a :class:`LabelGuard` so that no sender can create unbounded series
(each series costs memory here and in Prometheus). Kinds outside the known vocabulary are
counted as ``other`` in ``autorepair_alerts_total``; ``autorepair_unmapped_alerts_total``
names the first ``max_label_values`` unknown kinds, then ``other``. Per-cluster gauges
exist for the configured clusters and the first ``max_label_values`` others, with at most
:data:`MAX_COHORTS_PER_CLUSTER` cohorts each; the rest are not exported and counted in
``autorepair_metric_series_capped``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ingest.nccl import NcclEngine
from ingest.quota import LABEL_VALUE, SENDER, WHATS
from ingest.threshold import CohortResult

#: Handler latency buckets, seconds: 0.5 ms … 1 s (the ingest's target is p99 ≤ 20 ms,
#: measured by tests/bench/ingest.py).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Default distinct sender-chosen label values (``ingest.max_label_values``).
DEFAULT_MAX_LABEL_VALUES = 64
#: Cohorts exported per cluster: docs/design.md §4.3 names two workload types (training,
#: inference); sixteen leaves room for site-defined pools without unbounded series.
MAX_COHORTS_PER_CLUSTER = 16
#: Label value substituted for values outside the guard's budget.
OTHER = "other"
_CURRENT = object()
"""Default owner of :meth:`LabelGuard.admit`: the identity of the push being handled."""
_LABEL_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,62}")


class LabelGuard:
    """Bounds the values of one label.

    ``known`` values always pass. Up to ``budget`` further values pass, first come first
    served, when they look like identifiers (letters, digits, ``_.:/-``, at most 63
    characters); every other value maps to ``None`` (the caller exports ``other`` or
    nothing). Admitted values stay admitted for the life of the process.

    ``per_owner`` (``ingest.limits.label_values_per_identity``; ``None``: no per-owner
    bound) bounds how many of the ``budget`` values one identity may introduce, so one
    credential cannot take the budget every sender shares. The owner is the identity of
    the push being handled (:data:`ingest.quota.SENDER`) unless ``admit`` is given one;
    ``None`` (no authentication, or a value the control plane chose) is not bounded.
    ``on_refused`` is called for each value refused by the per-owner bound.
    """

    def __init__(self, known: Iterable[str] = (), budget: int = DEFAULT_MAX_LABEL_VALUES,
                 *, per_owner: int | None = None,
                 on_refused: Callable[[], None] | None = None) -> None:
        self.known = frozenset(known)
        self.budget = budget
        self.per_owner = per_owner
        self.on_refused = on_refused
        self.admitted: set[str] = set()
        self.owned: dict[str, int] = {}

    def admit(self, value: str, owner: str | object | None = _CURRENT) -> str | None:
        """``value`` when it may be a label value, else ``None``."""
        if value in self.known or value in self.admitted:
            return value
        if len(self.admitted) >= self.budget or not _LABEL_SHAPE.fullmatch(value):
            return None
        who = SENDER.get() if owner is _CURRENT else owner
        if isinstance(who, str) and self.per_owner is not None:
            if self.owned.get(who, 0) >= self.per_owner:
                if self.on_refused is not None:
                    self.on_refused()
                return None
            self.owned[who] = self.owned.get(who, 0) + 1
        self.admitted.add(value)
        return value


class _NoSeries:
    """Child of a refused gauge label set: setting it does nothing."""

    def set(self, value: float) -> None:
        pass

    def inc(self, amount: float = 1) -> None:
        pass


class BoundedLabels:
    """A labelled metric whose label at position ``index`` goes through ``guard``.

    ``labels(*values)`` returns the child for the guarded value, or: the ``other`` child
    (``refused="other"``, for counters: nothing is lost from totals) or a child that
    records nothing (``refused="drop"``, for gauges: a value of ``other`` would mean
    nothing). Every other attribute is the wrapped metric's.
    """

    def __init__(self, metric: Any, index: int, guard: LabelGuard, refused: str) -> None:
        self.metric = metric
        self.index = index
        self.guard = guard
        self.refused = refused

    def labels(self, *values: str) -> Any:
        """The child of ``values`` after the guard (see class docstring)."""
        v = list(values)
        ok = self.guard.admit(str(v[self.index]))
        if ok is None:
            if self.refused == "drop":
                return _NoSeries()
            v[self.index] = OTHER
        return self.metric.labels(*v)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)


class IngestMetrics:
    """All series of one ingest service. ``render()`` gives the text exposition."""

    def __init__(self, *, known_kinds: Iterable[str] = (), known_clusters: Iterable[str] = (),
                 max_label_values: int = DEFAULT_MAX_LABEL_VALUES) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.identity_limited_total = Counter(
            "autorepair_identity_limited_total",
            "Sender-chosen values refused by a per-identity cap (ingest.limits; what: "
            "unknown_node, cohort, nccl_communicator, label_value)", ["what"], registry=r)
        for what in WHATS:
            self.identity_limited_total.labels(what)
        label_refused = self.identity_limited_total.labels(LABEL_VALUE).inc
        self._label_refused = label_refused
        self.label_values_per_identity: int | None = None
        self.kinds = LabelGuard(known_kinds, 0)
        self.unmapped_kinds = LabelGuard((), max_label_values, on_refused=label_refused)
        self.clusters = LabelGuard(known_clusters, max_label_values, on_refused=label_refused)
        #: fault kinds of repairs (``manual``: a repair with no alert behind it)
        self.fault_kinds = LabelGuard([*known_kinds, "manual"], max_label_values)
        self._cohorts_of: dict[str, LabelGuard] = {}
        cc = ["cluster_id", "cohort"]
        self.threshold = Gauge("autorepair_threshold", "Published straggler threshold", cc,
                               registry=r)
        self.median = Gauge("autorepair_median", "Median health score of active nodes", cc,
                            registry=r)
        self.mad = Gauge("autorepair_mad", "MAD of active health scores", cc, registry=r)
        self.active_nodes = Gauge("autorepair_active_nodes", "Active nodes in the cohort", cc,
                                  registry=r)
        self.idle_nodes = Gauge("autorepair_idle_nodes", "Idle nodes in the cohort", cc,
                                registry=r)
        self.coverage_low = Gauge("autorepair_coverage_low",
                                  "1 when reporting nodes < coverage × expected", cc, registry=r)
        self.panic_mode = Gauge("autorepair_panic_mode",
                                "1 while the threshold is frozen (panic)", cc, registry=r)
        self.stragglers = Gauge("autorepair_stragglers",
                                "Nodes classified as stragglers (server side)", cc, registry=r)
        self.alerts_total = BoundedLabels(
            Counter("autorepair_alerts_total", "Alerts produced",
                    ["kind", "severity", "actionable"], registry=r), 0, self.kinds, OTHER)
        self.unmapped_alerts_total = BoundedLabels(
            Counter("autorepair_unmapped_alerts_total", "Alerts of a kind outside the catalogue",
                    ["kind"], registry=r), 0, self.unmapped_kinds, OTHER)
        self.repairs_total = Counter("autorepair_repairs_total", "Repairs by outcome",
                                     ["action", "outcome"], registry=r)
        dk = ["cluster", "action", "fault_kind"]

        def downtime_counter(name: str, doc: str) -> BoundedLabels:
            # cluster and fault kind bounded like the other sender-influenced labels
            inner = BoundedLabels(Counter(name, doc, dk, registry=r), 0, self.clusters, OTHER)
            return BoundedLabels(inner, 2, self.fault_kinds, OTHER)

        self.repair_downtime_gpu_hours_total = downtime_counter(
            "autorepair_repair_downtime_gpu_hours_total",
            "GPU-hours lost to finished repairs, cordon to rejoin")
        self.repair_idle_wait_gpu_hours_total = downtime_counter(
            "autorepair_repair_idle_wait_gpu_hours_total",
            "Part of the GPU-hours lost spent waiting for the workload to finish")
        self.repair_cost_total = downtime_counter(
            "autorepair_repair_cost_total",
            "Cost of the GPU-hours lost to finished repairs (providers.currency)")
        self.breaker_open = BoundedLabels(
            Gauge("autorepair_breaker_open", "1 while the breaker is open", ["cluster_id"],
                  registry=r), 0, self.clusters, "drop")
        self.otlp_requests_total = Counter("autorepair_otlp_requests_total", "OTLP requests",
                                           ["transport", "outcome"], registry=r)
        self.otlp_request_seconds = Histogram("autorepair_otlp_request_seconds",
                                              "OTLP handler latency", ["transport"],
                                              buckets=LATENCY_BUCKETS, registry=r)
        self.otlp_rejected_total = Counter(
            "autorepair_otlp_rejected_total",
            "Rejected data points and log records by reason (ingest.otlp.REASONS)",
            ["transport", "signal", "reason"], registry=r)
        self.series_capped = Gauge(
            "autorepair_metric_series_capped",
            "Cohorts whose gauges are not exported (label cardinality cap)", registry=r)
        self.alert_handoff_total = Counter(
            "autorepair_alert_handoff_total", "Alert hand-off to Temporal by outcome",
            ["outcome"], registry=r)
        # cluster label: a configured cluster or "other" (ingest.inventory.OTHER_CLUSTERS)
        self.unknown_nodes_limited_total = Counter(
            "autorepair_unknown_nodes_limited_total",
            "Alerts about nodes outside the inventory dropped by the per-cluster start limit",
            ["cluster"], registry=r)
        self.unknown_node_alerts_total = Counter(
            "autorepair_unknown_node_alerts_total",
            "Alerts about nodes outside the inventory passed on as observations",
            ["cluster"], registry=r)
        self.alerts_dead_lettered_total = Counter(
            "autorepair_alerts_dead_lettered_total",
            "Alerts that could not be delivered, written to the dead-letter table (design.md §4.5)",
            ["reason"], registry=r)
        self.alert_queue_depth = Gauge("autorepair_alert_queue_depth",
                                       "Alerts waiting for hand-off", registry=r)
        self.forward_total = Counter("autorepair_forward_total",
                                     "Forwarded OTLP batches by outcome", ["outcome"], registry=r)
        self.forward_dropped_total = Counter(
            "autorepair_forward_dropped_total", "Payloads dropped from the forward queue",
            registry=r)
        self.threshold_compute_seconds = Histogram(
            "autorepair_threshold_compute_seconds", "Threshold recompute time, all cohorts",
            buckets=LATENCY_BUCKETS, registry=r)
        self._cohorts: set[tuple[str, str]] = set()

    def configure_labels(self, *, known_kinds: Iterable[str], known_clusters: Iterable[str],
                         max_label_values: int, per_identity: int | None = None) -> None:
        """Set the always-allowed kinds and clusters, the budget of other values
        (``ingest.max_label_values``) and how many of them one identity may introduce
        (``ingest.limits.label_values_per_identity``; ``None``: unbounded); values
        admitted so far stay admitted."""
        self.kinds.known = frozenset(known_kinds)
        self.unmapped_kinds.budget = max_label_values
        self.clusters.known = frozenset(known_clusters)
        self.clusters.budget = max_label_values
        self.label_values_per_identity = per_identity
        for g in (self.unmapped_kinds, self.clusters, *self._cohorts_of.values()):
            g.per_owner = per_identity

    def publish(self, results: list[CohortResult],
                owner_of: Callable[[str, str], str | None] | None = None) -> None:
        """Set the per-cohort gauges from a recompute; drop series of vanished cohorts.

        ``owner_of(cluster, cohort)``: the identity whose score created the cohort (its
        labels are charged to that identity's ``label_values_per_identity``); ``None``:
        no owner."""
        seen: set[tuple[str, str]] = set()
        capped = 0
        for res in results:
            key = (res.cluster, res.cohort)
            owner = owner_of(res.cluster, res.cohort) if owner_of is not None else None
            if not self._exported(res.cluster, res.cohort, owner):
                capped += 1
                continue
            seen.add(key)
            self.threshold.labels(*key).set(res.threshold)
            self.median.labels(*key).set(res.median)
            self.mad.labels(*key).set(res.mad)
            self.active_nodes.labels(*key).set(res.active_nodes)
            self.idle_nodes.labels(*key).set(res.idle_nodes)
            self.coverage_low.labels(*key).set(1 if res.coverage_low else 0)
            self.panic_mode.labels(*key).set(1 if res.panic else 0)
            self.stragglers.labels(*key).set(res.stragglers)
        for key in self._cohorts - seen:
            for g in (self.threshold, self.median, self.mad, self.active_nodes,
                      self.idle_nodes, self.coverage_low, self.panic_mode, self.stragglers):
                try:
                    g.remove(*key)
                except KeyError:
                    pass
        self._cohorts = seen
        self.series_capped.set(capped)

    def _exported(self, cluster: str, cohort: str, owner: str | None) -> bool:
        if self.clusters.admit(cluster, owner) is None:
            return False
        guard = self._cohorts_of.get(cluster)
        if guard is None:
            guard = self._cohorts_of[cluster] = LabelGuard(
                (), MAX_COHORTS_PER_CLUSTER, per_owner=self.label_values_per_identity,
                on_refused=self._label_refused)
        return guard.admit(cohort, owner) is not None

    def watch_nccl(self, engine: NcclEngine) -> None:
        """Serve the NCCL engine's series (:class:`NcclCollector`) from this registry."""
        self.registry.register(NcclCollector(engine))

    def render(self) -> bytes:
        """Prometheus text exposition (``text/plain; version=0.0.4``) of the registry."""
        return generate_latest(self.registry)


class NcclCollector(Collector):
    """Series of :class:`ingest.nccl.NcclEngine`, read from the engine on each scrape.

    - ``autorepair_nccl_rank_lag_ms{cluster,comm}`` (histogram, docs/design.md §4.5): every rank's
      lag behind its peers' median per completed op (ms; early ranks in ``le="0"``). One
      series set per live communicator: communicators expire, so the label set is bounded
      by ``nccl.max_ranks`` / 3.
    - ``autorepair_nccl_slow_rank_info{cluster,comm,node}`` (docs/design.md §4.5): 1 per node
      currently attributed as hosting a late rank.
    - ``autorepair_nccl_ops_total{outcome}``: ops closed ``complete``, ``aged`` (closed with
      missing ranks) or ``dropped`` (too few ranks); ``autorepair_nccl_communicators``.
    """

    def __init__(self, engine: NcclEngine) -> None:
        self.engine = engine

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        lag = HistogramMetricFamily(
            "autorepair_nccl_rank_lag_ms", "Rank lag behind its peers' median per NCCL op (ms)",
            labels=["cluster", "comm"])
        for cluster, comm, buckets, total in e.histograms():
            lag.add_metric([cluster, comm], buckets, total)
        yield lag
        info = GaugeMetricFamily(
            "autorepair_nccl_slow_rank_info", "1 per node attributed as hosting a late NCCL rank",
            labels=["cluster", "comm", "node"])
        for cluster, comm, node, _a in e.attributions():
            info.add_metric([cluster, comm, node], 1.0)
        yield info
        ops = CounterMetricFamily("autorepair_nccl_ops", "NCCL ops closed by outcome",
                                  labels=["outcome"])
        for outcome in ("complete", "aged", "dropped"):
            ops.add_metric([outcome], float(e.ops.get(outcome, 0)))
        yield ops
        yield GaugeMetricFamily("autorepair_nccl_communicators", "Live NCCL communicators",
                                value=float(len(e.comms)))
