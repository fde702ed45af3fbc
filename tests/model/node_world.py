"""Exhaustive bounded model checker of the node lifecycle
(:mod:`workflows.lifecycle.node`, issue 26 item 4).

Breadth-first search over every event sequence up to ``depth`` from a fresh node entity,
in a small world of one node (symmetry: nodes share nothing in this machine, so one
stands for all) with

- a level fault ``gpu_lost`` that appears and heals (the agent sends the edge; an agent
  that restarts sends the current state of every level signal, I20's agent side) and
  an event fault (``xid 79``), each report sent with a sender clock 5 min slow, right or
  5 min fast and stamped by ingest with the control plane's clock (``received_at``);
- up to :data:`QUEUE_MAX` reports in flight between ingest and the node, delivered in any
  order (replicas, an outbox re-delivery);
- the repair the machine starts (or one another run started before this fresh entity,
  world ``W_OWNED``, or a person's started at any time, ``operator_starts_repair``, which
  the node learns of from the ledger only) ending succeeded (fixing the faults: a new boot), failed, shadowed
  (shadow mode: nothing ran, the faults stay), or without telling (terminated);
- the ledger going down and coming back, reads answered from the world's truth;
- timers, the clock crossing persistence and cooldown edges, continue-as-new and a
  worker restart (the run starts again from :func:`~workflows.lifecycle.node.carry`;
  calls that were out are lost);
- the node re-registered: another machine bound to it (the old machine's faults are
  gone with it), learnt at the policy read;
- from :data:`W_MAINT`: a planned maintenance window covering the node (reports marked
  ``in_maintenance`` on receipt, with its scheduled end :data:`WINDOW_UNTIL_S`), the
  window ending early or at that end (reports marked ``in_grace`` for :data:`GRACE_S`
  after; a level fault raised inside it is a fault judged past that grace), and the
  node rebooting (its first report from the new boot
  inside a grace starts a grace of its own).

The ledger write of an alert, the policy read and an ``attach_alert`` signal are answered
within the same transition (they cannot interleave with anything the machine decides on:
the machine waits for each); the signal lands exactly when the repair still runs.

States are hashed (canonical JSON of the machine's state plus the world). After every
step the invariants are checked: one repair per node at a time (I21), rule zero and I20
(a repair starts only on a fault reported after its last fix and not cleared since),
I17 (its persistence counted on the control plane's receipt times), and no alert is
answered ``attached`` to a repair that is not running, a repair starts only on a fault
the node (of failure domain :data:`DOMAIN`) reported to its guard (issue 29 item 2), and
(issue 29 item 1) nothing is
recommended inside a window or its grace from a fault that did not persist (a level
fault raised at the grace end) or recur (an event fault received after it) past it. A
violation comes with the shortest event trace (BFS order).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from workflows.config import CatalogueConfig, RailsConfig
from workflows.lifecycle import node as nm
from workflows.maintenance import IN_GRACE, IN_MAINTENANCE, MAINTENANCE_UNTIL, MAINTENANCE_WINDOW
from workflows.models import Action, Alert, Severity, Stage

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Rails of the world: persistence 60 s for level faults (event faults 0 s), cooldown
#: 1800 s (the defaults, docs/design.md §5).
RAILS = RailsConfig()
CATALOGUE = CatalogueConfig()
#: The failure domain the world's node belongs to (its guard counts its fault reports).
DOMAIN = "rack-1"
#: Clock step of a bare ``clock`` event, seconds (more than the persistence window).
CLOCK_STEP_S = 120.0
#: Sender clock offsets, seconds (ingest accepts up to 300 s ahead).
SKEWS = (-300.0, 0.0, 300.0)
#: Most reports in flight to the node at once.
QUEUE_MAX = 2
LEVEL, EVENT = "gpu_lost::", "xid:79:"
#: Grace period after maintenance in the world, seconds (more than one clock step, so
#: that time passes inside it; ``policy.maintenance.grace_s`` as the policy read says).
GRACE_S = 180.0
#: The window's scheduled end, seconds from T0 (ingest's ``maintenance_until`` mark): it
#: closes then by itself, or earlier when an operator ends it (``window_ends``).
WINDOW_UNTIL_S = 240.0
#: A report's maintenance mark (the queue's last field): none, inside the window, else
#: the grace end (seconds from T0).
NO_MARK, IN_WINDOW = -1.0, -2.0


def _alert(key: str, active: bool, sent_s: float, skew: float, boot: int, n: int,
           mark: float = NO_MARK) -> Alert:
    kind, code = ("gpu_lost", None) if key == LEVEL else ("xid", 79)
    ev: dict[str, object] = {"boot_id": f"b{boot}"}
    if mark == IN_WINDOW and active:
        ev[IN_MAINTENANCE] = "mw-1"
        ev[MAINTENANCE_UNTIL] = (T0 + timedelta(seconds=WINDOW_UNTIL_S)).isoformat()
    elif mark >= 0 and active:
        ev |= {IN_GRACE: (T0 + timedelta(seconds=mark)).isoformat(),
               MAINTENANCE_WINDOW: "mw-1"}
    return Alert(
        alert_id=f"{key}{'r' if active else 'c'}{n}", cluster="c1", node="n1", kind=kind,
        code=code, severity=Severity.critical, summary=kind, level=key == LEVEL,
        active=active, actionable=True, action=Action.power_cycle,
        evidence=ev,
        observed_at=T0 + timedelta(seconds=sent_s + skew),
        received_at=T0 + timedelta(seconds=sent_s))


@dataclass(frozen=True)
class World:
    """The node's truth, what is in flight, and what the invariants need."""

    now_s: float = 0.0
    level_present: bool = False
    event_pending: bool = False
    boot: int = 0
    sent: int = 0
    queue: tuple[tuple[str, bool, float, float, int, int, float], ...] = ()
    ledger_up: bool = True
    read_out: bool = False
    probe_out: bool = False
    #: the repair the probe out asks about (ledger_open_repair is asked with its id: it
    #: answers about that repair, not about another one running on the node)
    probe_id: str = ""
    timer_s: float | None = None
    repair: tuple[str, tuple[str, ...]] | None = None  # running: (id, fault keys)
    repair_told: bool = True  # the machine knows (False: owned by another run)
    # per fault key, control-plane receipt times delivered to the node
    raised_at: tuple[tuple[str, float], ...] = ()
    episode_at: tuple[tuple[str, float], ...] = ()
    cleared_at: tuple[tuple[str, float], ...] = ()
    fixed_at: tuple[tuple[str, float], ...] = ()
    started: int = 0
    machine: int = 0  # which machine is bound to the node (re-registration bumps it)
    bad: tuple[str, ...] = ()
    maint: bool = False  # the maintenance events are in play (W_MAINT)
    window_open: bool = False
    grace_end_s: float | None = None  # the node's grace end (window's or a boot's)
    window_boot: int | None = None  # the boot of the last report inside the window
    #: fault kinds the node reported to its guard (``fault_seen``; the node is in a
    #: failure domain, issue 29 item 2)
    reported: tuple[str, ...] = ()
    #: fault keys whose current episode began inside the window (reports marked
    #: ``in_maintenance``): no repair may start on one while the window is open
    window_eps: tuple[str, ...] = ()
    #: a person's repair of the node was started (the API, the CLI: it does not tell the
    #: node; once per run of the world)
    op_started: bool = False


