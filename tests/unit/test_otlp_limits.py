"""Per-request decode limits (resources, points, records, attributes) reported through OTLP
``partial_success`` with bounded reason codes, and bounded Prometheus label cardinality."""

from __future__ import annotations

import re
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from ingest.metrics import MAX_COHORTS_PER_CLUSTER, IngestMetrics, LabelGuard
from ingest.otlp import (
    REASONS,
    Limits,
    bounded_attributes,
    decode_logs,
    decode_metrics,
    make_fault_request,
    make_metrics_request,
)
from ingest.pipeline import Ingestor
from workflows.config import AutorepairConfig, ClusterConfig, IngestConfig, ThresholdConfig

NOW = 1_800_000_000.0
SMALL = Limits(resources=3, data_points=5, log_records=4, attributes=10, value_len=100, depth=2)


def many_resources(n: int) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    for i in range(n):
        req.MergeFrom(make_metrics_request("c", f"n{i}", 0.5))
    return req


def test_resources_beyond_the_cap_are_rejected_with_their_points() -> None:
    d = decode_metrics(many_resources(5), NOW, max_future_s=300, ttl_s=50, limits=SMALL)
    assert [p.resource.node for p in d.scores] == ["n0", "n1", "n2"]
    assert d.rejected == 2 and d.codes == {"too_many_resources": 2}
    assert "more than 3 resource blocks" in d.error_message()


def test_data_points_beyond_the_cap_are_rejected() -> None:
    req = make_metrics_request("c", "n", 0.5)
    pts = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    for _ in range(7):
        pts.add().CopyFrom(pts[0])
    d = decode_metrics(req, NOW, max_future_s=300, ttl_s=50, limits=SMALL)
    assert len(d.scores) == 5 and d.codes == {"too_many_records": 3}
    # the cap is per request, across resources
    d = decode_metrics(many_resources(3), NOW, max_future_s=300, ttl_s=50,
                       limits=Limits(**{**_fields(SMALL), "data_points": 2}))
    assert len(d.scores) == 2 and d.codes == {"too_many_records": 1}


def _fields(lim: Limits) -> dict[str, int]:
    return {f: getattr(lim, f) for f in Limits.__slots__}


def test_log_records_beyond_the_cap_are_rejected() -> None:
    req = make_fault_request("c", "n", kind="xid", code=79, body="x")
    records = req.resource_logs[0].scope_logs[0].log_records
    for _ in range(5):
        records.add().CopyFrom(records[0])
    d = decode_logs(req, NOW, max_future_s=300, limits=SMALL)
    assert len(d.faults) == 4 and d.codes == {"too_many_records": 2}


def _kv(key: str, v: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=v)


def nested(depth: int) -> AnyValue:
    v = AnyValue(string_value="leaf")
    for _ in range(depth):
        outer = AnyValue()
        outer.array_value.values.append(v)
        v = outer
    return v


def test_bounded_attributes_count_size_depth_and_keys() -> None:
    ok = [_kv(f"k{i}", AnyValue(int_value=i)) for i in range(10)]
    assert bounded_attributes(ok, SMALL) == {f"k{i}": i for i in range(10)}
    too_many = [*ok, _kv("k10", AnyValue(int_value=10))]
    assert "more than 10 attributes" in str(bounded_attributes(too_many, SMALL))
    big = [_kv("evidence", AnyValue(string_value="x" * 101))]
    assert bounded_attributes(big, SMALL) == \
        "attributes: 'evidence': string value longer than 100 characters"
    assert "bytes value longer than 100" in str(
        bounded_attributes([_kv("b", AnyValue(bytes_value=b"\0" * 101))], SMALL))
    assert "key 'kkkk" in str(bounded_attributes([_kv("k" * 101, AnyValue())], SMALL))
    assert bounded_attributes([_kv("a", nested(2))], SMALL) == {"a": [["leaf"]]}
    assert "nested deeper than 2" in str(bounded_attributes([_kv("a", nested(3))], SMALL))
    # nested elements count against the attribute budget
    wide = AnyValue()
    for i in range(10):
        wide.array_value.values.add().int_value = i
    assert "more than 10 attributes" in str(bounded_attributes([_kv("w", wide)], SMALL))


def test_oversized_attributes_reject_the_resource_or_the_record() -> None:
    req = make_metrics_request("c", "n", 0.5, extra_resource={"junk": "y" * 200})
    d = decode_metrics(req, NOW, max_future_s=300, ttl_s=50, limits=SMALL)
    assert not d.scores and d.codes == {"attributes": 1}
    assert "resource attributes: 'junk'" in d.error_message()
    logs = make_fault_request("c", "n", kind="xid", code=79, body="b",
                              evidence={"blob": "z" * 200})
    d = decode_logs(logs, NOW, max_future_s=300, limits=SMALL)
    assert not d.faults and d.codes == {"attributes": 1}
    # a structured body is bounded too; a string body is kept (truncated at 64 KiB)
    logs.resource_logs[0].scope_logs[0].log_records[0].ClearField("attributes")
    lr = logs.resource_logs[0].scope_logs[0].log_records[0]
    lr.attributes.extend([_kv("event.name", AnyValue(string_value="autorepair.fault")),
                          _kv("autorepair.fault.kind", AnyValue(string_value="xid"))])
    lr.body.CopyFrom(nested(3))
    d = decode_logs(logs, NOW, max_future_s=300, limits=SMALL)
    assert d.codes == {"attributes": 1} and "body" in d.error_message()


