"""The crash test's end-of-run invariants, as a pure function over what was observed.

Inputs are plain records gathered after the run (no I/O here), so the checker can be fed
a hand-made violation and shown to flag it (``tests/crash/test_invariants.py``):

- :class:`LedgerRepair`: one ``repairs`` row of the ledger with the stages of its
  ``repair_transitions`` and the ``(action, outcome)`` of its ``repair_attempts``;
- :class:`WorkflowEnd`: one ``RepairWorkflow`` execution as Temporal reports it (close
  status name, e.g. ``COMPLETED``, ``RUNNING``, ``TERMINATED``; the stage of its result
  when it completed);
- :class:`MachineCycle`: one reset that took a machine down, as the BMC accepted it (a
  power cycle's ``ForceOff``, a reboot's restart), with its wall time;
- the nodes still cordoned (or carrying our taint) on the scheduler side.

Invariants (docs/design.md §5 rule zero and rails, as the crash test states them):

1. every repair ends exactly once: the ledger row is in a terminal stage, it has exactly
   one terminal transition and that transition's stage is the row's stage;
2. the ledger matches Temporal: every ledger repair has its workflow, every repair
   workflow has its ledger row, the workflow is closed ``COMPLETED`` (``FAILED`` for a
   repair that ended ``failed`` / ``timed_out``: its failure carries the status) and its
   result's stage equals the ledger's;
3. no host cycled twice for one repair: at most one executed machine action per repair in
   the ledger, at most one take-down of the node's machine inside the repair's window
   (created → terminal transition), none outside every repair's window, and a
   ``succeeded`` action had its take-down;
4. no node left cordoned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

#: Terminal stages (``workflows.models.TERMINAL_STAGES``, by value).
FAILED_STAGES = frozenset({"failed", "timed_out"})
"""Stages with which a RepairWorkflow fails (``RepairFailed`` / ``RepairTimedOut``)."""
TERMINAL = frozenset({"succeeded", "failed", "rejected", "cancelled", "auto_resolved",
                      "timed_out", "shadowed"})
#: Attempt actions that power the host off and on (or restart it) through the BMC; each
#: executed one takes the machine down exactly once (``activities.power``).
POWER_ACTIONS = frozenset({"power_cycle", "reboot", "reprovision"})
#: Slack around a repair's window when attributing a take-down to it, seconds: the
#: ledger's times are the workflow's clock and the reset's the proxy's, both on this
#: machine.
EDGE_SLACK_S = 2.0


@dataclass(frozen=True)
class LedgerRepair:
    """One ledger repair: ``stages`` of its transitions in order, ``attempts`` as
    ``(action, outcome)``, ``ended_at`` the time of its first terminal transition."""

    repair_id: str
    node: str
    stage: str
    workflow_id: str | None
    created_at: datetime
    ended_at: datetime | None
    stages: tuple[str, ...]
    attempts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WorkflowEnd:
    """One ``RepairWorkflow`` as Temporal reports it: ``status`` is the
    ``WorkflowExecutionStatus`` name without prefix; ``result_stage`` the stage of the
    returned ``RepairStatus`` when ``COMPLETED`` (or the one the failure of a ``FAILED``
    failed / timed-out repair carries), else ``None``."""

    workflow_id: str
    status: str
    result_stage: str | None = None


@dataclass(frozen=True)
class MachineCycle:
    """A take-down reset of ``node``'s machine at wall time ``at`` (seconds since epoch)."""

    node: str
    at: float


@dataclass
class Verdict:
    """``violations``: one line each, empty when every invariant holds; ``figures``:
    ``repairs``, ``stages`` (count per terminal stage), ``machine_cycles``,
    ``duplicates`` (take-downs beyond one per repair, plus take-downs outside every repair,
    plus executed actions beyond one per repair), ``cordoned_left``."""

    violations: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)


def check(
    repairs: list[LedgerRepair],
    workflows: list[WorkflowEnd],
    cycles: list[MachineCycle],
    cordoned: list[str],
) -> Verdict:
    """Check the four invariants of the module docstring; never raises on any records."""
    v = Verdict()
    bad = v.violations
    by_wf = {w.workflow_id: w for w in workflows}
    ledger_wfs = {r.workflow_id for r in repairs if r.workflow_id}
    duplicates = 0

    for r in repairs:
        terminal = [s for s in r.stages if s in TERMINAL]
        if r.stage not in TERMINAL:
            bad.append(f"{r.repair_id} ({r.node}): ledger stage {r.stage!r} is not terminal")
        if len(terminal) != 1:
            bad.append(f"{r.repair_id} ({r.node}): {len(terminal)} terminal transitions "
                       f"{terminal} (want exactly 1)")
        elif terminal[0] != r.stage:
            bad.append(f"{r.repair_id} ({r.node}): terminal transition {terminal[0]!r} but "
                       f"row stage {r.stage!r}")
        wf = by_wf.get(r.workflow_id or "")
        if wf is None:
            bad.append(f"{r.repair_id} ({r.node}): no RepairWorkflow {r.workflow_id!r} in "
                       "Temporal")
        elif wf.status != "COMPLETED" and not (
                wf.status == "FAILED" and wf.result_stage in FAILED_STAGES):
            bad.append(f"{r.repair_id} ({r.node}): workflow {wf.workflow_id} is {wf.status}, "
                       "not COMPLETED (nor FAILED with a failed / timed_out repair)")
        elif wf.result_stage != r.stage:
            bad.append(f"{r.repair_id} ({r.node}): workflow result {wf.result_stage!r} != "
                       f"ledger {r.stage!r}")
        executed = [(a, o) for a, o in r.attempts if a in POWER_ACTIONS]
        if len(executed) > 1:
            duplicates += len(executed) - 1
            bad.append(f"{r.repair_id} ({r.node}): {len(executed)} machine actions in the "
                       f"ledger {executed} (want at most 1)")

    for w in workflows:
        if w.workflow_id not in ledger_wfs:
            bad.append(f"workflow {w.workflow_id} ({w.status}) has no ledger repair")

    # machine side: attribute each take-down to the repair of its node whose window holds
    # it; a repair owns at most one, one outside every window is a stray action
    owned: Counter[str] = Counter()
    for c in cycles:
        hits = ([r for r in repairs if r.node == c.node and _inside(c.at, r, 0.0)]
                or [r for r in repairs if r.node == c.node and _inside(c.at, r, EDGE_SLACK_S)])
        if not hits:
            duplicates += 1
            bad.append(f"{c.node}: machine taken down at {c.at:.1f} outside every repair")
            continue
        owned[hits[0].repair_id] += 1
    for r in repairs:
        n = owned[r.repair_id]
        if n > 1:
            duplicates += n - 1
            bad.append(f"{r.repair_id} ({r.node}): machine taken down {n} times (want at "
                       "most 1)")
        acted = [a for a, o in r.attempts if a in POWER_ACTIONS and o == "succeeded"]
        if acted and n == 0:
            bad.append(f"{r.repair_id} ({r.node}): ledger says {acted[0]} succeeded but the "
                       "machine was never taken down")

    for node in cordoned:
        bad.append(f"{node}: left cordoned")

    v.figures = {
        "repairs": len(repairs),
        "stages": dict(sorted(Counter(r.stage for r in repairs).items())),
        "machine_cycles": len(cycles),
        "duplicates": duplicates,
        "cordoned_left": len(cordoned),
    }
    return v


def _inside(at: float, r: LedgerRepair, slack_s: float) -> bool:
    start = r.created_at.timestamp() - slack_s
    end = (r.ended_at.timestamp() + slack_s) if r.ended_at else float("inf")
    return start <= at <= end
