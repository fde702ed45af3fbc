"""Exhaustive bounded model checker of the cluster guard (``GuardMachine``, issue 26).

The world (issue 26 item 4): one cluster, 3 nodes (``a1``, ``a2`` in pool ``A``, ``b1``
in pool ``B``), budget 1, breaker threshold 2. One automatic repair per node goes
idle → waiting (its request sent) → holding (granted) → done, or dies while waiting or
holding (its signals become undeliverable, its ledger row stays); a holder records its
cordon (``cordon``) some time after its grant. Events: a request or
its re-send, a renewal, a release, a repair dying, a holder's cordon, the breaker reset, the clock
crossing the lease TTL and the breaker window, each armed timer firing, a guard restart
(the machine's state lost), the ledger going down and coming back, the policy read
answering or failing, the ledger read answering (holders: every repair holding a node,
dead ones included, with when it was recorded; automatic starts: the automatic repairs
that recorded their cordon inside the window, as ``ledger_guard_state`` lists them, not
from their grant; breaker: the newest alert the guard wrote), continue-as-new (the
state round-trips through JSON), and batches (issue 30 item 1: the interpreter steps
every message that arrived before its next step as one :class:`~workflows.lifecycle.guard.Batch`):
a storm (every idle or waiting repair's request in one batch) and a busy task (every
holder's release, then every other repair's request, then the breaker reset, in one
batch). An undeliverable
lease signal comes back as a message of the next batch, as in :mod:`workflows.guard`
(its replies run concurrently; their failures join the inbox).

States are hashed (canonical JSON of the machine's state plus the world) with symmetry
reduction over the two nodes of pool ``A`` (swapping them maps a state onto an
equivalent one), so the bounded run is exhaustive. Invariants after every step:

- leases held (repairs that believe they hold one and are alive) ≤ budget, at most one
  per pool and one per node; the machine's own leases likewise;
- nothing automatic and new is granted while the breaker is open;
- the breaker: no more than ``breaker_threshold`` automatic repairs asked within one
  window (after the last reset) start — a start is a grant that cordoned or still holds
  the node — across guard restarts too (from :data:`W_HOLDER`, a fresh guard whose
  ledger lists a holder that has not recorded its cordon);
- **I23** a repair that waited through a reset of the open breaker, whatever queued it,
  is granted only with ``reset_at`` (it acts on evidence after the reset); after a
  reset nothing counted before it is counted in the window again;
- **I21** a fresh guard grants nothing before the ledger answered, nor before it read
  its policy once (a restarted guard starts from :data:`DEFAULTS`, as the interpreter's
  ``policy_view(None)``: no pools, no failure domains; the policy read can fail);
- a holder is told its lease lapsed (a refused renewal) only by a serving guard: one
  that is starting or rebuilding does not know its holders yet;
- every request the serving guard's queue holds was answered (granted, or told it waits)
  after its repair last asked, the messages deferred while a read was out included; and
  those are granted as stepping them one by one after the read would (a request that came
  before a later deferred one tripped the breaker was granted while it was closed).

With ``domains`` (issue 29 item 2) the three nodes form one failure domain ``r`` (hold
threshold 2 inside the breaker window), ``b1``'s repair is a person's (approved by one:
``automatic`` false), an operator's ``release domain r`` is an event, and the ledger keeps
the guard's newest ``failure_domain`` rows for a rebuild; each node may report its fault
once (``fault_seen``, before or after its request). Invariants: no automatic repair is
granted a lease (a new start) while its domain is held (the domains the world configures,
not the machine's view of them) — a person's may be; and none is
granted once 2 nodes of the domain reported a fault inside the window (the hold judges
faults, not only lease requests), counting the reports a release or a fresh guard has not
dropped (a fresh guard counts afresh: the counts below the threshold are not in the
ledger); an automatic repair waiting for its first lease when the hold was released (the
hold kept it queued, or would have had a guard restart not lost the queue: the ledger
keeps the release, the guard's clear of the hold, for a rebuild) is granted only with
``reset_at`` (it acts on evidence after the release).

With ``lossy`` (issue 30 item 1: the replies go out as ``guard_send_leases``, which
reports a reply the server did not take after its tries as ``failed``) the server can
stop and start taking lease replies (events ``replies lost`` / ``replies back``); while
it takes none, every reply to a live requester comes back as ``EffectFailed`` in the
next batch and the requester hears nothing (it re-sends its request). The invariants
above must hold all the same.

A guard restarted after a reset knows the reset from the ledger's newest breaker clear
(also when the breaker tripped again since), and a request names when its repair first asked (``requested_at``, kept
across re-sends): a request first asked for at or before the last reset waited through
it, even when the restart lost the queue that held it, and I23 is checked across guard
restarts; a rebuilt guard keeps the automatic starts the ledger lists at or before that
reset out of the window, so "nothing counted before a reset is counted again" holds
across restarts too.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from workflows.leases import (
    DomainHold,
    DomainRelease,
    FaultReport,
    LeaseRelease,
    LeaseRequest,
    ReleaseDomainSignal,
    ResetBreakerSignal,
)
from workflows.lifecycle import guard as gm

NODES = ("a1", "a2", "b1")
POOLS = {"a1": "A", "a2": "A", "b1": "B"}
#: Lease TTL and breaker window of the model, seconds; the clock step crosses the TTL in
#: two steps and the window in three.
TTL_S = 150.0
WINDOW_S = 250.0
CLOCK_STEP_S = 100.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = gm.PolicyView(gpu_nodes=3, budget=1, breaker_threshold=2, breaker_window_s=WINDOW_S,
                       one_per_pool=True, detector_cap=3, lease_ttl_s=TTL_S, pools=POOLS)
#: The policy of the domain world: every node in domain ``r``, held at 2 nodes.
POLICY_DOMAINS = POLICY.model_copy(update={"domains": {n: ["r"] for n in NODES},
                                           "domain_threshold": 2,
                                           "domain_window_s": WINDOW_S})
#: What a guard knows before it read its policy (the interpreter's ``policy_view(None)``:
#: the rails' minimums, no pools, no failure domains). A guard restart starts from it.
DEFAULTS = POLICY.model_copy(update={"pools": {}})
#: The node whose repair a person approved in the domain world.
PERSON = "b1"


@dataclass(frozen=True)
class World:
    now_s: float = 0.0
    #: per node: idle / waiting / holding / done / dead
    repairs: tuple[str, ...] = ("idle", "idle", "idle")
    out: str | None = None  # "policy" / "ledger": a read of the guard's is out
    ledger_up: bool = True
    ledger_breaker: bool = False  # the newest breaker alert the guard wrote is a trip
    ledger_reset_s: float | None = None  # the guard's newest breaker clear (its last reset)
    granted_at: tuple[float | None, ...] = (None, None, None)  # automatic grant times
    #: per node: waited through a reset of the open breaker (evidence predates it)
    stale: tuple[bool, ...] = (False, False, False)
    #: per node: its automatic request was queued by a failure-domain hold when an
    #: operator released it (its evidence predates the release)
    released: tuple[bool, ...] = (False, False, False)
    #: per node: counted (sent an automatic request) before the last reset
    pre_reset: tuple[bool, ...] = (False, False, False)
    bad: tuple[str, ...] = ()
    #: the domain world (see the module's docstring)
    domains: bool = False
    #: the holds the ledger has open (the guard's newest failure_domain rows), as JSON
    ledger_holds: tuple[str, ...] = ()
    #: when the ledger's newest release of domain ``r`` is (the hold's clear the guard
    #: wrote, at its clock; None: never released)
    ledger_release_s: float | None = None
    #: per node: when it reported its fault (``fault_seen``; None: not yet), and whether
    #: that report still counts (a release of the hold, or a fresh guard, drops it)
    fault_at: tuple[float | None, ...] = (None, None, None)
    fault_live: tuple[bool, ...] = (False, False, False)
    #: the lossy world (see the module's docstring); ``replies_lost``: the server takes
    #: no lease reply now (each comes back ``failed``: the machine's EffectFailed)
    lossy: bool = False
    replies_lost: bool = False
    #: per node: when its repair first asked (``LeaseRequest.requested_at``, kept across
    #: re-sends: the repair's clock, which is the control plane's)
    asked_at: tuple[float | None, ...] = (None, None, None)
    #: per node: a grant told the repair of a reset (``reset_at``); the repair keeps it
    #: when a later grant of a re-acquire lacks it (workflows/repair.py, ``lease``)
    told_reset: tuple[bool, ...] = (False, False, False)
    #: per node: fault reports that counted when its request was delivered; a request the
    #: guard deferred (a policy or ledger read out) is decided later in arrival order, so
    #: what counted for it is what had arrived before it, not what arrived since
    asked_reports: tuple[int, ...] = (0, 0, 0)
    #: per node: when its repair recorded its cordon (the ledger's ``cordoning``
    #: transition; None: not yet). The ledger lists an automatic start from then only
    #: (``ledger_guard_state``), not from its grant
    cordoned_at: tuple[float | None, ...] = (None, None, None)
    #: when the open breaker was last reset (the guard's clear alert; None: never)
    last_reset_s: float | None = None
    #: per node: its repair sent a new request and the guard has not answered since (a
    #: grant or "queued"; a reply the lossy server did not take counts as sent)
    unanswered: tuple[bool, ...] = (False, False, False)


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


def _rid(i: int) -> str:
    return f"r-{NODES[i]}"


def _policy(w: World) -> gm.PolicyView:
    return POLICY_DOMAINS if w.domains else POLICY


def _automatic(w: World, i: int) -> bool:
    return not (w.domains and NODES[i] == PERSON)


def _req(i: int, renew: bool = False, w: World | None = None) -> LeaseRequest:
    asked = None if w is None else w.asked_at[i] if w.asked_at[i] is not None else w.now_s
    return LeaseRequest(repair_id=_rid(i), workflow_id=f"w-{NODES[i]}", cluster="c",
                        node=NODES[i], node_pool=POOLS[NODES[i]],
                        automatic=w is None or _automatic(w, i), renew=renew,
                        fault_kinds=["nvlink_down"],
                        requested_at=None if asked is None else T0 + timedelta(seconds=asked))


def _set(t: tuple, i: int, v: object) -> tuple:  # type: ignore[type-arg]
    return (*t[:i], v, *t[i + 1:])


def _node_of(repair_id: str) -> int:
    return NODES.index(repair_id.removeprefix("r-"))


def _ledger(w: World, m: gm.GuardState) -> gm.LedgerView:
    # as ``Ledger.guard_state``: holders with when their row was recorded (before their
    # first request: the world's ``asked_at``), automatic starts from their recorded
    # cordon only (a holder granted before a guard restart that has not cordoned yet is
    # a holder, not a start)
    holders = [gm.HeldRepair(repair_id=_rid(i), node=NODES[i], workflow_id=f"w-{NODES[i]}",
                             automatic=_automatic(w, i),
                             requested_at=None if w.asked_at[i] is None
                             else T0 + timedelta(seconds=w.asked_at[i]))
               for i, st in enumerate(w.repairs) if st == "holding"
               or (st == "dead" and w.granted_at[i] is not None)]
    auto = [(_rid(i), T0 + timedelta(seconds=t)) for i, t in enumerate(w.cordoned_at)
            if t is not None and w.now_s - t <= WINDOW_S and _automatic(w, i)]
    return gm.LedgerView(holders=holders, automatic=auto, breaker_open=w.ledger_breaker,
                         tripped_at=T0 if w.ledger_breaker else None,
                         tripped_reason="tripped" if w.ledger_breaker else "",
                         reset_at=None if w.ledger_reset_s is None
                         else T0 + timedelta(seconds=w.ledger_reset_s),
                         holds=[DomainHold.model_validate_json(h) for h in w.ledger_holds],
                         releases=[] if w.ledger_release_s is None else [DomainRelease(
                             domain="r", by="oncall",
                             at=T0 + timedelta(seconds=w.ledger_release_s))])


def _events(m: gm.GuardState, w: World) -> list[tuple[str, gm.Event | None]]:
    """(label, event) of every enabled step; event None: a world-only change."""
    evs: list[tuple[str, gm.Event | None]] = []
    for i, st in enumerate(w.repairs):
        if st in ("idle", "waiting"):
            evs.append((f"request {NODES[i]}", gm.Request(req=_req(i, w=w))))
        if st == "holding":
            evs.append((f"renew {NODES[i]}", gm.Request(req=_req(i, renew=True, w=w))))
        if st == "holding" and w.cordoned_at[i] is None:
            evs.append((f"cordon {NODES[i]}", None))
        if st in ("waiting", "holding"):
            evs.append((f"release {NODES[i]}",
                        gm.Release(rel=LeaseRelease(repair_id=_rid(i), outcome="succeeded"))))
            evs.append((f"die {NODES[i]}", None))
    evs.append(("reset", gm.ResetBreaker(sig=ResetBreakerSignal(by="oncall"))))
    if w.domains:
        evs.append(("release domain r", gm.ReleaseDomain(sig=ReleaseDomainSignal(
            domain="r", by="oncall"))))
        evs += [(f"fault {n}", gm.FaultSeen(report=FaultReport(
            cluster="c", node=n, alert_id=f"x-{n}", kind="nvlink_down", domains=["r"])))
                for i, n in enumerate(NODES) if w.fault_at[i] is None]
    evs.append(("clock", gm.Clock()))
    now = T0 + timedelta(seconds=w.now_s)
    for name, at in sorted(m.timers.items()):
        if at <= now:
            evs.append((f"timer {name}", gm.TimerFired(name=name)))
    evs.append(("guard restart", gm.Started(fresh=True)))
    evs.append(("ledger down" if w.ledger_up else "ledger back", None))
    if w.lossy:
        evs.append(("replies lost" if not w.replies_lost else "replies back", None))
    if w.out == "policy":
        evs.append(("policy ok", gm.PolicyRead(view=_policy(w))))
        evs.append(("policy failed", gm.PolicyFailed(message="timeout")))
    if w.out == "ledger":
        evs.append(("ledger answers" if w.ledger_up else "ledger unavailable",
                    gm.LedgerRead(view=_ledger(w, m)) if w.ledger_up
                    else gm.LedgerUnavailable(message="connection refused")))
    evs.append(("continue-as-new", gm.HistoryLong()))
    evs += _batches(w)
    return evs


def _batches(w: World) -> list[tuple[str, gm.Event | None]]:
    """The batch events: a storm of requests, and every message with the reset last."""
    reqs = [gm.Request(req=_req(i, w=w)) for i, st in enumerate(w.repairs)
            if st in ("idle", "waiting")]
    # a repair that released never asks again: the holders release, the others ask
    rels = [gm.Release(rel=LeaseRelease(repair_id=_rid(i), outcome="succeeded"))
            for i, st in enumerate(w.repairs) if st == "holding"]
    out: list[tuple[str, gm.Event | None]] = []
    if len(reqs) >= 2:
        out.append(("batch: requests", gm.Batch(events=list(reqs))))
    busy: list[gm.Message] = [*rels, *reqs, gm.ResetBreaker(sig=ResetBreakerSignal(by="oncall"))]
    if len(busy) >= 3:
        out.append(("batch: releases, requests, reset", gm.Batch(events=busy)))
    return out


def _world_only(label: str, w: World) -> World:
    if label.startswith("die "):
        i = NODES.index(label.removeprefix("die "))
        return replace(w, repairs=_set(w.repairs, i, "dead"))
    if label.startswith("replies "):
        return replace(w, replies_lost=not w.replies_lost)
    if label.startswith("cordon "):
        i = NODES.index(label.removeprefix("cordon "))
        return replace(w, cordoned_at=_set(w.cordoned_at, i, w.now_s))
    return replace(w, ledger_up=not w.ledger_up)


def _before(label: str, ev: gm.Event, m: gm.GuardState, w: World) -> World:
    """The world's side of delivering ``ev`` (before the machine steps)."""
    if isinstance(ev, gm.Batch):
        for inner in ev.events:
            w = _before(label, inner, m, w)
        return w
    if isinstance(ev, gm.Clock):
        return replace(w, now_s=w.now_s + CLOCK_STEP_S)
    if isinstance(ev, gm.Request) and not ev.req.renew:
        i = _node_of(ev.req.repair_id)
        asked = w.asked_at[i] if w.asked_at[i] is not None else w.now_s
        waiting = any(isinstance(d, gm.Request) and d.req.repair_id == ev.req.repair_id
                      for d in m.deferred)  # the first copy is the one decided
        return replace(w, repairs=_set(w.repairs, i, "waiting"),
                       asked_at=_set(w.asked_at, i, asked),
                       unanswered=_set(w.unanswered, i, True),
                       asked_reports=w.asked_reports if waiting or not w.domains
                       else _set(w.asked_reports, i, _reported(w)))
    if isinstance(ev, gm.Release):
        i = _node_of(ev.rel.repair_id)
        return replace(w, repairs=_set(w.repairs, i, "done"))
    if isinstance(ev, gm.FaultSeen):
        i = NODES.index(ev.report.node)
        return replace(w, fault_at=_set(w.fault_at, i, w.now_s),
                       fault_live=_set(w.fault_live, i, True))
    if isinstance(ev, gm.Started):
        # a fresh guard knows an earlier reset from the ledger only (its time: a request
        # first asked for before it waited through it, whatever queue it sat in, and a
        # start before it is out of the window), not the fault counts below the threshold
        return replace(w, out=None, fault_live=(False,) * 3)
    if isinstance(ev, gm.PolicyRead | gm.PolicyFailed | gm.LedgerRead | gm.LedgerUnavailable):
        return replace(w, out=None)
    return w