def test_reject_codes_are_a_closed_set() -> None:
    from ingest.otlp import Decoded

    d = Decoded()
    try:
        d.reject("made-up", "x")
    except ValueError as e:
        assert "made-up" in str(e)
    else:
        raise AssertionError("unknown reason code accepted")
    assert "identity" in REASONS and "attributes" in REASONS


async def test_ingestor_reports_partial_success_and_counts_by_reason() -> None:
    cfg = AutorepairConfig(ingest=IngestConfig(max_resources_per_request=2))
    ing = Ingestor(cfg, clock=lambda: NOW)
    resp, _ = await ing.handle_metrics(many_resources(4), "grpc")
    assert resp.partial_success.rejected_data_points == 2
    assert "more than 2 resource blocks" in resp.partial_success.error_message
    text = ing.metrics.render().decode()
    assert ('autorepair_otlp_rejected_total{reason="too_many_resources",signal="metrics",'
            'transport="grpc"} 2.0') in text


def _series(text: str, name: str) -> list[str]:
    return re.findall(rf"^{name}\{{[^}}]*\}}", text, re.M)


async def test_fault_kinds_never_become_unbounded_labels() -> None:
    # 301 made-up nodes: a bucket big enough that the unknown-node limit drops none
    cfg = AutorepairConfig(ingest=IngestConfig(max_label_values=5, unknown_node_burst=301))
    ing = Ingestor(cfg, clock=lambda: NOW)
    for i in range(300):
        req = make_fault_request("c", f"n{i}", kind=f"made_up_{i}", body="x")
        await ing.handle_logs(req, "http")
    await ing.handle_logs(make_fault_request("c", "n", kind="xid", code=79, body="x"), "http")
    text = ing.metrics.render().decode()
    kinds = set(re.findall(r'autorepair_alerts_total\{actionable="\w+",kind="([^"]+)"', text))
    assert kinds == {"other", "xid"}
    unmapped = set(re.findall(r'autorepair_unmapped_alerts_total\{kind="([^"]+)"', text))
    assert unmapped == {f"made_up_{i}" for i in range(5)} | {"other"}
    total = sum(float(v) for v in re.findall(r"^autorepair_alerts_total\{[^}]*\} (\S+)", text,
                                             re.M))
    assert total == 301  # nothing lost from the totals


def test_label_guard_refuses_odd_values_and_keeps_known_ones() -> None:
    g = LabelGuard(known={"prod"}, budget=2)
    assert g.admit("prod") == "prod"
    assert g.admit('x"} 1\nevil') is None and g.admit("") is None and g.admit("a" * 64) is None
    assert g.admit("a") == "a" and g.admit("b") == "b" and g.admit("c") is None
    assert g.admit("a") == "a" and g.admit("prod") == "prod"


async def test_cluster_and_cohort_series_are_capped() -> None:
    cfg = AutorepairConfig(
        ingest=IngestConfig(max_label_values=3),
        clusters=[ClusterConfig(name="real")],
        threshold=ThresholdConfig(statistical_min=1),
    )
    ing = Ingestor(cfg, clock=lambda: NOW)
    for i in range(20):
        await ing.handle_metrics(make_metrics_request(f"fake{i}", "n", 0.9), "http")
    for i in range(MAX_COHORTS_PER_CLUSTER + 4):
        await ing.handle_metrics(make_metrics_request("real", f"n{i}", 0.9, workload=f"w{i}"),
                                 "http")
    await ing.compute()
    text = ing.metrics.render().decode()
    clusters = set(re.findall(r'autorepair_threshold\{cluster_id="([^"]+)"', text))
    assert "real" in clusters and len(clusters) == 1 + 3
    real_cohorts = re.findall(r'autorepair_threshold\{cluster_id="real",cohort="([^"]+)"', text)
    assert len(real_cohorts) == MAX_COHORTS_PER_CLUSTER
    capped = re.search(r"^autorepair_metric_series_capped (\S+)", text, re.M)
    assert capped is not None and float(capped.group(1)) == 17 + 4
    assert len(_series(text, "autorepair_median")) == len(_series(text, "autorepair_threshold"))


def test_metrics_defaults_match_config() -> None:
    from ingest.metrics import DEFAULT_MAX_LABEL_VALUES

    assert DEFAULT_MAX_LABEL_VALUES == IngestConfig().max_label_values
    m: Any = IngestMetrics()
    assert m.clusters.budget == DEFAULT_MAX_LABEL_VALUES
