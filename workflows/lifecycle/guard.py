"""The cluster guard's lifecycle (``ClusterGuardWorkflow``, issue 26): leases, the queue,
the circuit breaker and the rebuild from the ledger, as a pure machine.

``step(state, event, now) -> (state, commands)`` decides every (status, event) pair
(:data:`TRANSITIONS` is the table; docs/lifecycle.md is generated from it). The workflow
(:mod:`workflows.guard`) turns signals, activity results and timers into events and
executes the commands; nothing is decided there.

Statuses: ``starting`` (the policy is being read; a guard that never read it retries
every :data:`POLICY_RETRY_S` until ``load_policy`` answers and grants nothing meanwhile),
``rebuilding`` (a fresh guard reads the ledger's holders, automatic starts and breaker; it
retries every :data:`LEDGER_RETRY_S` until the ledger answers and grants nothing
meanwhile), ``serving``.

Rules (docs/design.md §5 rails), checked by ``tests/model/guard_world.py``:

- leases held ≤ the budget, one per node, one per pool (``one_per_pool``), at most
  ``detector_cap`` detector-requested ones;
- an automatic, non-renewing request is counted once in the breaker window; more than
  ``breaker_threshold`` counted in ``breaker_window_s`` trips the breaker; while open,
  automatic new requests are queued (renewals and a person's requests are not held);
- **I23** a reset marks every request queued at that moment, whatever queued it (budget,
  pool, node or breaker): its grant carries ``reset_at``, so the repair acts only on
  evidence observed after the reset; a reset starts a fresh window, and a repair counted
  before it is never counted again (its re-sent requests included). A request names when
  its repair first asked (``LeaseRequest.requested_at``, the repair's clock) and the guard
  keeps the last reset (``open_reset_at``; a rebuilt guard reads it from the ledger's
  reset alert), so a request first asked for at or before it is treated so even when a
  guard restart lost the queue that held it. A reset of a closed breaker is left alone;
- **I21** a fresh guard grants nothing until the ledger answered (a holder the ledger
  lists, in any stage that holds a node, keeps its slot), nor until its policy was read
  once (``PolicyView.loaded``): the defaults know no pool and no failure domain's nodes,
  so a hold rebuilt from the ledger would hold nothing. A failed first read is retried
  every :data:`POLICY_RETRY_S`, the requests wait (told ``queued``; a repair's own
  ``rails.lease_wait_max_s`` ends it ``timed_out`` if the policy stays unreadable); a
  failed refresh of a policy once read keeps serving on it.
- **failure-domain hold** (issue 29 item 2): when ``domain_threshold`` distinct nodes of
  one failure domain (``PolicyView.domains``) have raised an actionable fault (the node's
  ``fault_seen`` report, :class:`FaultSeen`) or asked for a lease for a platform-
  recommended repair within ``domain_window_s`` (the guard's clock), the domain is held: one
  ``failure_domain`` cluster alert names it, its nodes and fault kinds, and no automatic
  new request of a node of the domain is granted until an operator releases it
  (:class:`ReleaseDomain`); a person's request (approved by a person, or requested by a
  user) and a renewal are not held. Holds are carried and rebuilt from the ledger. A
  release marks the requests the hold kept queued as a reset does (their grant carries
  ``reset_at`` = the release): each repair acts only if its fault still stands or was
  received after the release. The guard keeps each domain's last release
  (``released_at``; a rebuilt guard reads it from the ledger's clear of the hold, written
  at the guard's clock), so an automatic request of the domain first asked for at or
  before it is treated so even when a guard restart lost the queue that held it.

The policy numbers come in :class:`PolicyView` (computed by the interpreter from
``load_policy`` with :func:`workflows.policy.concurrency_budget` and
:func:`workflows.policy.breaker_threshold`: the policy package reads
``workflows.config``, which the pure machines may not import).

``defects`` (a parameter of :func:`step`, empty in production; only ``tests/model``
passes it) re-introduces known defects (:data:`DEFECTS`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.leases import (
    DomainFault,
    DomainHold,
    DomainRelease,
    FaultReport,
    Lease,
    LeaseRelease,
    LeaseReply,
    LeaseRequest,
    ReleaseDomainSignal,
    ResetBreakerSignal,
)
from workflows.models import Alert, RequesterKind, Severity

#: How long a fresh guard waits before asking the ledger again, seconds (each read is
#: itself a few activity tries; 60 s keeps a down database from flooding the history).
LEDGER_RETRY_S = 60.0
#: Re-read the policy (``load_policy``) at most this often, seconds (the first release's
#: refresh interval).
POLICY_REFRESH_S = 300.0
#: How long a guard that never read its policy waits before asking ``load_policy`` again
#: after a failed read, seconds (I21: it grants nothing on the defaults). Each read is
#: itself activity tries with backoff (a retryable failure is retried inside it; the
#: machine hears of a non-retryable one, a broken configuration); 60 s, as for the
#: ledger (:data:`LEDGER_RETRY_S`), keeps a broken configuration from flooding the
#: history and picks up its fix within a minute.
POLICY_RETRY_S = 60.0
#: Kind of the breaker's cluster-level alerts (a trip raises, a reset clears).
BREAKER_KIND = "circuit_breaker"
#: Kind of a failure-domain hold's cluster-level alert (issue 29 contract: a hold raises,
#: a release clears).
DOMAIN_KIND = "failure_domain"
#: Defaults of ``policy.domains.threshold`` / ``.window_s`` (issue 29 item 2: 3 nodes of
#: one domain within 10 minutes; a rack's false NVLink-down arrived 18 nodes at a time).
DOMAIN_THRESHOLD = 3
DOMAIN_WINDOW_S = 600.0
#: Releases kept for operators (newest kept; the first release's bound for errors).
MAX_RELEASES = 20
#: Bounds of the lists kept for operators (newest kept): the ``status`` query shows them
#: and ``autorepair breaker status`` prints them; 50 expired leases and 20 errors are the
#: first release's bounds (enough for an on-call page, small in every carried state).
MAX_EXPIRED = 50
MAX_ERRORS = 20
#: Most requests kept waiting in ``queue`` (budget-, pool-, node- or breaker-queued),
#: one per repair. 12,500 is the node count of the largest fleet issue 30 sizes for
#: (100,000 GPUs at 8 per node, several clusters): one cluster never has more repairs
#: waiting at once, one repair per node being in flight (docs/design.md §5). A request
#: beyond it is told it waits (``queued``) without being kept; its repair re-sends it every
#: ``LEASE_RESEND_S`` (workflows/protocol.py) and is kept once there is room.
MAX_QUEUED = 12_500
#: History length after which the guard continues as new (Temporal's own suggestion
#: also triggers it); overridable through the carried ``history_limit``.
DEFAULT_HISTORY_LIMIT = 10_000
#: Timer names.
EXPIRY_TIMER = "lease_expiry"
LEDGER_TIMER = "ledger_retry"
POLICY_TIMER = "policy_retry"

DEFECTS: dict[str, str] = {
    "reset_marks_queue_only": "a breaker reset marks only the requests the guard's queue "
                              "holds; one re-sent after a guard restart lost it acts on "
                              "pre-reset evidence (I23)",
    "rebuild_recounts_before_reset": "a guard rebuilt from the ledger counts the automatic "
                                     "starts and requests from before the last reset in "
                                     "the window again (I23)",
    "reset_marks_breaker_queued_only": "a breaker reset marks only breaker-queued requests; "
                                       "a budget-queued one acts on pre-reset evidence (I23)",
    "reset_recounts": "a reset forgets which repairs were counted, so their re-sent "
                      "requests are counted again in the fresh window (I23)",
    "rebuild_counts_cordons_only": "a guard rebuilt from the ledger counts only the "
                                   "automatic repairs that recorded their cordon: an "
                                   "automatic holder granted before the restart is not "
                                   "counted, and the breaker lets threshold more through",
    "rebuild_gives_up": "a fresh guard that cannot read the ledger serves without its "
                        "holders and grants a second lease beside one (I21)",
    "can_skips_rebuild": "a guard that continued as new while it waited to retry its "
                         "first policy or ledger read serves without rebuilding from the "
                         "ledger: a holder the ledger lists loses its slot (I21)",
    "grant_before_policy": "a guard whose first policy read fails serves on the defaults, "
                           "which know no failure domain's nodes: a hold rebuilt from the "
                           "ledger holds nothing and an automatic lease is granted inside "
                           "the held domain (I21)",
    "drain_grants_at_end": "the messages deferred while a read was out are decided in "
                           "order but granted only after the last of them: a request that "
                           "came before a later one tripped the breaker is held by it, "
                           "and one the final grant round refuses is never answered",
    "rebuild_refuses_renewals": "a renewal that comes while the guard rebuilds from the "
                                "ledger is told queued: its holder takes its lease for "
                                "lapsed and stops before its next step until the rebuild",
    "reset_at_drain": "a breaker reset (or a domain release) deferred while a read was "
                      "out takes effect as of "
                      "when the read answered: a repair that first asked after the "
                      "operator's reset is told the reset and acts only on evidence "
                      "newer than the read (its fault's is older: it ends unrepaired). "
                      "Found by tests/unit/test_guard_deferred_reset.py, not by the model "
                      "checker: the old behaviour is over-cautious and breaks no safety "
                      "invariant",
    "breaker_ignores_queue": "a budget-queued automatic request is granted while the "
                             "breaker is open",
    "batch_decides_in_parallel": "a batch of requests is decided against the leases held "
                                 "before the batch, so two requests of one batch are both "
                                 "granted beyond the budget or the pool rule",
    "domain_hold_ignores_queue": "the hold is checked only when a request arrives: one "
                                 "queued before its domain was held (budget, pool, node) is "
                                 "granted from the queue while the hold is in force",
    "domain_counts_requests_only": "a node's fault report is not counted: a domain is "
                                   "judged on lease requests only, so the first "
                                   "threshold - 1 repairs of a rack cordon before it is "
                                   "held (issue 29 item 2)",
    "domain_release_keeps_evidence": "a release of a failure-domain hold does not mark the "
                                     "requests it kept queued: their repairs are granted "
                                     "without reset_at and act on evidence from before the "
                                     "release",
    "release_marks_queue_only": "a release of a failure-domain hold marks only the "
                                "requests the guard's queue holds: one a guard restart "
                                "lost and re-sent after the release acts on evidence "
                                "from before it",
}


class Status(StrEnum):
    """Where the guard's lifecycle is (see the module's docstring)."""

    starting = "starting"
    rebuilding = "rebuilding"
    serving = "serving"


class Why(StrEnum):
    """Why a queued request waits (a request that came while the guard was starting or
    rebuilding is kept in ``deferred`` and decided, in order, once it serves)."""

    node = "node"
    pool = "pool"
    budget = "budget"
    detector_cap = "detector_cap"
    breaker = "breaker"
    domain = "domain"


class PolicyView(BaseModel):
    """The rails the guard applies (from ``load_policy``; defaults: RailsConfig's)."""

    gpu_nodes: int = Field(ge=0)
    budget: int = Field(ge=1)
    breaker_threshold: int = Field(ge=1)
    breaker_window_s: float = Field(gt=0)
    one_per_pool: bool
    detector_cap: int = Field(ge=0)
    lease_ttl_s: float = Field(gt=0)
    pools: dict[str, str] = Field(default_factory=dict)
    #: node → the failure domains it belongs to (``nodes[].failure_domain``, scheduler
    #: labels / features; ``PolicySnapshot.domains``).
    domains: dict[str, list[str]] = Field(default_factory=dict)
    domain_threshold: int = Field(DOMAIN_THRESHOLD, ge=1)
    domain_window_s: float = Field(DOMAIN_WINDOW_S, gt=0)
    loaded: bool = False
    loaded_at: datetime | None = None


class Queued(BaseModel):
    """A waiting request: ``why`` and ``reason`` (the last refusal), ``since`` (first
    queued), ``evidence_after`` (a breaker reset happened while it waited: only evidence
    observed after it counts, I23)."""

    req: LeaseRequest
    why: Why
    reason: str
    since: datetime
    evidence_after: datetime | None = None


class Counted(BaseModel):
    """An automatic repair counted for the breaker; ``in_window`` false once a reset
    started a fresh window (the id is kept so it is never counted again).

    Bound after every step (:func:`_prune_counted`): entries of repairs still held or
    queued, and the newest ``breaker_threshold + 1`` others inside the breaker window.
    That is exact for the breaker: more than ``breaker_threshold`` starts in the window
    exist if and only if more than ``breaker_threshold`` are kept (the newest leave the
    window last)."""

    repair_id: str
    at: datetime
    in_window: bool = True


class HeldRepair(BaseModel):
    """A holder the ledger lists (a repair in a stage that holds a node)."""

    repair_id: str
    node: str
    workflow_id: str
    automatic: bool = False
    requester_kind: RequesterKind = RequesterKind.system
    #: when the repair was recorded (its first request follows; None: not known)
    requested_at: datetime | None = None
    #: the pool the repair asked with (None: none recorded); the configuration's pool
    #: of the node comes first, as for a request (:func:`_pool`)
    node_pool: str | None = None


class LedgerView(BaseModel):
    """What ``ledger_guard_state`` answered: holders, automatic starts in the window
    (``(repair_id, at)``), the breaker as the ledger has it."""

    holders: list[HeldRepair] = Field(default_factory=list)
    automatic: list[tuple[str, datetime]] = Field(default_factory=list)
    breaker_open: bool = False
    tripped_at: datetime | None = None
    tripped_reason: str = ""
    #: Failure-domain holds the ledger has open (their alert raised, not cleared).
    holds: list[DomainHold] = Field(default_factory=list)
    #: The last reset of the open breaker (the guard's newest breaker clear), also when
    #: the breaker tripped again since.
    reset_at: datetime | None = None
    #: Who made that reset (shown in the rebuilt guard's status).
    reset_by: str | None = None
    #: The last release of each failure domain the ledger records (the newest clear of
    #: the domain's hold, its time the guard's clock when it released).
    releases: list[DomainRelease] = Field(default_factory=list)


class GuardState(BaseModel):
    """Everything the guard keeps across continue-as-new (``GuardInput.carried``).

    Bounded: ``leases`` ≤ ``policy.budget``; ``queue`` ≤ :data:`MAX_QUEUED`; ``counted``
    ≤ held + queued + ``breaker_threshold + 1`` (:class:`Counted`); ``expired`` ≤
    :data:`MAX_EXPIRED`; ``errors`` ≤ :data:`MAX_ERRORS`; ``deferred`` holds only what came
    while the guard was starting or rebuilding, one request per repair and kind (a
    re-send replaces it in place, :func:`_defer`; a guard waiting out a long outage
    continues as new carrying them); ``timers`` ≤ 2 (the lease expiry and one read's retry);
    ``domain_faults``: inside ``domain_window_s`` only, at most one per (domain, repair),
    fewer than ``domain_threshold`` nodes per domain not held (a held domain counts no
    more) and :data:`MAX_QUEUED` in all; ``holds`` ≤ the domains configured;
    ``domain_releases`` ≤ :data:`MAX_RELEASES`."""

    model_config = ConfigDict(extra="ignore")

    cluster: str
    status: Status = Status.starting
    reading: Literal["policy", "ledger"] | None = None
    fresh: bool = True
    policy: PolicyView
    leases: list[Lease] = Field(default_factory=list)
    queue: list[Queued] = Field(default_factory=list)
    deferred: list[Deferred] = Field(default_factory=list)
    breaker_open: bool = False
    tripped_at: datetime | None = None
    tripped_reason: str = ""
    reset_at: datetime | None = None
    reset_by: str | None = None
    #: the last reset of an *open* breaker: a request first asked for at or before it
    #: waited through it (I23), even when this guard's queue never held it (a restart
    #: lost the queue, the request was re-sent after the reset)
    open_reset_at: datetime | None = None
    counted: list[Counted] = Field(default_factory=list)
    refused_total: int = 0
    expired: list[Lease] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    rebuilt_at: datetime | None = None
    timers: dict[str, datetime] = Field(default_factory=dict)
    history_limit: int = DEFAULT_HISTORY_LIMIT
    domain_faults: list[DomainFault] = Field(default_factory=list)
    holds: list[DomainHold] = Field(default_factory=list)
    domain_releases: list[DomainRelease] = Field(default_factory=list)
    #: domain → its last release (the guard's clock; rebuilt from the ledger's clear of
    #: the hold): an automatic request of a node of the domain first asked for at or
    #: before it waited through the release, even when this guard's queue never held it
    #: (a restart lost the queue), as ``open_reset_at`` does for a breaker reset
    released_at: dict[str, datetime] = Field(default_factory=dict)


# ---- events ------------------------------------------------------------------------
class Started(BaseModel):
    """The workflow run began: ``fresh`` for a first start or a restart after it was
    terminated (rebuild from the ledger), false after continue-as-new."""

    kind: Literal["started"] = "started"
    fresh: bool


class PolicyRead(BaseModel):
    kind: Literal["policy_ok"] = "policy_ok"
    view: PolicyView


class PolicyFailed(BaseModel):
    kind: Literal["policy_failed"] = "policy_failed"
    message: str = ""


class LedgerRead(BaseModel):
    kind: Literal["ledger_ok"] = "ledger_ok"
    view: LedgerView


class LedgerUnavailable(BaseModel):
    kind: Literal["ledger_unavailable"] = "ledger_unavailable"
    message: str = ""


class Request(BaseModel):
    """Signal ``acquire`` (a new request, a re-send, or a renewal: ``req.renew``)."""

    kind: Literal["request"] = "request"
    req: LeaseRequest


class Release(BaseModel):
    kind: Literal["release"] = "release"
    rel: LeaseRelease


class ResetBreaker(BaseModel):
    """Signal ``reset_breaker``; ``at``: when the guard received it, set when it is
    deferred (a read was out): the reset is decided later, as of then (I23)."""

    kind: Literal["reset_breaker"] = "reset_breaker"
    sig: ResetBreakerSignal
    at: datetime | None = None


class ReleaseDomain(BaseModel):
    """Signal ``release_domain``: an operator lifts a failure-domain hold."""

    kind: Literal["release_domain"] = "release_domain"
    sig: ReleaseDomainSignal
    #: when the guard received it, set when it is deferred (a read was out): the release
    #: is decided later, as of then (as a deferred breaker reset, :class:`ResetBreaker`)
    at: datetime | None = None


class FaultSeen(BaseModel):
    """Signal ``fault_seen``: a node of a failure domain raised an actionable fault
    (counted toward the domain's hold when it arrives; issue 29 item 2)."""

    kind: Literal["fault_seen"] = "fault_seen"
    report: FaultReport


#: A message a starting or rebuilding guard keeps for when it serves.
Deferred = Annotated[Request | Release | ResetBreaker | ReleaseDomain | FaultSeen,
                     Field(discriminator="kind")]


class ClusterAlert(BaseModel):
    """Signal ``cluster_alert`` (ingest's panic mode): recorded and notified."""

    kind: Literal["cluster_alert"] = "cluster_alert"
    alert: Alert


class TimerFired(BaseModel):
    kind: Literal["timer"] = "timer"
    name: str


class ReplyUndeliverable(BaseModel):
    """A lease signal could not be delivered: the holder/requester is gone."""

    kind: Literal["reply_undeliverable"] = "reply_undeliverable"
    repair_id: str
    purpose: Literal["reply", "extend", "rebuilt"]


class EffectFailed(BaseModel):
    """A best-effort side effect failed after its tries (``what``: ``write_alert``,
    ``notify`` or ``send_lease``; ``subject``: the alert id, the notification's subject,
    or the repair a lease reply could not reach for another reason than its requester
    being gone: the guard keeps its decision, the requester re-sends its request)."""

    kind: Literal["effect_failed"] = "effect_failed"
    what: Literal["write_alert", "notify", "send_lease"]
    subject: str
    message: str = ""


class HistoryLong(BaseModel):
    """The history is long (Temporal suggests continue-as-new, or ``history_limit``)."""

    kind: Literal["history_long"] = "history_long"


class Clock(BaseModel):
    """Time passed (``now`` of :func:`step`); nothing else."""

    kind: Literal["clock"] = "clock"


Message = Annotated[
    Request | Release | ResetBreaker | ReleaseDomain | FaultSeen | ClusterAlert
    | ReplyUndeliverable | EffectFailed,
    Field(discriminator="kind"),
]


class Batch(BaseModel):
    """Every message the workflow received before its next step (signals and command
    outcomes, in arrival order; issue 30 item 1): each is decided in order as if it came
    alone, then the queue is granted once, so one workflow task answers them all. A reply
    a later one in the same batch supersedes (a "queued" answer to a request the batch
    then grants, a request re-sent twice) is not sent."""

    kind: Literal["batch"] = "batch"
    events: list[Message] = Field(default_factory=list)


GuardState.model_rebuild()

Event = Annotated[
    Started | PolicyRead | PolicyFailed | LedgerRead | LedgerUnavailable | Request | Release
    | ResetBreaker | ReleaseDomain | FaultSeen | ClusterAlert | TimerFired
    | ReplyUndeliverable | EffectFailed | HistoryLong | Clock | Batch,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("started", "policy_ok", "policy_failed", "ledger_ok", "ledger_unavailable",
               "request", "release", "reset_breaker", "release_domain", "fault_seen",
               "cluster_alert", "timer",
               "reply_undeliverable", "effect_failed", "history_long", "clock", "batch")


# ---- commands ----------------------------------------------------------------------
class LoadPolicy(BaseModel):
    kind: Literal["load_policy"] = "load_policy"


class ReadLedger(BaseModel):
    """``ledger_guard_state`` for the cluster; ``since``: start of the breaker window."""

    kind: Literal["read_ledger"] = "read_ledger"
    since: datetime


class SendLease(BaseModel):
    """Signal ``lease`` ``reply`` to ``workflow_id``; undeliverable → ReplyUndeliverable."""

    kind: Literal["send_lease"] = "send_lease"
    workflow_id: str
    reply: LeaseReply
    purpose: Literal["reply", "extend", "rebuilt"] = "reply"


class WriteAlert(BaseModel):
    """Record a cluster-level alert in the ledger (idempotent on its id)."""

    kind: Literal["write_alert"] = "write_alert"
    alert: Alert


class Notify(BaseModel):
    kind: Literal["notify"] = "notify"
    subject: str
    body: str
    severity: str
    event: str
    dedup_key: str


class StartTimer(BaseModel):
    kind: Literal["start_timer"] = "start_timer"
    name: str
    at: datetime


class CancelTimer(BaseModel):
    kind: Literal["cancel_timer"] = "cancel_timer"
    name: str


class SetDetails(BaseModel):
    kind: Literal["set_details"] = "set_details"
    text: str


class Warn(BaseModel):
    """Log a warning (the guard's operators read it with the errors)."""

    kind: Literal["warn"] = "warn"
    text: str


class ContinueAsNew(BaseModel):
    """Continue as new carrying the state."""

    kind: Literal["continue_as_new"] = "continue_as_new"


Command = (LoadPolicy | ReadLedger | SendLease | WriteAlert | Notify | StartTimer
           | CancelTimer | SetDetails | Warn | ContinueAsNew)
Cmds = list[Command]


# ---- the machine -------------------------------------------------------------------
def new_state(cluster: str, policy: PolicyView) -> GuardState:
    """A fresh guard for ``cluster`` with ``policy`` (the defaults until read)."""
    if not cluster:
        raise ValueError("cluster: must be a non-empty name (got '')")
    return GuardState(cluster=cluster, policy=policy)


def window_count(s: GuardState, now: datetime) -> list[datetime]:
    """Times of the automatic starts counted in the current breaker window."""
    start = now - timedelta(seconds=s.policy.breaker_window_s)
    return sorted(c.at for c in s.counted if c.in_window and start <= c.at <= now)


def _note(s: GuardState, now: datetime, text: str) -> tuple[GuardState, Cmds]:
    errors = [*s.errors, f"{now.isoformat()} {text}"][-MAX_ERRORS:]
    return s.model_copy(update={"errors": errors}), [Warn(text=text)]


def _ttl(s: GuardState) -> timedelta:
    return timedelta(seconds=s.policy.lease_ttl_s)


def _pool(s: GuardState, req: LeaseRequest) -> str | None:
    """The node's pool from the configuration; the request's only for unconfigured
    nodes."""
    return s.policy.pools.get(req.node) or req.node_pool


def refusal(s: GuardState, req: LeaseRequest) -> tuple[Why, str] | None:
    """Why ``req`` cannot be granted now (node, pool, budget, detector cap), or None."""
    others = [x for x in s.leases if x.repair_id != req.repair_id]
    same_node = [x for x in others if x.node == req.node]
    if same_node:
        return Why.node, f"node {req.node} busy with repair {same_node[0].repair_id}"
    pool = _pool(s, req)
    if s.policy.one_per_pool and pool is not None:
        busy = [x for x in others if x.node_pool == pool]
        if busy:
            return Why.pool, f"node pool {pool} busy with repair {busy[0].repair_id}"
    if len(others) >= s.policy.budget:
        return Why.budget, f"concurrency budget {s.policy.budget} in use"
    if req.requester_kind == RequesterKind.detector:
        n = sum(1 for x in others if x.requester_kind == RequesterKind.detector)
        if n >= s.policy.detector_cap:
            return Why.detector_cap, f"detector cap {s.policy.detector_cap} reached"
    return None


def _breaker_holds(s: GuardState, req: LeaseRequest) -> bool:
    """Whether the open breaker holds ``req`` back: automatic new starts only."""
    return s.breaker_open and req.automatic and not req.renew


def is_person(req: LeaseRequest) -> bool:
    """Whether a person decided ``req``'s repair: approved by a person (``automatic``
    false: the repair's approver is not the consent policy) or requested by a user."""
    return not req.automatic or req.requester_kind == RequesterKind.user


def domain_hold(s: GuardState, req: LeaseRequest) -> DomainHold | None:
    """The failure-domain hold that keeps ``req`` waiting, or None: only an automatic new
    request of a node of a held domain (a renewal and a person's request are not held)."""
    if not s.holds or req.renew or is_person(req):
        return None
    mine = s.policy.domains.get(req.node) or []
    return next((h for h in s.holds if h.domain in mine), None)


def _hold_reason(s: GuardState, domain: str, opened_at: datetime, nodes: list[str],
                 kinds: list[str]) -> str:
    return (f"failure domain {domain} held since {opened_at.isoformat()}: {len(nodes)} "
            f"nodes ({', '.join(nodes)}) raised "
            f"{', '.join(kinds) or 'faults'} within {s.policy.domain_window_s:g} s; "
            f"waiting until an operator runs `autorepair domains release --cluster "
            f"{s.cluster} {domain}`")


def _open_hold(s: GuardState, domain: str, nodes: list[str], kinds: list[str],
               now: datetime) -> tuple[DomainHold, Cmds]:
    """The hold of ``domain`` opened at ``now`` and its commands: details, the
    ``failure_domain`` cluster alert (ledger, then notification)."""
    reason = _hold_reason(s, domain, now, nodes, kinds)
    alert_id = f"domain/{s.cluster}/{domain}/{now.isoformat()}"
    hold = DomainHold(domain=domain, opened_at=now, nodes=nodes, kinds=kinds,
                      alert_id=alert_id, reason=reason)
    alert = Alert(
        alert_id=alert_id, cluster=s.cluster, node="*", kind=DOMAIN_KIND,
        severity=Severity.critical,
        summary=f"Failure-domain hold on {domain} in cluster {s.cluster}: {len(nodes)} "
                f"nodes ({', '.join(kinds) or 'faults'})",
        description=reason,
        evidence={"domain": domain, "nodes": nodes, "kinds": kinds,
                  "threshold": s.policy.domain_threshold,
                  "window_s": s.policy.domain_window_s},
        level=True, source="guard", observed_at=now)
    return hold, [SetDetails(text=f"failure domain {domain} HELD: {len(nodes)} nodes "
                                  f"({', '.join(nodes)})"), *_record(alert)]


def _count_domain(s: GuardState, req: LeaseRequest, now: datetime
                  ) -> tuple[GuardState, Cmds]:
    """Count a new request of a platform-recommended repair once (per repair) for each
    failure domain of its node that is not held — automatic or approved by a person: the
    faults point at a shared cause either way, and with ``consent.mode: approve`` (the
    default) every request comes after an approval; an operator's own request
    (``requested by a user``) is not counted. A domain with ``domain_threshold`` distinct
    nodes counted inside ``domain_window_s`` is held (:func:`_open_hold`); the hold keeps
    only automatic requests waiting (:func:`domain_hold`): a person's approval still
    goes, and the hold's alert tells the approvers of the shared cause."""
    if req.renew or req.requester_kind == RequesterKind.user:
        return s, []
    return _count(s, req.node, s.policy.domains.get(req.node) or [], req.repair_id,
                  req.fault_kinds, now)


def _count_fault(s: GuardState, rep: FaultReport, now: datetime,
                 defects: frozenset[str]) -> tuple[GuardState, Cmds]:
    """Count a node's actionable fault (``fault_seen``) toward each failure domain of the
    node (the guard's view, with the domains the node reported: both come from
    ``load_policy``) at arrival: at most one count per (domain, node) inside the window,
    so a flapping node fills no list. Counting faults, not only lease requests, holds a
    domain before its first repair asks (faults waiting out a grace period ask at once
    when it ends)."""
    if "domain_counts_requests_only" in defects:
        return s, []
    mine = sorted({*(s.policy.domains.get(rep.node) or []), *rep.domains})
    start = now - timedelta(seconds=s.policy.domain_window_s)
    fresh = [d for d in mine if not any(f.domain == d and f.node == rep.node
                                        and f.at >= start for f in s.domain_faults)]
    return _count(s, rep.node, fresh, f"fault/{rep.alert_id}", [rep.kind], now)


def _count(s: GuardState, node: str, mine: list[str], key: str, kinds: list[str],
           now: datetime) -> tuple[GuardState, Cmds]:
    """Count ``node`` (under ``key``: a repair id or ``fault/{alert id}``) once for each
    domain of ``mine`` not held; hold a domain at ``domain_threshold`` distinct nodes
    inside ``domain_window_s``."""
    if not mine:
        return s, []
    start = now - timedelta(seconds=s.policy.domain_window_s)
    faults = list(s.domain_faults)
    holds = list(s.holds)
    cmds: Cmds = []
    for d in mine:
        # a held domain counts no more (its hold names what opened it): the counts stay
        # below the threshold per domain, so a storm's batch scans short lists
        if any(h.domain == d for h in holds) or any(
                f.domain == d and f.repair_id == key for f in faults):
            continue
        faults.append(DomainFault(domain=d, node=node, repair_id=key,
                                  kinds=sorted(set(kinds)), at=now))
        recent = [f for f in faults if f.domain == d and start <= f.at <= now]
        nodes = sorted({f.node for f in recent})
        if len(nodes) >= s.policy.domain_threshold:
            hold, more = _open_hold(s, d, nodes, sorted({k for f in recent for k in f.kinds}),
                                    now)
            holds.append(hold)
            cmds += more
    return s.model_copy(update={"domain_faults": faults[-MAX_QUEUED:], "holds": holds}), cmds


def _prune_domains(s: GuardState, now: datetime) -> GuardState:
    """Drop the domain counts older than ``domain_window_s`` (the bound of
    :class:`GuardState`)."""
    if not s.domain_faults:
        return s
    start = now - timedelta(seconds=s.policy.domain_window_s)
    if s.domain_faults[0].at >= start:
        return s
    return s.model_copy(update={"domain_faults": [f for f in s.domain_faults
                                                  if f.at >= start]})


def _held_by_domain(s: GuardState, q: Queued, defects: frozenset[str]) -> DomainHold | None:
    if "domain_hold_ignores_queue" in defects:
        return None
    return domain_hold(s, q.req)


def _released(have: dict[str, datetime], more: dict[str, datetime]
              ) -> dict[str, datetime]:
    """``have`` with the releases ``more`` adds (the later of two per domain), bounded:
    the newest :data:`MAX_QUEUED` domains (each one entry)."""
    out = dict(have)
    for d, at in more.items():
        if d not in out or at > out[d]:
            out[d] = at
    if len(out) > MAX_QUEUED:
        out = dict(sorted(out.items(), key=lambda kv: kv[1])[-MAX_QUEUED:])
    return out


def release_before(s: GuardState, req: LeaseRequest) -> datetime | None:
    """The last release of a failure domain of ``req``'s node that ``req`` waited
    through, or None: an automatic new request (the kind a hold keeps waiting,
    :func:`domain_hold`) first asked for at or before it (``requested_at``). Its repair
    acts only on evidence observed after the release, as one the hold kept queued when
    it was released does, even when this guard's queue never held it (a restart lost it)."""
    if req.requested_at is None or req.renew or is_person(req) or not s.released_at:
        return None
    mine = s.policy.domains.get(req.node) or []
    return max((at for d in mine if (at := s.released_at.get(d)) is not None
                and req.requested_at <= at), default=None)


def _on_release_domain(s: GuardState, sig: ReleaseDomainSignal, now: datetime,
                       defects: frozenset[str] = frozenset()) -> tuple[GuardState, Cmds]:
    """Lift the hold of ``sig.domain`` (its counts start afresh); the clear is recorded
    as the hold alert's inactive row. A domain not held: a warning, nothing else. The
    requests the hold kept queued are marked ``evidence_after`` the release (``now``):
    their grants carry it as ``reset_at``, so each repair acts only if its fault still
    stands or was received after the release (the rule of a breaker reset, I23)."""
    hold = next((h for h in s.holds if h.domain == sig.domain), None)
    if hold is None:
        return s, [Warn(text=f"release_domain by {sig.by}: domain {sig.domain} is not held")]
    rel = DomainRelease(domain=sig.domain, by=sig.by, reason=sig.reason, at=now,
                        opened_at=hold.opened_at)
    # the repairs the hold kept waiting act only on evidence observed after the release,
    # as those queued through a breaker reset do (I23): their grant carries ``reset_at``
    queue = s.queue if "domain_release_keeps_evidence" in defects else [
        q.model_copy(update={"evidence_after": max(now, q.evidence_after or now)})
        if sig.domain in (s.policy.domains.get(q.req.node) or [])
        and domain_hold(s, q.req) is not None else q
        for q in s.queue]
    s = s.model_copy(update={
        "queue": queue,
        "holds": [h for h in s.holds if h.domain != sig.domain],
        "domain_faults": [f for f in s.domain_faults if f.domain != sig.domain],
        "domain_releases": [*s.domain_releases, rel][-MAX_RELEASES:],
        "released_at": _released(s.released_at, {sig.domain: now})})
    return s, [
        SetDetails(text=f"failure domain {sig.domain} released by {sig.by} at "
                        f"{now.isoformat()}: {sig.reason}"),
        WriteAlert(alert=Alert(
            alert_id=f"{hold.alert_id}/release", cluster=s.cluster, node="*",
            kind=DOMAIN_KIND, severity=Severity.info,
            summary=f"Failure-domain hold on {sig.domain} released by {sig.by}",
            description=sig.reason,
            evidence={"domain": sig.domain, "by": sig.by, "reason": sig.reason,
                      "opened_at": hold.opened_at.isoformat()},
            level=True, active=False, source="guard", observed_at=now))]


def _prune_counted(s: GuardState, now: datetime, asking: str) -> GuardState:
    """Keep the counted entries of repairs held, queued or ``asking``, and the newest
    ``breaker_threshold + 1`` others in the window (the bound of :class:`Counted`). Run
    once per step (:func:`_settle`): it never changes a trip decision, which needs only
    more than ``breaker_threshold`` entries in the window."""
    start = now - timedelta(seconds=s.policy.breaker_window_s)
    live = {q.req.repair_id for q in s.queue} | {x.repair_id for x in s.leases} | {asking}
    others = [c for c in s.counted if c.repair_id not in live and start <= c.at]
    keep = {id(c) for c in sorted(others, key=lambda c: c.at)[-(s.policy.breaker_threshold
                                                                 + 1):]}
    counted = [c for c in s.counted if c.repair_id in live or id(c) in keep]
    return s.model_copy(update={"counted": counted})


def _drop(s: GuardState, repair_id: str) -> GuardState:
    """Forget ``repair_id``'s lease and queued request. Its breaker entry stays
    (:class:`Counted`): the breaker counts automatic starts in its window, ended ones
    too, as a guard rebuilt from the ledger does; forgetting it on release let a rolling
    failure — each repair over before the next began — go past the threshold untripped.
    :func:`_prune_counted` bounds the entries."""
    return s.model_copy(update={
        "leases": [x for x in s.leases if x.repair_id != repair_id],
        "queue": [q for q in s.queue if q.req.repair_id != repair_id],
    })


def _grant_queued(s: GuardState, now: datetime, defects: frozenset[str],
                  base: GuardState | None = None) -> tuple[GuardState, Cmds]:
    """Grant every queued request the rules allow, in queue order (each grant counts
    against the next request's budget, pool and node). ``base``: only with the planted
    defect ``batch_decides_in_parallel``, the state the rules are wrongly checked on."""
    leases = list(s.leases)
    still: list[Queued] = []
    cmds: Cmds = []
    for q in s.queue:
        if _held_by_breaker(s, q, defects):
            still.append(q.model_copy(update={"why": Why.breaker}))
            continue
        hold = _held_by_domain(s, q, defects)
        if hold is not None:
            still.append(q.model_copy(update={"why": Why.domain, "reason": hold.reason}))
            continue
        no = refusal(base if base is not None else s.model_copy(update={"leases": leases}),
                     q.req)
        if no is not None:
            still.append(q.model_copy(update={"why": no[0], "reason": no[1]}))
            continue
        lease, reply = _grant(s, q, now)
        leases.append(lease)
        cmds.append(reply)
    return s.model_copy(update={"leases": leases, "queue": still}), cmds


def _held_by_breaker(s: GuardState, q: Queued, defects: frozenset[str]) -> bool:
    return _breaker_holds(s, q.req) and not (
        "breaker_ignores_queue" in defects and q.why != Why.breaker)


def _grant(s: GuardState, q: Queued, now: datetime) -> tuple[Lease, SendLease]:
    """The lease granted to ``q`` at ``now`` and its reply."""
    req, exp = q.req, now + _ttl(s)
    lease = Lease(repair_id=req.repair_id, workflow_id=req.workflow_id, node=req.node,
                  node_pool=_pool(s, req), automatic=req.automatic,
                  requester_kind=req.requester_kind, granted_at=now, expires_at=exp,
                  evidence_after=q.evidence_after)
    return lease, SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
        repair_id=req.repair_id, granted=True,
        reason="re-acquired" if req.renew else "granted",
        reset_at=q.evidence_after, expires_at=exp))