def _get(t: tuple[tuple[str, float], ...], k: str) -> float | None:
    return dict(t).get(k)


def _put(t: tuple[tuple[str, float], ...], k: str, v: float | None
         ) -> tuple[tuple[str, float], ...]:
    d = dict(t)
    if v is None:
        d.pop(k, None)
    else:
        d[k] = v
    return tuple(sorted(d.items()))


W_FRESH = World()
#: A fresh entity for a node whose fault another run's repair already owns.
W_OWNED = World(level_present=True, repair=("r0", (LEVEL,)), repair_told=False,
                raised_at=((LEVEL, -600.0),), episode_at=((LEVEL, -600.0),))


#: A node inside a planned maintenance window (its grace and reboots in play).
W_MAINT = World(maint=True, window_open=True)


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    violations: list[tuple[str, list[str]]] = field(default_factory=list)


def _send(w: World, key: str, active: bool, skew: float) -> World:
    if len(w.queue) >= QUEUE_MAX:
        return w
    mark = NO_MARK
    if w.window_open:
        mark = IN_WINDOW
    elif w.grace_end_s is not None and w.now_s < w.grace_end_s:
        mark = w.grace_end_s  # ingest's mark: the window's grace end
    item = (key, active, w.now_s, skew, w.boot, w.sent, mark)
    return replace(w, queue=(*w.queue, item), sent=w.sent + 1)


