"""TemporalAlertSink scheduling: many shards in parallel, each node's alerts one at a time in
order.

``deliver`` (the update-with-start call) is replaced by a recorder that holds chosen
alerts until released; everything else is the real sink."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from ingest.handoff import HandoffQueueFull, TemporalAlertSink
from workflows.models import Alert, AlertDelivery, AlertOutcome


def alert(node: str, i: int, active: bool = True) -> Alert:
    return Alert(alert_id=f"{node}-{i}", cluster="c", node=node, kind="xid", code=79,
                 summary="Xid 79", observed_at=datetime(2026, 1, 1, tzinfo=UTC), active=active)


class Recording(TemporalAlertSink):
    def __init__(self, **kw: Any) -> None:
        super().__init__(client=None, **kw)  # type: ignore[arg-type]
        self.started: list[str] = []
        self.finished: list[str] = []
        self.hold: dict[str, asyncio.Event] = {}
        self.in_flight: dict[str, int] = {}
        self.max_in_flight_per_node = 0

    @property
    def parallel_shards(self) -> int:
        return len(self._queues)

    async def deliver(self, a: Alert) -> AlertDelivery:
        self.started.append(a.alert_id)
        n = self.in_flight.get(a.node, 0) + 1
        self.in_flight[a.node] = n
        self.max_in_flight_per_node = max(self.max_in_flight_per_node, n)
        try:
            if a.alert_id in self.hold:
                await self.hold[a.alert_id].wait()
            await asyncio.sleep(0)
        finally:
            self.in_flight[a.node] -= 1
        self.finished.append(a.alert_id)
        return AlertDelivery(alert_id=a.alert_id, outcome=AlertOutcome.new)


async def until(cond: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.001)):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not met in time")


async def test_slow_node_does_not_hold_up_other_nodes() -> None:
    sink = Recording()  # default shards
    sink.hold["slow-0"] = asyncio.Event()
    await sink.start()
    try:
        await sink.submit(alert("slow", 0))
        await sink.submit(alert("slow", 1, active=False))  # the clear waits for the raise
        # d, f and m share the slow node's shard when there are only 4 shards
        for node in ("d", "f", "m"):
            await sink.submit(alert(node, 0))
        await until(lambda: {"d-0", "f-0", "m-0"} <= set(sink.finished))
        assert "slow-1" not in sink.started  # its raise is still in flight
        sink.hold["slow-0"].set()
        await until(lambda: "slow-1" in sink.finished)
        assert sink.finished.index("slow-0") < sink.finished.index("slow-1")
        assert sink.max_in_flight_per_node == 1
        assert sink.counts["delivered"] == 5 and sink.depth() == 0
    finally:
        await sink.stop(drain_timeout_s=1)


async def test_many_alerts_of_one_node_keep_their_order() -> None:
    sink = Recording(shards=8)
    await sink.start()
    try:
        for i in range(50):
            await sink.submit(alert("n", i, active=i % 2 == 0))
        await until(lambda: len(sink.finished) == 50)
        assert sink.finished == [f"n-{i}" for i in range(50)]
        assert sink.max_in_flight_per_node == 1
    finally:
        await sink.stop(drain_timeout_s=1)


async def test_queue_bound_and_default_shards() -> None:
    assert Recording().parallel_shards == 64
    assert Recording(queue_size=10).parallel_shards == 10  # never more shards than slots
    sink = Recording(shards=1, queue_size=2)
    sink.hold["x-0"] = asyncio.Event()
    await sink.start()
    try:
        await sink.submit(alert("x", 0))
        await until(lambda: sink.started == ["x-0"])
        await sink.submit(alert("y", 0))
        with pytest.raises(HandoffQueueFull):  # the one in flight counts until delivered
            await sink.submit(alert("z", 0))
        assert sink.counts["queue_full"] == 1 and sink.depth() == 2
        sink.hold["x-0"].set()
        await until(lambda: sink.finished == ["x-0", "y-0"])
        assert sink.depth() == 0
    finally:
        await sink.stop(drain_timeout_s=1)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="queue_size: 2 must be at least shards"):
        Recording(shards=3, queue_size=2)
