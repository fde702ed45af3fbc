"""Alert building: one reader event → one evidence-carrying :class:`~workflows.models.Alert`.

Pure and sandbox-safe: no I/O, no clock (callers pass times), no globals mutated.
:func:`alert_from_fault` gives an alert a stable id, a stable one-line summary, a
plain-language description and an evidence payload carrying the catalogue mnemonic.

What an alert means for its node — count-in-window thresholds and app-level repeats on
one GPU/GPC (both docs/design.md §5 catalogue), persistence from the first observation, cooldown —
is decided by the ``NodeWorkflow`` with :mod:`workflows.policy`.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from workflows.catalogue import CatalogueEntry, entry_for
from workflows.config import CatalogueConfig
from workflows.models import Action, Alert

_CODE_KEY = {"xid": "xid", "sxid": "sxid"}


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _nonempty(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: must be a non-empty string, got {value!r}")
    return value


def make_alert_id(
    cluster: str,
    node: str,
    kind: str,
    code: int | None,
    gpu: str | None,
    evidence_text: str,
    observed_at: datetime,
) -> str:
    """``sha256`` hex of cluster/node/kind/code/gpu/evidence_text/observed_at (UTC ISO).

    The same observation always gets the same id, so re-deliveries de-duplicate."""
    parts = [
        cluster,
        node,
        kind,
        "" if code is None else str(code),
        gpu or "",
        evidence_text,
        _utc(observed_at).isoformat(),
    ]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "replace")).hexdigest()


def summarize(
    kind: str,
    code: int | None,
    gpu: str | None,
    mnemonic: str,
    evidence: dict[str, Any],
    node: str | None = None,
) -> str:
    """Stable one-line summary (no timestamps, pids or counters).

    E.g. ``"Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-01 GPU 0000:c6:00"``,
    ``"Xid 13 ROBUST_CHANNEL_GR_EXCEPTION on GPU 0000:cb:00 GPC 7 TPC 7"``,
    ``"slurm_node SLURM_NODE_STATE on gpu-03: IDLE+DRAIN (gres/gpu count …)"``.
    """
    if kind == "xid":
        head = f"Xid {code} {mnemonic}"
    elif kind == "sxid":
        head = f"SXid {code} {mnemonic}"
    else:
        head = f"{kind} {mnemonic}" if code is None else f"{kind} {code} {mnemonic}"
    where = f" on {node}" if node else ""
    if gpu:
        what = "NVSwitch" if kind == "sxid" else "GPU"
        if kind.startswith(("pcie", "ib", "nic")):
            what = "device"
        where += f" {what} {gpu}"
    extra: list[str] = []
    ev = evidence or {}
    if "gpc" in ev and "tpc" in ev:
        extra.append(f"GPC {ev['gpc']} TPC {ev['tpc']}")
    if kind in ("xid", "sxid") and "link" in ev:
        sev = f"{ev['severity']} " if ev.get("severity") else ""
        sub = f"{ev['subunit']} " if ev.get("subunit") else ""
        extra.append(f"{sub}{sev}link {ev['link']}".strip())
    if "recovery_action" in ev:
        extra.append(f"recovery action {ev['recovery_action']}")
    if "caused_by_xid" in ev:
        extra.append(f"caused by Xid {ev['caused_by_xid']}")
    if kind in ("ib_link_down", "ib_link_up") and ev.get("device"):
        extra.append(f"{ev['device']}" + (f" port {ev['port']}" if "port" in ev else ""))
    if kind == "dcgm_diag" and isinstance(ev.get("failed"), list) and ev["failed"]:
        gpus = ev.get("failed_gpus")
        on = f" on GPU {', '.join(str(g) for g in gpus)}" if isinstance(gpus, list) and gpus else ""
        extra.append("failed " + ", ".join(str(t) for t in ev["failed"]) + on)
    if kind == "nic_fatal":
        nic = " ".join(str(ev[k]) for k in ("device", "nic_event", "module_error") if ev.get(k))
        extra.append(nic)
    if kind in ("xfs_shutdown", "ext4_readonly") and ev.get("device"):
        extra.append(str(ev["device"]))
    if kind == "nvsmi" and isinstance(ev.get("flags"), list):
        extra.append(", ".join(str(f) for f in ev["flags"]))
    if kind == "slurm_node":
        state = ev.get("state")
        st = "+".join(str(s) for s in state) if isinstance(state, list) else str(state or "")
        reason = ev.get("reason")
        extra.append(st + (f" ({reason})" if reason else ""))
    if kind == "hung_task" and ev.get("process"):
        extra.append(f"task {ev['process']}")
    if kind == "oom_kill" and ev.get("process"):
        extra.append(f"killed {ev['process']}")
    if kind in ("gsp_heartbeat", "reset_required") and "gpu_index" in ev and not gpu:
        extra.append(f"GPU{ev['gpu_index']}")
    if kind == "nccl_slow_rank" and ev.get("comm"):
        extra.append(f"NCCL communicator {ev['comm']}")
    if kind == "slurm_node" and not node and ev.get("node"):
        where = f" on {ev['node']}"
    line = head + where
    if extra:
        line += ": " + "; ".join(x for x in extra if x)
    return " ".join(line.split())[:300]


def describe(
    entry: CatalogueEntry, kind: str, code: int | None, evidence: dict[str, Any], gpu: str | None
) -> str:
    """Plain-language description: the catalogue text plus where and who."""
    parts = [entry.description]
    if gpu:
        parts.append(f"Device: {gpu}.")
    proc = evidence.get("process")
    pid = evidence.get("pid")
    if proc or pid:
        who = proc or "unknown process"
        parts.append(f"Process: {who}" + (f" (pid {pid})." if pid else "."))
    if "caused_by_xid" in evidence:
        parts.append(f"It is a consequence of Xid {evidence['caused_by_xid']} on the same GPU.")
    if entry.app_level:
        parts.append("Application-level: no node repair by itself.")
    elif entry.actionable:
        when = (
            f" after {entry.count} occurrences within {int(entry.window_s)} s"
            if entry.count > 1
            else ""
        )
        parts.append(f"Recommended action: {entry.action.value}{when}.")
    else:
        parts.append("No node action.")
    return " ".join(parts)


def alert_from_fault(
    *,
    cluster: str,
    node: str,
    kind: str,
    code: int | None,
    gpu: str | None,
    evidence_text: str,
    evidence: dict[str, Any],
    observed_at: datetime,
    catalogue: CatalogueConfig,
    machine_id: str | None = None,
    node_pool: str | None = None,
    active: bool = True,
    level: bool = False,
    source: str = "agent",
) -> Alert:
    """Build the :class:`Alert` for one observed fault.

    ``evidence`` is the reader's kind-specific payload (as sent in OTLP attributes); the
    result's ``evidence`` adds ``mnemonic``, ``xid``/``sxid`` (code) and ``pci`` (``gpu``).
    ``alert_id`` is :func:`make_alert_id`; ``summary`` is :func:`summarize` (stable);
    ``severity``/``actionable``/``action``/``mnemonic`` come from
    :func:`workflows.catalogue.entry_for` with ``catalogue`` — an annotation: the
    ``NodeWorkflow`` decides again under the worker's policy. A cleared level fault
    (``active=False``) is never actionable.

    Raises ``ValueError`` naming the field for an empty ``cluster``/``node``/``kind``, a
    negative ``code`` or a non-dict ``evidence``.
    """
    _nonempty("cluster", cluster)
    _nonempty("node", node)
    _nonempty("kind", kind)
    if not isinstance(evidence, dict):
        raise ValueError(f"evidence: must be a dict, got {type(evidence).__name__}")
    if not isinstance(observed_at, datetime):
        raise ValueError(f"observed_at: must be a datetime, got {observed_at!r}")
    entry = entry_for(kind, code, evidence, catalogue)
    payload: dict[str, Any] = dict(evidence)
    payload["mnemonic"] = entry.mnemonic
    if code is not None:
        payload[_CODE_KEY.get(kind, "code")] = code
    if gpu is not None:
        payload.setdefault("pci", gpu)
    if not entry.mapped:
        payload["unmapped"] = True
    return Alert(
        alert_id=make_alert_id(cluster, node, kind, code, gpu, evidence_text, observed_at),
        cluster=cluster,
        node=node,
        machine_id=machine_id,
        node_pool=node_pool,
        kind=kind,
        code=code,
        gpu=gpu,
        severity=entry.severity,
        mnemonic=entry.mnemonic,
        actionable=entry.actionable and active,
        action=entry.action if active else Action.none,
        summary=summarize(kind, code, gpu, entry.mnemonic, payload, node),
        description=describe(entry, kind, code, payload, gpu),
        evidence_text=evidence_text,
        evidence=payload,
        level=level,
        active=active,
        source=source,
        observed_at=observed_at,
    )