def _run(m: gm.GuardState, w: World, ev: gm.Event, defects: frozenset[str]
         ) -> tuple[gm.GuardState, World]:
    """Step ``ev`` and execute its commands as the interpreter does."""
    todo: deque[gm.Event] = deque([ev])
    later: list[gm.Message] = []  # outcomes of the replies: the next batch
    bad = list(w.bad)
    while todo or later:
        if not todo:
            todo.append(gm.Batch(events=later))
            later = []
        e = todo.popleft()
        now = T0 + timedelta(seconds=w.now_s)
        was_open, reset_at, counted = m.breaker_open, m.reset_at, m.counted
        # a repair the guard holds a lease for was not waiting at a reset, whatever the
        # repair believes (its grant lost, the lossy world)
        holding = {x.repair_id for x in m.leases}
        open_at = _open_at_grant(m, e, now, defects)
        held_at = _held_at_grant(m, e, now, defects)
        # granted in this step before its domain release / breaker reset was decided (a
        # batch's or a drain's earlier message): did not wait through it
        before_release = _granted_before(m, e, now, defects, _releases_domain)
        before_reset = _granted_before(m, e, now, defects, _resets_breaker)
        deferred = {d.req.repair_id for d in m.deferred if isinstance(d, gm.Request)}
        m, cmds = gm.step(m, e, now, defects)
        clears = [c.alert.observed_at for c in cmds if isinstance(c, gm.WriteAlert)
                  and c.alert.kind == gm.DOMAIN_KIND and not c.alert.active]
        if clears:
            # the machine lifted the hold in this step (a deferred release included): the
            # reports it dropped count no more, before the grants the step made; the
            # automatic repairs waiting for a first lease waited through the release (the
            # hold kept them queued, or would have had a guard restart not lost the queue
            # that held them: their evidence predates the release all the same)
            w = replace(w, fault_live=(False,) * 3, released=tuple(
                r or (st == "waiting" and _automatic(w, i) and w.granted_at[i] is None
                      and _rid(i) not in holding and _rid(i) not in before_release
                      # a deferred release is the operator's of when it came: a repair
                      # that first asked after it did not wait through it
                      and (w.asked_at[i] is None
                           or T0 + timedelta(seconds=w.asked_at[i]) <= clears[-1]))
                for i, (r, st) in enumerate(zip(w.released, w.repairs, strict=True))))
        if m.reset_at != reset_at:  # the machine reset the open breaker in this step
            pre = tuple(p or any(c.repair_id == _rid(i) for c in counted)
                        for i, p in enumerate(w.pre_reset))
            # a deferred reset is the operator's of when it came (m.reset_at): a repair
            # that first asked after it did not wait through it
            stale = tuple(x or (was_open and st == "waiting" and _rid(i) not in holding
                                and _rid(i) not in before_reset
                                and (w.asked_at[i] is None or m.reset_at is None
                                     or T0 + timedelta(seconds=w.asked_at[i]) <= m.reset_at))
                          for i, (x, st) in enumerate(zip(w.stale, w.repairs, strict=True)))
            w = replace(w, pre_reset=pre, stale=stale)
        for c in cmds:
            if isinstance(c, gm.LoadPolicy):
                w = replace(w, out="policy")
            elif isinstance(c, gm.ReadLedger):
                w = replace(w, out="ledger")
            elif isinstance(c, gm.WriteAlert) and c.alert.kind == gm.BREAKER_KIND:
                # a reset's clear is written at the reset's time (a deferred one: when it
                # came, not when the read out answered)
                at_s = (c.alert.observed_at - T0).total_seconds()
                w = replace(w, ledger_breaker=c.alert.active,
                            ledger_reset_s=w.ledger_reset_s if c.alert.active else at_s,
                            last_reset_s=w.last_reset_s if c.alert.active else at_s)
            elif isinstance(c, gm.WriteAlert) and c.alert.kind == gm.DOMAIN_KIND:
                w = replace(w, ledger_holds=_ledger_holds(w, c),
                            ledger_release_s=w.ledger_release_s if c.alert.active
                            else (c.alert.observed_at - T0).total_seconds())
            elif isinstance(c, gm.ContinueAsNew):
                m = gm.GuardState.model_validate_json(m.model_dump_json())
                todo.append(gm.Started(fresh=False))
            elif isinstance(c, gm.SendLease):
                i = _node_of(c.reply.repair_id)
                st = w.repairs[i]
                if c.purpose == "reply":
                    w = replace(w, unanswered=_set(w.unanswered, i, False))
                if st in ("dead", "done", "idle"):
                    later.append(gm.ReplyUndeliverable(repair_id=c.reply.repair_id,
                                                       purpose=c.purpose))
                    continue
                if w.replies_lost:  # guard_send_leases' "failed": the requester hears nothing
                    later.append(gm.EffectFailed(what="send_lease", subject=c.reply.repair_id,
                                                 message="UNAVAILABLE (3 tries)"))
                    continue
                if c.reply.granted:
                    if st == "waiting":
                        # a lapsed holder's renewal re-acquires ("re-acquired"), and a
                        # re-sent request of a holder whose grant was lost is told again
                        # ("already held", the lossy world): not a new start, which is
                        # all the breaker holds back
                        if _automatic(w, i) and open_at.get(c.reply.repair_id, m.breaker_open) \
                                and c.purpose == "reply" and c.reply.reason not in _NOT_NEW:
                            bad.append("breaker: an automatic new repair granted while open")
                        if m.status != gm.Status.serving or m.rebuilt_at is None:
                            bad.append("I21: granted before the ledger answered")
                        if not m.policy.loaded:
                            bad.append("I21: granted before the policy was read")
                        if (_automatic(w, i) and c.purpose == "reply"
                                and c.reply.reason not in _NOT_NEW
                                and held_at.get(c.reply.repair_id, _held(m, NODES[i]))):
                            bad.append(f"domain: automatic {NODES[i]} granted while its "
                                       "domain is held")
                        seen = (min(_reported(w), w.asked_reports[i])
                                if c.reply.repair_id in deferred else _reported(w))
                        if (_automatic(w, i) and c.purpose == "reply"
                                and c.reply.reason not in _NOT_NEW
                                and seen >= POLICY_DOMAINS.domain_threshold):
                            bad.append(f"domain: automatic {NODES[i]} granted after "
                                       f"{seen} nodes of its domain reported faults")
                        if (w.released[i] and c.reply.reset_at is None
                                and not w.told_reset[i]):
                            bad.append(f"domain: {NODES[i]} waited through a hold's release "
                                       "and acts on evidence from before it")
                        if w.stale[i] and c.reply.reset_at is None and not w.told_reset[i]:
                            bad.append(f"I23: {NODES[i]} waited through a reset and acts on "
                                       "pre-reset evidence")
                        w = replace(w, repairs=_set(w.repairs, i, "holding"),
                                    granted_at=_set(w.granted_at, i, w.now_s),
                                    told_reset=_set(w.told_reset, i, w.told_reset[i]
                                                    or c.reply.reset_at is not None))
                elif st == "holding":  # a refused renewal: the lease lapsed, do not act
                    if m.status != gm.Status.serving:
                        # only a guard that knows its holders (rebuilt) can say a lease
                        # lapsed: the ledger lists this one, the rebuild tells it
                        bad.append(f"renewal: holder {NODES[i]} told its lease lapsed by a "
                                   "guard that has not rebuilt")
                    w = replace(w, repairs=_set(w.repairs, i, "waiting"))
    return m, replace(w, bad=tuple(bad))


