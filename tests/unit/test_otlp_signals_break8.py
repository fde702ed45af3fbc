"""A signal gauge sent as another OTLP type is rejected and counted, as a score is.

docs/wire-contract.md: the four signals (``autorepair.node.throughput_ratio`` …) are
gauges 0..1; what is malformed is "rejected and counted (never stored)". A signal sent as
a histogram or summary vanished: not stored, not in ``partial_success``, not in
``autorepair_otlp_rejected_total``, so the sender never learns its signals are lost.
"""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingest.otlp import decode_metrics, make_metrics_request

NOW = 1_800_000_000.0


def _with_signal(kind: str) -> ExportMetricsServiceRequest:
    req = make_metrics_request("c", "gpu-01", 0.9, time_ns=int(NOW * 1e9))
    m = req.resource_metrics[0].scope_metrics[0].metrics.add()
    m.name = "autorepair.node.throughput_ratio"
    if kind == "histogram":
        dp = m.histogram.data_points.add()
        dp.count, dp.sum = 2, 1.8
    elif kind == "summary":
        dp = m.summary.data_points.add()  # type: ignore[assignment]
        dp.count, dp.sum = 2, 1.8
    else:
        dp = m.exponential_histogram.data_points.add()  # type: ignore[assignment]
        dp.count, dp.sum = 2, 1.8
    dp.time_unix_nano = int(NOW * 1e9)
    return req


@pytest.mark.parametrize("kind", ["histogram", "summary", "exponential_histogram"])
def test_a_signal_that_is_not_a_gauge_is_rejected_naming_it(kind: str) -> None:
    d = decode_metrics(_with_signal(kind), NOW, max_future_s=300, ttl_s=50)
    assert [p.score for p in d.scores] == [0.9]  # the rest of the push is taken
    assert d.signals == []
    assert d.rejected == 1 and d.codes == {"value": 1}
    msg = d.error_message()
    assert "autorepair.node.throughput_ratio" in msg and kind in msg
