"""Exhaustive bounded model checker of the composed fleet (issue 26 item 4).

One cluster, 3 nodes (``a1``, ``a2`` in pool ``A``; ``b1`` in pool ``B``), budget 1, breaker
threshold 2. The pure machines run together, their commands executed by the world as the
shells execute them:

- a :class:`~workflows.lifecycle.node.NodeMachine` state per node
  (:mod:`workflows.lifecycle.node`), driven as ``NodeWorkflow`` drives it: alerts
  delivered (``AlertDelivered``; its ledger write ``RecordAlert``, the policy read
  ``LoadPolicy`` and an ``AttachAlert`` signal answered at once, the signal landing
  exactly while the repair has not ended), repairs started (``RepairStarted``), their
  ends told (``RepairFinishedEv``), ledger reads and repair probes out until answered
  (``LedgerRead`` / ``LedgerUnavailable``, ``RepairProbed``), its one timer, lease
  releases to the guard; events reach an entity one at a time, in the order commanded;
- the :class:`~workflows.lifecycle.guard.GuardState` machine (:mod:`workflows.lifecycle.guard`):
  lease requests, releases, breaker, rebuild from the ledger;
- per repair an abstract stage model (:class:`Repair`, stepped by :func:`repair_step`,
  the one seam a ``RepairMachine`` is swapped in through: ``check(repair=...)``), its
  machine action the real :mod:`workflows.lifecycle.machine_action` machine.

Events (every one enabled in a state is explored): per node a level fault raised (sender
clock 5 min slow or 5 min fast; ingest stamps the control plane's receipt time) and
cleared, an event fault (Xid 79) raised, the node re-registered (a fresh entity: its
state lost), an operator's own cordon / uncordon; approve / reject / cancel of each open
repair; activity outcomes (drain done; the machine action ok, a BMC status read failing
after the disruptive command, failing for good); the ledger down and back; each read out
answered (or failing while the ledger is down); a worker restart (calls out lost, node
entities restart from their carried state, a machine action from its carried phase);
continue-as-new of every entity; a guard restart (its state lost, rebuilt from the
ledger); each due timer; the clock crossing persistence (70 s), cooldown / lease TTL /
breaker window (1800 s) and the 7-day ladder window (7 d).

Messages between the machines (a lease request, its reply, a release, a repair's end
told to its node) are delivered at once, in the order commanded; reads and activities
stay out until an event answers them, so they interleave with everything else.

Invariants after every step: one repair per node; leases and acting repairs within the
budget (and one per pool); no automatic new repair granted while the breaker is open;
I17 (a repair starts only on a fault whose persistence elapsed by receipt time, rule
zero); I21 (nothing granted before a fresh guard read the ledger; no second repair for a
node whose repair may be open); I23 (a repair that waited through a reset acts only on
evidence after it; nothing counted twice); never left cordoned without a reason (a
repair's cordon belongs to an open repair or a failed one that says so).

States are hashed canonically with **symmetry reduction**: ``a1`` and ``a2`` are
interchangeable (same pool), so a state and its ``a1``↔``a2`` mirror are one state. A
violation is reported with the shortest event trace reaching it (BFS order).

``check(world_defects=...)`` plants test-only defects only a composed world reaches
(:data:`WORLD_DEFECTS`); the machines' own ``defects`` pass through ``defects``.
Genuine findings in the machines as they are (:data:`KNOWN_FINDINGS`) are violations
unless ``check(known=...)`` names them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from workflows.config import CatalogueConfig, RailsConfig
from workflows.leases import LeaseRelease, LeaseRequest, ResetBreakerSignal
from workflows.lifecycle import guard as gm
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle import node as nm
from workflows.models import Action, Alert, Severity, Stage

NODES = ("a1", "a2", "b1")
POOLS = {"a1": "A", "a2": "A", "b1": "B"}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Node rails: persistence 60 s for level faults (0 s for event faults), cooldown 1800 s
#: (RailsConfig's defaults, docs/design.md §5).
RAILS = RailsConfig()
CATALOGUE = CatalogueConfig()
#: Guard rails of the model: lease TTL 100 s (two ticks), breaker window 1000 s (one
#: cooldown step crosses it), budget 1, threshold 2 (issue 26 item 4).
POLICY = gm.PolicyView(gpu_nodes=3, budget=1, breaker_threshold=2, breaker_window_s=1000.0,
                       one_per_pool=True, detector_cap=3, lease_ttl_s=100.0, pools=POOLS)
#: Clock steps, seconds: past the level persistence, past the cooldown / TTL / window,
#: past the 7-day ladder window.
CLOCKS = (("tick", 70.0), ("cooldown", 1800.0), ("week", 7 * 86400.0))
#: Sender clock offsets, seconds (ingest accepts up to 300 s ahead and stamps the control
#: plane's receipt time, which decides, I17): a level raise 5 min slow or fast (its
#: persistence is where a sender's clock could judge); an event fault (no persistence)
#: 5 min fast and a clear 5 min slow, one offset each: a second would double their
#: branching and change no safety decision.
SKEWS = (-300.0, 300.0)
EVENT_SKEWS = (300.0,)
CLEAR_SKEWS = (-300.0,)
#: Retry bound of a machine action, seconds (rails.action_retry_max_s's order).
RETRY_MAX_S = 300.0
LEVEL, EVENT = "gpu_lost::", "xid:79:"
#: Stages of the abstract repair that hold the node (cordoned, lease held).
HOLDING = ("draining", "acting")

#: Test-only defects of the world (each found by the checker; tests/model/test_fleet_model.py).
WORLD_DEFECTS: dict[str, str] = {
    "ledger_open_repair_skips_unleased": "the ledger's open-repair read lists a repair only "
    "once it holds a lease (its row written at cordon): a re-registered node entity reads "
    "'none' while its repair waits for approval or a lease, and starts a second one (I21)",
    "ledger_holders_skip_draining": "the ledger's guard state lists as holders only repairs "
    "acting on the machine, not one that cordoned and drains: a restarted guard rebuilds "
    "without it and grants a second lease beside it (budget, I21)",
}

#: Genuine findings of the composed world in the machines as they are (not planted):
#: name → what breaks. A violation that is one of them carries ``[known: NAME]``;
#: ``check(known=...)`` sets those aside in ``Result.known`` (their states are not
#: explored further) so the rest of the space is still checked; without ``known`` (the
#: CLI) they are violations. Remove an entry once its machine is fixed (the tests fail
#: while an entry is no longer found).
KNOWN_FINDINGS: dict[str, str] = {}
#: Fixed findings (kept for the record; each has a regression test):
#: ``repair_before_queued_clear`` — NodeMachine started a due repair while a clear of
#: that fault waited in its intake for its ledger write (rule zero); fixed in
#: ``workflows.lifecycle.node._evaluate`` (a queued clear of a due fault is weighed first).


# ---- the abstract repair (the swappable component) ----------------------------------
@dataclass(frozen=True)
class Repair:
    """One repair as the world runs it: ``stage`` awaiting_approval → requesting (lease
    asked) → draining (cordoned, drain out) → acting (machine action) → ended."""

    rid: str
    node: str
    action: Action
    automatic: bool
    stage: str
    action_state: ma.MachineActionState | None = None
    evidence_after: datetime | None = None  # a grant's reset_at (I23)
    ended: str = ""  # the terminal stage once ended


@dataclass(frozen=True)
class RStart:
    pass


@dataclass(frozen=True)
class RApprove:
    pass


@dataclass(frozen=True)
class RReject:
    pass


@dataclass(frozen=True)
class RCancel:
    pass


@dataclass(frozen=True)
class RLease:
    granted: bool
    reset_at: datetime | None


@dataclass(frozen=True)
class RDrained:
    pass


@dataclass(frozen=True)
class RAction:
    """An event for the repair's machine action."""

    ev: Any


