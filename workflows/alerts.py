"""Alert building and pure per-node alert state (count windows, bursts, level edges).

Pure and sandbox-safe: no I/O, no clock (callers pass times), no globals mutated. The
state classes hold plain JSON data (:meth:`to_json` / :meth:`from_json`) so a
``NodeWorkflow`` can keep them and carry them across continue-as-new.

- :func:`alert_from_fault` turns one reader event (kind, code, GPU, evidence) into an
  :class:`~workflows.models.Alert` with a stable id, a stable one-line summary, a
  plain-language description and an evidence payload carrying the catalogue mnemonic.
- :class:`CountWindow` counts occurrences per key in a sliding window (scenario 9:
  "Xid 43 counts after 5 occurrences in 10 minutes on one node") and de-duplicates bursts.
- :class:`LevelTracker` keeps raise/clear edges of level faults; the persistence window
  counts from the first observation and is not reset by re-reports.
- :func:`decide` combines them: what one delivered alert means for the node (record only,
  duplicate, recommend an action, or recommend a diagnostic validation run).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from workflows.catalogue import CatalogueEntry, lookup
from workflows.config import CatalogueConfig
from workflows.models import Action, Alert

DEFAULT_BURST_S = 10.0
"""Repeats of the same fault (same kind, code, GPU and summary) within this many seconds
are one burst and count once: the driver prints one fault as several lines within a few
seconds (one per channel/TPC), and kernel printk rate limiting uses a 5 s interval."""

MAX_TIMES_PER_KEY = 1000
"""Bound on remembered occurrences per key (state stays small across continue-as-new)."""

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
        if kind.startswith(("pcie", "ib")):
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
    :func:`workflows.catalogue.lookup` with ``catalogue``. A cleared level fault
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
    entry = lookup(kind, code, evidence, catalogue)
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


def count_key(kind: str, code: int | None) -> str:
    """Key of a per-node count-in-window threshold: ``"xid/43"``, ``"hung_task/-"``."""
    return f"{kind}/{'-' if code is None else code}"


def repeat_key(kind: str, code: int | None, gpu: str | None, evidence: dict[str, Any]) -> str:
    """Key for app-level repeats on the same GPU (and GPC when the Xid names one)."""
    gpc = evidence.get("gpc")
    return f"{count_key(kind, code)}/{gpu or '-'}" + ("" if gpc is None else f"/gpc{gpc}")


def burst_key(alert: Alert) -> str:
    """Key of one fault for burst de-duplication: kind, code, GPU and stable summary."""
    return f"{count_key(alert.kind, alert.code)}/{alert.gpu or '-'}/{alert.summary}"


@dataclass
class CountWindow:
    """Sliding-window occurrence counts per key (pure; JSON state).

    ``times[key]`` holds sorted observation times in seconds since the epoch (UTC).
    """

    times: dict[str, list[float]] = field(default_factory=dict)

    def observe(self, key: str, at: float, window_s: float) -> int:
        """Record one occurrence at ``at`` and return how many fall in ``(at-window_s, at]``.

        Raises ``ValueError`` naming the field for a non-positive ``window_s``."""
        if not window_s > 0:
            raise ValueError(f"window_s: must be > 0, got {window_s!r}")
        ts = self.times.setdefault(key, [])
        ts.append(float(at))
        if len(ts) > 1 and ts[-2] > ts[-1]:
            ts.sort()
        return self._trim(key, at, window_s)

    def count(self, key: str, at: float, window_s: float) -> int:
        """Occurrences of ``key`` in ``(at-window_s, at]`` without recording one."""
        return sum(1 for t in self.times.get(key, []) if at - window_s < t <= at)

    def last(self, key: str) -> float | None:
        """Time of the latest occurrence of ``key``, or None."""
        ts = self.times.get(key)
        return ts[-1] if ts else None

    def _trim(self, key: str, at: float, window_s: float) -> int:
        ts = self.times[key]
        n = sum(1 for t in ts if at - window_s < t <= at)
        if len(ts) > MAX_TIMES_PER_KEY:
            del ts[: len(ts) - MAX_TIMES_PER_KEY]
        return n

    def prune(self, now: float, keep_s: float) -> None:
        """Forget occurrences older than ``now - keep_s`` (call with the longest window)."""
        for key in list(self.times):
            kept = [t for t in self.times[key] if t > now - keep_s]
            if kept:
                self.times[key] = kept
            else:
                del self.times[key]

    def to_json(self) -> dict[str, Any]:
        """``{"times": {key: [seconds, ...]}}``."""
        return {"times": {k: list(v) for k, v in self.times.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> CountWindow:
        """Inverse of :meth:`to_json`; ``None`` gives an empty window.

        Raises ``ValueError`` naming the field for malformed data."""
        if not data:
            return cls()
        raw = data.get("times")
        if not isinstance(raw, dict):
            raise ValueError(f"times: must be an object of lists, got {raw!r}")
        out: dict[str, list[float]] = {}
        for k, v in raw.items():
            if not isinstance(v, list):
                raise ValueError(f"times.{k}: must be a list of seconds, got {v!r}")
            out[str(k)] = sorted(float(x) for x in v)
        return cls(times=out)


@dataclass
class LevelState:
    """One level fault: first/last observation (seconds) and whether it is active."""

    first_seen: float
    last_seen: float
    active: bool = True


@dataclass
class LevelTracker:
    """Raise/clear edges of level faults per key (pure; JSON state)."""

    levels: dict[str, LevelState] = field(default_factory=dict)

    def observe(self, key: str, at: float, active: bool) -> str | None:
        """Record a report; returns ``"raise"``, ``"clear"`` or None (no edge).

        Re-reports of an active fault keep ``first_seen``; a clear forgets it, so the next
        raise starts a new persistence window."""
        st = self.levels.get(key)
        if active:
            if st is None or not st.active:
                self.levels[key] = LevelState(first_seen=at, last_seen=at)
                return "raise"
            st.last_seen = max(st.last_seen, at)
            return None
        if st is not None and st.active:
            del self.levels[key]
            return "clear"
        return None

    def persisted(self, key: str, now: float, persistence_s: float) -> bool:
        """True when ``key`` is active and was first seen at least ``persistence_s`` ago."""
        st = self.levels.get(key)
        return bool(st and st.active and now - st.first_seen >= persistence_s)

    def to_json(self) -> dict[str, Any]:
        """``{"levels": {key: {"first_seen", "last_seen", "active"}}}``."""
        return {
            "levels": {
                k: {"first_seen": v.first_seen, "last_seen": v.last_seen, "active": v.active}
                for k, v in self.levels.items()
            }
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LevelTracker:
        """Inverse of :meth:`to_json`. Raises ``ValueError`` naming the field when malformed."""
        if not data:
            return cls()
        raw = data.get("levels")
        if not isinstance(raw, dict):
            raise ValueError(f"levels: must be an object, got {raw!r}")
        out: dict[str, LevelState] = {}
        for k, v in raw.items():
            try:
                out[str(k)] = LevelState(
                    first_seen=float(v["first_seen"]),
                    last_seen=float(v["last_seen"]),
                    active=bool(v.get("active", True)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"levels.{k}: malformed level state {v!r}") from exc
        return cls(levels=out)


@dataclass
class AlertState:
    """Everything :func:`decide` keeps per node (JSON via :meth:`to_json`)."""

    counts: CountWindow = field(default_factory=CountWindow)
    levels: LevelTracker = field(default_factory=LevelTracker)

    def to_json(self) -> dict[str, Any]:
        """``{"counts": CountWindow JSON, "levels": LevelTracker JSON}``."""
        return {"counts": self.counts.to_json(), "levels": self.levels.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> AlertState:
        """Inverse of :meth:`to_json`."""
        data = data or {}
        return cls(
            counts=CountWindow.from_json(data.get("counts")),
            levels=LevelTracker.from_json(data.get("levels")),
        )


@dataclass
class AlertDecision:
    """What one alert means for its node.

    - ``duplicate``: part of a burst already counted (recorded, not counted again).
    - ``count``: occurrences in the entry's window (or the app-level repeat window).
    - ``recommend``: the node action to recommend now, or None.
    - ``diagnose``: recommend a diagnostic validation run (app-level repeats, scenario 2).
    - ``edge``: ``"raise"``/``"clear"`` for level faults, else None.
    - ``reason``: one line for logs and the ledger.
    """

    duplicate: bool
    count: int
    recommend: Action | None
    diagnose: bool
    edge: str | None
    reason: str
    root_xid: int | None = None


def decide(
    alert: Alert,
    state: AlertState,
    catalogue: CatalogueConfig,
    *,
    persistence_s: float = 0.0,
    burst_s: float = DEFAULT_BURST_S,
) -> AlertDecision:
    """Update ``state`` with ``alert`` and say what it means (pure apart from ``state``).

    Event faults: a repeat within ``burst_s`` of the same burst key is a duplicate.
    App-level Xids never recommend a node action; when the same GPU (and GPC) repeats
    ``catalogue.app_xid_repeat_count`` times within ``app_xid_repeat_window_s`` (or the
    code's own override count/window), ``diagnose`` is True. Actionable faults recommend
    their action once ``count`` occurrences fall inside ``window_s``. Level faults record
    raise/clear edges and recommend only after ``persistence_s`` from the first
    observation (re-reports do not reset it); a clear never recommends. A secondary Xid
    naming its root ("caused by previous Xid N") is attached to the root (``root_xid``)
    and never counted on its own.
    """
    at = _utc(alert.observed_at).timestamp()
    entry = lookup(alert.kind, alert.code, alert.evidence, catalogue)
    if alert.level:
        key = f"{count_key(alert.kind, alert.code)}/{alert.gpu or '-'}"
        edge = state.levels.observe(key, at, alert.active)
        if not alert.active:
            return AlertDecision(False, 0, None, False, edge, "level fault cleared")
        if entry.actionable and state.levels.persisted(key, at, persistence_s):
            return AlertDecision(
                False, 1, entry.action, False, edge, f"level fault persisted {persistence_s:.0f} s"
            )
        return AlertDecision(
            False,
            1,
            None,
            False,
            edge,
            "level fault raised" if edge else "level fault still active",
        )
    root = alert.evidence.get("caused_by_xid")
    if alert.kind == "xid" and isinstance(root, int):
        return AlertDecision(
            False,
            0,
            None,
            False,
            None,
            f"secondary Xid: attached to root Xid {root}",
            root_xid=root,
        )
    bkey = "burst/" + burst_key(alert)
    last = state.counts.last(bkey)
    state.counts.observe(bkey, at, max(burst_s, 1e-9))
    if last is not None and 0 <= at - last < burst_s:
        return AlertDecision(True, 0, None, False, None, "duplicate within burst")
    if entry.app_level:
        ov = catalogue.xid.get(alert.code) if alert.kind == "xid" and alert.code else None
        need = ov.count if ov is not None and ov.count > 1 else catalogue.app_xid_repeat_count
        window = (
            ov.window_s if ov is not None and ov.count > 1 else catalogue.app_xid_repeat_window_s
        )
        n = state.counts.observe(
            repeat_key(alert.kind, alert.code, alert.gpu, alert.evidence), at, window
        )
        if n >= need:
            return AlertDecision(
                False,
                n,
                None,
                True,
                None,
                f"application-level Xid repeated {n}x on the same GPU within "
                f"{window:.0f} s: diagnostic run",
            )
        return AlertDecision(False, n, None, False, None, "application-level: recorded only")
    n = state.counts.observe(count_key(alert.kind, alert.code), at, entry.window_s)
    if not entry.actionable:
        reason = "recorded (no action mapping)" if not entry.mapped else "recorded (no action)"
        return AlertDecision(False, n, None, False, None, reason)
    if n >= entry.count:
        return AlertDecision(
            False, n, entry.action, False, None, f"{n} occurrence(s) within {entry.window_s:.0f} s"
        )
    return AlertDecision(
        False,
        n,
        None,
        False,
        None,
        f"{n} of {entry.count} occurrences within {entry.window_s:.0f} s",
    )
