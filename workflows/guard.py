"""``ClusterGuardWorkflow`` (id ``guard/{cluster}``): concurrency budget and circuit breaker.

One long-running workflow per cluster. Repairs ask it for a lease before they cordon
(signal protocol in :mod:`workflows.protocol`); it grants within the budget
(``max(min_concurrent, ceil(concurrency_fraction × GPU nodes))``), one repair per node
and one per node pool at a time (the pool from its own configuration, not from the
request), at most ``rails.detector_cap`` detector-requested repairs, and trips the
circuit breaker when automatic repair/cordon requests within ``rails.breaker_window_s``
exceed ``max(breaker_min, ceil(breaker_fraction × GPU nodes))``. While open, automatic
requests are queued (refused) and a cluster-level alert is raised; an operator's
``reset_breaker`` signal closes it and queued requests are granted with the reset time,
so the repairs only act on evidence observed after it (docs/design.md §5 rails: evidence is
re-checked right before acting).

"GPU nodes" is the configured count; with none configured, the nodes that reported a GPU
(ledger alerts naming one, or a request whose evidence names one), never every node that
asked for a lease.

Every decision is made by the pure machine :mod:`workflows.lifecycle.guard`
(``step(state, event, now) -> (state, commands)``, issue 26); this workflow turns
signals, activity results and timers into its events and executes its commands.

Throughput (issue 30 item 1): every message that arrived before the guard's next step
(signals, and the outcomes of its own replies and effects) is decided in one ``step``
over a :class:`~workflows.lifecycle.guard.Batch`. The calls a step commands go out in the
commanded order (:meth:`ClusterGuardWorkflow._pump`): the ``lease`` replies as one
``guard_send_leases`` activity per batch (:mod:`activities.guard_replies`; one out at a
time, so a requester gets its replies in order, and the next gathers every reply decided
meanwhile), each ledger write and notification as a best-effort activity of its own,
run concurrently (at most :data:`MAX_IN_FLIGHT`). Their outcomes (a gone requester, a
failed effect) are messages of a later batch. Nothing the guard writes is on the
decision path: a decision waits only for a policy or ledger read the machine asked for.
A reply used to be an external signal whose completion woke the guard for a workflow
task of its own: tasks grew with decisions, not batches (docs/scaling.md).

Durability (docs/design.md §5 rails must hold across restarts):

- a step's replies start before its ledger writes and notifications (the commanded
  order); a reply that cannot be sent for another reason than its requester being gone
  is noted and the decision kept (the requester re-sends); notifications and ledger
  writes are best effort (bounded retries; a failure is noted in ``GuardStatus.errors``
  and logged, never fails the guard);
- continue-as-new waits for every commanded call to have gone out and come back, and for
  every handler, then carries the messages that arrived meanwhile (``carried["inbox"]``,
  :data:`CARRIED_INBOX`) into the next run, which decides them first: none is lost;
- a lease lives as long as its holder: holders renew it from their long waits, and at
  expiry the guard asks the holder (a signal) — still running, the lease is extended;
  gone, the slot is freed;
- a fresh guard (first start, or after it was terminated) rebuilds leases, recent
  automatic starts and the breaker from the ledger and tells each rebuilt holder (a
  holder that is gone is dropped); it retries until the ledger answers and grants
  nothing meanwhile (I21); waiters re-send their requests every
  :data:`~workflows.protocol.LEASE_RESEND_S`.

Operator interface (the ``autorepair breaker`` and ``autorepair domains`` CLIs): query
``status`` → GuardStatus, signal ``reset_breaker`` ``{"by": USER, "reason": TEXT}``,
signal ``release_domain`` ``{"domain": D, "by": USER, "reason": TEXT}`` (issue 29 item 2:
a failure-domain hold holds every automatic repair of the domain's nodes until then).
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import (
        ACT,
        GuardLedgerState,
        GuardStateQuery,
        LeaseDeliveries,
        LeaseDelivery,
        LeaseOutcomes,
        Notification,
        PolicySnapshot,
    )
    from workflows.config import PolicyConfig
    from workflows.leases import FaultReport
    from workflows.lifecycle import guard as gm
    from workflows.lifecycle.trace import Call, Trace
    from workflows.models import Alert, RequesterKind
    from workflows.policy import breaker_threshold, concurrency_budget
    from workflows.protocol import (
        GUARD_QUERY_STATUS,
        GUARD_SIGNAL_ACQUIRE,
        GUARD_SIGNAL_CLUSTER_ALERT,
        GUARD_SIGNAL_FAULT_SEEN,
        GUARD_SIGNAL_RELEASE,
        GUARD_SIGNAL_RELEASE_DOMAIN,
        GUARD_SIGNAL_RESET_BREAKER,
        GUARD_WORKFLOW,
        GuardInput,
        GuardStatus,
        LeaseRelease,
        LeaseRequest,
        ReleaseDomainSignal,
        ResetBreakerSignal,
        workflow_id_repair,
    )
    from workflows.upgrades import upgrade_behavior, upgrade_due

#: Re-exported from the machine (the names the first release defined here).
DEFAULT_HISTORY_LIMIT = gm.DEFAULT_HISTORY_LIMIT
POLICY_REFRESH_S = gm.POLICY_REFRESH_S
BREAKER_KIND = gm.BREAKER_KIND
_ACT_TIMEOUT = timedelta(seconds=30)
#: Side effects (ledger writes, notifications) and the two reads (policy, ledger) are
#: tried a few times (1 + 2 + 4 + 8 s apart), then the machine is told: it notes a failed
#: effect, serves on the last policy read when a refresh fails, and retries a first read
#: or the ledger on its own timer. A read retried without end blocked the guard: while
#: it is out every message waits (no grant, release or expiry) for the whole outage.
_EFFECT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5)
#: Most replies and effects in flight at once. The Temporal server fails a workflow task
#: that leaves more than 2,000 external signals (``limit.numPendingSignals.error``) or
#: 2,000 activities (``limit.numPendingActivities.error``) pending (its defaults); half of
#: that leaves room to spare.
MAX_IN_FLIGHT = 1000
#: Most replies one ``guard_send_leases`` carries: a step's replies (at most
#: :data:`MAX_BATCH` requests, each answered once, plus the grants a release makes) fit
#: in one, and 1,000 replies of about 250 bytes stay far below the server's 2 MB payload
#: limit (``limit.blobSize.error``).
MAX_REPLIES = 1000
#: Bound of one ``guard_send_leases`` attempt: 1,000 signals at 32 in flight take about
#: 3 s on the 2-core dev stack; a slow or restarted worker's attempt is retried.
_REPLY_TIMEOUT = timedelta(seconds=60)
#: Most messages one step decides. The SDK fails a workflow task whose activation runs
#: longer than 2 s without yielding (its deadlock detector, TMPRL1101); a batch of 1,000
#: requests took longer than that on a loaded 2-core machine (tests/bench/guard_throughput.py),
#: 200 take about a tenth of it. A longer inbox is decided in steps of this size, each
#: in an activation of its own (:data:`_BATCH_PAUSE`).
MAX_BATCH = 200
#: The pause between two steps of a long inbox when no reply batch is out (with one out,
#: its completion starts the next activation): a timer, so the next step runs in a new
#: activation (1 ms: the shortest timer; the dev server fires it within about a second,
#: which is why a reply batch's completion is waited for instead where there is one).
_BATCH_PAUSE = timedelta(milliseconds=1)
#: Key of the carried messages in ``GuardInput.carried`` (beside the machine's state,
#: which ignores it).
CARRIED_INBOX = "inbox"
#: Longest a long inbox's next step waits for the reply batch out (a batch normally
#: completes within about a second; one whose attempt is retried must not stall the
#: decisions behind it).
_CUT_WAIT = timedelta(seconds=2)
_INBOX: TypeAdapter[list[gm.Message]] = TypeAdapter(list[gm.Message])


def policy_view(snap: PolicySnapshot | None) -> gm.PolicyView:
    """The rails the machine applies, from ``load_policy``'s snapshot (None: the
    defaults of :class:`~workflows.config.PolicyConfig`). Budget and breaker threshold
    are :func:`~workflows.policy.concurrency_budget` and
    :func:`~workflows.policy.breaker_threshold` of the configured GPU node count (nodes
    named by alerts are no denominator, issue 27 item 9)."""
    policy = snap.policy if snap else PolicyConfig()
    gpu = snap.gpu_nodes if snap else 0
    rails = policy.rails
    return gm.PolicyView(
        gpu_nodes=gpu,
        budget=concurrency_budget(gpu, rails, 0),
        breaker_threshold=breaker_threshold(gpu, rails, 0),
        breaker_window_s=rails.breaker_window_s,
        one_per_pool=rails.one_per_pool,
        detector_cap=rails.detector_cap,
        lease_ttl_s=rails.lease_ttl_s,
        pools=dict(snap.pools) if snap else {},
        domains={n: list(ds) for n, ds in snap.domains.items()} if snap else {},
        domain_threshold=policy.domains.threshold,
        domain_window_s=policy.domains.window_s,
    )


def ledger_view(cluster: str, st: GuardLedgerState) -> gm.LedgerView:
    """The machine's view of ``ledger_guard_state``'s answer."""
    holders = [
        gm.HeldRepair(
            repair_id=h.repair_id,
            node=h.node,
            workflow_id=h.workflow_id or workflow_id_repair(cluster, h.node, h.repair_id),
            automatic=h.automatic,
            requested_at=h.requested_at,
            node_pool=h.node_pool,
            requester_kind=RequesterKind(h.requester_kind)
            if h.requester_kind in RequesterKind.__members__
            else RequesterKind.system,
        )
        for h in st.holders
    ]
    return gm.LedgerView(
        holders=holders,
        automatic=[(a.repair_id, a.at) for a in st.automatic],
        breaker_open=st.breaker_open,
        tripped_at=st.tripped_at,
        tripped_reason=st.tripped_reason,
        holds=list(st.domain_holds),
        reset_at=st.reset_at,
        reset_by=st.reset_by,
        releases=list(st.domain_releases),
    )


@workflow.defn(name=GUARD_WORKFLOW)
class ClusterGuardWorkflow:
    """Budget + breaker for one cluster; runs until cancelled, continuing as new. A thin
    interpreter of :mod:`workflows.lifecycle.guard`."""

    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self._cluster = inp.cluster
        self._fresh = not inp.carried
        default = policy_view(None)
        self._m = (
            gm.GuardState.model_validate(
                {"cluster": inp.cluster, "policy": default.model_dump(mode="json"),
                 **inp.carried}
            )
            if inp.carried
            else gm.new_state(inp.cluster, default)
        )
        #: messages not yet stepped (signals, outcomes of calls), in arrival order
        self._inbox: list[gm.Message] = (
            _INBOX.validate_python(inp.carried.get(CARRIED_INBOX) or [])
            if inp.carried else [])
        #: replies, ledger writes and notifications commanded and not yet started, in
        #: the commanded order (:meth:`_pump` starts them)
        self._outbox: list[gm.SendLease | gm.WriteAlert | gm.Notify] = []
        #: a ``guard_send_leases`` is out (one at a time)
        self._replying = False
        #: ledger writes and notifications started and not finished
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: what ``step`` commanded, checked against what runs (issue 26 item 5)
        self.lifecycle_trace = Trace()

    # ---- signals / queries -------------------------------------------------------
    @workflow.signal(name=GUARD_SIGNAL_ACQUIRE)
    def acquire(self, req: LeaseRequest) -> None:
        """Ask for (or renew) a lease; the answer comes back as signal ``lease`` to
        ``req.workflow_id``."""
        self._inbox.append(gm.Request(req=req))

    @workflow.signal(name=GUARD_SIGNAL_RELEASE)
    def release(self, rel: LeaseRelease) -> None:
        """Give a lease (or a queued request) back."""
        self._inbox.append(gm.Release(rel=rel))

    @workflow.signal(name=GUARD_SIGNAL_RESET_BREAKER)
    def reset_breaker(self, sig: ResetBreakerSignal) -> None:
        """Operator closes the breaker: ``{"by": "alice"}``."""
        self._inbox.append(gm.ResetBreaker(sig=sig))

    @workflow.signal(name=GUARD_SIGNAL_RELEASE_DOMAIN)
    def release_domain(self, sig: ReleaseDomainSignal) -> None:
        """Operator lifts a failure-domain hold: ``{"domain": "rack-07", "by": "alice"}``."""
        self._inbox.append(gm.ReleaseDomain(sig=sig))

    @workflow.signal(name=GUARD_SIGNAL_FAULT_SEEN)
    def fault_seen(self, rep: FaultReport) -> None:
        """A node of a failure domain raised an actionable fault (issue 29 item 2):
        counted toward its domains' holds on arrival (the guard's clock)."""
        self._inbox.append(gm.FaultSeen(report=rep))

    @workflow.signal(name=GUARD_SIGNAL_CLUSTER_ALERT)
    def cluster_alert(self, alert: Alert) -> None:
        """A cluster-level alert from outside (ingest panic mode): recorded (idempotent on
        ``alert.alert_id``) and notified, best effort; nothing is tripped."""
        self._inbox.append(gm.ClusterAlert(alert=alert))

    @workflow.query(name=GUARD_QUERY_STATUS)
    def status(self) -> GuardStatus:
        """Budget, leases, queued requests, breaker state, recent automatic requests."""
        s = self._m
        return GuardStatus(
            cluster=self._cluster,
            gpu_nodes=s.policy.gpu_nodes,
            budget=s.policy.budget,
            breaker_threshold=s.policy.breaker_threshold,
            breaker_window_s=s.policy.breaker_window_s,
            breaker_open=s.breaker_open,
            tripped_at=s.tripped_at,
            tripped_reason=s.tripped_reason,
            reset_at=s.reset_at,
            reset_by=s.reset_by,
            leases=list(s.leases),
            pending=_pending(s),
            recent_automatic=gm.window_count(s, workflow.now()),
            refused_total=s.refused_total,
            expired=list(s.expired),
            errors=list(s.errors),
            rebuilt_at=s.rebuilt_at,
            policy_loaded=s.policy.loaded,
            domain_holds=list(s.holds),
            domain_faults=list(s.domain_faults),
            domain_releases=list(s.domain_releases),
            domain_threshold=s.policy.domain_threshold,
            domain_window_s=s.policy.domain_window_s,
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        """Serve lease requests forever. Input ``{"cluster": "demo"}``."""
        self._spawn(self._pump())
        await self._deliver(gm.Started(fresh=self._fresh))
        cut = False  # the last step left part of a long inbox for later
        while True:
            if cut and self._replying:
                # decide the rest in a new activation (the deadlock bound): the one the
                # reply batch out completes in, when the pump would send the next anyway
                # (a batch retried for long holds no decision back: _CUT_WAIT)
                try:
                    await workflow.wait_condition(lambda: not self._replying,
                                                  timeout=_CUT_WAIT)
                except TimeoutError:
                    pass
            elif cut:
                await workflow.sleep(_BATCH_PAUSE)
            else:
                try:
                    await workflow.wait_condition(lambda: bool(self._inbox),
                                                  timeout=self._next_timer_in())
                except TimeoutError:
                    pass
            now = workflow.now()
            for name, at in sorted(self._m.timers.items(), key=lambda kv: kv[1]):
                if at <= now:
                    await self._deliver(gm.TimerFired(name=name))
            cut = len(self._inbox) > MAX_BATCH
            if self._inbox:  # one step of at most MAX_BATCH messages
                batch, self._inbox = self._inbox[:MAX_BATCH], self._inbox[MAX_BATCH:]
                await self._deliver(gm.Batch(events=batch))
            info = workflow.info()
            # a storm never empties the inbox: continue-as-new carries what is left
            # a newer current build: move to it by continue-as-new (workflows.upgrades)
            if (info.is_continue_as_new_suggested()
                    or info.get_current_history_length() > self._m.history_limit
                    or upgrade_due()):
                await self._deliver(gm.HistoryLong())

    def _next_timer_in(self) -> timedelta | None:
        if not self._m.timers:
            return None
        soonest = min(self._m.timers.values())
        return max(soonest - workflow.now(), timedelta(seconds=1))

    async def _deliver(self, event: gm.Event) -> None:
        """Step the machine with ``event`` and execute its commands in order. A read's
        outcome (policy, ledger) is stepped after the step's commands; replies and effects
        go to the outbox (:meth:`_pump` starts them) and their outcomes join the inbox."""
        todo: deque[gm.Event] = deque([event])
        while todo:
            ev = todo.popleft()
            self._m, cmds = gm.step(self._m, ev, workflow.now())
            self.lifecycle_trace.commanded(c for cmd in cmds for c in calls(cmd))
            for cmd in cmds:
                follow = await self._execute(cmd)
                if follow is not None:
                    todo.append(follow)

    async def _execute(self, cmd: gm.Command) -> gm.Event | None:
        """Carry out one command; returns the event a read's outcome is (or None)."""
        if isinstance(cmd, gm.SendLease | gm.WriteAlert | gm.Notify):
            self._outbox.append(cmd)
        elif isinstance(cmd, gm.LoadPolicy | gm.ReadLedger):
            # every call commanded before it goes out first (the commanded order)
            await workflow.wait_condition(lambda: not self._outbox)
            return await self._read(cmd)
        elif isinstance(cmd, gm.SetDetails):
            workflow.set_current_details(cmd.text)
        elif isinstance(cmd, gm.Warn):
            workflow.logger.warning("guard cluster=%s: %s", self._cluster, cmd.text)
        elif isinstance(cmd, gm.ContinueAsNew):
            await self._continue_as_new()
        # StartTimer / CancelTimer: the machine's state holds the timers (``timers``),
        # which the main loop waits on
        return None

    async def _pump(self) -> None:
        """Start the outbox's calls in the commanded order, forever: the replies at its
        head as one ``guard_send_leases`` (at most :data:`MAX_REPLIES`; only one at a
        time, so a requester gets its replies in order and a batch waits for the one
        before it, gathering what came meanwhile), each ledger write or notification as
        its own best-effort activity (at most :data:`MAX_IN_FLIGHT`)."""
        while True:
            await workflow.wait_condition(lambda: bool(self._outbox))
            head = self._outbox[0]
            if isinstance(head, gm.SendLease):
                await workflow.wait_condition(lambda: not self._replying)
                n = 0
                while (n < len(self._outbox) and n < MAX_REPLIES
                       and isinstance(self._outbox[n], gm.SendLease)):
                    n += 1
                batch = [c for c in self._outbox[:n] if isinstance(c, gm.SendLease)]
                del self._outbox[:n]
                self._replying = True
                self._spawn(self._replies(batch))
            else:
                if self._in_flight >= MAX_IN_FLIGHT:
                    await workflow.wait_condition(lambda: self._in_flight < MAX_IN_FLIGHT)
                self._outbox.pop(0)
                assert isinstance(head, gm.WriteAlert | gm.Notify)
                self._in_flight += 1
                self._spawn(self._background(head))
            await asyncio.sleep(0)  # the task makes its call before the next one starts

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def _replies(self, batch: list[gm.SendLease]) -> None:
        """One ``guard_send_leases`` for ``batch``; a gone requester's outcome is a
        ``ReplyUndeliverable``, any other failure an ``EffectFailed`` (noted), each a
        message of a later batch."""
        try:
            follow = await self._send_leases(batch)
        finally:
            self._replying = False
        self._inbox.extend(follow)

    async def _send_leases(self, batch: list[gm.SendLease]) -> list[gm.Message]:
        inp = LeaseDeliveries(guard_id=workflow.info().workflow_id, commands=[
            LeaseDelivery(workflow_id=c.workflow_id, reply=c.reply, purpose=c.purpose)
            for c in batch])
        try:
            out = await workflow.execute_activity(
                ACT.guard_send_leases,
                inp,
                result_type=LeaseOutcomes,
                start_to_close_timeout=_REPLY_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            return [gm.EffectFailed(what="send_lease", subject=f"{len(batch)} lease replies",
                                    message=_cause(err))]
        follow: list[gm.Message] = []
        for o in out.outcomes:
            if o.status == "gone":
                follow.append(gm.ReplyUndeliverable(repair_id=o.repair_id, purpose=o.purpose))
            elif o.status == "failed":
                follow.append(gm.EffectFailed(what="send_lease", subject=o.repair_id,
                                              message=o.message))
        return follow

    async def _background(self, cmd: gm.WriteAlert | gm.Notify) -> None:
        try:
            follow = await self._effect(cmd)
        finally:
            self._in_flight -= 1
        if follow is not None:
            self._inbox.append(follow)

    async def _continue_as_new(self) -> None:
        """Wait for every call in flight and every handler, then continue as new with the
        machine's state and the messages that arrived meanwhile (the next run decides
        them first). Nothing is awaited between the last look and ``continue_as_new``, so
        no signal can come in between."""
        await workflow.wait_condition(
            lambda: not self._outbox and not self._replying and self._in_flight == 0
            and workflow.all_handlers_finished())
        carried: dict[str, Any] = self._m.model_dump(mode="json")
        if self._inbox:
            carried[CARRIED_INBOX] = _INBOX.dump_python(self._inbox, mode="json")
        workflow.continue_as_new(GuardInput(cluster=self._cluster, carried=carried),
                                 initial_versioning_behavior=upgrade_behavior())

    async def _effect(self, cmd: gm.WriteAlert | gm.Notify) -> gm.Message | None:
        """A best-effort effect; returns the message its failure is (or None)."""
        if isinstance(cmd, gm.WriteAlert):
            try:
                await workflow.execute_activity(
                    ACT.ledger_record_alert,
                    cmd.alert,
                    result_type=bool,
                    start_to_close_timeout=_ACT_TIMEOUT,
                    retry_policy=_EFFECT_RETRY,
                )
            except ActivityError as err:
                return gm.EffectFailed(what="write_alert", subject=cmd.alert.alert_id,
                                       message=_cause(err))
            return None
        try:
            await workflow.execute_activity(
                ACT.notify,
                Notification(cluster=self._cluster, subject=cmd.subject, body=cmd.body,
                             severity=cmd.severity, event=cmd.event,
                             dedup_key=cmd.dedup_key),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            return gm.EffectFailed(what="notify", subject=cmd.subject, message=_cause(err))
        return None

    async def _read(self, cmd: gm.LoadPolicy | gm.ReadLedger) -> gm.Event:
        """A read the machine waits for; returns its outcome."""
        if isinstance(cmd, gm.LoadPolicy):
            try:
                snap = await workflow.execute_activity(
                    ACT.load_policy,
                    self._cluster,
                    result_type=PolicySnapshot,
                    start_to_close_timeout=_ACT_TIMEOUT,
                    retry_policy=_EFFECT_RETRY,
                )
            except ActivityError as err:
                return gm.PolicyFailed(message=_cause(err))
            return gm.PolicyRead(view=policy_view(snap))
        try:
            st = await workflow.execute_activity(
                ACT.ledger_guard_state,
                GuardStateQuery(cluster=self._cluster, since=cmd.since),
                result_type=GuardLedgerState,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            return gm.LedgerUnavailable(message=_cause(err))
        return gm.LedgerRead(view=ledger_view(self._cluster, st))


def _pending(s: gm.GuardState) -> list[LeaseRequest]:
    """The waiting requests: the queue's, then the deferred ones (a guard starting or
    rebuilding keeps each re-send until it decides them in order), one per repair (its
    newest copy)."""
    out: dict[str, LeaseRequest] = {q.req.repair_id: q.req for q in s.queue}
    for d in s.deferred:
        if isinstance(d, gm.Request):
            out[d.req.repair_id] = d.req
    return list(out.values())


def calls(cmd: gm.Command) -> tuple[Call, ...]:
    """The outbound Temporal calls :meth:`ClusterGuardWorkflow._execute` makes for
    ``cmd`` (the fidelity check's expectation, :mod:`workflows.lifecycle.trace`); timers,
    details and warnings stay inside the workflow: ``()``."""
    if isinstance(cmd, gm.SendLease):
        # one element of a ``guard_send_leases`` batch (LeaseDeliveries.commands)
        return (Call("activity", ACT.guard_send_leases, (
            ("workflow_id", cmd.workflow_id), ("repair_id", cmd.reply.repair_id),
            ("granted", cmd.reply.granted), ("purpose", cmd.purpose))),)
    if isinstance(cmd, gm.LoadPolicy):
        return (Call("activity", ACT.load_policy),)
    if isinstance(cmd, gm.ReadLedger):
        return (Call("activity", ACT.ledger_guard_state, (("since", cmd.since),)),)
    if isinstance(cmd, gm.WriteAlert):
        return (Call("activity", ACT.ledger_record_alert, (("alert_id", cmd.alert.alert_id),)),)
    if isinstance(cmd, gm.Notify):
        return (Call("activity", ACT.notify, (("dedup_key", cmd.dedup_key),)),)
    if isinstance(cmd, gm.ContinueAsNew):
        return (Call("continue_as_new", ""),)
    return ()


def _cause(err: BaseException) -> str:
    cause = err.__cause__
    return str(cause) if cause is not None else str(err)
