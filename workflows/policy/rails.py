"""Safety rails: persistence, cooldown, concurrency budget, circuit breaker, evidence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from workflows.config import RailsConfig
from workflows.models import Alert


def persistence_for(alert: Alert, rails: RailsConfig) -> float:
    """Seconds ``alert`` must persist (from its first observation) before it may become a
    recommendation. ``rails.persistence_by_kind[kind]`` wins; otherwise level faults wait
    ``rails.persistence_s`` (default 60 s) and event faults (an Xid line, a single
    observation that never clears) act at once (0 s)."""
    if alert.kind in rails.persistence_by_kind:
        return rails.persistence_by_kind[alert.kind]
    return rails.persistence_s if alert.level else 0.0


def cooldown_until(ended_at: datetime, rails: RailsConfig) -> datetime:
    """End of the cooldown after a repair that ended at ``ended_at`` (default 1800 s)."""
    return ended_at + timedelta(seconds=rails.cooldown_s)


def in_cooldown(until: datetime | None, now: datetime) -> bool:
    """True while ``now`` is before the cooldown end ``until`` (None = no cooldown)."""
    return until is not None and now < until


def concurrency_budget(gpu_nodes: int, rails: RailsConfig, seen_nodes: int = 0) -> int:
    """Repairs allowed at once in a cluster: ``max(min_concurrent, ceil(fraction × N))``.

    ``N`` is ``gpu_nodes`` (``load_policy``: the configured inventory, else the
    scheduler's node list), or ``seen_nodes`` when that is 0 (the guard passes 0: nodes
    named by alerts are no denominator, issue 27 item 9).
    Defaults (docs/design.md §5): fraction 0.05, min 1.
    """
    n = gpu_nodes or seen_nodes
    return max(rails.min_concurrent, math.ceil(rails.concurrency_fraction * n))


def breaker_threshold(gpu_nodes: int, rails: RailsConfig, seen_nodes: int = 0) -> int:
    """Automatic repairs/cordons in ``breaker_window_s`` that trip the breaker:
    ``max(breaker_min, ceil(breaker_fraction × N))``, N = GPU nodes of the cluster
    (``gpu_nodes``, else ``seen_nodes``; the guard passes 0 for the latter). Defaults
    (docs/design.md §5): 0.10, min 2, 600 s."""
    n = gpu_nodes or seen_nodes
    return max(rails.breaker_min, math.ceil(rails.breaker_fraction * n))


def recent_events(times: Sequence[datetime], now: datetime, window_s: float) -> list[datetime]:
    """The ``times`` within ``window_s`` seconds before ``now`` (oldest first)."""
    start = now - timedelta(seconds=window_s)
    return sorted(t for t in times if start <= t <= now)


def breaker_trips(
    times: Sequence[datetime],
    now: datetime,
    gpu_nodes: int,
    rails: RailsConfig,
    seen_nodes: int = 0,
) -> bool:
    """True when the automatic repair/cordon requests in the window (the new one
    included) *exceed* :func:`breaker_threshold` (RailsConfig: "exceed fraction × GPU
    nodes, at least breaker_min"). Checked before granting, so at most ``threshold``
    automatic cordons happen in one window."""
    return len(recent_events(times, now, rails.breaker_window_s)) > breaker_threshold(
        gpu_nodes, rails, seen_nodes
    )


def evidence_current(alerts: Sequence[Alert], not_before: datetime | None = None) -> bool:
    """Whether any alert behind a repair is still current.

    A level fault is current while active (no clear received). An event fault (Xid) is
    current unless ``not_before`` is given and the control plane received it before then
    (after a breaker reset only evidence received after the reset counts; design.md §5
    rails; I17: :func:`received_time`, never a sender's clock). No alerts (an operator
    repair) is always current.
    """
    if not alerts:
        return True
    for a in alerts:
        if a.level:
            if a.active:
                return True
        elif a.active and (not_before is None or received_time(a) >= not_before):
            return True
    return False


def received_time(a: Alert) -> datetime:
    """When the control plane received ``a``: ``received_at`` (ingest's clock), the
    sender's ``observed_at`` only for an alert that did not pass through ingest (an
    operator's or a test's). Every window and cut-off judges alerts by it (I17)."""
    return a.received_at if a.received_at is not None else a.observed_at