REvent = RStart | RApprove | RReject | RCancel | RLease | RDrained | RAction


@dataclass(frozen=True)
class RCmd:
    """A repair's command: ``request_lease``, ``release_lease``, ``cordon``, ``uncordon``,
    ``drain``, ``action`` (``cmd``: a machine-action command), ``finished`` (``stage``)."""

    kind: Literal["request_lease", "release_lease", "cordon", "uncordon", "drain", "action",
                  "finished"]
    cmd: Any = None
    stage: str = ""


def _ma_cmds(r: Repair, cmds: list[ma.Command]) -> tuple[Repair, list[RCmd]]:
    out = [RCmd("action", cmd=c) for c in cmds]
    fin = next((c for c in cmds if isinstance(c, ma.Finish)), None)
    if fin is None:
        return r, out
    if fin.outcome == "failed":  # the node stays cordoned; the failed repair says so
        return replace(r, stage="ended", ended="failed"), [
            *out, RCmd("release_lease"), RCmd("finished", stage="failed")]
    stage = {"succeeded": "succeeded", "cancelled": "cancelled", "not_run": "failed"}[
        fin.outcome]
    return replace(r, stage="ended", ended=stage), [
        *out, RCmd("uncordon"), RCmd("release_lease"), RCmd("finished", stage=stage)]


def repair_step(r: Repair, ev: REvent, now: datetime, defects: frozenset[str]
                ) -> tuple[Repair, list[RCmd]]:
    """The abstract repair's decision for ``ev`` (a ``RepairMachine`` replaces it)."""
    if r.stage == "ended":
        return r, []
    if isinstance(ev, RStart):
        if r.automatic:
            return replace(r, stage="requesting"), [RCmd("request_lease")]
        return r, []
    if isinstance(ev, RApprove):
        if r.stage == "awaiting_approval":
            return replace(r, stage="requesting"), [RCmd("request_lease")]
        return r, []
    if isinstance(ev, RReject | RCancel):
        how = "rejected" if isinstance(ev, RReject) else "cancelled"
        if r.stage in ("awaiting_approval", "requesting"):
            return replace(r, stage="ended", ended=how), [
                RCmd("release_lease"), RCmd("finished", stage=how)]
        if r.stage == "draining":
            return replace(r, stage="ended", ended=how), [
                RCmd("uncordon"), RCmd("release_lease"), RCmd("finished", stage=how)]
        assert r.action_state is not None
        m, cmds = ma.step(r.action_state, ma.Cancel(by="oncall"), now, defects)
        return _ma_cmds(replace(r, action_state=m), list(cmds))
    if isinstance(ev, RLease):
        if r.stage == "requesting" and ev.granted:
            return replace(r, stage="draining", evidence_after=ev.reset_at), [
                RCmd("cordon"), RCmd("drain")]
        return r, []
    if isinstance(ev, RDrained):
        if r.stage != "draining":
            return r, []
        m0 = ma.new_state(r.action, f"{r.rid}/{r.action.value}/1", RETRY_MAX_S)
        m, cmds = ma.step(m0, ma.Start(), now, defects)
        return _ma_cmds(replace(r, stage="acting", action_state=m), list(cmds))
    if isinstance(ev, RAction):
        if r.stage != "acting" or r.action_state is None:
            return r, []
        m, cmds = ma.step(r.action_state, ev.ev, now, defects)
        return _ma_cmds(replace(r, action_state=m), list(cmds))
    raise AssertionError(f"event: {ev!r} is not a repair event")  # pragma: no cover


RepairStep = Callable[[Repair, REvent, datetime, frozenset[str]], tuple[Repair, list[RCmd]]]


