"""The activity contract between the workflows and ``activities/``.

Workflows call activities by these names with these pydantic inputs and result types
(``workflow.execute_activity(ACT.cordon_node, CordonInput(...), result_type=CordonResult)``);
``activities/`` registers implementations under the same names
(``@activity.defn(name=ACT.cordon_node)``). Tests register same-named test activities
where a real peer is not part of the test.

Every activity is idempotent: it checks the current state and acts only if needed, and
records the repair id on the target where the target allows it. Permanent failures
raise non-retryable ``ApplicationError`` with one of the ``ERR_*`` types below;
transient ones raise anything else and are retried.

No credentials ever appear in these models (docs/design.md §4.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.exceptions import ApplicationError

from workflows.config import PolicyConfig, PolicyMode
from workflows.leases import DomainHold, DomainRelease, LeaseReply
from workflows.models import Action, Alert, Requester, Stage, ValidationResult, Verdict
from workflows.models import AttemptRecord as AttemptRecord  # defined there: pure (issue 26)
from workflows.protocol import BMC_TASK_QUEUE


class ACT:
    """Activity names (one namespace so typos fail at import time)."""

    # configuration
    load_policy = "load_policy"
    load_node_policy = "load_node_policy"
    # ledger (PostgreSQL)
    ledger_record_alert = "ledger_record_alert"
    ledger_upsert_repair = "ledger_upsert_repair"
    ledger_record_transition = "ledger_record_transition"
    ledger_record_attempt = "ledger_record_attempt"
    ledger_attempt_history = "ledger_attempt_history"
    ledger_claim_request = "ledger_claim_request"
    ledger_record_verdict = "ledger_record_verdict"
    ledger_open_ticket = "ledger_open_ticket"
    ledger_guard_state = "ledger_guard_state"
    ledger_open_repair = "ledger_open_repair"
    ledger_machine_held = "ledger_machine_held"
    ledger_maintenance_covering = "ledger_maintenance_covering"
    ledger_record_evidence = "ledger_record_evidence"
    # scheduler side (Slurm or Kubernetes, chosen by the cluster config)
    cordon_node = "cordon_node"
    check_idle = "check_idle"
    drain_node = "drain_node"
    rejoin_node = "rejoin_node"
    node_health = "node_health"
    # machine side (BMC task queue, rate limited)
    reset_gpu = "reset_gpu"
    reboot_machine = "reboot_machine"
    power_cycle_machine = "power_cycle_machine"
    reprovision_machine = "reprovision_machine"
    migrate_node = "migrate_node"
    remove_machine = "remove_machine"
    # evidence before a disruptive action (workflows.evidence): node job + BMC SEL
    capture_evidence = "capture_evidence"
    # validation
    place_validation = "place_validation"
    collect_validation = "collect_validation"
    release_validation = "release_validation"
    return_machine = "return_machine"
    post_ticket = "post_ticket"
    # notifications
    notify = "notify"
    # cluster guard (issue 30 item 1)
    guard_send_leases = "guard_send_leases"


# Non-retryable ApplicationError types (docs/design.md §6: permanent failures are non-retryable
# ApplicationErrors; workflows list them in their RetryPolicy.non_retryable_error_types).
#: Credentials refused (BMC, Kubernetes API, provisioning webhook).
ERR_AUTH = "AuthFailure"
#: The cluster, node or machine is not known where the activity looked it up.
ERR_UNKNOWN_NODE = "UnknownNode"
#: The action cannot be done on this target or with this configuration.
ERR_UNSUPPORTED = "UnsupportedAction"
#: The peer refused or failed the action itself (4xx answer, failed operation).
ERR_ACTION_FAILED = "ActionFailed"
#: Work still running on the node after the drain deadline.
ERR_DRAIN_DEADLINE = "DrainDeadline"
#: No way to place a validation job on the machine.
ERR_PLACEMENT = "PlacementImpossible"
#: The worker's configuration lacks what the activity needs (a binary, the ledger).
ERR_CONFIGURATION = "ConfigurationError"


def permanent(err_type: str, message: str, *details: Any) -> ApplicationError:
    """A non-retryable ``ApplicationError`` of type ``err_type`` (one of the ``ERR_*``).

    Activities raise it for a failure a retry cannot fix: ``raise permanent(ERR_AUTH,
    f"BMC {host} rejected user {user!r}")``. ``details`` travel with the failure (e.g. a
    ``DrainResult`` dump) and must be JSON-serialisable.
    """
    return ApplicationError(message, *details, type=err_type, non_retryable=True)


class NodeRef(BaseModel):
    """A node of a cluster, optionally with the repair acting on it."""

    cluster: str
    node: str
    repair_id: str | None = None


class PolicySnapshot(BaseModel):
    """Result of ``load_policy``: the policy bundle and the cluster facts rails need."""

    cluster: str
    policy: PolicyConfig
    gpu_nodes: int
    scheduler: str
    pools: dict[str, str] = Field(default_factory=dict)
    machines: dict[str, str] = Field(default_factory=dict)
    #: node → its failure domains (issue 29 item 2): ``nodes[].failure_domain`` and the
    #: scheduler's labels (``policy.domains.label_keys``) or features
    #: (``policy.domains.slurm_feature_prefix``), sorted.
    domains: dict[str, list[str]] = Field(default_factory=dict)
    #: Task queue of the machine-side (BMC) activities (``temporal.bmc_task_queue``).
    bmc_task_queue: str = BMC_TASK_QUEUE
    #: ``enforce`` / ``shadow`` of the pools that set their own ``clusters[].pools[].mode``
    #: (pool name → mode); other pools take ``policy.mode`` (the cluster's already folded
    #: in). Issue 29 item 3.
    pool_modes: dict[str, PolicyMode] = Field(default_factory=dict)

    def mode_of(self, pool: str | None) -> PolicyMode:
        """The mode of a repair in ``pool``: the pool's own, else ``policy.mode``."""
        if pool is not None and pool in self.pool_modes:
            return self.pool_modes[pool]
        return self.policy.mode