def _grant_one(s: GuardState, repair_id: str, now: datetime, defects: frozenset[str],
               base: GuardState | None) -> tuple[GuardState, Cmds]:
    """After a request inside a batch: grant its queue entry if the rules allow. Exactly
    what :func:`_grant_queued` would do there: since the last grant round only this
    request changed the state (it can trip the breaker, never free a slot), so every
    other entry is still refused for the reason it has."""
    queue = s.queue
    i = len(queue) - 1 if queue and queue[-1].req.repair_id == repair_id else next(
        (k for k, q in enumerate(queue) if q.req.repair_id == repair_id), -1)
    if i < 0:
        return s, []
    q = queue[i]
    if _held_by_breaker(s, q, defects) or _held_by_domain(s, q, defects) is not None:
        return s, []
    no = refusal(base if base is not None else s, q.req)
    if no is not None:
        return s, []
    lease, reply = _grant(s, q, now)
    return s.model_copy(update={"leases": [*s.leases, lease],
                                "queue": [*queue[:i], *queue[i + 1:]]}), [reply]


def _timers(s: GuardState) -> tuple[GuardState, Cmds]:
    """Arm the lease-expiry timer at the soonest expiry (cancel it with no lease)."""
    timers = dict(s.timers)
    cmds: Cmds = []
    soonest = min((x.expires_at for x in s.leases), default=None)
    if soonest is None:
        if EXPIRY_TIMER in timers:
            del timers[EXPIRY_TIMER]
            cmds.append(CancelTimer(name=EXPIRY_TIMER))
    elif timers.get(EXPIRY_TIMER) != soonest:
        timers[EXPIRY_TIMER] = soonest
        cmds.append(StartTimer(name=EXPIRY_TIMER, at=soonest))
    return s.model_copy(update={"timers": timers}), cmds


