"""Exhaustive bounded model checker of the pure lifecycle machines (issue 26 item 4).

Breadth-first search over every event sequence up to ``depth`` from a fresh machine,
for each phased machine action (:data:`workflows.lifecycle.machine_action.PHASES`),
against a small world that plays the BMC: an activity call out resumes from the
phase the command named, reaches any later phase and then returns ok or fails in
every way (transient, permanent, timed out, a BMC status read failing, the worker
dying) — the disruptive command and ``On`` counted as the world sees them. A cancel
can arrive at any point, the back-off timer fires, the clock advances past the retry
bound. States are hashed (canonical JSON of the machine's pydantic state plus the
world), so every reachable state is expanded once and the bounded run is exhaustive,
not sampled. After every step the invariants I16, I19 and I22 are checked; a
violation is reported with the shortest event trace reaching it (BFS order).

Run: ``make model-check DEPTH=N`` (``python -m tests.model --depth N``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from workflows.lifecycle.machine_action import (
    DISRUPTIVE,
    PHASES,
    ActivityFailed,
    ActivityOk,
    BmcReadFailed,
    Cancel,
    Clock,
    Event,
    Finish,
    MachineActionState,
    RecordAttempt,
    RunActivity,
    Start,
    StartTimer,
    TimerFired,
    WorkerRestart,
    new_state,
    phase_index,
    step,
)
from workflows.models import Action

#: The model's world: retry bound and clock step, seconds (the clock step is more than
#: half the bound, so two clock events spend it; the back-off 10 s … 120 s is shorter).
RETRY_MAX_S = 300.0
CLOCK_STEP_S = 200.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class World:
    """What the BMC and the ledger saw; the machine's state is kept beside it."""

    now_s: float = 0.0
    out: tuple[str, str] | None = None  # (resume_phase, purpose) of the call out
    timer: bool = False
    disruptive_sent: int = 0
    host_on: bool = True
    recorded: int = 0
    finished: str | None = None
    finish_detail: str = ""
    finish_touched: bool = False
    #: a try ended without reporting its phase itself (worker died, time-out): a later
    #: "host already rebooted" cannot be told from our own reboot, and is counted
    uncertain: bool = False
    cancelled_sent: bool = False
    act_after_cancel: bool = False
    double_call: bool = False
    double_finish: bool = False


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    violations: list[tuple[str, list[str]]] = field(default_factory=list)

    def line(self) -> str:
        return (f"states={self.states} transitions={self.transitions} depth={self.depth} "
                f"violations={len(self.violations)} seconds={self.seconds:.2f}")


def _events(action: Action, m: MachineActionState, w: World) -> list[Event]:
    evs: list[Event] = [Start(), Cancel(by="oncall"), Clock()]
    if w.timer:
        evs.append(TimerFired())
    if w.out is not None:
        phases = PHASES[action]
        r = phase_index(action, w.out[0])
        evs.append(ActivityOk(phase=phases[-1], detail="done"))
        # the host found already rebooted since the attempt began: nothing sent
        evs.append(ActivityOk(phase=phases[-1], detail="host already came back",
                              skipped=True))
        if r == 0:
            evs.append(ActivityOk(phase=phases[0], not_run="cannot run here"))
        for p in phases[r:-1]:
            evs += [
                ActivityFailed(outcome="transient", phase=p, message="BMC 503"),
                ActivityFailed(outcome="timed_out", phase=p, message="heartbeat timeout"),
                ActivityFailed(outcome="permanent", phase=p, message="auth refused"),
                BmcReadFailed(phase=p, message="BmcUnavailable"),
                WorkerRestart(phase=p),
            ]
    return evs


def _deliver(action: Action, w: World, ev: Event) -> World:
    """What happens in the world when ``ev`` is delivered (before the machine steps)."""
    if isinstance(ev, Clock):
        return replace(w, now_s=w.now_s + CLOCK_STEP_S)
    if isinstance(ev, Cancel):
        return replace(w, cancelled_sent=True)
    if isinstance(ev, TimerFired):
        return replace(w, timer=False)
    if isinstance(ev, Start):
        return w
    if w.out is None:
        return w
    if isinstance(ev, ActivityOk) and ev.skipped:
        # the call sent nothing; a new boot identity means the host is up
        return replace(w, out=None, host_on=True)
    if isinstance(ev, WorkerRestart) or (isinstance(ev, ActivityFailed)
                                         and ev.outcome == "timed_out"):
        w = replace(w, uncertain=True)
    phases = PHASES[action]
    r = phase_index(action, w.out[0])
    reached = phase_index(action, ev.phase)
    sent, on = w.disruptive_sent, w.host_on
    for p in phases[r + 1: reached + 1]:  # the steps this call performed
        if p == DISRUPTIVE[action]:
            sent += 1
            on = on and action != Action.power_cycle
        if p == "on_sent":
            on = True
    return replace(w, out=None, disruptive_sent=sent, host_on=on)


