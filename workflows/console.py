"""What the Temporal UI shows for each workflow: static summary and details (Temporal user
metadata, ``static_summary=`` / ``static_details=`` at start) and current details.

The Temporal UI is the operator's console (docs/design.md §4.4: signals and inputs a person can
type): the workflow list shows each run's summary, the detail page its details and the
current details the workflow keeps up to date. Every place that starts a workflow builds
its text here:

- :func:`repair_summary` / :func:`repair_details` — ``RepairWorkflow`` (NodeWorkflow
  child, repair API);
- :func:`node_summary` / :func:`node_details` — ``NodeWorkflow`` (ingest update-with-start);
- :func:`guard_summary` / :func:`guard_details` — ``ClusterGuardWorkflow``;
- :func:`validation_summary` / :func:`validation_details` — ``ValidationWorkflow``;
- :func:`waiting_details` — current details of a stage that waits (what for, until when).

Pure and deterministic (no clock, no I/O): safe inside workflow code. Summaries are one
line of at most :data:`SUMMARY_MAX` characters, details at most :data:`DETAILS_MAX`
(Temporal markdown); neither carries credentials — only alert text, names and ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from workflows.models import Alert, RepairRequest, RequesterKind, ValidationRequest

SUMMARY_MAX = 200
"""Longest summary kept, characters: one line of the workflow list (Temporal limits user
metadata summaries to a few hundred bytes)."""
DETAILS_MAX = 8000
"""Longest details kept, characters (well under Temporal's user-metadata size limit)."""
EVIDENCE_MAX = 5
"""Alerts quoted in a repair's details; the rest are counted."""
LINE_MAX = 300
"""Longest quoted evidence line, characters."""
RUNBOOK = "docs/runbook.md"
"""The operator runbook, relative to the project root (linked by section title)."""
SEP = " · "


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` with ``…``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _cap(text: str) -> str:
    return text if len(text) <= DETAILS_MAX else text[: DETAILS_MAX - 1] + "…"


def _fault(req: RepairRequest) -> str:
    """The fault in words: the requester's own reason for a person's or a detector's
    request (their evidence record only restates it), else the first active alert's
    summary, else the reason."""
    if req.requester.kind != RequesterKind.system and req.reason.strip():
        return req.reason
    active = [a for a in req.alerts if a.active] or list(req.alerts)
    if active:
        return active[0].summary
    return req.reason or "no alert cited"


def _requester(req: RepairRequest) -> str:
    who = f"{req.requester.kind.value} {req.requester.name}"
    if (req.requester.kind == RequesterKind.detector and req.detector
            and req.detector != req.requester.name):
        who += f" (detector {req.detector})"
    return who


def _evidence_lines(alerts: Sequence[Alert]) -> list[str]:
    lines: list[str] = []
    for a in alerts[:EVIDENCE_MAX]:
        code = f" {a.code}" if a.code is not None else ""
        head = (f"- `{a.kind}{code}` {a.severity.value} on {a.node}"
                f"{f' GPU {a.gpu}' if a.gpu else ''}, observed "
                f"{a.observed_at.isoformat(timespec='seconds')}: {_one_line(a.summary, LINE_MAX)}")
        lines.append(head)
        if a.evidence_text:
            lines.append(f"  `{_one_line(a.evidence_text, LINE_MAX)}`")
    if len(alerts) > EVIDENCE_MAX:
        lines.append(f"- and {len(alerts) - EVIDENCE_MAX} more alert(s)")
    return lines


# ---------------------------------------------------------------------- repairs
def repair_summary(req: RepairRequest) -> str:
    """One line for the workflow list: ``ACTION NODE · FAULT · requested by WHO``, e.g.
    ``power_cycle gpu-03 · Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-03 · requested by
    system autorepair``. The stage is not here (a static summary never changes): it is in
    the current details."""
    text = SEP.join((f"{req.action.value} {req.node}", _fault(req),
                     f"requested by {_requester(req)}"))
    return _one_line(text, SUMMARY_MAX)


def repair_details(req: RepairRequest) -> str:
    """Markdown for the detail page: what, where, who asked, the rule behind it, the
    evidence (each alert's summary and raw line, at most :data:`EVIDENCE_MAX`), and how
    to approve, reject or cancel (CLI and signal), with the runbook section."""
    machine = f" (machine {req.machine_id})" if req.machine_id else ""
    lines = [
        f"**{req.action.value}** on node **{req.cluster}/{req.node}**{machine}",
        f"Repair id: `{req.repair_id}`",
        f"Requested by: {_requester(req)}"
        + (f", request id `{req.request_id}`" if req.request_id else ""),
        f"Rule: {_one_line(req.reason, LINE_MAX) or 'none given'}",
    ]
    if req.auto_approved_rule:
        lines.append(f"Approval: automatic ({req.auto_approved_rule})")
    lines += ["", f"**Evidence** ({len(req.alerts)} alert(s))", *(
        _evidence_lines(req.alerts) or ["- none cited (operator or detector request)"])]
    lines += [
        "",
        "**Decide** (while it waits for approval): "
        f"`autorepair repairs approve {req.repair_id}` · `reject` · `cancel`, or signal "
        '`approve` with `{"by": "YOU"}`, `reject` / `cancel` with `{"by": "YOU", "reason": "…"}`',
        f"Runbook: {RUNBOOK}, section *Approve, reject, cancel a repair*",
    ]
    return _cap("\n".join(lines))


def waiting_details(what: str, until: datetime | None = None, stage: str = "") -> str:
    """Current details of a step that waits: ``STAGE: waiting for WHAT until UNTIL``
    (``until`` in UTC ISO 8601 seconds; left out when unbounded)."""
    head = f"{stage}: " if stage else ""
    bound = f" until {until.isoformat(timespec='seconds')}" if until else " (no deadline)"
    return _one_line(f"{head}waiting for {what}{bound}", SUMMARY_MAX * 2)


# ------------------------------------------------------------------------ nodes
def node_summary(cluster: str, node: str, first: Alert | None = None) -> str:
    """``node NODE · cluster C · first alert: SUMMARY`` for a NodeWorkflow."""
    parts = [f"node {node}", f"cluster {cluster}"]
    if first is not None:
        parts.append(f"first alert: {first.summary}")
    return _one_line(SEP.join(parts), SUMMARY_MAX)


def node_details(cluster: str, node: str, first: Alert | None = None) -> str:
    """What a NodeWorkflow is and the alert that started it."""
    lines = [
        f"Health entity of node **{cluster}/{node}**: collects its alerts, recommends "
        "repairs (child `RepairWorkflow`s) and keeps cooldowns.",
        "Query `status` for the active alerts and the repair in flight.",
    ]
    if first is not None:
        lines += ["", "**Started by**", *_evidence_lines([first])]
    return _cap("\n".join(lines))


# ------------------------------------------------------------------------ guard
def guard_summary(cluster: str) -> str:
    """``cluster guard C · repair budget and circuit breaker``."""
    return _one_line(f"cluster guard {cluster}{SEP}repair budget and circuit breaker",
                     SUMMARY_MAX)


def guard_details(cluster: str) -> str:
    """How to read and reset the guard of ``cluster``."""
    return _cap("\n".join([
        f"Grants repair leases in cluster **{cluster}** within the concurrency budget and "
        "trips the circuit breaker on a burst of automatic repairs.",
        f"State: `autorepair breaker status --cluster {cluster}` or query `status`.",
        f"Close the breaker: `autorepair breaker reset --cluster {cluster}` or signal "
        '`reset_breaker` with `{"by": "YOU", "reason": "…"}`.',
        f"Runbook: {RUNBOOK}, section *The circuit breaker*",
    ]))


# ------------------------------------------------------------------- validation
def validation_summary(req: ValidationRequest) -> str:
    """``validate MACHINE · cluster C · REASON · requested by WHO``."""
    parts = [f"validate {req.machine}", f"cluster {req.cluster}", req.reason,
             f"requested by {req.requested_by}"]
    if req.repair_id:
        parts.append(f"repair {req.repair_id}")
    return _one_line(SEP.join(p for p in parts if p), SUMMARY_MAX)


def validation_details(req: ValidationRequest) -> str:
    """What the validation runs and what each verdict does."""
    node = f" (node {req.node})" if req.node and req.node != req.machine else ""
    return _cap("\n".join([
        f"Re-validation of machine **{req.machine}**{node} in cluster **{req.cluster}**: "
        "GPU, NCCL, InfiniBand and storage checks (`autorepair-agent validate`).",
        f"Requested by {req.requested_by}: {_one_line(req.reason, LINE_MAX)}"
        + (f" (repair `{req.repair_id}`)" if req.repair_id else ""),
        f"passed → back to the {req.return_to}; failed → hardware ticket, machine stays out; "
        "aborted → prior state restored, nothing condemned.",
        "Query `status` for the stage and the job id.",
        f"Runbook: {RUNBOOK}, section *Validate a machine*",
    ]))
