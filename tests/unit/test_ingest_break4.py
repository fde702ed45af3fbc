"""Ingest rails a break-test of 8a5413f found open, each a failing reproduction."""

from __future__ import annotations

from ingest.otlp import make_metrics_request
from ingest.pipeline import Ingestor
from workflows.config import AutorepairConfig

NOW = 1_800_000_000.0


async def test_a_node_whose_clock_runs_two_minutes_slow_has_its_scores_taken() -> None:
    """Operator: gpu-03's NTP is broken and its clock runs 2 minutes slow. Every health
    score it pushes is refused ("time_unix_nano … is older than the score TTL (50 s)",
    autorepair_otlp_rejected_total{reason="timestamp"}): the node never enters the
    cohort's median and quorum and is never flagged as a straggler however slow it is,
    while it pushes every 10 s. The wire contract refuses only timestamps far in the
    future; I17: staleness is judged on the control plane's receive time, never the
    sender's clock, which may be up to ±5 min off."""
    cfg = AutorepairConfig.model_validate({
        "threshold": {"push_interval_s": 10},
        "clusters": [{"name": "c", "gpu_nodes": 3,
                      "nodes": [{"name": f"gpu-0{i}"} for i in (1, 2, 3)]}]})
    ing = Ingestor(cfg, clock=lambda: NOW)
    slow_clock = NOW - 120
    resp, _ = await ing.handle_metrics(
        make_metrics_request("c", "gpu-03", 0.2, time_ns=int(slow_clock * 1e9)), "test")
    assert resp.partial_success.rejected_data_points == 0, (
        resp.partial_success.error_message)
    assert ing.nodes[("c", "gpu-03")].score == 0.2


async def test_alerts_taken_while_temporal_is_down_for_a_few_minutes_are_delivered() -> None:
    """Operator: the Temporal frontend is restarted for an upgrade (about 3 minutes
    unreachable). An Xid 79 ingest accepted meanwhile never becomes a repair: after
    ``ingest.handoff_max_attempts`` (12 tries, about 140 s of back-off) it is written to
    ``dead_letters`` (``retries_exhausted``) and marked handed off, so nothing re-delivers
    it until someone runs `autorepair dead-letters replay`. Rail: nothing already
    accepted is lost — an unreachable Temporal is waited out (the hand-off module: "never
    losing an accepted alert while Temporal is down"); only a workflow that refuses or
    never answers an alert dead-letters it."""
    import asyncio
    from datetime import UTC, datetime

    from temporalio.service import RPCError, RPCStatusCode

    from ingest.handoff import TemporalAlertSink
    from workflows.models import Alert, AlertDelivery, AlertOutcome

    class DownThenUp(TemporalAlertSink):
        calls = 0

        async def deliver(self, alert: Alert) -> AlertDelivery:
            self.calls += 1
            if self.calls <= 20:  # Temporal's frontend is down for 20 tries
                raise RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")
            return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.recommended)

    sink = DownThenUp(None, max_backoff_s=0.01)  # type: ignore[arg-type]
    sink._backoff = lambda attempts: 0.001  # type: ignore[method-assign]
    await sink.start()
    try:
        await sink.submit(Alert(alert_id="x79", cluster="c", node="gpu-01", kind="xid",
                                code=79, summary="Xid 79",
                                observed_at=datetime(2026, 1, 1, tzinfo=UTC)))
        for _ in range(500):
            if sink.counts["delivered"] or sink.counts["dead_lettered"]:
                break
            await asyncio.sleep(0.01)
        assert sink.counts["dead_lettered"] == 0 and sink.counts["delivered"] == 1, sink.counts
    finally:
        await sink.stop(drain_timeout_s=0.1)