def _reported(w: World) -> int:
    """Nodes whose fault report counts now (inside the window, not dropped)."""
    return sum(1 for at, live in zip(w.fault_at, w.fault_live, strict=True)
               if live and at is not None and w.now_s - at <= WINDOW_S)


#: Reasons of grants that are no new start (the breaker and domain checks skip them).
_NOT_NEW = ("re-acquired", "already held")


def _held(m: gm.GuardState, node: str) -> bool:
    """Whether the machine holds a domain ``node`` belongs to: the world's domains (the
    configuration's), not the machine's view of them (a guard that never read its
    policy knows none)."""
    mine = POLICY_DOMAINS.domains.get(node) or []
    return any(h.domain in mine for h in m.holds)


def _ledger_holds(w: World, c: gm.WriteAlert) -> tuple[str, ...]:
    """The ledger's open holds after the guard wrote ``c`` (a raise or a release)."""
    ev = c.alert.evidence
    domain = str(ev["domain"])
    rest = tuple(h for h in w.ledger_holds
                 if DomainHold.model_validate_json(h).domain != domain)
    if not c.alert.active:
        return rest
    hold = DomainHold(domain=domain, opened_at=c.alert.observed_at,
                      nodes=list(ev["nodes"]), kinds=list(ev["kinds"]),
                      alert_id=c.alert.alert_id, reason=c.alert.description)
    return (*rest, hold.model_dump_json())