# ---- the world ----------------------------------------------------------------------
@dataclass(frozen=True)
class NodeTruth:
    """One node's truth and what is out for it."""

    level: bool = False  # gpu_lost present (NVML sees fewer GPUs)
    boot: int = 0
    sent: int = 0  # reports sent (alert ids)
    gen: int = 0  # registrations: a re-registered entity's repair ids are its own
    read_out: bool = False  # the entity's ledger read (``ReadLedger``) is out
    probe_out: str = ""  # the repair id a ``ProbeRepair`` out asks about ("" none)
    timer_s: float | None = None
    cordon_repair: str = ""  # the repair whose cordon is on the node
    cordon_failed: bool = False  # ... left by a failed repair (its reason recorded)
    cordon_operator: bool = False
    #: control-plane receipt time of the current episode of each fault (I17 / rule zero)
    episode: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class World:
    now_s: float = 0.0
    automatic: bool = True  # consent: automatic, or every repair waits for a person
    nodes: tuple[NodeTruth, ...] = (NodeTruth(), NodeTruth(), NodeTruth())
    ledger_up: bool = True
    guard_read_out: bool = False
    ledger_breaker: bool = False
    #: automatic repairs' grant times (the ledger's automatic starts), by repair id
    granted_at: tuple[tuple[str, float], ...] = ()
    #: per machine-action key: the disruptive command sent (I16), the call out
    sent: tuple[tuple[str, int], ...] = ()
    out: tuple[tuple[str, str], ...] = ()  # repair id → "drain" / resume phase
    backoff: tuple[str, ...] = ()  # repair ids whose back-off timer runs
    stale: tuple[str, ...] = ()  # repairs that waited through a breaker reset
    pre_reset: tuple[str, ...] = ()  # repairs counted before the last reset


@dataclass
class Fleet:
    """The machines' states beside the world (mutable while one event is executed)."""

    nodes: dict[str, nm.NodeState]
    guard: gm.GuardState
    repairs: dict[str, Repair]
    w: World


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    violations: list[tuple[str, list[str]]] = field(default_factory=list)
    #: violations that are all findings named in ``check(known=...)``
    known: list[tuple[str, list[str]]] = field(default_factory=list)
    per_depth: list[tuple[int, int, int, float]] = field(default_factory=list)

    def line(self) -> str:
        return (f"states={self.states} transitions={self.transitions} depth={self.depth} "
                f"violations={len(self.violations)} seconds={self.seconds:.2f}")


def _ix(node: str) -> int:
    return NODES.index(node)


def _put(t: tuple[tuple[str, Any], ...], k: str, v: Any) -> tuple[tuple[str, Any], ...]:
    d = dict(t)
    if v is None:
        d.pop(k, None)
    else:
        d[k] = v
    return tuple(sorted(d.items()))


def _set_node(w: World, node: str, **kw: Any) -> World:
    i = _ix(node)
    return replace(w, nodes=(*w.nodes[:i], replace(w.nodes[i], **kw), *w.nodes[i + 1:]))


def _now(w: World) -> datetime:
    return T0 + timedelta(seconds=w.now_s)


#: De-duplication digest (:func:`~workflows.lifecycle.node.seen_digest`) → the alert id
#: it was taken from, for every alert the world made: a node's ``seen`` is hashed as the
#: ids themselves, which the ``a1``↔``a2`` mirror can swap (digests it cannot).
_SEEN_IDS: dict[str, str] = {}


def _alert(node: str, key: str, active: bool, w: World, skew: float) -> Alert:
    nt = w.nodes[_ix(node)]
    kind, code = ("gpu_lost", None) if key == LEVEL else ("xid", 79)
    alert_id = f"{node}/{key}{'r' if active else 'c'}{nt.sent}"
    _SEEN_IDS.setdefault(nm.seen_digest(alert_id), alert_id)
    return Alert(
        alert_id=alert_id, cluster="c", node=node,
        kind=kind, code=code, severity=Severity.critical, summary=kind, level=key == LEVEL,
        active=active, actionable=True, action=Action.power_cycle,
        evidence={"boot_id": f"{node}-b{nt.boot}"},
        observed_at=_now(w) + timedelta(seconds=skew), received_at=_now(w))


