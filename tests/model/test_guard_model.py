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
        ("grant_before_policy", "I21: granted before the policy was read"),
        ("can_skips_rebuild", "I21"),
        ("breaker_ignores_queue", "granted while open"),
        ("batch_decides_in_parallel", "budget"),
        ("drain_grants_at_end", "was never told"),
        ("rebuild_refuses_renewals", "told its lease lapsed by a guard that has not rebuilt"),
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


#: Found by ``make model-check`` at guard depth 6 (I23): the batch queues a2 and b1 and
#: trips the breaker; the guard restarts (its queue lost), is rebuilt, the breaker is
#: reset, and a2's re-sent request is granted without ``reset_at``: the reset marked only
#: the queue it held, which no longer had a2.
RESTART_THEN_RESET = ["batch: requests", "guard restart", "policy ok", "ledger answers",
                      "reset", "batch: releases, requests, reset"]


def test_a_request_lost_by_a_guard_restart_and_resent_after_a_reset_is_told_the_reset(
) -> None:
    """The request names when its repair first asked (``requested_at``) and the guard
    keeps the last reset of the open breaker (``open_reset_at``, rebuilt from the
    ledger's reset alert): a request first asked for at or before it waited through it."""
    assert replay(RESTART_THEN_RESET) == []
    bad = replay(RESTART_THEN_RESET, defects=frozenset({"reset_marks_queue_only"}))
    assert any("a2 waited through a reset" in b for b in bad), bad


def test_a_reset_before_a_guard_restart_marks_the_requests_re_sent_after_it() -> None:
    """The reset is known to the rebuilt guard from the ledger only (its breaker clear),
    yet b1, queued before the reset (by the breaker, then the budget), is granted with
    ``reset_at`` once a2 releases."""
    trace = ["batch: requests", "release a1", "reset", "guard restart", "policy ok",
             "ledger answers", "release a2", "request b1"]
    assert replay(trace) == []
    bad = replay(trace, defects=frozenset({"reset_marks_queue_only"}))
    assert any("b1 waited through a reset" in b for b in bad), bad


def test_a_rebuilt_guard_does_not_count_again_what_was_counted_before_the_reset() -> None:
    """Found by ``make model-check`` at guard depth 6 once restarts kept the I23
    bookkeeping: a2, counted in the storm that tripped the breaker, re-sends after a
    restart that followed the reset; the fresh guard counted it in the new window."""
    trace = ["batch: requests", "reset", "guard restart", "request a2", "policy ok",
             "ledger answers"]
    assert replay(trace) == []
    bad = replay(trace, defects=frozenset({"rebuild_recounts_before_reset"}))
    assert any("counted before the reset is counted again" in b for b in bad), bad