async def test_a_dead_lettered_raise_is_not_superseded_by_a_clear_received_before_it(
        ledger_pool: object) -> None:
    """Operator: gpu-04's clock ran 5 minutes fast until NTP stepped it back. Its GPU
    fault cleared (the clear received 12:00, stamped 12:05 by the fast clock), then came
    back (received 12:02, stamped 12:02) while Temporal was unreachable, so the raise was
    dead-lettered. `autorepair dead-letters replay --all` skips it as "superseded: its
    fault was cleared at 12:05, after this raise" — ordered on the sender's stamps — and
    the fault that is there now is never repaired. Rail (I17): edge order is the control
    plane's receipt time, never the sender's clock."""
    from datetime import UTC, datetime, timedelta

    from activities.ledger import Ledger
    from workflows.models import Alert

    ledger = Ledger(ledger_pool)  # type: ignore[arg-type]
    t = datetime(2026, 3, 1, 12, tzinfo=UTC)

    def edge(aid: str, active: bool, received: datetime, stamped: datetime) -> Alert:
        return Alert(alert_id=aid, cluster="c", node="gpu-04", kind="gpu_lost",
                     summary="GPU missing", level=True, active=active,
                     observed_at=stamped, received_at=received)

    await ledger.record_alert(edge("clear", False, t, t + timedelta(minutes=5)))
    raise_ = edge("raise", True, t + timedelta(minutes=2), t + timedelta(minutes=2))
    await ledger.record_alert(raise_)
    assert await ledger.clear_after(raise_) is None, "a clear received before it"


async def test_the_whatif_replays_alerts_at_their_receipt_time(ledger_pool: object) -> None:
    """Operator: `autorepair whatif` says "alerts are replayed at their receipt time
    (received_at; observed_at for rows older than migration 0014)", but the ledger read
    behind it selects and windows the alerts by the sender's observed_at and drops
    received_at: a node whose clock runs 4 minutes slow has its faults replayed 4 minutes
    early (before the other nodes' faults it followed, outside the window asked for), so
    the replay's persistence, counts and breaker order are not what the node workflows
    judged. Rail (I17): windows and order are the control plane's receipt time."""
    from datetime import UTC, datetime, timedelta

    from activities.ledger import Ledger
    from activities.ledger_queries import whatif_alerts
    from workflows.models import Alert

    ledger = Ledger(ledger_pool)  # type: ignore[arg-type]
    t0 = datetime(2026, 11, 2, 12, tzinfo=UTC)

    def xid(aid: str, received: datetime, stamped: datetime) -> Alert:
        return Alert(alert_id=aid, cluster="wc", node="n-" + aid, kind="xid", code=79,
                     summary="Xid 79", observed_at=stamped, received_at=received)

    # "slow" was received at 12:02 but its node's clock said 11:58 (before the window)
    await ledger.record_alert(xid("first", t0 + timedelta(minutes=1), t0 + timedelta(minutes=1)))
    await ledger.record_alert(xid("slow", t0 + timedelta(minutes=2), t0 - timedelta(minutes=2)))
    got = [a async for p in whatif_alerts(ledger_pool, t0, t0 + timedelta(hours=1),  # type: ignore[arg-type]
                                          cluster="wc") for a in p]
    assert [a.alert_id for a in got] == ["first", "slow"]
    assert got[1].received_at == t0 + timedelta(minutes=2)


def test_status_shows_an_xid_received_after_the_repair_as_active() -> None:
    """Operator: `autorepair status` lists gpu-05's new Xid 79 as ``repaired``: its
    node's clock runs 5 minutes slow, so the Xid received a minute after the last
    successful repair ended carries a stamp from before it, and the episode table
    compared the repair's end with that stamp. The fault that is there now looks fixed.
    Rail (I17): the control plane's receipt time orders events, never the sender's."""
    from workers.ops import alert_episodes

    xid = {"alert_id": "x", "cluster": "c", "node": "gpu-05", "kind": "xid", "code": 79,
           "gpu": None, "level": False, "active": True, "source": "agent",
           "observed_at": "2026-03-01T11:56:00+00:00",
           "received_at": "2026-03-01T12:01:00+00:00"}
    repairs = [{"cluster": "c", "node": "gpu-05", "stage": "succeeded",
                "updated_at": "2026-03-01T12:00:00+00:00"}]
    (row,) = alert_episodes([xid], {("c", "gpu-05")}, repairs)
    assert row["state"] == "active", row["state"]