class NodePolicy(PolicySnapshot):
    """Result of ``load_node_policy(NodeRef)``: the policy slice one node's entity and
    repairs read (issue 30 item 2) — ``load_policy``'s snapshot for ``node`` alone.

    ``policy`` (with the cluster's ``reset_gpu.policy`` and ``mode`` folded in),
    ``gpu_nodes``, ``scheduler``, ``bmc_task_queue`` and ``pool_modes`` (one entry per
    pool that sets its own mode: bounded by the pools, not the nodes) are the snapshot's;
    ``pools``, ``machines`` and ``domains`` hold at most ``node``'s own entry. So its size
    does not grow with the cluster's node count (``load_policy`` at 10,000 nodes is about
    470 KB; this stays a few KB), and the snapshot's accessors (``machines.get(node)``,
    :meth:`~PolicySnapshot.mode_of`) read the same as before."""

    node: str

    @classmethod
    def of(cls, snap: PolicySnapshot, node: str) -> NodePolicy:
        """``snap`` (a whole cluster's ``load_policy`` answer) cut down to ``node``."""
        def one(d: dict[str, Any]) -> dict[str, Any]:
            return {node: d[node]} if node in d else {}

        return cls(**{**dict(snap), "node": node, "pools": one(snap.pools),
                      "machines": one(snap.machines), "domains": one(snap.domains)})

    @property
    def machine(self) -> str | None:
        """The machine ``node`` runs on (a migrate's binding, else the configured
        ``nodes[].machine``, else its name when configured); None: not configured."""
        return self.machines.get(self.node)

    @property
    def pool(self) -> str | None:
        """``node``'s configured pool (``nodes[].pool``), or None."""
        return self.pools.get(self.node)

    @property
    def node_domains(self) -> list[str]:
        """``node``'s failure domains, sorted (``[]``: none)."""
        return list(self.domains.get(self.node, []))


class CordonInput(BaseModel):
    cluster: str
    node: str
    repair_id: str
    reason: str


class CordonResult(BaseModel):
    """``cordoned_by_us`` is true when this repair holds the cordon (set now or earlier by it).

    ``by_other`` is true when the node was already cordoned/drained by someone else;
    rejoin then never uncordons it (someone else's cordon is theirs to lift).
    ``held_by_repair`` names the other repair when that someone is one of ours (the
    Kubernetes repair annotation, the Slurm ``autorepair:<id>`` drain reason): the
    repair asking then ends, as one repair acts on a node at a time (docs/design.md §5 rails).
    """

    cordoned_by_us: bool
    by_other: bool = False
    held_by_repair: str | None = None
    detail: str = ""


