"""``NodeWorkflow`` (id ``node/{cluster}/{node}``): the node entity.

One per node, started by the ingest service with update-with-start
(:data:`~workflows.protocol.NODE_UPDATE_DELIVER_ALERT` ``deliver_alert``, input
:class:`~workflows.models.NodeInput`). It de-duplicates alerts by ``alert_id`` (keys
survive continue-as-new), records every alert in the ledger, decides each one with the
worker's catalogue (operator overrides and count-in-window thresholds included; ingest
only annotates), tracks persistence per fault from its first observation, the cooldown
after a repair and the in-flight repair, and turns an actionable fault that outlives its
persistence window into a ``RepairWorkflow`` child (parent close policy ABANDON). Alerts
arriving during a repair attach to it (no second repair starts; the cooldown follows its
end, docs/design.md §5 rails); a fault that clears before a repair starts auto-resolves the
recommendation.

Interface: update ``deliver_alert`` (Alert → AlertDelivery), signal ``repair_finished``
(RepairFinished, from the repair), query ``status`` → NodeStatus.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
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
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

    from workflows.activity_api import (
        ACT,
        Notification,
        PolicySnapshot,
        RepairLiveness,
        RepairProbe,
        TransitionRecord,
    )
    from workflows.catalogue.vocabulary import count_window_s
    from workflows.config import PolicyConfig, RailsConfig
    from workflows.console import repair_details, repair_summary
    from workflows.lifecycle.node import LEDGER_RETRY_S, NON_BOOTING
    from workflows.models import (
        ACTION_WEIGHT,
        TERMINAL_STAGES,
        Action,
        Alert,
        AlertDelivery,
        AlertOutcome,
        NodeInput,
        RepairRequest,
        Requester,
        RequesterKind,
        Stage,
    )
    from workflows.policy import (
        cooldown_until,
        count_in_window,
        decide_node_action,
        in_cooldown,
        persistence_for,
        repeat_key,
    )
    from workflows.protocol import (
        GUARD_SIGNAL_RELEASE,
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
        LeaseRelease,
        NodeStatus,
        RepairFinished,
        fault_key,
        repair_identity_attributes,
        repair_state,
        workflow_id_guard,
        workflow_id_repair,
    )

#: History length after which the node continues as new (Temporal's suggestion also
#: triggers it); overridable through ``NodeInput.carried["history_limit"]``.
DEFAULT_HISTORY_LIMIT = 10_000
#: How long de-duplication keys are kept, seconds (8 days: beyond the 7-day ladder window).
DEDUP_TTL_S = 8 * 86400.0
#: Most de-duplication keys kept (oldest dropped first).
DEDUP_MAX = 20_000
#: Hex digits of sha256(alert_id) kept as a de-duplication key (48 bits: the chance of
#: two of 20,000 ids colliding is about 7e-7).
DEDUP_DIGEST_HEX = 12
#: De-duplication keys are carried grouped by the hour they were seen (a key's age is
#: known to within this many seconds; pruning drops whole hours).
DEDUP_BUCKET_S = 3600
#: Most distinct count-in-window keys (``kind:code`` and repeat keys) carried, and most
#: observation times per key (the least recently touched key is dropped first).
MAX_OCCURRENCE_KEYS = 32
MAX_OCCURRENCES = 256
#: Most active faults carried (the lightest action, then the oldest, dropped first) and
#: longest ``evidence_text``/``description`` of a carried alert, characters (the ledger
#: holds the full alert).
MAX_ACTIVE_FAULTS = 32
MAX_CARRIED_TEXT = 4096
#: Most diagnostic recommendations listed, and fault keys remembered for their window.
MAX_DIAGNOSTICS = 100
MAX_DIAGNOSED = 256
#: Most level faults whose last clear time is remembered (the least recently cleared is
#: dropped first): a raise observed before its fault's last clear is stale.
MAX_CLEARED = 256
#: Re-read the policy (``load_policy``) at most this often, seconds.
POLICY_REFRESH_S = 300.0
#: While a repair is in flight, ask Temporal whether it still runs this often, seconds
#: (15 min; a repair started by this run is also awaited directly, which notices its end
#: at once where the server reports a child's termination to its parent).
REPAIR_PROBE_S = 900.0
#: Finished repairs remembered until this run has reconciled (a bound, not a window:
#: one node has one repair at a time, so more than a few is already abnormal).
MAX_FINISHED_EARLY = 16
_ACT_TIMEOUT = timedelta(seconds=30)
_ACT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
_BEST_EFFORT = RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5)


def seen_digest(alert_id: str) -> str:
    """De-duplication key of an alert id: the first :data:`DEDUP_DIGEST_HEX` hex digits
    of its sha256."""
    return hashlib.sha256(alert_id.encode("utf-8", "replace")).hexdigest()[:DEDUP_DIGEST_HEX]


def _trim(alert: Alert) -> Alert:
    """``alert`` with ``evidence_text``/``description`` cut to :data:`MAX_CARRIED_TEXT`."""
    if len(alert.evidence_text) <= MAX_CARRIED_TEXT and len(alert.description) <= MAX_CARRIED_TEXT:
        return alert
    return alert.model_copy(
        update={
            "evidence_text": alert.evidence_text[:MAX_CARRIED_TEXT],
            "description": alert.description[:MAX_CARRIED_TEXT],
        }
    )


class ActiveFault(BaseModel):
    """An actionable fault on the node: latest alert, decided action, first observation."""

    alert: Alert
    action: Action
    rule: str
    first_seen: datetime
    #: When the control plane received the latest raise (``Alert.received_at``, else
    #: this workflow's clock at delivery): I20 retires what was received before a
    #: successful repair ended.
    received: datetime | None = None


class NodeCarried(BaseModel):
    """State carried across continue-as-new (``NodeInput.carried``); bounded in bytes
    (every collection has a cap above, so the payload stays well under Temporal's 2 MiB).

    ``seen_log``: de-duplication keys as ``[[hour_epoch_s, "digest digest ..."], ...]``
    (digests of :data:`DEDUP_DIGEST_HEX` characters concatenated, oldest hour first);
    ``seen``: the old ``{alert_id: time}`` form, read once and converted. ``rails``: the
    rails of the last policy read, so a configured cooldown or persistence applies before
    the next read.
    """

    seen_log: list[tuple[int, str]] = Field(default_factory=list)
    seen: dict[str, datetime] = Field(default_factory=dict)
    active: dict[str, ActiveFault] = Field(default_factory=dict)
    occurrences: dict[str, list[datetime]] = Field(default_factory=dict)
    repair_id: str | None = None
    repair_alert_ids: list[str] = Field(default_factory=list)
    cooldown_until: datetime | None = None
    recommendations: int = 0
    diagnostics: list[str] = Field(default_factory=list)
    #: Last diagnostic recommendation per fault (``repeat_key``): one recommendation per
    #: fault and window, whichever source reports it (agent and ingest both see stragglers).
    diagnosed: dict[str, datetime] = Field(default_factory=dict)
    rails: RailsConfig | None = None
    #: Per level fault (``fault_key``): the newest observation time of its clears.
    cleared: dict[str, datetime] = Field(default_factory=dict)
    history_limit: int = DEFAULT_HISTORY_LIMIT
    #: Action of the open repair this run started (None: found in the ledger, unknown).
    repair_action: Action | None = None
    #: End of the last successful repair that booted the machine again: a raise
    #: received at or before it is from the boot it replaced (I20).
    booted_at: datetime | None = None


def _utc(t: datetime) -> datetime:
    """``t`` in UTC (a naive time is taken as UTC): edges from different sources compare."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _bucket(t: datetime) -> int:
    return int(t.timestamp()) // DEDUP_BUCKET_S * DEDUP_BUCKET_S


def _load_seen(s: NodeCarried) -> dict[str, int]:
    """digest → hour bucket, oldest first, from ``seen_log`` and the old ``seen``."""
    out: dict[str, int] = {}
    for alert_id, t in sorted(s.seen.items(), key=lambda kv: kv[1]):
        out[seen_digest(alert_id)] = _bucket(t)
    for bucket, digests in s.seen_log:
        for i in range(0, len(digests), DEDUP_DIGEST_HEX):
            out[digests[i : i + DEDUP_DIGEST_HEX]] = bucket
    return out


def _dump_seen(seen: dict[str, int]) -> list[tuple[int, str]]:
    """``seen`` (digest → bucket, oldest first) as the carried ``seen_log``."""
    log: list[tuple[int, list[str]]] = []
    for digest, bucket in seen.items():
        if log and log[-1][0] == bucket:
            log[-1][1].append(digest)
        else:
            log.append((bucket, [digest]))
    return [(b, "".join(ds)) for b, ds in log]


@workflow.defn(name=NODE_WORKFLOW)
class NodeWorkflow:
    """Node entity; see the module docstring for its interface."""

    @workflow.init
    def __init__(self, inp: NodeInput) -> None:
        # State is restored here, not in run(): an update delivered with the start (or
        # buffered across continue-as-new) runs before run() begins.
        self._inp: NodeInput | None = inp
        self._s = NodeCarried.model_validate(inp.carried) if inp.carried else NodeCarried()
        self._seen = _load_seen(self._s)
        self._s.seen = {}
        self._s.seen_log = []
        self._fresh = not inp.carried
        self._dirty = False
        self._lock = asyncio.Lock()
        self._snapshot: PolicySnapshot | None = None
        self._loaded_at: datetime | None = None
        self._reconciled = False
        self._reconciling = False
        self._probed_at: datetime | None = None
        self._watch_task: asyncio.Task[None] | None = None
        #: ``repair_finished`` of repairs not (yet) ours, received before this run
        #: reconciled: the ledger's row may still say "running".
        self._finished_early: dict[str, RepairFinished] = {}

    # ---- update / signal / query -------------------------------------------------
    @workflow.update(name=NODE_UPDATE_DELIVER_ALERT)
    async def deliver_alert(self, alert: Alert) -> AlertDelivery:
        """Take one alert (raise or clear); idempotent by ``alert_id``.

        Returns ``deduplicated`` (seen before), ``ignored`` (not actionable, with the
        catalogue's reason), ``cleared`` (a clear; auto-resolves a pending
        recommendation), ``attached`` (a repair is in flight: the alert joins it),
        ``recommended`` (a repair was started or a diagnostic run recommended) or ``new``
        (actionable, waiting for its persistence window or the cooldown).
        """
        s = self._s
        digest = seen_digest(alert.alert_id)
        if digest in self._seen:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.deduplicated,
                reason="alert id already delivered",
                repair_id=s.repair_id,
            )
        now = workflow.now()
        self._seen[digest] = _bucket(now)
        self._prune_seen(now)
        record = workflow.execute_activity(
            ACT.ledger_record_alert,
            alert,
            result_type=bool,
            start_to_close_timeout=_ACT_TIMEOUT,
            retry_policy=_ACT_RETRY,
        )
        # the ledger write, the reconcile and the policy read do not depend on one
        # another: one round trip instead of three on a node's first alert
        await asyncio.gather(record, self._ensure_reconciled(), self._policy())
        key = fault_key(alert)
        stale = self._stale_edge(alert, key)
        if stale is not None:
            return stale
        if not alert.active:
            return await self._on_clear(alert, key)
        occ_key = f"{alert.kind}:{alert.code}"
        rep_key = "repeat:" + repeat_key(alert)
        policy = (await self._policy()).policy
        cat = policy.catalogue
        for k in (occ_key, rep_key):
            times = [t for t in s.occurrences.pop(k, []) if now - t <= timedelta(days=8)]
            times.append(now)
            s.occurrences[k] = times[-MAX_OCCURRENCES:]  # re-inserted: most recent last
        while len(s.occurrences) > MAX_OCCURRENCE_KEYS:
            s.occurrences.pop(next(iter(s.occurrences)))
        window = count_window_s(alert.kind, alert.code, cat)
        dec = decide_node_action(
            alert,
            cat,
            occurrences_in_window=count_in_window(s.occurrences[occ_key], now, window),
            repeats_same_gpu=count_in_window(
                s.occurrences[rep_key], now, cat.app_xid_repeat_window_s
            ),
        )
        if dec.actionable:
            sev = dec.severity or alert.severity
            if (alert.action, alert.actionable, alert.severity) != (dec.action, True, sev):
                # The worker's catalogue decided (ingest only annotated): the repair sees
                # the action and severity that were decided, not the annotation.
                alert = alert.model_copy(
                    update={"action": dec.action, "actionable": True, "severity": sev}
                )
            prev = s.active.get(key)
            s.active[key] = ActiveFault(
                alert=_trim(alert),
                action=dec.action,
                rule=dec.rule,
                first_seen=prev.first_seen if prev else now,
                received=_utc(alert.received_at) if alert.received_at else now,
            )
            if len(s.active) > MAX_ACTIVE_FAULTS:
                drop = min(
                    s.active,
                    key=lambda k: (ACTION_WEIGHT[s.active[k].action], s.active[k].first_seen),
                )
                s.active.pop(drop)
            self._dirty = True
        if s.repair_id is not None:
            await self._attach(alert)  # may find the repair gone (s.repair_id cleared)
        if s.repair_id is not None:
            if dec.actionable:
                s.repair_alert_ids.append(alert.alert_id)
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.attached,
                reason=f"repair {s.repair_id} in flight; {dec.reason}",
                repair_id=s.repair_id,
            )
        if dec.diagnostic:
            diag_key = repeat_key(alert)
            last = s.diagnosed.get(diag_key)
            if last is not None and (now - last).total_seconds() < cat.app_xid_repeat_window_s:
                return AlertDelivery(
                    alert_id=alert.alert_id,
                    outcome=AlertOutcome.ignored,
                    reason=f"diagnostic validation already recommended at {last.isoformat()}",
                )
            s.diagnosed.pop(diag_key, None)
            s.diagnosed[diag_key] = now
            while len(s.diagnosed) > MAX_DIAGNOSED:
                s.diagnosed.pop(next(iter(s.diagnosed)))
            s.diagnostics = [*s.diagnostics, alert.alert_id][-MAX_DIAGNOSTICS:]
            # the Temporal UI's Current Details: what is recommended and how to run it
            workflow.set_current_details(
                f"node {alert.node} of {alert.cluster}: diagnostic validation recommended "
                f"— {alert.summary}: {dec.reason}. Run `autorepair validate {alert.node}` "
                "(no repair is started for this)."
            )
            await workflow.execute_activity(
                ACT.notify,
                Notification(
                    cluster=alert.cluster,
                    node=alert.node,
                    subject=f"diagnostic validation recommended for {alert.node}",
                    body=dec.reason,
                    severity="warning",
                    event="diagnostic_recommended",
                ),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_ACT_RETRY,
            )
            return AlertDelivery(
                alert_id=alert.alert_id, outcome=AlertOutcome.recommended, reason=dec.reason
            )
        if not dec.actionable:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.ignored,
                reason=f"{dec.rule}: {dec.reason}",
            )
        async with self._lock:
            await self._evaluate()
        if s.repair_id is not None and alert.alert_id in s.repair_alert_ids:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.recommended,
                reason=f"{dec.action.value} recommended ({dec.rule})",
                repair_id=s.repair_id,
            )
        return AlertDelivery(
            alert_id=alert.alert_id,
            outcome=AlertOutcome.new,
            reason=self._waiting_reason(key, policy),
        )

    @workflow.signal(name=NODE_SIGNAL_REPAIR_FINISHED)
    def repair_finished(self, msg: RepairFinished) -> None:
        """The in-flight repair ended: start the cooldown (not after ``auto_resolved``:
        nothing was done to the node), drop the event faults it used."""
        s = self._s
        if msg.repair_id != s.repair_id:
            if not self._reconciled and len(self._finished_early) < MAX_FINISHED_EARLY:
                self._finished_early[msg.repair_id] = msg
            return
        self._apply_finished(msg)

    def _apply_finished(self, msg: RepairFinished) -> None:
        """End the in-flight repair ``msg.repair_id`` as :meth:`repair_finished` says."""
        s = self._s
        if msg.stage != Stage.auto_resolved:
            s.cooldown_until = cooldown_until(msg.at, self._rails())
        used = set(msg.alert_ids) | set(s.repair_alert_ids)
        s.active = {
            k: f for k, f in s.active.items() if f.alert.level or f.alert.alert_id not in used
        }
        if msg.stage == Stage.succeeded:
            self._retire(msg, used)
        s.repair_id = None
        s.repair_action = None
        s.repair_alert_ids = []
        self._dirty = True

    def _retire(self, msg: RepairFinished, used: set[str]) -> None:
        """I20: a successful repair retires the level faults it acted on. After an action
        that booted the machine again (all but ``reset_gpu``; a repair found in the
        ledger counts as one) every fault received before its end is retired and later
        raises received by then are stale: the restarted agent reports what is still
        wrong (``agent.runner`` emits every level signal's state when it starts). After
        ``reset_gpu`` only the faults it used are retired. What ran is judged by
        ``msg.actions`` (the actions that touched the machine, which an operator's
        ``approve --action`` or the ladder can make differ from the one this run started
        the repair with), else by that started action."""
        s = self._s
        end = _utc(msg.at)
        ran = msg.actions if msg.actions is not None else [s.repair_action]
        if all(a in NON_BOOTING for a in ran):
            s.active = {k: f for k, f in s.active.items() if f.alert.alert_id not in used}
            return
        s.booted_at = end if s.booted_at is None else max(end, _utc(s.booted_at))
        s.active = {
            k: f for k, f in s.active.items()
            if _utc(f.received or f.first_seen) > end
        }

    @workflow.query(name=NODE_QUERY_STATUS)
    def status(self) -> NodeStatus:
        """Degraded state, active faults with first observation, repair, cooldown."""
        assert self._inp is not None
        s = self._s
        return NodeStatus(
            cluster=self._inp.cluster,
            node=self._inp.node,
            degraded=bool(s.active) or s.repair_id is not None,
            active_alerts=[f.alert for f in s.active.values()],
            first_seen={k: f.first_seen for k, f in s.active.items()},
            repair_id=s.repair_id,
            cooldown_until=s.cooldown_until,
            seen_alert_ids=len(self._seen),
            recommendations=s.recommendations,
            diagnostics=list(s.diagnostics),
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        """Run for the node's lifetime, continuing as new when the history grows."""
        workflow.set_current_details(f"node {inp.node} of {inp.cluster}")
        await self._ensure_reconciled()
        while True:
            timeout = self._next_deadline()
            try:
                await workflow.wait_condition(
                    lambda: self._dirty or self._history_full(), timeout=timeout
                )
            except TimeoutError:
                pass
            self._dirty = False
            await self._ensure_reconciled()
            async with self._lock:
                await self._probe_repair()
                await self._evaluate()
            if self._history_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._s.seen_log = _dump_seen(self._seen)
                workflow.continue_as_new(
                    NodeInput(
                        cluster=inp.cluster,
                        node=inp.node,
                        machine_id=inp.machine_id,
                        node_pool=inp.node_pool,
                        carried=self._s.model_dump(mode="json"),
                    )
                )

    # ---- helpers -------------------------------------------------------------------
    def _history_full(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > self._s.history_limit
        )

    async def _policy(self) -> PolicySnapshot:
        assert self._inp is not None
        now = workflow.now()
        if (
            self._snapshot is None
            or self._loaded_at is None
            or (now - self._loaded_at).total_seconds() >= POLICY_REFRESH_S
        ):
            self._snapshot = await workflow.execute_activity(
                ACT.load_policy,
                self._inp.cluster,
                result_type=PolicySnapshot,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_ACT_RETRY,
            )
            self._loaded_at = now
            self._s.rails = self._snapshot.policy.rails
        return self._snapshot

    def _rails(self) -> RailsConfig:
        """Rails of the last policy read (carried across continue-as-new), else defaults."""
        if self._snapshot is not None:
            return self._snapshot.policy.rails
        return self._s.rails or PolicyConfig().rails

    def _prune_seen(self, now: datetime) -> None:
        """Drop keys older than :data:`DEDUP_TTL_S`, then the oldest beyond
        :data:`DEDUP_MAX` (``self._seen`` is oldest first)."""
        horizon = _bucket(now - timedelta(seconds=DEDUP_TTL_S))
        seen = self._seen
        while seen and (len(seen) > DEDUP_MAX or next(iter(seen.values())) < horizon):
            seen.pop(next(iter(seen)))

    def _stale_edge(self, alert: Alert, key: str) -> AlertDelivery | None:
        """An ``ignored`` answer for a level edge that arrived out of order, else None
        (a clear is remembered here either way).

        Edges of one fault can reach the node out of order: ingest replicas each deliver
        in order but not with one another, a restarted ingest re-delivers its outbox, an
        operator replays a dead letter (``autorepair dead-letters replay``). Agents and
        watchers send each edge once, so a raise that lands after the clear that followed
        it would leave a healed fault active for good, and repaired after its persistence
        window. A raise observed at or before the fault's last clear is therefore stale;
        so is a clear observed before the active fault was raised (again). At one
        instant the clear wins: no action on a node that may be healthy."""
        s = self._s
        at = _utc(alert.observed_at)

        def ignored(reason: str) -> AlertDelivery:
            return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.ignored,
                                 reason=reason, repair_id=s.repair_id)

        if alert.active:
            rcv = _utc(alert.received_at) if alert.received_at else workflow.now()
            if s.booted_at is not None and rcv <= _utc(s.booted_at):
                return ignored(f"stale raise: received {rcv.isoformat()}, not after the "
                               "successful repair that booted the machine again at "
                               f"{_utc(s.booted_at).isoformat()} (I20)")
            last = s.cleared.get(key)
            if alert.level and last is not None and at <= _utc(last):
                return ignored(f"stale raise: observed {at.isoformat()}, not after the "
                               f"fault's clear observed {_utc(last).isoformat()}; the fault "
                               "is cleared")
            return None
        last = s.cleared.pop(key, None)
        s.cleared[key] = at if last is None else max(at, _utc(last))
        while len(s.cleared) > MAX_CLEARED:
            s.cleared.pop(next(iter(s.cleared)))
        self._dirty = True
        f = s.active.get(key)
        if f is not None and f.alert.level and _utc(f.alert.observed_at) > at:
            return ignored(f"stale clear: observed {at.isoformat()}, before the fault was "
                           f"raised again at {_utc(f.alert.observed_at).isoformat()}")
        return None

    async def _on_clear(self, alert: Alert, key: str) -> AlertDelivery:
        s = self._s
        removed = s.active.pop(key, None)
        self._dirty = True
        if s.repair_id is not None:
            await self._attach(alert)
        if s.repair_id is not None:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.cleared,
                reason=f"clear attached to repair {s.repair_id}",
                repair_id=s.repair_id,
            )
        if removed is not None:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.cleared,
                reason="fault cleared before action: recommendation auto-resolved",
            )
        return AlertDelivery(
            alert_id=alert.alert_id, outcome=AlertOutcome.cleared, reason="no active fault to clear"
        )

    async def _attach(self, alert: Alert) -> None:
        assert self._inp is not None and self._s.repair_id is not None
        wid = workflow_id_repair(self._inp.cluster, self._inp.node, self._s.repair_id)
        try:
            await workflow.get_external_workflow_handle(wid).signal(
                REPAIR_SIGNAL_ATTACH_ALERT, alert
            )
        except FailureError:
            # The repair is closed. Had it finished normally its repair_finished signal
            # would already be handled (it signals before it closes); still ours, it
            # ended without telling us (terminated, timed out).
            workflow.logger.info("repair gone; alert %s not attached", alert.alert_id)
            rid = self._s.repair_id
            if rid is not None:
                live = await self._liveness(rid)
                if self._s.repair_id == rid and (live is None or not live.running):
                    await self._repair_gone(rid, live.status if live else "closed")

    def _waiting_reason(self, key: str, policy: PolicyConfig) -> str:
        now = workflow.now()
        s = self._s
        if in_cooldown(s.cooldown_until, now):
            assert s.cooldown_until is not None
            return f"in cooldown until {s.cooldown_until.isoformat()}"
        f = s.active.get(key)
        if f is None:
            return "not active"
        due = f.first_seen + timedelta(seconds=persistence_for(f.alert, policy.rails))
        return f"waiting for persistence until {due.isoformat()}"

    def _next_deadline(self) -> timedelta | None:
        s = self._s
        if s.repair_id is not None:
            return timedelta(seconds=REPAIR_PROBE_S)
        if not s.active:
            return None
        now = workflow.now()
        rails = self._rails()
        times = [
            f.first_seen + timedelta(seconds=persistence_for(f.alert, rails))
            for f in s.active.values()
        ]
        if s.cooldown_until is not None and s.cooldown_until > now:
            times.append(s.cooldown_until)
        future = [t for t in times if t > now]
        if not future:
            return timedelta(seconds=1) if in_cooldown(s.cooldown_until, now) else None
        return max(min(future) - now, timedelta(milliseconds=1))

    async def _evaluate(self) -> None:
        """Start a repair for the faults that outlived their persistence window."""
        assert self._inp is not None
        s = self._s
        if s.repair_id is not None or not s.active:
            return
        now = workflow.now()
        if in_cooldown(s.cooldown_until, now):
            return
        snap = await self._policy()
        rails = snap.policy.rails
        due = [
            f
            for f in s.active.values()
            if now >= f.first_seen + timedelta(seconds=persistence_for(f.alert, rails))
        ]
        if not due:
            return
        due.sort(key=lambda f: -ACTION_WEIGHT[f.action])
        action = due[0].action
        repair_id = workflow.uuid4().hex[:16]
        inp = self._inp
        # Machine and pool from configuration and the ledger's bindings, never from what
        # the agent reported (NodeInput carries host.id / autorepair.node_pool as sent).
        req = RepairRequest(
            repair_id=repair_id,
            cluster=inp.cluster,
            node=inp.node,
            machine_id=snap.machines.get(inp.node),
            node_pool=snap.pools.get(inp.node),
            action=action,
            requester=Requester(kind=RequesterKind.system, name="autorepair"),
            reason="; ".join(f"{f.alert.summary} ({f.rule})" for f in due),
            alerts=[f.alert for f in due],
        )
        s.repair_id = repair_id
        s.repair_action = action
        s.repair_alert_ids = [f.alert.alert_id for f in due]
        s.recommendations += 1
        handle = await workflow.start_child_workflow(
            REPAIR_WORKFLOW,
            req,
            id=workflow_id_repair(inp.cluster, inp.node, repair_id),
            task_queue=workflow.info().task_queue,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            static_summary=repair_summary(req),
            static_details=repair_details(req),
            # visible to search from its first event: the repair's own first upsert comes
            # only after its policy read (command attributes are not replay-checked)
            search_attributes=_repair_search_attributes(req),
        )
        workflow.set_current_details(f"repair {repair_id} ({action.value}) in flight")
        self._watch_task = asyncio.create_task(self._watch_child(handle, repair_id))

    # ---- the in-flight repair's end ---------------------------------------------------
    async def _ensure_reconciled(self) -> None:
        """Once per run: a fresh start takes the node's open repair from the ledger (a
        running one becomes the in-flight repair; one whose workflow ended without
        finishing is closed out); a carried repair is checked the same way. While the
        ledger does not answer, retry with back-off (:data:`LEDGER_RETRY_S`: 5 s doubling
        to 60 s) without end: no decision before it answers (I21)."""
        if self._reconciled:
            return
        if self._reconciling:
            await workflow.wait_condition(lambda: self._reconciled)
            return
        self._reconciling = True
        try:
            s = self._s
            if s.repair_id is None and not self._fresh:
                return
            live = await self._liveness(s.repair_id)
            wait, tries = LEDGER_RETRY_S[0], 0
            while live is None:
                # I21: the ledger did not answer; another repair may own this episode.
                # Nothing is decided until it does (alerts are taken and wait).
                tries += 1
                workflow.set_current_details(
                    f"ledger unavailable: retry {tries} in {wait:g} s before deciding")
                await workflow.sleep(wait)
                wait = min(wait * 2, LEDGER_RETRY_S[1])
                live = await self._liveness(s.repair_id)
            if live.repair_id is None:
                return
            early = self._finished_early.get(live.repair_id)
            if live.running and s.repair_id is None and early is not None:
                # it told us it finished: the ledger's "running" is behind (the repair
                # signals before its workflow closes)
                s.repair_id = live.repair_id
                self._apply_finished(early)
                return
            if live.running:
                if s.repair_id is None:
                    s.repair_id = live.repair_id
                    workflow.set_current_details(
                        f"repair {live.repair_id} in flight (found in the ledger)"
                    )
                return
            if s.repair_id == live.repair_id:
                await self._repair_gone(live.repair_id, live.status)
            elif live.stage and live.stage not in {t.value for t in TERMINAL_STAGES}:
                await self._close_ledger(live.repair_id, live.status)
        finally:
            self._reconciled = True
            self._finished_early.clear()

    async def _liveness(self, repair_id: str | None) -> RepairLiveness | None:
        """``ledger_open_repair`` for this node (None when the activity failed)."""
        assert self._inp is not None
        try:
            return await workflow.execute_activity(
                ACT.ledger_open_repair,
                RepairProbe(cluster=self._inp.cluster, node=self._inp.node, repair_id=repair_id),
                result_type=RepairLiveness,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_BEST_EFFORT,
            )
        except ActivityError as err:
            workflow.logger.warning("repair liveness check failed: %s", err)
            return None

    async def _probe_repair(self) -> None:
        """Every :data:`REPAIR_PROBE_S`, ask whether the in-flight repair still runs."""
        s = self._s
        rid = s.repair_id
        if rid is None:
            return
        now = workflow.now()
        if self._probed_at is not None and (now - self._probed_at).total_seconds() < (
            REPAIR_PROBE_S
        ):
            return
        self._probed_at = now
        live = await self._liveness(rid)
        if live is not None and not live.running and s.repair_id == rid:
            await self._repair_gone(rid, live.status)

    async def _watch_child(
        self, handle: workflow.ChildWorkflowHandle[object, object], rid: str
    ) -> None:
        """Await the repair this run started; if it ends without ``repair_finished``
        (terminated, timed out, failed), close it out."""
        how = "completed"
        try:
            await handle
        except ChildWorkflowError as err:
            cause = err.cause
            how = (
                # a repair that ended failed / timed_out fails its workflow on purpose
                # (REPAIR_FAILED / REPAIR_TIMED_OUT) after its own cleanup and ledger row:
                # it finished, like a completed one
                "completed"
                if isinstance(cause, ApplicationError)
                and cause.type in (REPAIR_FAILED, REPAIR_TIMED_OUT)
                else "terminated"
                if isinstance(cause, TerminatedError)
                else "timed_out"
                if isinstance(cause, TemporalTimeoutError)
                else "canceled"
                if isinstance(cause, CancelledError)
                else "failed"
            )
        if self._s.repair_id == rid:
            async with self._lock:
                if self._s.repair_id == rid:
                    await self._repair_gone(rid, how)

    async def _repair_gone(self, rid: str, how: str) -> None:
        """The in-flight repair ``rid`` ended without telling us (``how``: Temporal's
        status). Stop attaching alerts to it, start the cooldown (it may have acted),
        record its end in the ledger, give its lease back and tell people — the node
        may be left cordoned by it (docs/design.md §5: someone else's cordon is never lifted
        blindly)."""
        assert self._inp is not None
        s = self._s
        now = workflow.now()
        s.repair_id = None
        s.repair_action = None
        s.repair_alert_ids = []
        s.cooldown_until = cooldown_until(now, self._rails())
        self._dirty = True
        workflow.set_current_details(f"repair {rid} ended without finishing ({how})")
        await self._close_ledger(rid, how)
        try:
            await workflow.get_external_workflow_handle(
                workflow_id_guard(self._inp.cluster)
            ).signal(GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id=rid, outcome=how))
        except FailureError:
            pass  # no guard running: a fresh one rebuilds from the ledger
        try:
            await workflow.execute_activity(
                ACT.notify,
                Notification(
                    cluster=self._inp.cluster,
                    node=self._inp.node,
                    repair_id=rid,
                    subject=f"repair {rid} on {self._inp.node} ended without finishing ({how})",
                    body="The repair workflow stopped before its cleanup ran; the node may "
                    "still be cordoned by it. Check the node and uncordon it if healthy.",
                    severity="warning",
                ),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_BEST_EFFORT,
            )
        except ActivityError as err:
            workflow.logger.warning("notification failed: %s", err)

    async def _close_ledger(self, rid: str, how: str) -> None:
        """Record the terminal stage of a repair whose workflow ended without writing it."""
        stage = {"timed_out": Stage.timed_out, "failed": Stage.failed}.get(how, Stage.cancelled)
        if how == "completed":
            return  # it wrote its own end
        try:
            await workflow.execute_activity(
                ACT.ledger_record_transition,
                TransitionRecord(
                    repair_id=rid,
                    stage=stage,
                    at=workflow.now(),
                    by="system",
                    reason=f"repair workflow {how} before it finished; recorded by the node "
                    "workflow",
                ),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_BEST_EFFORT,
            )
        except ActivityError as err:
            workflow.logger.warning("ledger write failed: %s", err)


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