def _world_events(w: World) -> list[tuple[str, World, nm.Event | None]]:
    """(label, world after, event to the machine or None)."""
    out: list[tuple[str, World, nm.Event | None]] = []
    if len(w.queue) < QUEUE_MAX:
        if not w.level_present:
            for sk in SKEWS:
                out.append((f"gpu_lost_appears(skew={sk:+g})",
                            _send(replace(w, level_present=True), LEVEL, True, sk), None))
        else:
            out.append(("gpu_lost_heals",
                        _send(replace(w, level_present=False), LEVEL, False, 0.0), None))
        if not w.event_pending:
            for sk in SKEWS:
                out.append((f"xid79(skew={sk:+g})",
                            _send(replace(w, event_pending=True), EVENT, True, sk), None))
        # an agent restart: the current state of every level signal (I20, agent side)
        out.append(("agent_restart", _send(w, LEVEL, w.level_present, 0.0), None))
    if w.maint:
        if w.window_open:
            out.append(("window_ends", replace(w, window_open=False,
                                               grace_end_s=w.now_s + GRACE_S), None))
        out.append(("node_reboots", replace(w, boot=w.boot + 1), None))
    for i, (key, active, sent_s, skew, boot, n, mark) in enumerate(w.queue):
        a = _alert(key, active, sent_s, skew, boot, n, mark)
        w1 = replace(w, queue=w.queue[:i] + w.queue[i + 1:])
        ev: nm.Event = nm.AlertDelivered(alert=a)
        if active and mark == IN_WINDOW:
            # observed only: no fault episode; its boot is the one seen inside the window
            w1 = replace(w1, window_boot=boot)
        elif active and (w1.grace_end_s is not None and sent_s < w1.grace_end_s
                         and w1.window_boot is not None and boot != w1.window_boot):
            # the first report, inside the grace, from a boot made since the window's
            # last report: a grace of its own from its receipt
            w1 = replace(w1, window_boot=boot,
                         grace_end_s=max(w1.grace_end_s, sent_s + GRACE_S))
        if active and (mark != IN_WINDOW or key == LEVEL):
            # a level fault raised inside the window is a fault all the same (judged
            # after the window's grace); an event fault there is the maintenance's
            last = _get(w1.raised_at, key)
            w1 = replace(w1, raised_at=_put(w1.raised_at, key, max(sent_s, last or sent_s)))
            open_ep = _get(w1.episode_at, key)
            cl = _get(w1.cleared_at, key)
            fx = _get(w1.fixed_at, key)
            fresh = (cl is None or sent_s > cl) and (fx is None or sent_s > fx)
            ends = [t for t in (cl, fx) if t is not None]
            if fresh and (open_ep is None or (ends and open_ep <= max(ends))):
                w1 = replace(w1, episode_at=_put(w1.episode_at, key, sent_s))
                inside = tuple(sorted({*w1.window_eps, key})) if mark == IN_WINDOW \
                    else tuple(k for k in w1.window_eps if k != key)
                w1 = replace(w1, window_eps=inside)
        elif not active:
            cl = _get(w1.cleared_at, key)
            w1 = replace(w1, cleared_at=_put(w1.cleared_at, key, max(sent_s, cl or sent_s)))
        out.append((f"deliver({a.alert_id},{'raise' if active else 'clear'},skew={skew:+g})",
                    w1, ev))
    if w.repair is None and not w.op_started:
        # a person starts a repair of the node (``repairs create``): the node learns of
        # it from the ledger only; its end is signalled to the node like any repair's
        out.append(("operator_starts_repair",
                    replace(w, repair=("op", ()), repair_told=False, op_started=True), None))
    # a terminated repair (id "") never reports that it finished
    if w.repair is not None and w.repair[0]:
        rid, keys = w.repair
        fixed = w.fixed_at
        for k in keys + ((LEVEL,) if w.level_present else ()) + (
                (EVENT,) if w.event_pending else ()):
            fixed = _put(fixed, k, w.now_s)
        ok = replace(w, repair=None, level_present=False, event_pending=False,
                     boot=w.boot + 1, fixed_at=fixed)
        out.append((f"repair_succeeded({rid})", ok,
                    nm.RepairFinishedEv(repair_id=rid, stage=Stage.succeeded,
                                        at=T0 + timedelta(seconds=w.now_s))))
        # shadow mode (issue 29 item 3): nothing ran, the faults are still there; the
        # node retires the ones the repair stood for (one episode, one shadowed repair)
        out.append((f"repair_shadowed({rid})", replace(w, repair=None),
                    nm.RepairFinishedEv(repair_id=rid, stage=Stage.shadowed,
                                        at=T0 + timedelta(seconds=w.now_s))))
        # I18: the machine is held for RMA; the repair refused to act (cancelled) and the
        # node sets the faults it stood for aside (no repair for them every cooldown)
        out.append((f"repair_refused_held({rid})", replace(w, repair=None),
                    nm.RepairFinishedEv(repair_id=rid, stage=Stage.cancelled,
                                        at=T0 + timedelta(seconds=w.now_s),
                                        machine_held=True)))
        out.append((f"repair_failed({rid})", replace(w, repair=None),
                    nm.RepairFinishedEv(repair_id=rid, stage=Stage.failed,
                                        at=T0 + timedelta(seconds=w.now_s))))
        out.append((f"repair_terminated({rid})", replace(w, repair=("", ())), None))
    out.append(("ledger_down" if w.ledger_up else "ledger_up",
                replace(w, ledger_up=not w.ledger_up), None))
    if w.read_out:
        w1 = replace(w, read_out=False)
        if not w.ledger_up:
            out.append(("ledger_read_fails", w1, nm.LedgerUnavailable(message="pg down")))
        else:
            running = w.repair is not None and w.repair[0] != ""
            if w.repair == ("", ()):  # the ledger knows the terminated repair is over
                w1 = replace(w1, repair=None)
            out.append(("ledger_read", w1, nm.LedgerRead(
                repair_id=w.repair[0] if running and w.repair else None, running=running,
                stage="repairing" if running else "", status="running" if running else "")))
    if w.probe_out:
        w1 = replace(w, probe_out=False)
        if not w.ledger_up:
            out.append(("probe_fails", w1, nm.RepairProbed(repair_id="?", ok=False)))
        elif w.repair == ("", ()) or w.repair is None or (
                w.repair[0] != w.probe_id and w.probe_id):
            gone = w1 if w.repair is not None and w.repair[0] else replace(w1, repair=None)
            out.append(("probe_finds_it_gone", gone,
                        nm.RepairProbed(repair_id="?", running=False, status="terminated")))
        else:
            out.append(("probe_finds_it_running", w1,
                        nm.RepairProbed(repair_id="?", running=True, status="running")))
    if not w.queue:
        # another machine bound to the node (nothing in flight to it): the old one's
        # faults left with it
        out.append(("node_reregistered",
                    replace(w, machine=w.machine + 1, level_present=False,
                            event_pending=False, raised_at=(), episode_at=(),
                            cleared_at=(), fixed_at=()),
                    _policy(w.machine + 1)))
    if w.repair == ("", ()):
        out.append(("watch_sees_it_end", replace(w, repair=None),
                    nm.RepairEnded(repair_id="?", how="terminated")))
    if w.timer_s is not None:
        out.append(("timer", replace(w, now_s=max(w.now_s, w.timer_s), timer_s=None),
                    nm.TimerFired()))
    out.append(("clock", replace(w, now_s=w.now_s + CLOCK_STEP_S), nm.Clock()))
    out.append(("history_full", w, nm.HistoryFull()))
    out.append(("worker_restart", replace(w, read_out=False, probe_out=False, timer_s=None),
                None))
    return [(label, _closed_on_time(w1), ev) for label, w1, ev in out]