def _one_by_one(m: gm.GuardState, e: gm.Event) -> tuple[gm.GuardState, list[gm.Event]]:
    """The events whose one-by-one steps specify ``e``'s grants: a batch's messages; a
    read's outcome and then the messages deferred while it was out (the machine decides
    them in order once it serves); none for anything else."""
    if isinstance(e, gm.Batch):
        return m, list(e.events)
    if isinstance(e, gm.PolicyRead | gm.PolicyFailed | gm.LedgerRead) and m.deferred:
        return m.model_copy(update={"deferred": []}), [e, *m.deferred]
    return m, []


def _releases_domain(m: gm.GuardState, cmds: list[gm.Command]) -> bool:
    return any(isinstance(c, gm.WriteAlert) and c.alert.kind == gm.DOMAIN_KIND
               and not c.alert.active for c in cmds)


def _resets_breaker(m: gm.GuardState, cmds: list[gm.Command]) -> bool:
    return any(isinstance(c, gm.WriteAlert) and c.alert.kind == gm.BREAKER_KIND
               and not c.alert.active for c in cmds)


def _granted_before(m: gm.GuardState, e: gm.Event, now: datetime, defects: frozenset[str],
                    until: Callable[[gm.GuardState, list[gm.Command]], bool]) -> set[str]:
    """For a batch or a drain: the repairs granted, by the one-by-one specification
    (:func:`_one_by_one`), before the message whose step ``until`` matches."""
    m, events = _one_by_one(m, e)
    out: set[str] = set()
    for inner in events:
        m, cmds = gm.step(m, inner, now, defects)
        if until(m, cmds):
            return out
        out |= {c.reply.repair_id for c in cmds
                if isinstance(c, gm.SendLease) and c.reply.granted}
    return out