def _expire(s: GuardState, now: datetime) -> tuple[GuardState, Cmds]:
    """Leases past expiry: extended, and the holder asked (a signal); a holder that is
    gone frees its slot (:class:`ReplyUndeliverable` ``extend``)."""
    cmds: Cmds = []
    leases = []
    for x in s.leases:
        if x.expires_at <= now:
            x = x.model_copy(update={"expires_at": now + _ttl(s)})
            cmds.append(SendLease(workflow_id=x.workflow_id, purpose="extend", reply=LeaseReply(
                repair_id=x.repair_id, granted=True,
                reason="lease extended at expiry: holder still running",
                reset_at=x.evidence_after, expires_at=x.expires_at)))
        leases.append(x)
    return s.model_copy(update={"leases": leases}), cmds


def _trip(s: GuardState, now: datetime, count: int) -> tuple[GuardState, Cmds]:
    reason = (f"{count} automatic repair/cordon requests within "
              f"{s.policy.breaker_window_s:g} s exceeded threshold {s.policy.breaker_threshold}")
    s = s.model_copy(update={"breaker_open": True, "tripped_at": now, "tripped_reason": reason})
    alert = Alert(
        alert_id=f"breaker/{s.cluster}/{now.isoformat()}", cluster=s.cluster, node="*",
        kind=BREAKER_KIND, severity=Severity.critical,
        summary=f"Circuit breaker tripped on cluster {s.cluster}",
        description=reason + "; automatic repairs are paused until an operator runs "
        f"`autorepair breaker reset --cluster {s.cluster}`",
        evidence={"count": count, "threshold": s.policy.breaker_threshold, "reason": reason},
        level=True, source="guard", observed_at=now)
    return s, [SetDetails(text=f"circuit breaker OPEN: {reason}"), *_record(alert)]