class World_:
    """Executes commands of the machines on a :class:`Fleet` (one event's cascade)."""

    def __init__(self, f: Fleet, defects: frozenset[str], world_defects: frozenset[str],
                 repair: RepairStep) -> None:
        self.f, self.defects, self.wd, self.repair = f, defects, world_defects, repair
        self.bad: list[str] = []
        #: per node, events waiting while the entity decides one (a workflow takes one
        #: event at a time: an answer or a message commanded meanwhile comes after it)
        self.node_q: dict[str, deque[nm.Event]] = {}

    # -- guard ------------------------------------------------------------------------
    def guard(self, ev: gm.Event) -> None:
        todo: deque[gm.Event] = deque([ev])
        while todo:
            e = todo.popleft()
            f = self.f
            was_open, reset_at = f.guard.breaker_open, f.guard.reset_at
            counted = f.guard.counted
            g, cmds = gm.step(f.guard, e, _now(f.w), self.defects)
            f.guard = g
            if g.reset_at != reset_at:  # a reset applied in this step
                stale = set(f.w.stale) | ({r.rid for r in f.repairs.values()
                                           if r.stage == "requesting"} if was_open else set())
                pre = set(f.w.pre_reset) | {c.repair_id for c in counted}
                f.w = replace(f.w, stale=tuple(sorted(stale)), pre_reset=tuple(sorted(pre)))
            for c in cmds:
                if isinstance(c, gm.LoadPolicy):
                    todo.append(gm.PolicyRead(view=POLICY))  # answered in the same step
                elif isinstance(c, gm.ReadLedger):
                    f.w = replace(f.w, guard_read_out=True)
                elif isinstance(c, gm.WriteAlert) and c.alert.kind == gm.BREAKER_KIND:
                    f.w = replace(f.w, ledger_breaker=c.alert.active)
                elif isinstance(c, gm.ContinueAsNew):
                    f.guard = gm.GuardState.model_validate_json(f.guard.model_dump_json())
                    todo.append(gm.Started(fresh=False))
                elif isinstance(c, gm.SendLease):
                    r = f.repairs.get(c.reply.repair_id)
                    if r is None or r.stage == "ended":
                        todo.append(gm.ReplyUndeliverable(repair_id=c.reply.repair_id,
                                                          purpose=c.purpose))
                        continue
                    if c.reply.granted and r.stage == "requesting" and c.purpose == "reply":
                        if f.guard.breaker_open and r.automatic:
                            self.bad.append("breaker: an automatic new repair granted "
                                            "while the breaker is open")
                        if f.guard.status != gm.Status.serving or f.guard.rebuilt_at is None:
                            self.bad.append("I21: a lease granted before the guard read "
                                            "the ledger")
                        if r.rid in f.w.stale and c.reply.reset_at is None:
                            self.bad.append(f"I23: {r.rid} waited through a breaker reset "
                                            "and acts on pre-reset evidence")
                        if r.automatic:
                            f.w = replace(f.w, granted_at=_put(f.w.granted_at, r.rid,
                                                               f.w.now_s))
                    self.to_repair(r.rid, RLease(granted=c.reply.granted,
                                                 reset_at=c.reply.reset_at))

    # -- repairs ----------------------------------------------------------------------
    def to_repair(self, rid: str, ev: REvent) -> None:
        f = self.f
        r0 = f.repairs[rid]
        r, cmds = self.repair(r0, ev, _now(f.w), self.defects)
        f.repairs[rid] = r
        for c in cmds:
            self.repair_cmd(r, c)

    def repair_cmd(self, r: Repair, c: RCmd) -> None:
        f = self.f
        if c.kind == "request_lease":
            req = LeaseRequest(repair_id=r.rid, workflow_id=f"w-{r.rid}", cluster="c",
                               node=r.node, node_pool=POOLS[r.node], automatic=r.automatic)
            self.guard(gm.Request(req=req))
        elif c.kind == "release_lease":
            f.w = replace(f.w, out=_put(f.w.out, r.rid, None),
                          backoff=tuple(x for x in f.w.backoff if x != r.rid))
            self.guard(gm.Release(rel=LeaseRelease(repair_id=r.rid, outcome=r.ended)))
        elif c.kind == "cordon":
            f.w = _set_node(f.w, r.node, cordon_repair=r.rid, cordon_failed=False)
        elif c.kind == "uncordon":
            nt = f.w.nodes[_ix(r.node)]
            if nt.cordon_repair == r.rid:
                f.w = _set_node(f.w, r.node, cordon_repair="", cordon_failed=False)
        elif c.kind == "drain":
            f.w = replace(f.w, out=_put(f.w.out, r.rid, "drain"))
        elif c.kind == "finished":
            nt = f.w.nodes[_ix(r.node)]
            if c.stage == "failed" and nt.cordon_repair == r.rid:
                f.w = _set_node(f.w, r.node, cordon_failed=True)
            if c.stage == "succeeded":
                # the action fixed the machine: a new boot, its faults gone
                f.w = _set_node(f.w, r.node, level=False, boot=nt.boot + 1, episode=())
            self.to_node(r.node, nm.RepairFinishedEv(repair_id=r.rid, stage=Stage(c.stage),
                                                     at=_now(f.w)))
        elif c.kind == "action":
            mc = c.cmd
            if isinstance(mc, ma.RunActivity):
                if dict(f.w.out).get(r.rid) not in (None, "drain"):
                    self.bad.append("one call at a time: a second machine activity while "
                                    "one was out")
                f.w = replace(f.w, out=_put(f.w.out, r.rid, mc.resume_phase))
            elif isinstance(mc, ma.StartTimer):
                f.w = replace(f.w, backoff=tuple(sorted({*f.w.backoff, r.rid})))

    # -- nodes ------------------------------------------------------------------------
    def to_node(self, node: str, ev: nm.Event) -> None:
        """Deliver ``ev`` to the node entity; one already deciding takes it after the
        event it decides (and after what that event's commands were answered with)."""
        q = self.node_q.get(node)
        if q is not None:
            q.append(ev)
            return
        q = self.node_q[node] = deque([ev])
        try:
            while q:
                f = self.f
                known = f.nodes[node].reconcile == nm.Reconcile.done
                m, cmds = nm.step(f.nodes[node], q.popleft(), _now(f.w), self.defects)
                f.nodes[node] = m
                self.node_cmds(node, cmds, known)
        finally:
            del self.node_q[node]

    def node_cmds(self, node: str, cmds: list[nm.Command], known: bool = False) -> None:
        """Execute a node entity's commands in order, as ``NodeWorkflow`` does. The
        ledger write of an alert, the policy read and an ``attach_alert`` signal are
        answered at once (the entity waits for each; they interleave with nothing it
        decides on), and so is the read of the node's open repair an entity that knew its
        ledger (``known``) makes before a start (every repair of this world is a node
        entity's, so the one it finds is its own); the first ledger read and a repair
        probe stay out until an event answers them; replies, notices, details and the ledger's close-out change no truth the
        invariants read (the world's ledger is the repairs themselves)."""
        f = self.f
        for c in cmds:
            if isinstance(c, nm.RecordAlert):
                self.to_node(node, nm.AlertRecorded(alert_id=c.alert.alert_id,
                                                    ok=f.w.ledger_up))
            elif isinstance(c, nm.LoadPolicy):
                self.to_node(node, _policy(node))
            elif isinstance(c, nm.AttachAlert):
                r = f.repairs.get(c.repair_id)
                landed = r is not None and r.stage != "ended"
                self.to_node(node, nm.AttachDone(alert_id=c.alert.alert_id, ok=landed))
            elif isinstance(c, nm.StartRepair):
                self.start_repair(node, c)
            elif isinstance(c, nm.ReadLedger) and known:
                self.to_node(node, _ledger_open(f, node, self.wd) if f.w.ledger_up
                             else nm.LedgerUnavailable(message="connection refused"))
            elif isinstance(c, nm.ReadLedger):
                f.w = _set_node(f.w, node, read_out=True)
            elif isinstance(c, nm.ProbeRepair):
                f.w = _set_node(f.w, node, probe_out=c.repair_id)
            elif isinstance(c, nm.SetTimer):
                f.w = _set_node(f.w, node, timer_s=None if c.at is None
                                else (c.at - T0).total_seconds())
            elif isinstance(c, nm.ReleaseLease):
                self.guard(gm.Release(rel=LeaseRelease(repair_id=c.repair_id,
                                                       outcome=c.outcome)))

    def start_repair(self, node: str, c: nm.StartRepair) -> None:
        f = self.f
        open_ = [r.rid for r in f.repairs.values() if r.node == node and r.stage != "ended"]
        if open_:
            self.bad.append(f"one repair per node: {c.repair_id} started on {node} while "
                            f"{open_[0]} is open (I21)")
        nt = f.w.nodes[_ix(node)]
        ep = dict(nt.episode)
        ok = False
        for k in c.fault_keys:
            persist = RAILS.persistence_s if k == LEVEL else 0.0
            if k in ep and f.w.now_s - ep[k] >= persist:
                ok = True
        if not ok:
            queued_clear = any(not a.active and nm.fault_key(a) in c.fault_keys
                               for a in f.nodes[node].intake)
            self.bad.append(f"I17/rule zero: {c.repair_id} on {node} for {c.fault_keys} "
                            "without a fault that outlived its persistence by receipt time"
                            + (" [known: repair_before_queued_clear]" if queued_clear
                               else ""))
        if c.action not in ma.PHASES:
            return
        f.repairs[c.repair_id] = Repair(rid=c.repair_id, node=node, action=c.action,
                                        automatic=f.w.automatic, stage="awaiting_approval")
        self.to_node(node, nm.RepairStarted(repair_id=c.repair_id))
        self.to_repair(c.repair_id, RStart())


