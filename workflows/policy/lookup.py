"""Catalogue lookup on the NodeWorkflow side: does this alert drive a node action?

The ingest side (``workflows/catalogue.py``, ``workflows/alerts.py``) already stamps
``Alert.action`` / ``Alert.actionable`` from the default catalogue. Here the operator's
per-code overrides (:class:`~workflows.config.CatalogueConfig`, scenario 9) and the
count-in-window thresholds are applied, and the rule that decided is named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Alert

#: Xid codes that never drive a node repair by themselves (DESIGN §5: application-level
#: or preemptive-cleanup errors, NVIDIA Xid catalogue buckets RESTART_APP/IGNORE).
APP_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 94})
#: App Xids whose repeats on one GPU/GPC recommend a diagnostic validation run
#: (scenario 2). Xid 45 (preemptive cleanup) is excluded: it is a secondary symptom
#: logged many times by healthy nodes after one job crash (scenario 1), so repetition
#: alone never escalates it.
DIAGNOSTIC_XIDS: frozenset[int] = frozenset({13, 31, 43, 94})


@dataclass(frozen=True)
class CatalogueDecision:
    """Outcome of :func:`catalogue_decision`.

    ``action``: the node-level action (``Action.none`` when not actionable);
    ``actionable``: whether the alert may become a repair recommendation;
    ``rule``: which rule decided (e.g. ``"xid:79:default"``, ``"xid:43:override"``);
    ``reason``: plain-language why; ``diagnostic``: True when repeats of an
    application Xid on one GPU/GPC ask for a diagnostic validation run (scenario 2).
    """

    action: Action
    actionable: bool
    rule: str
    reason: str
    diagnostic: bool = False


def _override(alert: Alert, cat: CatalogueConfig) -> tuple[str, CatalogueOverride] | None:
    if alert.code is not None:
        if alert.kind == "xid" and alert.code in cat.xid:
            return f"xid:{alert.code}:override", cat.xid[alert.code]
        if alert.kind == "sxid" and alert.code in cat.sxid:
            return f"sxid:{alert.code}:override", cat.sxid[alert.code]
    if alert.kind in cat.kinds:
        return f"kind:{alert.kind}:override", cat.kinds[alert.kind]
    return None


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


def catalogue_decision(
    alert: Alert,
    cat: CatalogueConfig,
    occurrences_in_window: int = 1,
    repeats_same_gpu: int = 1,
) -> CatalogueDecision:
    """Decide whether ``alert`` drives a node action under ``cat``.

    ``occurrences_in_window``: occurrences of the same kind/code on this node within the
    override's ``window_s`` (the caller counts, this one included).
    ``repeats_same_gpu``: occurrences of the same app Xid on the same GPU/GPC within
    ``cat.app_xid_repeat_window_s`` (scenario 2).

    Order: operator override (action/actionable/count, scenario 9) → app-Xid rule
    (:data:`APP_XIDS` never repair a node; repeats on one GPU/GPC recommend diagnostics)
    → the action the ingest catalogue stamped on the alert. A clear (``active=False``)
    is never actionable. Raises nothing.
    """
    if not alert.active:
        return CatalogueDecision(Action.none, False, "clear", "alert cleared")
    ov = _override(alert, cat)
    if ov is not None:
        rule, o = ov
        action = o.action if o.action is not None else alert.action
        actionable = o.actionable if o.actionable is not None else action != Action.none
        if occurrences_in_window < o.count:
            return CatalogueDecision(
                Action.none,
                False,
                rule,
                f"{occurrences_in_window} of {o.count} occurrences within {o.window_s:g} s",
            )
        if not actionable or action == Action.none:
            return CatalogueDecision(Action.none, False, rule, "override: not actionable")
        return CatalogueDecision(
            action, True, rule, f"override: {o.count} occurrence(s) within {o.window_s:g} s"
        )
    root = alert.evidence.get("caused_by_xid")
    if alert.kind == "xid" and isinstance(root, int):
        # "caused by previous Xid N": a symptom of its root, never counted on its own.
        return CatalogueDecision(
            Action.none,
            False,
            f"xid:{alert.code}:secondary",
            f"secondary Xid: attached to root Xid {root}",
        )
    if alert.kind == "straggler":
        # Slow is not failed: a straggler asks for diagnostics, never a node repair.
        return CatalogueDecision(
            Action.none,
            False,
            "straggler:diagnose",
            "health score below the straggler threshold: diagnostic validation recommended",
            diagnostic=True,
        )
    if alert.kind == "xid" and alert.code in APP_XIDS:
        if alert.code in DIAGNOSTIC_XIDS and repeats_same_gpu >= cat.app_xid_repeat_count:
            return CatalogueDecision(
                Action.none,
                False,
                f"xid:{alert.code}:repeat",
                f"Xid {alert.code} repeated {repeats_same_gpu} times on the same GPU/GPC "
                f"within {cat.app_xid_repeat_window_s:g} s: diagnostic validation recommended",
                diagnostic=True,
            )
        return CatalogueDecision(
            Action.none,
            False,
            f"xid:{alert.code}:app",
            f"Xid {alert.code} is application-level and never drives a node repair by itself",
        )
    if not alert.actionable or alert.action == Action.none:
        return CatalogueDecision(
            Action.none, False, f"{alert.kind}:default", "signal maps to no node action"
        )
    if alert.action == Action.remove:
        # remove is human-only; the platform recommends it but never starts it itself
        return CatalogueDecision(
            Action.remove, True, f"{alert.kind}:default", "catalogue: contact support"
        )
    return CatalogueDecision(alert.action, True, f"{alert.kind}:default", "catalogue default")
