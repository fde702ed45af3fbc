"""Exhaustive bounded model checker of the repair lifecycle
(:mod:`workflows.lifecycle.repair`, issue 26 item 4).

Breadth-first search over every event sequence up to ``depth`` from a fresh repair of one
node (a ``reboot`` requested on one event fault, consent ``approve`` so every rung needs a
person, the default ladder and node cap) in a small world that plays the ledger, the
guard, the scheduler and the BMC:

- every answer to the call out (the cordon finding the node free or held by an ended
  repair, that holder still running or not, the node idle or busy, healthy or not, a
  call failing for good, the ledger unavailable);
- the machine action's every outcome after each phase (ok, transient, permanent, timed
  out, the worker dying), the back-off and poll timers firing;
- approve (while a person is asked), reject and cancel at any point, the level evidence
  clearing, a recurrence after the action, the lease granted or queued, the clock passing
  every deadline, continue-as-new (the next run starts from the carried state only) and a
  worker restart, the machine becoming held for RMA before the cordon; three starting
  worlds: the node free, cordoned by a repair that has ended, or the node free with the
  repair's pool in shadow mode (``load_policy`` answers ``mode: shadow``).

States are hashed (canonical JSON of the machine's state plus the world). After every
step the invariants are checked: I1 (never left cordoned by us unless held with a
reason), I16 (one disruptive command per attempt), I18 (a held machine is never cordoned,
drained or acted on; an ended repair's cordon is never adopted without a person), I19
(after a cancel or reject nothing more is cordoned, drained or acted on), I22 (attempts
recorded exactly for the actions that touched), "an approval covers one action at one
rung", "a cordon only after a maintenance read that found no window covering the node,
and no lease held while a window is waited out" (issue 29; a window may open or end at
any point before the cordon), "a drain, and each attempt of a machine action, starts only under a held
lease" (a lease that lapsed — a refused renewal, its TTL past — is asked for again,
never reused; a retry inside an attempt resumes under the lease it started with), and
shadow mode (issue 29 item 3): no disruptive command (cordon, drain, machine
action) in shadow mode, and a shadow repair that ends after deciding records exactly one
``shadowed`` attempt. A violation comes with the shortest event trace (BFS order).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from tests.model.checker import Result
from workflows.config import PolicyConfig
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle import repair as rm
from workflows.models import Action, Alert, Requester, RequesterKind, Severity

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Clock step of a bare ``clock`` event, seconds: past the approval timeout (1 h default)
#: and the lease wait bound is reached in a few.
CLOCK_STEP_S = 4000.0


def _policy() -> PolicyConfig:
    p = PolicyConfig()
    p.consent.mode = "approve"
    p.consent.automatic_xids = []
    p.wait_for_idle.max_wait_s = 600.0
    p.rails.action_retry_max_s = 300.0
    return p


POLICY = _policy()


def _alert(n: int, at_s: float, active: bool = True) -> Alert:
    return Alert(alert_id=f"a{n}", cluster="c1", node="n1", kind="xid", code=79,
                 severity=Severity.critical, summary="xid 79", level=False, active=active,
                 actionable=True, action=Action.reboot,
                 observed_at=T0 + timedelta(seconds=at_s),
                 received_at=T0 + timedelta(seconds=at_s))


@dataclass(frozen=True)
class World:
    now_s: float = 0.0
    held: bool = False
    cordon: str = ""  # "" | "us" | "old" (an ended repair's)
    holder_running: bool = False
    stop_sent: bool = False
    approved: tuple[tuple[str, int], ...] = ()  # (action, rung) a person approved
    stale_asked: bool = False
    stale_approved: bool = False
    recorded: int = 0
    touched_keys: tuple[str, ...] = ()
    disruptive: tuple[tuple[str, int], ...] = ()
    ma_key: str = ""
    recurred: bool = False
    finished: bool = False
    shadow: bool = False  # the repair's pool is in shadow mode
    shadowed: int = 0  # ``shadowed`` attempts recorded
    lapsed: bool = False  # the lease lapsed once (a refused renewal, its TTL passed)
    window: bool = False  # a maintenance window covers the node now
    window_opened: bool = False  # one opened (once per world)
    last_read: str = ""  # what the last maintenance read answered: "" | "none" | "covered"
    bad: tuple[str, ...] = ()


def _new(stale: bool, shadow: bool = False) -> tuple[rm.RepairState, World]:
    s = rm.new_state("r1", "c1", "n1", Requester(kind=RequesterKind.system,
                                                    name="system"),
                     Action.reboot, [_alert(0, -10.0)])
    return s, World(cordon="old" if stale else "", shadow=shadow)


def _events(s: rm.RepairState, w: World) -> list[rm.Event]:
    st = s.status
    evs: list[rm.Event] = []
    if st in (rm.Status.awaiting_approval, rm.Status.awaiting_lease, rm.Status.acting):
        evs.append(rm.Clock())  # only deadlines and the action's retry bound read it
    if st == rm.Status.acting:
        evs.append(rm.WorkerRestart())  # elsewhere the state is replayed: nothing to decide
    if st == rm.Status.new:
        evs.append(rm.Start())
    if not w.stop_sent:
        # reject takes cancel's path (one pending Stop); the world sends cancel only
        evs.append(rm.Cancel(by="oncall", reason="hands off"))
    if st == rm.Status.awaiting_approval:
        evs.append(rm.Approve(by="alice"))
    if st == rm.Status.awaiting_lease:
        evs += [rm.LeaseReply(granted=True), rm.LeaseReply(granted=False, reason="budget")]
    if st in (rm.Status.idle_backoff, rm.Status.join_backoff, rm.Status.maintenance_wait):
        evs.append(rm.TimerFired())
    if not w.window_opened and not s.acted and w.cordon != "us" and st in (
            rm.Status.awaiting_lease, rm.Status.reading_history):
        evs.append(rm.MaintenanceRead(window_id="opens"))  # marker: a window opens
    if w.window:
        evs.append(rm.MaintenanceRead(window_id="ends"))  # marker: it ends (early)
    if s.lease == "granted" and not w.lapsed:
        evs.append(rm.LeaseLapsed())  # once per world: the renewal refused, the TTL past
    if st in (rm.Status.idle_backoff, rm.Status.checking_idle) and not s.can_due:
        evs.append(rm.ContinueAsNewDue())
    if st in (rm.Status.join_backoff, rm.Status.joining) and not w.recurred:
        evs.append(rm.AlertAttached(alert=_alert(1, w.now_s)))
    if not w.held and st in (rm.Status.new, rm.Status.reading_policy, rm.Status.reading_history,
                             rm.Status.awaiting_approval, rm.Status.awaiting_lease):
        # the machine is removed before the hold check in front of the cordon
        pass
    if not w.held and ((not s.acted and w.cordon != "us" and st in (
            rm.Status.new, rm.Status.reading_policy, rm.Status.reading_history,
            rm.Status.awaiting_approval, rm.Status.awaiting_lease))
            or st in (rm.Status.idle_backoff, rm.Status.join_backoff)):
        # marker: the machine is removed (by another repair) before the hold check in
        # front of the cordon, while this one waits for idle, or while the node rejoins
        # after a rung (the next rung reads the hold again)
        evs.append(rm.HoldRead(held=True, reason="appears"))
    if st in rm.CALL_OUT:
        evs.append(rm.CallFailed(message="403"))
        if st == rm.Status.reading_policy:
            evs.append(rm.PolicyRead(policy=POLICY, machine="m1",
                                     mode="shadow" if w.shadow else None))
        elif st == rm.Status.reading_hold:
            evs += [rm.HoldRead(held=False, reason="answer"), rm.LedgerUnavailable()]
        elif st == rm.Status.reading_history:
            evs.append(rm.HistoryRead(attempts=[]))
        elif st == rm.Status.reading_maintenance:
            evs.append(rm.MaintenanceRead())  # the world answers (see _deliver)
        elif st == rm.Status.checking_idle:
            evs += [rm.CallOk(idle=True), rm.CallOk(idle=False)]
        elif st == rm.Status.joining:
            evs += [rm.CallOk(healthy=True), rm.CallOk(healthy=False)]
        elif st == rm.Status.probing_holder:
            evs += [rm.CallOk(running=True), rm.CallOk(running=False)]
        elif st == rm.Status.draining:
            # drained, or the drain's deadline passed with a job still running
            evs += [rm.CallOk(), rm.CallOk(drained=False, remaining=["job-7"])]
        elif st != rm.Status.cordoning:
            evs.append(rm.CallOk())
        else:
            evs.append(rm.CallOk())  # the cordon's answer is the world's (see _deliver)
    m = s.machine_action
    if st == rm.Status.acting and m is not None:
        if m.status in ma.TERMINAL:
            pass
        elif m.status in (ma.Status.backing_off, ma.Status.safe_backing_off):
            evs.append(rm.Machine(event=ma.TimerFired()))
        elif m.status in (ma.Status.running, ma.Status.making_safe):
            phases = ma.PHASES[m.action]
            r = ma.phase_index(m.action, m.phase)
            evs.append(rm.Machine(event=ma.ActivityOk(phase=phases[-1])))
            for p in phases[r:-1]:
                evs += [rm.Machine(event=ma.ActivityFailed(outcome="transient", phase=p)),
                        rm.Machine(event=ma.ActivityFailed(outcome="permanent", phase=p))]
    return evs


def _deliver(s: rm.RepairState, w: World, ev: rm.Event) -> tuple[rm.Event | None, World]:
    """The world's side of ``ev``; returns the event the machine gets (None: none)."""
    if isinstance(ev, rm.Clock):
        return ev, replace(w, now_s=w.now_s + CLOCK_STEP_S)
    if isinstance(ev, (rm.Cancel, rm.Reject)):
        return ev, replace(w, stop_sent=True)
    if isinstance(ev, rm.HoldRead) and ev.reason == "appears":
        return None, replace(w, held=True)  # the machine is removed meanwhile
    if isinstance(ev, rm.HoldRead):
        return rm.HoldRead(held=w.held, reason="removed for RMA by r0"), w
    if isinstance(ev, rm.Approve):
        rung = w.recorded
        w = replace(w, approved=(*w.approved, (s.action.value, rung)))
        if w.stale_asked:
            w = replace(w, stale_approved=True)
        return ev, w
    if isinstance(ev, rm.AlertAttached):
        return ev, replace(w, recurred=True)
    if isinstance(ev, rm.LeaseLapsed):
        return ev, replace(w, lapsed=True)
    if isinstance(ev, rm.MaintenanceRead) and ev.window_id == "opens":
        return None, replace(w, window=True, window_opened=True)
    if isinstance(ev, rm.MaintenanceRead) and ev.window_id == "ends":
        return None, replace(w, window=False)
    if isinstance(ev, rm.MaintenanceRead):
        if not w.window:
            return rm.MaintenanceRead(), replace(w, last_read="none")
        return rm.MaintenanceRead(window_id="w1", reason="rack reboot",
                                  ends_at=T0 + timedelta(seconds=w.now_s + 1800)), \
            replace(w, last_read="covered")
    if isinstance(ev, rm.CallOk) and s.status == rm.Status.rejoining and w.cordon == "us":
        return ev, replace(w, cordon="")
    if isinstance(ev, rm.CallOk) and s.status == rm.Status.cordoning:
        if w.cordon == "":
            return rm.CallOk(cordoned_by_us=True), replace(w, cordon="us")
        return rm.CallOk(cordoned_by_us=False, held_by_repair="r0"), w
    if isinstance(ev, rm.Machine) and isinstance(ev.event, (ma.ActivityOk, ma.ActivityFailed)):
        m = s.machine_action
        assert m is not None
        disruptive = ma.DISRUPTIVE[m.action]
        before = ma.phase_index(m.action, m.phase)
        reached = ma.phase_index(m.action, ev.event.phase)
        d = ma.phase_index(m.action, disruptive)
        if before < d <= reached:  # this call sent the disruptive command
            counts = dict(w.disruptive)
            counts[m.key] = counts.get(m.key, 0) + 1
            w = replace(w, disruptive=tuple(sorted(counts.items())),
                        touched_keys=tuple(sorted({*w.touched_keys, m.key})))
    return ev, w