class IdleStatus(BaseModel):
    """``idle``: no GPU pod (Kubernetes) / no allocation (Slurm) on the node. ``detail``:
    what the check did beyond looking (Kubernetes non-graceful node shutdown of a host
    the BMC reports powered off), empty otherwise."""

    idle: bool
    running: list[str] = Field(default_factory=list)
    detail: str = ""


class DrainInput(BaseModel):
    """``deadline_at``: the drain's absolute deadline (the control plane's clock, set once
    when the repair began draining: :func:`workflows.lifecycle.decision.drain_deadline`);
    the activity gives the scheduler only the time left until it (:meth:`remaining_s`),
    so a retry never restarts the deadline. ``deadline_s``: the time left when the
    workflow scheduled the call, seconds (what a caller without ``deadline_at`` bounds
    the drain with)."""

    cluster: str
    node: str
    repair_id: str
    deadline_s: float = 1800.0
    deadline_at: datetime | None = None

    def remaining_s(self, now: datetime) -> float:
        """Seconds left until the deadline at ``now`` (0 once it passed; ``deadline_s``
        without ``deadline_at``)."""
        if self.deadline_at is None:
            return self.deadline_s
        return max(0.0, (self.deadline_at - now).total_seconds())


class DrainResult(BaseModel):
    drained: bool
    remaining: list[str] = Field(default_factory=list)
    detail: str = ""


class RejoinInput(BaseModel):
    cluster: str
    node: str
    repair_id: str


class RejoinResult(BaseModel):
    """``uncordoned`` only when the cordon was ours; ``kept_reason`` explains otherwise."""

    uncordoned: bool
    kept_reason: str = ""


#: Seconds a boot time must advance to count as a new boot when no exact boot id is
#: known (Slurm's ``BootTime``): slurmctld recomputes it as "now − uptime" at every
#: registration of slurmd (``node_mgr.c``, one-second resolution), so a slurmd restart
#: on the same boot can move it by a second or two; a real reboot moves it by the old
#: boot's whole uptime.
BOOT_TIME_JITTER_S = 60.0


class NodeHealth(BaseModel):
    """Scheduler view of a node: readiness and boot identity.

    ``boot_id``: an exact identity of the running boot where the scheduler has one
    (Kubernetes ``status.nodeInfo.bootID``; Slurm only with
    ``slurm_boot_identity: slurmd_start``); ``boot_time``: when the host booted (UTC),
    compared with :data:`BOOT_TIME_JITTER_S` of slack."""

    ready: bool
    state: list[str] = Field(default_factory=list)
    boot_id: str | None = None
    boot_time: datetime | None = None
    reason: str = ""

    def rebooted_since(self, boot_id: str | None, boot_time: datetime | None) -> bool | None:
        """Whether this view shows a boot other than the one ``boot_id`` / ``boot_time``
        (read earlier) identified: both boot ids known → they differ; else both boot
        times known → this one is more than :data:`BOOT_TIME_JITTER_S` later; else
        ``None`` (unknown)."""
        if boot_id is not None and self.boot_id is not None:
            return self.boot_id != boot_id
        if boot_time is not None and self.boot_time is not None:
            return (self.boot_time - boot_time).total_seconds() > BOOT_TIME_JITTER_S
        return None


class MachineActionInput(BaseModel):
    """Input of the machine-side actions.

    ``boot_id_before`` / ``boot_time_before`` are read before acting and recorded in the
    workflow history, so a retried power cycle sees the host already came back and does
    not cycle it again (docs/design.md §5: power cycle guarded by a boot-ID check).

    ``gpu``: the GPU of the first alert; ``gpus``: every GPU the active evidence names
    (:func:`workflows.policy.reset_targets`: PCI ``0000:bb:dd`` or index), the targets of
    ``reset_gpu`` (``gpu`` alone when empty).
    """

    cluster: str
    node: str
    machine: str
    repair_id: str
    gpu: str | None = None
    gpus: list[str] = Field(default_factory=list)
    boot_id_before: str | None = None
    boot_time_before: datetime | None = None
    #: Phase the attempt already reached (``workflows.lifecycle.machine_action.PHASES``):
    #: the activity resumes from it, never sending a disruptive command again that an
    #: earlier try sent (I16). ``not_started``: a fresh attempt.
    resume_phase: str = "not_started"
    #: When (UTC, as the activity that sent it recorded it: :data:`SENT_AT_DETAIL`) the
    #: attempt's restart request went out — ``reboot_machine``'s ``GracefulRestart``,
    #: reported with phase ``restart_sent``; ``None`` before that and for other actions.
    #: Carried by the workflow (``MachineActionState.sent_at``) with ``resume_phase``, so a
    #: retry resumed at ``restart_sent`` waits only what is left of ``RESTART_SEEN_S``
    #: (seconds, :mod:`activities.power`) from the send, never a fresh window (I16).
    sent_at: datetime | None = None
    #: Idempotency key of the attempt (``repair id / action / attempt``), for logs and BMC
    #: audit trails.
    idempotency_key: str = ""
    #: this run only brings the machine to a safe power state after a cancel (the
    #: machine action's ``make_safe``): a power cycle finishes its On, and never sends
    #: ForceOff
    make_safe: bool = False