def _record(alert: Alert) -> Cmds:
    """Ledger write, then (while active) the notification."""
    cmds: Cmds = [WriteAlert(alert=alert)]
    if alert.active:
        breaker = alert.kind == BREAKER_KIND
        cmds.append(Notify(
            subject=alert.summary, body=alert.description, severity=alert.severity.value,
            event="breaker_tripped" if breaker else "cluster_alert",
            # each trip its own incident (its alert id names the cluster and the trip's
            # time): a reset resolves nothing at the pager, so one key per cluster folded
            # the next trip into the incident of the last and paged nobody
            dedup_key=alert.alert_id))
    return cmds


def _on_request(s: GuardState, req: LeaseRequest, now: datetime, defects: frozenset[str]
                ) -> tuple[GuardState, Cmds, Cmds]:
    """(state, replies, effects) for one request while serving."""
    held = next((x for x in s.leases if x.repair_id == req.repair_id), None)
    if held is not None:
        exp = now + _ttl(s)
        leases = [x.model_copy(update={"expires_at": exp, "workflow_id": req.workflow_id,
                                       "source": "granted"})
                  if x.repair_id == req.repair_id else x for x in s.leases]
        s = s.model_copy(update={"leases": leases})
        # the grant's reset, again: a holder whose grant never reached it (a failed
        # reply) acts on this answer, and must not act on pre-reset evidence (I23)
        return s, [SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
            repair_id=req.repair_id, granted=True,
            reason="renewed" if req.renew else "already held",
            reset_at=held.evidence_after, expires_at=exp))], []
    # list comprehensions, not generators: a storm's batch looks through long lists
    # once per request (issue 30: a batch must fit one workflow activation)
    ids = [q.req.repair_id for q in s.queue]
    old = s.queue[ids.index(req.repair_id)] if req.repair_id in ids else None
    counts = req.automatic and not req.renew
    effects: Cmds = []
    # first asked at or before the last reset: counted before it (by this guard or by the
    # one a restart replaced), so not in the fresh window (I23)
    before_reset = (req.requested_at is not None and s.open_reset_at is not None
                    and req.requested_at <= s.open_reset_at)
    if counts and req.repair_id not in {c.repair_id for c in s.counted}:
        s = s.model_copy(update={"counted": [*s.counted, Counted(
            repair_id=req.repair_id, at=now,
            in_window=not before_reset or bool(
                {"rebuild_recounts_before_reset", "reset_recounts"} & defects))]})
    if counts and not s.breaker_open:  # (pruned once per step, in _settle)
        recent = window_count(s, now)
        if len(recent) > s.policy.breaker_threshold:
            s, effects = _trip(s, now, len(recent))
    s, opened = _count_domain(s, req, now)
    effects += opened
    q = old or Queued(req=req, why=Why.breaker, reason="", since=now)
    if (q.evidence_after is None and not req.renew and before_reset
            and "reset_marks_queue_only" not in defects):
        q = q.model_copy(update={"evidence_after": s.open_reset_at})
    # first asked at or before a release of its domain's hold: it waited through the
    # release (queued by the hold, by this guard or by the one a restart replaced)
    released = None if "release_marks_queue_only" in defects else release_before(s, req)
    if released is not None and (q.evidence_after is None or q.evidence_after < released):
        q = q.model_copy(update={"evidence_after": released})
    if counts and s.breaker_open:
        q = q.model_copy(update={"why": Why.breaker,
                                 "reason": f"circuit breaker open: {s.tripped_reason}"})
        total = s.refused_total + (0 if old else 1)
    else:
        q = q.model_copy(update={"req": req})
        total = s.refused_total
    if old is None and len(s.queue) >= MAX_QUEUED:
        return s.model_copy(update={"refused_total": total}), [SendLease(
            workflow_id=req.workflow_id, reply=LeaseReply(
                repair_id=req.repair_id, granted=False, queued=True,
                reason=f"guard queue full ({MAX_QUEUED} waiting): re-send later"))], effects
    queue = ([q if x.req.repair_id == req.repair_id else x for x in s.queue] if old
             else [*s.queue, q])
    s = s.model_copy(update={"queue": queue, "refused_total": total})
    if counts and s.breaker_open:
        return s, [SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
            repair_id=req.repair_id, granted=False, queued=True, reason=q.reason))], effects
    hold = domain_hold(s, req)
    if hold is not None:
        queue = [x.model_copy(update={"why": Why.domain, "reason": hold.reason})
                 if x.req.repair_id == req.repair_id else x for x in s.queue]
        s = s.model_copy(update={"queue": queue})
        return s, [SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
            repair_id=req.repair_id, granted=False, queued=True, reason=hold.reason))], effects
    no = refusal(s, req)
    if no is not None:
        text = no[1]
        if req.renew:
            lapsed = next((x for x in s.expired if x.repair_id == req.repair_id), None)
            when = f" at {lapsed.expires_at.isoformat()}" if lapsed else ""
            text = f"lease lapsed{when} and cannot be renewed: {text}"
        queue = [x.model_copy(update={"why": no[0], "reason": text})
                 if x.req.repair_id == req.repair_id else x for x in s.queue]
        s = s.model_copy(update={"queue": queue})
        return s, [SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
            repair_id=req.repair_id, granted=False, queued=True, reason=text))], effects
    return s, [], effects