def _policy(node: str) -> nm.PolicyLoaded:
    """``load_policy``'s answer for ``node``: the model's catalogue and rails, and the
    node's configured machine and pool (a re-registration keeps the machine)."""
    return nm.PolicyLoaded(catalogue=CATALOGUE, rails=RAILS, machine_id=f"m-{node}",
                           node_pool=POOLS[node])


def _ledger_open(f: Fleet, node: str, wd: frozenset[str]) -> nm.LedgerRead:
    for r in f.repairs.values():
        if r.node != node or r.stage == "ended":
            continue
        if "ledger_open_repair_skips_unleased" in wd and r.stage not in HOLDING:
            continue
        return nm.LedgerRead(repair_id=r.rid, running=True, stage="repairing",
                             status="running")
    return nm.LedgerRead()


def _ledger_guard(f: Fleet, wd: frozenset[str]) -> gm.LedgerView:
    holding = ("acting",) if "ledger_holders_skip_draining" in wd else HOLDING
    holders = [gm.HeldRepair(repair_id=r.rid, node=r.node, workflow_id=f"w-{r.rid}",
                             automatic=r.automatic)
               for r in f.repairs.values() if r.stage in holding]
    window = POLICY.breaker_window_s
    auto = [(rid, T0 + timedelta(seconds=t)) for rid, t in f.w.granted_at
            if f.w.now_s - t <= window]
    return gm.LedgerView(holders=holders, automatic=auto, breaker_open=f.w.ledger_breaker,
                         tripped_at=T0 if f.w.ledger_breaker else None,
                         tripped_reason="tripped" if f.w.ledger_breaker else "")


Step = Callable[[World_], None]


def _events(f: Fleet, symmetric: bool) -> list[tuple[str, Step]]:
    """(label, action on the world) of every event enabled in ``f``; ``symmetric``: ``f``
    is its own ``a1``↔``a2`` mirror image, so ``a2``'s events are left out (they reach
    the mirror images of ``a1``'s)."""
    w = f.w
    evs: list[tuple[str, Step]] = []
    for node in NODES:
        if node == "a2" and symmetric:
            continue  # symmetry: a2's events lead to the mirror images of a1's
        nt = w.nodes[_ix(node)]
        if not nt.level:
            for sk in SKEWS:
                evs.append((f"{node}: gpu_lost(skew={sk:+g})", _raise(node, LEVEL, sk)))
        else:
            for sk in CLEAR_SKEWS:
                evs.append((f"{node}: gpu_lost cleared(skew={sk:+g})", _clear(node, sk)))
        for sk in EVENT_SKEWS:
            evs.append((f"{node}: xid79(skew={sk:+g})", _raise(node, EVENT, sk)))
        evs.append((f"{node}: re-registered", _reregister(node)))
        evs.append((f"{node}: operator {'uncordon' if nt.cordon_operator else 'cordon'}",
                    _operator(node)))
        if nt.read_out:
            evs.append((f"{node}: ledger answers", _node_read(node)))
        if nt.probe_out:
            evs.append((f"{node}: probe answers", _node_probe(node)))
        if nt.timer_s is not None:
            evs.append((f"{node}: timer", _node_timer(node)))
    for rid, r in sorted(f.repairs.items()):
        if r.stage == "ended":
            continue
        if r.stage == "awaiting_approval":
            evs.append((f"approve {rid}", _to_repair(rid, RApprove())))
            evs.append((f"reject {rid}", _to_repair(rid, RReject())))
        evs.append((f"cancel {rid}", _to_repair(rid, RCancel())))
        out = dict(w.out).get(rid)
        if out == "drain":
            evs.append((f"{rid}: drained", _drained(rid)))
        elif out is not None:
            for label, ev in _outcomes(r.action, out):
                evs.append((f"{rid}: {label}", _act(rid, ev)))
        if rid in w.backoff:
            evs.append((f"{rid}: back-off timer", _backoff(rid)))
    if w.guard_read_out:
        evs.append(("guard: ledger answers", _guard_read))
    now = _now(w)
    for name, at in sorted(f.guard.timers.items()):
        if at <= now:
            evs.append((f"guard: timer {name}", _guard_timer(name)))
    evs.append(("ledger down" if w.ledger_up else "ledger back", _ledger_toggle))
    evs.append(("breaker reset", _reset))
    evs.append(("worker restart", _worker_restart))
    evs.append(("continue-as-new", _continue_as_new))
    evs.append(("guard restart", _guard_restart))
    for label, dt in CLOCKS:
        evs.append((f"clock +{label}", _clock(dt)))
    return evs