def _held_at_grant(m: gm.GuardState, e: gm.Event, now: datetime, defects: frozenset[str]
                   ) -> dict[str, bool]:
    """For a batch or a drain: whether each granted repair's domain was held when it was
    granted, by the specification (as :func:`_open_at_grant`)."""
    m, events = _one_by_one(m, e)
    out: dict[str, bool] = {}
    for inner in events:
        m, cmds = gm.step(m, inner, now, defects)
        for c in cmds:
            if isinstance(c, gm.SendLease) and c.reply.granted:
                out.setdefault(c.reply.repair_id, _held(m, _node_of_id(c.reply.repair_id)))
    return out


def _node_of_id(repair_id: str) -> str:
    return repair_id.removeprefix("r-")


def _open_at_grant(m: gm.GuardState, e: gm.Event, now: datetime, defects: frozenset[str]
                   ) -> dict[str, bool]:
    """For a batch: whether the breaker was open when each repair was granted, by the
    batch's specification (its messages stepped one by one: a request granted before a
    later one of the batch trips the breaker was granted while it was closed); for a read
    that drains the messages deferred while it was out, likewise (:func:`_one_by_one`).
    A grant the one-by-one steps do not make is judged on the breaker after the step."""
    m, events = _one_by_one(m, e)
    out: dict[str, bool] = {}
    for inner in events:
        m, cmds = gm.step(m, inner, now, defects)
        for c in cmds:
            if isinstance(c, gm.SendLease) and c.reply.granted:
                out.setdefault(c.reply.repair_id, m.breaker_open)
    return out