#: Key of the phase reached in a phased machine activity's heartbeat details and in the
#: ``details[0]`` of the ``ApplicationError`` it fails with (``{"phase": ...}``).
PHASE_DETAIL = "phase"
#: Key, beside :data:`PHASE_DETAIL`, of when the attempt's restart request went out: an
#: ISO 8601 UTC time (:attr:`MachineActionInput.sent_at`).
SENT_AT_DETAIL = "sent_at"


def phased_failure(err: BaseException, phase: str,
                   sent_at: datetime | None = None) -> ApplicationError:
    """``err`` as an ``ApplicationError`` carrying ``{"phase": phase}`` in its details
    (and ``"sent_at"``, ISO 8601 UTC, when given), so the workflow learns the phase
    reached even where heartbeat details are not kept with a failure. Keeps the type,
    message and retryability of an ``ApplicationError``; any other exception becomes a
    retryable error of its class name (e.g. ``BmcUnavailable``)."""
    details: dict[str, str] = {PHASE_DETAIL: phase}
    if sent_at is not None:
        details[SENT_AT_DETAIL] = sent_at.isoformat()
    if isinstance(err, ApplicationError):
        return ApplicationError(err.message, details, type=err.type,
                                non_retryable=err.non_retryable)
    return ApplicationError(str(err), details, type=type(err).__name__)


def detail_time(details: Sequence[Any], key: str = SENT_AT_DETAIL) -> datetime | None:
    """The time under ``key`` in the last dict of ``details`` (heartbeat or failure
    details) that has one, as an aware UTC ``datetime``; ``None`` when none has a
    readable one (a naive time is taken as UTC)."""
    for d in reversed(list(details)):
        if isinstance(d, dict) and d.get(key) is not None:
            try:
                t = datetime.fromisoformat(str(d[key]))
            except ValueError:
                return None
            return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return None


class ActionResult(BaseModel):
    """Outcome of a machine action. ``not_run``: the action could not run and touched
    nothing (e.g. ``autorepair-agent reset-gpu`` exit 2, with its reason); the repair
    moves to the policy's fallback without counting a failed attempt."""

    done: bool
    skipped_reason: str = ""
    detail: str = ""
    ticket_id: str | None = None
    not_run: str = ""
    #: The phase reached (the last one on success; "" from activities without phases).
    phase: str = ""
    #: A run that only made the machine safe after a cancel (``make_safe``) proved that no
    #: disruptive command of this attempt landed: the ForceOff reported as possibly sent
    #: (``off_requested``) left the power On for the whole ``FORCE_OFF_LANDED_S`` wait
    #: (:mod:`activities.power`). The attempt touched nothing (I22).
    nothing_landed: bool = False


class MigrateResult(BaseModel):
    new_machine: str
    old_machine: str
    detail: str = ""


