"""``NodeWorkflow`` (id ``node/{cluster}/{node}``): the node entity.

One per node, started by the ingest service with update-with-start
(:data:`~workflows.protocol.NODE_UPDATE_DELIVER_ALERT` ``deliver_alert``, input
:class:`~workflows.models.NodeInput`). It de-duplicates alerts by ``alert_id`` (keys
survive continue-as-new), records every alert in the ledger, decides each one with the
worker's catalogue (operator overrides and count-in-window thresholds included; ingest
only annotates), tracks persistence per fault from its first receipt, the cooldown after
a repair and the in-flight repair, and turns an actionable fault that outlives its
persistence window into a ``RepairWorkflow`` child (parent close policy ABANDON). Alerts
arriving during a repair attach to it (no second repair starts; the cooldown follows its
end, docs/design.md §5 rails); a fault that clears before a repair starts auto-resolves the
recommendation.

Every decision is made by the pure machine :mod:`workflows.lifecycle.node`
(``step(state, event, now) -> (state, commands)``, issue 26): this workflow turns the
update, the signals, the repair child's end, its one timer, activity outcomes and a long
history into the machine's events and executes the commands it returns, in order
(the ledger write, policy read and ledger reads are started in command order, as local
activities (:mod:`workflows.local`; the policy read is ``load_node_policy``, this node's
slice only), and their outcomes stepped as events when they come back; signals, the
child start, notifications and closing ledger writes are awaited in place). The
machine's state is the whole carried state (``NodeInput.carried``; a 0.3.0 run's
:class:`NodeCarried` is read once and converted). A versioned node is ``PINNED`` and
moves to a new build by continue-as-new (:mod:`workflows.upgrades`).

Interface: update ``deliver_alert`` (Alert → AlertDelivery), signal ``repair_finished``
(RepairFinished, from the repair), query ``status`` → NodeStatus.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributePair,
    TypedSearchAttributes,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

    from workflows.activity_api import (
        ACT,
        NodePolicy,
        NodeRef,
        Notification,
        RepairLiveness,
        RepairProbe,
        TransitionRecord,
    )
    from workflows.config import RailsConfig
    from workflows.console import guard_details, guard_summary, repair_details, repair_summary
    from workflows.lifecycle import node as nm
    from workflows.lifecycle.trace import Call, Trace
    from workflows.local import start_local
    from workflows.models import (
        Action,
        Alert,
        AlertDelivery,
        NodeInput,
        RepairRequest,
        Requester,
        RequesterKind,
        Stage,
    )
    from workflows.protocol import (
        GUARD_SIGNAL_FAULT_SEEN,
        GUARD_SIGNAL_RELEASE,
        GUARD_WORKFLOW,
        NODE_QUERY_STATUS,
        NODE_SIGNAL_REPAIR_FINISHED,
        NODE_UPDATE_DELIVER_ALERT,
        NODE_WORKFLOW,
        REPAIR_FAILED,
        REPAIR_SIGNAL_ATTACH_ALERT,
        REPAIR_TIMED_OUT,
        REPAIR_WORKFLOW,
        SA_ACTION,
        SA_STAGE,
        SA_STATE,
        GuardInput,
        LeaseRelease,
        NodeStatus,
        RepairFinished,
        repair_identity_attributes,
        repair_state,
        workflow_id_guard,
        workflow_id_repair,
    )
    from workflows.upgrades import UPGRADE_CHECK_S, upgrade_behavior, upgrade_due, versioned

#: Re-exported from the machine (the names the first release defined here).
DEFAULT_HISTORY_LIMIT = nm.DEFAULT_HISTORY_LIMIT
DEDUP_TTL_S = nm.DEDUP_TTL_S
DEDUP_MAX = nm.DEDUP_MAX
DEDUP_DIGEST_HEX = nm.DEDUP_DIGEST_HEX
DEDUP_BUCKET_S = nm.DEDUP_BUCKET_S
MAX_OCCURRENCE_KEYS = nm.MAX_OCCURRENCE_KEYS
MAX_OCCURRENCES = nm.MAX_OCCURRENCES
MAX_ACTIVE_FAULTS = nm.MAX_ACTIVE_FAULTS
MAX_CARRIED_TEXT = nm.MAX_CARRIED_TEXT
MAX_DIAGNOSTICS = nm.MAX_DIAGNOSTICS
MAX_DIAGNOSED = nm.MAX_DIAGNOSED
MAX_CLEARED = nm.MAX_CLEARED
POLICY_REFRESH_S = nm.POLICY_REFRESH_S
REPAIR_PROBE_S = nm.REPAIR_PROBE_S
MAX_FINISHED_EARLY = nm.MAX_FINISHED_EARLY
seen_digest = nm.seen_digest
_dump_seen = nm.dump_seen
_ACT_TIMEOUT = timedelta(seconds=30)
#: Ledger writes of alerts and policy reads retry (30 s apart at most) for the local
#: activity's tries (``workflows.local.LOCAL_ATTEMPTS``, about 1.5 min); then the
#: machine is told it failed (``AlertRecorded(ok=False)``: decided all the same, ingest's
#: outbox holds the alert; ``PolicyFailed``: the last policy decides, re-read after
#: ``nm.POLICY_REFRESH_S``).
_ACT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
#: Ledger reads, closing writes and notifications: a few tries, then the machine is told
#: (a failed read is retried by the machine with back-off, ``nm.LEDGER_RETRY_S``).
_BEST_EFFORT = RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5)
#: The reconcile's ledger read: two tries of at most 10 s (1 s apart), so a failed read
#: (PostgreSQL down or hanging) is known within about 21 s and the alerts waiting on it
#: are answered inside ingest's 30 s update timeout (``ingest.handoff`` ``rpc_timeout_s``);
#: the machine retries the read itself (``nm.LEDGER_RETRY_S``).
_READ_TIMEOUT = timedelta(seconds=10)
_READ_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=1), maximum_attempts=2)


class ActiveFault(BaseModel):
    """An active fault as the 0.3.0 release carried it (read by :func:`machine_state`)."""

    alert: Alert
    action: Action
    rule: str
    first_seen: datetime
    received: datetime | None = None


class NodeCarried(BaseModel):
    """The state the 0.3.0 release carried across continue-as-new (``NodeInput.carried``
    without ``id_seed``): read once by :func:`machine_state` when such a run continues
    as new onto this build. ``seen_log`` as :func:`~workflows.lifecycle.node.dump_seen`
    writes it; ``seen``: the older ``{alert_id: time}`` form."""

    seen_log: list[tuple[int, str]] = Field(default_factory=list)
    seen: dict[str, datetime] = Field(default_factory=dict)
    active: dict[str, ActiveFault] = Field(default_factory=dict)
    occurrences: dict[str, list[datetime]] = Field(default_factory=dict)
    repair_id: str | None = None
    repair_alert_ids: list[str] = Field(default_factory=list)
    cooldown_until: datetime | None = None
    recommendations: int = 0
    diagnostics: list[str] = Field(default_factory=list)
    diagnosed: dict[str, datetime] = Field(default_factory=dict)
    rails: RailsConfig | None = None
    cleared: dict[str, datetime] = Field(default_factory=dict)
    history_limit: int = DEFAULT_HISTORY_LIMIT
    repair_action: Action | None = None
    booted_at: datetime | None = None


def machine_state(inp: NodeInput, id_seed: str) -> nm.NodeState:
    """The machine's state a run starts from: fresh (no ``carried``), the machine's own
    carried state (it has ``id_seed``), or a 0.3.0 :class:`NodeCarried` converted (its
    open repair read again from the ledger). Raises ``pydantic.ValidationError`` naming
    the field of a carried state that does not validate."""
    c = inp.carried
    if not c:
        return nm.new_state(inp.cluster, inp.node, id_seed)
    if "id_seed" in c:
        return nm.NodeState.model_validate({"cluster": inp.cluster, "node": inp.node, **c})
    old = NodeCarried.model_validate(c)
    seen = {seen_digest(a): nm.bucket(t)
            for a, t in sorted(old.seen.items(), key=lambda kv: kv[1])}
    seen |= nm.load_seen([list(e) for e in old.seen_log])
    active = {k: nm.Fault(alert=f.alert, action=f.action, rule=f.rule,
                          first_seen=f.first_seen, received=f.received or f.first_seen)
              for k, f in old.active.items()}
    repair = None
    if old.repair_id is not None:
        ids = set(old.repair_alert_ids)
        repair = nm.OpenRepair(repair_id=old.repair_id, action=old.repair_action,
                               alert_ids=list(old.repair_alert_ids),
                               acted_on=[k for k, f in active.items()
                                         if f.alert.alert_id in ids])
    return nm.NodeState(
        cluster=inp.cluster, node=inp.node, id_seed=id_seed,
        rails=old.rails or RailsConfig(),
        reconcile=nm.Reconcile.pending if repair else nm.Reconcile.done,
        seen=seen, active=active, occurrences=old.occurrences, repair=repair,
        cooldown_until=old.cooldown_until, recommendations=old.recommendations,
        diagnostics=old.diagnostics, diagnosed=old.diagnosed, cleared=old.cleared,
        history_limit=old.history_limit, booted_at=old.booted_at)


@workflow.defn(name=NODE_WORKFLOW)
class NodeWorkflow:
    """Node entity; a thin interpreter of :mod:`workflows.lifecycle.node`."""

    @workflow.init
    def __init__(self, inp: NodeInput) -> None:
        # State is restored here, not in run(): an update delivered with the start (or
        # buffered across continue-as-new) runs before run() begins.
        self._inp = inp
        self._m = machine_state(inp, workflow.uuid4().hex)
        self._lock = asyncio.Lock()
        self._begun = False
        #: answers the machine gave later than the delivery's own step, by alert id
        self._replies: dict[str, nm.Reply] = {}
        #: activity calls out (their outcomes are events): continue-as-new waits for them
        self._tasks: set[asyncio.Task[None]] = set()
        #: the repair children this run awaits (abandoned at continue-as-new)
        self._watches: set[asyncio.Task[None]] = set()
        #: what ``step`` commanded, checked against what runs (issue 26 item 5)
        self.lifecycle_trace = Trace()
        #: a newer build was seen current in an activation of this run. The flag
        #: (``upgrade_due``) is set on the activation that starts a workflow task only: a
        #: local activity resolved later in the same task sees it unset, so the run
        #: remembers it (it is read from the history: the same on replay)
        self._upgrade_seen = False

    # ---- update / signal / query -------------------------------------------------
    @workflow.update(name=NODE_UPDATE_DELIVER_ALERT)
    async def deliver_alert(self, alert: Alert) -> AlertDelivery:
        """Take one alert (raise or clear); idempotent by ``alert_id``.

        Returns ``deduplicated`` (seen before), ``ignored`` (not actionable, with the
        catalogue's reason, or a stale edge), ``cleared`` (a clear; auto-resolves a
        pending recommendation), ``attached`` (a repair is in flight: the alert joined
        it), ``recommended`` (a repair was started or a diagnostic run recommended) or
        ``new`` (actionable, waiting for its persistence window, the cooldown or the
        ledger).
        """
        reply = await self._deliver(nm.AlertDelivered(alert=alert), want=alert.alert_id)
        if reply is None:
            aid = alert.alert_id
            await workflow.wait_condition(lambda: aid in self._replies)
            reply = self._replies.pop(aid)
        return AlertDelivery(alert_id=reply.alert_id, outcome=reply.outcome,
                             reason=reply.reason, repair_id=reply.repair_id)

    @workflow.signal(name=NODE_SIGNAL_REPAIR_FINISHED)
    async def repair_finished(self, msg: RepairFinished) -> None:
        """The in-flight repair ended (stage, end time, alerts used, actions that ran)."""
        await self._deliver(nm.RepairFinishedEv(
            repair_id=msg.repair_id, stage=msg.stage, at=msg.at, alert_ids=msg.alert_ids,
            actions=msg.actions, machine_held=msg.machine_held,
            unjudged_alert_ids=msg.unjudged_alert_ids))

    @workflow.query(name=NODE_QUERY_STATUS)
    def status(self) -> NodeStatus:
        """Degraded state, active faults with first observation, repair, cooldown."""
        s = self._m
        rid = s.repair.repair_id if s.repair else None
        return NodeStatus(
            cluster=self._inp.cluster,
            node=self._inp.node,
            degraded=bool(s.active) or rid is not None,
            active_alerts=[f.alert for f in s.active.values()],
            first_seen={k: f.first_seen for k, f in s.active.items()},
            repair_id=rid,
            cooldown_until=s.cooldown_until,
            seen_alert_ids=len(s.seen),
            recommendations=s.recommendations,
            diagnostics=list(s.diagnostics),
            held={k: f"{f.held_why} until {f.held_until.isoformat()}"
                  for k, f in s.active.items()
                  if f.held_until is not None and nm.held(f, workflow.now())},
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        """Run for the node's lifetime: the machine's timer and a long history are its
        only own events; continue-as-new happens inside :meth:`_execute`."""
        workflow.set_current_details(f"node {inp.node} of {inp.cluster}")
        await self._deliver(None)
        while True:
            at = self._m.timer_at
            timeout = None if at is None else max(at - workflow.now(),
                                                   timedelta(milliseconds=1))
            if versioned():
                # a pinned entity looks for a newer current build at least this often,
                # so an idle node moves too (and the old build can drain)
                wake = timedelta(seconds=UPGRADE_CHECK_S)
                timeout = wake if timeout is None else min(timeout, wake)
            try:
                await workflow.wait_condition(
                    lambda at=at: self._m.timer_at != at or self._may_continue(),  # type: ignore[misc]
                    timeout=timeout)
            except TimeoutError:
                if self._m.timer_at == at and at is not None and workflow.now() >= at:
                    await self._deliver(nm.TimerFired())
            if self._may_continue():
                await self._deliver(nm.HistoryFull())

    def _may_continue(self) -> bool:
        """The history is long, or a newer build became the deployment's current version
        (this run is pinned to its own), and nothing is in progress (no handler, no
        activity out, nothing the machine is deciding): the machine may continue as new
        at once."""
        info = workflow.info()
        self._upgrade_seen = self._upgrade_seen or upgrade_due()
        long = (info.is_continue_as_new_suggested()
                or info.get_current_history_length() > self._m.history_limit
                or self._upgrade_seen)
        return (long and not self._tasks and not self._lock.locked()
                and workflow.all_handlers_finished() and nm.quiescent(self._m))

    async def _deliver(self, event: nm.Event | None, want: str | None = None
                       ) -> nm.Reply | None:
        """Step the machine with ``event`` (None: only begin the run) and execute its
        commands; an outcome that is itself an event and comes at once (a signal that
        landed or not, a child started) is stepped after them, in order. Returns the
        reply to ``want``'s delivery when ``event``'s own step gave it; other replies are
        kept for their waiting update."""
        async with self._lock:
            todo: deque[nm.Event] = deque()
            if not self._begun:
                self._begun = True
                todo.append(nm.Begin())
            if event is not None:
                todo.append(event)
            mine: nm.Reply | None = None
            while todo:
                ev = todo.popleft()
                self._m, cmds = nm.step(self._m, ev, workflow.now())
                self.lifecycle_trace.commanded(c for cmd in cmds for c in calls(cmd))
                for cmd in cmds:
                    if isinstance(cmd, nm.Reply):
                        if ev is event and cmd.alert_id == want and mine is None:
                            mine = cmd
                        else:
                            self._replies[cmd.alert_id] = cmd
                        continue
                    follow = await self._execute(cmd)
                    if follow is not None:
                        todo.append(follow)
            return mine

    async def _execute(self, cmd: nm.Command) -> nm.Event | None:
        """Carry out one command; returns the event its immediate outcome is (or None)."""
        inp = self._inp
        # the ledger and policy calls are short and idempotent: local activities
        # (workflows.local), run in this worker inside the workflow task
        if isinstance(cmd, nm.RecordAlert):
            aid = cmd.alert.alert_id
            self._spawn(start_local(
                ACT.ledger_record_alert, cmd.alert, result_type=bool,
                start_to_close=_ACT_TIMEOUT, retry_policy=_ACT_RETRY),
                lambda _r: nm.AlertRecorded(alert_id=aid),
                lambda _e: nm.AlertRecorded(alert_id=aid, ok=False))
        elif isinstance(cmd, nm.LoadPolicy):
            self._spawn(start_local(
                ACT.load_node_policy, NodeRef(cluster=inp.cluster, node=inp.node),
                result_type=NodePolicy, start_to_close=_ACT_TIMEOUT, retry_policy=_ACT_RETRY),
                self._policy_event, lambda e: nm.PolicyFailed(message=_cause(e)))
        elif isinstance(cmd, (nm.ReadLedger, nm.ProbeRepair)):
            read = isinstance(cmd, nm.ReadLedger)
            self._spawn(start_local(
                ACT.ledger_open_repair,
                RepairProbe(cluster=inp.cluster, node=inp.node, repair_id=cmd.repair_id),
                result_type=RepairLiveness,
                start_to_close=_READ_TIMEOUT if read else _ACT_TIMEOUT,
                retry_policy=_READ_RETRY if read else _BEST_EFFORT),
                *_liveness_events(cmd))
        elif isinstance(cmd, nm.StartRepair):
            await self._start_repair(cmd)
            return nm.RepairStarted(repair_id=cmd.repair_id)
        elif isinstance(cmd, nm.AttachAlert):
            wid = workflow_id_repair(inp.cluster, inp.node, cmd.repair_id)
            try:
                await workflow.get_external_workflow_handle(wid).signal(
                    REPAIR_SIGNAL_ATTACH_ALERT, cmd.alert)
            except FailureError:
                return nm.AttachDone(alert_id=cmd.alert.alert_id, ok=False)
            return nm.AttachDone(alert_id=cmd.alert.alert_id, ok=True)
        elif isinstance(cmd, nm.CloseLedger):
            await self._effect(start_local(
                ACT.ledger_record_transition,
                TransitionRecord(repair_id=cmd.repair_id, stage=cmd.stage, at=cmd.at,
                                 by="system", reason=f"repair workflow {cmd.how} before it "
                                 "finished; recorded by the node workflow",
                                 # one close per repair, whichever task (or run) writes
                                 # it: a task re-run after a crash has a later ``at``
                                 write_key=f"node-close/{cmd.repair_id}"),
                start_to_close=_ACT_TIMEOUT, retry_policy=_BEST_EFFORT))
        elif isinstance(cmd, nm.ReleaseLease):
            try:
                await workflow.get_external_workflow_handle(
                    workflow_id_guard(inp.cluster)
                ).signal(GUARD_SIGNAL_RELEASE,
                         LeaseRelease(repair_id=cmd.repair_id, outcome=cmd.outcome))
            except FailureError:
                pass  # no guard running: a fresh one rebuilds from the ledger
        elif isinstance(cmd, nm.ReportFault):
            try:
                await workflow.get_external_workflow_handle(
                    workflow_id_guard(inp.cluster)).signal(GUARD_SIGNAL_FAULT_SEEN, cmd.report)
            except FailureError:
                return nm.FaultReportFailed(report=cmd.report, retried=cmd.retried)
        elif isinstance(cmd, nm.StartGuard):
            try:
                await workflow.start_child_workflow(
                    GUARD_WORKFLOW, GuardInput(cluster=inp.cluster),
                    id=workflow_id_guard(inp.cluster), task_queue=workflow.info().task_queue,
                    parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                    static_summary=guard_summary(inp.cluster),
                    static_details=guard_details(inp.cluster))
            except WorkflowAlreadyStartedError:
                pass  # started meanwhile (a repair's lease request): the report goes there
        elif isinstance(cmd, nm.Notify):
            await self._effect(workflow.start_activity(
                ACT.notify,
                Notification(cluster=inp.cluster, node=inp.node, repair_id=cmd.repair_id,
                             subject=cmd.subject, body=cmd.body, severity=cmd.severity,
                             event=cmd.event or None),
                start_to_close_timeout=_ACT_TIMEOUT, retry_policy=_BEST_EFFORT))
        elif isinstance(cmd, nm.SetDetails):
            workflow.set_current_details(cmd.text)
        elif isinstance(cmd, nm.ContinueAsNew):
            workflow.continue_as_new(NodeInput(
                cluster=inp.cluster, node=inp.node, machine_id=inp.machine_id,
                node_pool=inp.node_pool, carried=cmd.state.model_dump(mode="json")),
                initial_versioning_behavior=upgrade_behavior(self._upgrade_seen))
        # SetTimer: the machine's state holds the timer (``timer_at``), which run() waits on
        return None

    async def _effect(self, handle: Any) -> None:
        """Await a side effect in place (best effort: a failure is logged; the answers
        that follow it in the same step are given after it)."""
        try:
            await handle
        except ActivityError as err:
            workflow.logger.warning("node %s: %s", self._inp.node, _cause(err))

    def _spawn(self, handle: Any, ok: Callable[[Any], nm.Event] | None = None,
               failed: Callable[[ActivityError], nm.Event] | None = None) -> None:
        """Await an activity started in command order; step its outcome as an event."""

        async def outcome() -> None:
            try:
                result = await handle
            except ActivityError as err:
                workflow.logger.warning("node %s: activity failed: %s", self._inp.node, err)
                ev = failed(err) if failed else None
            else:
                ev = ok(result) if ok else None
            if ev is not None:
                await self._deliver(ev)

        task = asyncio.create_task(outcome())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _policy_event(self, snap: NodePolicy) -> nm.Event:
        """``load_node_policy``'s slice as the machine's event (this node's machine and
        pool; the snapshot's accessors read as ``load_policy``'s did)."""
        node = self._inp.node
        return nm.PolicyLoaded(catalogue=snap.policy.catalogue, rails=snap.policy.rails,
                               machine_id=snap.machines.get(node),
                               node_pool=snap.pools.get(node),
                               grace_s=snap.policy.maintenance.grace_s,
                               domains=snap.domains.get(node, []))

    async def _start_repair(self, cmd: nm.StartRepair) -> None:
        inp = self._inp
        req = RepairRequest(
            repair_id=cmd.repair_id, cluster=inp.cluster, node=inp.node,
            machine_id=cmd.machine_id, node_pool=cmd.node_pool, action=cmd.action,
            requester=Requester(kind=RequesterKind.system, name="autorepair"),
            reason=cmd.reason, alerts=cmd.alerts)
        handle = await workflow.start_child_workflow(
            REPAIR_WORKFLOW,
            req,
            id=workflow_id_repair(inp.cluster, inp.node, cmd.repair_id),
            task_queue=workflow.info().task_queue,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            static_summary=repair_summary(req),
            static_details=repair_details(req),
            # visible to search from its first event: the repair's own first upsert comes
            # only after its policy read (command attributes are not replay-checked)
            search_attributes=_repair_search_attributes(req),
        )
        task = asyncio.create_task(self._watch_child(handle, cmd.repair_id))
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _watch_child(
        self, handle: workflow.ChildWorkflowHandle[object, object], rid: str
    ) -> None:
        """Await the repair this run started; its end is the machine's event."""
        try:
            await handle
            how = "completed"
        except ChildWorkflowError as err:
            how = child_end(err.cause)
        await self._deliver(nm.RepairEnded(repair_id=rid, how=how))


