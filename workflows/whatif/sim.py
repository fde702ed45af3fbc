"""The what-if driver: recorded alerts through the production lifecycle machines under a
simulated clock (issue 31 item 1).

:func:`replay` runs, per node, the :class:`~workflows.lifecycle.node.NodeMachine`
(``workflows.lifecycle.node.step``), per cluster the guard machine
(``workflows.lifecycle.guard.step``) and per repair the repair machine
(``workflows.lifecycle.repair.step``, whose machine action is
``workflows.lifecycle.machine_action``): the very ``step`` functions the workflows
interpret. Only the world is simulated, each command answered as the shells' activities
would answer it, in the order commanded (a workflow takes one event at a time: an answer
commanded meanwhile comes after the event being decided, as ``tests/model/fleet_world``
delivers them):

- the ledger: alert writes succeed; reads answer from what this replay did (the node's
  open repair, the attempts it recorded, the machines it removed); a fresh guard reads an
  empty ledger (nothing open when the window starts);
- the policy: ``load_policy`` answers the policy under test with the node's machine and
  pool from :class:`Facts`;
- maintenance: a repair about to cordon a node that one of the ledger's windows
  (:attr:`Facts.windows`) covers waits for the window's end, as the workflow does;
- the scheduler: cordon is this repair's, the node is idle after the median idle wait,
  the drain completes after the median drain, the node is healthy after the median
  rejoin (:class:`Durations`);
- the machine action: its ``k``-th attempt of action ``A`` on a node ends as the
  ledger's ``k``-th recorded attempt of ``A`` on that node ended (``failed``: a permanent
  failure after the disruptive command), else it succeeds after the median duration of
  ``A``; a recurrence is what the ledger's alerts say (every recorded alert is replayed
  at its time, whatever the policy did before it);
- a person: a repair waiting for approval is approved after the median approval wait the
  ledger measured (:attr:`Durations.approval_s`; ``None``: nobody approves, it ends as the
  consent's ``approval_timeout_s`` says); a tripped breaker is reset after the median
  trip-to-reset time of the ledger's breaker alerts (``breaker_reset_s``; ``None``: never,
  it stays open to the end of the replay, :data:`HORIZON_S` past the window);
- failure domains: each node's domains are :attr:`Facts.domains` (the configuration's
  ``nodes[].failure_domain``; the scheduler's labels and features are not read offline),
  with the policy's ``domains.threshold`` and ``domains.window_s``; a domain hold the
  guard opens is released by a person after the median hold-to-release time of the
  ledger's ``failure_domain`` alerts (``domain_release_s``; ``None``: never, the domain's
  automatic repairs wait to the end of the replay).

Alert times: the control plane's receipt time ``received_at`` where an alert carries it,
else ``observed_at`` (the ledger keeps the receipt time of alerts recorded since
migration 0014; for older rows, ingest rejected senders more than 300 s ahead, so the two
agree to within that).

Deterministic: events are ordered by (time, sequence number), every collection is
iterated in insertion or sorted order, nothing reads a clock or a random source.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from workflows.config import PolicyConfig
from workflows.leases import LeaseRelease, LeaseRequest, ReleaseDomainSignal, ResetBreakerSignal
from workflows.lifecycle import guard as gm
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle import node as nm
from workflows.lifecycle import repair as rm
from workflows.maintenance import MaintenanceWindow, covering_last
from workflows.models import Action, Alert, AttemptRecord, Requester, Stage
from workflows.policy import breaker_threshold, concurrency_budget

#: Stage durations assumed where the ledger measured none, seconds: idle at once, drain
#: 60 s, action 600 s (a power cycle's boot), rejoin 120 s (the node's health re-read
#: every ``rails.rejoin_poll_s`` 30 s, a few polls). Stated in the output.
DEFAULT_DURATIONS_S: dict[str, float] = {"waiting_for_idle": 0.0, "draining": 60.0,
                                         "repairing": 600.0, "joining": 120.0}
#: The replay runs this long past the window's end (or its last alert), seconds, so that
#: repairs started near the end can finish: 3 days, the default
#: ``consent.approval_timeout_s`` (a waiting repair has ended by then). Repairs still open
#: then are counted ``open``.
HORIZON_S = 3 * 86400.0
#: Name recorded for the simulated approvals and breaker resets.
APPROVER = "whatif"


@dataclass(frozen=True)
class Durations:
    """Median stage durations the ledger measured, seconds: ``by_action[action][stage]``
    for ``waiting_for_idle``, ``draining``, ``repairing`` (``migrating`` for migrate is
    filed as ``repairing``) and ``joining``; ``approval_s``: median wait from
    ``awaiting_approval`` to the next stage (None: nobody approves); ``breaker_reset_s``:
    median time from a breaker trip to its reset in the ledger (None: nobody resets it);
    ``domain_release_s``: median time from a failure-domain hold to its release in the
    ledger (None: nobody releases one)."""

    by_action: dict[str, dict[str, float]] = field(default_factory=dict)
    approval_s: float | None = None
    breaker_reset_s: float | None = None
    domain_release_s: float | None = None

    def of(self, action: Action, stage: str) -> float:
        """Seconds ``action`` spends in ``stage`` (measured, else :data:`DEFAULT_DURATIONS_S`)."""
        got = self.by_action.get(action.value, {}).get(stage)
        return DEFAULT_DURATIONS_S[stage] if got is None else max(got, 0.0)


@dataclass(frozen=True)
class Facts:
    """What the ledger and inventory say beside the alerts: GPU nodes per cluster (the
    rails' denominator; 0: the rails' minimums), node → pool and node → machine per
    cluster, the recorded attempt outcomes per (cluster, node, action), oldest first,
    node → failure domains per cluster (the guard's ``PolicyView.domains``) and the
    ledger's maintenance windows (``ledger_maintenance_covering`` answers from them)."""

    gpu_nodes: dict[str, int] = field(default_factory=dict)
    pools: dict[str, dict[str, str]] = field(default_factory=dict)
    machines: dict[str, dict[str, str]] = field(default_factory=dict)
    domains: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    outcomes: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    windows: list[MaintenanceWindow] = field(default_factory=list)


@dataclass
class RepairRun:
    """One simulated repair: ``action`` as first decided, ``asked``: why it waited for a
    person (empty: automatic), ``transitions`` ``(stage, at)`` as recorded, ``attempts``
    the actions executed with their outcome, ``stage`` the terminal one ("" still open
    when the replay ended), ``rule`` / ``reason`` the last decision and end, ``refused``
    the guard's last reason for queueing its lease request and ``refused_why`` its
    category (``gm.Why``: ``budget``, ``breaker``, ``domain``, …); ``domain_held``: its
    lease request ever waited for a failure-domain hold."""

    repair_id: str
    cluster: str
    node: str
    requested: Action
    action: Action | None = None
    asked: list[str] = field(default_factory=list)
    transitions: list[tuple[str, datetime]] = field(default_factory=list)
    attempts: list[tuple[Action, str]] = field(default_factory=list)
    stage: str = ""
    rule: str = ""
    reason: str = ""
    refused: str = ""  # the guard's last reason for not granting the lease ("" none)
    refused_why: str = ""
    domain_held: bool = False


@dataclass
class AlertResult:
    """What the node machine answered for one alert (``Reply``) and its repair."""

    alert_id: str
    cluster: str
    node: str
    at: datetime
    outcome: str = ""
    reason: str = ""
    repair_id: str | None = None


@dataclass
class Run:
    """A replay's result: alerts in replay order, repairs by id (in start order), breaker
    trips ``(cluster, at, reason)``, failure-domain holds ``(cluster, domain, at, nodes)``
    and their releases ``(cluster, domain, at)``, the simulated time the replay ended."""

    alerts: dict[str, AlertResult] = field(default_factory=dict)
    repairs: dict[str, RepairRun] = field(default_factory=dict)
    trips: list[tuple[str, datetime, str]] = field(default_factory=list)
    holds: list[tuple[str, str, datetime, list[str]]] = field(default_factory=list)
    releases: list[tuple[str, str, datetime]] = field(default_factory=list)
    ended_at: datetime | None = None
    open_at_end: int = 0


Target = tuple[str, Any]  # ("node", (cluster, node)) | ("guard", cluster) | ("repair", rid)


class _Sim:
    def __init__(self, policy: PolicyConfig, facts: Facts, durations: Durations) -> None:
        self.policy, self.facts, self.dur = policy, facts, durations
        self.now = datetime.min.replace(tzinfo=UTC)
        self.seq = 0
        self.heap: list[tuple[datetime, int, str, Any, Any, Any]] = []
        self.fifo: deque[tuple[str, Any, Any]] = deque()
        self.nodes: dict[tuple[str, str], nm.NodeState] = {}
        self.node_timer: dict[tuple[str, str], datetime | None] = {}
        self.guards: dict[str, gm.GuardState] = {}
        self.guard_timers: dict[tuple[str, str], datetime] = {}
        self.repairs: dict[str, rm.RepairState] = {}
        self.tokens: dict[str, int] = {}  # repair id → token of its pending timed event
        self.attempts: dict[tuple[str, str], list[AttemptRecord]] = {}
        self.tries: dict[tuple[str, str, str], int] = {}
        self.removed: set[tuple[str, str]] = set()
        self.views: dict[str, gm.PolicyView] = {}
        self.run = Run()

    # -- scheduling ---------------------------------------------------------------------
    def at(self, t: datetime, kind: str, who: Any, ev: Any, token: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, who, ev, token))

    def later(self, seconds: float, rid: str, ev: Any) -> None:
        """A repair's answer or timer ``seconds`` from now (one out at a time per repair)."""
        tok = self.tokens.get(rid, 0) + 1
        self.tokens[rid] = tok
        self.at(self.now + timedelta(seconds=seconds), "repair", rid, ev, tok)

    def send(self, kind: str, who: Any, ev: Any) -> None:
        self.fifo.append((kind, who, ev))

    def settle(self) -> None:
        while self.fifo:
            kind, who, ev = self.fifo.popleft()
            if kind == "node":
                self.node(who, ev)
            elif kind == "guard":
                self.guard(who, ev)
            else:
                self.repair(who, ev)

    def go(self, alerts: list[Alert], until: datetime | None) -> Run:
        for a in alerts:
            self.at(a.received_at or a.observed_at, "alert", (a.cluster, a.node), a)
        last = max((a.received_at or a.observed_at for a in alerts), default=None)
        end = None if last is None else max(until or last, last) + timedelta(
            seconds=HORIZON_S)
        while self.heap:
            t, _, kind, who, ev, tok = heapq.heappop(self.heap)
            if end is not None and t > end:
                self.now = end
                break
            self.now = max(self.now, t)
            if kind == "alert":
                self.alert(ev)
            elif kind == "node_timer":
                if self.node_timer.get(who) == t:
                    self.node_timer[who] = None
                    self.send("node", who, nm.TimerFired())
            elif kind == "guard_timer":
                if self.guard_timers.get(who) == t:
                    del self.guard_timers[who]
                    self.send("guard", who[0], gm.TimerFired(name=who[1]))
            elif kind == "breaker_reset":
                g = self.guards.get(who)
                if g is not None and g.breaker_open:
                    self.send("guard", who, gm.ResetBreaker(sig=ResetBreakerSignal(
                        by=APPROVER, reason="reset as the ledger's breaker resets took")))
            elif kind == "domain_release":
                g = self.guards.get(who[0])
                if g is not None and any(h.domain == who[1] for h in g.holds):
                    self.run.releases.append((who[0], who[1], self.now))
                    self.send("guard", who[0], gm.ReleaseDomain(sig=ReleaseDomainSignal(
                        domain=who[1], by=APPROVER,
                        reason="released as the ledger's domain holds were")))
            elif kind == "repair_clock":
                if who in self.repairs:
                    self.send("repair", who, rm.Clock())
            elif self.tokens.get(who) == tok:
                self.send("repair", who, ev)
            self.settle()
        self.run.ended_at = self.now if alerts else None
        self.run.open_at_end = len(self.repairs)
        return self.run

    # -- nodes --------------------------------------------------------------------------
    def alert(self, a: Alert) -> None:
        key = (a.cluster, a.node)
        self.run.alerts[a.alert_id] = AlertResult(a.alert_id, a.cluster, a.node,
                                                  a.received_at or a.observed_at)
        if a.cluster not in self.guards:
            self.start_guard(a.cluster)
        if key not in self.nodes:
            self.nodes[key] = nm.new_state(a.cluster, a.node, f"{a.cluster}/{a.node}/",
                                           self.policy.rails)
            self.send("node", key, nm.Begin())
        if a.received_at is None:
            a = a.model_copy(update={"received_at": a.observed_at})
        self.send("node", key, nm.AlertDelivered(alert=a))

    def node(self, key: tuple[str, str], ev: nm.Event) -> None:
        m, cmds = nm.step(self.nodes[key], ev, self.now)
        self.nodes[key] = m
        cluster, node = key
        for c in cmds:
            if isinstance(c, nm.RecordAlert):
                self.send("node", key, nm.AlertRecorded(alert_id=c.alert.alert_id))
            elif isinstance(c, nm.LoadPolicy):
                self.send("node", key, nm.PolicyLoaded(
                    catalogue=self.policy.catalogue, rails=self.policy.rails,
                    machine_id=self.machine(cluster, node), node_pool=self.pool(cluster, node),
                    grace_s=self.policy.maintenance.grace_s,
                    domains=list(self.facts.domains.get(cluster, {}).get(node, []))))
            elif isinstance(c, nm.Reply):
                r = self.run.alerts.get(c.alert_id)
                if r is not None:
                    r.outcome, r.reason, r.repair_id = c.outcome.value, c.reason, c.repair_id
            elif isinstance(c, nm.AttachAlert):
                landed = c.repair_id in self.repairs
                if landed and c.alert.active:
                    self.send("repair", c.repair_id, rm.AlertAttached(alert=c.alert))
                elif landed:  # a clear names the repair's alerts of its fault (kind, code)
                    fk = nm.fault_key(c.alert)
                    for a in self.repairs[c.repair_id].alerts:
                        if a.active and nm.fault_key(a) == fk:
                            self.send("repair", c.repair_id, rm.AlertCleared(alert_id=a.alert_id))
                            break
                self.send("node", key, nm.AttachDone(alert_id=c.alert.alert_id, ok=landed))
            elif isinstance(c, nm.StartRepair):
                self.start_repair(key, c)
            elif isinstance(c, nm.ReadLedger):
                self.send("node", key, self.open_repair(key))
            elif isinstance(c, nm.ProbeRepair):
                running = c.repair_id in self.repairs
                self.send("node", key, nm.RepairProbed(
                    repair_id=c.repair_id, running=running,
                    status="running" if running else "completed"))
            elif isinstance(c, nm.SetTimer):
                self.node_timer[key] = c.at
                if c.at is not None:
                    self.at(max(c.at, self.now), "node_timer", key, None)
                    self.node_timer[key] = max(c.at, self.now)
            elif isinstance(c, nm.ReleaseLease):
                self.send("guard", cluster, gm.Release(rel=LeaseRelease(
                    repair_id=c.repair_id, outcome=c.outcome)))
            elif isinstance(c, nm.ReportFault):  # the guard counts it for the domain
                self.send("guard", cluster, gm.FaultSeen(report=c.report))
            # nm.StartGuard: the replay's guard of every cluster always runs

    def open_repair(self, key: tuple[str, str]) -> nm.LedgerRead:
        for rid, s in self.repairs.items():
            if (s.cluster, s.node) == key:
                return nm.LedgerRead(repair_id=rid, running=True, stage=s.stage.value,
                                     status="running")
        return nm.LedgerRead()

    def machine(self, cluster: str, node: str) -> str:
        return self.facts.machines.get(cluster, {}).get(node, node)

    def pool(self, cluster: str, node: str) -> str | None:
        return self.facts.pools.get(cluster, {}).get(node)

    # -- the guard ----------------------------------------------------------------------
    def view(self, cluster: str) -> gm.PolicyView:
        """The guard's policy for ``cluster``: built once (policy and facts do not change
        during a replay; a 10,000-node map is not copied at every policy re-read)."""
        got = self.views.get(cluster)
        if got is not None:
            return got
        rails = self.policy.rails
        gpu = self.facts.gpu_nodes.get(cluster, 0)
        got = gm.PolicyView(
            gpu_nodes=gpu, budget=concurrency_budget(gpu, rails, 0),
            breaker_threshold=breaker_threshold(gpu, rails, 0),
            breaker_window_s=rails.breaker_window_s, one_per_pool=rails.one_per_pool,
            detector_cap=rails.detector_cap, lease_ttl_s=rails.lease_ttl_s,
            pools=dict(self.facts.pools.get(cluster, {})),
            domains={n: list(ds) for n, ds in self.facts.domains.get(cluster, {}).items()},
            domain_threshold=self.policy.domains.threshold,
            domain_window_s=self.policy.domains.window_s)
        self.views[cluster] = got
        return got

    def start_guard(self, cluster: str) -> None:
        self.guards[cluster] = gm.new_state(cluster, self.view(cluster))
        self.guard(cluster, gm.Started(fresh=True))
        self.settle()

    def guard(self, cluster: str, ev: gm.Event) -> None:
        g, cmds = gm.step(self.guards[cluster], ev, self.now)
        self.guards[cluster] = g
        for c in cmds:
            if isinstance(c, gm.LoadPolicy):
                self.send("guard", cluster, gm.PolicyRead(view=self.view(cluster)))
            elif isinstance(c, gm.ReadLedger):
                self.send("guard", cluster, gm.LedgerRead(view=gm.LedgerView()))
            elif isinstance(c, gm.SendLease):
                rid = c.reply.repair_id
                if rid not in self.repairs:
                    self.send("guard", cluster, gm.ReplyUndeliverable(repair_id=rid,
                                                                      purpose=c.purpose))
                elif c.purpose == "reply":
                    if not c.reply.granted:
                        run = self.run.repairs[rid]
                        run.refused = c.reply.reason
                        why = next((q.why.value for q in g.queue
                                    if q.req.repair_id == rid), "")
                        run.refused_why = why
                        run.domain_held = run.domain_held or why == gm.Why.domain.value
                    self.send("repair", rid, rm.LeaseReply(granted=c.reply.granted,
                                                           reason=c.reply.reason))
            elif isinstance(c, gm.WriteAlert):
                if c.alert.kind == gm.BREAKER_KIND and c.alert.active:
                    self.run.trips.append((cluster, self.now, c.alert.summary))
                    if self.dur.breaker_reset_s is not None:
                        self.at(self.now + timedelta(seconds=self.dur.breaker_reset_s),
                                "breaker_reset", cluster, None)
                elif c.alert.kind == gm.DOMAIN_KIND and c.alert.active:
                    domain = str(c.alert.evidence.get("domain", ""))
                    nodes = [str(n) for n in c.alert.evidence.get("nodes", [])]
                    self.run.holds.append((cluster, domain, self.now, nodes))
                    if self.dur.domain_release_s is not None:
                        self.at(self.now + timedelta(seconds=self.dur.domain_release_s),
                                "domain_release", (cluster, domain), None)
            elif isinstance(c, gm.StartTimer):
                self.guard_timers[(cluster, c.name)] = c.at
                self.at(c.at, "guard_timer", (cluster, c.name), None)
            elif isinstance(c, gm.CancelTimer):
                self.guard_timers.pop((cluster, c.name), None)

    # -- repairs ------------------------------------------------------------------------
    def start_repair(self, key: tuple[str, str], c: nm.StartRepair) -> None:
        cluster, node = key
        if c.action not in ma.PHASES:
            return
        self.repairs[c.repair_id] = rm.new_state(c.repair_id, cluster, node, Requester(),
                                                 c.action, list(c.alerts))
        self.run.repairs[c.repair_id] = RepairRun(c.repair_id, cluster, node, c.action)
        self.send("node", key, nm.RepairStarted(repair_id=c.repair_id))
        self.send("repair", c.repair_id, rm.Start())

    def repair(self, rid: str, ev: rm.Event) -> None:
        s0 = self.repairs.get(rid)
        if s0 is None:
            return
        s, cmds = rm.step(s0, ev, self.now)
        self.repairs[rid] = s
        run = self.run.repairs[rid]
        for c in cmds:
            self.repair_cmd(rid, s, run, c)
        if rid in self.repairs and s.status == rm.Status.awaiting_approval \
                and s.approval_deadline is not None and s0.status != s.status:
            self.at(s.approval_deadline, "repair_clock", rid, None)
        if rid in self.repairs and s.status == rm.Status.awaiting_lease \
                and s.lease_deadline is not None and s0.status != s.status:
            self.at(s.lease_deadline, "repair_clock", rid, None)

    def repair_cmd(self, rid: str, s: rm.RepairState, run: RepairRun, c: rm.Command) -> None:
        cluster, node = s.cluster, s.node
        if isinstance(c, rm.RunActivity):
            self.activity(rid, s, c.name)
        elif isinstance(c, rm.SignalGuard):
            if c.what == "release":
                self.send("guard", cluster, gm.Release(rel=LeaseRelease(repair_id=rid)))
            else:
                self.send("guard", cluster, gm.Request(req=LeaseRequest(
                    repair_id=rid, workflow_id=rid, cluster=cluster, node=node,
                    node_pool=s.pool, automatic=s.approval is None,
                    requester_kind=s.requester.kind, renew=c.what == "renew",
                    gpu_evidence=any(a.gpu for a in s.alerts), requested_at=self.now,
                    fault_kinds=sorted({a.kind for a in s.alerts}))))
        elif isinstance(c, rm.StartTimer):
            self.later(c.seconds, rid, rm.TimerFired())
        elif isinstance(c, rm.RecordTransition):
            run.transitions.append((c.stage.value, self.now))
            if run.action is None and c.stage in (Stage.awaiting_approval, Stage.cordoning):
                run.action = s.action
            if c.stage == Stage.awaiting_approval:
                run.asked.append(c.reason)
                if self.dur.approval_s is not None:
                    self.later(self.dur.approval_s, rid, rm.Approve(by=APPROVER))
            run.rule = s.rule
        elif isinstance(c, rm.RecordAttempt):
            rec = AttemptRecord(repair_id=rid, cluster=cluster, node=node,
                                machine_id=s.machine, action=c.action,
                                alert_kind=s.alerts[0].kind if s.alerts else "manual",
                                code=s.alerts[0].code if s.alerts else None,
                                outcome=c.outcome, at=self.now)
            self.attempts.setdefault((cluster, node), []).append(rec)
            run.attempts.append((c.action, c.outcome))
        elif isinstance(c, rm.MachineCommand):
            self.machine_cmd(rid, s, c.command)
        elif isinstance(c, rm.StartValidation):
            if c.return_to == "hold":
                self.removed.add((cluster, c.machine))
        elif isinstance(c, rm.Finish):
            run.stage, run.reason = c.stage.value, c.reason
            if run.action is None:
                run.action = s.action
            del self.repairs[rid]
            self.tokens.pop(rid, None)
            self.send("node", (cluster, node), nm.RepairFinishedEv(
                repair_id=rid, stage=c.stage, at=self.now, alert_ids=list(s.cited),
                actions=list(s.acted)))
            self.send("node", (cluster, node), nm.RepairEnded(repair_id=rid, how="completed"))

    def activity(self, rid: str, s: rm.RepairState, name: str) -> None:
        cluster, node = s.cluster, s.node
        if name == "load_policy":
            self.send("repair", rid, rm.PolicyRead(policy=self.policy,
                                                   machine=self.machine(cluster, node),
                                                   pool=self.pool(cluster, node)))
        elif name == "ledger_machine_held":
            held = (cluster, s.machine or node) in self.removed
            self.send("repair", rid, rm.HoldRead(held=held, reason="removed" if held else ""))
        elif name == "ledger_attempt_history":
            self.send("repair", rid, rm.HistoryRead(
                attempts=list(self.attempts.get((cluster, node), []))))
        elif name == "cordon_node":
            self.send("repair", rid, rm.CallOk(cordoned_by_us=True))
        elif name == "ledger_open_repair":
            self.send("repair", rid, rm.CallOk(running=False))
        elif name == "check_idle":
            self.later(self.dur.of(s.action, "waiting_for_idle"), rid, rm.CallOk(idle=True))
        elif name == "drain_node":
            self.later(self.dur.of(s.action, "draining"), rid, rm.CallOk(drained=True))
        elif name == "node_health":
            self.later(self.dur.of(s.action, "joining"), rid, rm.CallOk(healthy=True))
        elif name == "rejoin_node":
            self.send("repair", rid, rm.CallOk())
        elif name == "ledger_maintenance_covering":
            # as the activity: the covering window in force now that ends last
            w = covering_last(self.facts.windows, cluster, node, self.pool(cluster, node),
                              self.now)
            self.send("repair", rid, rm.MaintenanceRead() if w is None else rm.MaintenanceRead(
                window_id=w.window_id, ends_at=w.end(), reason=w.reason))
        else:  # pragma: no cover (CALL_OF names no other)
            raise AssertionError(f"activity: {name!r} is not simulated")

    def machine_cmd(self, rid: str, s: rm.RepairState, c: ma.Command) -> None:
        if isinstance(c, ma.RunActivity):
            action = c.action
            k = (s.cluster, s.node, action.value)
            n = self.tries.get(k, 0)
            self.tries[k] = n + 1
            recorded = self.facts.outcomes.get(k, [])
            outcome = recorded[n] if n < len(recorded) else "succeeded"
            secs = self.dur.of(action, "repairing")
            if outcome == "failed" and c.purpose == "act":
                ev: ma.Event = ma.ActivityFailed(outcome="permanent", phase=ma.DISRUPTIVE[action],
                                                 message="failed as recorded in the ledger")
            else:
                ev = ma.ActivityOk(phase=ma.PHASES[action][-1])
            self.later(secs, rid, rm.Machine(event=ev))
        elif isinstance(c, ma.StartTimer):
            self.later(c.seconds, rid, rm.Machine(event=ma.TimerFired()))


def replay(alerts: list[Alert], policy: PolicyConfig, facts: Facts | None = None,
           durations: Durations | None = None, until: datetime | None = None) -> Run:
    """Replay ``alerts`` (any order: sorted here by receipt time, then id) through the
    machines under ``policy``, up to :data:`HORIZON_S` past ``until`` (the window's end;
    default: the last alert); see the module docstring for what is assumed. Raises
    ``ValueError`` naming an alert whose times are naive (no time zone)."""
    for i, a in enumerate(alerts):
        t = a.received_at or a.observed_at
        if t.tzinfo is None:
            raise ValueError(f"alerts[{i}].observed_at: {t.isoformat()} has no time zone "
                             f"(alert {a.alert_id})")
    ordered = sorted(alerts, key=lambda a: (a.received_at or a.observed_at, a.alert_id))
    return _Sim(policy, facts or Facts(), durations or Durations()).go(ordered, until)
