"""Prometheus metrics of the ingest service (DESIGN §4.5), on a per-service registry.

Each :class:`IngestMetrics` owns its own ``CollectorRegistry`` so several services in one
process (tests) never collide. Names of DESIGN §4.5 are kept exactly; the extra series
(``autorepair_otlp_rejected_total``, ``autorepair_alert_handoff_total``, …) are this
service's own and documented here.

``autorepair_repairs_total`` and ``autorepair_breaker_open`` belong to the repair path;
they are registered here because DESIGN §4.5 serves every series on the API port's
``/metrics``, and kept current from Temporal by :mod:`ingest.repair_metrics`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ingest.threshold import CohortResult

#: Handler latency buckets, seconds: 0.5 ms … 1 s (the ingest's target is p99 ≤ 20 ms,
#: measured by tests/bench/ingest.py).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class IngestMetrics:
    """All series of one ingest service. ``render()`` gives the text exposition."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
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
        self.alerts_total = Counter("autorepair_alerts_total", "Alerts produced",
                                    ["kind", "severity", "actionable"], registry=r)
        self.unmapped_alerts_total = Counter(
            "autorepair_unmapped_alerts_total", "Alerts of a kind outside the catalogue",
            ["kind"], registry=r)
        self.repairs_total = Counter("autorepair_repairs_total", "Repairs by outcome",
                                     ["action", "outcome"], registry=r)
        self.breaker_open = Gauge("autorepair_breaker_open", "1 while the breaker is open",
                                  ["cluster_id"], registry=r)
        self.otlp_requests_total = Counter("autorepair_otlp_requests_total", "OTLP requests",
                                           ["transport", "outcome"], registry=r)
        self.otlp_request_seconds = Histogram("autorepair_otlp_request_seconds",
                                              "OTLP handler latency", ["transport"],
                                              buckets=LATENCY_BUCKETS, registry=r)
        self.otlp_rejected_total = Counter(
            "autorepair_otlp_rejected_total", "Rejected data points and log records",
            ["transport", "signal"], registry=r)
        self.alert_handoff_total = Counter(
            "autorepair_alert_handoff_total", "Alert hand-off to Temporal by outcome",
            ["outcome"], registry=r)
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

    def publish(self, results: list[CohortResult]) -> None:
        """Set the per-cohort gauges from a recompute; drop series of vanished cohorts."""
        seen: set[tuple[str, str]] = set()
        for res in results:
            key = (res.cluster, res.cohort)
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

    def render(self) -> bytes:
        """Prometheus text exposition (``text/plain; version=0.0.4``) of the registry."""
        return generate_latest(self.registry)