def _outcomes(action: Action, resume: str
              ) -> list[tuple[str, ma.ActivityOk | ma.ActivityFailed | ma.BmcReadFailed]]:
    phases = ma.PHASES[action]
    r = ma.phase_index(action, resume)
    out: list[tuple[str, ma.ActivityOk | ma.ActivityFailed | ma.BmcReadFailed]] = [("action ok", ma.ActivityOk(phase=phases[-1]))]
    if r < len(phases) - 1:
        out.append(("bmc read fails", ma.BmcReadFailed(phase=phases[-2],
                                                       message="BmcUnavailable")))
        out.append(("action fails for good", ma.ActivityFailed(
            outcome="permanent", phase=resume, message="auth refused")))
    return out


def _raise(node: str, key: str, skew: float) -> Step:
    def go(x: World_) -> None:
        f = x.f
        nt = f.w.nodes[_ix(node)]
        a = _alert(node, key, True, f.w, skew)
        ep = dict(nt.episode)
        if key not in ep:
            ep[key] = f.w.now_s
        f.w = _set_node(f.w, node, sent=nt.sent + 1, episode=tuple(sorted(ep.items())),
                        level=nt.level or key == LEVEL)
        x.to_node(node, nm.AlertDelivered(alert=a))
    return go


def _clear(node: str, skew: float) -> Step:
    def go(x: World_) -> None:
        f = x.f
        nt = f.w.nodes[_ix(node)]
        a = _alert(node, LEVEL, False, f.w, skew)
        f.w = _set_node(f.w, node, sent=nt.sent + 1, level=False,
                        episode=_put(nt.episode, LEVEL, None))
        x.to_node(node, nm.AlertDelivered(alert=a))
    return go


def _begin(x: World_, node: str, m: nm.NodeState) -> None:
    x.f.nodes[node] = m
    x.f.w = _set_node(x.f.w, node, read_out=False, probe_out="", timer_s=None)
    x.to_node(node, nm.Begin())


def _reregister(node: str) -> Step:
    def go(x: World_) -> None:
        # a fresh entity: everything it knew is gone; an agent re-sends its level state
        gen = x.f.w.nodes[_ix(node)].gen + 1
        x.f.w = _set_node(x.f.w, node, gen=gen)
        _begin(x, node, nm.new_state("c", node, f"{node}-{gen}-", RAILS))
        nt = x.f.w.nodes[_ix(node)]
        x.f.w = _set_node(x.f.w, node, episode=tuple(
            (k, t) for k, t in nt.episode if k == LEVEL and nt.level))
        if nt.level:
            _raise(node, LEVEL, 0.0)(x)
    return go


def _operator(node: str) -> Step:
    def go(x: World_) -> None:
        nt = x.f.w.nodes[_ix(node)]
        x.f.w = _set_node(x.f.w, node, cordon_operator=not nt.cordon_operator)
    return go


def _node_read(node: str) -> Step:
    """The entity's ledger read answered: the node's open repair (or none), or the
    ledger unavailable."""
    def go(x: World_) -> None:
        f = x.f
        f.w = _set_node(f.w, node, read_out=False)
        if not f.w.ledger_up:
            x.to_node(node, nm.LedgerUnavailable(message="connection refused"))
            return
        x.to_node(node, _ledger_open(f, node, x.wd))
    return go


def _node_probe(node: str) -> Step:
    """The entity's probe of its open repair answered from the ledger: running while the
    repair has not ended (an ended one wrote its own end: ``completed``); failing while
    the ledger is down."""
    def go(x: World_) -> None:
        f = x.f
        rid = f.w.nodes[_ix(node)].probe_out
        f.w = _set_node(f.w, node, probe_out="")
        if not f.w.ledger_up:
            x.to_node(node, nm.RepairProbed(repair_id=rid, ok=False))
            return
        r = f.repairs.get(rid)
        running = r is not None and r.stage != "ended"
        x.to_node(node, nm.RepairProbed(repair_id=rid, running=running,
                                        status="running" if running else "completed"))
    return go


def _node_timer(node: str) -> Step:
    def go(x: World_) -> None:
        f = x.f
        at = f.w.nodes[_ix(node)].timer_s
        assert at is not None
        f.w = _set_node(replace(f.w, now_s=max(f.w.now_s, at)), node, timer_s=None)
        x.to_node(node, nm.TimerFired())
    return go


def _to_repair(rid: str, ev: REvent) -> Step:
    def go(x: World_) -> None:
        x.to_repair(rid, ev)
    return go


def _drained(rid: str) -> Step:
    def go(x: World_) -> None:
        x.f.w = replace(x.f.w, out=_put(x.f.w.out, rid, None))
        x.to_repair(rid, RDrained())
    return go


def _act(rid: str, ev: ma.ActivityOk | ma.ActivityFailed | ma.BmcReadFailed) -> Step:
    def go(x: World_) -> None:
        f = x.f
        r = f.repairs[rid]
        resume = dict(f.w.out)[rid]
        assert r.action_state is not None
        key = r.action_state.key
        lo, hi = ma.phase_index(r.action, resume), ma.phase_index(r.action, ev.phase)
        if ma.phase_index(r.action, ma.DISRUPTIVE[r.action]) in range(lo + 1, hi + 1):
            f.w = replace(f.w, sent=_put(f.w.sent, key, dict(f.w.sent).get(key, 0) + 1))
            if dict(f.w.sent)[key] > 1:
                x.bad.append(f"I16: {key} sent its disruptive command twice")
        f.w = replace(f.w, out=_put(f.w.out, rid, None))
        x.to_repair(rid, RAction(ev))
    return go