def child_end(cause: BaseException | None) -> str:
    """Temporal's way a repair child ended, in lower case, from its failure's cause. A
    repair that ended ``failed`` / ``timed_out`` fails its workflow on purpose
    (``REPAIR_FAILED`` / ``REPAIR_TIMED_OUT``) after its own cleanup and ledger row: it
    finished, like a completed one."""
    if isinstance(cause, ApplicationError) and cause.type in (REPAIR_FAILED, REPAIR_TIMED_OUT):
        return "completed"
    if isinstance(cause, TerminatedError):
        return "terminated"
    if isinstance(cause, TemporalTimeoutError):
        return "timed_out"
    if isinstance(cause, CancelledError):
        return "canceled"
    return "failed"


def _liveness_events(
    cmd: nm.ReadLedger | nm.ProbeRepair,
) -> tuple[Callable[[RepairLiveness], nm.Event], Callable[[ActivityError], nm.Event]]:
    """``ledger_open_repair``'s answer (or failure) as the event for ``cmd``."""
    if isinstance(cmd, nm.ProbeRepair):
        rid = cmd.repair_id
        return (lambda live: nm.RepairProbed(repair_id=rid, running=live.running,
                                             status=live.status),
                lambda _e: nm.RepairProbed(repair_id=rid, ok=False))
    return (lambda live: nm.LedgerRead(repair_id=live.repair_id, stage=live.stage,
                                       running=live.running, status=live.status,
                                       last=_last_ended(live)),
            lambda e: nm.LedgerUnavailable(message=_cause(e)))