def _on_reset(s: GuardState, sig: ResetBreakerSignal, now: datetime,
              defects: frozenset[str]) -> tuple[GuardState, Cmds]:
    was_open, tripped_at = s.breaker_open, s.tripped_at
    if not was_open:
        # a closed breaker is left alone (docs/design.md §5; the CLI sends nothing then):
        # no fresh window, which a rebuilt guard could not know of (the ledger records
        # the resets of an open breaker only)
        return s, [SetDetails(text=f"breaker reset by {sig.by} at {now.isoformat()} left "
                                   "alone: the breaker is closed")]
    counted = ([] if "reset_recounts" in defects
               else [c.model_copy(update={"in_window": False}) for c in s.counted])
    queue = [q.model_copy(update={"evidence_after": now})
             if "reset_marks_breaker_queued_only" not in defects
             or q.reason.startswith("circuit breaker open")  # (re-)sent while open
             else q for q in s.queue]
    s = s.model_copy(update={"breaker_open": False, "reset_at": now, "reset_by": sig.by,
                             "counted": counted, "queue": queue, "open_reset_at": now})
    since = (tripped_at or now).isoformat()
    return s, [SetDetails(text=f"breaker reset by {sig.by} at {now.isoformat()}: {sig.reason}"),
               WriteAlert(alert=Alert(
                   alert_id=f"breaker/{s.cluster}/{since}/reset", cluster=s.cluster, node="*",
                   kind=BREAKER_KIND, severity=Severity.info,
                   summary=f"Circuit breaker reset on cluster {s.cluster} by {sig.by}",
                   description=sig.reason, evidence={"by": sig.by, "reason": sig.reason},
                   level=True, active=False, source="guard", observed_at=now))]


