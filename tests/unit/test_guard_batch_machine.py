"""The guard machine's batch event and bounds (issue 30 item 1), pure: a batch decides
like the same messages one by one, answers every request once, and the carried state
stays bounded in a storm."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.leases import LeaseRelease, LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def policy(budget: int = 3, threshold: int = 1000) -> gm.PolicyView:
    return gm.PolicyView(gpu_nodes=1000, budget=budget, breaker_threshold=threshold,
                         breaker_window_s=600, one_per_pool=True, detector_cap=1000,
                         lease_ttl_s=3600, loaded=True, loaded_at=T0)


def serving(p: gm.PolicyView) -> gm.GuardState:
    s = gm.new_state("c", p)
    return s.model_copy(update={"status": gm.Status.serving, "policy": p, "fresh": False,
                                "rebuilt_at": T0})


def req(i: int, automatic: bool = True) -> gm.Request:
    return gm.Request(req=LeaseRequest(repair_id=f"r{i}", workflow_id=f"w{i}", cluster="c",
                                       node=f"n{i}", node_pool=f"p{i}", automatic=automatic))


def replies(cmds: gm.Cmds) -> list[gm.SendLease]:
    return [c for c in cmds if isinstance(c, gm.SendLease)]


def test_a_batch_decides_like_the_same_requests_one_by_one() -> None:
    p = policy(budget=3)
    events = [req(i) for i in range(20)]
    one = serving(p)
    for ev in events:
        one, _ = gm.step(one, ev, T0)
    batch, cmds = gm.step(serving(p), gm.Batch(events=list(events)), T0)
    assert [x.repair_id for x in batch.leases] == [x.repair_id for x in one.leases]
    assert [q.req.repair_id for q in batch.queue] == [q.req.repair_id for q in one.queue]
    sent = replies(cmds)
    assert sorted(c.reply.repair_id for c in sent) == sorted(f"r{i}" for i in range(20))
    assert sum(c.reply.granted for c in sent) == 3 and len(batch.leases) == 3


@pytest.mark.parametrize(("budget", "threshold"), [(1, 2), (3, 5), (50, 1000)])
def test_a_batch_answers_like_one_step_per_request(budget: int, threshold: int) -> None:
    """The same replies, leases, queue and breaker as stepping the requests one by one
    (with a trip in the middle: the request before it is granted, not held by it)."""
    p = policy(budget=budget, threshold=threshold)
    events = [req(i) for i in range(12)]
    one, sent_one = serving(p), []
    for ev in events:
        one, cmds = gm.step(one, ev, T0)
        sent_one += replies(cmds)
    batch, cmds = gm.step(serving(p), gm.Batch(events=list(events)), T0)
    key = [(c.reply.repair_id, c.reply.granted, c.reply.reason) for c in sent_one]
    assert sorted(key) == sorted((c.reply.repair_id, c.reply.granted, c.reply.reason)
                                 for c in replies(cmds))
    assert batch.leases == one.leases and batch.queue == one.queue
    assert batch.breaker_open == one.breaker_open


def test_a_queued_answer_the_batch_then_grants_is_not_sent() -> None:
    p = policy(budget=1)
    s, _ = gm.step(serving(p), req(0), T0)  # r0 holds the only slot
    s, cmds = gm.step(s, gm.Batch(events=[
        req(1), gm.Release(rel=LeaseRelease(repair_id="r0"))]), T0)
    sent = replies(cmds)
    assert [(c.reply.repair_id, c.reply.granted) for c in sent] == [("r1", True)]


def test_a_storm_keeps_counted_bounded_by_live_plus_threshold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # requests beyond the queue's cap are counted but neither held nor queued: without
    # the bound every one of them stays in ``counted`` for the whole window
    monkeypatch.setattr(gm, "MAX_QUEUED", 10)
    p = policy(budget=2, threshold=5)
    s = serving(p)
    now = T0
    for i in range(250):  # 1 s apart: within one policy refresh (POLICY_REFRESH_S)
        now += timedelta(seconds=1)
        s, _ = gm.step(s, gm.Batch(events=[req(i)]), now)
        live = len(s.leases) + len(s.queue)
        assert len(s.counted) <= live + p.breaker_threshold + 1, (i, len(s.counted))
    assert s.breaker_open and len(gm.window_count(s, now)) > p.breaker_threshold


def test_the_queue_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gm, "MAX_QUEUED", 5)
    s, cmds = gm.step(serving(policy(budget=1)), gm.Batch(
        events=[req(i, automatic=False) for i in range(10)]), T0)
    # the first granted, five kept, four told to re-send
    assert len(s.queue) == 5 and len(s.leases) == 1
    full = [c for c in replies(cmds) if "queue full" in c.reply.reason]
    assert len(full) == 4 and all(c.reply.queued and not c.reply.granted for c in full)