def _closed_on_time(w: World) -> World:
    """The window closes by itself at its scheduled end (its grace runs from then)."""
    if not (w.maint and w.window_open and w.now_s >= WINDOW_UNTIL_S):
        return w
    return replace(w, window_open=False,
                   grace_end_s=max(w.grace_end_s or 0.0, WINDOW_UNTIL_S + GRACE_S))

def _policy(machine: int) -> nm.PolicyLoaded:
    return nm.PolicyLoaded(catalogue=CATALOGUE, rails=RAILS, machine_id=f"m{machine}",
                           grace_s=GRACE_S, domains=[DOMAIN])


def _run(m: nm.NodeState, w: World, ev: nm.Event, now: datetime,
         defects: frozenset[str]) -> tuple[nm.NodeState, World, list[nm.Command]]:
    """Step ``ev`` and what the world answers at once (ledger write, policy read, the
    attach signal), applying every command to the world."""
    todo = [ev]
    every: list[nm.Command] = []
    while todo:
        m, cmds = nm.step(m, todo.pop(0), now, defects)
        every += cmds
        w = _apply(w, cmds, (now - T0).total_seconds())
        for c in cmds:
            if isinstance(c, nm.RecordAlert):
                todo.append(nm.AlertRecorded(alert_id=c.alert.alert_id))
            elif isinstance(c, nm.LoadPolicy):
                todo.append(_policy(w.machine))
            elif isinstance(c, nm.AttachAlert):
                landed = w.repair is not None and w.repair[0] == c.repair_id
                if not landed and w.repair == ("", ()):
                    # the signal failed: the terminated workflow is closed (workflows/node.py)
                    w = replace(w, repair=None)
                todo.append(nm.AttachDone(alert_id=c.alert.alert_id, ok=landed))
    return m, w, every


