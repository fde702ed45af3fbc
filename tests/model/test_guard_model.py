"""The model checker over the cluster guard (issue 26 item 4): the CI bound, every
(status, event) pair decided, and the planted defects found with short traces."""

from __future__ import annotations

import pytest

from tests.model.guard_world import check, replay
from workflows.lifecycle.guard import DEFECTS, EVENT_KINDS, TRANSITIONS, Status

#: The CI bound: every event sequence of up to 5 events from a serving guard (~15 s
#: here); ``make model-check`` goes as deep as asked.
CI_DEPTH = 5


def test_guard_holds_every_invariant_to_the_ci_bound() -> None:
    res = check(CI_DEPTH)
    assert not res.violations, res.violations[:3]
    assert res.states > 5000, res.line()  # the whole bounded space, not a sample


def test_every_guard_status_event_pair_is_in_the_table() -> None:
    assert set(TRANSITIONS) == {(s, k) for s in Status for k in EVENT_KINDS}


@pytest.mark.parametrize(
    ("defect", "invariant"),
    [
        ("reset_marks_breaker_queued_only", "waited through a reset"),
        ("reset_recounts", "counted again"),
        ("rebuild_gives_up", "I21"),
        ("breaker_ignores_queue", "granted while open"),
        ("batch_decides_in_parallel", "budget"),
    ],
)
def test_guard_checker_finds_each_planted_defect(defect: str, invariant: str) -> None:
    assert defect in DEFECTS
    res = check(CI_DEPTH, defects=frozenset({defect}), stop_at_first=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, what
    assert len(trace) <= CI_DEPTH


#: The lossy world's CI bound (issue 30 item 1: replies the server does not take).
LOSSY_DEPTH = 4


def test_lost_lease_replies_break_no_invariant_to_the_ci_bound() -> None:
    """A grant the requester never heard of keeps its slot (the guard counts it) and a
    re-sent request is answered again; nothing else changes."""
    res = check(LOSSY_DEPTH, lossy=True)
    assert not res.violations, res.violations[:3]
    assert res.states > 3000, res.line()


def test_a_holder_whose_grant_after_a_reset_was_lost_is_told_the_reset_again() -> None:
    """Found by the lossy world at depth 5 (I23): a2 waits through a reset, is granted
    with ``reset_at``, that reply is lost, and its re-sent request was answered "already
    held" without ``reset_at``, so it acted on pre-reset evidence. The lease keeps the
    reset (``Lease.evidence_after``) and every later answer carries it."""
    trace = ["batch: requests", "replies lost", "batch: releases, requests, reset",
             "replies back", "request a2"]
    assert replay(trace, lossy=True) == []


#: The failure-domain world's CI bound (issue 29 item 2; ~6 s here).
DOMAIN_DEPTH = 4


def test_no_automatic_lease_in_a_held_domain_to_the_ci_bound() -> None:
    res = check(DOMAIN_DEPTH, domains=True)
    assert not res.violations, res.violations[:3]
    assert res.states > 3000, res.line()


@pytest.mark.parametrize(
    ("defect", "invariant"),
    [
        ("domain_hold_ignores_queue", "granted while its domain is held"),
        ("domain_counts_requests_only", "nodes of its domain reported faults"),
    ],
)
def test_domain_checker_finds_each_planted_hold_defect(defect: str, invariant: str) -> None:
    assert defect in DEFECTS
    res = check(DOMAIN_DEPTH, defects=frozenset({defect}), stop_at_first=True, domains=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, what
    assert len(trace) <= DOMAIN_DEPTH
