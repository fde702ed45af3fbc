"""NCCL timings end to end without sockets: the agent's trace lines and OTLP points, ingest's
decoding and rejections, the ``nccl_slow_rank`` alert and its ``/metrics`` series, and the
NodeWorkflow's decision (diagnostics, never a repair)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import HistogramDataPoint, Metric

from agent.kmsg import KernelLogFollower
from agent.nccl import (
    METRIC,
    NcclBuffer,
    NcclLineReader,
    NcclRecord,
    TraceModel,
    nccl_metric,
    parse_line,
)
from agent.otlp import key_values, metrics_request
from ingest.nccl_wire import decode_nccl
from ingest.pipeline import NCCL_KIND, Ingestor
from tests.fixtures.sinks import ListSink
from workflows.config import AutorepairConfig, CatalogueConfig, NcclConfig
from workflows.models import Action, Alert
from workflows.policy.node_action import decide_node_action

NOW = 1_800_000_000.0
LINE = {"comm": "7f3a9c2e51d04b18", "op": "AllReduce", "seq": 1042, "rank": 3, "nranks": 16,
        "bytes": 26214400, "duration_ms": 12.84, "ts": 1718000000.5}


# ----------------------------------------------------------------------- trace lines
def test_parse_line_documented_format() -> None:
    rec = parse_line(json.dumps(LINE))
    assert rec == NcclRecord("7f3a9c2e51d04b18", "AllReduce", 1042, 3, 16, 12.84, 26214400,
                             1718000000500000000)
    assert parse_line(json.dumps({**LINE, "comm": 255, "bytes": None, "ts": None})) == \
        NcclRecord("ff", "AllReduce", 1042, 3, 16, 12.84, None, 0)


@pytest.mark.parametrize(("patch", "reason"), [
    ({"rank": 16}, "rank: 16 is not an integer in [0, 16)"),
    ({"rank": None}, "rank: None"),
    ({"duration_ms": -1}, "duration_ms: -1 is not a finite number"),
    ({"duration_ms": "fast"}, "duration_ms: 'fast'"),
    ({"seq": 1.5}, "seq: 1.5 is not an integer"),
    ({"nranks": 0}, "nranks: 0 is not an integer >= 1"),
    ({"comm": ""}, "comm: '' is not a non-empty string"),
    ({"op": True}, "op: 'True' is not"),
    ({"bytes": -4}, "bytes: -4"),
    ({"ts": "now"}, "ts: 'now' is not epoch seconds"),
])
def test_parse_line_names_the_bad_field(patch: dict[str, Any], reason: str) -> None:
    got = parse_line(json.dumps({**LINE, **patch}))
    assert isinstance(got, str) and got.startswith(reason), got


def test_parse_line_never_raises_on_junk() -> None:
    for junk in ("", "{", "[1, 2]", "null", "x" * 5000, '{"comm": {}}', "\x00\xff"):
        assert isinstance(parse_line(junk), str)


def test_trace_file_followed_through_the_kernel_log_follower(tmp_path: Path) -> None:
    path = tmp_path / "nccl.jsonl"
    path.write_text(json.dumps(LINE) + "\n")  # written before the agent started: skipped
    follower = KernelLogFollower(str(path), reader_factory=NcclLineReader)
    assert follower.poll() == []
    with path.open("a") as f:
        f.write(json.dumps({**LINE, "seq": 1043}) + "\nnot json\n")
        f.write(json.dumps({**LINE, "seq": 1044, "rank": 99}) + "\n")
    got = follower.poll()
    assert [r.seq for r in got] == [1043]
    reader = follower.reader
    assert isinstance(reader, NcclLineReader)
    assert reader.malformed == 2 and reader.last_error is not None
    assert "rank: 99" in reader.last_error
    follower.close()


def test_buffer_drops_oldest_and_counts() -> None:
    buf = NcclBuffer(max_points=3)
    buf.extend(NcclRecord("c", "AllReduce", i, 0, 2, 1.0) for i in range(5))
    assert [r.seq for r in buf.take()] == [2, 3, 4] and buf.dropped == 2 and len(buf) == 0


# ------------------------------------------------------------------------ wire decoding
def test_agent_points_decode_to_columns() -> None:
    recs = [NcclRecord("k1", "AllGather", 5, r, 4, 1.0 + r, 1024) for r in range(3)]
    recs.append(NcclRecord("k2", "Broadcast", 9, 0, 2, 0.5))
    reasons: list[str] = []
    cols = decode_nccl(nccl_metric(recs, now_ns=1), reasons.append)
    assert not reasons
    by = {c.comm: c for c in cols}
    assert by["k1"].nranks == 4 and by["k1"].rank == [0, 1, 2] and by["k1"].seq == [5, 5, 5]
    assert by["k1"].dur == [1.0, 2.0, 3.0] and by["k2"].op_type == ["Broadcast"]


def test_histogram_points_and_bad_attributes() -> None:
    m = Metric(name=METRIC, unit="ms")
    good = {"nccl.comm_id_hash": 0x1F, "nccl.op_type": "AllReduce", "nccl.op_seq": 3,
            "nccl.rank": 1, "nccl.nranks": 2}
    m.histogram.data_points.append(HistogramDataPoint(count=4, sum=10.0,
                                                      attributes=key_values(good)))
    no_rank = {k: v for k, v in good.items() if k != "nccl.rank"}
    m.histogram.data_points.append(HistogramDataPoint(count=1, sum=1.0,
                                                      attributes=key_values(no_rank)))
    m.histogram.data_points.append(HistogramDataPoint(
        count=1, sum=1.0, attributes=key_values({**good, "nccl.rank": "first"})))
    m.histogram.data_points.append(HistogramDataPoint(count=0, attributes=key_values(good)))
    reasons: list[str] = []
    (cols,) = decode_nccl(m, reasons.append)
    assert (cols.comm, cols.dur, cols.seq) == ("1f", [2.5], [3])
    assert reasons == [
        "autorepair.nccl.collective.duration_ms: data point without nccl.rank",
        "nccl.rank: 'first' is not an integer",
        "autorepair.nccl.collective.duration_ms: data point without a value",
    ]
    summary = Metric(name=METRIC)
    summary.summary.data_points.add()
    decode_nccl(summary, reasons.append)
    assert reasons[-1].endswith("must be a gauge or histogram, got summary")


# ------------------------------------------------------------------- ingest pipeline
def requests(model: TraceModel, k: int, *, cluster: str = "c1") -> list[Any]:
    seqs, types, nbytes, dur = model.next_ops(k)
    out = []
    for node in model.node_ranks:
        recs = model.records(node, seqs, types, nbytes, dur)
        attrs = {"host.name": node, "autorepair.cluster.id": cluster, "host.id": f"m-{node}"}
        out.append(metrics_request(attrs, [nccl_metric(recs, now_ns=int(NOW * 1e9))]))
    return out


async def test_late_node_raises_nccl_slow_rank_alert_and_metrics() -> None:
    sink = ListSink()
    cfg = AutorepairConfig(nccl=NcclConfig(alert_ops=8))
    ing = Ingestor(cfg, alert_sink=sink, clock=lambda: NOW)
    model = TraceModel(32, [f"gpu-{i:02d}" for i in range(4)], late={"gpu-02": 1.5}, seed=9)
    for _ in range(8):
        for req in requests(model, 5):
            resp, _hint = await ing.handle_metrics(req, "http")
            assert resp.partial_success.rejected_data_points == 0
    (alert,) = sink.alerts
    assert alert.kind == NCCL_KIND and alert.node == "gpu-02" and alert.active and alert.level
    assert alert.source == "ingest" and not alert.actionable and alert.action == Action.none
    assert alert.mnemonic == "NCCL_SLOW_RANK" and model.comm in alert.summary
    assert alert.evidence["ranks"] and set(alert.evidence["ranks"]) <= set(range(16, 24))
    assert alert.evidence["share"] >= 0.5 and alert.evidence["median_lag_ms"] > 1.0
    text = ing.metrics.render().decode()
    assert (f'autorepair_nccl_slow_rank_info{{cluster="c1",comm="{model.comm}",'
            f'node="gpu-02"}} 1.0') in text
    assert f'autorepair_nccl_rank_lag_ms_bucket{{cluster="c1",comm="{model.comm}",le="+Inf"}}' \
        f' {32.0 * 40}' in text
    assert 'autorepair_nccl_ops_total{outcome="complete"} 40.0' in text
    assert 'autorepair_alerts_total{actionable="false",kind="nccl_slow_rank"' in text
    snap = ing.snapshot()["nccl"]
    assert snap["communicators"] == 1 and snap["slow_ranks"][0]["node"] == "gpu-02"
    # the job ends: the communicator expires at the recompute, the alert clears
    ing.clock = lambda: NOW + cfg.nccl.comm_ttl_s + 1
    await ing.compute()
    assert [a.active for a in sink.alerts] == [True, False]
    assert "autorepair_nccl_slow_rank_info{" not in ing.metrics.render().decode()


async def test_malformed_points_get_partial_success() -> None:
    ing = Ingestor(AutorepairConfig(), clock=lambda: NOW)
    recs = [NcclRecord("k", "AllReduce", 1, 0, 4, 1.0), NcclRecord("k", "AllReduce", 1, 7, 4, 1.0),
            NcclRecord("k", "AllReduce", 1, 1, 4, -2.0)]
    m = nccl_metric(recs, now_ns=1)
    del m.gauge.data_points[0].attributes[3]  # drop nccl.rank of the first point
    req = metrics_request({"host.name": "n1", "autorepair.cluster.id": "c"}, [m])
    resp, _ = await ing.handle_metrics(req, "grpc")
    ps = resp.partial_success
    assert ps.rejected_data_points == 3
    for part in ("without nccl.rank", "nccl.rank: 7 outside [0, nranks 4)", "duration_ms: -2.0"):
        assert part in ps.error_message
    text = ing.metrics.render().decode()
    assert 'autorepair_otlp_rejected_total{reason="nccl",signal="metrics",transport="grpc"} 3.0' in text


async def test_disabled_engine_ignores_points() -> None:
    ing = Ingestor(AutorepairConfig(nccl=NcclConfig(enabled=False)), clock=lambda: NOW)
    model = TraceModel(4, ["a"], ranks_per_node=4)
    for req in requests(model, 3):
        resp, _ = await ing.handle_metrics(req, "http")
        assert resp.partial_success.rejected_data_points == 0
    assert ing.nccl.points == 0 and not ing.nccl.comms


def test_config_rejects_inconsistent_windows() -> None:
    with pytest.raises(ValueError, match=r"nccl\.min_ops: 80 exceeds nccl\.window_ops 64"):
        NcclConfig(min_ops=80)
    with pytest.raises(ValueError, match="clear_share"):
        NcclConfig(clear_share=0.6, min_share=0.5)


# ------------------------------------------------------------------------------ policy
def test_nccl_slow_rank_asks_for_diagnostics_never_a_repair() -> None:
    a = Alert(alert_id="x", cluster="c", node="n", kind="nccl_slow_rank", code=None,
              severity="warning", actionable=True, action="reboot", summary="s",
              observed_at=datetime(2027, 1, 1, tzinfo=UTC), level=True)
    d = decide_node_action(a, CatalogueConfig())
    assert d.diagnostic and not d.actionable and d.action == Action.none
    assert d.rule == "nccl_slow_rank:diagnose" and "NCCL" in d.reason
    assert not decide_node_action(a.model_copy(update={"active": False}),
                                  CatalogueConfig()).diagnostic