def _apply(w: World, cmds: list[nm.Command], now_s: float) -> World:
    for c in cmds:
        if isinstance(c, nm.Reply) and c.outcome == nm.AlertOutcome.attached:
            if w.repair is None or w.repair[0] != c.repair_id:
                w = replace(w, bad=(*w.bad, f"attached {c.alert_id} to repair "
                                    f"{c.repair_id}, which is not running"))
        if isinstance(c, nm.ReportFault) and c.report.kind not in w.reported:
            w = replace(w, reported=tuple(sorted((*w.reported, c.report.kind))))
        if isinstance(c, nm.StartRepair):
            bad = list(w.bad)
            if w.window_open and any(k in w.window_eps for k in c.fault_keys):
                bad.append("window: repair recommended inside the maintenance window from "
                           "a fault raised inside it")
            unreported = [k for k in c.fault_keys if k.split(":")[0] not in w.reported]
            if unreported:
                bad.append(f"domain: repair on {unreported[0]} of a node of failure domain "
                           f"{DOMAIN} whose fault was never reported to the guard")
            if w.repair is not None:
                bad.append("one repair per node: a second repair started while "
                           f"{w.repair[0] or 'one'} may still run (I21)")
            if not any(_justified(w, k, now_s) for k in c.fault_keys):
                bad.append(_why(w, c.fault_keys, now_s))
            w = replace(w, repair=(c.repair_id, tuple(c.fault_keys)), started=w.started + 1,
                        bad=tuple(bad))
        elif isinstance(c, (nm.ReadLedger)):
            w = replace(w, read_out=True)
        elif isinstance(c, nm.ProbeRepair):
            w = replace(w, probe_out=True, probe_id=c.repair_id)
        elif isinstance(c, nm.SetTimer):
            w = replace(w, timer_s=None if c.at is None else (c.at - T0).total_seconds())
    return w


def _justified(w: World, k: str, now_s: float) -> bool:
    """Rule zero, I20 and I17 for fault ``k`` at ``now_s``: a raise received after its
    last fix and its last clear, its episode older than the persistence window."""
    r, cl, fx, ep = (_get(w.raised_at, k), _get(w.cleared_at, k), _get(w.fixed_at, k),
                     _get(w.episode_at, k))
    if r is None or ep is None or (cl is not None and r <= cl) or (fx is not None and r <= fx):
        return False
    if not _past_grace(w, k, now_s):
        return False
    persist = RAILS.persistence_s if k == LEVEL else 0.0
    return now_s - ep >= persist