def _apply(s_before: rm.RepairState, s: rm.RepairState, w: World,
           cmds: list[rm.Command]) -> World:
    bad = list(w.bad)
    for c in cmds:
        disruptive = (isinstance(c, rm.RunActivity) and c.name in ("cordon_node", "drain_node")
                      ) or (isinstance(c, rm.MachineCommand)
                            and isinstance(c.command, ma.RunActivity)
                            and c.command.purpose == "act")
        if disruptive:
            name = c.name if isinstance(c, rm.RunActivity) else "the machine action"
            if w.held:
                bad.append(f"I18: {name} on a machine held for RMA")
            if w.stop_sent:
                bad.append(f"I19: {name} after a cancel or reject")
            if name != "cordon_node" and w.cordon == "old" and not w.stale_approved:
                bad.append(f"I18: {name} beside an ended repair's cordon, no person asked")
            if w.shadow:
                bad.append(f"shadow: {name} in shadow mode (no disruptive command)")
            if name == "cordon_node" and w.last_read != "none":
                bad.append("maintenance: cordon without a maintenance read that found no "
                           "window")
            # an attempt starts (its first try) only under a held lease; a retry of the
            # same attempt resumes under the lease it started with (ending it half-way
            # for a lease could leave a host off)
            first = not isinstance(c, rm.MachineCommand) or (
                s.machine_action is not None and s.machine_action.tries == 1
                and not s.machine_action.first_failure)
            if name != "cordon_node" and first and (s.lease != "granted" or s.lease_lapsed):
                bad.append(f"lease: {name} without a held lease (a lapsed one reused)")
        if isinstance(c, rm.MachineCommand) and isinstance(c.command, ma.RunActivity) \
                and c.command.purpose == "act" and s.machine_action is not None \
                and s.machine_action.tries == 1 and not s.machine_action.first_failure:
            if (s.machine_action.action.value, w.recorded) not in w.approved:
                bad.append(f"approval: {s.machine_action.action.value} at rung {w.recorded} "
                           "started without an approval of that action at that rung")
        if isinstance(c, rm.RecordAttempt) and c.outcome == "shadowed":
            if not w.shadow:
                bad.append("shadow: a shadowed attempt recorded in enforce mode")
            w = replace(w, shadowed=w.shadowed + 1)
        elif isinstance(c, rm.RecordAttempt):
            w = replace(w, recorded=w.recorded + 1)
        if isinstance(c, rm.ContinueAsNew):
            pass  # the next run starts from c.state (see check)
        if isinstance(c, rm.Finish):
            if w.finished:
                bad.append("the repair finished twice")
            cordon = w.cordon
            if c.uncordon and cordon == "us":
                cordon = ""
            if cordon == "us" and not c.held:
                bad.append("I1: left cordoned by us without a reason")
            if (c.stage.value == "shadowed") != (w.shadowed == 1):
                bad.append(f"shadow: ended {c.stage.value} with {w.shadowed} shadowed "
                           "attempt(s) recorded")
            w = replace(w, finished=True, cordon=cordon)
    if s.status == rm.Status.maintenance_wait and s.lease != "none":
        bad.append("maintenance: a lease held while waiting out a window")
    if s.status == rm.Status.awaiting_approval and s_before.status == rm.Status.probing_holder:
        w = replace(w, stale_asked=True)
    if any(n > 1 for _, n in w.disruptive):
        bad.append("I16: the disruptive command was sent twice in one attempt")
    if w.finished and w.recorded != len(w.touched_keys):
        bad.append(f"I22: {w.recorded} attempt(s) recorded, {len(w.touched_keys)} touched")
    return replace(w, bad=tuple(dict.fromkeys(bad)))


