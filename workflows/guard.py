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
so the repairs only act on evidence observed after it (DESIGN §5 rails: evidence is
re-checked right before acting).

"GPU nodes" is the configured count; with none configured, the nodes that reported a GPU
(ledger alerts naming one, or a request whose evidence names one), never every node that
asked for a lease.

Durability (DESIGN §5 rails must hold across restarts):

- grants are signalled before any side effect runs; notifications and ledger writes are
  best effort (bounded retries; a failure is noted in ``GuardStatus.errors`` and logged,
  never fails the guard);
- a lease lives as long as its holder: holders renew it from their long waits, and at
  expiry the guard asks the holder (a signal) — still running, the lease is extended;
  gone, the slot is freed;
- a fresh guard (first start, or after it was terminated) rebuilds leases, recent
  automatic starts and the breaker from the ledger and tells each rebuilt holder (a
  holder that is gone is dropped); waiters re-send their requests every
  :data:`~workflows.protocol.LEASE_RESEND_S`.

Operator interface (the ``autorepair breaker`` CLI): query ``status`` → GuardStatus,
signal ``reset_breaker`` ``{"by": USER, "reason": TEXT}``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

    from workflows.activity_api import (
        ACT,
        GuardLedgerState,
        GuardStateQuery,
        Notification,
        PolicySnapshot,
    )
    from workflows.config import PolicyConfig
    from workflows.models import Alert, RequesterKind, Severity
    from workflows.policy import breaker_threshold, breaker_trips, concurrency_budget
    from workflows.protocol import (
        GUARD_QUERY_STATUS,
        GUARD_SIGNAL_ACQUIRE,
        GUARD_SIGNAL_CLUSTER_ALERT,
        GUARD_SIGNAL_RELEASE,
        GUARD_SIGNAL_RESET_BREAKER,
        GUARD_WORKFLOW,
        REPAIR_SIGNAL_LEASE,
        GuardInput,
        GuardStatus,
        Lease,
        LeaseRelease,
        LeaseReply,
        LeaseRequest,
        ResetBreakerSignal,
        workflow_id_repair,
    )

#: History length after which the guard continues as new (Temporal's own suggestion
#: also triggers it); overridable through ``GuardInput.carried["history_limit"]``.
DEFAULT_HISTORY_LIMIT = 10_000
#: Re-read the policy (``load_policy``) at most this often, seconds.
POLICY_REFRESH_S = 300.0
#: Kind of the breaker's cluster-level alerts (a trip raises, a reset clears).
BREAKER_KIND = "circuit_breaker"
#: Bounds of the lists kept for operators (newest kept).
MAX_EXPIRED = 50
MAX_ERRORS = 20
_ACT_TIMEOUT = timedelta(seconds=30)
_ACT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
#: Side effects (ledger writes, notifications) are best effort: a few tries, then noted.
_EFFECT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5)


class GuardCarried(BaseModel):
    """Guard state carried across continue-as-new."""

    leases: list[Lease] = Field(default_factory=list)
    pending: list[LeaseRequest] = Field(default_factory=list)
    breaker_open: bool = False
    tripped_at: datetime | None = None
    tripped_reason: str = ""
    reset_at: datetime | None = None
    reset_by: str | None = None
    automatic_times: list[datetime] = Field(default_factory=list)
    counted: list[str] = Field(default_factory=list)
    #: Nodes whose lease requests carried GPU evidence (breaker/budget denominator when
    #: no GPU node count is configured).
    gpu_nodes_seen: list[str] = Field(default_factory=list)
    #: Nodes of the cluster with a GPU-naming alert in the ledger (same use).
    gpu_nodes_reported: int = 0
    refused_total: int = 0
    breaker_queued: list[str] = Field(default_factory=list)
    expired: list[Lease] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    rebuilt_at: datetime | None = None
    history_limit: int = DEFAULT_HISTORY_LIMIT