def check_invariants(m: gm.GuardState, w: World) -> list[str]:
    bad = list(w.bad)
    holding = [NODES[i] for i, st in enumerate(w.repairs) if st == "holding"]
    if len(holding) > POLICY.budget:
        bad.append(f"budget: {len(holding)} repairs hold a lease (budget {POLICY.budget})")
    pools = [POOLS[n] for n in holding]
    if len(set(pools)) < len(pools):
        bad.append("pool: two leases in one pool")
    if len(m.leases) > POLICY.budget or len({x.node for x in m.leases}) < len(m.leases):
        bad.append("guard: leases beyond the budget or two on a node")
    if m.status == gm.Status.serving and m.reading is None:
        # a request the guard decided (its queue holds it) was answered: granted, or told
        # it waits (the messages deferred while a read was out included)
        for q in m.queue:
            if w.unanswered[_node_of(q.req.repair_id)]:
                bad.append(f"answer: {q.req.node} waits in the guard's queue and was "
                           "never told")
    for c in m.counted:
        if c.in_window and w.pre_reset[_node_of(c.repair_id)]:
            bad.append(f"I23: {c.repair_id} counted before the reset is counted again")
    # the breaker counts an automatic request when it arrives: more than the threshold
    # of them asked within one window (after the last reset) never all start — a start
    # is a grant that cordoned or still holds (one released before its cordon did nothing)
    started = [NODES[i] for i in range(len(NODES))
               if _automatic(w, i) and w.granted_at[i] is not None
               and (w.cordoned_at[i] is not None or w.repairs[i] in ("holding", "dead"))
               and (at := w.asked_at[i]) is not None and w.now_s - at <= WINDOW_S
               and (w.last_reset_s is None or at > w.last_reset_s)]
    if len(started) > POLICY.breaker_threshold:
        bad.append(f"breaker: {len(started)} automatic repairs started in one window "
                   f"({', '.join(started)}; threshold {POLICY.breaker_threshold})")
    return bad


