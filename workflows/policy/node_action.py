"""Does this alert drive an action on its node? Decided once, in the ``NodeWorkflow``.

:func:`decide_node_action` looks the alert's fault up in the catalogue
(:func:`workflows.catalogue.entry_for`) under the *worker's* policy — operator overrides
and count-in-window thresholds included — and applies the node-level rules: a clear is
never actionable, a secondary Xid follows its root, a straggler (or a late NCCL rank) asks
for diagnostics, application-level Xids never repair a node (their repeats on one GPU/GPC
recommend a diagnostic run). The ``action``/``actionable`` ingest stamped on the alert are an
annotation only and are not read here, with one exception that only ever lowers the
outcome: an alert ingest marked **observed only** because its node is outside the
inventory (``evidence["inventory"] == "unknown"``, :data:`UNKNOWN_INVENTORY`, set by
``ingest.inventory.observed``) is final: no recommendation, repair or notification.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.catalogue import entry_for
from workflows.catalogue.vocabulary import APP_LEVEL_XIDS, DIAGNOSTIC_XIDS, override_for
from workflows.config import CatalogueConfig
from workflows.maintenance import IN_MAINTENANCE
from workflows.models import Action, Alert, Severity

SLOW_KINDS: dict[str, str] = {
    "straggler": "health score below the straggler threshold",
    "nccl_slow_rank": "a rank on this node persistently arrives last at its NCCL collectives",
}
"""Kinds that say a node is slow (docs/design.md §1 rule zero: slow is not failed), with the reason
text of their diagnostic recommendation."""

UNKNOWN_INVENTORY = "unknown"
"""``Alert.evidence["inventory"]`` of an alert about a node outside the inventory
(``ingest.inventory.UNKNOWN``): observed only, on every path (issue 27 item 0)."""


@dataclass(frozen=True)
class NodeActionDecision:
    """Outcome of :func:`decide_node_action`.

    ``action``: the node-level action (``Action.none`` when not actionable);
    ``actionable``: whether the alert may become a repair recommendation;
    ``rule``: which rule decided (e.g. ``"xid:79:default"``, ``"xid:43:override"``);
    ``reason``: plain-language why; ``diagnostic``: True when repeats of an
    application Xid on one GPU/GPC (or a straggler) ask for a diagnostic validation run;
    ``severity``: the catalogue's severity under the worker's policy (None for a clear).
    """

    action: Action
    actionable: bool
    rule: str
    reason: str
    diagnostic: bool = False
    severity: Severity | None = None


def repeat_key(alert: Alert) -> str:
    """Key under which repeats of one fault on one node are counted.

    Shape ``"{kind}:{code}:{gpu}:{gpc}"``; ``gpc`` comes from ``alert.evidence["gpc"]``
    (or ``"tpc"``) when the classifier found one, else empty.
    """
    gpc = alert.evidence.get("gpc") or alert.evidence.get("tpc") or ""
    return f"{alert.kind}:{alert.code}:{alert.gpu or ''}:{gpc}"


def count_in_window(times: Iterable[datetime], now: datetime, window_s: float) -> int:
    """Number of ``times`` within ``window_s`` seconds before (and including) ``now``."""
    start = now - timedelta(seconds=window_s)
    return sum(1 for t in times if start <= t <= now)


def decide_node_action(
    alert: Alert,
    cat: CatalogueConfig,
    occurrences_in_window: int = 1,
    repeats_same_gpu: int = 1,
) -> NodeActionDecision:
    """Decide whether ``alert`` drives a node action under ``cat`` (the worker's
    ``policy.catalogue``).

    ``occurrences_in_window``: occurrences of the same kind/code on this node within the
    window of :func:`~workflows.catalogue.vocabulary.count_window_s` (the caller counts,
    this one included). ``repeats_same_gpu``: occurrences of the same application Xid on
    the same GPU/GPC within ``cat.app_xid_repeat_window_s``.

    Order: clear → node inside a maintenance window (``evidence["in_maintenance"]``,
    stamped on delivery by ``ingest.maintenance_marks``: observed only, final) → node
    outside the inventory (observed only, final) → operator override
    (action/actionable/count) → secondary Xid → straggler or late NCCL rank
    (:data:`SLOW_KINDS`) → application-level Xid
    (:data:`APP_LEVEL_XIDS` never repair a node; repeats of :data:`DIAGNOSTIC_XIDS`
    recommend diagnostics) → the catalogue's entry for
    the fault. Raises nothing for a valid :class:`Alert`.
    """
    if not alert.active:
        return NodeActionDecision(Action.none, False, "clear", "alert cleared")
    window = alert.evidence.get(IN_MAINTENANCE)
    if isinstance(window, str) and window:
        # the delivery path marked it inside a planned maintenance window (issue 29):
        # recorded, never recommended
        return NodeActionDecision(
            Action.none, False, f"maintenance:{window}",
            "node inside a planned maintenance window: observed only",
            severity=alert.severity,
        )
    if alert.evidence.get("inventory") == UNKNOWN_INVENTORY:
        # ingest's observed-only mark is final: a made-up node name never pages anyone,
        # never asks for diagnostics and never reaches the action path
        return NodeActionDecision(
            Action.none, False, "inventory:unknown",
            "node outside the inventory: observed only", severity=alert.severity,
        )
    entry = entry_for(alert.kind, alert.code, alert.evidence, cat)
    sev = entry.severity
    found = override_for(alert.kind, alert.code, cat)
    if found is not None:
        rule, o = found
        if occurrences_in_window < o.count:
            return NodeActionDecision(
                Action.none,
                False,
                rule,
                f"{occurrences_in_window} of {o.count} occurrences within {o.window_s:g} s",
                severity=sev,
            )
        if not entry.actionable or entry.action == Action.none:
            return NodeActionDecision(
                Action.none, False, rule, "override: not actionable", severity=sev
            )
        return NodeActionDecision(
            entry.action,
            True,
            rule,
            f"override: {o.count} occurrence(s) within {o.window_s:g} s",
            severity=sev,
        )
    root = alert.evidence.get("caused_by_xid")
    if alert.kind == "xid" and isinstance(root, int):
        # "caused by previous Xid N": a symptom of its root, never counted on its own.
        return NodeActionDecision(
            Action.none,
            False,
            f"xid:{alert.code}:secondary",
            f"secondary Xid: attached to root Xid {root}",
            severity=sev,
        )
    if alert.kind in SLOW_KINDS:
        # Slow is not failed: a straggler or a late NCCL rank asks for diagnostics, never
        # a node repair.
        return NodeActionDecision(
            Action.none,
            False,
            f"{alert.kind}:diagnose",
            f"{SLOW_KINDS[alert.kind]}: diagnostic validation recommended",
            diagnostic=True,
            severity=sev,
        )
    if alert.kind == "xid" and alert.code in APP_LEVEL_XIDS:
        if alert.code in DIAGNOSTIC_XIDS and repeats_same_gpu >= cat.app_xid_repeat_count:
            return NodeActionDecision(
                Action.none,
                False,
                f"xid:{alert.code}:repeat",
                f"Xid {alert.code} repeated {repeats_same_gpu} times on the same GPU/GPC "
                f"within {cat.app_xid_repeat_window_s:g} s: diagnostic validation recommended",
                diagnostic=True,
                severity=sev,
            )
        return NodeActionDecision(
            Action.none,
            False,
            f"xid:{alert.code}:app",
            f"Xid {alert.code} is application-level and never drives a node repair by itself",
            severity=sev,
        )
    code = f":{alert.code}" if alert.code is not None else ""
    rule = f"{alert.kind}{code}:default"
    if not entry.mapped:
        return NodeActionDecision(
            Action.none, False, f"{alert.kind}{code}:unmapped", entry.description, severity=sev
        )
    if not entry.actionable or entry.action == Action.none:
        return NodeActionDecision(
            Action.none, False, rule, "signal maps to no node action", severity=sev
        )
    if entry.action == Action.remove:
        # remove is human-only; the platform recommends it but never starts it itself
        return NodeActionDecision(
            Action.remove, True, rule, "catalogue: contact support", severity=sev
        )
    return NodeActionDecision(entry.action, True, rule, "catalogue default", severity=sev)