def _rebuild(s: GuardState, v: LedgerView, now: datetime, defects: frozenset[str] = frozenset()
             ) -> tuple[GuardState, Cmds]:
    """Take the ledger's holders, automatic starts, breaker and last reset as ours; tell
    each rebuilt holder (one that is gone is dropped). An automatic holder the ledger does
    not list among the starts (granted, its cordon not recorded yet) is counted as one,
    from when it was recorded. An automatic start at or before the last reset is kept out
    of the window (a reset starts a fresh one, I23)."""
    leases = list(s.leases)
    cmds: Cmds = []
    for hr in v.holders:
        if any(x.repair_id == hr.repair_id for x in leases):
            continue
        lease = Lease(repair_id=hr.repair_id, workflow_id=hr.workflow_id, node=hr.node,
                      node_pool=s.policy.pools.get(hr.node) or hr.node_pool,
                      automatic=hr.automatic,
                      requester_kind=hr.requester_kind, granted_at=now,
                      expires_at=now + _ttl(s), source="ledger")
        leases.append(lease)
        cmds.append(SendLease(workflow_id=lease.workflow_id, purpose="rebuilt", reply=LeaseReply(
            repair_id=lease.repair_id, granted=True,
            reason="lease re-registered from the ledger after a guard restart",
            expires_at=lease.expires_at)))
    counted = list(s.counted)
    # a reset started a fresh window: a start at or before it is not counted again (I23)
    reset = max((t for t in (s.open_reset_at, v.reset_at) if t is not None), default=None)
    starts = list(v.automatic)
    if "rebuild_counts_cordons_only" not in defects:
        # the ledger lists an automatic start once it recorded its cordon; a holder
        # granted before the restart that has not cordoned yet was counted by the guard
        # that granted it and will cordon: counted too, from when it was recorded (its
        # first request came after), else from now
        listed = {rid for rid, _ in starts}
        starts += [(hr.repair_id, hr.requested_at or now) for hr in v.holders
                   if hr.automatic and hr.repair_id not in listed]
    for rid, at in starts:
        if all(c.repair_id != rid for c in counted):
            counted.append(Counted(repair_id=rid, at=at,
                                   in_window=reset is None or at > reset
                                   or "rebuild_recounts_before_reset" in defects))
    upd: dict[str, object] = {"leases": leases, "counted": counted, "rebuilt_at": now,
                              "status": Status.serving, "reading": None}
    have = {h.domain for h in s.holds}
    rebuilt = [h for h in v.holds if h.domain not in have]
    if rebuilt:
        upd["holds"] = [*s.holds, *rebuilt]
        cmds.insert(0, SetDetails(text="failure domains HELD (from the ledger): "
                                       + ", ".join(h.domain for h in rebuilt)))
    if v.reset_at is not None and (s.open_reset_at is None or v.reset_at > s.open_reset_at):
        upd["open_reset_at"] = v.reset_at
    if v.reset_at is not None and (s.reset_at is None or v.reset_at > s.reset_at):
        # the status says when and by whom the breaker was last reset, after a restart too
        upd["reset_at"], upd["reset_by"] = v.reset_at, v.reset_by
    if v.releases:
        # the last release of each domain: a request first asked for at or before it
        # waited through it (:func:`release_before`); the operators' list shows them
        upd["released_at"] = _released(s.released_at, {r.domain: r.at for r in v.releases})
        known = {(r.domain, r.at) for r in s.domain_releases}
        upd["domain_releases"] = sorted(
            [*s.domain_releases, *(r for r in v.releases if (r.domain, r.at) not in known)],
            key=lambda r: r.at)[-MAX_RELEASES:]
    if v.breaker_open and not s.breaker_open:
        reason = v.tripped_reason or "breaker open in the ledger"
        upd |= {"breaker_open": True, "tripped_at": v.tripped_at, "tripped_reason": reason}
        cmds.insert(0, SetDetails(text=f"circuit breaker OPEN: {reason}"))
    return s.model_copy(update=upd), cmds


def _serve(s: GuardState, ev: Request | Release | ResetBreaker | ReleaseDomain | FaultSeen,
           now: datetime, defects: frozenset[str]) -> tuple[GuardState, Cmds]:
    """One message while serving (the policy is fresh)."""
    if isinstance(ev, FaultSeen):
        return _count_fault(s, ev.report, now, defects)
    if isinstance(ev, Request):
        s, replies, effects = _on_request(s, ev.req, now, defects)
        return s, [*replies, *effects]
    if isinstance(ev, Release):
        return _drop(s, ev.rel.repair_id), []
    if isinstance(ev, ReleaseDomain):
        # a deferred release is the operator's of when it came (not before the hold
        # opened: the drain may open it)
        hold = next((h for h in s.holds if h.domain == ev.sig.domain), None)
        at = now if ev.at is None or hold is None or "reset_at_drain" in defects else min(
            now, max(ev.at, hold.opened_at))
        return _on_release_domain(s, ev.sig, at, defects)
    # a reset deferred while a read was out is the operator's reset of when it came: the
    # requests first asked after it did not wait through it (not before the breaker's
    # trip, though: the drain may trip it, and the ledger's newest breaker row decides
    # whether a rebuilt guard finds it open)
    at = now if ev.at is None or "reset_at_drain" in defects else min(
        now, max(ev.at, s.tripped_at or ev.at))
    return _on_reset(s, ev.sig, at, defects)


def _settle(s: GuardState, cmds: Cmds, now: datetime, defects: frozenset[str],
            base: GuardState | None = None) -> tuple[GuardState, Cmds]:
    """After every event while serving: expire, grant what the rules allow, re-arm the
    expiry timer. Replies go out before effects (ledger writes, notifications)."""
    if s.status != Status.serving:
        return s, cmds
    s = _prune_domains(_prune_counted(s, now, ""), now)
    s, exp = _expire(s, now)
    s, grants = _grant_queued(s, now, defects, base)
    s, timers = _timers(s)
    replies = [c for c in cmds if isinstance(c, SendLease)]
    rest = [c for c in cmds if not isinstance(c, SendLease)]
    return s, [*exp, *replies, *grants, *rest, *timers]