def _mirror(w: World) -> World:
    """The world with ``a1`` and ``a2`` swapped (per-node tuples reordered)."""
    def sw(t: tuple) -> tuple:  # type: ignore[type-arg]
        return (t[1], t[0], t[2])
    return replace(w, repairs=sw(w.repairs), granted_at=sw(w.granted_at), stale=sw(w.stale),
                   released=sw(w.released),
                   pre_reset=sw(w.pre_reset), fault_at=sw(w.fault_at),
                   fault_live=sw(w.fault_live), asked_at=sw(w.asked_at),
                   told_reset=sw(w.told_reset), asked_reports=sw(w.asked_reports),
                   cordoned_at=sw(w.cordoned_at), unanswered=sw(w.unanswered))


def _key(m: gm.GuardState, w: World) -> str:
    """Canonical text of (machine, world): the smaller of it and its a1↔a2 mirror image
    (symmetry reduction: the two nodes of pool A are interchangeable)."""
    text = m.model_dump_json() + repr(w)
    mirrored = m.model_dump_json().replace("a1", "\0").replace("a2", "a1").replace(
        "\0", "a2") + repr(_mirror(w))
    return min(text, mirrored)


#: The world of a guard started afresh while ``a1``'s automatic repair holds a lease a
#: guard before it granted, its cordon not recorded yet (``holder=True``).
W_HOLDER = World(repairs=("holding", "idle", "idle"), granted_at=(0.0, None, None),
                 asked_at=(0.0, None, None))


