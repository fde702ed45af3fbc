"""The Slurm watcher's maintenance windows leave out the project's own reservations
(issue 29 item 1 + issue 31 item 3): the evidence capture before a repair's action
places a ``Flags=MAINT`` reservation ``autorepair-evidence-<run>``; taken for an
operator's window, it would mark the node's alerts ``in_maintenance`` and, once deleted,
hold its next faults for ``policy.maintenance.grace_s``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.evidence.node import RESERVATION_PREFIX
from activities.scheduler.slurm import SlurmReservation
from workers.watchers.slurm import SlurmWatcher
from workflows.config import AutorepairConfig

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class _NoSink:
    async def deliver(self, alert: object) -> object:  # never called here
        raise AssertionError("no alert expected")


def _res(name: str) -> SlurmReservation:
    return SlurmReservation(name=name, nodes=("gpu-01",), flags=frozenset({"MAINT"}),
                            start=T0, end=T0 + timedelta(hours=1))


def test_own_reservations_are_not_maintenance_windows() -> None:
    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c1", "nodes": [
        {"name": "gpu-01"}]}]})
    cl = cfg.clusters[0]
    w = SlurmWatcher(cfg, cl, _NoSink())  # type: ignore[arg-type]
    got = w.maintenance_windows([
        _res("rack-a"), _res(f"{RESERVATION_PREFIX}-r1"),
        _res(f"{cl.validation.reservation_prefix}-v1"),
        _res(f"{cl.reset_gpu.reservation_prefix}-g1")])
    assert [x.window_id for x in got] == ["slurm:c1:rack-a"]