def _drain(s: GuardState, now: datetime, defects: frozenset[str]) -> tuple[GuardState, Cmds]:
    """Serve the deferred messages in order (the policy was just read, or the ledger),
    each with the grants stepping it alone would make right after it, as a batch does
    (:func:`_batch`): a request granted before a later deferred one trips the breaker or
    holds its domain stays granted, and every deferred request is answered (granted or
    told it waits). A "queued" answer a later grant of the drain supersedes is not sent.
    Granting only once after all of them (``drain_grants_at_end``) held requests that
    came before the trip behind the breaker and left the ones the last grant round
    refused without an answer."""
    cmds: Cmds = []
    deferred, s = s.deferred, s.model_copy(update={"deferred": []})
    for ev in deferred:
        s, c = _serve(s, ev, now, defects)
        cmds += c
        if "drain_grants_at_end" in defects:
            continue
        if isinstance(ev, Request):
            s, c = _grant_one(s, ev.req.repair_id, now, defects, None)
        else:
            s, c = _grant_queued(s, now, defects)
        cmds += c
    return s, _superseded_dropped(cmds)


def _defer(deferred: list[Deferred], ev: Deferred) -> list[Deferred]:
    """``deferred`` with ``ev`` kept for when the guard serves, in arrival order. A
    request re-sent while the same repair's last deferred message is its earlier request
    (the same kind: a request or a renewal) replaces it in place: the first place in the
    order is kept, the newest content taken, so a long outage keeps one per repair
    instead of one per re-send (each waiting repair re-sends every ``LEASE_RESEND_S``)."""
    if isinstance(ev, Request):
        rid = ev.req.repair_id
        for i in range(len(deferred) - 1, -1, -1):
            d = deferred[i]
            if isinstance(d, Request) and d.req.repair_id == rid:
                if d.req.renew == ev.req.renew:
                    return [*deferred[:i], ev, *deferred[i + 1:]]
                break
            if isinstance(d, Release) and d.rel.repair_id == rid:
                break
    return [*deferred, ev]


#: What a request waiting for a guard's first policy read is told (``queued``).
POLICY_WAIT_REASON = ("guard waiting for its policy: load_policy failed and no policy was "
                      f"read yet; retrying every {POLICY_RETRY_S:g} s, nothing is granted "
                      "meanwhile")


def _policy_wait(req: LeaseRequest) -> SendLease:
    """The ``queued`` answer to ``req`` while the guard waits for its first policy."""
    return SendLease(workflow_id=req.workflow_id, reply=LeaseReply(
        repair_id=req.repair_id, granted=False, queued=True, reason=POLICY_WAIT_REASON))


def _policy_retry(s: GuardState, now: datetime, message: str, cmds: Cmds
                  ) -> tuple[GuardState, Cmds]:
    """A starting guard's policy read failed and no policy was ever read (I21): stay
    starting with the messages deferred, arm :data:`POLICY_TIMER` (read again in
    :data:`POLICY_RETRY_S`), and tell each new request deferred so far that it waits
    (a renewal is decided once the policy is read: the holder keeps acting meanwhile)."""
    at = now + timedelta(seconds=POLICY_RETRY_S)
    s = s.model_copy(update={"reading": None, "timers": {**s.timers, POLICY_TIMER: at}})
    told: dict[str, SendLease] = {}
    for d in s.deferred:
        if isinstance(d, Request) and not d.req.renew:
            told[d.req.repair_id] = _policy_wait(d.req)
    return s, [*cmds, SetDetails(text=f"starting: load_policy failed ({message}); no "
                                      "policy read yet, nothing granted; retrying in "
                                      f"{POLICY_RETRY_S:g} s"),
               StartTimer(name=POLICY_TIMER, at=at), *told.values()]


def _stale(s: GuardState, now: datetime) -> bool:
    at = s.policy.loaded_at
    return at is None or (now - at).total_seconds() >= POLICY_REFRESH_S


def step(state: GuardState, event: Event, now: datetime,
         defects: frozenset[str] = frozenset()) -> tuple[GuardState, Cmds]:
    """Decide ``event`` in ``state`` at ``now`` (the control plane's clock): the next
    state and the commands to execute, in order. Pure: same input, same output."""
    if isinstance(event, Batch):
        return _batch(state, event, now, defects)
    s, cmds = _step(state, event, now, defects)
    return _settle(s, cmds, now, defects)


def _batch(state: GuardState, batch: Batch, now: datetime, defects: frozenset[str]
           ) -> tuple[GuardState, Cmds]:
    """Each message of ``batch`` in order, with the grants stepping it alone would make
    right after it (a request: its own entry, :func:`_grant_one`; anything else, which may
    free a slot or close the breaker: the whole queue); one expiry, timer and ordering
    round at the end (:func:`_settle`): the same decisions as one step per message, for
    one pass over the queue per request instead of one per message."""
    base = state if "batch_decides_in_parallel" in defects else None
    s, cmds = state, []
    for ev in batch.events:
        s, more = _step(s, ev, now, defects)
        cmds += more
        if s.status != Status.serving:
            continue
        if isinstance(ev, Request):
            s, more = _grant_one(s, ev.req.repair_id, now, defects, base)
        else:
            s, more = _grant_queued(s, now, defects, base)
        cmds += more
    s, cmds = _settle(s, cmds, now, defects, base)
    return s, _superseded_dropped(_queued_told(s, batch, cmds))



def _queued_told(s: GuardState, batch: Batch, cmds: Cmds) -> Cmds:
    """Tell each request of ``batch`` that the batch left queued without an answer (it
    found room when it came, and the grants of the batch took it) that it waits, with the
    reason its queue entry has; after the other replies, before any effect."""
    answered = {c.reply.repair_id for c in cmds if isinstance(c, SendLease)}
    queued = {q.req.repair_id: q for q in s.queue}
    late: Cmds = []
    for ev in batch.events:
        if isinstance(ev, Request) and ev.req.repair_id in queued \
                and ev.req.repair_id not in answered:
            q = queued[ev.req.repair_id]
            answered.add(q.req.repair_id)
            late.append(SendLease(workflow_id=q.req.workflow_id, reply=LeaseReply(
                repair_id=q.req.repair_id, granted=False, queued=True, reason=q.reason)))
    last = max((i for i, c in enumerate(cmds) if isinstance(c, SendLease)), default=-1)
    return [*cmds[:last + 1], *late, *cmds[last + 1:]]


def _superseded_dropped(cmds: Cmds) -> Cmds:
    """``cmds`` without a "queued" answer (``purpose`` reply, not granted) that a later
    reply to the same repair in ``cmds`` supersedes: the requester acts on the last one."""
    last: dict[str, int] = {}
    for i, c in enumerate(cmds):
        if isinstance(c, SendLease):
            last[c.reply.repair_id] = i
    return [c for i, c in enumerate(cmds)
            if not (isinstance(c, SendLease) and c.purpose == "reply" and not c.reply.granted
                    and last[c.reply.repair_id] != i)]


