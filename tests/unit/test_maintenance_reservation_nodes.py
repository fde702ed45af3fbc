"""A maintenance window read from a scheduler holds each node once, in the order the
scheduler lists them (first occurrence wins), as an operator's window does since
``maintenance --nodes a,a`` was fixed (294203b): a Slurm ``Flags=MAINT`` reservation
whose node list names a node twice (``Nodes=gpu-[01-02],gpu-01``) was stored, listed and
reported with that node twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.scheduler.slurm import SlurmReservation, parse_scontrol_show_reservation
from workers.watchers.slurm import SlurmWatcher
from workflows.config import AutorepairConfig
from workflows.maintenance import MaintenanceWindow, covering

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)

RESERVATIONS = (
    "ReservationName=rack-a StartTime=2026-12-01T12:00:00 EndTime=2026-12-01T14:00:00 "
    "Duration=02:00:00 Nodes=gpu-[02-03],gpu-02,gpu-[01-03] NodeCnt=3 CoreCnt=3 "
    "Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=3 Users=root "
    "State=ACTIVE\n")


class _NoSink:
    async def submit(self, alert: object) -> None:  # never called here
        raise AssertionError("no alert expected")


def test_a_reservation_lists_each_node_once_in_order() -> None:
    (r,) = parse_scontrol_show_reservation(RESERVATIONS)
    assert r.nodes == ("gpu-02", "gpu-03", "gpu-01")


def test_the_slurm_watchers_window_holds_each_node_once_in_order() -> None:
    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c1", "nodes": [
        {"name": "gpu-01"}, {"name": "gpu-02"}, {"name": "gpu-03"}]}]})
    w = SlurmWatcher(cfg, cfg.clusters[0], _NoSink())  # type: ignore[arg-type]
    # a reservation as another reader may give it (nodes not yet de-duplicated)
    res = SlurmReservation(name="rack-b", nodes=("gpu-01", "gpu-02", "gpu-01"),
                           flags=frozenset({"MAINT"}), start=T0, end=T0 + timedelta(hours=1))
    (got,) = w.maintenance_windows([res])
    assert got.nodes == ["gpu-01", "gpu-02"]
    (got,) = w.maintenance_windows(parse_scontrol_show_reservation(RESERVATIONS))
    assert got.nodes == ["gpu-02", "gpu-03", "gpu-01"]


def test_a_window_holds_each_node_once_whatever_its_source() -> None:
    w = MaintenanceWindow(window_id="slurm:c1:rack-a", cluster="c1", scope="nodes",
                          nodes=["gpu-02", "gpu-01", "gpu-02", "gpu-01"], reason="r",
                          created_by="slurm", source="slurm", starts_at=T0,
                          ends_at=T0 + timedelta(hours=1))
    assert w.nodes == ["gpu-02", "gpu-01"]
    hit = covering([w], "c1", "gpu-01", None, T0 + timedelta(minutes=1))
    assert [x.nodes for x in hit] == [["gpu-02", "gpu-01"]]
