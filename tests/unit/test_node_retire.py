"""I20 retirement judged by what ran (found in review of issue 26): a repair started as a
power cycle and approved as a ``reset_gpu`` (``approve --action``) retires only the
faults it used; a repair whose actions included a booting one retires every fault the
control plane received before it ended. ``NodeWorkflow._retire`` is pure over the
carried state, so it is driven here without Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.conftest import make_alert
from workflows.models import Action, Stage
from workflows.node import ActiveFault, NodeCarried, NodeWorkflow
from workflows.protocol import RepairFinished

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
USED = "c/gpu-01/used"  # make_alert's id of the fault the repair acted on


def _node(started_as: Action) -> NodeWorkflow:
    wf = NodeWorkflow.__new__(NodeWorkflow)
    faults = {}
    for key, gpu in (("used", "0000:3b:00.0"), ("other", "0000:5e:00.0")):
        a = make_alert("c", "gpu-01", key, kind="ecc_remap", code=None, gpu=gpu, level=True,
                       observed_at=T0, received_at=T0)
        faults[key] = ActiveFault(alert=a, action=Action.reset_gpu, rule="r",
                                  first_seen=T0, received=T0)
    wf._s = NodeCarried(active=faults, repair_id="r1", repair_alert_ids=[USED],
                        repair_action=started_as)
    return wf


def _finished(actions: list[Action] | None) -> RepairFinished:
    return RepairFinished(repair_id="r1", stage=Stage.succeeded,
                          at=T0 + timedelta(hours=1), alert_ids=[USED], actions=actions)


def test_reset_that_ran_retires_only_the_faults_it_used() -> None:
    wf = _node(started_as=Action.power_cycle)  # approved with --action reset_gpu
    wf._retire(_finished([Action.reset_gpu]), {USED})
    assert set(wf._s.active) == {"other"} and wf._s.booted_at is None


def test_a_booting_action_among_those_that_ran_retires_everything_before_its_end() -> None:
    wf = _node(started_as=Action.reset_gpu)  # the reset could not run; reboot ran
    wf._retire(_finished([Action.reboot]), {USED})
    assert wf._s.active == {} and wf._s.booted_at == T0 + timedelta(hours=1)


def test_an_older_sender_without_actions_is_judged_by_the_started_action() -> None:
    wf = _node(started_as=Action.reset_gpu)
    wf._retire(_finished(None), {USED})
    assert set(wf._s.active) == {"other"}