def _apply(w: World, cmds: list[object]) -> World:
    for c in cmds:
        if isinstance(c, RunActivity):
            w = replace(w, double_call=w.double_call or w.out is not None,
                        act_after_cancel=w.act_after_cancel
                        or (w.cancelled_sent and c.purpose == "act"),
                        out=(c.resume_phase, c.purpose))
        elif isinstance(c, StartTimer):
            w = replace(w, timer=True)
        elif isinstance(c, RecordAttempt):
            w = replace(w, recorded=w.recorded + 1)
        elif isinstance(c, Finish):
            w = replace(w, double_finish=w.double_finish or w.finished is not None,
                        finished=c.outcome, finish_detail=c.detail,
                        finish_touched=c.touched)
    return w


def check_invariants(w: World) -> list[str]:
    """The invariants over the world after a step; returns the names of those broken."""
    bad: list[str] = []
    if w.disruptive_sent > 1:
        bad.append("I16: the disruptive command was sent twice in one attempt")
    if w.act_after_cancel:
        bad.append("I19: an action step was run after the cancel")
    if w.finished == "cancelled" and not w.host_on and "human must power it on" not in (
            w.finish_detail):
        bad.append("I19: ended cancelled with the host left off")
    touched = w.disruptive_sent > 0
    # a try that could not report its phase, then a reboot found: counted (never under)
    over = w.uncertain and w.recorded == 1 and not touched
    if w.finished in ("failed", "cancelled") and w.recorded != int(touched) and not over:
        bad.append(f"I22: {w.recorded} attempt(s) recorded, machine touched={touched}")
    if w.finished in ("succeeded", "not_run") and w.recorded:
        bad.append("I22: an attempt recorded by the machine for a success / not-run")
    if w.finished == "succeeded" and touched and not w.finish_touched:
        # the repair records a success's attempt from Finish.touched
        bad.append("I22: a success that touched the machine reported untouched")
    if w.finished == "not_run" and touched:
        bad.append("I22: not_run although the machine was touched")
    if w.double_call:
        bad.append("one call at a time: a second activity while one was out")
    if w.double_finish:
        bad.append("the action finished twice")
    return bad


def _key(m: MachineActionState, w: World) -> str:
    return json.dumps([m.model_dump(mode="json"), w.__dict__], sort_keys=True, default=str)


def _label(ev: Event) -> str:
    d = ev.model_dump(exclude_defaults=True)
    d.pop("kind", None)
    return ev.kind + (json.dumps(d, sort_keys=True) if d else "")


def check(depth: int, actions: list[Action] | None = None,
          defects: frozenset[str] = frozenset(), stop_at_first: bool = False) -> Result:
    """Explore every event sequence of length ≤ ``depth`` for each action (default: all
    of :data:`PHASES`); ``defects`` re-introduces the named ones (test-only)."""
    res = Result(depth=depth)
    t0 = time.monotonic()
    for action in actions or list(PHASES):
        m0 = new_state(action, f"r1/{action.value}/1", RETRY_MAX_S)
        w0 = World()
        seen = {_key(m0, w0)}
        queue: deque[tuple[MachineActionState, World, list[str]]] = deque([(m0, w0, [])])
        while queue:
            m, w, trace = queue.popleft()
            if len(trace) >= depth:
                continue
            for ev in _events(action, m, w):
                w1 = _deliver(action, w, ev)
                now = T0 + timedelta(seconds=w1.now_s)
                m1, cmds = step(m, ev, now, defects)
                w1 = _apply(w1, list(cmds))
                res.transitions += 1
                t1 = [*trace, _label(ev)]
                bad = check_invariants(w1)
                if bad:
                    res.violations.append((f"{action.value}: {'; '.join(bad)}", t1))
                    if stop_at_first:
                        res.states += len(seen)
                        res.seconds = time.monotonic() - t0
                        return res
                    continue
                k = _key(m1, w1)
                if k not in seen:
                    seen.add(k)
                    queue.append((m1, w1, t1))
        res.states += len(seen)
    res.seconds = time.monotonic() - t0
    return res