def test_a_reset_of_a_closed_breaker_leaves_the_window_alone() -> None:
    """A closed breaker is left alone (the CLI sends nothing then; the ledger records the
    resets of an open breaker only, so a fresh window here would be lost at a restart)."""
    trace = ["request a1", "reset", "guard restart", "policy ok", "ledger answers"]
    assert replay(trace) == []


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
        ("domain_release_keeps_evidence", "acts on evidence from before it"),
    ],
)
def test_domain_checker_finds_each_planted_hold_defect(defect: str, invariant: str) -> None:
    assert defect in DEFECTS
    res = check(DOMAIN_DEPTH, defects=frozenset({defect}), stop_at_first=True, domains=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, what
    assert len(trace) <= DOMAIN_DEPTH


#: A release before a guard restart (the rebuilt guard knows it from the ledger's clear
#: only): the storm queues a2 (held by the domain) and b1 (a person's, budget); the
#: release marks a2, which still waits for the budget; the guard restarts (its queue
#: lost) and a2's re-sent request, granted once a1 releases, must carry ``reset_at``.
RELEASE_THEN_RESTART = ["batch: requests", "release domain r", "guard restart", "policy ok",
                        "ledger answers", "batch: releases, requests, reset"]
#: Found by ``check(6, domains=True)`` with ``release_marks_queue_only``: the faults hold
#: the domain, continue-as-new reads the policy, the release and a1's request are
#: deferred meanwhile (in that order) and a1, asked when the release came in, is granted
#: with nothing of the release.
RELEASE_WHILE_READING = ["fault a1", "fault a2", "continue-as-new", "release domain r",
                         "request a1", "policy ok"]


@pytest.mark.parametrize("trace", [RELEASE_THEN_RESTART, RELEASE_WHILE_READING])
def test_a_request_first_asked_before_a_release_acts_on_evidence_after_it(
        trace: list[str]) -> None:
    """The guard keeps each domain's last release (``released_at``, rebuilt from the
    ledger's clear of the hold): an automatic request of the domain first asked for at or
    before it waited through it, even when no queue of the guard held it."""
    assert "release_marks_queue_only" in DEFECTS
    assert replay(trace, domains=True) == []
    bad = replay(trace, domains=True, defects=frozenset({"release_marks_queue_only"}))
    assert any("waited through a hold's release" in b for b in bad), bad


def test_a_persons_repair_is_neither_counted_nor_held_by_the_breaker_after_a_rebuild(
) -> None:
    """Found at domain depth 6 (a fault of the world, not of the machine): the world's
    ledger listed b1, a person's repair, among the automatic starts, so the rebuilt guard
    counted three and tripped, and the breaker check flagged the person's grant. The real
    query lists ``approved_by = auto`` rows only, and an open breaker holds back
    automatic new requests only."""
    trace = ["request b1", "guard restart", "policy ok", "renew b1", "batch: requests",
             "ledger answers"]
    assert replay(trace, domains=True) == []


def test_a_rebuilt_guard_counts_a_holder_that_has_not_cordoned_to_the_ci_bound() -> None:
    """From a guard started afresh while a1's automatic repair holds a lease an earlier
    guard granted, its cordon not yet recorded (the ledger lists it as a holder, not as an
    automatic start): no more than the threshold start in the window."""
    res = check(CI_DEPTH, holder=True)
    assert not res.violations, res.violations[:3]
    assert res.states > 1000, res.line()


def test_guard_checker_finds_a_rebuild_that_counts_cordons_only() -> None:
    """The break-test's defect (the rebuilt guard counted only the ledger's cordons): a1
    cordons and ends, a2 and b1 ask in one batch, a2 cordons and ends, and b1 — the third
    automatic repair of the window — is granted."""
    assert "rebuild_counts_cordons_only" in DEFECTS
    res = check(CI_DEPTH, defects=frozenset({"rebuild_counts_cordons_only"}),
                stop_at_first=True, holder=True)
    assert res.violations, "rebuild_counts_cordons_only not found"
    what, trace = res.violations[0]
    assert "automatic repairs started in one window" in what, what
    assert len(trace) <= CI_DEPTH


def test_no_automatic_lease_in_a_domain_held_across_a_restart_to_the_ci_bound() -> None:
    """From a held domain (the ledger has its hold): a restarted guard starts from the
    defaults (no failure domains) and its policy read can fail; none of the domain's
    automatic repairs is granted before the policy read tells the hold its nodes."""
    res = check(DOMAIN_DEPTH, domains=True, held=True)
    assert not res.violations, res.violations[:3]
    assert res.states > 1000, res.line()


def test_domain_checker_finds_a_grant_before_the_policy_was_read() -> None:
    """The planted defect ``grant_before_policy`` (a fresh guard whose first policy read
    fails serves on the defaults): the hold rebuilt from the ledger knows no nodes, and
    a1's automatic request is granted inside the held domain."""
    assert "grant_before_policy" in DEFECTS
    res = check(DOMAIN_DEPTH, defects=frozenset({"grant_before_policy"}),
                stop_at_first=True, domains=True, held=True)
    assert res.violations, "grant_before_policy not found"
    what, trace = res.violations[0]
    assert "granted while its domain is held" in what, what
    assert "policy failed" in trace and len(trace) <= DOMAIN_DEPTH, trace
