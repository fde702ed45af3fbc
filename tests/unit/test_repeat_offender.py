"""Repeat-offender machines (issue 31 item 2): at ``rails.repeat_offender.threshold``
disruptive repairs within ``window_s`` on one machine, whatever the fault kinds, the next
recommendation is ``remove`` for a person, the rule naming the repairs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from workflows.activity_api import AttemptRecord
from workflows.config import LadderConfig, MigrateGateConfig, PolicyConfig, RepeatOffenderConfig
from workflows.models import Action
from workflows.policy import choose_action, repeat_offender

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
CFG = RepeatOffenderConfig()


def att(rid: str, action: Action, days_ago: float, machine: str = "m-1",
        kind: str = "xid", code: int | None = 79, outcome: str = "succeeded") -> AttemptRecord:
    return AttemptRecord(repair_id=rid, cluster="c", node="gpu-01", machine_id=machine,
                         action=action, alert_kind=kind, code=code, outcome=outcome,
                         at=NOW - timedelta(days=days_ago))


def test_defaults_and_config_keys() -> None:
    p = PolicyConfig.model_validate({"rails": {"repeat_offender": {"threshold": 4,
                                                                   "window_s": 86400}}})
    assert p.rails.repeat_offender.threshold == 4
    assert PolicyConfig().rails.repeat_offender.window_s == 30 * 86400
    assert PolicyConfig().rails.repeat_offender.threshold == 3
    with pytest.raises(ValidationError, match="threshold"):
        RepeatOffenderConfig(threshold=0)


def test_three_disruptive_repairs_across_fault_kinds_make_a_repeat_offender() -> None:
    attempts = [
        att("r1", Action.power_cycle, 20, kind="xid", code=79),
        att("r2", Action.reboot, 10, kind="ecc", code=None, outcome="failed"),
        att("r2", Action.reprovision, 9.9, kind="ecc", code=None),  # same repair: once
        att("r3", Action.reset_gpu, 1, kind="nvlink", code=None),
    ]
    ro = repeat_offender(attempts, "m-1", NOW, CFG)
    assert ro is not None and ro.repairs == ("r1", "r2", "r3")
    assert "repeat offender" in ro.rule and "r1, r2, r3" in ro.rule


@pytest.mark.parametrize("attempts", [
    # two repairs only
    [att("r1", Action.power_cycle, 5), att("r2", Action.reboot, 4)],
    # the third is outside the 30-day window
    [att("r1", Action.power_cycle, 31), att("r2", Action.reboot, 4), att("r3", Action.reboot, 1)],
    # cancelled / auto-resolved attempts do not count
    [att("r1", Action.power_cycle, 5), att("r2", Action.reboot, 4),
     att("r3", Action.reboot, 1, outcome="cancelled")],
    # another machine's repairs (the node moved to m-1 after a migrate)
    [att("r1", Action.power_cycle, 5, machine="m-0"), att("r2", Action.reboot, 4, machine="m-0"),
     att("r3", Action.reboot, 1)],
    # remove and none are not disruptive repairs for the count
    [att("r1", Action.remove, 5), att("r2", Action.none, 4), att("r3", Action.reboot, 1)],
])
def test_not_a_repeat_offender(attempts: list[AttemptRecord]) -> None:
    assert repeat_offender(attempts, "m-1", NOW, CFG) is None


def test_no_machine_is_never_a_repeat_offender() -> None:
    attempts = [att(f"r{i}", Action.reboot, i) for i in range(5)]
    assert repeat_offender(attempts, None, NOW, CFG) is None


def test_choose_action_recommends_remove_for_a_person_and_names_the_rule() -> None:
    attempts = [att("r1", Action.power_cycle, 20), att("r2", Action.reboot, 10),
                att("r3", Action.reboot, 2, kind="ecc", code=None)]
    dec = choose_action(Action.power_cycle, [], attempts, [], "m-1", NOW, LadderConfig(),
                        MigrateGateConfig(), repeat=CFG)
    assert dec.action == Action.remove and dec.needs_human
    assert "repeat offender: machine m-1 had 3 disruptive repairs" in dec.rule
    # the ladder's own step stays in the rule (it is unchanged)
    assert "ladder" in dec.rule
    # without the rule (callers that do not pass it) nothing changes
    plain = choose_action(Action.power_cycle, [], attempts, [], "m-1", NOW, LadderConfig(),
                          MigrateGateConfig())
    assert plain.action == Action.power_cycle
    # none stays none (nothing disruptive is asked for)
    assert choose_action(Action.none, [], attempts, [], "m-1", NOW, LadderConfig(),
                         MigrateGateConfig(), repeat=CFG).action == Action.none
