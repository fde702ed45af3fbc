"""The model checker over the node lifecycle (issue 26 item 4): the CI bound, every
(reconcile status, event) pair decided, and the planted defects found."""

from __future__ import annotations

import pytest

from tests.model.node_world import check
from workflows.lifecycle.node import DEFECTS, EVENT_KINDS, TRANSITIONS, Reconcile

#: The CI bound: every node event sequence of up to 5 events (about 40 s here).
CI_DEPTH = 5


def test_node_machine_holds_every_invariant_to_the_ci_bound() -> None:
    res = check(CI_DEPTH)
    assert not res.violations, res.violations[:3]
    assert res.states > 10_000  # the whole bounded space, not a sample


def test_every_reconcile_event_pair_is_in_the_table() -> None:
    assert set(TRANSITIONS) == {(r, k) for r in Reconcile for k in EVENT_KINDS}


@pytest.mark.parametrize(
    ("defect", "invariant", "depth"),
    [
        ("level_fault_survives_success", "I20", 6),
        ("decide_without_ledger", "I21", 4),
        ("sender_clock_judges", "I17", 3),
        ("inherit_machine_history", "rule zero", 5),
        ("attach_blind", "not running", 5),
        ("unreported_domain_fault", "never reported to the guard", 3),
        ("start_without_check", "one repair per node", 4),
    ],
)
def test_checker_finds_each_planted_node_defect(defect: str, invariant: str,
                                                depth: int) -> None:
    assert defect in DEFECTS
    res = check(depth, defects=frozenset({defect}), stop_at_first=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, what
    assert len(trace) <= depth


def test_maintenance_grace_holds_in_the_model() -> None:
    """Issue 29 item 1: from a node inside a maintenance window (its end, its grace and
    reboots in play), nothing is recommended inside the window or its grace from a
    fault that did not persist or recur past it."""
    from tests.model.node_world import W_MAINT
    res = check(CI_DEPTH, worlds=(W_MAINT,))
    assert not res.violations, res.violations[:3]
    assert res.states > 1_000


def test_checker_finds_the_planted_grace_defect() -> None:
    from tests.model.node_world import W_MAINT
    assert "grace_ignored" in DEFECTS
    res = check(4, defects=frozenset({"grace_ignored"}), worlds=(W_MAINT,))
    assert res.violations, "grace_ignored not found"
    # the shortest finds a level fault of the window repaired inside it; past its end, a
    # fault of the grace repaired before the grace is over
    assert any("window" in what for what, _ in res.violations)
    assert any("grace" in what and "window_ends" in trace for what, trace in res.violations)


def test_checker_finds_the_planted_window_defect() -> None:
    """A level fault raised inside the window judged at once (not held to the grace after
    the window's end): a repair recommended inside the window."""
    from tests.model.node_world import W_MAINT
    assert "window_level_fault_unheld" in DEFECTS
    res = check(4, defects=frozenset({"window_level_fault_unheld"}), stop_at_first=True,
                worlds=(W_MAINT,))
    assert res.violations, "window_level_fault_unheld not found"
    what, _ = res.violations[0]
    assert "inside the maintenance window" in what, what
