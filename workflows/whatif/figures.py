"""What a what-if replay (:mod:`workflows.whatif.sim`) adds up to, per policy, and the
alerts whose outcome differs between two replays (issue 31 item 1). Pure.

Figures of one replay (:func:`figures`), a JSON-ready dict:

- ``repairs``; ``by_action``: repairs by the action first decided (ladder, gate, node
  cap applied); ``automatic``: repairs that never waited for a person; ``waited_for_person``:
  the others; ``nodes_reaching_person``: nodes with at least one such repair;
- ``outcomes``: repairs by terminal stage (``open`` when the replay ended first);
- ``breaker_trips`` (and ``trips``: cluster, time, reason); ``domain_holds`` (and
  ``holds``: cluster, domain, time, nodes that opened it, ``released_at`` or ``None``);
  ``domain_held_repairs``: repairs whose lease request waited for a hold (``why=domain``);
- ``disruptive_per_node``: executed actions per node over nodes that had an alert
  (``max``, ``p99`` by the nearest-rank method: the ⌈0.99·n⌉-th smallest);
- ``gpu_hours`` / ``cost`` / ``unpriced_repairs``: the downtime model of
  ``autorepair report`` (:func:`workflows.downtime.compute_downtime`) over the
  simulated transitions; ``cost`` is ``None`` when no repair had an hourly rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from workflows.downtime import compute_downtime
from workflows.providers import ProviderInfo
from workflows.whatif.sim import AlertResult, RepairRun, Run

#: How many differing alerts are listed (issue 31 item 1: the first 20).
MAX_DIFFERENCES = 20

InfoFor = Callable[[str, str], ProviderInfo]


def _default_info(cluster: str, node: str) -> ProviderInfo:
    return ProviderInfo()


def p99(values: list[int]) -> int:
    """Nearest-rank 99th percentile of ``values`` (0 for none): the ⌈0.99·n⌉-th smallest."""
    if not values:
        return 0
    s = sorted(values)
    return s[max(math.ceil(0.99 * len(s)) - 1, 0)]


def figures(run: Run, info_for: InfoFor = _default_info) -> dict[str, Any]:
    """The figures of one replay (module docstring); ``info_for(cluster, node)`` gives the
    node's GPUs and hourly rate (default: 8 GPUs, no rate)."""
    by_action: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    automatic = waited = 0
    person_nodes: set[tuple[str, str]] = set()
    per_node: dict[tuple[str, str], int] = {(a.cluster, a.node): 0 for a in run.alerts.values()}
    gpu_hours = 0.0
    cost = 0.0
    priced = unpriced = 0
    currency = "USD"
    for r in run.repairs.values():
        act = (r.action or r.requested).value
        by_action[act] = by_action.get(act, 0) + 1
        outcomes[r.stage or "open"] = outcomes.get(r.stage or "open", 0) + 1
        if r.asked:
            waited += 1
            person_nodes.add((r.cluster, r.node))
        else:
            automatic += 1
        key = (r.cluster, r.node)
        per_node[key] = per_node.get(key, 0) + len(r.attempts)
        if not r.stage:
            continue
        info = info_for(r.cluster, r.node)
        d = compute_downtime(r.transitions, info)
        if d is None:
            continue
        gpu_hours += d.gpu_hours
        currency = d.currency
        if d.cost is None:
            unpriced += 1
        else:
            priced += 1
            cost += d.cost
    counts = list(per_node.values())
    released: dict[tuple[str, str], list[datetime]] = {}
    for cl, dom, at in run.releases:
        released.setdefault((cl, dom), []).append(at)
    holds: list[dict[str, Any]] = []
    for cl, dom, at, nodes in run.holds:  # the k-th release of a domain ends its k-th hold
        rel = released.get((cl, dom), [])
        holds.append({"cluster": cl, "domain": dom, "at": at.isoformat(), "nodes": nodes,
                      "released_at": rel.pop(0).isoformat() if rel else None})
    return {
        "repairs": len(run.repairs),
        "by_action": dict(sorted(by_action.items())),
        "automatic": automatic,
        "waited_for_person": waited,
        "nodes_reaching_person": len(person_nodes),
        "outcomes": dict(sorted(outcomes.items())),
        "breaker_trips": len(run.trips),
        "trips": [{"cluster": c, "at": at.isoformat(), "reason": why}
                  for c, at, why in run.trips],
        "domain_holds": len(run.holds),
        "holds": holds,
        "domain_held_repairs": sum(1 for r in run.repairs.values() if r.domain_held),
        "disruptive_per_node": {"max": max(counts, default=0), "p99": p99(counts),
                                "nodes": len(counts), "total": sum(counts)},
        "gpu_hours": round(gpu_hours, 6),
        "cost": round(cost, 6) if priced else None,
        "currency": currency,
        "unpriced_repairs": unpriced,
    }


def _signature(a: AlertResult, run: Run) -> tuple[str, str, str, str]:
    """(alert outcome, action, who decided, repair's end) of an alert in one replay."""
    r = run.repairs.get(a.repair_id) if a.repair_id else None
    if r is None:
        return (a.outcome, "", "", "")
    return (a.outcome, (r.action or r.requested).value,
            "person" if r.asked else "automatic", r.stage or "open")


def _why(a: AlertResult, run: Run) -> str:
    r: RepairRun | None = run.repairs.get(a.repair_id) if a.repair_id else None
    if r is None:
        return a.reason or a.outcome
    parts = [f"{(r.action or r.requested).value} ({r.rule})" if r.rule
             else (r.action or r.requested).value]
    if r.asked:
        parts.append(f"waited for a person: {r.asked[0]}")
    if r.refused:
        parts.append(f"lease queued: {r.refused} (why={r.refused_why or 'queued'})")
    parts.append(f"ended {r.stage}: {r.reason}" if r.stage else "still open")
    return "; ".join(parts)


def differences(current: Run, new: Run, limit: int = MAX_DIFFERENCES) -> tuple[
        list[dict[str, Any]], int]:
    """The first ``limit`` alerts (replay order: receipt time, then id) whose outcome
    differs between the two replays, each with both outcomes and why; and how many
    differ in all."""
    out: list[dict[str, Any]] = []
    total = 0
    for aid, a in current.alerts.items():
        b = new.alerts.get(aid)
        if b is None:
            continue
        sa, sb = _signature(a, current), _signature(b, new)
        if sa == sb:
            continue
        total += 1
        if len(out) < limit:
            out.append({"alert_id": aid, "cluster": a.cluster, "node": a.node,
                        "at": a.at.isoformat(),
                        "current": {"outcome": sa[0], "action": sa[1], "decided": sa[2],
                                    "end": sa[3], "why": _why(a, current)},
                        "new": {"outcome": sb[0], "action": sb[1], "decided": sb[2],
                                "end": sb[3], "why": _why(b, new)}})
    return out, total
