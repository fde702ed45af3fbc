"""Request and response bodies of the repair intake and its HTTP API (``/api/v1/repairs``).

Field rules are enforced by pydantic (a malformed body answers 422 naming the field);
``extra="forbid"`` on request bodies, so a misspelt field is an error, not ignored. Every
text field is text the ledger can store (:data:`STORABLE`), and ``detected_at`` a time that
exists in UTC, so a request that passes validation cannot fail in PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from workflows.downtime import Downtime
from workflows.models import Action, Alert, RepairStatus
from workflows.names import MAX_NAME_LEN, NAME_PATTERN


class RepairMode(StrEnum):
    """What an external request may ask for (docs/design.md §4.1 ``--mode``)."""

    reboot = "reboot"
    reprovision = "reprovision"
    migrate = "migrate"
    remove = "remove"


#: Detector names: ``user:NAME`` and the like. Node and cluster names follow the one rule
#: of :mod:`workflows.names` (``NAME_PATTERN``), the same as OTLP decode.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"
STORABLE = r"^[^\x00]*$"
"""Pattern of free text the ledger stores: no U+0000, which PostgreSQL ``text`` and
``jsonb`` cannot hold (PostgreSQL docs, "Character Types"). pydantic checks a pattern on
Rust strings, so a lone surrogate (not encodable in UTF-8) fails the same field
(``string_unicode``). Also the pattern of the API's text query and path parameters."""


def in_utc(at: datetime | None) -> datetime | None:
    """``at`` as an aware UTC time (a naive time is taken as UTC).

    Raises ``ValueError`` when the UTC time falls outside the years 1-9999 (e.g.
    ``9999-12-31T23:59:59-14:00``), which neither Python nor the ledger can hold."""
    if at is None:
        return None
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    try:
        return at.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{at.isoformat()} is outside the years 1-9999 in UTC") from None


_Text = Annotated[str, Field(pattern=STORABLE)]


class RepairCreate(BaseModel):
    """Body of ``POST /api/v1/repairs``.

    ``request_id`` with ``detector`` is the idempotency key (forever). ``detector``
    defaults to the token's user for the detector role and to ``user:<name>`` for an
    operator. ``evidence_alert`` cites a ledger alert id; ``evidence_run`` names a
    health-check run of the detector. ``detected_at``: when the fault was detected
    (default: now). ``cluster`` may be left out when the node belongs to exactly one
    configured cluster (or only one is configured).
    """

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)
    mode: RepairMode
    request_id: _Text = Field(min_length=1, max_length=256)
    reason: _Text = Field(min_length=1, max_length=4000)
    detector: str | None = Field(None, min_length=1, max_length=128, pattern=_NAME)
    cluster: str | None = Field(None, min_length=1, max_length=MAX_NAME_LEN,
                                pattern=NAME_PATTERN)
    evidence_alert: _Text | None = Field(None, min_length=1, max_length=256)
    evidence_run: _Text | None = Field(None, min_length=1, max_length=256)
    detected_at: Annotated[datetime | None, AfterValidator(in_utc)] = None


class DecisionBody(BaseModel):
    """Body of approve / reject / cancel: a reason and, for approve, an action override."""

    model_config = ConfigDict(extra="forbid")

    reason: _Text = Field("", max_length=4000)
    action: Action | None = None

    @field_validator("action")
    @classmethod
    def _an_action_to_run(cls, v: Action | None) -> Action | None:
        if v == Action.none:
            raise ValueError("'none' is not an action to run; leave `action` out to approve "
                             "the action the repair proposes, or reject the repair")
        return v


class TransitionView(BaseModel):
    """One recorded stage transition."""

    stage: str
    at: datetime
    by: str
    reason: str = ""


class RepairView(BaseModel):
    """A repair as the API shows it (ledger row, transitions, live workflow status).

    ``state``: ``awaiting_approval``, ``in_progress`` or the terminal stage name
    (the ``RepairState`` search attribute values).
    """

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    action: str
    stage: str
    state: str
    requester_kind: str
    requester_name: str
    detector: str | None = None
    request_id: str | None = None
    reason: str = ""
    approved_by: str | None = None
    decided_by_rule: str | None = None
    alert_ids: list[str] = Field(default_factory=list)
    workflow_id: str | None = None
    created_at: datetime
    updated_at: datetime
    transitions: list[TransitionView] = Field(default_factory=list)
    live: RepairStatus | None = None
    #: Downtime and cost once the repair ended (``repair_downtime``); None before.
    downtime: Downtime | None = None
    #: Evidence captured before its disruptive actions (``repair_evidence``, oldest
    #: first): ``{"action", "attempt", "node", "bmc", "notes", "summary", "captured_at"}``
    #: with ``node``/``bmc`` the ``workflows.evidence`` NodeCapture / BmcCapture JSON.
    evidence: list[dict[str, Any]] = Field(default_factory=list)