def _key(s: rm.RepairState, w: World) -> str:
    d = s.model_dump(mode="json", exclude={"policy"})
    return json.dumps([d, w.__dict__], sort_keys=True, default=str)


def _label(ev: rm.Event) -> str:
    if isinstance(ev, rm.Machine):
        inner = ev.event.model_dump(exclude_defaults=True)
        inner.pop("kind", None)
        return f"machine:{ev.event.kind}{json.dumps(inner, sort_keys=True) if inner else ''}"
    d = ev.model_dump(exclude_defaults=True, exclude={"policy", "alert", "attempts"})
    d.pop("kind", None)
    return ev.kind + (json.dumps(d, sort_keys=True) if d else "")


def check(depth: int, defects: frozenset[str] = frozenset(),
          stop_at_first: bool = False) -> Result:
    """Explore every event sequence of length ≤ ``depth`` from both starting worlds;
    ``defects`` re-introduces the named ones (test-only)."""
    res = Result(depth=depth)
    t0 = time.monotonic()
    seen: set[str] = set()
    queue: deque[tuple[rm.RepairState, World, list[str]]] = deque()
    for stale, shadow in ((False, False), (True, False), (False, True)):
        s0, w0 = _new(stale, shadow)
        seen.add(_key(s0, w0))
        queue.append((s0, w0, []))
    while queue:
        s, w, trace = queue.popleft()
        if len(trace) >= depth or w.finished:
            continue
        for ev in _events(s, w):
            got, w1 = _deliver(s, w, ev)
            t1 = [*trace, _label(ev)]
            res.transitions += 1
            if got is None:
                s1, cmds = s, []
            else:
                s1, cmds = rm.step(s, got, T0 + timedelta(seconds=w1.now_s), defects)
            w1 = _apply(s, s1, w1, list(cmds))
            for c in cmds:
                if isinstance(c, rm.ContinueAsNew):
                    s1 = c.state  # only what was carried survives
            if w1.bad:
                res.violations.append(("; ".join(w1.bad), t1))
                if stop_at_first:
                    res.states = len(seen)
                    res.seconds = time.monotonic() - t0
                    return res
                continue
            k = _key(s1, w1)
            if k not in seen:
                seen.add(k)
                queue.append((s1, w1, t1))
    res.states = len(seen)
    res.seconds = time.monotonic() - t0
    return res
