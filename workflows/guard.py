"""``ClusterGuardWorkflow`` (id ``guard/{cluster}``): concurrency budget and circuit breaker.

One long-running workflow per cluster. Repairs ask it for a lease before they cordon
(signal protocol in :mod:`workflows.protocol`); it grants within the budget
(``max(min_concurrent, ceil(concurrency_fraction × GPU nodes))``), one repair per node
pool at a time, at most ``rails.detector_cap`` detector-requested repairs, and trips the
circuit breaker when automatic repair/cordon requests within ``rails.breaker_window_s``
exceed ``max(breaker_min, ceil(breaker_fraction × GPU nodes))``. While open, automatic
requests are queued (refused) and a cluster-level alert is raised; an operator's
``reset_breaker`` signal closes it and queued requests are granted with the reset time,
so the repairs only act on evidence observed after it (DESIGN §5 rails: evidence is
re-checked right before acting).

Operator interface (the ``autorepair breaker`` CLI): query ``status`` → GuardStatus,
signal ``reset_breaker`` ``{"by": USER, "reason": TEXT}``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

    from workflows.activity_api import ACT, Notification, PolicySnapshot
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
    )

#: History length after which the guard continues as new (Temporal's own suggestion
#: also triggers it); overridable through ``GuardInput.carried["history_limit"]``.
DEFAULT_HISTORY_LIMIT = 10_000
#: Re-read the policy (``load_policy``) at most this often, seconds.
POLICY_REFRESH_S = 300.0
_ACT_TIMEOUT = timedelta(seconds=30)
_ACT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))


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
    seen_nodes: list[str] = Field(default_factory=list)
    refused_total: int = 0
    breaker_queued: list[str] = Field(default_factory=list)
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

    # ---- signals / queries -------------------------------------------------------
    @workflow.signal(name=GUARD_SIGNAL_ACQUIRE)
    def acquire(self, req: LeaseRequest) -> None:
        """Ask for a lease; the answer comes back as signal ``lease`` to ``req.workflow_id``."""
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
        """A cluster-level alert from outside (ingest panic mode): record and notify it.

        The ledger write is idempotent on ``alert.alert_id``; nothing is tripped."""
        await self._record_cluster_alert(alert)

    async def _record_cluster_alert(self, alert: Alert) -> None:
        """Record a cluster-level alert in the ledger; notify while it is active."""
        await workflow.execute_activity(
            ACT.ledger_record_alert,
            alert,
            result_type=bool,
            start_to_close_timeout=_ACT_TIMEOUT,
            retry_policy=_ACT_RETRY,
        )
        if alert.active:
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
                retry_policy=_ACT_RETRY,
            )

    @workflow.query(name=GUARD_QUERY_STATUS)
    def status(self) -> GuardStatus:
        """Budget, leases, queued requests, breaker state, recent automatic requests."""
        policy = self._policy()
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        seen = len(self._s.seen_nodes)
        return GuardStatus(
            cluster=self._cluster,
            gpu_nodes=gpu,
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
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        """Serve lease requests forever. Input ``{"cluster": "demo"}``."""
        workflow.set_current_details(f"cluster guard for {inp.cluster}")
        await self._refresh_policy(force=True)
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

    async def _refresh_policy(self, force: bool = False) -> None:
        now = workflow.now()
        if (
            not force
            and self._loaded_at is not None
            and (now - self._loaded_at).total_seconds() < POLICY_REFRESH_S
        ):
            return
        self._snapshot = await workflow.execute_activity(
            ACT.load_policy,
            self._cluster,
            result_type=PolicySnapshot,
            start_to_close_timeout=_ACT_TIMEOUT,
            retry_policy=_ACT_RETRY,
        )
        self._loaded_at = now

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
                self._s.breaker_open = False
                self._s.reset_at = workflow.now()
                self._s.reset_by = msg.by
                self._s.automatic_times = []
                self._s.counted = []
                workflow.set_current_details(
                    f"breaker reset by {msg.by} at {self._s.reset_at.isoformat()}: {msg.reason}"
                )
        now = workflow.now()
        expired = [x for x in self._s.leases if x.expires_at <= now]
        self._s.leases = [x for x in self._s.leases if x.expires_at > now]
        for x in expired:
            workflow.logger.warning(
                "lease expired cluster=%s repair_id=%s", self._cluster, x.repair_id
            )
        replies.extend(self._grant_pending())
        for wid, reply in replies:
            await self._reply(wid, reply)

    async def _on_acquire(self, req: LeaseRequest) -> list[tuple[str, LeaseReply]]:
        now = workflow.now()
        rails = self._policy().rails
        if req.node not in self._s.seen_nodes:
            self._s.seen_nodes.append(req.node)
        held = next((x for x in self._s.leases if x.repair_id == req.repair_id), None)
        if held is not None:
            return [
                (
                    req.workflow_id,
                    LeaseReply(repair_id=req.repair_id, granted=True, reason="already held"),
                )
            ]
        already_pending = any(x.repair_id == req.repair_id for x in self._s.pending)
        if req.automatic and req.repair_id not in self._s.counted:
            self._s.counted.append(req.repair_id)
            self._s.automatic_times.append(now)
        window = timedelta(seconds=rails.breaker_window_s)
        self._s.automatic_times = [t for t in self._s.automatic_times if t >= now - window]
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        seen = len(self._s.seen_nodes)
        if (
            req.automatic
            and not self._s.breaker_open
            and breaker_trips(self._s.automatic_times, now, gpu, rails, seen)
        ):
            await self._trip(len(self._s.automatic_times), breaker_threshold(gpu, rails, seen))
        if req.automatic and self._s.breaker_open:
            if not already_pending:
                self._s.pending.append(req)
                self._s.refused_total += 1
            if req.repair_id not in self._s.breaker_queued:
                self._s.breaker_queued.append(req.repair_id)
            return [
                (
                    req.workflow_id,
                    LeaseReply(
                        repair_id=req.repair_id,
                        granted=False,
                        queued=True,
                        reason=f"circuit breaker open: {self._s.tripped_reason}",
                    ),
                )
            ]
        if not already_pending:
            self._s.pending.append(req)
        refusal = self._refusal(req)
        if refusal:
            return [
                (
                    req.workflow_id,
                    LeaseReply(repair_id=req.repair_id, granted=False, queued=True, reason=refusal),
                )
            ]
        return self._grant_pending()

    def _refusal(self, req: LeaseRequest) -> str:
        rails = self._policy().rails
        gpu = self._snapshot.gpu_nodes if self._snapshot else 0
        budget = concurrency_budget(gpu, rails, len(self._s.seen_nodes))
        if len(self._s.leases) >= budget:
            return f"concurrency budget {budget} in use"
        if rails.one_per_pool and req.node_pool is not None:
            busy = [x for x in self._s.leases if x.node_pool == req.node_pool]
            if busy:
                return f"node pool {req.node_pool} busy with repair {busy[0].repair_id}"
        if req.requester_kind == RequesterKind.detector:
            n = sum(1 for x in self._s.leases if x.requester_kind == RequesterKind.detector)
            if n >= rails.detector_cap:
                return f"detector cap {rails.detector_cap} reached"
        return ""

    def _grant_pending(self) -> list[tuple[str, LeaseReply]]:
        now = workflow.now()
        ttl = timedelta(seconds=self._policy().rails.lease_ttl_s)
        out: list[tuple[str, LeaseReply]] = []
        still: list[LeaseRequest] = []
        for req in self._s.pending:
            if (req.automatic and self._s.breaker_open) or self._refusal(req):
                still.append(req)
                continue
            self._s.leases.append(
                Lease(
                    repair_id=req.repair_id,
                    workflow_id=req.workflow_id,
                    node=req.node,
                    node_pool=req.node_pool,
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
                        reason="granted",
                        reset_at=(
                            self._s.reset_at if req.repair_id in self._s.breaker_queued else None
                        ),
                    ),
                )
            )
        self._s.pending = still
        granted = {r.repair_id for _, r in out}
        self._s.breaker_queued = [x for x in self._s.breaker_queued if x not in granted]
        return out

    async def _trip(self, count: int, threshold: int) -> None:
        now = workflow.now()
        rails = self._policy().rails
        self._s.breaker_open = True
        self._s.tripped_at = now
        self._s.tripped_reason = (
            f"{count} automatic repair/cordon requests within {rails.breaker_window_s:g} s "
            f"exceeded threshold {threshold}"
        )
        workflow.set_current_details(f"circuit breaker OPEN: {self._s.tripped_reason}")
        alert = Alert(
            alert_id=f"breaker/{self._cluster}/{now.isoformat()}",
            cluster=self._cluster,
            node="*",
            kind="circuit_breaker",
            severity=Severity.critical,
            summary=f"Circuit breaker tripped on cluster {self._cluster}",
            description=self._s.tripped_reason
            + "; automatic repairs are paused until an operator runs "
            f"`autorepair breaker reset --cluster {self._cluster}`",
            evidence={"count": count, "threshold": threshold},
            level=True,
            source="guard",
            observed_at=now,
        )
        await self._record_cluster_alert(alert)

    async def _reply(self, workflow_id: str, reply: LeaseReply) -> None:
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(
                REPAIR_SIGNAL_LEASE, reply
            )
        except FailureError:
            # the requester is gone: drop what it held or waited for
            self._s.leases = [x for x in self._s.leases if x.repair_id != reply.repair_id]
            self._s.pending = [x for x in self._s.pending if x.repair_id != reply.repair_id]
