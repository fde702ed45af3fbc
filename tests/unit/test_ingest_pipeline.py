"""Decoding against the wire contract and the ingest core (no sockets): aliases, fault and
straggler records → alerts (real ``workflows.alerts.alert_from_fault``), panic, views."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingest.handoff import HandoffQueueFull
from ingest.otlp import (
    INGERO_SCORE,
    decode_logs,
    decode_metrics,
    make_fault_request,
    make_metrics_request,
)
from ingest.pipeline import PANIC_KIND, Ingestor, ThresholdHint
from ingest.threshold import NodeState
from workflows.config import AutorepairConfig, ThresholdConfig
from workflows.models import Alert

NOW = 1_800_000_000.0


class ListSink:
    """Collects alerts; refuses after ``limit`` (to exercise HandoffQueueFull)."""

    def __init__(self, limit: int = 10**9) -> None:
        self.alerts: list[Alert] = []
        self.limit = limit

    async def submit(self, alert: Alert) -> None:
        if len(self.alerts) >= self.limit:
            raise HandoffQueueFull("full")
        self.alerts.append(alert)


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def ingestor(sink: Any = None, **thr: Any) -> tuple[Ingestor, Clock]:
    clock = Clock()
    cfg = AutorepairConfig(threshold=ThresholdConfig(**thr))
    return Ingestor(cfg, alert_sink=sink, clock=clock), clock


def test_decode_contract_and_signals() -> None:
    req = make_metrics_request("c1", "gpu-1", 0.87, state="calibrating", workload="inference",
                               signals={"throughput_ratio": 0.9, "memory_headroom": 0.4},
                               machine_id="m1", boot_id="b1",
                               extra_resource={"k8s.node.name": "k-1",
                                               "autorepair.node_pool": "pool-a"})
    d = decode_metrics(req, NOW, max_future_s=300, ttl_s=50)
    (p,) = d.scores
    assert (p.score, p.state, p.time_s) == (0.87, NodeState.CALIBRATING, NOW)
    r = p.resource
    assert (r.cluster, r.node, r.cohort, r.machine_id, r.boot_id, r.k8s_node, r.node_pool) == \
        ("c1", "gpu-1", "inference", "m1", "b1", "k-1", "pool-a")
    assert d.signals[0].values == {"throughput_ratio": 0.9, "memory_headroom": 0.4}
    assert d.rejected == 0


def test_decode_ingero_aliases() -> None:
    req = make_metrics_request("x", "x", 0.5, workload=None)
    res = req.resource_metrics[0].resource
    del res.attributes[:]
    for k, v in (("ingero.node.id", "ig-1"), ("ingero.cluster.id", "ic")):
        kv = res.attributes.add()
        kv.key = k
        kv.value.string_value = v
    m = req.resource_metrics[0].scope_metrics[0].metrics[0]
    m.name = INGERO_SCORE
    m.gauge.data_points[0].attributes[0].key = "ingero.node.state"
    (p,) = decode_metrics(req, NOW, max_future_s=300, ttl_s=50).scores
    assert (p.resource.node, p.resource.cluster, p.resource.ingero) == ("ig-1", "ic", True)
    assert p.resource.cohort == "default"
    assert ThresholdHint(0.5, True, True).http_headers()[2][0] == b"x-ingero-threshold"


def test_decode_rejections_name_field_and_value() -> None:
    req = ExportMetricsServiceRequest()
    req.MergeFrom(make_metrics_request("c", "a", math.nan))
    req.MergeFrom(make_metrics_request("c", "b", 0.5, state="busy"))
    req.MergeFrom(make_metrics_request("c", "old", 0.5, time_ns=int((NOW - 3600) * 1e9)))
    req.MergeFrom(make_metrics_request("c", "", 0.5))
    d = decode_metrics(req, NOW, max_future_s=300, ttl_s=50)
    assert d.rejected == 4 and not d.scores
    msg = d.error_message()
    assert "'busy'" in msg and "nan" in msg and "older than the score TTL" in msg
    assert "no node id" in msg


def test_decode_fault_record() -> None:
    req = make_fault_request("c", "gpu-2", kind="xid", code=79, gpu="0000:3b:00.0",
                             body="NVRM: Xid (PCI:0000:3b:00): 79, ...", active=True,
                             time_ns=int(NOW * 1e9), evidence={"pid": 42})
    (f,) = decode_logs(req, NOW, max_future_s=300).faults
    assert (f.kind, f.code, f.gpu, f.active, f.time_s) == ("xid", 79, "0000:3b:00.0", True, NOW)
    assert f.evidence == {"pid": 42} and f.evidence_text.startswith("NVRM")
    bad = make_fault_request("c", "gpu-2", kind="xid", body="x")
    for kv in bad.resource_logs[0].scope_logs[0].log_records[0].attributes:
        if kv.key == "autorepair.fault.active":
            kv.value.string_value = "maybe"
    d = decode_logs(bad, NOW, max_future_s=300)
    assert d.rejected == 1 and "autorepair.fault.active: 'maybe'" in d.error_message()


async def test_fault_log_becomes_alert_through_catalogue() -> None:
    sink = ListSink()
    ing, _ = ingestor(sink)
    req = make_fault_request("c", "gpu-3", kind="xid", code=79, gpu="0000:3b:00.0",
                             body="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                             time_ns=int(NOW * 1e9))
    resp, _ = await ing.handle_logs(req, "test")
    assert not resp.HasField("partial_success")
    (a,) = sink.alerts
    assert (a.cluster, a.node, a.kind, a.code, a.gpu, a.source) == \
        ("c", "gpu-3", "xid", 79, "0000:3b:00.0", "agent")
    # same record again → the same stable alert id (the NodeWorkflow de-duplicates)
    await ing.handle_logs(req, "test")
    assert sink.alerts[1].alert_id == a.alert_id
    text = ing.metrics.render().decode()
    assert 'autorepair_alerts_total{actionable=' in text and 'kind="xid"' in text


async def test_unknown_kind_counted_unmapped() -> None:
    sink = ListSink()
    ing, _ = ingestor(sink)
    await ing.handle_logs(make_fault_request("c", "n", kind="weird_kind", body="?"), "test")
    assert 'autorepair_unmapped_alerts_total{kind="weird_kind"} 1.0' in \
        ing.metrics.render().decode()


async def test_server_side_straggler_alert_raise_and_clear() -> None:
    sink = ListSink()
    ing, clock = ingestor(sink, straggler_pushes=2, recovery_pushes=2)
    for i in range(6):
        await ing.handle_metrics(make_metrics_request("c", f"n{i}", 0.95), "t")
    await ing.compute()
    for _ in range(2):
        clock.t += 1
        await ing.handle_metrics(make_metrics_request("c", "n0", 0.30), "t")
    (raised,) = sink.alerts
    assert raised.kind == "straggler" and raised.active and raised.level
    assert raised.evidence["score"] == 0.30 and raised.evidence["classified_by"] == "ingest"
    for _ in range(2):
        clock.t += 1
        await ing.handle_metrics(make_metrics_request("c", "n0", 0.95), "t")
    assert [a.active for a in sink.alerts] == [True, False]


async def test_straggler_edge_retried_when_handoff_full() -> None:
    sink = ListSink(limit=0)
    ing, _clock = ingestor(sink, straggler_pushes=1)
    for i in range(6):
        await ing.handle_metrics(make_metrics_request("c", f"n{i}", 0.95), "t")
    await ing.compute()
    await ing.handle_metrics(make_metrics_request("c", "n0", 0.30), "t")
    assert ing.alerts_refused == 1 and not sink.alerts
    sink.limit = 10
    await ing.handle_metrics(make_metrics_request("c", "n0", 0.30), "t")
    assert [a.kind for a in sink.alerts] == ["straggler"]


async def test_panic_raises_cluster_alert_and_views() -> None:
    sink = ListSink()
    ing, clock = ingestor(sink)
    for i in range(10):
        await ing.handle_metrics(make_metrics_request("c", f"n{i}", 0.95), "t")
    await ing.compute()
    clock.t += 10
    for i in range(10):
        await ing.handle_metrics(make_metrics_request("c", f"n{i}", 0.40), "t")
    (res,) = await ing.compute()
    assert res.panic
    snap = ing.snapshot("c")
    assert snap["cluster_alerts"][0]["kind"] == PANIC_KIND
    assert snap["cluster_alerts"][0]["active"] is True
    view = ing.threshold_view("c")
    assert view["panic"] is True and view["quorum_met"] is True
    assert 'autorepair_panic_mode{cluster_id="c",cohort="training"} 1.0' in \
        ing.metrics.render().decode()
    clock.t += 10
    for i in range(10):
        await ing.handle_metrics(make_metrics_request("c", f"n{i}", 0.95), "t")
    await ing.compute()
    assert ing.snapshot("c")["cluster_alerts"][-1]["summary"] == "panic cleared"
    # both edges went to the hand-off as cluster-level alerts (node "*", for the guard)
    panic = [a for a in sink.alerts if a.kind == PANIC_KIND]
    assert [(a.node, a.active, a.level) for a in panic] == [("*", True, True), ("*", False, True)]
    assert panic[0].severity.value == "critical" and panic[0].evidence["flagged"] == 10
    assert not panic[0].actionable


async def test_threshold_view_cohorts_and_cold_start() -> None:
    ing, _ = ingestor()
    for i in range(5):
        await ing.handle_metrics(make_metrics_request("c", f"t{i}", 0.9), "t")
    for i in range(7):
        await ing.handle_metrics(
            make_metrics_request("c", f"i{i}", 0.6, workload="inference"), "t")
    await ing.compute()
    v = ing.threshold_view("c")
    assert v["cohort"] == "inference" and v["active_nodes"] == 7  # largest cohort
    assert set(v["cohorts"]) == {"inference", "training"}
    assert ing.threshold_view("c", "training")["median"] == pytest.approx(0.9)
    cold = ing.threshold_view("nobody")
    assert cold["threshold"] == 0 and cold["quorum_met"] is False and cold["cohorts"] == {}


async def test_nodes_expire_from_snapshot() -> None:
    ing, clock = ingestor(push_interval_s=10, ttl_multiplier=5)
    await ing.handle_metrics(make_metrics_request("c", "gone", 0.9), "t")
    await ing.compute()
    assert len(ing.snapshot()["nodes"]) == 1
    clock.t += 51
    await ing.compute()
    assert ing.snapshot()["nodes"] == [] and ing.threshold_view("c")["cohorts"] == {}


async def test_alert_carries_the_control_planes_receipt_time() -> None:
    """I17 (issue 26 reproduction 3): ``received_at`` is ingest's clock; the sender's
    time (here 4 min ahead) stays ``observed_at``, evidence only. A re-sent record keeps
    its alert id (receipt time is not part of it)."""
    from datetime import UTC, datetime

    sink = ListSink()
    ing, clock = ingestor(sink)
    req = make_fault_request("c", "gpu-3", kind="xid", code=79, gpu="0000:3b:00.0",
                             body="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                             time_ns=int((NOW + 240) * 1e9))
    await ing.handle_logs(req, "test")
    clock.t = NOW + 30
    await ing.handle_logs(req, "test")
    a, b = sink.alerts
    assert a.observed_at == datetime.fromtimestamp(NOW + 240, UTC)
    assert a.received_at == datetime.fromtimestamp(NOW, UTC)
    assert b.received_at == datetime.fromtimestamp(NOW + 30, UTC)
    assert a.alert_id == b.alert_id


def test_decode_fault_code_outside_the_ledgers_range_is_rejected() -> None:
    for code in (-5, 2**31, 2**40):
        req = make_fault_request("c", "gpu-2", kind="xid", code=code, body="x",
                                 time_ns=int(NOW * 1e9))
        d = decode_logs(req, NOW, max_future_s=300)
        assert d.rejected == 1 and not d.faults
        assert f"autorepair.fault.code: {code} is outside 0..2147483647" in d.error_message()
    ok = make_fault_request("c", "gpu-2", kind="xid", code=2**31 - 1, body="x",
                            time_ns=int(NOW * 1e9))
    assert decode_logs(ok, NOW, max_future_s=300).faults[0].code == 2**31 - 1


def test_decode_signal_outside_0_to_1_is_rejected() -> None:
    req = make_metrics_request("c1", "gpu-1", 0.8,
                               signals={"throughput_ratio": 1.7, "memory_headroom": 0.4})
    d = decode_metrics(req, NOW, max_future_s=300, ttl_s=50)
    assert d.signals[0].values == {"memory_headroom": 0.4}
    assert d.rejected == 1 and "throughput_ratio: value 1.7 is outside 0..1" in d.error_message()


async def test_a_record_no_alert_can_be_built_from_is_counted_rejected() -> None:
    """A record no alert can be built from (planted: the builder refuses one of two, as
    the catalogue refuses a negative code) is counted in ``partial_success``, never
    dropped under a 200 that says its alerts are stored."""
    sink = ListSink()
    ing, _ = ingestor(sink)
    req = make_fault_request("c", "gpu-3", kind="xid", code=79, body="x",
                             time_ns=int(NOW * 1e9))
    req.MergeFrom(make_fault_request("c", "gpu-3", kind="xid", code=48, body="y",
                                     time_ns=int(NOW * 1e9)))
    bad = ing.build_alert

    def refusing(*a: Any, **kw: Any) -> Alert:
        if kw.get("code") == 48:
            raise ValueError("code: must be a non-negative integer or None, got -5")
        return bad(*a, **kw)

    ing.build_alert = refusing  # type: ignore[method-assign]
    resp, _ = await ing.handle_logs(req, "test")
    assert [a.code for a in sink.alerts] == [79]
    assert resp.partial_success.rejected_log_records == 1
    assert "got -5" in resp.partial_success.error_message


def test_alert_text_and_evidence_stay_storable() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    a = Alert(alert_id="x", cluster="c", node="n", kind="xid", code=79, summary="s",
              observed_at=at, evidence={"t": math.nan, "l": [math.inf, 1.5], "d": {"z": -math.inf}})
    assert a.evidence == {"t": "nan", "l": ["inf", 1.5], "d": {"z": "-inf"}}
    with pytest.raises(ValueError, match="code"):
        Alert(alert_id="x", cluster="c", node="n", kind="xid", code=2**31, summary="s",
              observed_at=at)
