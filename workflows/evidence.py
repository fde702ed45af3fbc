"""Evidence captured before a disruptive action: the ``capture_evidence`` activity's input
and result (docs/design.md §5 "evidence capture before a disruptive action: bounded, never
blocks"). Pure models, no I/O.

The repair calls ``ACT.capture_evidence`` with :class:`EvidenceCaptureInput` before an
action of ``policy.evidence_capture.actions`` and gets an :class:`EvidenceCapture` back:
what the node-side job wrote (:class:`NodeCapture`) and the BMC's System Event Log entries
(:class:`BmcCapture`), either ``None`` with the reason in ``notes`` when it could not be
captured. The activity never fails the repair for a capture it could not make; it raises
only for invalid input: a field this module rejects (pydantic, naming the field and
value) or a cluster the worker does not know (non-retryable ``ERR_UNKNOWN_NODE``). The
repair records the result with ``ACT.ledger_record_evidence`` (:class:`EvidenceRecord`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from workflows.config import EvidenceCaptureConfig
from workflows.models import Action

NODE_TOOLS = ("nvidia-bug-report", "fallback")
"""``NodeCapture.tool``: ``nvidia-bug-report`` (NVIDIA's ``nvidia-bug-report.sh`` ran) or
``fallback`` (``nvidia-smi -q``, the kernel log since boot and the NVML counters)."""
ACTIVITY_MARGIN_S = 30.0
"""Seconds the workflow's ``start_to_close_timeout`` of ``capture_evidence`` adds to
``timeout_s`` (the activity bounds itself by ``timeout_s``; the margin covers a worker's
scheduling and the placement's clean-up after the bound)."""
SUMMARY_ENTRIES = 3
"""SEL entries quoted in :meth:`EvidenceCapture.summary` (the newest)."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[A-Za-z0-9._:@/-]{1,200}$")


class SelEntry(BaseModel):
    """One System Event Log entry as Redfish ``LogEntry`` gives it (DSP0268 ``LogEntry``:
    ``Id``, ``Created``, ``Severity`` OK | Warning | Critical, ``Message``, ``EntryType``,
    ``SensorType``, ``MessageId``); absent fields are ``None``."""

    id: str
    created: str | None = None
    severity: str | None = None
    message: str = ""
    entry_type: str | None = None
    sensor_type: str | None = None
    message_id: str | None = None


class NodeCapture(BaseModel):
    """The archive the node-side job wrote: ``path`` on the node, ``size_bytes``, its
    ``sha256`` (hex), the ``tool`` that made it (:data:`NODE_TOOLS`), when (UTC)."""

    path: str
    size_bytes: int = Field(ge=0)
    sha256: str
    tool: Literal["nvidia-bug-report", "fallback"]
    collected_at: datetime

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not _SHA256.match(v):
            raise ValueError(f"sha256: {v!r} is not 64 lower-case hex digits")
        return v


class BmcCapture(BaseModel):
    """The newest System Event Log entries of the machine's BMC, newest first; ``source``
    names the Redfish log service read (``SEL``, ``Log1``, … ; ``Managers/…`` prefixed
    when the manager's log was the fallback)."""

    entries: list[SelEntry] = Field(default_factory=list)
    source: str
    collected_at: datetime


class EvidenceCaptureInput(BaseModel):
    """What to capture: before ``action`` of repair ``repair_id`` on ``cluster``/``node``
    (``machine_id``: the machine under it, whose BMC is read; ``None`` = the node name),
    within ``timeout_s`` seconds in all, the last ``bmc_entries`` SEL entries, the archive
    under ``dir`` on the node; ``attempt``: the repair's action attempt (1 = first), part
    of the ledger key with ``repair_id`` and ``action``."""

    cluster: str
    node: str
    machine_id: str | None = None
    repair_id: str
    action: Action
    timeout_s: float = Field(300.0, gt=0, le=3600)
    bmc_entries: int = Field(50, ge=0, le=1000)
    dir: str = "/var/lib/autorepair/evidence"
    attempt: int = Field(1, ge=1)

    @field_validator("repair_id")
    @classmethod
    def _repair_id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"repair_id: {v!r} is not a repair id (letters, digits, ._:@/-)")
        return v

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v or "\n" in v:
            raise ValueError(f"dir: {v!r} is not an absolute path")
        return v


class EvidenceCapture(BaseModel):
    """What was captured: ``node`` (``None`` = not captured), ``bmc`` (``None`` = not
    captured), ``notes`` (why not, or what was partial; one sentence each)."""

    node: NodeCapture | None = None
    bmc: BmcCapture | None = None
    notes: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        """One line for a notification or a ticket, e.g. ``evidence: node archive
        /var/…/r1.tar.gz (1.2 MiB, sha256 3f2a…, nvidia-bug-report); BMC SEL 50 entries
        (newest: Critical "Uncorrectable ECC")``; notes follow after ``; ``."""
        parts: list[str] = []
        if self.node is not None:
            n = self.node
            parts.append(f"node archive {n.path} ({n.size_bytes / 1048576:.1f} MiB, "
                         f"sha256 {n.sha256[:12]}…, {n.tool})")
        if self.bmc is not None:
            b = self.bmc
            newest = "; ".join(f'{e.severity or "?"} "{e.message[:80]}"'
                               for e in b.entries[:SUMMARY_ENTRIES])
            parts.append(f"BMC {b.source} {len(b.entries)} entries"
                         + (f" (newest: {newest})" if newest else ""))
        parts.extend(self.notes)
        return "evidence: " + ("; ".join(parts) if parts else "none captured")


class EvidenceRecord(BaseModel):
    """``ledger_record_evidence`` input: the capture of repair ``repair_id`` before
    ``action`` (attempt ``attempt``); the ledger keeps one row per the three."""

    repair_id: str
    action: Action
    attempt: int = Field(1, ge=1)
    capture: EvidenceCapture
    at: datetime


def capture_input(
    cfg: EvidenceCaptureConfig, *, cluster: str, node: str, machine_id: str | None,
    repair_id: str, action: Action, attempt: int = 1,
) -> EvidenceCaptureInput | None:
    """The ``capture_evidence`` input the repair sends before ``action`` under
    ``policy.evidence_capture`` (``cfg``), or ``None`` when nothing is to be captured
    (disabled, or ``action`` not in ``cfg.actions``). Pure; for the repair machine.
    The activity's ``start_to_close_timeout`` is ``timeout_s`` + :data:`ACTIVITY_MARGIN_S`."""
    if not cfg.applies_to(action):
        return None
    return EvidenceCaptureInput(cluster=cluster, node=node, machine_id=machine_id,
                                repair_id=repair_id, action=action, timeout_s=cfg.timeout_s,
                                bmc_entries=cfg.bmc_entries, dir=cfg.dir, attempt=attempt)
