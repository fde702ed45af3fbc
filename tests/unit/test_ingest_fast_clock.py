"""I17: a fault from an agent whose clock runs minutes fast is not dropped. Before the
fix a record more than ``ingest.max_future_s`` (300 s) ahead was refused with reason
``timestamp``: the Xid 79 of a node with a broken NTP never reached its NodeWorkflow
and the clear of a level fault was lost. Found by a review (driven in-process: the real
``Ingestor``, no sockets)."""

from __future__ import annotations

from typing import Any

from ingest.otlp import make_fault_request, make_metrics_request
from ingest.pipeline import Ingestor
from workflows.config import AutorepairConfig
from workflows.models import Alert

NOW = 1_800_000_000.0


class ListSink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


def _ingestor(sink: Any) -> Ingestor:
    return Ingestor(AutorepairConfig(), alert_sink=sink, clock=lambda: NOW)


async def test_fault_from_an_agent_whose_clock_is_minutes_fast_is_not_dropped() -> None:
    sink = ListSink()
    ing = _ingestor(sink)
    ahead_ns = int((NOW + 360) * 1e9)
    xid = make_fault_request("c", "gpu-3", kind="xid", code=79, gpu="0000:3b:00.0",
                             body="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                             time_ns=ahead_ns)
    resp, _ = await ing.handle_logs(xid, "test")
    clear = make_fault_request("c", "gpu-3", kind="gpu_lost", gpu="0000:3b:00.0",
                               body="GPU 0000:3b:00.0 is back", active=False,
                               time_ns=ahead_ns + 1)
    resp2, _ = await ing.handle_logs(clear, "test")
    why = (resp.partial_success.error_message, resp2.partial_success.error_message)
    assert [(a.kind, a.active) for a in sink.alerts] == [("xid", True),
                                                         ("gpu_lost", False)], why
    for a in sink.alerts:
        # judged on receipt: stamped with ingest's time, the sender's kept as evidence
        assert a.observed_at.timestamp() == NOW and a.received_at is not None
        assert a.received_at.timestamp() == NOW
        assert a.evidence["sender_clock_ahead_s"] == 360
        assert a.evidence["sender_time_unix_nano"] in (ahead_ns, ahead_ns + 1)


async def test_a_score_from_the_future_is_still_refused() -> None:
    """Scores keep the bound: a point from the future would outlive its TTL."""
    ing = _ingestor(ListSink())
    req = make_metrics_request("c", "gpu-3", 0.9, time_ns=int((NOW + 360) * 1e9))
    resp, _ = await ing.handle_metrics(req, "test")
    assert resp.partial_success.rejected_data_points == 1
    assert "in the future" in resp.partial_success.error_message