def _backoff(rid: str) -> Step:
    def go(x: World_) -> None:
        x.f.w = replace(x.f.w, backoff=tuple(b for b in x.f.w.backoff if b != rid))
        x.to_repair(rid, RAction(ma.TimerFired()))
    return go


def _guard_read(x: World_) -> None:
    x.f.w = replace(x.f.w, guard_read_out=False)
    if x.f.w.ledger_up:
        x.guard(gm.LedgerRead(view=_ledger_guard(x.f, x.wd)))
    else:
        x.guard(gm.LedgerUnavailable(message="connection refused"))


def _guard_timer(name: str) -> Step:
    def go(x: World_) -> None:
        x.guard(gm.TimerFired(name=name))
    return go


def _ledger_toggle(x: World_) -> None:
    x.f.w = replace(x.f.w, ledger_up=not x.f.w.ledger_up)


def _reset(x: World_) -> None:
    x.guard(gm.ResetBreaker(sig=ResetBreakerSignal(by="oncall")))


def _worker_restart(x: World_) -> None:
    f = x.f
    # calls out are lost: a machine action resumes from its carried phase
    for rid, out in list(f.w.out):
        if out == "drain":
            continue  # the drain activity is retried by Temporal: still out
        f.w = replace(f.w, out=_put(f.w.out, rid, None))
        x.to_repair(rid, RAction(ma.WorkerRestart(phase=out)))
    for node in NODES:  # node entities restart from their carried state
        _begin(x, node, nm.carry(f.nodes[node]))
    # the guard's ledger read is an activity: Temporal retries it, it stays out


def _continue_as_new(x: World_) -> None:
    f = x.f
    for node in NODES:
        _, cmds = nm.step(f.nodes[node], nm.HistoryFull(), _now(f.w), x.defects)
        cont = [c for c in cmds if isinstance(c, nm.ContinueAsNew)]
        if cont:  # else deferred (an alert being decided, a read out): nothing changes
            _begin(x, node, cont[0].state)
    x.guard(gm.HistoryLong())


def _guard_restart(x: World_) -> None:
    x.f.guard = gm.new_state("c", POLICY)
    x.f.w = replace(x.f.w, guard_read_out=False, stale=(), pre_reset=())
    x.guard(gm.Started(fresh=True))


def _clock(dt: float) -> Step:
    def go(x: World_) -> None:
        x.f.w = replace(x.f.w, now_s=x.f.w.now_s + dt)
    return go


# ---- invariants ---------------------------------------------------------------------
def check_invariants(f: Fleet) -> list[str]:
    bad: list[str] = []
    holding = [r for r in f.repairs.values() if r.stage in HOLDING]
    if len(holding) > POLICY.budget:
        bad.append(f"budget: {len(holding)} repairs hold a node "
                   f"({', '.join(r.rid for r in holding)}; budget {POLICY.budget})")
    pools = [POOLS[r.node] for r in holding]
    if len(set(pools)) < len(pools):
        bad.append("pool: two repairs hold nodes of one pool")
    if len(f.guard.leases) > POLICY.budget:
        bad.append(f"guard: {len(f.guard.leases)} leases beyond the budget")
    per_node: dict[str, int] = {}
    for r in f.repairs.values():
        if r.stage != "ended":
            per_node[r.node] = per_node.get(r.node, 0) + 1
    if any(n > 1 for n in per_node.values()):
        bad.append("one repair per node: two open repairs on one node")
    for c in f.guard.counted:
        if c.in_window and c.repair_id in f.w.pre_reset:
            bad.append(f"I23: {c.repair_id} counted before the reset is counted again")
    for node, nt in zip(NODES, f.w.nodes, strict=True):
        rid = nt.cordon_repair
        if rid and not nt.cordon_failed:
            holder = f.repairs.get(rid)
            if holder is None or holder.stage not in HOLDING:
                bad.append(f"cordon: {node} left cordoned by {rid} without a reason")
    return bad


# ---- canonical states (symmetry reduction) ------------------------------------------
#: Not hashed: constant once read (``rails``, ``catalogue``: ``policy_at`` tells whether
#: and when it was read), read by no decision (``details``), or hashed as its alert ids
#: (``seen``: :func:`_node_text`).
_NODE_EXCLUDE = {"rails", "details", "catalogue", "seen"}
_GUARD_EXCLUDE: Any = {"errors": True, "expired": True, "refused_total": True,
                      "policy": {"pools"}}  # pools: constant (POLICY)


def _node_text(m: nm.NodeState, nt: NodeTruth) -> str:
    seen = [(_SEEN_IDS.get(d, d), b) for d, b in m.seen.items()]  # order kept (eviction)
    return m.model_dump_json(exclude=_NODE_EXCLUDE) + repr(seen) + repr(nt)


def _repair_text(r: Repair) -> str:
    ma_text = (r.action_state.model_dump_json(exclude={"detail"})
               if r.action_state is not None else "")
    return (f"{r.rid}|{r.node}|{r.action.value}|{r.automatic}|{r.stage}|{r.ended}|"
            f"{r.evidence_after}|{ma_text}")


def _world_text(w: World) -> str:
    return repr((w.now_s, w.automatic, w.ledger_up, w.guard_read_out, w.ledger_breaker,
                 w.granted_at, w.sent, w.out, w.backoff, w.stale, w.pre_reset))


def _swap(text: str) -> str:
    return text.replace("a1", "\0").replace("a2", "a1").replace("\0", "a2")