class RepairRecord(BaseModel):
    """Ledger row of a repair (created and updated by RepairWorkflow)."""

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    action: Action
    stage: Stage
    requester: Requester
    reason: str = ""
    approved_by: str | None = None
    decided_by_rule: str | None = None
    detector: str | None = None
    request_id: str | None = None
    alert_ids: list[str] = Field(default_factory=list)
    workflow_id: str | None = None
    updated_at: datetime
    #: The repair holds a lease the guard granted (set when the grant arrives, cleared
    #: when it hands the lease back): a guard rebuilt from the ledger counts it as a
    #: holder whatever its stage (before its cordon too; I21)
    lease_held: bool = False
    #: A person is asked for an approval now (True), or not (False: at
    #: ``awaiting_approval`` that is a repair approved and waiting for its lease or a
    #: maintenance window, the stage kept for the documented order). No
    #: ``approval_needed`` notification goes out for a row written with False (migration
    #: 0017). None: not said (a writer from before it), judged by the stage.
    approval_pending: bool | None = None
    #: ``enforce`` or ``shadow`` (policy.mode of its cluster or pool, read as it started;
    #: migration 0018): the ledger side's notification of a shadow-mode repair's ending
    #: says ``shadow:``. None: not said (a writer from before it), kept as recorded.
    mode: str | None = None
    #: The node pool the repair asks the cluster guard with (its lease request's
    #: ``node_pool``; migration 0019): a guard rebuilt from the ledger re-registers a
    #: holder in it when the configuration places its node in no pool. None: none (or a
    #: writer from before it), kept as recorded.
    node_pool: str | None = None


class TransitionRecord(BaseModel):
    repair_id: str
    stage: Stage
    at: datetime
    by: str = "system"
    reason: str = ""
    #: The write's own idempotency key, ``"<run id>/<n>"`` (``RepairWorkflow`` counts its
    #: ledger writes per run): a workflow task run again after a worker crash writes with
    #: the same key and a later ``at``, and overwrites the row instead of adding one
    #: (migration 0013). None: idempotent on (repair, stage, at) only.
    write_key: str | None = None
    #: Whether a person is asked now (:attr:`RepairRecord.approval_pending`), written with
    #: the stage in the same statement so the row never shows ``awaiting_approval`` with
    #: the previous value (the API's ``state`` would read ``in_progress`` between two
    #: writes). None: the row's value is kept.
    approval_pending: bool | None = None


class AttemptQuery(BaseModel):
    cluster: str
    node: str
    machine_id: str | None = None
    since: datetime


class AttemptHistory(BaseModel):
    """Attempts on the machine and critical alerts seen on it since ``since``."""

    attempts: list[AttemptRecord] = Field(default_factory=list)
    critical_alerts: list[Alert] = Field(default_factory=list)


class ClaimInput(BaseModel):
    """Idempotency claim: detector + request id is unique forever (docs/design.md §5)."""

    detector: str
    request_id: str
    repair_id: str
    cluster: str
    node: str


class ClaimResult(BaseModel):
    repair_id: str
    created: bool


class VerdictRecord(BaseModel):
    """A validation verdict; a pass closes the machine's open tickets unless
    ``close_tickets`` is false (a machine removed for RMA keeps its ticket)."""

    run_id: str
    cluster: str
    machine: str
    verdict: Verdict
    result: ValidationResult
    at: datetime
    close_tickets: bool = True


class TicketInput(BaseModel):
    cluster: str
    machine: str
    run_id: str
    summary: str
    result: ValidationResult


class TicketResult(BaseModel):
    """``ledger_open_ticket``'s answer: the ticket id and the summary line of each evidence
    capture the ticket carries (``workflows.evidence.EvidenceCapture.summary``)."""

    ticket_id: str
    evidence: list[str] = Field(default_factory=list)


class ValidationPlacement(BaseModel):
    cluster: str
    machine: str
    node: str
    run_id: str
    timeout_s: float = 1800.0


class PlacementResult(BaseModel):
    """``timeout_s``/``poll_s`` come from the cluster's ``validation`` config, so the
    workflow's bound is recorded in its history."""

    placed: bool
    job_id: str | None = None
    prior_state: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    timeout_s: float = 1800.0
    poll_s: float = 30.0


class CollectInput(BaseModel):
    """``wait_s``: how long ``collect_validation`` may wait for the job before answering
    ``finished=False`` (it heartbeats meanwhile); also the input of ``release_validation``."""

    cluster: str
    machine: str
    node: str
    run_id: str
    job_id: str
    wait_s: float = 0.0


class CollectResult(BaseModel):
    finished: bool
    result: ValidationResult | None = None


class ReturnMachineInput(BaseModel):
    cluster: str
    machine: str
    node: str
    run_id: str
    verdict: Verdict
    prior_state: dict[str, Any] = Field(default_factory=dict)
    #: ``pool`` (back to the scheduler) or ``spare`` (the cluster's hot-spare pool).
    return_to: str = "pool"
    ticket_id: str | None = None


