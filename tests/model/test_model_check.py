"""The model checker over the machine action lifecycle (issue 26 item 4): the CI bound,
every (status, event) pair decided, and the planted defects found."""

from __future__ import annotations

import pytest

from tests.model.__main__ import main
from tests.model.checker import check
from workflows.lifecycle.machine_action import (
    DEFECTS,
    EVENT_KINDS,
    TRANSITIONS,
    Status,
)

#: The CI bound: every event sequence of up to 10 events per action (about 5 s here).
CI_DEPTH = 10


def test_machine_action_holds_every_invariant_to_the_ci_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--depth", str(CI_DEPTH), "--node-depth", "3", "--repair-depth", "8",
                 "--fleet-depth", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("states=") and " violations=0 " in last, last
    states = int(last.split()[0].removeprefix("states="))
    assert states > 1000  # the whole bounded space, not a sample


def test_every_status_event_pair_is_in_the_table() -> None:
    assert set(TRANSITIONS) == {(s, k) for s in Status for k in EVENT_KINDS}


@pytest.mark.parametrize(
    ("defect", "invariant"),
    [
        ("retry_from_scratch", "I16"),
        ("cancel_leaves_off", "I19"),
        ("record_untouched", "I22"),
    ],
)
def test_checker_finds_each_planted_defect(defect: str, invariant: str) -> None:
    assert defect in DEFECTS
    res = check(CI_DEPTH, defects=frozenset({defect}), stop_at_first=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, what
    assert len(trace) <= 4  # BFS: the shortest trace, a handful of events
