"""I20 retirement judged by what ran (found in review of issue 26): a repair started as a
power cycle and approved as a ``reset_gpu`` (``approve --action``) retires only the
faults it used; a repair whose actions included a booting one retires every fault the
control plane received before it ended. The node machine
(:mod:`workflows.lifecycle.node`) decides it, so it is driven here without Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.conftest import make_alert
from workflows.lifecycle import node as nm
from workflows.models import Action, Stage

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
USED = "c/gpu-01/used"  # make_alert's id of the fault the repair acted on


def _node(started_as: Action) -> nm.NodeState:
    faults = {}
    for key, gpu in (("used", "0000:3b:00.0"), ("other", "0000:5e:00.0")):
        a = make_alert("c", "gpu-01", key, kind="ecc_remap", code=None, gpu=gpu, level=True,
                       observed_at=T0, received_at=T0)
        faults[key] = nm.Fault(alert=a, action=Action.reset_gpu, rule="r",
                               first_seen=T0, received=T0)
    s = nm.new_state("c", "gpu-01", "seed")
    return s.model_copy(update={
        "reconcile": nm.Reconcile.done, "active": faults,
        "repair": nm.OpenRepair(repair_id="r1", action=started_as, acted_on=["used"],
                                alert_ids=[USED])})


def _finished(s: nm.NodeState, actions: list[Action] | None) -> nm.NodeState:
    end = T0 + timedelta(hours=1)
    out, _ = nm.step(s, nm.RepairFinishedEv(repair_id="r1", stage=Stage.succeeded, at=end,
                                            alert_ids=[USED], actions=actions), end)
    return out


def test_reset_that_ran_retires_only_the_faults_it_used() -> None:
    s = _finished(_node(started_as=Action.power_cycle), [Action.reset_gpu])  # --action
    assert set(s.active) == {"other"} and s.booted_at is None


def test_a_booting_action_among_those_that_ran_retires_everything_before_its_end() -> None:
    s = _finished(_node(started_as=Action.reset_gpu), [Action.reboot])  # reset could not run
    assert s.active == {} and s.booted_at == T0 + timedelta(hours=1)


def test_an_older_sender_without_actions_is_judged_by_the_started_action() -> None:
    s = _finished(_node(started_as=Action.reset_gpu), None)
    assert set(s.active) == {"other"}


def _with_boot(started_as: Action) -> nm.NodeState:
    s = _node(started_as)
    assert s.repair is not None
    return s.model_copy(update={"repair": s.repair.model_copy(
        update={"boots": {"used": "boot-0"}})})


def test_a_reset_retires_its_fault_without_the_boot_it_ran_on() -> None:
    """A GPU reset replaces no boot: the fault it fixed is retired with no boot, so the
    same fault reported later from boot-0 (after the end) is the fault back, not a late
    report of a replaced boot (found by a break-test: the node ignored it for good)."""
    s = _finished(_with_boot(Action.reset_gpu), [Action.reset_gpu])
    assert s.retired["used"] == (T0 + timedelta(hours=1), "")


def test_a_booting_action_retires_its_fault_with_the_boot_it_replaced() -> None:
    s = _finished(_with_boot(Action.reset_gpu), [Action.reset_gpu, Action.reboot])
    assert s.retired["used"] == (T0 + timedelta(hours=1), "boot-0")
