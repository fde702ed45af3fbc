"""The watchers' edge times (workers.watchers.edges.EdgeTimes): a fault's raises and
clears are stamped in the order they were sent, whatever the two clocks say, so the
ledger's "newest edge" reading (open_level_alerts) matches what the watcher did."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.watchers.edges import DEPARTED_KEEP, EDGE_STEP, EdgeTimes

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_raise_in_the_second_of_the_clear_is_moved_after_it() -> None:
    e = EdgeTimes()
    e.raised("gpu-03", T0)
    clear = e.clear_at("gpu-03", T0 + timedelta(seconds=0.4))  # the watcher's own clock
    assert clear == T0 + timedelta(seconds=0.4)
    # DOWN again within that second: Slurm's reason time is the whole second T0
    again = e.raise_at("gpu-03", T0)
    assert again == clear + EDGE_STEP
    assert e.raise_at("gpu-03", T0) == again  # stable from scan to scan: one alert_id
    assert e.raise_at("gpu-03", T0 + timedelta(seconds=1)) == T0 + timedelta(seconds=1)


def test_clear_stamped_before_its_raise_is_moved_after_it() -> None:
    e = EdgeTimes()
    e.raised(("gpu-01", "Ready"), T0 + timedelta(seconds=5))  # API server clock ahead
    assert e.clear_at(("gpu-01", "Ready"), T0) == T0 + timedelta(seconds=5) + EDGE_STEP


def test_keys_are_independent_and_retain_forgets_deleted_nodes() -> None:
    e = EdgeTimes()
    e.raised(("gpu-01", "Ready"), T0)
    e.clear_at(("gpu-01", "Ready"), T0 + timedelta(seconds=1))
    e.clear_at(("gpu-02", "Ready"), T0 + timedelta(seconds=1))
    assert e.raise_at(("gpu-01", "KernelDeadlock"), T0) == T0
    assert len(e) == 2
    e.retain({"gpu-02"}, T0 + timedelta(seconds=2))
    assert len(e) == 2  # gone for less than DEPARTED_KEEP: kept
    e.retain({"gpu-02"}, T0 + timedelta(seconds=2) + DEPARTED_KEEP)
    assert len(e) == 1
    assert e.raise_at(("gpu-01", "Ready"), T0) == T0  # forgotten with its node
    assert e.raise_at(("gpu-02", "Ready"), T0) == T0 + timedelta(seconds=1) + EDGE_STEP


def test_node_deleted_and_registered_again_keeps_its_floor() -> None:
    """A Kubernetes Node deleted (its NotReady cleared when it left) and registered again
    a few seconds later, NotReady again with the API server's clock 2 s behind: the raise
    is stamped after the clear, not answered "stale raise"."""
    e = EdgeTimes()
    key = ("gpu-01", "Ready")
    e.raised(key, T0)
    gone = e.clear_at(key, T0 + timedelta(seconds=30))  # the node left the list
    e.retain(set(), T0 + timedelta(seconds=30))
    e.retain(set(), T0 + timedelta(seconds=35))
    e.retain({"gpu-01"}, T0 + timedelta(seconds=40))  # back: the clock restarts
    behind = T0 + timedelta(seconds=38) - timedelta(seconds=10)
    assert e.raise_at(key, behind) == gone + EDGE_STEP
    e.retain(set(), T0 + timedelta(seconds=50) + DEPARTED_KEEP - timedelta(seconds=1))
    assert len(e) == 1  # missing again, counted from then


@settings(max_examples=200, derandomize=True)
@given(st.lists(st.tuples(st.integers(-3000, 3000), st.integers(-3000, 3000)),
                min_size=1, max_size=30))
def test_every_edge_of_a_fault_sorts_after_the_one_before(
    episodes: list[tuple[int, int]]
) -> None:
    """Any raise/clear sequence, each edge stamped from either clock (offsets in ms): the
    stamped times strictly increase, so the newest edge is the last one sent."""
    e = EdgeTimes()
    stamped: list[datetime] = []
    for raise_ms, clear_ms in episodes:
        at = e.raise_at("n", T0 + timedelta(milliseconds=raise_ms))
        assert e.raise_at("n", T0 + timedelta(milliseconds=raise_ms)) == at
        e.raised("n", at)
        stamped.append(at)
        stamped.append(e.clear_at("n", T0 + timedelta(milliseconds=clear_ms)))
    assert all(a < b for a, b in itertools.pairwise(stamped)), stamped


def test_reopened_raise_keeps_its_stamp_across_a_restart() -> None:
    """Before the restart the raise was moved after a clear (T0 + 0.4 s + 1 ms); the
    restarted watcher re-opens it from the ledger and recomputes the peer's T0: it gets
    the moved stamp again (one alert_id), and a clear after it still sorts after it."""
    before = EdgeTimes()
    before.raised("gpu-03", T0)
    before.clear_at("gpu-03", T0 + timedelta(seconds=0.4))
    moved = before.raise_at("gpu-03", T0)
    after = EdgeTimes()
    after.reopened("gpu-03", moved)
    assert after.raise_at("gpu-03", T0) == moved
    assert after.clear_at("gpu-03", T0) > moved
    # an episode that was never moved keeps the peer's time
    plain = EdgeTimes()
    plain.reopened("gpu-04", T0)
    assert plain.raise_at("gpu-04", T0) == T0
    assert plain.raise_at("gpu-04", T0 + timedelta(seconds=9)) == T0 + timedelta(seconds=9)


def test_raise_after_a_restart_sorts_after_the_ledgers_last_clear() -> None:
    """The watcher restarted between a clear and the next raise: it reads the clear from
    the ledger (``Ledger.last_level_edges``), so a raise Slurm stamps earlier (no reason
    time: slurmd's start time, long before) is still stamped after it, and two such
    episodes never share a stamp (an ``alert_id``)."""
    slurmd_start = T0 - timedelta(hours=3)
    before = EdgeTimes()
    first = before.raise_at("gpu-02", slurmd_start)
    before.raised("gpu-02", first)
    clear = before.clear_at("gpu-02", T0)
    after = EdgeTimes()
    after.cleared_before("gpu-02", clear)
    again = after.raise_at("gpu-02", slurmd_start)
    assert again == clear + EDGE_STEP and again != first
    assert after.raise_at("gpu-02", slurmd_start) == again  # stable: one alert_id
    # a later clear known already wins over an older one read afterwards
    after.cleared_before("gpu-02", clear - timedelta(seconds=5))
    assert after.raise_at("gpu-02", slurmd_start) == again


@settings(max_examples=300, derandomize=True)
@given(st.lists(st.tuples(st.integers(-3000, 3000), st.integers(-3000, 3000),
                          st.sampled_from(["none", "after_raise", "after_clear",
                                           "after_clear_ledger_down"]),
                          st.integers(0, 5000)),
                min_size=1, max_size=30))
def test_edges_stay_in_order_across_restarts(
    episodes: list[tuple[int, int, str, int]]
) -> None:
    """Any raise/clear sequence with watcher restarts between any two edges; a restarted
    watcher knows only the ledger's newest edge (re-opened when a raise, a floor when a
    clear), or, when the ledger is down at start, nothing until the next raise is sent
    (:attr:`EdgeTimes.floor`: its first scan, ``wait_ms`` after the last edge it sent).
    The stamps strictly increase, and a raise re-computed right after a restart or
    right after the ledger answers keeps the stamp it had (one alert_id)."""
    e = EdgeTimes()
    stamped: list[datetime] = []
    ledger_back: datetime | None = None  # the clear the ledger answers once it is back
    for raise_ms, clear_ms, restart, wait_ms in episodes:
        peer = T0 + timedelta(milliseconds=raise_ms)
        at = e.raise_at("n", peer)
        e.raised("n", at)
        stamped.append(at)
        if ledger_back is not None:
            e.floor = None
            e.cleared_before("n", ledger_back)
            assert e.raise_at("n", peer) == at
            ledger_back = None
        if restart == "after_raise":
            e = EdgeTimes()
            e.reopened("n", at)
            assert e.raise_at("n", peer) == at
        stamped.append(e.clear_at("n", T0 + timedelta(milliseconds=clear_ms)))
        if restart == "after_clear":
            e = EdgeTimes()
            e.cleared_before("n", stamped[-1])
        if restart == "after_clear_ledger_down":
            e = EdgeTimes()
            e.floor = stamped[-1] + timedelta(milliseconds=wait_ms)
            ledger_back = stamped[-1]
    assert all(a < b for a, b in itertools.pairwise(stamped)), stamped