def initial(defects: frozenset[str] = frozenset(), domains: bool = False,
            lossy: bool = False, holder: bool = False, held: bool = False
            ) -> tuple[gm.GuardState, World]:
    """A guard that started, read its policy and rebuilt from the ledger: empty, or
    (``holder``) listing ``a1``'s repair as a holder that has not cordoned yet; with
    ``held`` (the domain world), then ``a1`` and ``a2`` reported their faults, so the
    domain is held and the ledger has its hold."""
    w0 = (replace(W_HOLDER, domains=domains, lossy=lossy) if holder
          else World(domains=domains, lossy=lossy))
    m, w = _run(gm.new_state("c", DEFAULTS), w0, gm.Started(fresh=True), defects)
    m, w = _run(m, replace(w, out=None), gm.PolicyRead(view=_policy(w0)), defects)
    m, w = _run(m, replace(w, out=None), gm.LedgerRead(view=_ledger(w, m)), defects)
    assert m.status == gm.Status.serving, m.status
    if held:
        assert domains, "held: the domain world only"
        for label in ("fault a1", "fault a2"):
            ev = dict(_events(m, w))[label]
            assert ev is not None
            m, w = _run(m, _before(label, ev, m, w), ev, defects)
        assert [h.domain for h in m.holds] == ["r"] and w.ledger_holds, m.holds
    return m, w


def check(depth: int, defects: frozenset[str] = frozenset(),
          stop_at_first: bool = False, domains: bool = False, lossy: bool = False,
          holder: bool = False, held: bool = False) -> Result:
    """Explore every event sequence of length ≤ ``depth`` from a guard's first start;
    ``defects`` re-introduces the named ones (test-only); ``domains``: the domain world,
    ``lossy``: the lossy world (module docstring); ``holder``: from :data:`W_HOLDER`;
    ``held``: from a held domain (:func:`initial`)."""
    res = Result(depth=depth)
    t0 = time.monotonic()
    m0, w0 = initial(defects, domains, lossy, holder, held)
    seen = {_key(m0, w0)}
    queue: deque[tuple[gm.GuardState, World, list[str]]] = deque([(m0, w0, [])])
    while queue:
        m, w, trace = queue.popleft()
        if len(trace) >= depth:
            continue
        for label, ev in _events(m, w):
            if ev is None:
                m1, w1 = m, _world_only(label, w)
            else:
                w1 = _before(label, ev, m, w)
                # a guard restart loses the machine's state
                base = gm.new_state("c", DEFAULTS) if isinstance(ev, gm.Started) else m
                m1, w1 = _run(base, w1, ev, defects)
            res.transitions += 1
            t1 = [*trace, label]
            bad = check_invariants(m1, w1)
            if bad:
                res.violations.append(("guard: " + "; ".join(bad), t1))
                if stop_at_first:
                    res.states = len(seen)
                    res.seconds = time.monotonic() - t0
                    return res
                continue
            k = _key(m1, w1)
            if k not in seen:
                seen.add(k)
                queue.append((m1, w1, t1))
    res.states = len(seen)
    res.seconds = time.monotonic() - t0
    return res


def replay(labels: list[str], defects: frozenset[str] = frozenset(), domains: bool = False,
           lossy: bool = False) -> list[str]:
    """Step the events named ``labels`` (as :func:`_events` names them) from
    :func:`initial` and return the invariant violations of the last state (a trace the
    checker printed, kept as a named test). Raises ``KeyError`` naming a label that is
    not enabled where it comes."""
    m, w = initial(defects, domains, lossy)
    for label in labels:
        evs = dict(_events(m, w))
        if label not in evs:
            raise KeyError(f"{label!r} not enabled here (enabled: {sorted(evs)})")
        ev = evs[label]
        if ev is None:
            w = _world_only(label, w)
        else:
            w = _before(label, ev, m, w)
            base = gm.new_state("c", DEFAULTS) if isinstance(ev, gm.Started) else m
            m, w = _run(base, w, ev, defects)
        bad = check_invariants(m, w)
        if bad:
            return bad
    return []
