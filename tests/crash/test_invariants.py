"""The crash test's checker flags each kind of violation it exists for (and only those):
a clean run passes, then one seeded defect at a time must be reported."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from tests.crash.invariants import LedgerRepair, MachineCycle, WorkflowEnd, check

T0 = datetime(2025, 1, 1, tzinfo=UTC)
STAGES = ("recommended", "cordoning", "waiting_for_idle", "draining", "repairing", "joining",
          "running", "succeeded")


def repair(rid: str, node: str, start_s: float, end_s: float, **kw: object) -> LedgerRepair:
    base = LedgerRepair(
        repair_id=rid, node=node, stage="succeeded", workflow_id=f"repair/c/{node}/{rid}",
        created_at=T0 + timedelta(seconds=start_s), ended_at=T0 + timedelta(seconds=end_s),
        stages=STAGES, attempts=(("power_cycle", "succeeded"),))
    return replace(base, **kw)  # type: ignore[arg-type]


def cycle(node: str, at_s: float) -> MachineCycle:
    return MachineCycle(node=node, at=(T0 + timedelta(seconds=at_s)).timestamp())


def clean() -> tuple[list[LedgerRepair], list[WorkflowEnd], list[MachineCycle]]:
    # two repairs one after the other on gpu-01, one on gpu-02
    rs = [repair("a", "gpu-01", 0, 20), repair("b", "gpu-01", 30, 50),
          repair("c", "gpu-02", 0, 25)]
    wfs = [WorkflowEnd(r.workflow_id or "", "COMPLETED", "succeeded") for r in rs]
    cycles = [cycle("gpu-01", 10), cycle("gpu-01", 40), cycle("gpu-02", 12)]
    return rs, wfs, cycles


def test_a_clean_run_has_no_violation() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, wfs, cycles, [])
    assert v.violations == []
    assert v.figures == {"repairs": 3, "stages": {"succeeded": 3}, "machine_cycles": 3,
                         "duplicates": 0, "cordoned_left": 0}


def test_a_machine_cycled_twice_in_one_repair_is_a_duplicate() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, wfs, [*cycles, cycle("gpu-02", 18)], [])
    assert v.figures["duplicates"] == 1
    assert any("c (gpu-02): machine taken down 2 times" in x for x in v.violations)


def test_a_cycle_outside_every_repair_is_a_duplicate() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, wfs, [*cycles, cycle("gpu-02", 300)], [])
    assert v.figures["duplicates"] == 1
    assert any("outside every repair" in x for x in v.violations)


def test_two_actions_in_the_ledger_for_one_repair_are_a_duplicate() -> None:
    rs, wfs, cycles = clean()
    rs[2] = replace(rs[2], attempts=(("power_cycle", "succeeded"), ("reboot", "succeeded")))
    v = check(rs, wfs, cycles, [])
    assert v.figures["duplicates"] == 1
    assert any("2 machine actions in the ledger" in x for x in v.violations)


def test_an_action_the_machine_never_saw_is_flagged() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, wfs, cycles[:2], [])
    assert v.violations == ["c (gpu-02): ledger says power_cycle succeeded but the machine "
                            "was never taken down"]


def test_a_repair_that_did_not_end_or_ended_twice_is_flagged() -> None:
    rs, wfs, cycles = clean()
    stuck = replace(rs[0], stage="joining", ended_at=None, stages=STAGES[:-2])
    v = check([stuck, *rs[1:]], wfs, cycles, [])
    assert any("ledger stage 'joining' is not terminal" in x for x in v.violations)
    assert any("0 terminal transitions" in x for x in v.violations)
    twice = replace(rs[0], stages=(*STAGES, "failed"))
    v = check([twice, *rs[1:]], wfs, cycles, [])
    assert any("2 terminal transitions" in x for x in v.violations)


def test_ledger_and_temporal_must_agree() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, [replace(wfs[0], status="RUNNING", result_stage=None), *wfs[1:]], cycles, [])
    assert any("is RUNNING, not COMPLETED" in x for x in v.violations)
    v = check(rs, [replace(wfs[0], result_stage="failed"), *wfs[1:]], cycles, [])
    assert any("workflow result 'failed' != ledger 'succeeded'" in x for x in v.violations)
    v = check(rs[1:], wfs, cycles[1:], [])
    assert any("has no ledger repair" in x for x in v.violations)
    v = check(rs, wfs[1:], cycles, [])
    assert any("no RepairWorkflow" in x for x in v.violations)


def test_a_node_left_cordoned_is_flagged() -> None:
    rs, wfs, cycles = clean()
    v = check(rs, wfs, cycles, ["gpu-02"])
    assert v.violations == ["gpu-02: left cordoned"] and v.figures["cordoned_left"] == 1