@workflow.defn(name=GUARD_WORKFLOW)
class ClusterGuardWorkflow:
    """Budget + breaker for one cluster; runs until cancelled, continuing as new."""

    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self._cluster = inp.cluster
        self._s = GuardCarried.model_validate(inp.carried) if inp.carried else GuardCarried()
        self._inbox: list[LeaseRequest | LeaseRelease | ResetBreakerSignal] = []
        self._snapshot: PolicySnapshot | None = None
        self._loaded_at: datetime | None = None
        self._effects: list[Alert] = []

    # ---- signals / queries -------------------------------------------------------
    @workflow.signal(name=GUARD_SIGNAL_ACQUIRE)
    def acquire(self, req: LeaseRequest) -> None:
        """Ask for (or renew) a lease; the answer comes back as signal ``lease`` to
        ``req.workflow_id``."""
        self._inbox.append(req)

    @workflow.signal(name=GUARD_SIGNAL_RELEASE)
    def release(self, rel: LeaseRelease) -> None:
        """Give a lease (or a queued request) back."""
        self._inbox.append(rel)

    @workflow.signal(name=GUARD_SIGNAL_RESET_BREAKER)
    def reset_breaker(self, sig: ResetBreakerSignal) -> None:
        """Operator closes the breaker: ``{"by": "alice"}``."""
        self._inbox.append(sig)

    @workflow.signal(name=GUARD_SIGNAL_CLUSTER_ALERT)
    async def cluster_alert(self, alert: Alert) -> None:
        """A cluster-level alert from outside (ingest panic mode): record and notify it
        (best effort). The ledger write is idempotent on ``alert.alert_id``; nothing is
        tripped."""
        await self._record_cluster_alert(alert)

    async def _record_cluster_alert(self, alert: Alert) -> None:
        """Record a cluster-level alert in the ledger; notify while it is active. Best
        effort: a failure is noted (``GuardStatus.errors``), never raised."""
        try:
            await workflow.execute_activity(
                ACT.ledger_record_alert,
                alert,
                result_type=bool,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            self._note_error(f"ledger write of {alert.alert_id} failed: {_cause(err)}")
        if not alert.active:
            return
        try:
            await workflow.execute_activity(
                ACT.notify,
                Notification(
                    cluster=self._cluster,
                    subject=alert.summary,
                    body=alert.description,
                    severity=alert.severity.value,
                    event="breaker_tripped" if alert.kind == "circuit_breaker"
                    else "cluster_alert",
                    dedup_key=f"breaker/{self._cluster}" if alert.kind == "circuit_breaker"
                    else alert.alert_id,
                ),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            self._note_error(f"notification {alert.summary!r} failed: {_cause(err)}")

    def _note_error(self, text: str) -> None:
        workflow.logger.warning("guard side effect failed cluster=%s: %s", self._cluster, text)
        stamp = workflow.now().isoformat()
        self._s.errors = [*self._s.errors, f"{stamp} {text}"][-MAX_ERRORS:]

    @workflow.query(name=GUARD_QUERY_STATUS)
    def status(self) -> GuardStatus:
        """Budget, leases, queued requests, breaker state, recent automatic requests."""
        policy = self._policy()
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        seen = self._gpu_nodes_seen()
        return GuardStatus(
            cluster=self._cluster,
            gpu_nodes=gpu or seen,
            budget=concurrency_budget(gpu, policy.rails, seen),
            breaker_threshold=breaker_threshold(gpu, policy.rails, seen),
            breaker_window_s=policy.rails.breaker_window_s,
            breaker_open=self._s.breaker_open,
            tripped_at=self._s.tripped_at,
            tripped_reason=self._s.tripped_reason,
            reset_at=self._s.reset_at,
            reset_by=self._s.reset_by,
            leases=list(self._s.leases),
            pending=list(self._s.pending),
            recent_automatic=list(self._s.automatic_times),
            refused_total=self._s.refused_total,
            expired=list(self._s.expired),
            errors=list(self._s.errors),
            rebuilt_at=self._s.rebuilt_at,
            policy_loaded=self._snapshot is not None,
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        """Serve lease requests forever. Input ``{"cluster": "demo"}``."""
        workflow.set_current_details(f"cluster guard for {inp.cluster}")
        fresh = not inp.carried
        await self._refresh_policy(force=True)
        await self._read_ledger_state(rebuild=fresh)
        while True:
            timeout = self._next_expiry_in()
            try:
                await workflow.wait_condition(lambda: bool(self._inbox), timeout=timeout)
            except TimeoutError:
                pass
            await self._process()
            info = workflow.info()
            if (
                info.is_continue_as_new_suggested()
                or info.get_current_history_length() > self._s.history_limit
            ) and not self._inbox:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._inbox:
                    workflow.continue_as_new(
                        GuardInput(cluster=self._cluster, carried=self._s.model_dump(mode="json"))
                    )

    def _policy(self) -> PolicyConfig:
        return self._snapshot.policy if self._snapshot else PolicyConfig()

    def _ttl(self) -> timedelta:
        return timedelta(seconds=self._policy().rails.lease_ttl_s)

    def _gpu_nodes_seen(self) -> int:
        """Denominator when no GPU node count is configured: nodes that reported a GPU."""
        return max(self._s.gpu_nodes_reported, len(self._s.gpu_nodes_seen))

    def _pool_of(self, req: LeaseRequest) -> str | None:
        """The node's pool from the configuration (``load_policy``); the request's own
        (which the repair also took from configuration) only for unconfigured nodes."""
        pools = self._snapshot.pools if self._snapshot else {}
        return pools.get(req.node) or req.node_pool

    async def _refresh_policy(self, force: bool = False) -> None:
        now = workflow.now()
        if (
            not force
            and self._loaded_at is not None
            and (now - self._loaded_at).total_seconds() < POLICY_REFRESH_S
        ):
            return
        try:
            self._snapshot = await workflow.execute_activity(
                ACT.load_policy,
                self._cluster,
                result_type=PolicySnapshot,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_ACT_RETRY,
            )
        except ActivityError as err:
            # keep serving on the last policy (or the defaults) rather than fail
            self._note_error(f"load_policy failed: {_cause(err)}")
        self._loaded_at = now
        if not force:
            await self._read_ledger_state(rebuild=False)

    async def _read_ledger_state(self, rebuild: bool) -> None:
        """Read the ledger's view of the cluster (``ledger_guard_state``); on a fresh
        start (``rebuild``) take its holders, automatic starts and breaker as ours and tell
        every rebuilt holder (a holder that is gone is dropped)."""
        now = workflow.now()
        window = timedelta(seconds=self._policy().rails.breaker_window_s)
        try:
            st = await workflow.execute_activity(
                ACT.ledger_guard_state,
                GuardStateQuery(cluster=self._cluster, since=now - window),
                result_type=GuardLedgerState,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_EFFECT_RETRY,
            )
        except ActivityError as err:
            self._note_error(f"reading the ledger's guard state failed: {_cause(err)}")
            return
        self._s.gpu_nodes_reported = st.gpu_nodes_reported
        if not rebuild:
            return
        s = self._s
        ttl = self._ttl()
        pools = self._snapshot.pools if self._snapshot else {}
        rebuilt: list[Lease] = []
        for hr in st.holders:
            if any(x.repair_id == hr.repair_id for x in s.leases):
                continue
            kind = (
                RequesterKind(hr.requester_kind)
                if hr.requester_kind in RequesterKind.__members__
                else RequesterKind.system
            )
            lease = Lease(
                repair_id=hr.repair_id,
                workflow_id=hr.workflow_id
                or workflow_id_repair(self._cluster, hr.node, hr.repair_id),
                node=hr.node,
                node_pool=pools.get(hr.node),
                automatic=hr.automatic,
                requester_kind=kind,
                granted_at=now,
                expires_at=now + ttl,
                source="ledger",
            )
            s.leases.append(lease)
            rebuilt.append(lease)
        for a in st.automatic:
            if a.repair_id not in s.counted:
                s.counted.append(a.repair_id)
                s.automatic_times.append(a.at)
        if st.breaker_open and not s.breaker_open:
            s.breaker_open = True
            s.tripped_at = st.tripped_at
            s.tripped_reason = st.tripped_reason or "breaker open in the ledger"
            workflow.set_current_details(f"circuit breaker OPEN: {s.tripped_reason}")
        s.rebuilt_at = now
        for lease in rebuilt:
            await self._reply(
                lease.workflow_id,
                LeaseReply(
                    repair_id=lease.repair_id,
                    granted=True,
                    reason="lease re-registered from the ledger after a guard restart",
                    expires_at=lease.expires_at,
                ),
            )

    def _next_expiry_in(self) -> timedelta | None:
        if not self._s.leases:
            return None
        soonest = min(lease.expires_at for lease in self._s.leases)
        return max(soonest - workflow.now(), timedelta(seconds=1))

    async def _process(self) -> None:
        replies: list[tuple[str, LeaseReply]] = []
        while self._inbox:
            msg = self._inbox.pop(0)
            if isinstance(msg, LeaseRequest):
                await self._refresh_policy()
                replies.extend(await self._on_acquire(msg))
            elif isinstance(msg, LeaseRelease):
                self._s.leases = [x for x in self._s.leases if x.repair_id != msg.repair_id]
                self._s.pending = [x for x in self._s.pending if x.repair_id != msg.repair_id]
            else:
                await self._on_reset(msg)
        await self._expire()
        replies.extend(self._grant_pending())
        # decided grants go out before any side effect can fail or take time
        for wid, reply in replies:
            await self._reply(wid, reply)
        effects, self._effects = self._effects, []
        for alert in effects:
            await self._record_cluster_alert(alert)

    async def _effect(self, alert: Alert) -> None:
        """Record ``alert`` after this round's replies."""
        self._effects.append(alert)

    async def _on_reset(self, msg: ResetBreakerSignal) -> None:
        s = self._s
        now = workflow.now()
        was_open, tripped_at = s.breaker_open, s.tripped_at
        s.breaker_open = False
        s.reset_at = now
        s.reset_by = msg.by
        s.automatic_times = []
        s.counted = []
        workflow.set_current_details(
            f"breaker reset by {msg.by} at {now.isoformat()}: {msg.reason}"
        )
        if was_open:
            # the clear tells a guard rebuilt from the ledger that the breaker is closed
            since = tripped_at.isoformat() if tripped_at else now.isoformat()
            self._effects.append(
                Alert(
                    alert_id=f"breaker/{self._cluster}/{since}/reset",
                    cluster=self._cluster,
                    node="*",
                    kind=BREAKER_KIND,
                    severity=Severity.info,
                    summary=f"Circuit breaker reset on cluster {self._cluster} by {msg.by}",
                    description=msg.reason,
                    evidence={"by": msg.by, "reason": msg.reason},
                    level=True,
                    active=False,
                    source="guard",
                    observed_at=now,
                )
            )

    async def _expire(self) -> None:
        """Leases past ``expires_at``: ask the holder (signal); a holder still running
        keeps its lease (extended), a gone one frees its slot (DESIGN §5 rails: leases
        live as long as their holder)."""
        now = workflow.now()
        ttl = self._ttl()
        for lease in [x for x in self._s.leases if x.expires_at <= now]:
            alive = await self._send(
                lease.workflow_id,
                LeaseReply(
                    repair_id=lease.repair_id,
                    granted=True,
                    reason="lease extended at expiry: holder still running",
                    expires_at=now + ttl,
                ),
            )
            if alive:
                lease.expires_at = now + ttl
                continue
            self._s.leases = [x for x in self._s.leases if x.repair_id != lease.repair_id]
            self._s.expired = [*self._s.expired, lease][-MAX_EXPIRED:]
            workflow.logger.warning(
                "lease expired, holder gone cluster=%s repair_id=%s node=%s",
                self._cluster,
                lease.repair_id,
                lease.node,
            )

    async def _on_acquire(self, req: LeaseRequest) -> list[tuple[str, LeaseReply]]:
        now = workflow.now()
        rails = self._policy().rails
        s = self._s
        if req.gpu_evidence and req.node not in s.gpu_nodes_seen:
            s.gpu_nodes_seen.append(req.node)
        held = next((x for x in s.leases if x.repair_id == req.repair_id), None)
        if held is not None:
            held.expires_at = now + self._ttl()
            held.workflow_id = req.workflow_id
            held.source = "granted"
            return [
                (
                    req.workflow_id,
                    LeaseReply(
                        repair_id=req.repair_id,
                        granted=True,
                        reason="renewed" if req.renew else "already held",
                        expires_at=held.expires_at,
                    ),
                )
            ]
        already_pending = any(x.repair_id == req.repair_id for x in s.pending)
        # a renewal is a holder that already acted: not a new automatic start, and the
        # breaker (which stops new cordons) does not hold it back
        counts = req.automatic and not req.renew
        if counts and req.repair_id not in s.counted:
            s.counted.append(req.repair_id)
            s.automatic_times.append(now)
        window = timedelta(seconds=rails.breaker_window_s)
        s.automatic_times = [t for t in s.automatic_times if t >= now - window]
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        seen = self._gpu_nodes_seen()
        if (
            counts
            and not s.breaker_open
            and breaker_trips(s.automatic_times, now, gpu, rails, seen)
        ):
            await self._trip(len(s.automatic_times), breaker_threshold(gpu, rails, seen))
        if counts and s.breaker_open:
            if not already_pending:
                s.pending.append(req)
                s.refused_total += 1
            if req.repair_id not in s.breaker_queued:
                s.breaker_queued.append(req.repair_id)
            return [
                (
                    req.workflow_id,
                    LeaseReply(
                        repair_id=req.repair_id,
                        granted=False,
                        queued=True,
                        reason=f"circuit breaker open: {s.tripped_reason}",
                    ),
                )
            ]
        if already_pending:
            s.pending = [req if x.repair_id == req.repair_id else x for x in s.pending]
        else:
            s.pending.append(req)
        refusal = self._refusal(req)
        if refusal:
            lapsed = next((x for x in s.expired if x.repair_id == req.repair_id), None)
            if req.renew:
                when = f" at {lapsed.expires_at.isoformat()}" if lapsed else ""
                refusal = f"lease lapsed{when} and cannot be renewed: {refusal}"
            return [
                (
                    req.workflow_id,
                    LeaseReply(repair_id=req.repair_id, granted=False, queued=True, reason=refusal),
                )
            ]
        return self._grant_pending()

    def _refusal(self, req: LeaseRequest) -> str:
        """Why ``req`` cannot be granted now ("" when it can): node, pool, budget, cap."""
        rails = self._policy().rails
        others = [x for x in self._s.leases if x.repair_id != req.repair_id]
        same_node = [x for x in others if x.node == req.node]
        if same_node:
            return f"node {req.node} busy with repair {same_node[0].repair_id}"
        pool = self._pool_of(req)
        if rails.one_per_pool and pool is not None:
            busy = [x for x in others if x.node_pool == pool]
            if busy:
                return f"node pool {pool} busy with repair {busy[0].repair_id}"
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        budget = concurrency_budget(gpu, rails, self._gpu_nodes_seen())
        if len(others) >= budget:
            return f"concurrency budget {budget} in use"
        if req.requester_kind == RequesterKind.detector:
            n = sum(1 for x in others if x.requester_kind == RequesterKind.detector)
            if n >= rails.detector_cap:
                return f"detector cap {rails.detector_cap} reached"
        return ""

    def _grant_pending(self) -> list[tuple[str, LeaseReply]]:
        now = workflow.now()
        ttl = self._ttl()
        out: list[tuple[str, LeaseReply]] = []
        still: list[LeaseRequest] = []
        for req in self._s.pending:
            breaker_held = req.automatic and not req.renew and self._s.breaker_open
            if breaker_held or self._refusal(req):
                still.append(req)
                continue
            self._s.leases.append(
                Lease(
                    repair_id=req.repair_id,
                    workflow_id=req.workflow_id,
                    node=req.node,
                    node_pool=self._pool_of(req),
                    automatic=req.automatic,
                    requester_kind=req.requester_kind,
                    granted_at=now,
                    expires_at=now + ttl,
                )
            )
            out.append(
                (
                    req.workflow_id,
                    LeaseReply(
                        repair_id=req.repair_id,
                        granted=True,
                        reason="re-acquired" if req.renew else "granted",
                        reset_at=(
                            self._s.reset_at if req.repair_id in self._s.breaker_queued else None
                        ),
                        expires_at=now + ttl,
                    ),
                )
            )
        self._s.pending = still
        granted = {r.repair_id for _, r in out}
        self._s.breaker_queued = [x for x in self._s.breaker_queued if x not in granted]
        return out

    async def _trip(self, count: int, threshold: int) -> None:
        """Open the breaker; its cluster-level alert is recorded after the replies."""
        now = workflow.now()
        rails = self._policy().rails
        self._s.breaker_open = True
        self._s.tripped_at = now
        self._s.tripped_reason = (
            f"{count} automatic repair/cordon requests within {rails.breaker_window_s:g} s "
            f"exceeded threshold {threshold}"
        )
        workflow.set_current_details(f"circuit breaker OPEN: {self._s.tripped_reason}")
        await self._effect(
            Alert(
                alert_id=f"breaker/{self._cluster}/{now.isoformat()}",
                cluster=self._cluster,
                node="*",
                kind=BREAKER_KIND,
                severity=Severity.critical,
                summary=f"Circuit breaker tripped on cluster {self._cluster}",
                description=self._s.tripped_reason
                + "; automatic repairs are paused until an operator runs "
                f"`autorepair breaker reset --cluster {self._cluster}`",
                evidence={
                    "count": count,
                    "threshold": threshold,
                    "reason": self._s.tripped_reason,
                },
                level=True,
                source="guard",
                observed_at=now,
            )
        )

    async def _send(self, workflow_id: str, reply: LeaseReply) -> bool:
        """Signal ``lease`` to ``workflow_id``; False when it is gone (closed or unknown)."""
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(
                REPAIR_SIGNAL_LEASE, reply
            )
        except FailureError:
            return False
        return True

    async def _reply(self, workflow_id: str, reply: LeaseReply) -> None:
        if not await self._send(workflow_id, reply):
            # the requester is gone: drop what it held or waited for
            self._s.leases = [x for x in self._s.leases if x.repair_id != reply.repair_id]
            self._s.pending = [x for x in self._s.pending if x.repair_id != reply.repair_id]


def _cause(err: BaseException) -> str:
    cause = err.__cause__
    return str(cause) if cause is not None else str(err)
