"""Helpers of tests/workflows/test_repair_agreement.py: the scenarios, the pure repair
machine (:mod:`workflows.lifecycle.repair`) driven in a small world that answers its
commands as the harness's ``FakeCluster`` answers the real ``RepairWorkflow``, and what
an operator can see of either run (:class:`Seen`).

The world is tests/model/repair_world.py's, cut to one scripted run: the ledger reads
answer "no hold, no history, no maintenance window", the guard grants every lease at
once, the cordon finds the node free, the idle check answers busy once then idle, the
drain drains, the machine action answers by the scenario's outcome (``ok``: it ran to
``booted``; ``fail``: it failed for good after its disruptive phase, once; ``recur``: it
ran, and the fault is reported again while the first health read after it is out), the
node's health after the action by ``rejoin`` (``healthy`` at once / ``never``). Timers
fire when started (the clock advances by their length). A person approves whenever the
repair waits for one, except where the scenario's stop is at ``approval``.

The stop (``approve`` / ``reject`` / ``cancel`` / ``clear``: the level fault clears) is
sent while the scenario's point is under way: ``approval`` (the repair asks a person,
first time), ``lease`` (the repair is queued for its lease behind another repair's:
the harness's budget is one repair; that repair is cancelled once the stop is sent, so
the grant comes after it), ``idle`` (the first idle check is out), ``drain`` (the drain is out),
``act`` (the first try of the first machine action is out), ``rejoin`` (the first health
read after the first machine action is out), ``cordon`` (the cordon call is out),
``uncordon`` (the node is back healthy and this repair's uncordon call is out),
``reapproval`` (a person is asked again after a rung that failed or after which the
fault recurred).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from workflows.config import PolicyConfig
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle import repair as rm
from workflows.models import Action, Alert, Requester, Severity

CONSENTS = ("auto", "person")
STOP_KINDS = ("approve", "reject", "cancel", "clear")
POINTS = ("approval", "lease", "cordon", "idle", "drain", "act", "rejoin", "uncordon",
          "reapproval")
OUTCOMES = ("ok", "fail", "recur")
REJOINS = ("healthy", "never")
#: The drain's own outcomes (no stop): ``stuck`` its deadline passed with a job still
#: running; ``refused`` the scheduler refused it for good (a 403).
DRAIN_OUTCOMES = ("stuck", "refused")
#: ``flaky``: the first try of the action fails transiently after On was sent (a BMC
#: status read refused); the retry resumes from there.
ACTION = Action.power_cycle
MACHINE_OF = "m-{node}"  # the harness's load_policy binds node → m-node


@dataclass(frozen=True)
class Scenario:
    consent: str  # auto | person
    stop: str  # none | approve | reject | cancel | clear
    point: str  # "" | approval | idle | drain | act | rejoin
    outcome: str  # ok | fail | recur | flaky | stuck | refused (the drain's)
    rejoin: str  # healthy | never

    @property
    def id(self) -> str:
        at = f"{self.stop}_at_{self.point}" if self.stop != "none" else "nostop"
        return f"{self.consent}-{at}-{self.outcome}-{self.rejoin}"


def scenarios() -> list[Scenario]:
    """The product (consent × stop × point × outcome × rejoin), pruned: a stop before
    the action makes the outcome and the rejoin moot (``ok`` / ``healthy`` only); no
    ``approval`` point where consent is automatic (nobody is asked) and no ``approve``
    there where a person is asked (the person approving is the ordinary run)."""
    out: list[Scenario] = []
    for consent in CONSENTS:
        for outcome, rejoin in itertools.product(OUTCOMES, REJOINS):
            out.append(Scenario(consent, "none", "", outcome, rejoin))
        for outcome in (*DRAIN_OUTCOMES, "flaky"):
            out.append(Scenario(consent, "none", "", outcome, "healthy"))
        for stop, point in itertools.product(STOP_KINDS, POINTS):
            if point in ("approval", "reapproval") and (consent == "auto"
                                                        or stop == "approve"):
                continue
            if point == "reapproval":  # asked again after a rung that did not fix it
                for outcome in ("fail", "recur"):
                    out.append(Scenario(consent, stop, point, outcome, "healthy"))
                continue
            tails: Iterator[tuple[str, str]] = (
                itertools.product(OUTCOMES, REJOINS) if point in ("act", "rejoin")
                # the uncordon comes only once the node is back healthy
                else itertools.product(OUTCOMES, ("healthy",)) if point == "uncordon"
                else iter([("ok", "healthy")]))
            for outcome, rejoin in tails:
                out.append(Scenario(consent, stop, point, outcome, rejoin))
            if point == "act":
                out.append(Scenario(consent, stop, point, "flaky", "healthy"))
    return out


#: The CI slice (about 5 s a scenario on the time-skipping server, under 3 min in all):
#: every stop kind, every point, every outcome and both rejoins, under both consents.
CI_SLICE = frozenset({
    "auto-nostop-ok-healthy", "auto-nostop-fail-healthy", "auto-nostop-recur-never",
    "auto-cancel_at_idle-ok-healthy", "auto-reject_at_drain-ok-healthy",
    "auto-cancel_at_act-fail-healthy", "auto-clear_at_act-fail-healthy",
    "auto-reject_at_rejoin-recur-healthy", "auto-clear_at_rejoin-ok-never",
    "auto-cancel_at_rejoin-ok-healthy", "person-nostop-recur-healthy",
    "person-reject_at_approval-ok-healthy", "person-clear_at_approval-ok-healthy",
    "person-clear_at_drain-ok-healthy", "person-reject_at_act-ok-healthy",
    "person-approve_at_act-recur-healthy", "person-cancel_at_rejoin-fail-healthy",
    "person-clear_at_rejoin-recur-never", "auto-cancel_at_lease-ok-healthy",
    "person-clear_at_lease-ok-healthy", "auto-reject_at_cordon-ok-healthy",
    "person-cancel_at_uncordon-recur-healthy", "auto-nostop-stuck-healthy",
    "person-nostop-refused-healthy", "person-reject_at_reapproval-fail-healthy",
    "person-clear_at_reapproval-recur-healthy", "auto-nostop-flaky-healthy",
    "person-cancel_at_act-flaky-healthy",
})


def ci_slice(all_: list[Scenario]) -> list[Scenario]:
    """The scenarios of :data:`CI_SLICE`, in product order."""
    keep = [sc for sc in all_ if sc.id in CI_SLICE]
    assert len(keep) == len(CI_SLICE), sorted(CI_SLICE - {sc.id for sc in keep})
    return keep


def policy_for(sc: Scenario) -> PolicyConfig:
    """The policy both sides run under (the harness's, consent and clocks set)."""
    p = PolicyConfig()
    p.consent.mode = "automatic" if sc.consent == "auto" else "approve"
    p.consent.automatic_xids = []
    p.wait_for_idle.poll_s = 60
    p.wait_for_idle.poll_max_s = 60
    p.rails.rejoin_poll_s = 60
    p.rails.rejoin_timeout_s = 300
    return p


def level_alert(cluster: str, node: str, n: int | str, at: datetime,
                **kw: object) -> Alert:
    """The repair's evidence: a level fault (so it can clear) asking for a power cycle."""
    base: dict[str, object] = dict(
        alert_id=f"{cluster}/{node}/{n}", cluster=cluster, node=node, kind="xid", code=79,
        gpu="0000:3b:00.0", severity=Severity.critical, actionable=True,
        action=ACTION, level=True, summary="Xid 79: GPU has fallen off the bus",
        evidence_text="NVRM: Xid 79", observed_at=at)
    base.update(kw)
    return Alert.model_validate(base)


@dataclass
class Seen:
    """What an operator can see of one run."""

    stage: str
    history: list[str]
    attempts: list[tuple[str, str]]
    cordoned: bool
    disruptive: list[str]  # sorted distinct: cordon, drain, act:<action>

    def as_dict(self) -> dict[str, object]:
        return dict(stage=self.stage, history=self.history, attempts=self.attempts,
                    cordoned=self.cordoned, disruptive=self.disruptive)


def collapse(stages: list[str]) -> list[str]:
    """Consecutive repeats folded: a note re-records the stage it is in."""
    out: list[str] = []
    for s in stages:
        if not out or out[-1] != s:
            out.append(s)
    return out


@dataclass
class _World:
    now: datetime
    cordon: bool = False
    history: list[str] = field(default_factory=list)
    attempts: list[tuple[str, str]] = field(default_factory=list)
    disruptive: set[str] = field(default_factory=set)
    finish: rm.Finish | None = None
    idle_checks: int = 0
    acts: int = 0
    health_after: int = 0
    asks: int = 0
    acquires: int = 0


def run_machine(sc: Scenario, cluster: str = "c1", node: str = "gpu-01",
                rid: str = "r1", defects: frozenset[str] = frozenset()) -> Seen:
    """Drive :func:`repair.step` through one scenario in the scripted world;
    ``defects``: planted defects of the machine (:data:`repair.DEFECTS`) for the proof
    that the comparison bites."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    alert = level_alert(cluster, node, rid, t0 - timedelta(seconds=10),
                        received_at=t0 - timedelta(seconds=10))
    s = rm.new_state(rid, cluster, node, Requester(), ACTION, [alert])
    w = _World(now=t0)
    policy = policy_for(sc)
    events: list[rm.Event] = [rm.Start()]

    def stop_events() -> list[rm.Event]:
        if sc.stop == "approve":
            return [rm.Approve(by="bob")]
        if sc.stop == "reject":
            return [rm.Reject(by="oncall", reason="not now")]
        if sc.stop == "cancel":
            return [rm.Cancel(by="oncall", reason="hands off")]
        if sc.stop == "clear":
            return [rm.AlertCleared(alert_id=alert.alert_id)]
        return []

    def at(point: str) -> list[rm.Event]:
        return stop_events() if sc.point == point else []

    for _ in range(500):
        if not events:
            break
        ev = events.pop(0)
        s, cmds = rm.step(s, ev, w.now, defects)
        follow: list[rm.Event] = []
        for c in cmds:
            if isinstance(c, rm.RecordTransition):
                w.history.append(c.stage.value)
            elif isinstance(c, rm.RecordAttempt):
                w.attempts.append((c.action.value, c.outcome))
            elif isinstance(c, rm.SignalGuard):
                if c.what == "acquire":
                    w.acquires += 1
                    if sc.point == "lease" and w.acquires == 1:
                        # queued behind another repair's lease; the stop comes, then
                        # that repair ends and the lease is granted
                        follow += [rm.LeaseReply(granted=False, reason="budget"),
                                   *at("lease")]
                    follow.append(rm.LeaseReply(granted=True))
            elif isinstance(c, rm.StartTimer):
                w.now += timedelta(seconds=c.seconds)
                follow.append(rm.TimerFired())
            elif isinstance(c, rm.ContinueAsNew):
                s = c.state
            elif isinstance(c, rm.Finish):
                w.finish = c
                if c.uncordon:
                    w.cordon = False
            elif isinstance(c, rm.MachineCommand):
                mc = c.command
                w.now += timedelta(seconds=1)  # every call takes a moment
                if isinstance(mc, ma.StartTimer):
                    w.now += timedelta(seconds=mc.seconds)
                    follow.append(rm.Machine(event=ma.TimerFired()))
                elif isinstance(mc, ma.RunActivity):
                    last = ma.PHASES[mc.action][-1]
                    if mc.purpose == "make_safe":
                        follow.append(rm.Machine(event=ma.ActivityOk(phase=last)))
                        continue
                    w.disruptive.add(f"act:{mc.action.value}")
                    w.acts += 1
                    first = w.acts == 1
                    if first:
                        follow += at("act")
                    if first and sc.outcome == "flaky":
                        follow.append(rm.Machine(event=ma.ActivityFailed(
                            outcome="transient", phase="on_sent",
                            message="BmcUnavailable (injected)")))
                    elif first and sc.outcome == "fail":
                        follow.append(rm.Machine(event=ma.ActivityFailed(
                            outcome="permanent", phase=ma.DISRUPTIVE[mc.action],
                            message="injected")))
                    else:
                        follow.append(rm.Machine(event=ma.ActivityOk(phase=last)))
            elif isinstance(c, rm.RunActivity):
                w.now += timedelta(seconds=1)
                follow += _answer(sc, s, c, w, policy, node, at)
        events = follow + events
        if s.status == rm.Status.awaiting_approval and not any(
                isinstance(e, (rm.Approve, rm.Reject, rm.Cancel)) for e in events):
            w.asks += 1
            if (sc.point == "approval" and w.asks == 1) or (
                    sc.point == "reapproval" and w.asks == 2):
                events += stop_events()
            else:
                events.append(rm.Approve(by="alice"))
        if s.status == rm.Status.ended:
            break
    assert w.finish is not None, f"the machine did not finish: {s.status} {events[:3]}"
    return Seen(stage=w.finish.stage.value, history=collapse(w.history),
                attempts=w.attempts, cordoned=w.cordon,
                disruptive=sorted(w.disruptive))


def _answer(sc: Scenario, s: rm.RepairState, c: rm.RunActivity, w: _World,
            policy: PolicyConfig, node: str,
            here: Callable[[str], list[rm.Event]]) -> list[rm.Event]:
    name = c.name
    if name == "load_policy":
        return [rm.PolicyRead(policy=policy, machine=MACHINE_OF.format(node=node))]
    if name == "ledger_machine_held":
        return [rm.HoldRead(held=False)]
    if name == "ledger_attempt_history":
        return [rm.HistoryRead(attempts=[])]
    if name == "ledger_maintenance_covering":
        return [rm.MaintenanceRead()]
    if name == "cordon_node":
        w.disruptive.add("cordon")
        w.cordon = True
        return [*here("cordon"), rm.CallOk(cordoned_by_us=True)]
    if name == "ledger_open_repair":
        return [rm.CallOk(running=False)]
    if name == "check_idle":
        w.idle_checks += 1
        pre = here("idle") if w.idle_checks == 1 else []
        return [*pre, rm.CallOk(idle=w.idle_checks > 1)]
    if name == "drain_node":
        w.disruptive.add("drain")
        if sc.outcome == "refused":
            return [*here("drain"), rm.CallFailed(message="403")]
        return [*here("drain"), rm.CallOk(drained=sc.outcome != "stuck",
                                          remaining=["job-7"] if sc.outcome == "stuck"
                                          else [])]
    if name == "node_health":
        w.health_after += 1
        pre: list[rm.Event] = []
        if w.health_after == 1:
            if sc.outcome == "recur":
                pre.append(rm.AlertAttached(alert=level_alert(
                    s.cluster, s.node, "again", w.now, received_at=w.now,
                    evidence={"boot_id": "boot-1"})))
            pre += here("rejoin")
        return [*pre, rm.CallOk(healthy=sc.rejoin == "healthy")]
    if name == "rejoin_node":
        w.cordon = False
        return [*here("uncordon"), rm.CallOk()]
    raise AssertionError(f"no answer for {name}")  # pragma: no cover