class ReturnMachineResult(BaseModel):
    """Where the machine ended: ``state`` flags after the call, whether it was made
    schedulable, whether it joined the spare pool, and why it was kept out otherwise."""

    state: list[str] = Field(default_factory=list)
    schedulable: bool = False
    spare: bool = False
    detail: str = ""


class TicketPost(BaseModel):
    """Input of ``post_ticket`` (optional webhook of a hardware ticket)."""

    ticket_id: str
    cluster: str
    machine: str
    run_id: str
    summary: str
    result: ValidationResult


class Notification(BaseModel):
    """Input of ``notify``. ``event``: a ``workflows.config.NotifyEvent`` value (None:
    inferred, see ``activities.notifications.event.event_of``); ``dedup_key``: what
    groups repeats of the same matter at a receiver (PagerDuty ``dedup_key``; default:
    the repair id, else a hash of the notification)."""

    cluster: str
    node: str | None = None
    repair_id: str | None = None
    subject: str
    body: str = ""
    severity: str = "info"
    event: str | None = None
    dedup_key: str | None = None


class LeaseDelivery(BaseModel):
    """One ``lease`` signal the guard commanded (``SendLease``): ``reply`` to the workflow
    ``workflow_id``; ``purpose`` as the machine gave it (``reply``, ``extend``, ``rebuilt``)."""

    workflow_id: str
    reply: LeaseReply
    purpose: Literal["reply", "extend", "rebuilt"] = "reply"

    @property
    def repair_id(self) -> str:
        """The reply's repair id (the fidelity check's field)."""
        return self.reply.repair_id

    @property
    def granted(self) -> bool:
        """Whether the reply grants (the fidelity check's field)."""
        return self.reply.granted


class LeaseDeliveries(BaseModel):
    """Input of ``guard_send_leases``: the ``lease`` signals of one or more guard steps,
    in the commanded order (``commands``: the fidelity check matches each element against
    one commanded ``SendLease``, :mod:`workflows.lifecycle.trace`). ``guard_id``: the
    guard's workflow id (the idempotency keys' prefix). At most
    ``workflows.guard.MAX_REPLIES`` elements."""

    guard_id: str
    commands: list[LeaseDelivery] = Field(default_factory=list)


class LeaseOutcome(BaseModel):
    """What became of one :class:`LeaseDelivery`: ``delivered``; ``gone`` (the requester
    workflow is not running: NOT_FOUND); ``failed`` (another error after the activity's
    own tries; ``message`` says which)."""

    repair_id: str
    purpose: Literal["reply", "extend", "rebuilt"] = "reply"
    status: Literal["delivered", "gone", "failed"]
    message: str = ""


class LeaseOutcomes(BaseModel):
    """Result of ``guard_send_leases``: one outcome per delivery, in the input's order."""

    outcomes: list[LeaseOutcome] = Field(default_factory=list)


class GuardStateQuery(BaseModel):
    """Input of ``ledger_guard_state``: the cluster, and the start of the breaker window."""

    cluster: str
    since: datetime


class HeldRepair(BaseModel):
    """An open repair past its lease grant (stage cordoning … running) in the ledger."""

    repair_id: str
    node: str
    workflow_id: str | None = None
    automatic: bool = False
    requester_kind: str = "system"
    stage: Stage
    #: when the repair was recorded (``repairs.created_at``, the control plane's clock):
    #: its first lease request follows, so a rebuilt guard counts an automatic holder
    #: that has not recorded its cordon yet from then (None: a ledger that predates it)
    requested_at: datetime | None = None
    #: the pool the repair asked with (``repairs.node_pool``, migration 0019; None: none
    #: recorded): the rebuilt lease's pool when the configuration has none for the node
    node_pool: str | None = None


class AutomaticStart(BaseModel):
    """An automatically approved repair and when it started cordoning (its lease grant)."""

    repair_id: str
    at: datetime