def key(f: Fleet) -> tuple[str, bool]:
    """Canonical text of the fleet (the smaller of it and its ``a1``↔``a2`` mirror: the
    two nodes of pool A are interchangeable) and whether it is its own mirror image.

    Each part is serialised on its own (pydantic's JSON for the machines, without the
    fields no decision reads: ``rails``, ``catalogue``, ``details``, the guard's ``errors`` /
    ``expired`` / ``refused_total``, a machine action's ``detail``); the mirror swaps the
    names in every part and puts the parts of ``a1`` and ``a2`` in each other's place
    (a part keyed by node or repair id is ordered by its swapped name)."""
    nodes = {n: _node_text(f.nodes[n], f.w.nodes[i]) for i, n in enumerate(NODES)}
    guard = f.guard.model_dump_json(exclude=_GUARD_EXCLUDE)
    repairs = {rid: _repair_text(r) for rid, r in f.repairs.items()}
    world = _world_text(f.w)
    text = "\n".join([nodes["a1"], nodes["a2"], nodes["b1"], guard,
                       *(repairs[k] for k in sorted(repairs)), world])
    mirrored = "\n".join([_swap(nodes["a2"]), _swap(nodes["a1"]), _swap(nodes["b1"]),
                           _swap(guard),
                           *(_swap(repairs[k]) for k in sorted(repairs, key=_swap)),
                           _swap(world)])
    return min(text, mirrored), text == mirrored


def _copy(f: Fleet) -> Fleet:
    return Fleet(nodes=dict(f.nodes), guard=f.guard, repairs=dict(f.repairs), w=f.w)


def initial(automatic: bool, defects: frozenset[str] = frozenset(),
            world_defects: frozenset[str] = frozenset(),
            repair: RepairStep = repair_step) -> Fleet:
    """Three fresh node entities that read the (empty) ledger, and a guard that started,
    read its policy and rebuilt from the ledger: the fleet at rest."""
    f = Fleet(nodes={}, guard=gm.new_state("c", POLICY), repairs={},
              w=World(automatic=automatic))
    x = World_(f, defects, world_defects, repair)
    x.guard(gm.Started(fresh=True))
    _guard_read(x)
    for node in NODES:
        _begin(x, node, nm.new_state("c", node, f"{node}-0-", RAILS))
        _node_read(node)(x)
    assert f.guard.status == gm.Status.serving, f.guard.status
    assert not x.bad, x.bad
    return f


def check(depth: int, defects: frozenset[str] = frozenset(),
          world_defects: frozenset[str] = frozenset(), stop_at_first: bool = False,
          repair: RepairStep = repair_step, report: Callable[[str], None] | None = None,
          consents: tuple[bool, ...] = (True, False),
          known: frozenset[str] = frozenset()) -> Result:
    """Explore every event sequence of length ≤ ``depth`` from the fleet at rest, for
    each of ``consents`` (True: automatic consent; False: every repair waits for a
    person's approval). ``defects`` re-introduces the machines' named defects,
    ``world_defects`` the world's (:data:`WORLD_DEFECTS`); ``repair`` is the repair
    component (default :func:`repair_step`); ``report`` is called with a line per depth
    (states, transitions, seconds so far); a violation that is only findings named in
    ``known`` (:data:`KNOWN_FINDINGS`) goes to ``Result.known`` instead. Raises
    ``ValueError`` naming an unknown world defect or known finding."""
    unknown = set(world_defects) - set(WORLD_DEFECTS)
    if unknown:
        raise ValueError(f"world_defects: unknown {sorted(unknown)} (known: "
                         f"{sorted(WORLD_DEFECTS)})")
    if set(known) - set(KNOWN_FINDINGS):
        raise ValueError(f"known: unknown {sorted(set(known) - set(KNOWN_FINDINGS))} "
                         f"(known findings: {sorted(KNOWN_FINDINGS)})")
    res = Result(depth=depth)
    t0 = time.monotonic()
    starts = [initial(a, defects, world_defects, repair) for a in consents]
    keys = [key(f) for f in starts]
    seen = {k for k, _ in keys}
    frontier: list[tuple[Fleet, bool, list[str]]] = [
        (f, sym, []) for f, (_, sym) in zip(starts, keys, strict=True)]
    for d in range(1, depth + 1):
        nxt: list[tuple[Fleet, bool, list[str]]] = []
        for f, symmetric, trace in frontier:
            for label, go in _events(f, symmetric):
                f1 = _copy(f)
                x = World_(f1, defects, world_defects, repair)
                go(x)
                res.transitions += 1
                t1 = [*trace, label]
                bad = [*x.bad, *check_invariants(f1)]
                if bad and all(any(f"[known: {n}]" in b for n in known) for b in bad):
                    res.known.append(("fleet: " + "; ".join(dict.fromkeys(bad)), t1))
                    continue
                if bad:
                    res.violations.append(("fleet: " + "; ".join(dict.fromkeys(bad)), t1))
                    if stop_at_first:
                        res.states = len(seen)
                        res.seconds = time.monotonic() - t0
                        return res
                    continue
                k, sym = key(f1)
                if k not in seen:
                    seen.add(k)
                    nxt.append((f1, sym, t1))
        frontier = nxt
        res.per_depth.append((d, len(seen), res.transitions, time.monotonic() - t0))
        if report is not None:
            report(f"fleet depth={d}: states={len(seen)} transitions={res.transitions} "
                   f"seconds={time.monotonic() - t0:.2f}")
        if not frontier:
            break
    res.states = len(seen)
    res.seconds = time.monotonic() - t0
    return res


def replay(labels: list[str], automatic: bool, defects: frozenset[str] = frozenset(),
           world_defects: frozenset[str] = frozenset(),
           repair: RepairStep = repair_step) -> tuple[Fleet, list[str]]:
    """Run the event sequence ``labels`` (as a trace prints them) from the fleet at rest;
    returns the fleet after it and the first step's violations (empty: none broke).
    Raises ``ValueError`` naming a label not enabled where it comes."""
    f = initial(automatic, defects, world_defects, repair)
    for i, label in enumerate(labels):
        evs = dict(_events(f, symmetric=False))
        if label not in evs:
            raise ValueError(f"labels[{i}]: {label!r} is not enabled here "
                             f"(enabled: {sorted(evs)})")
        f1 = _copy(f)
        x = World_(f1, defects, world_defects, repair)
        evs[label](x)
        bad = [*x.bad, *check_invariants(f1)]
        if bad:
            return f1, bad
        f = f1
    return f, []
