"""The model checker over the repair lifecycle (issue 26 item 4): the CI bound, every
(status, event) pair decided, and each planted defect found."""

from __future__ import annotations

import pytest

from tests.model.repair_world import check
from workflows.lifecycle.repair import DEFECTS, EVENT_KINDS, TRANSITIONS, Status

#: The CI bound: every repair event sequence of up to 16 events (about 6 s here), deep
#: enough for a first rung to fail and the person to be asked for the next.
CI_DEPTH = 16


def test_repair_machine_holds_every_invariant_to_the_ci_bound() -> None:
    res = check(CI_DEPTH)
    assert not res.violations, res.violations[:3]
    assert res.states > 3_000  # the whole bounded space, not a sample


def test_every_repair_status_event_pair_is_in_the_table() -> None:
    assert set(TRANSITIONS) == {(s, k) for s in Status for k in EVENT_KINDS}
    assert all(TRANSITIONS.values())


@pytest.mark.parametrize(
    ("defect", "invariant", "depth"),
    [
        ("cancel_lost_across_can", "I19", 12),
        ("approval_carried_over", "approval", 12),
        ("act_on_held_machine", "I18", 9),
        ("adopt_stale_cordon", "I18", 11),
        # a cancel while the node rejoins, a recurrence, the next rung approved
        ("cancel_ignored_between_rungs", "I19", 17),
    ],
)
def test_checker_finds_each_planted_repair_defect(defect: str, invariant: str,
                                                  depth: int) -> None:
    assert defect in DEFECTS
    res = check(depth, defects=frozenset({defect}), stop_at_first=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, (what, trace)
    assert len(trace) <= depth  # BFS: the shortest trace