def _past_grace(w: World, k: str, now_s: float) -> bool:
    """Issue 29 item 1: a fault whose episode began before the node's grace end
    persisted past it (level: raised at it) or recurred after it (event)."""
    g, ep, r = w.grace_end_s, _get(w.episode_at, k), _get(w.raised_at, k)
    if g is None or ep is None or r is None or ep >= g:
        return True
    return now_s >= g if k == LEVEL else r >= g


def _why(w: World, keys: list[str], now_s: float) -> str:
    k = keys[0]
    r, fx, ep = _get(w.raised_at, k), _get(w.fixed_at, k), _get(w.episode_at, k)
    if not _past_grace(w, k, now_s):
        return (f"grace: repair on {k} from a fault of the maintenance grace period "
                f"(ends {w.grace_end_s:g} s) that did not persist or recur past it")
    if r is not None and fx is not None and r <= fx:
        return f"I20: repair on {k} that a successful repair fixed, with no report since"
    if r is not None and ep is not None and (now_s - ep) < (
            RAILS.persistence_s if k == LEVEL else 0.0):
        return f"I17: repair on {k} before its persistence window, by receipt time"
    return f"rule zero: repair on {k} with no current failed check behind it"


def _key(m: nm.NodeState, w: World) -> str:
    return m.model_dump_json(exclude={"rails", "details", "catalogue"}) + repr(w)


def check(depth: int, defects: frozenset[str] = frozenset(),
          stop_at_first: bool = False,
          worlds: tuple[World, ...] = (W_FRESH, W_OWNED)) -> Result:
    """Explore every event sequence of length ≤ ``depth`` from each starting world
    (:data:`W_FRESH`, :data:`W_OWNED`; :data:`W_MAINT` when named in ``worlds``);
    ``defects`` re-introduces the named ones."""
    res = Result(depth=depth)
    t0 = time.monotonic()
    for w0 in worlds:
        m0, w0, _ = _run(nm.new_state("c1", "n1", "seed"), w0, nm.Begin(), T0, defects)
        seen = {_key(m0, w0)}
        queue: deque[tuple[nm.NodeState, World, list[str]]] = deque([(m0, w0, [])])
        while queue:
            m, w, trace = queue.popleft()
            if len(trace) >= depth:
                continue
            for label, w1, ev in _world_events(w):
                if label == "node_reregistered" and m.intake:
                    # not modelled: a report still undecided when the machine is swapped
                    # (an alert carries no machine the control plane trusts, so whose
                    # it is cannot be told; it is judged under the binding read next)
                    continue
                now = T0 + timedelta(seconds=w1.now_s)
                m1 = m
                cmds: list[nm.Command] = []
                if label == "worker_restart" or (
                        ev is not None and isinstance(ev, nm.HistoryFull)):
                    if isinstance(ev, nm.HistoryFull):
                        m1, cmds = nm.step(m, ev, now, defects)
                        cont = [c for c in cmds if isinstance(c, nm.ContinueAsNew)]
                        if not cont:  # deferred: nothing changes
                            res.transitions += 1
                            continue
                        m1 = cont[0].state
                    else:
                        m1 = nm.carry(m)
                    w1 = replace(w1, read_out=False, probe_out=False, timer_s=None)
                    m1, w1, cmds = _run(m1.model_copy(update={"timer_at": None}), w1,
                                        nm.Begin(), now, defects)
                elif ev is not None:
                    if isinstance(ev, (nm.RepairEnded, nm.RepairProbed)) and m.repair:
                        ev = ev.model_copy(update={"repair_id": m.repair.repair_id})
                    m1, w1, cmds = _run(m, w1, ev, now, defects)
                res.transitions += 1
                t1 = [*trace, label]
                if w1.bad:
                    res.violations.append(("node: " + "; ".join(w1.bad), t1))
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