def _last_ended(live: RepairLiveness) -> nm.Finished | None:
    """The node's newest ended repair the ledger named, as the machine's end message."""
    if not live.last_repair_id or live.last_ended_at is None:
        return None
    try:
        stage = Stage(live.last_stage)
    except ValueError:
        return None
    return nm.Finished(repair_id=live.last_repair_id, stage=stage, at=live.last_ended_at,
                       alert_ids=live.last_alert_ids, actions=live.last_actions)


def calls(cmd: nm.Command) -> tuple[Call, ...]:
    """The outbound Temporal calls :meth:`NodeWorkflow._execute` makes for ``cmd`` (the
    fidelity check's expectation, :mod:`workflows.lifecycle.trace`); replies, timers and
    details stay inside the workflow: ``()``."""
    if isinstance(cmd, nm.RecordAlert):
        return (Call("local_activity", ACT.ledger_record_alert,
                     (("alert_id", cmd.alert.alert_id),)),)
    if isinstance(cmd, nm.LoadPolicy):
        return (Call("local_activity", ACT.load_node_policy),)
    if isinstance(cmd, (nm.ReadLedger, nm.ProbeRepair)):
        return (Call("local_activity", ACT.ledger_open_repair,
                     (("repair_id", cmd.repair_id),)),)
    if isinstance(cmd, nm.StartRepair):
        return (Call("child", REPAIR_WORKFLOW, (("repair_id", cmd.repair_id),
                                                ("action", cmd.action),
                                                ("machine_id", cmd.machine_id))),)
    if isinstance(cmd, nm.AttachAlert):
        return (Call("signal", REPAIR_SIGNAL_ATTACH_ALERT,
                     (("alert_id", cmd.alert.alert_id),)),)
    if isinstance(cmd, nm.CloseLedger):
        return (Call("local_activity", ACT.ledger_record_transition,
                     (("repair_id", cmd.repair_id), ("stage", cmd.stage))),)
    if isinstance(cmd, nm.ReleaseLease):
        return (Call("signal", GUARD_SIGNAL_RELEASE, (("repair_id", cmd.repair_id),)),)
    if isinstance(cmd, nm.ReportFault):
        return (Call("signal", GUARD_SIGNAL_FAULT_SEEN,
                     (("alert_id", cmd.report.alert_id),)),)
    if isinstance(cmd, nm.StartGuard):
        return (Call("child", GUARD_WORKFLOW),)
    if isinstance(cmd, nm.Notify):
        return (Call("activity", ACT.notify, (("subject", cmd.subject),)),)
    if isinstance(cmd, nm.ContinueAsNew):
        return (Call("continue_as_new", ""),)
    return ()


def _cause(err: BaseException) -> str:
    cause = err.__cause__
    return str(cause) if cause is not None else str(err)


def _repair_search_attributes(req: RepairRequest) -> TypedSearchAttributes:
    """docs/design.md §4.4's search attributes of a repair about to start (the values its own
    first upsert sets: :func:`~workflows.protocol.repair_identity_attributes`, action,
    stage ``recommended``)."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(k, v) for k, v in repair_identity_attributes(req, req.machine_id)
    ]
    pairs += [
        SearchAttributePair(SA_ACTION, req.action.value),
        SearchAttributePair(SA_STAGE, Stage.recommended.value),
        SearchAttributePair(SA_STATE, repair_state(Stage.recommended)),
    ]
    return TypedSearchAttributes(pairs)