def _step(s: GuardState, ev: Event, now: datetime, defects: frozenset[str]
          ) -> tuple[GuardState, Cmds]:
    if isinstance(ev, Batch):  # nested: decided in order, as at the top (no settle)
        out: Cmds = []
        for inner in ev.events:
            s, more = _step(s, inner, now, defects)
            out += more
        return s, out
    if isinstance(ev, Clock):
        return s, []
    if isinstance(ev, Started):
        # a run that continued as new while it waited to retry its first policy or
        # ledger read (a long outage) carries a state that never served: it still
        # rebuilds from the ledger once the policy is read (I21)
        fresh = ev.fresh or (s.fresh and s.status != Status.serving
                             and "can_skips_rebuild" not in defects)
        s = s.model_copy(update={"status": Status.starting, "reading": "policy",
                                 "fresh": fresh})
        return s, [SetDetails(text=f"cluster guard for {s.cluster}"), LoadPolicy()]
    if isinstance(ev, ClusterAlert):
        return s, _record(ev.alert)
    if isinstance(ev, EffectFailed):
        what = {"write_alert": f"ledger write of {ev.subject}",
                "notify": f"notification {ev.subject!r}",
                "send_lease": f"lease reply to {ev.subject}"}[ev.what]
        return _note(s, now, f"{what} failed: {ev.message}")
    if isinstance(ev, ReplyUndeliverable):
        gone = next((x for x in s.leases if x.repair_id == ev.repair_id), None)
        s = _drop(s, ev.repair_id)
        if ev.purpose == "extend" and gone is not None:
            s = s.model_copy(update={"expired": [*s.expired, gone][-MAX_EXPIRED:]})
            return s, [Warn(text=f"lease expired, holder gone cluster={s.cluster} "
                                 f"repair_id={gone.repair_id} node={gone.node}")]
        return s, []
    if isinstance(ev, PolicyRead | PolicyFailed):
        if s.reading != "policy":
            return s, []  # no read of ours is out
        cmds: Cmds = []
        if isinstance(ev, PolicyRead):
            # a held lease's pool is its node's pool in the configuration read now (a node
            # moved to another pool takes its lease there): the pool rule judges the
            # pools as configured, never the ones of an earlier read
            leases = [x if (p := ev.view.pools.get(x.node)) in (None, x.node_pool)
                      else x.model_copy(update={"node_pool": p}) for x in s.leases]
            s = s.model_copy(update={"leases": leases, "policy": ev.view.model_copy(
                update={"loaded": True, "loaded_at": now})})
        else:
            s, cmds = _note(s, now, f"load_policy failed: {ev.message}")
            if (s.status == Status.starting and not s.policy.loaded
                    and "grant_before_policy" not in defects):
                # never read: the defaults know no pool and no domain's nodes; decide
                # nothing on them (I21), read again later
                return _policy_retry(s, now, ev.message, cmds)
            # keep serving on the last policy read
            s = s.model_copy(update={"policy": s.policy.model_copy(update={"loaded_at": now})})
        s = s.model_copy(update={"reading": None})
        if s.status == Status.starting:
            if s.fresh:
                window = timedelta(seconds=s.policy.breaker_window_s)
                s = s.model_copy(update={"status": Status.rebuilding, "reading": "ledger"})
                return s, [*cmds, ReadLedger(since=now - window)]
            s = s.model_copy(update={"status": Status.serving})
        s, more = _drain(s, now, defects)
        return s, [*cmds, *more]
    if isinstance(ev, LedgerRead | LedgerUnavailable):
        if s.reading != "ledger" or s.status != Status.rebuilding:
            return s, []
        if isinstance(ev, LedgerRead):
            s, cmds = _rebuild(s, ev.view, now, defects)
            s, more = _drain(s, now, defects)
            return s, [*cmds, *more]
        s, cmds = _note(s, now, f"reading the ledger's guard state failed: {ev.message}")
        if "rebuild_gives_up" in defects:
            s = s.model_copy(update={"status": Status.serving, "reading": None})
            s, more = _drain(s, now, defects)
            return s, [*cmds, *more]
        at = now + timedelta(seconds=LEDGER_RETRY_S)
        s = s.model_copy(update={"reading": None, "timers": {**s.timers, LEDGER_TIMER: at}})
        return s, [*cmds, SetDetails(text="rebuilding from the ledger: the ledger does not "
                                          f"answer ({ev.message}); retrying"),
                   StartTimer(name=LEDGER_TIMER, at=at)]
    if isinstance(ev, TimerFired):
        due = s.timers.get(ev.name)
        if due is None or now < due:
            return s, []  # not armed, or re-armed later
        timers = {k: v for k, v in s.timers.items() if k != ev.name}
        s = s.model_copy(update={"timers": timers})
        if ev.name == LEDGER_TIMER and s.status == Status.rebuilding and s.reading is None:
            window = timedelta(seconds=s.policy.breaker_window_s)
            return s.model_copy(update={"reading": "ledger"}), [ReadLedger(
                since=now - window)]
        if ev.name == POLICY_TIMER and s.status == Status.starting and s.reading is None:
            return s.model_copy(update={"reading": "policy"}), [LoadPolicy()]
        return s, []  # the expiry timer: _settle expires what is due
    if isinstance(ev, HistoryLong):
        if s.status == Status.serving and s.reading is None and not s.deferred:
            return s, [ContinueAsNew()]
        if s.status != Status.serving and s.reading is None:
            # waiting to retry a read whose source does not answer (a policy or ledger
            # outage): every waiting repair re-sends each LEASE_RESEND_S and the history
            # grows without end; the new run carries the state (the deferred messages,
            # one per repair and kind) and reads again at once
            return s, [ContinueAsNew()]
        return s, []  # asked again on a later round
    # a message: request, release, reset
    if s.status != Status.serving or s.reading is not None:
        if isinstance(ev, ResetBreaker | ReleaseDomain) and ev.at is None:
            ev = ev.model_copy(update={"at": now})
        s = s.model_copy(update={"deferred": _defer(s.deferred, ev)})
        # a renewal is decided once the guard serves, as while it waits for its policy:
        # its holder keeps acting meanwhile (the ledger lists it, the rebuild tells it).
        # Told "queued", the holder took its lease for lapsed: it stopped renewing and
        # waited for a grant before its next disruptive step, a ledger outage long
        if (isinstance(ev, Request) and s.status == Status.rebuilding
                and (not ev.req.renew or "rebuild_refuses_renewals" in defects)):
            return s, [SendLease(workflow_id=ev.req.workflow_id, reply=LeaseReply(
                repair_id=ev.req.repair_id, granted=False, queued=True,
                reason="guard rebuilding its state from the ledger"))]
        if isinstance(ev, Request) and POLICY_TIMER in s.timers and not ev.req.renew:
            return s, [_policy_wait(ev.req)]
        return s, []
    if isinstance(ev, Request) and _stale(s, now):
        s = s.model_copy(update={"deferred": [ev], "reading": "policy"})
        return s, [LoadPolicy()]
    return _serve(s, ev, now, defects)


#: The transition table: (status, event kind) → what :func:`step` decides, in words.
TRANSITIONS: dict[tuple[Status, str], str] = {}


def _table() -> None:
    msg_wait = ("deferred until the read out returns (decided in order then, each with "
                "the grants it would make alone, as in a batch)")
    for st in Status:
        for kind in EVENT_KINDS:
            if kind == "clock":
                what = "nothing: time alone decides nothing (expiry runs on its timer)"
            elif kind == "batch":
                what = ("each message decided in order as that message alone would be, "
                        "then (serving) the queue granted once; a queued answer a later "
                        "reply of the batch supersedes is not sent")
            elif kind == "started":
                what = ("→ starting: read the policy (a fresh start, or a run that "
                        "continued as new before it ever served, then rebuilds)")
            elif kind == "cluster_alert":
                what = "record in the ledger; notify while active"
            elif kind == "effect_failed":
                what = ("noted in errors (best effort: a ledger write, a notification, "
                        "or a lease reply that failed for another reason than its "
                        "requester being gone, which re-sends); nothing else changes")
            elif kind == "reply_undeliverable":
                what = "the holder/requester is gone: its lease and queue entry dropped " \
                       "(an expiry probe's lease goes to expired)"
            elif kind in ("policy_ok", "policy_failed"):
                what = {
                    Status.starting: "fresh → rebuilding (read the ledger); after "
                                     "continue-as-new → serving; failure with a policy "
                                     "read before → go on with it; failure with none read "
                                     "yet → stay starting, retry timer "
                                     f"({POLICY_RETRY_S:g} s), the new requests deferred "
                                     "so far told queued, nothing granted (I21)",
                    Status.rebuilding: "ignored: no policy read is out",
                    Status.serving: "policy refreshed, each held lease in its node's "
                                    "pool as now configured (failure: kept, noted); deferred "
                                    "messages decided in order, each with the grants it "
                                    "would make alone (as in a batch)",
                }[st]
            elif kind in ("ledger_ok", "ledger_unavailable"):
                what = {
                    Status.rebuilding: "ok → serving: holders (every stage that holds a node) "
                                       "re-registered and told, automatic starts counted, "
                                       "breaker, last reset, domain holds and each "
                                       "domain's last release taken; unavailable → retry "
                                       "timer "
                                       f"({LEDGER_RETRY_S:g} s), nothing granted (I21)",
                }.get(st, "ignored: no ledger read is out")
            elif kind == "timer":
                what = {
                    Status.starting: "policy retry due → read the policy again",
                    Status.rebuilding: "ledger retry due → read the ledger again",
                    Status.serving: "lease expiry: each expired lease extended and its "
                                    "holder asked; a gone holder frees its slot",
                }.get(st, "ignored: no timer of this status runs")
            elif kind == "history_long":
                what = ("continue as new carrying the state (when nothing is read or "
                        "deferred)") if st == Status.serving else (
                    "while waiting to retry a read (a policy or ledger outage): continue "
                    "as new carrying the state, the deferred messages included (one "
                    "request per repair and kind); while a read is out: asked again later")
            elif st != Status.serving:
                resend = ("; a re-sent request replaces the same repair's deferred one "
                          "in place" if kind == "request" else
                          "; decided as of when it came (not before the breaker's trip)"
                          if kind == "reset_breaker" else
                          "; decided as of when it came (not before the hold opened)"
                          if kind == "release_domain" else "")
                what = msg_wait + resend + ("; a new request is told it is queued "
                                   "(rebuilding; a renewal is not: its holder keeps acting)"
                                   if st == Status.rebuilding and kind == "request" else
                                   "; a new request is told it is queued while the policy "
                                   "retry timer runs"
                                   if st == Status.starting and kind == "request" else "")
            elif kind == "request":
                what = ("held → renewed (the answer carries the grant's breaker reset "
                        "again, I23); automatic new → counted once (a repair counted "
                        "before a reset is never counted again), trips the breaker past "
                        "the threshold, queued while open; counted once for each failure "
                        "domain of its node, the domain held at the threshold (one "
                        "failure_domain alert), queued while held (a person's request is "
                        "not); an automatic one first asked for at or before the last "
                        "release of its domain's hold acts only on evidence after it; else "
                        "granted if node, pool, budget and detector cap allow, queued with "
                        "why; a stale policy is re-read first")
            elif kind == "release":
                what = "lease / queue entry dropped; the queue granted in order"
            elif kind == "fault_seen":
                what = ("counted once per (domain, node) in the window for each failure "
                        "domain of the node not held; the domain held at the threshold "
                        "(one failure_domain alert), before any of its repairs asks")
            elif kind == "release_domain":
                what = ("the domain's hold lifted and its counts dropped (not held: a "
                        "warning); the release kept (its time), so the repairs the hold "
                        "kept waiting, and later requests of the domain first asked for "
                        "before it, act only on evidence after it; the waiting repairs "
                        "granted as the rails allow; the clear recorded (a rebuilt guard "
                        "reads it back)")
            else:
                what = ("open: closed, a fresh window (what was counted before it is not "
                        "counted again), every queued request, whatever queued it, and "
                        "every later one first asked for before the reset act only on "
                        "evidence after it (I23); the clear recorded. Closed: left alone")
            TRANSITIONS[(st, kind)] = what


_table()