class CreateResult(BaseModel):
    """Answer of a create: ``created`` false for a retried key; ``refused`` with
    ``refused_reason`` when the request was recorded as refused (detector cap, remove)."""

    created: bool
    refused: bool = False
    refused_reason: str = ""
    repair: RepairView


class RepairList(BaseModel):
    """Answer of ``GET /api/v1/repairs``."""

    repairs: list[RepairView]


class AlertList(BaseModel):
    """Answer of ``GET /api/v1/alerts``: recorded alerts, newest first."""

    alerts: list[Alert]


_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, field: str = "for") -> float:
    """A duration (``90m``, ``2h``, ``1d``, ``30s`` or plain seconds) in seconds. Raises
    ``ValueError`` naming ``field`` and the value when it is not one or is not positive."""
    raw = text.strip().lower()
    units = {"s": 1, **_UNITS}
    try:
        if raw[-1:] in units and raw[:-1].replace(".", "", 1).isdecimal():
            seconds = float(raw[:-1]) * units[raw[-1]]
        else:
            seconds = float(raw)
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a duration (30m, 2h, 1d or seconds)"
                         ) from None
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{field}: {text!r} must be a positive duration")
    return seconds


class MaintenanceCreate(BaseModel):
    """Body of ``POST /api/v1/maintenance``: exactly one of ``pool``, ``nodes``, ``all``;
    ``for``: the duration (``2h``, ``90m``, seconds), at most ``policy.maintenance.max_s``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    cluster: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN)
    pool: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN)
    nodes: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN,
                                     pattern=NAME_PATTERN)]] | None = Field(
        None, min_length=1, max_length=10_000)
    all: bool = False
    duration: str = Field(alias="for", min_length=1, max_length=32)
    reason: _Text = Field(min_length=1, max_length=1000)

    @field_validator("nodes")
    @classmethod
    def _each_node_once(cls, v: list[str] | None) -> list[str] | None:
        """Each node once, in the order given (a repeat was stored and listed twice)."""
        return list(dict.fromkeys(v)) if v is not None else None

    @model_validator(mode="after")
    def _one_scope(self) -> MaintenanceCreate:
        given = [k for k, v in (("pool", self.pool), ("nodes", self.nodes), ("all", self.all))
                 if v]
        if len(given) != 1:
            raise ValueError("scope: give exactly one of pool, nodes, all (got "
                             f"{', '.join(given) or 'none'})")
        parse_duration(self.duration)
        return self


def parse_since(text: str, now: datetime) -> datetime:
    """Start of a report window: a duration back from ``now`` (``90m``, ``24h``, ``7d``,
    ``2w``; at most 366 days) or an ISO 8601 time (UTC when it names no zone); aware UTC.

    Raises ``ValueError`` naming the value when it is neither, when the start falls
    outside the years 1-9999 in UTC, or when it is not before ``now`` (the window's end: a
    window running backwards would report nothing as "no repairs")."""
    raw = text.strip()
    unit = raw[-1:].lower()
    if unit in _UNITS and raw[:-1].isdecimal() and raw[:-1].isascii():
        seconds = int(raw[:-1]) * _UNITS[unit]
        if not 0 < seconds <= 366 * 86400:
            raise ValueError(f"since: {text!r} must be between 1m and 366d")
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise ValueError(f"since: {text!r} before {now.isoformat()} is before the "
                             "year 1") from None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"since: {text!r} is neither a duration (7d, 24h, 90m, 2w) nor an "
                         "ISO 8601 time") from None
    try:
        utc = in_utc(at)
    except ValueError as e:
        raise ValueError(f"since: {e}") from None
    assert utc is not None
    if utc >= now:
        raise ValueError(f"since: {text!r} is not before the end of the window "
                         f"({now.isoformat()})")
    return utc
