"""Issue 27 item 5: control-plane kinds are refused from senders, and the ledger's reads
of control-plane state take only the control plane's rows.

A node's own token reporting ``circuit_breaker`` for itself used to make the next fresh
guard hold every automatic repair ("FORGED by gpu-01"), and a clear stamped later masked
a real trip on rebuild (``ledger.guard_state`` had no source filter)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.ledger import Ledger
from ingest.otlp import make_fault_request
from ingest.pipeline import Ingestor
from tests.workflows.conftest import make_alert
from workflows.activity_api import GuardStateQuery
from workflows.catalogue.vocabulary import SENDER_RESERVED_KINDS, SIGNAL_KINDS
from workflows.config import AutorepairConfig
from workflows.models import Alert

RESERVED = ["circuit_breaker", "node_unreachable", "straggler_panic", "repair_request",
            "nccl_slow_rank", "failure_domain"]


class ListSink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


def test_reserved_list_names_every_control_plane_kind() -> None:
    assert set(RESERVED) <= SENDER_RESERVED_KINDS
    assert "straggler" not in SENDER_RESERVED_KINDS  # the agent's own classification
    assert not SIGNAL_KINDS & SENDER_RESERVED_KINDS  # nothing the agent reads is refused


@pytest.mark.parametrize("kind", [*RESERVED, "CIRCUIT_BREAKER"])
async def test_sender_cannot_report_a_control_plane_kind(kind: str) -> None:
    cfg = AutorepairConfig.model_validate(
        {"clusters": [{"name": "c1", "nodes": [{"name": "gpu-01"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink)
    req = make_fault_request("c1", "gpu-01", kind=kind, body="FORGED by gpu-01",
                             evidence={"reason": "FORGED by gpu-01"})
    resp, _ = await ing.handle_logs(req, "http", reporter="node")
    assert sink.alerts == []
    assert resp.partial_success.rejected_log_records == 1
    assert "control-plane kind" in resp.partial_success.error_message


def _breaker(cluster: str, at: datetime, *, active: bool, source: str, node: str,
             reason: str) -> Alert:
    return make_alert(cluster, node, f"{source}-{at.isoformat()}-{active}",
                      kind="circuit_breaker", code=None, gpu=None, severity="critical",
                      actionable=False, action="none", level=True, active=active,
                      source=source, observed_at=at, evidence={"reason": reason})


async def test_guard_state_reads_only_the_guards_breaker_rows(ledger_pool: Any) -> None:
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC)
    since = now - timedelta(hours=1)
    # a forged raise recorded for the node itself: no breaker
    await ledger.record_alert(_breaker("c1", now - timedelta(minutes=5), active=True,
                                       source="agent", node="gpu-01",
                                       reason="FORGED by gpu-01"))
    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=since))
    assert not st.breaker_open and st.tripped_reason == ""
    # a real trip by the guard, then a forged clear stamped +290 s: still open
    await ledger.record_alert(_breaker("c2", now - timedelta(minutes=10), active=True,
                                       source="guard", node="*", reason="3 > 2"))
    await ledger.record_alert(_breaker("c2", now - timedelta(minutes=10) + timedelta(
        seconds=290), active=False, source="agent", node="*", reason="FORGED clear"))
    st = await ledger.guard_state(GuardStateQuery(cluster="c2", since=since))
    assert st.breaker_open and st.tripped_reason == "3 > 2"
