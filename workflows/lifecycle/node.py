"""The node lifecycle: what ``NodeWorkflow`` decides for one node across alerts, its
repair, the ledger, timers, continue-as-new, worker restarts and upgrades (issue 26).

``step(state, event, now) -> (state, commands)`` decides every (reconcile status, event)
pair (:data:`TRANSITIONS` is the table; docs/lifecycle.md is generated from it). ``now``
is the control plane's clock. Everything the entity must keep lives in
:class:`NodeState` (carried whole across continue-as-new: :func:`carry`).

Invariants (checked by ``tests/model/node_world.py``):

- **one repair per node at a time**: a repair child starts only while no repair of this
  node is open, or may be open (the ledger not yet read, I21), and right after the ledger
  said none is open: a person's or a detector's repair does not tell the node when it
  starts, so the ledger is read again before every start (one running is taken over).
- **I17 the control plane's clock decides**: a fault's first observation, its
  persistence and the stale-edge order are judged on when the control plane received
  the report (``Alert.received_at``, stamped by ingest; else ``now`` at delivery). The
  sender's ``observed_at`` is evidence only.
- **I20 a fixed level fault is retired**: a repair that succeeded retires every fault it
  acted on; a later raise re-confirms it only when it was received after the repair
  ended and is not from the boot the repair acted on.
- **I21 decide only on what you know**: a fresh entity (or one carrying an open repair)
  reads the ledger before it decides; a failed read is retried with back-off
  (:data:`LEDGER_RETRY_S`) and no repair starts meanwhile.
- **rule zero**: no repair without an actionable, unretired, uncleared fault that
  outlived its persistence window behind it.
- **grace after maintenance** (issue 29 item 1): a fault received inside the grace
  period after a maintenance window (the ``in_grace`` mark of ``ingest.maintenance_marks``)
  or after the node's first report from a new boot following the window (its boot id
  differs from the one reported inside it: ``NodeState.grace_s`` from that report) is
  *held* until the grace end: a level fault is recommended only if still raised then, an
  event fault only if it recurs after it (one that does not is dropped at the grace end).

Policy is called, not re-implemented: the catalogue (``decide_node_action``), the
count-in-window thresholds, persistence and cooldown (``workflows.policy``).

``defects`` (test-only, empty in production) re-introduces known defects so the
checker can show it finds them (:data:`DEFECTS`).

``NodeWorkflow`` (workflows/node.py) is a thin interpreter of this machine: the
``deliver_alert`` update, the ``repair_finished`` signal, the repair child's end, the
timer, every activity outcome and continue-as-new become events; what ``step`` commands
is what it executes (checked in the workflow tests by ``workflows.lifecycle.trace``).

An alert's way through the machine (:class:`AlertDelivered`): de-duplicated by
``alert_id`` (digests carried, :data:`DEDUP_MAX`), recorded in the ledger
(:class:`RecordAlert`), decided in arrival order once it is recorded, the policy was read
within :data:`POLICY_REFRESH_S` and the ledger has answered or failed (a read that fails
answers the waiting alerts at once: ``new``, "waiting for the ledger"; the update never
waits out the ledger's outage). An alert for the open repair is answered ``attached``
only once the signal reached it; a repair that is gone is probed and closed out first.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, field_serializer, field_validator

from workflows.catalogue.kinds import NODE_LEVEL_KINDS
from workflows.catalogue.vocabulary import count_window_s
from workflows.config import CatalogueConfig, MaintenanceConfig, RailsConfig
from workflows.leases import FaultReport
from workflows.maintenance import (
    IN_GRACE,
    IN_MAINTENANCE,
    MAINTENANCE_REASON,
    MAINTENANCE_UNTIL,
    MAINTENANCE_WINDOW,
)
from workflows.models import (
    ACTION_WEIGHT,
    TERMINAL_STAGES,
    Action,
    Alert,
    AlertOutcome,
    Stage,
)
from workflows.policy.node_action import (
    NodeActionDecision,
    count_in_window,
    decide_node_action,
    repeat_key,
)
from workflows.policy.rails import cooldown_until, in_cooldown, persistence_for

#: Back-off between ledger reads while the ledger is unavailable, seconds: 5 s doubling
#: to 60 s, without end (I21: a fresh entity never decides blind).
LEDGER_RETRY_S = (5.0, 60.0)
#: While a repair is open, ask whether it still runs this often, seconds (15 min, the
#: first release's ``REPAIR_PROBE_S``).
REPAIR_PROBE_S = 900.0
#: Re-read the policy (``load_policy``) at most this often, seconds (the first release's
#: ``POLICY_REFRESH_S``).
POLICY_REFRESH_S = 300.0
#: An alert filed under another machine than the last read binding makes the node read
#: the policy again first, when that read is at least this old, seconds.
MACHINE_RECHECK_S = 30.0
#: History length after which the node continues as new (Temporal's suggestion also
#: triggers it); carried as ``NodeState.history_limit``.
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
#: Most active faults, remembered clears and occurrence keys carried (bounds on the
#: carried payload; the ledger holds everything).
MAX_ACTIVE_FAULTS = 32
MAX_CLEARED = 256
MAX_OCCURRENCE_KEYS = 32
MAX_OCCURRENCES = 256
MAX_DIAGNOSED = 256
#: Most diagnostic recommendations listed (alert ids, newest kept).
MAX_DIAGNOSTICS = 100
#: Longest ``evidence_text``/``description`` of a carried alert, characters (the ledger
#: holds the full alert).
MAX_CARRIED_TEXT = 4096
#: Finished-repair messages kept until the ledger was read (one node has one repair at
#: a time: more than a few is already abnormal).
MAX_FINISHED_EARLY = 16
#: Repairs closed without their ``repair_finished`` (a probe or the ledger found them
#: closed, the child ended first) kept so that a late ``repair_finished`` of one is still
#: applied as the repair's end (:func:`_late_finish`); newest kept.
MAX_GONE = 4
#: Occurrence times are kept this long, seconds (8 days: beyond the 7-day ladder window).
OCCURRENCE_TTL_S = 8 * 86400.0

#: Actions after whose success the machine has not booted again: only the faults the
#: repair acted on (or that were attached to it) are retired. After any other action
#: (power cycle, reboot, reprovision, migrate; or a repair found in the ledger, action
#: unknown) every fault received before its end is retired: the boot they were seen on
#: is gone, and the restarted agent reports what is still wrong (I20, agent side).
NON_BOOTING = frozenset({Action.reset_gpu, Action.none})
#: Test-only defects :func:`step` can re-introduce (``tests/model`` shows each is found).
DEFECTS: dict[str, str] = {
    "unreported_domain_fault": "a new actionable fault of a node of a failure domain is "
                               "not reported to the guard (issue 29 item 2)",
    "level_fault_survives_success": "a success keeps the level faults it acted on "
    "(the healthy node is repaired again after the cooldown; reproduction 1)",
    "decide_without_ledger": "a fresh entity whose ledger read failed decides anyway "
    "(a second repair for an episode another repair owns; reproduction 8)",
    "sender_clock_judges": "persistence and edge order are judged on the sender's "
    "observed_at (a clock 5 min fast makes a new fault due at once; I17)",
    "attach_blind": "an alert for the open repair is answered `attached` without the "
    "signal reaching it (a repair that is gone swallows every later alert)",
    "inherit_machine_history": "a node re-registered to another machine keeps the old "
    "machine's faults and history (its retired faults hide the new machine's)",
    "window_level_fault_forgotten": "a level fault raised inside a maintenance window is "
    "observed only and never judged again: a GPU that did not come back from the planned "
    "reboot is never repaired (issue 29 item 1). Found by "
    "tests/unit/test_domain_fault_reports.py, not by the model checker: a fault never "
    "judged breaks liveness, not a safety invariant",
    "window_level_fault_unheld": "a level fault raised inside a maintenance window is "
    "judged at once: its repair is recommended inside the window (issue 29 item 1)",
    "start_without_check": "a node that knows its ledger starts a repair without reading "
    "the node's open repair again (a second repair beside an operator's running one)",
    "grace_ignored": "a fault received in the grace period after maintenance is "
    "recommended once its persistence is over (the false faults of a planned reboot are "
    "repaired; issue 29 item 1)",
}
#: Default grace period after maintenance, seconds (``policy.maintenance.grace_s``).
GRACE_S = MaintenanceConfig().grace_s


_V = TypeVar("_V")


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def seen_digest(alert_id: str) -> str:
    """De-duplication key of an alert id: the first :data:`DEDUP_DIGEST_HEX` hex digits
    of its sha256."""
    return hashlib.sha256(alert_id.encode("utf-8", "replace")).hexdigest()[:DEDUP_DIGEST_HEX]


def bucket(t: datetime) -> int:
    """The de-duplication hour of ``t``: epoch seconds floored to :data:`DEDUP_BUCKET_S`."""
    return int(t.timestamp()) // DEDUP_BUCKET_S * DEDUP_BUCKET_S


def dump_seen(seen: dict[str, int]) -> list[tuple[int, str]]:
    """``seen`` (digest → bucket, oldest first) as ``[[hour_epoch_s, "digest…"], …]``
    (digests concatenated, oldest hour first): the carried form."""
    log: list[tuple[int, list[str]]] = []
    for digest, b in seen.items():
        if log and log[-1][0] == b:
            log[-1][1].append(digest)
        else:
            log.append((b, [digest]))
    return [(b, "".join(ds)) for b, ds in log]


def load_seen(log: list[Any]) -> dict[str, int]:
    """The inverse of :func:`dump_seen`. Raises ``ValueError`` naming ``seen`` when an
    entry is not ``[int, str]``."""
    out: dict[str, int] = {}
    for entry in log:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2
                and isinstance(entry[1], str)):
            raise ValueError(f"seen: entries are [hour_epoch_s, digests] (got {entry!r})")
        b, digests = int(entry[0]), entry[1]
        for i in range(0, len(digests), DEDUP_DIGEST_HEX):
            out[digests[i: i + DEDUP_DIGEST_HEX]] = b
    return out


def trim(alert: Alert) -> Alert:
    """``alert`` with ``evidence_text``/``description`` cut to :data:`MAX_CARRIED_TEXT`."""
    if (len(alert.evidence_text) <= MAX_CARRIED_TEXT
            and len(alert.description) <= MAX_CARRIED_TEXT):
        return alert
    return alert.model_copy(update={"evidence_text": alert.evidence_text[:MAX_CARRIED_TEXT],
                                    "description": alert.description[:MAX_CARRIED_TEXT]})


class Reconcile(StrEnum):
    """Whether this run knows the node's open repair (the ledger's answer)."""

    pending = "pending"  # not asked yet (fresh start, continue-as-new, restart)
    reading = "reading"  # a ledger read is out
    retry_wait = "retry_wait"  # the ledger was unavailable; a retry timer runs
    done = "done"  # known: decisions may be taken


class Fault(BaseModel):
    """An actionable fault: its latest alert (action and severity as decided), the rule
    that decided, when the control plane first and last received it."""

    alert: Alert
    action: Action
    rule: str
    first_seen: datetime
    received: datetime
    #: Held until this grace end (received inside a grace period after maintenance):
    #: a level fault is due only from then on, an event fault only if received after it.
    held_until: datetime | None = None
    held_why: str = ""
    #: Reported to the cluster's guard (``fault_seen``, issue 29 item 2): at its first
    #: raise outside a window, else when a repair is started for it.
    reported: bool = False


def held(f: Fault, now: datetime) -> bool:
    """Whether ``f`` is held by a grace period at ``now``: a level fault until its
    ``held_until``; an event fault until it is received again at or after it."""
    if f.held_until is None:
        return False
    if f.alert.level:
        return now < f.held_until
    return f.received < f.held_until


class OpenRepair(BaseModel):
    """The repair this node has open: its id, the fault keys and alert ids it acted on
    (``acted_on`` empty when found in the ledger: it acted on what it was started for)."""

    repair_id: str
    action: Action | None = None  # None: found in the ledger (not known here)
    acted_on: list[str] = Field(default_factory=list)
    alert_ids: list[str] = Field(default_factory=list)
    boots: dict[str, str] = Field(default_factory=dict)  # fault key → boot_id acted on
    probed_at: datetime | None = None


class Finished(BaseModel):
    """A ``repair_finished`` message (kept when it arrived before the ledger was read).
    ``actions``: what ran on the machine (None: a sender that predates the field)."""

    repair_id: str
    stage: Stage
    at: datetime
    alert_ids: list[str] = Field(default_factory=list)
    actions: list[Action] | None = None
    #: the repair ended because its machine is held for RMA (``RepairFinished``)
    machine_held: bool = False
    #: alerts attached after the repair's last recurrence check (``RepairFinished``)
    unjudged_alert_ids: list[str] = Field(default_factory=list)


class Attaching(BaseModel):
    """An alert signalled to the open repair, its answer held until the signal landed."""

    alert: Alert
    key: str
    repair_id: str
    reason: str
    failed: bool = False  # the signal found the workflow closed: a probe decides


class Tracked(BaseModel):
    """An actionable raise tracked, its answer given after the evaluation (held in
    ``NodeState.checking`` while the read before a repair start is out)."""

    kind: Literal["tracked"] = "tracked"
    alert: Alert
    key: str
    text: str


class NodeState(BaseModel):
    """Everything the node entity keeps across continue-as-new, a worker restart or an
    upgrade. Times are the control plane's (UTC). ``retired``: fault key → (end of the
    successful repair, boot id a booting action of it replaced or ""): a raise received
    before that end, or from that boot, is stale (I20); after only non-booting actions
    (``reset_gpu``) the boot runs on and no boot is recorded. ``cleared``: fault key →
    newest receipt time of its clears (a raise received at or before it is stale).
    ``seen``: de-duplication digest → hour bucket, oldest first (carried as
    :func:`dump_seen`'s compact form). ``intake``: alerts taken and not yet decided, in
    arrival order; ``unrecorded``: their ids whose ledger write is out.
    ``catalogue``/``policy_at``: the last policy read (not carried: the next run reads
    it again); ``machine_id``/``node_pool``: the node's configured binding at that read
    (alerts and repairs are filed under it)."""

    cluster: str
    node: str
    id_seed: str  # from the shell (``workflow.uuid4``): repair ids are seed + counter
    rails: RailsConfig = Field(default_factory=RailsConfig)
    reconcile: Reconcile = Reconcile.pending
    ledger_tries: int = 0
    seen: dict[str, int] = Field(default_factory=dict)
    intake: list[Alert] = Field(default_factory=list)
    unrecorded: list[str] = Field(default_factory=list)
    attaching: list[Attaching] = Field(default_factory=list)
    probe_out: str = ""  # "", "periodic" or "attach": the purpose of the probe out
    catalogue: CatalogueConfig | None = None
    policy_at: datetime | None = None
    policy_out: bool = False
    machine_id: str | None = None
    node_pool: str | None = None
    #: The machine the carried faults and history belong to (the last one bound).
    history_machine: str | None = None
    active: dict[str, Fault] = Field(default_factory=dict)
    cleared: dict[str, datetime] = Field(default_factory=dict)
    retired: dict[str, tuple[datetime, str]] = Field(default_factory=dict)
    occurrences: dict[str, list[datetime]] = Field(default_factory=dict)
    diagnosed: dict[str, datetime] = Field(default_factory=dict)
    diagnostics: list[str] = Field(default_factory=list)
    repair: OpenRepair | None = None
    cooldown_until: datetime | None = None
    #: End of the last successful repair that booted the machine again: any raise
    #: received at or before it is from the boot it replaced (I20).
    booted_at: datetime | None = None
    finished_early: dict[str, Finished] = Field(default_factory=dict)
    #: Repairs of ours closed without their finish (:data:`MAX_GONE`, newest last): a
    #: late ``repair_finished`` of one ends it as if it were still open (I20, cooldown).
    gone: dict[str, OpenRepair] = Field(default_factory=dict)
    #: Repairs whose end the node applied (:data:`MAX_GONE`, newest last): one the ledger
    #: still shows running (it signals before its workflow closes) is not taken over.
    ended: list[str] = Field(default_factory=list)
    #: The ledger answered a read of the node's open repair in this step (reset at the
    #: end of every step): a repair starts only in the step that took such an answer
    #: (the read before a start; a person's repair may have started since any earlier).
    checked: bool = False
    #: Actionable raises whose answer waits for that read (``recommended`` with the repair
    #: that starts, ``attached`` to the one the ledger has, or ``new``).
    checking: list[Tracked] = Field(default_factory=list)
    recommendations: int = 0
    repairs_started: int = 0
    timer_at: datetime | None = None
    history_limit: int = DEFAULT_HISTORY_LIMIT
    details: str = ""
    #: Grace period after maintenance, seconds (``policy.maintenance.grace_s``, last read).
    grace_s: float = GRACE_S
    #: Boot id of the node's last report inside a maintenance window ("" : none known).
    maint_boot: str = ""
    #: The node's grace end after maintenance (None: none seen) and why.
    grace_until: datetime | None = None
    grace_why: str = ""
    #: The failure domains the node belongs to (``load_policy``'s ``domains``, last read):
    #: a new actionable fault of a node with any is reported to the guard (issue 29 item 2).
    domains: list[str] = Field(default_factory=list)

    @field_serializer("seen")
    def _ser_seen(self, seen: dict[str, int]) -> list[tuple[int, str]]:
        return dump_seen(seen)

    @field_validator("seen", mode="before")
    @classmethod
    def _val_seen(cls, v: Any) -> Any:
        return load_seen(v) if isinstance(v, list) else v


# ---- events ------------------------------------------------------------------------
class Begin(BaseModel):
    """A run began (first start, continue-as-new, a worker restart replaying)."""

    kind: Literal["begin"] = "begin"


class AlertDelivered(BaseModel):
    """An alert (raise or clear) delivered through the ``deliver_alert`` update."""

    kind: Literal["alert_delivered"] = "alert_delivered"
    alert: Alert


class AlertRecorded(BaseModel):
    """The ledger write of ``alert_id`` ended (``ok`` False: it failed for good; the alert
    is decided all the same: the ledger is the record, the decision is here)."""

    kind: Literal["alert_recorded"] = "alert_recorded"
    alert_id: str
    ok: bool = True


class PolicyLoaded(BaseModel):
    """``load_policy``'s answer: the catalogue that decides, the rails that time, and the
    node's configured machine and pool (None: not configured)."""

    kind: Literal["policy_loaded"] = "policy_loaded"
    catalogue: CatalogueConfig
    rails: RailsConfig
    machine_id: str | None = None
    node_pool: str | None = None
    grace_s: float = GRACE_S
    #: the node's failure domains (``nodes[].failure_domain``, scheduler labels/features)
    domains: list[str] = Field(default_factory=list)


class PolicyFailed(BaseModel):
    """``load_policy`` failed for good (a configuration that does not load)."""

    kind: Literal["policy_failed"] = "policy_failed"
    message: str = ""


class AttachDone(BaseModel):
    """The ``attach_alert`` signal for ``alert_id`` landed (``ok``) or the repair's
    workflow is closed (not ``ok``)."""

    kind: Literal["attach_done"] = "attach_done"
    alert_id: str
    ok: bool


class RepairStarted(BaseModel):
    """The repair child the machine asked for started (or already existed: same id)."""

    kind: Literal["repair_started"] = "repair_started"
    repair_id: str


class RepairFinishedEv(BaseModel):
    """The repair told us it reached a terminal stage (signal ``repair_finished``)."""

    kind: Literal["repair_finished"] = "repair_finished"
    repair_id: str
    stage: Stage
    at: datetime
    alert_ids: list[str] = Field(default_factory=list)
    actions: list[Action] | None = None
    machine_held: bool = False
    unjudged_alert_ids: list[str] = Field(default_factory=list)


class RepairEnded(BaseModel):
    """The repair child this run started ended (``how``: Temporal's status in lower
    case; ``completed`` for a repair that ended normally)."""

    kind: Literal["repair_ended"] = "repair_ended"
    repair_id: str
    how: str


class RepairProbed(BaseModel):
    """``ledger_open_repair``'s answer about the open repair ``repair_id`` (``ok`` False:
    the probe failed)."""

    kind: Literal["repair_probed"] = "repair_probed"
    repair_id: str
    ok: bool = True
    running: bool = False
    status: str = ""


class LedgerRead(BaseModel):
    """The ledger's answer about the node's open repair (``ledger_open_repair``);
    ``last``: the node's newest ended repair as its end message (None: none, or not
    asked), what a fresh entity learns its cooldown and retirements from (I21)."""

    kind: Literal["ledger_read"] = "ledger_read"
    repair_id: str | None = None
    stage: str = ""
    running: bool = False
    status: str = ""
    last: Finished | None = None


class LedgerUnavailable(BaseModel):
    """The ledger read failed (PostgreSQL down, timeout)."""

    kind: Literal["ledger_unavailable"] = "ledger_unavailable"
    message: str = ""


class FaultReportFailed(BaseModel):
    """A ``fault_seen`` report could not be delivered (no guard runs for the cluster);
    ``retried``: it was already the second try, after starting the guard."""

    kind: Literal["fault_report_failed"] = "fault_report_failed"
    report: FaultReport
    retried: bool = False


class TimerFired(BaseModel):
    """The timer the machine asked for fired."""

    kind: Literal["timer"] = "timer"


class HistoryFull(BaseModel):
    """The history is long (or Temporal suggests continue-as-new)."""

    kind: Literal["history_full"] = "history_full"


class Clock(BaseModel):
    """Time passed; nothing else (time alone is judged at the next timer)."""

    kind: Literal["clock"] = "clock"


Event = Annotated[
    Begin | AlertDelivered | AlertRecorded | PolicyLoaded | PolicyFailed | AttachDone
    | RepairStarted | RepairFinishedEv | RepairEnded | RepairProbed | LedgerRead
    | LedgerUnavailable | FaultReportFailed | TimerFired | HistoryFull | Clock,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("begin", "alert_delivered", "alert_recorded", "policy_loaded",
               "policy_failed", "attach_done", "repair_started", "repair_finished",
               "repair_ended", "repair_probed", "ledger_read", "ledger_unavailable",
               "fault_report_failed",
               "timer", "history_full", "clock")


# ---- commands ----------------------------------------------------------------------
class Reply(BaseModel):
    """The answer to the alert's delivery (update ``deliver_alert``)."""

    kind: Literal["reply"] = "reply"
    alert_id: str
    outcome: AlertOutcome
    reason: str = ""
    repair_id: str | None = None


class RecordAlert(BaseModel):
    """Write the alert to the ledger (``ledger_record_alert``; idempotent on its id)."""

    kind: Literal["record_alert"] = "record_alert"
    alert: Alert


class LoadPolicy(BaseModel):
    """Read the cluster's policy (``load_policy``)."""

    kind: Literal["load_policy"] = "load_policy"


class StartRepair(BaseModel):
    """Start the ``RepairWorkflow`` child ``repair_id`` for ``action`` on the faults
    ``fault_keys`` (their alerts ``alerts``), on the configured ``machine_id`` and
    ``node_pool`` (never what a sender reported)."""

    kind: Literal["start_repair"] = "start_repair"
    repair_id: str
    action: Action
    fault_keys: list[str]
    alerts: list[Alert]
    reason: str
    machine_id: str | None = None
    node_pool: str | None = None


class AttachAlert(BaseModel):
    """Signal the open repair with the alert (``attach_alert``)."""

    kind: Literal["attach_alert"] = "attach_alert"
    repair_id: str
    alert: Alert


class ReadLedger(BaseModel):
    """Ask the ledger for the node's open repair (``ledger_open_repair``)."""

    kind: Literal["read_ledger"] = "read_ledger"
    repair_id: str | None = None


class ProbeRepair(BaseModel):
    """Ask whether the open repair still runs (``ledger_open_repair`` with its id)."""

    kind: Literal["probe_repair"] = "probe_repair"
    repair_id: str


class CloseLedger(BaseModel):
    """Record the terminal ``stage`` of a repair that ended without writing it
    (``ledger_record_transition`` at ``at``)."""

    kind: Literal["close_ledger"] = "close_ledger"
    repair_id: str
    how: str
    stage: Stage
    at: datetime


class ReleaseLease(BaseModel):
    """Give the ended repair's lease back to the guard."""

    kind: Literal["release_lease"] = "release_lease"
    repair_id: str
    outcome: str


class ReportFault(BaseModel):
    """Signal ``fault_seen`` to the cluster's guard: a new actionable fault of a node of a
    failure domain (issue 29 item 2); undeliverable → :class:`FaultReportFailed`."""

    kind: Literal["report_fault"] = "report_fault"
    report: FaultReport
    retried: bool = False


class StartGuard(BaseModel):
    """Start the cluster's guard (``guard/{cluster}``, abandoned by the node; one that
    already runs is left as it is)."""

    kind: Literal["start_guard"] = "start_guard"


class Notify(BaseModel):
    kind: Literal["notify"] = "notify"
    subject: str
    body: str
    severity: str = "warning"
    event: str = ""
    repair_id: str | None = None


class SetTimer(BaseModel):
    """(Re)arm the one timer at ``at`` (None: no timer needed)."""

    kind: Literal["set_timer"] = "set_timer"
    at: datetime | None


class SetDetails(BaseModel):
    kind: Literal["set_details"] = "set_details"
    text: str


class ContinueAsNew(BaseModel):
    """Continue as new carrying ``state`` (:func:`carry`)."""

    kind: Literal["continue_as_new"] = "continue_as_new"
    state: NodeState


Command = (Reply | RecordAlert | LoadPolicy | StartRepair | AttachAlert | ReadLedger
           | ProbeRepair | CloseLedger | ReleaseLease | ReportFault | StartGuard | Notify
           | SetTimer | SetDetails | ContinueAsNew)


# ---- the machine -------------------------------------------------------------------
def new_state(cluster: str, node: str, id_seed: str,
              rails: RailsConfig | None = None) -> NodeState:
    """A fresh node entity (nothing known: the ledger is read first, I21). Raises
    ``ValueError`` naming the field when ``cluster``, ``node`` or ``id_seed`` is empty."""
    for name, v in (("cluster", cluster), ("node", node), ("id_seed", id_seed)):
        if not v:
            raise ValueError(f"{name}: must not be empty (got {v!r})")
    return NodeState(cluster=cluster, node=node, id_seed=id_seed,
                     rails=rails or RailsConfig())


def carry(s: NodeState) -> NodeState:
    """The state the next run starts from (continue-as-new, an upgrade, a worker restart
    that lost what was out): all of it but the policy (read again) and what was out; the
    ledger is read again when a repair is open (it may have ended meanwhile) or was not
    yet known."""
    reconcile = Reconcile.pending if s.repair is not None else Reconcile.done
    if s.reconcile != Reconcile.done:
        reconcile = Reconcile.pending
    return s.model_copy(update={"reconcile": reconcile, "ledger_tries": 0, "timer_at": None,
                                "catalogue": None, "policy_at": None, "policy_out": False,
                                "probe_out": "", "unrecorded": []})


def quiescent(s: NodeState) -> bool:
    """Nothing is being decided: no alert waits for its answer, no read or probe is out
    (continue-as-new only then; :class:`HistoryFull` waits otherwise)."""
    return not (s.intake or s.attaching or s.checking or s.probe_out or s.policy_out
                or s.reconcile == Reconcile.reading)


def fault_key(alert: Alert) -> str:
    """``kind:code:gpu`` (as :func:`workflows.protocol.fault_key`; no device for the
    node-level kinds, :data:`~workflows.catalogue.kinds.NODE_LEVEL_KINDS`)."""
    gpu = "" if alert.kind in NODE_LEVEL_KINDS else (alert.gpu or "")
    return f"{alert.kind}:{'' if alert.code is None else alert.code}:{gpu}"


def received(alert: Alert, now: datetime, defects: frozenset[str] = frozenset()) -> datetime:
    """When the control plane received ``alert`` (I17): ingest's ``received_at`` (never
    later than ``now``), else ``now`` at delivery; never the sender's ``observed_at``
    (the ``sender_clock_judges`` defect brings that back)."""
    if "sender_clock_judges" in defects:
        return _utc(alert.observed_at)
    now = _utc(now)
    # a stamp ahead of this clock (ingest's host runs ahead): received no later than now
    return min(_utc(alert.received_at), now) if alert.received_at is not None else now


def _boot(alert: Alert) -> str:
    b = alert.evidence.get("boot_id")
    return b if isinstance(b, str) else ""


def due_faults(s: NodeState, now: datetime, defects: frozenset[str] = frozenset()
               ) -> list[tuple[str, Fault]]:
    """Active faults that outlived their persistence window at ``now`` and are not held
    by a grace period after maintenance (:func:`held`), heaviest action first
    (``persistence_for`` of the carried rails)."""
    due = [(k, f) for k, f in s.active.items()
           if now >= f.first_seen + timedelta(seconds=persistence_for(f.alert, s.rails))
           and (not held(f, now) or "grace_ignored" in defects)]
    due.sort(key=lambda kf: (-ACTION_WEIGHT[kf[1].action], kf[1].first_seen))
    return due


def next_deadline(s: NodeState, now: datetime) -> datetime | None:
    """The next time something is due: a ledger retry, a repair probe, a persistence
    window, a grace end after maintenance or the cooldown's end (None: nothing is)."""
    if s.reconcile == Reconcile.retry_wait:
        return s.timer_at
    if s.reconcile != Reconcile.done:
        return None
    if s.repair is not None:
        base = s.repair.probed_at or now
        return base + timedelta(seconds=REPAIR_PROBE_S)
    if not s.active:
        return None
    times = [max(f.first_seen + timedelta(seconds=persistence_for(f.alert, s.rails)),
                 f.held_until or now) for f in s.active.values()]
    if in_cooldown(s.cooldown_until, now):
        assert s.cooldown_until is not None
        times = [max(t, s.cooldown_until) for t in times]
    future = [t for t in times if t > now]
    return min(future) if future else None


def _timer(s: NodeState, now: datetime) -> tuple[NodeState, list[Command]]:
    at = next_deadline(s, now)
    if at == s.timer_at:
        return s, []
    return s.model_copy(update={"timer_at": at}), [SetTimer(at=at)]


def _evaluate(s: NodeState, now: datetime, defects: frozenset[str]
              ) -> tuple[NodeState, list[Command]]:
    """Start a repair for the faults that outlived their persistence window (rule zero),
    if none is open, the ledger was read (I21) and the cooldown is over; the policy is
    read first when the last read is older than :data:`POLICY_REFRESH_S` (the repair is
    filed under the machine configured now), then the ledger's open repair of the node
    again unless it answered in this step (→ ``reading``: a repair another
    requester started meanwhile is taken over instead, :func:`_on_ledger`)."""
    known = s.reconcile == Reconcile.done or (
        "decide_without_ledger" in defects and s.reconcile == Reconcile.retry_wait)
    if s.repair is not None or not known or in_cooldown(s.cooldown_until, now):
        return s, []
    due = due_faults(s, now, defects)
    if not due:
        return s, []
    pending_clears = {fault_key(a) for a in s.intake if not a.active}
    if any(k in pending_clears for k, _ in due):
        # rule zero: a clear of a due fault is received and still being recorded (its
        # ledger write is out): it is weighed first, the repair waits for it (found by
        # the fleet model check, tests/model/fleet_world.py)
        return s, []
    if _policy_stale(s, now):
        # the configured machine and pool, and the rails, as configured now: read first
        if s.policy_out:
            return s, []
        return s.model_copy(update={"policy_out": True}), [LoadPolicy()]
    if (not s.checked and s.reconcile == Reconcile.done
            and "start_without_check" not in defects):
        # one repair per node: a repair started by a person or a detector (the API, the
        # CLI) does not tell the node; the ledger is read again right before a start, and
        # a repair it has running is taken over as a fresh entity takes it (_on_ledger)
        return (s.model_copy(update={"reconcile": Reconcile.reading}),
                [ReadLedger(repair_id=None)])
    action = due[0][1].action
    rid = f"{s.id_seed}{s.repairs_started:04x}"[-16:]
    keys = [k for k, _ in due]
    alerts = [f.alert for _, f in due]
    repair = OpenRepair(repair_id=rid, action=action, acted_on=keys,
                        alert_ids=[a.alert_id for a in alerts],
                        boots={k: _boot(f.alert) for k, f in due}, probed_at=now)
    s = s.model_copy(update={
        "repair": repair, "recommendations": s.recommendations + 1,
        "repairs_started": s.repairs_started + 1,
        "details": f"repair {rid} ({action.value}) in flight"})
    reason = "; ".join(f"{f.alert.summary} ({f.rule})" for _, f in due)
    # a fault not reported yet (raised inside a window, or before the domains were
    # known) is reported now, before the repair's lease request
    told = [] if not s.domains or "unreported_domain_fault" in defects else [
        k for k, f in due if not f.reported]
    if told:
        s = s.model_copy(update={"active": {
            k: f.model_copy(update={"reported": True}) if k in told else f
            for k, f in s.active.items()}})
    return s, [*[_report(s, s.active[k].alert) for k in told],
               StartRepair(repair_id=rid, action=action, fault_keys=keys, alerts=alerts,
                           reason=reason, machine_id=s.machine_id, node_pool=s.node_pool),
               SetDetails(text=s.details)]


def _finish(s: NodeState, msg: Finished, defects: frozenset[str]) -> NodeState:
    """End the open repair as ``msg`` says: cooldown from its end (not after
    ``auto_resolved``), event faults it used dropped, and on success (or ``shadowed``)
    every fault it acted on retired (I20). What ran is judged by ``msg.actions`` (an operator's
    ``approve --action`` or the ladder can make it differ from the started action),
    else by the started action: after only non-booting actions (``reset_gpu``) just the
    faults it acted on or used are retired; after a booting one every fault received
    before its end, and later raises received by then are stale."""
    assert s.repair is not None
    rep = s.repair
    used = set(msg.alert_ids) | set(rep.alert_ids)
    at = _utc(msg.at)
    ran = msg.actions if msg.actions is not None else [rep.action]
    booting = not all(a in NON_BOOTING for a in ran)
    active = dict(s.active)
    retired = dict(s.retired)
    # I20: a report from another boot than the ones the repair acted on, after a booting
    # action, is a fresh observation of the boot the action brought (attached to the
    # repair while it verified, or not): it re-confirms its fault, which stays
    old_boots = {b for b in rep.boots.values() if b}

    # and a report the repair received after its last check that the fault had not come
    # back (``unjudged_alert_ids``: while it rejoined and closed) was judged by nobody:
    # its fault stays open too, whether or not the report names its boot
    unjudged = set(msg.unjudged_alert_ids)

    def from_new_boot(f: Fault) -> bool:
        b = _boot(f.alert)
        return (f.alert.alert_id in unjudged
                or (booting and bool(old_boots) and bool(b) and b not in old_boots))

    for k, f in list(active.items()):
        if not f.alert.level and f.alert.alert_id in used and not from_new_boot(f):
            active.pop(k)
    # a shadowed repair (shadow mode, issue 29 item 3) stands for the action it would have
    # run: the faults it stood for are retired as after a success (nothing booted), so
    # one fault episode makes one shadowed repair, as it makes one repair in enforce
    ok = (msg.stage in (Stage.succeeded, Stage.shadowed)
          and "level_fault_survives_success" not in defects)
    if msg.stage == Stage.rejected:
        # a person said no to this repair: the faults it stood for are set aside until
        # reported again (a new raise is a new episode), not proposed again every
        # cooldown (with automatic consent, not cordoned again 30 min after the reject)
        for k in sorted(set(rep.acted_on) | {k for k, f in s.active.items()
                                             if f.alert.alert_id in used}):
            if active.pop(k, None) is not None:
                retired[k] = (at, "")
    if msg.machine_held:
        # I18: the machine is held for RMA (out of service until an operator returns
        # it); the faults the repair stood for are dealt with — a repair for them would
        # be refused again every cooldown. A fault reported after this end (a new
        # raise, a new Xid) is a new episode and is judged as any other.
        # retired with no boot: nothing rebooted the machine, so a raise of the same
        # boot after its return is a new episode, not a stale one (_stale_raise); sorted,
        # so the bounded map trims the same entries on every replay
        for k in sorted(set(rep.acted_on) | {k for k, f in s.active.items()
                                             if f.alert.alert_id in used
                                             or f.received <= at}):
            if active.pop(k, None) is not None:
                retired[k] = (at, "")
    if ok:
        acted = {k for k in set(rep.acted_on) | {
                     k for k, f in s.active.items()
                     if f.alert.alert_id in used or (booting and f.received <= at)}
                 # the fault it acted on, reported again from the new boot or after its
                 # last check, was not fixed: it stays
                 if not (k in s.active and from_new_boot(s.active[k]))}
        for k in sorted(acted):  # sorted: the bounded map trims alike on every replay
            gone = active.pop(k, None)
            # the boot a later raise of the fault is stale from: only one a booting action
            # replaced; after only non-booting actions (a GPU reset) the boot runs on, and
            # the same fault reported from it after the end is the fault back (I20)
            boot = "" if not booting else (
                rep.boots.get(k) or (_boot(gone.alert) if gone is not None else ""))
            retired[k] = (at, boot)
    booted = s.booted_at
    if ok and booting:
        booted = max(at, booted or at)
    cooldown = s.cooldown_until
    if msg.stage != Stage.auto_resolved:
        cooldown = cooldown_until(at, s.rails)
    held = (": its machine is held for RMA, the faults it stood for are set aside until "
            "reported again" if msg.machine_held else
            ": the faults it stood for are set aside until reported again"
            if msg.stage == Stage.rejected else "")
    return s.model_copy(update={
        "active": active, "retired": _bounded(retired, MAX_CLEARED), "repair": None,
        "cooldown_until": cooldown, "booted_at": booted, "ended": _ended(s, msg.repair_id),
        "details": f"repair {msg.repair_id} ended {msg.stage.value}{held}"})


def _foreign_finish(s: NodeState, msg: Finished) -> NodeState:
    """A repair of this node that another run started told us it finished before the
    ledger answered, or one this node did not start (a person's, a detector's) once it
    knows its ledger: its cooldown holds (not after ``auto_resolved``). A success after a
    booting action (``msg.actions``; unknown: taken as booting) retires every fault
    received before its end (what it acted on is not known here; a fault still there is
    reported again after the new boot, I20); a success (or ``shadowed``) after only
    non-booting actions (``reset_gpu``: nothing reboots, so nothing is reported again)
    retires just the faults whose alerts it names (``msg.alert_ids``)."""
    at = _utc(msg.at)
    update: dict[str, object] = {"ended": _ended(s, msg.repair_id)}
    if msg.stage != Stage.auto_resolved:
        end = cooldown_until(at, s.rails)
        update["cooldown_until"] = max(end, s.cooldown_until or end)
    if msg.stage in (Stage.succeeded, Stage.shadowed):
        booting = (msg.stage == Stage.succeeded and (
            msg.actions is None or not all(a in NON_BOOTING for a in msg.actions)))
        named = set(msg.alert_ids)
        if booting:
            update["booted_at"] = max(at, s.booted_at or at)
        retired = dict(s.retired)
        active = dict(s.active)
        for k, f in sorted(s.active.items()):
            if (f.received <= at) if booting else (f.alert.alert_id in named):
                active.pop(k)
                retired[k] = (at, "")
        update |= {"active": active, "retired": _bounded(retired, MAX_CLEARED)}
    return s.model_copy(update=update)


def _ended(s: NodeState, rid: str) -> list[str]:
    """``s.ended`` with ``rid`` last (bounded to :data:`MAX_GONE`)."""
    return [*(r for r in s.ended if r != rid), rid][-MAX_GONE:]


def _late_finish(s: NodeState, msg: Finished, defects: frozenset[str]) -> NodeState:
    """The ``repair_finished`` of a repair of ours that :func:`_gone` already closed (the
    probe, the ledger or the child's end came first): applied as :func:`_finish` applies
    it to the open repair (faults retired on success, I20), the cooldown the later of the
    two ends; the repair open now, if any, stays open."""
    rep = s.gone[msg.repair_id]
    gone = {k: v for k, v in s.gone.items() if k != msg.repair_id}
    t = _finish(s.model_copy(update={"repair": rep, "gone": gone}), msg, defects)
    ends = [c for c in (s.cooldown_until, t.cooldown_until) if c is not None]
    return t.model_copy(update={"repair": s.repair,
                                "cooldown_until": max(ends) if ends else None})


#: Ledger stage recorded for a repair whose workflow ended without writing its own end,
#: by Temporal's status (anything else: ``cancelled``).
CLOSE_STAGE = {"timed_out": Stage.timed_out, "failed": Stage.failed}


def _gone(s: NodeState, rid: str, how: str, now: datetime) -> tuple[NodeState, list[Command]]:
    """The open repair ``rid`` ended without telling: cooldown (it may have acted),
    ledger closed (not after ``completed``: it wrote its own end), lease released,
    people told (its cordon may remain). The repair is remembered (:data:`MAX_GONE`): a
    ``repair_finished`` it sent that is stepped after this (the probe saw the workflow
    closed first) still ends it as it says (:func:`_late_finish`)."""
    gone = dict(s.gone)
    if s.repair is not None and s.repair.repair_id == rid:
        gone.pop(rid, None)
        gone[rid] = s.repair
    s = s.model_copy(update={"repair": None, "cooldown_until": cooldown_until(now, s.rails),
                             "gone": _bounded(gone, MAX_GONE),
                             "details": f"repair {rid} ended without finishing ({how})"})
    cmds: list[Command] = [SetDetails(text=s.details)]
    if how != "completed":
        cmds.append(_close(rid, how, now))
    return s, [
        *cmds, ReleaseLease(repair_id=rid, outcome=how),
        Notify(subject=f"repair {rid} on {s.node} ended without finishing ({how})",
               body="The repair workflow stopped before its cleanup ran; the node may still "
               "be cordoned by it. Check the node and uncordon it if healthy.",
               repair_id=rid),
    ]


def _close(rid: str, how: str, now: datetime) -> CloseLedger:
    return CloseLedger(repair_id=rid, how=how, stage=CLOSE_STAGE.get(how, Stage.cancelled),
                       at=now)


def _bounded(d: dict[str, _V], cap: int) -> dict[str, _V]:
    while len(d) > cap:
        d.pop(next(iter(d)))
    return d


def _reply(alert: Alert, outcome: AlertOutcome, reason: str,
           repair_id: str | None = None) -> Reply:
    return Reply(alert_id=alert.alert_id, outcome=outcome, reason=reason, repair_id=repair_id)


def _stale_raise(s: NodeState, alert: Alert, key: str, at: datetime) -> str | None:
    if s.booted_at is not None and at <= s.booted_at:
        return (f"stale raise: received {at.isoformat()}, not after the successful repair "
                f"that booted the machine again at {s.booted_at.isoformat()} (I20)")
    last = s.cleared.get(key)
    if alert.level and last is not None and at <= last:
        return (f"stale raise: received {at.isoformat()}, not after the fault's clear "
                f"received {last.isoformat()}; the fault is cleared")
    ret = s.retired.get(key)
    if ret is not None:
        end, boot = ret
        if at <= end:
            return (f"stale raise: received {at.isoformat()}, before the repair that "
                    f"ended at {end.isoformat()} retired the fault")
        if boot and _boot(alert) == boot:
            return f"stale raise: from boot {boot}, which the successful repair replaced"
    return None


def _attach(s: NodeState, alert: Alert, key: str, reason: str, outcome: AlertOutcome,
            defects: frozenset[str]) -> tuple[NodeState, list[Command]]:
    """Signal the open repair with ``alert``; the answer waits until the signal landed
    (:class:`AttachDone`), unless the ``attach_blind`` defect answers at once."""
    assert s.repair is not None
    rid = s.repair.repair_id
    cmds: list[Command] = [AttachAlert(repair_id=rid, alert=alert)]
    if "attach_blind" in defects:
        return s, [*cmds, _reply(alert, outcome, reason, rid)]
    pend = Attaching(alert=alert, key=key, repair_id=rid, reason=reason)
    return s.model_copy(update={"attaching": [*s.attaching, pend]}), cmds


def _on_raise(s: NodeState, alert: Alert, now: datetime, defects: frozenset[str]
              ) -> tuple[NodeState, list[Command | Tracked]]:
    key = fault_key(alert)
    at = received(alert, now, defects)
    stale = _stale_raise(s, alert, key, at)
    rid = s.repair.repair_id if s.repair else None
    if stale is not None:
        return s, [_reply(alert, AlertOutcome.ignored, stale, rid)]
    cat = s.catalogue or CatalogueConfig()
    occ = {k: list(v) for k, v in s.occurrences.items()}
    occ_key, rep_key = f"{alert.kind}:{alert.code}", "repeat:" + repeat_key(alert)
    for k in (occ_key, rep_key):
        times = [t for t in occ.pop(k, []) if (at - t).total_seconds() <= OCCURRENCE_TTL_S]
        occ[k] = [*times, at][-MAX_OCCURRENCES:]
    s = s.model_copy(update={"occurrences": _bounded(occ, MAX_OCCURRENCE_KEYS)})
    s, grace = _grace(s, alert, at)
    in_window = isinstance(alert.evidence.get(IN_MAINTENANCE), str)
    report: list[Command | Tracked] = []

    def decide(a: Alert) -> NodeActionDecision:
        return decide_node_action(
            a, cat,
            occurrences_in_window=count_in_window(occ[occ_key], at,
                                                  count_window_s(a.kind, a.code, cat)),
            repeats_same_gpu=count_in_window(occ[rep_key], at, cat.app_xid_repeat_window_s))

    dec = decide(alert)
    inside = _inside_window(s, alert, defects)
    if inside is not None and (judged := decide(inside[0])).actionable:
        # a level fault raised inside a window: a fault all the same, judged after it
        (alert, grace), dec = inside, judged
    if dec.actionable:
        sev = dec.severity or alert.severity
        alert = trim(alert.model_copy(update={"action": dec.action, "actionable": True,
                                              "severity": sev}))
        prev = s.active.get(key)
        active = dict(s.active)
        hold, why = (prev.held_until, prev.held_why) if prev else (None, "")
        if grace is not None and (hold is None or grace[0] > hold):
            hold, why = grace
        active[key] = Fault(alert=alert, action=dec.action, rule=dec.rule,
                            first_seen=prev.first_seen if prev else at, received=at,
                            held_until=hold, held_why=why,
                            reported=bool(prev and prev.reported))
        if (not (prev and prev.reported) and s.domains and not in_window
                and "unreported_domain_fault" not in defects):
            report = [_report(s, alert)]
            active[key] = active[key].model_copy(update={"reported": True})
        if len(active) > MAX_ACTIVE_FAULTS:
            drop = min(active, key=lambda k: (ACTION_WEIGHT[active[k].action],
                                              active[k].first_seen))
            active.pop(drop)
        s = s.model_copy(update={"active": active})
    if s.repair is not None:
        rep = s.repair
        if dec.actionable:
            s = s.model_copy(update={"repair": rep.model_copy(
                update={"alert_ids": [*rep.alert_ids, alert.alert_id]})})
        s, sent = _attach(s, alert, key, f"repair {rep.repair_id} in flight; {dec.reason}",
                          AlertOutcome.attached, defects)
        return s, [*report, *sent]
    if dec.diagnostic:
        dk = repeat_key(alert)
        last = s.diagnosed.get(dk)
        if last is not None and (at - last).total_seconds() < cat.app_xid_repeat_window_s:
            return s, [_reply(alert, AlertOutcome.ignored, "diagnostic validation already "
                              f"recommended at {last.isoformat()}")]
        diag = dict(s.diagnosed)
        diag.pop(dk, None)
        diag[dk] = at
        details = (f"node {alert.node} of {alert.cluster}: diagnostic validation recommended "
                   f"— {alert.summary}: {dec.reason}. Run `autorepair validate {alert.node}` "
                   "(no repair is started for this).")
        s = s.model_copy(update={
            "diagnosed": _bounded(diag, MAX_DIAGNOSED), "details": details,
            "diagnostics": [*s.diagnostics, alert.alert_id][-MAX_DIAGNOSTICS:]})
        return s, [SetDetails(text=details),
                   Notify(subject=f"diagnostic validation recommended for {alert.node}",
                          body=dec.reason, event="diagnostic_recommended"),
                   _reply(alert, AlertOutcome.recommended, dec.reason)]
    if not dec.actionable:
        return s, [_reply(alert, AlertOutcome.ignored, f"{dec.rule}: {dec.reason}")]
    # answered once every alert decidable now was decided (:func:`_drain`): a clear
    # queued behind it may end the fault before a repair would start
    return s, [*report, Tracked(alert=alert, key=key,
                                 text=f"{dec.action.value} recommended ({dec.rule})")]


def _report(s: NodeState, alert: Alert) -> ReportFault:
    return ReportFault(report=FaultReport(cluster=s.cluster, node=s.node,
                                          alert_id=alert.alert_id, kind=alert.kind,
                                          code=alert.code, domains=list(s.domains)))


def _inside_window(s: NodeState, alert: Alert, defects: frozenset[str]
                   ) -> tuple[Alert, tuple[datetime, str]] | None:
    """A level fault raised inside a maintenance window (the ``in_maintenance`` mark with
    the window's scheduled end, ``maintenance_until``): the alert without the mark, to
    be judged by the catalogue, and its hold — ``grace_s`` after that end, when it is
    recommended only if still raised (a GPU that did not come back from the planned
    reboot is repaired; one the agent clears meanwhile is not). None for an event fault
    (observed only: the maintenance's), a clear, or a mark with no end."""
    if not alert.level or not alert.active or "window_level_fault_forgotten" in defects:
        return None
    window = alert.evidence.get(IN_MAINTENANCE)
    until = alert.evidence.get(MAINTENANCE_UNTIL)
    if not isinstance(window, str) or not isinstance(until, str):
        return None
    try:
        end = _utc(datetime.fromisoformat(until))
    except ValueError:
        return None
    ev = {k: v for k, v in alert.evidence.items()
          if k not in (IN_MAINTENANCE, MAINTENANCE_REASON, MAINTENANCE_UNTIL)}
    hold = end + timedelta(seconds=s.grace_s)
    if "window_level_fault_unheld" in defects:
        return alert.model_copy(update={"evidence": ev}), (end - timedelta(days=1), "")
    return (alert.model_copy(update={"evidence": ev}),
            (hold, f"raised inside maintenance window {window} (scheduled to end "
                   f"{end.isoformat()}); judged again at the end of its grace period"))


def _grace_mark(alert: Alert) -> tuple[datetime, str] | None:
    """The ``in_grace`` mark ingest stamped (grace end, window id), None when absent or
    not a time (ingest removes a sender's: the mark is its own)."""
    v = alert.evidence.get(IN_GRACE)
    if not isinstance(v, str):
        return None
    try:
        end = _utc(datetime.fromisoformat(v))
    except ValueError:
        return None
    win = alert.evidence.get(MAINTENANCE_WINDOW)
    return end, win if isinstance(win, str) else "?"


def _grace(s: NodeState, alert: Alert, at: datetime
           ) -> tuple[NodeState, tuple[datetime, str] | None]:
    """The grace period a raise received at ``at`` falls in (its end and why), the
    node's grace view updated: a report inside a window records its boot id; a report
    from another boot, inside a window's grace or the node's, starts ``grace_s`` from
    its receipt (the node booted during or after the window). None: no grace applies."""
    boot = _boot(alert)
    if isinstance(alert.evidence.get(IN_MAINTENANCE), str):
        if boot and boot != s.maint_boot:
            s = s.model_copy(update={"maint_boot": boot})
        return s, None
    cands: list[tuple[datetime, str]] = []
    mark = _grace_mark(alert)
    if mark is not None and at < mark[0]:
        cands.append((mark[0], f"grace period after maintenance window {mark[1]}"))
    if s.grace_until is not None and at < s.grace_until:
        cands.append((s.grace_until, s.grace_why))
    if cands and boot and s.maint_boot and boot != s.maint_boot and s.grace_s > 0:
        cands.append((at + timedelta(seconds=s.grace_s),
                      f"grace period after boot {boot[:36]} (first reported "
                      f"{at.isoformat()}; boot {s.maint_boot[:36]} was reported inside "
                      "the maintenance window)"))
        s = s.model_copy(update={"maint_boot": boot})
    if not cands:
        return s, None
    end, why = max(cands, key=lambda c: c[0])
    if s.grace_until is None or end > s.grace_until:
        s = s.model_copy(update={"grace_until": end, "grace_why": why})
    return s, (end, why)


def _release(s: NodeState, now: datetime) -> tuple[NodeState, list[Command]]:
    """Drop the event faults whose grace hold ended without a recurrence (they were the
    maintenance's, not the machine's); a level fault still raised is due instead."""
    gone = [k for k, f in s.active.items() if f.held_until is not None
            and not f.alert.level and f.received < f.held_until <= now]
    if not gone:
        return s, []
    active = {k: f for k, f in s.active.items() if k not in gone}
    end = max(f.held_until for k, f in s.active.items()
              if k in gone and f.held_until is not None)
    text = (f"held {', '.join(gone)} dropped: not reported again after the grace period "
            f"ended {end.isoformat()} (policy.maintenance.grace_s)")
    s = s.model_copy(update={"active": active, "details": text})
    return s, [SetDetails(text=text)]


def _waiting(s: NodeState, key: str, now: datetime) -> str:
    if s.reconcile != Reconcile.done:
        return "waiting for the ledger before deciding (the node's open repair is unknown)"
    f = s.active.get(key)
    if f is not None and held(f, now):
        assert f.held_until is not None
        need = "still raised" if f.alert.level else "reported again"
        return (f"held: received in the {f.held_why}; recommended only if {need} after "
                f"{f.held_until.isoformat()} (policy.maintenance.grace_s)")
    if in_cooldown(s.cooldown_until, now):
        assert s.cooldown_until is not None
        return f"in cooldown until {s.cooldown_until.isoformat()}"
    if f is None:
        return "not active"
    due = f.first_seen + timedelta(seconds=persistence_for(f.alert, s.rails))
    return f"waiting for persistence until {due.isoformat()}"


def _on_clear(s: NodeState, alert: Alert, now: datetime, defects: frozenset[str]
              ) -> tuple[NodeState, list[Command]]:
    key = fault_key(alert)
    at = received(alert, now, defects)
    rid = s.repair.repair_id if s.repair else None
    cleared = dict(s.cleared)
    last = cleared.pop(key, None)
    cleared[key] = at if last is None else max(at, last)
    s = s.model_copy(update={"cleared": _bounded(cleared, MAX_CLEARED)})
    f = s.active.get(key)
    if f is not None and f.alert.level and f.received > at:
        return s, [_reply(alert, AlertOutcome.ignored, f"stale clear: received "
                          f"{at.isoformat()}, before the fault was raised again at "
                          f"{f.received.isoformat()}", rid)]
    active = dict(s.active)
    removed = active.pop(key, None)
    s = s.model_copy(update={"active": active})
    if rid is not None:
        return _attach(s, alert, key, f"clear attached to repair {rid}",
                       AlertOutcome.cleared, defects)
    if removed is not None:
        return s, [_reply(alert, AlertOutcome.cleared,
                          "fault cleared before action: recommendation auto-resolved")]
    return s, [_reply(alert, AlertOutcome.cleared, "no active fault to clear")]


def _after_gone(s: NodeState, p: Attaching, now: datetime) -> Reply:
    """The answer for an alert whose repair turned out gone before it landed."""
    if p.alert.active:
        return _reply(p.alert, AlertOutcome.new,
                      f"repair {p.repair_id} had ended; {_waiting(s, p.key, now)}")
    return _reply(p.alert, AlertOutcome.cleared,
                  f"fault cleared; repair {p.repair_id} had ended")


def _on_attach(s: NodeState, ev: AttachDone, now: datetime
               ) -> tuple[NodeState, list[Command]]:
    mine = [p for p in s.attaching if p.alert.alert_id == ev.alert_id]
    if not mine:
        return s, []
    p = mine[0]
    if ev.ok:
        rest = [q for q in s.attaching if q is not p]
        out = AlertOutcome.attached if p.alert.active else AlertOutcome.cleared
        return (s.model_copy(update={"attaching": rest}),
                [_reply(p.alert, out, p.reason, p.repair_id)])
    if s.repair is None or s.repair.repair_id != p.repair_id:
        rest = [q for q in s.attaching if q is not p]
        return s.model_copy(update={"attaching": rest}), [_after_gone(s, p, now)]
    # the repair's workflow is closed: held until the probe says how it ended
    failed = [q for q in s.attaching if q is not p]
    s = s.model_copy(update={"attaching": [*failed, p.model_copy(update={"failed": True})]})
    if s.probe_out:  # the probe out answers this attach too
        return s.model_copy(update={"probe_out": "attach"}), []
    return (s.model_copy(update={"probe_out": "attach"}),
            [ProbeRepair(repair_id=p.repair_id)])


def _on_probe(s: NodeState, ev: RepairProbed, now: datetime
              ) -> tuple[NodeState, list[Command]]:
    purpose = s.probe_out
    s = s.model_copy(update={"probe_out": ""})
    cmds: list[Command] = []
    ours = s.repair is not None and s.repair.repair_id == ev.repair_id
    if ours and ((ev.ok and not ev.running) or (not ev.ok and purpose == "attach")):
        s, cmds = _gone(s, ev.repair_id, ev.status or "closed", now)
    failed = [p for p in s.attaching if p.failed]
    if failed:
        s = s.model_copy(update={"attaching": [p for p in s.attaching if not p.failed]})
        for p in failed:
            if s.repair is not None and s.repair.repair_id == p.repair_id:
                out = AlertOutcome.attached if p.alert.active else AlertOutcome.cleared
                cmds.append(_reply(p.alert, out, f"repair {p.repair_id} in flight",
                                   p.repair_id))
            else:
                cmds.append(_after_gone(s, p, now))
    return s, cmds


def _on_ledger(s: NodeState, ev: LedgerRead, now: datetime, defects: frozenset[str]
               ) -> tuple[NodeState, list[Command]]:
    early = s.finished_early
    # a read of the node's open repair (not of the repair carried): a start may follow in
    # this step without reading again (_evaluate)
    s = s.model_copy(update={"reconcile": Reconcile.done, "ledger_tries": 0,
                             "finished_early": {}, "checked": s.repair is None})
    cmds: list[Command] = []
    rid = ev.repair_id
    ours = s.repair.repair_id if s.repair is not None else None
    last = ev.last
    if (last is not None and not s.ended and last.stage in TERMINAL_STAGES
            and last.repair_id not in early and last.repair_id not in (rid, ours)):
        # a fresh entity (it applied no repair's end yet): the node's newest ended repair,
        # whose end a predecessor applied (or never told of), is applied as a repair
        # this node did not start — its cooldown holds and a success retires what it
        # fixed, so a late or re-delivered report of that episode starts nothing (I20)
        s = _foreign_finish(s, last)
    for msg in early.values():
        if msg.repair_id not in (rid, ours):
            s = _foreign_finish(s, msg)
    if rid is None:
        if s.repair is not None:  # the ledger has no open repair: ours is gone
            if ours in early:
                return _finish(s, early[ours], defects), []
            s, cmds = _gone(s, s.repair.repair_id, ev.status or "not_found", now)
        return s, cmds
    if s.repair is None and ev.running and rid in s.ended:
        # it told us it finished (applied already): its workflow is closing
        return s, []
    if s.repair is None and ev.running:
        if rid in early:  # it told us it finished: the ledger's "running" is behind
            s = s.model_copy(update={"repair": OpenRepair(repair_id=rid)})
            return _finish(s, early[rid], defects), []
        # the faults taken while the ledger was unknown are this repair's evidence: they
        # join it (their deliveries were answered `new`, waiting for the ledger)
        alerts = [f.alert for f in s.active.values()]
        s = s.model_copy(update={
            "repair": OpenRepair(repair_id=rid, probed_at=now,
                                 alert_ids=[a.alert_id for a in alerts]),
            "details": f"repair {rid} in flight (found in the ledger)"})
        # the raises that made a repair due while the node knew its ledger (read again
        # before the start: a person's or a detector's repair started meanwhile) are
        # answered `attached` once their signal landed
        waiting = {t.alert.alert_id for t in s.checking}
        cmds = [SetDetails(text=s.details),
                *(AttachAlert(repair_id=rid, alert=a) for a in alerts
                  if a.alert_id not in waiting)]
        held, s = s.checking, s.model_copy(update={"checking": []})
        for t in held:
            s, sent = _attach(s, t.alert, t.key, f"repair {rid} in flight (found in the "
                              "ledger)", AlertOutcome.attached, defects)
            cmds += sent
        return s, cmds
    if ev.running:
        return s, []
    if s.repair is not None and s.repair.repair_id == rid:
        if rid in early:
            return _finish(s, early[rid], defects), []
        return _gone(s, rid, ev.status, now)
    if ev.stage and ev.stage not in {t.value for t in TERMINAL_STAGES}:
        return s, [_close(rid, ev.status, now)]
    return s, []


def _on_delivered(s: NodeState, alert: Alert, now: datetime
                  ) -> tuple[NodeState, list[Command]]:
    """Take ``alert``: a duplicate is answered at once; a new one is remembered (stamped
    ``received_at`` = ``now`` when nothing stamped it), recorded and queued for its
    decision (:func:`_drain`)."""
    digest = seen_digest(alert.alert_id)
    if digest in s.seen:
        rid = s.repair.repair_id if s.repair else None
        return s, [_reply(alert, AlertOutcome.deduplicated, "alert id already delivered", rid)]
    if alert.received_at is None:
        # I17: an alert that did not pass through ingest (a scheduler watcher's, an
        # operator's) is stamped with the control plane's clock at delivery, so the
        # ledger, the repair's recurrence and the breaker reset judge it on that, never
        # on the sender's observed_at
        alert = alert.model_copy(update={"received_at": _utc(now)})
    seen = dict(s.seen)
    seen[digest] = bucket(now)
    horizon = bucket(now - timedelta(seconds=DEDUP_TTL_S))
    while seen and (len(seen) > DEDUP_MAX or next(iter(seen.values())) < horizon):
        seen.pop(next(iter(seen)))
    s = s.model_copy(update={"seen": seen, "intake": [*s.intake, alert],
                             "unrecorded": [*s.unrecorded, alert.alert_id]})
    return s, [RecordAlert(alert=alert)]


def _policy_stale(s: NodeState, now: datetime) -> bool:
    return (s.catalogue is None or s.policy_at is None
            or (now - s.policy_at).total_seconds() >= POLICY_REFRESH_S)


def _drain(s: NodeState, now: datetime, defects: frozenset[str]
           ) -> tuple[NodeState, list[Command]]:
    """Decide the queued alerts, oldest first, while the oldest is recorded, the policy
    is fresh, the ledger has answered (or failed: I21, then decided as waiting) and no
    earlier alert waits for its repair to take it."""
    cmds: list[Command] = []
    tracked: list[Tracked] = []
    while s.intake:
        if _policy_stale(s, now):
            if not s.policy_out:
                s = s.model_copy(update={"policy_out": True})
                cmds.append(LoadPolicy())
            break
        head = s.intake[0]
        if (head.alert_id in s.unrecorded or s.attaching
                or s.reconcile in (Reconcile.pending, Reconcile.reading)):
            break
        if (head.machine_id is not None and s.machine_id is not None
                and head.machine_id != s.machine_id and s.policy_at is not None
                and (now - s.policy_at).total_seconds() >= MACHINE_RECHECK_S):
            # ingest filed it under another machine than the binding last read (the node
            # was re-registered): the binding is read again before it is decided, so its
            # repair is filed under the machine configured now (at most every
            # MACHINE_RECHECK_S: a sender that stamps the configured machine, not the
            # ledger's binding — a scheduler watcher — does not make every alert a read)
            s = s.model_copy(update={"policy_at": None})
            continue
        s = s.model_copy(update={"intake": s.intake[1:]})
        if head.active:
            s, out = _on_raise(s, head, now, defects)
        else:
            s, cl = _on_clear(s, head, now, defects)
            out = list(cl)
        for c in out:
            if isinstance(c, Tracked):
                tracked.append(c)
            else:
                cmds.append(c)
    if tracked or (s.checking and s.reconcile not in (Reconcile.pending,
                                                      Reconcile.reading)):
        s, started = _evaluate(s, now, defects)
        cmds += started
        if s.reconcile == Reconcile.reading:
            # the ledger is read again before the start: answered once it answered
            return s.model_copy(update={"checking": [*s.checking, *tracked]}), cmds
        tracked, s = [*s.checking, *tracked], s.model_copy(update={"checking": []})
        for t in tracked:
            if s.repair is not None and t.key in s.repair.acted_on:
                cmds.append(_reply(t.alert, AlertOutcome.recommended, t.text,
                                   s.repair.repair_id))
            else:
                why = _waiting(s, t.key, now)
                cmds.append(_reply(t.alert, AlertOutcome.new, why))
                if why.startswith("held:") and s.details != f"{t.key} {why}":
                    s = s.model_copy(update={"details": f"{t.key} {why}"})
                    cmds.append(SetDetails(text=s.details))
    return s, cmds


def _on_policy(s: NodeState, ev: PolicyLoaded, now: datetime, defects: frozenset[str]
               ) -> tuple[NodeState, list[Command]]:
    """A policy read: its catalogue and rails apply from now on (a changed catalogue
    judges the active faults again, :func:`_rejudge`). A node whose configured
    machine changed (re-registered: another machine bound to it) starts the new
    machine's record afresh — faults, counts, clears and retirements of the old machine
    are not the new one's — and people are told (alerts and repairs are filed under the
    configured machine)."""
    update: dict[str, object] = {"catalogue": ev.catalogue, "rails": ev.rails,
                                 "policy_at": now, "policy_out": False,
                                 "grace_s": ev.grace_s, "domains": sorted(ev.domains),
                                 "machine_id": ev.machine_id, "node_pool": ev.node_pool}
    if s.cooldown_until is not None and ev.rails.cooldown_s != s.rails.cooldown_s:
        # the running cooldown is timed by the rails read now, from the same end: one
        # set before the first read (a fresh entity applying the ledger's last repair)
        # was timed by the defaults, 1800 s, whatever the configuration says
        ended = s.cooldown_until - timedelta(seconds=s.rails.cooldown_s)
        update["cooldown_until"] = cooldown_until(ended, ev.rails)
    cmds: list[Command] = []
    prev = s.catalogue
    old = s.history_machine
    if ev.machine_id is not None:
        update["history_machine"] = ev.machine_id
    if (old is not None and ev.machine_id is not None and ev.machine_id != old
            and "inherit_machine_history" not in defects):
        # the new machine's own faults stay: ingest filed them under it (the configured
        # binding), and they may have been decided before this read saw the re-binding
        # (the agent does not report a level fault again)
        mine = {k: f for k, f in s.active.items() if f.alert.machine_id == ev.machine_id}
        update |= {"active": mine, "occurrences": {}, "cleared": {}, "retired": {},
                   "diagnosed": {}, "booted_at": None}
        cmds.append(Notify(
            subject=f"{s.node} re-registered: machine {old} → {ev.machine_id}",
            body=f"The faults and history of machine {old} are not carried over to "
            f"{ev.machine_id}; its ledger history stays filed under {old}.",
            severity="info", event="cluster_alert"))
    s = s.model_copy(update=update)
    if prev is not None and ev.catalogue != prev:
        s, more = _rejudge(s, ev.catalogue)
        cmds += more
    return s, cmds


def _rejudge(s: NodeState, cat: CatalogueConfig) -> tuple[NodeState, list[Command]]:
    """The active faults judged again under the catalogue ``cat`` just read (rule zero: a
    repair starts on what the policy in force calls actionable): a fault it no longer
    acts on is dropped, one it maps to another action takes that action. Counts are the
    ones at the fault's receipt (a count no longer carried counts as met: it was when the
    fault was taken)."""
    active: dict[str, Fault] = {}
    dropped: list[str] = []
    for k, f in s.active.items():
        a = f.alert
        occ = s.occurrences.get(f"{a.kind}:{a.code}")
        rep = s.occurrences.get("repeat:" + repeat_key(a))
        dec = decide_node_action(
            a, cat,
            occurrences_in_window=1_000_000 if occ is None else count_in_window(
                occ, f.received, count_window_s(a.kind, a.code, cat)),
            repeats_same_gpu=1 if rep is None else count_in_window(
                rep, f.received, cat.app_xid_repeat_window_s))
        if not dec.actionable:
            dropped.append(f"{k} ({dec.rule}: {dec.reason})")
            continue
        if dec.action != f.action:
            f = f.model_copy(update={"action": dec.action, "rule": dec.rule,
                                     "alert": a.model_copy(update={"action": dec.action})})
        active[k] = f
    if not dropped and active == s.active:
        return s, []
    text = ("policy changed: active faults judged again"
            + (f"; no longer acted on: {', '.join(dropped)}" if dropped else ""))
    s = s.model_copy(update={"active": active, "details": text})
    return s, [SetDetails(text=text)]


def step(state: NodeState, event: Event, now: datetime,
         defects: frozenset[str] = frozenset()) -> tuple[NodeState, list[Command]]:
    """Decide ``event`` in ``state`` at ``now`` (the control plane's clock, UTC): the next
    state and the commands to execute, in order. Pure: same input, same output. After
    every event the queued alerts are decided as far as they can be (:func:`_drain`), a
    due repair starts and the one timer is re-armed to :func:`next_deadline` (a
    ``SetTimer`` when it changed). Raises nothing for valid events."""
    now = _utc(now)
    s, cmds = _step(state, event, now, defects)
    if not any(isinstance(c, ContinueAsNew) for c in cmds):
        s, dropped = _release(s, now)
        cmds += dropped
        s, drained = _drain(s, now, defects)
        s, more = _evaluate(s, now, defects)
        s, timer = _timer(s, now)
        cmds = [*cmds, *drained, *more, *timer]
    if s.checked:  # the ledger's answer is good for this step only
        s = s.model_copy(update={"checked": False})
    return s, cmds


def _step(s: NodeState, ev: Event, now: datetime, defects: frozenset[str]
          ) -> tuple[NodeState, list[Command]]:
    rc = s.reconcile
    if isinstance(ev, Clock):
        return s, []
    if isinstance(ev, Begin):
        if rc == Reconcile.pending:
            rid = s.repair.repair_id if s.repair else None
            return (s.model_copy(update={"reconcile": Reconcile.reading}),
                    [ReadLedger(repair_id=rid)])
        return s, []
    if isinstance(ev, AlertDelivered):
        return _on_delivered(s, ev.alert, now)
    if isinstance(ev, AlertRecorded):
        return s.model_copy(update={
            "unrecorded": [a for a in s.unrecorded if a != ev.alert_id]}), []
    if isinstance(ev, PolicyLoaded):
        return _on_policy(s, ev, now, defects)
    if isinstance(ev, PolicyFailed):
        cat = s.catalogue or CatalogueConfig()
        s = s.model_copy(update={
            "catalogue": cat, "policy_at": now, "policy_out": False,
            "details": f"policy read failed ({ev.message}); deciding on the last read "
                       "policy (or the built-in defaults) until the next read"})
        return s, [SetDetails(text=s.details),
                   Notify(subject=f"policy read failed for {s.node}", body=ev.message,
                          event="cluster_alert")]
    if isinstance(ev, AttachDone):
        return _on_attach(s, ev, now)
    if isinstance(ev, RepairProbed):
        return _on_probe(s, ev, now)
    if isinstance(ev, FaultReportFailed):
        if ev.retried:  # the guard could not be started: its lease requests still count
            return s, [SetDetails(text=f"fault {ev.report.alert_id} not reported to the "
                                       f"guard of {s.cluster}: no guard answers")]
        return s, [StartGuard(), ReportFault(report=ev.report, retried=True)]
    if isinstance(ev, LedgerRead):
        if rc != Reconcile.reading:
            return s, []  # not asked (a late answer of a lost read)
        return _on_ledger(s, ev, now, defects)
    if isinstance(ev, LedgerUnavailable):
        if rc != Reconcile.reading:
            return s, []
        tries = s.ledger_tries + 1
        wait = min(LEDGER_RETRY_S[0] * 2 ** (tries - 1), LEDGER_RETRY_S[1])
        at = now + timedelta(seconds=wait)
        s = s.model_copy(update={
            "reconcile": Reconcile.retry_wait, "ledger_tries": tries, "timer_at": at,
            "details": f"ledger unavailable ({ev.message or 'read failed'}); retry {tries} "
                       f"in {wait:g} s before deciding"})
        return s, [SetDetails(text=s.details), SetTimer(at=at)]
    if isinstance(ev, TimerFired):
        if rc == Reconcile.retry_wait:
            rid = s.repair.repair_id if s.repair else None
            return (s.model_copy(update={"reconcile": Reconcile.reading, "timer_at": None}),
                    [ReadLedger(repair_id=rid)])
        s = s.model_copy(update={"timer_at": None})
        if rc == Reconcile.done and s.repair is not None and not s.probe_out:
            probed = s.repair.probed_at
            if probed is None or (now - probed).total_seconds() >= REPAIR_PROBE_S:
                rep = s.repair.model_copy(update={"probed_at": now})
                return s.model_copy(update={"repair": rep, "probe_out": "periodic"}), [
                    ProbeRepair(repair_id=rep.repair_id)]
        return s, []
    if isinstance(ev, HistoryFull):
        if not quiescent(s):
            return s, []  # offered again once nothing is being decided
        return s, [ContinueAsNew(state=carry(s))]
    if isinstance(ev, RepairStarted):
        return s, []
    if isinstance(ev, RepairFinishedEv):
        msg = Finished(repair_id=ev.repair_id, stage=ev.stage, at=ev.at,
                       alert_ids=ev.alert_ids, actions=ev.actions,
                       machine_held=ev.machine_held,
                       unjudged_alert_ids=ev.unjudged_alert_ids)
        if s.repair is not None and s.repair.repair_id == ev.repair_id:
            return _finish(s, msg, defects), []
        if ev.repair_id in s.gone:
            return _late_finish(s, msg, defects), []
        if ev.repair_id in s.ended:
            return s, []  # applied already (a repeated message)
        if rc != Reconcile.done:
            if len(s.finished_early) < MAX_FINISHED_EARLY:
                early = dict(s.finished_early)
                early[ev.repair_id] = msg
                return s.model_copy(update={"finished_early": early}), []
            return s, []
        # a repair of this node we did not start (a person's, a detector's): it acted on
        # the machine all the same; applied as when it arrives before the ledger read
        return _foreign_finish(s, msg), []
    if isinstance(ev, RepairEnded):
        if s.repair is not None and s.repair.repair_id == ev.repair_id:
            return _gone(s, ev.repair_id, ev.how, now)
        return s, []
    raise AssertionError(f"event: {ev!r} is not a node event")  # pragma: no cover


#: The transition table: (reconcile status, event kind) → what :func:`step` decides, in
#: words. docs/lifecycle.md is generated from it; ``tests/model`` checks every pair is
#: listed. After every event (but continue-as-new) the queued alerts are decided as far
#: as they can be, a due repair starts when the ledger is known, none is open and the
#: cooldown is over, and the timer is re-armed.
TRANSITIONS: dict[tuple[Reconcile, str], str] = {}


def _table() -> None:
    for rc in Reconcile:
        known = rc == Reconcile.done
        waiting = rc in (Reconcile.pending, Reconcile.reading)
        TRANSITIONS[(rc, "begin")] = ("→ reading: ask the ledger (repair carried or fresh)"
                                      if rc == Reconcile.pending else "ignored")
        TRANSITIONS[(rc, "alert_delivered")] = (
            "seen id → `deduplicated` at once; else remembered, recorded in the ledger and "
            "queued" + ("; decided once the ledger answers or fails (I21)" if waiting else
                        "; decided in order once recorded and the policy is fresh (read "
                        "again first for an alert filed under another machine than the "
                        "binding last read): stale "
                        "(at/before a clear, before a success that retired it, from the "
                        "boot it replaced) → ignored; inside a maintenance window → "
                        "observed only (its boot id noted), a level fault held to "
                        "`grace_s` after the window's scheduled end (recommended only if "
                        "still raised then); in a grace period after one "
                        "(the `in_grace` mark, or a first report from another boot "
                        "within it: `grace_s` from then) → held to the grace end; "
                        "catalogue decides; open repair → "
                        "signalled, `attached` once it landed; diagnostic → notify once "
                        "per window; actionable → tracked from its receipt time, repair "
                        "started once persistence is over, right after the ledger's open "
                        "repair of the node is read again (one running — a person's, a "
                        "detector's — is taken over and the alert attached to it)" + (
                            "" if known else " (none while the ledger is unavailable: "
                            "`new`, waiting for the ledger)")))
        TRANSITIONS[(rc, "alert_recorded")] = "the alert may be decided (queued order kept)"
        TRANSITIONS[(rc, "policy_loaded")] = (
            "catalogue and rails apply (a changed catalogue judges the active faults "
            "again: one it no longer acts on dropped, one it maps to another action "
            "takes it; a changed cooldown times the running one from the same "
            "end); another machine bound to the node → the old "
            "machine's faults and history dropped (faults ingest filed under the new "
            "machine kept), people told")
        TRANSITIONS[(rc, "policy_failed")] = (
            "the last read policy (else the built-in defaults) decides until the next "
            "read; people told")
        TRANSITIONS[(rc, "attach_done")] = (
            "landed → `attached` (`cleared` for a clear); the repair's workflow closed → "
            "probe it (answer held); the repair already ended → answered as without one")
        TRANSITIONS[(rc, "repair_started")] = "nothing (the repair was opened when asked for)"
        TRANSITIONS[(rc, "repair_finished")] = (
            "ours → cooldown (not after auto_resolved), used event faults dropped; "
            "succeeded (or shadowed: the action it stood for) → acted-on faults retired, "
            "every fault received before its end after a booting action, except one "
            "reported from another boot or after the repair's last check (unjudged: it "
            "stays open; I20); rejected → the faults it stood for set aside until "
            "reported again (not proposed again every cooldown); refused "
            "because the machine is held for RMA (I18) → the faults it stood for set "
            "aside until reported again; ours closed before it came (the probe, the "
            "ledger or the child's end first) → applied as ours; not ours (a person's, a "
            "detector's) → cooldown, and on success the faults received before its end "
            "retired (after only non-booting actions: the ones it names)" if known else
            "ours (or ours closed before it came) → as when known; not ours → kept until "
            "the ledger answers")
        TRANSITIONS[(rc, "repair_ended")] = ("ours → cooldown, ledger closed (not after "
                                             "`completed`), lease released, warning sent; "
                                             "else ignored")
        TRANSITIONS[(rc, "repair_probed")] = (
            "ours not running (or, for a failed attach, not answering) → ended without "
            "finishing (as repair_ended); held answers of failed attaches given")
        TRANSITIONS[(rc, "ledger_read")] = (
            "→ done: a fresh entity applies the node's newest ended repair as one it "
            "did not start (cooldown; a success retires what it fixed); running repair "
            "adopted (or finished, if it told us early; raises "
            "waiting on the read before a start attached to it); ours gone → closed out "
            "with a warning; stale open row → closed; queued alerts decided; none open "
            "→ a due repair starts at once"
            if rc == Reconcile.reading else "ignored: no read is out")
        TRANSITIONS[(rc, "ledger_unavailable")] = (
            "→ retry_wait: timer 5 s doubling to 60 s; queued alerts answered `new` "
            "(waiting for the ledger); no repair meanwhile (I21)"
            if rc == Reconcile.reading else "ignored: no read is out")
        TRANSITIONS[(rc, "fault_report_failed")] = (
            "first try → start the cluster's guard and report again; second → noted in "
            "the details (the repair's lease request still counts for its domain)")
        TRANSITIONS[(rc, "timer")] = {
            Reconcile.retry_wait: "→ reading: ask the ledger again",
            Reconcile.done: "open repair → probe it every 15 min; else due faults decided "
            "(a held level fault still raised at its grace end is due; a held event "
            "fault not reported again is dropped)",
        }.get(rc, "nothing")
        TRANSITIONS[(rc, "history_full")] = (
            "continue as new carrying the whole state (policy read again; the ledger too "
            "if a repair is open or it was not yet known); deferred while an alert is "
            "being decided or a read is out")
        TRANSITIONS[(rc, "clock")] = "nothing: time alone is judged at the timer"


_table()