class GuardLedgerState(BaseModel):
    """What a freshly started guard rebuilds from the ledger (``ledger_guard_state``).

    ``holders``: open repairs that hold (or held) a lease; ``automatic``: automatically
    approved repairs that cordoned since the query's ``since`` (the breaker window);
    ``breaker_open``/``tripped_at``/``tripped_reason``: the newest ``circuit_breaker``
    alert of the guard (source ``guard``) is a raise, not the reset's clear;
    ``gpu_nodes_reported``: kept for histories that carry it, always 0 now (nodes named
    by alerts are no denominator; ``load_policy``'s ``gpu_nodes`` is, issue 27 item 9).
    """

    holders: list[HeldRepair] = Field(default_factory=list)
    automatic: list[AutomaticStart] = Field(default_factory=list)
    breaker_open: bool = False
    tripped_at: datetime | None = None
    tripped_reason: str = ""
    gpu_nodes_reported: int = 0
    #: Failure-domain holds in force (issue 29 item 2): per domain, the guard's newest
    #: ``failure_domain`` alert is a raise, not a release's clear.
    domain_holds: list[DomainHold] = Field(default_factory=list)
    #: When an operator last reset the open breaker (the guard's newest ``circuit_breaker``
    #: clear, also when the breaker tripped again since), None when never: a rebuilt
    #: guard marks a request first asked for before it (I23) and keeps the automatic
    #: starts before it out of the window.
    reset_at: datetime | None = None
    #: Who made that reset (the clear's ``evidence.by``), for the rebuilt guard's status.
    reset_by: str | None = None
    #: Per domain, its last release: the guard's newest clear (``active`` false) of the
    #: domain's ``failure_domain`` hold, at the guard's clock when it released (the
    #: alert's ``observed_at``, which the guard sets; a sender cannot write the kind). A
    #: rebuilt guard marks an automatic request of the domain first asked for at or
    #: before it, as the release marked the requests the hold kept queued.
    domain_releases: list[DomainRelease] = Field(default_factory=list)


class RepairProbe(BaseModel):
    """Input of ``ledger_open_repair``: a node, and the repair the caller believes is in
    flight there (None: find the node's newest open repair in the ledger)."""

    cluster: str
    node: str
    repair_id: str | None = None


class MachineHoldQuery(BaseModel):
    """Input of ``ledger_machine_held``: the machine (None: the node has none bound; the
    answer is then "not held")."""

    cluster: str
    machine_id: str | None = None


class MachineHold(BaseModel):
    """Result of ``ledger_machine_held`` (issue 26 I18: a removed machine stays out).

    ``held``: the machine was removed for RMA (a succeeded ``remove`` attempt, or the
    provider's ``removed_machines`` row) and no operator returned it since
    (``autorepair machines return``); ``since``: when it was removed; ``repair_id``: the
    repair that removed it; ``reason``: one line for the repair's record."""

    held: bool = False
    machine_id: str | None = None
    since: datetime | None = None
    repair_id: str | None = None
    reason: str = ""


class MaintenanceQuery(BaseModel):
    """Input of ``ledger_maintenance_covering``: a node (and its pool) at ``at`` (the
    asking workflow's time, the control plane's clock; None: the activity's clock, as
    the first release asked)."""

    cluster: str
    node: str
    pool: str | None = None
    at: datetime | None = None


class MaintenanceCover(BaseModel):
    """Result of ``ledger_maintenance_covering`` (issue 29): the maintenance window in force
    now that covers the node and ends last (``window_id`` None: none), when it ends and
    why."""

    window_id: str | None = None
    ends_at: datetime | None = None
    reason: str = ""


class RepairLiveness(BaseModel):
    """Result of ``ledger_open_repair``.

    ``repair_id`` None: the ledger has no open repair on the node (and none was named).
    ``stage``: the ledger's stage ("" when the repair has no row yet); ``running``: its
    workflow is running in Temporal; ``status``: Temporal's execution status in lower
    case (``running``, ``completed``, ``terminated``, ``timed_out``, ``failed``,
    ``canceled``, ``not_found``, ...).
    """

    repair_id: str | None = None
    workflow_id: str | None = None
    stage: str = ""
    running: bool = False
    status: str = ""
    #: Asked without a repair id: the node's newest *ended* repair (None: none), so a
    #: fresh node entity knows its cooldown and what it retired (I21, I20): its id,
    #: terminal stage, end (the terminal transition's time), the actions its attempts
    #: ran (shadowed ones not) and the alerts it named.
    last_repair_id: str | None = None
    last_stage: str = ""
    last_ended_at: datetime | None = None
    last_actions: list[Action] = Field(default_factory=list)
    last_alert_ids: list[str] = Field(default_factory=list)

