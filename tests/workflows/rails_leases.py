"""Lease checks of the rails property test (``rails_driver``), on the guard's ``status``
and a repair's history alone, so each can be shown to flag a planted violation
(``test_rails_property.py``): lease clashes, what a guard rebuilt from the ledger must
keep, leases and requests left after settling, and repairs waiting for a lease."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.client import WorkflowHandle

from workflows.protocol import REPAIR_SIGNAL_LEASE, GuardStatus


@dataclass
class LeaseWaiters:
    """Open repairs waiting for a lease: those the guard queues, and violations naming
    those it neither queues nor holds."""

    waiting: list[str] = field(default_factory=list)  # queued at the guard
    forgotten: list[str] = field(default_factory=list)  # violations: unknown to the guard


def lease_waiters(g: GuardStatus | None, details: dict[str, str]) -> LeaseWaiters:
    """Sort open repairs (``details``: repair id → its status detail) that wait for a
    lease into those the guard queues and those it neither queues nor holds (forgotten)."""
    queued = {p.repair_id for p in g.pending} if g else set()
    holding = {x.repair_id for x in g.leases} if g else set()
    out = LeaseWaiters()
    for rid, detail in details.items():
        if not waits_for_lease(detail) or rid in holding:
            continue
        if rid in queued:
            out.waiting.append(rid)
        else:
            out.forgotten.append(f"{rid} waits for a lease ({detail!r}) the guard neither "
                                 "holds nor queues")
    return out


def waits_for_lease(detail: str) -> bool:
    """Whether a repair's ``detail`` says it waits for a lease (first request, queued,
    or re-acquiring before a disruptive step)."""
    return any(x in detail for x in ("waiting for a lease", "lease queued", "re-acquiring"))


async def granted_since(handle: WorkflowHandle[Any, Any], since: datetime) -> bool:
    """Whether the repair received a granted ``lease`` reply after ``since`` (history)."""
    for e in (await handle.fetch_history()).events:
        if not e.HasField("workflow_execution_signaled_event_attributes"):
            continue
        a = e.workflow_execution_signaled_event_attributes
        if a.signal_name != REPAIR_SIGNAL_LEASE or not a.input.payloads:
            continue
        if e.event_time.ToDatetime(tzinfo=UTC) > since and json.loads(
                a.input.payloads[0].data).get("granted"):
            return True
    return False


def lease_clashes(g: GuardStatus, live: set[str] | None = None) -> list[str]:
    """Leases of ``g`` that break the guard's rules: two on one node, two in one pool, more
    than the budget. ``live``: only leases of these repairs count (None: all)."""
    held = [x for x in g.leases if live is None or x.repair_id in live]
    out: list[str] = []
    for a, b in itertools.combinations(held, 2):
        if a.node == b.node:
            out.append(f"two leases on node {a.node}: {a.repair_id} and {b.repair_id}")
        elif a.node_pool is not None and a.node_pool == b.node_pool:
            out.append(f"two leases in pool {a.node_pool}: {a.repair_id} ({a.node}) and "
                       f"{b.repair_id} ({b.node})")
    if len(held) > g.budget:
        out.append(f"{len(held)} leases over the budget of {g.budget}: "
                   f"{[x.repair_id for x in held]}")
    return out


def rebuild_changes(before: GuardStatus, after: GuardStatus) -> list[str]:
    """What a guard rebuilt from the ledger changed that it must keep: budget, breaker
    threshold, GPU node count and the breaker's state (open or closed)."""
    return [
        f"{name} {getattr(before, name)!r} before the restart, {getattr(after, name)!r} after"
        for name in ("budget", "breaker_threshold", "gpu_nodes", "breaker_open")
        if getattr(before, name) != getattr(after, name)
    ]


def leftover_leases(g: GuardStatus | None, terminated: set[str]) -> list[str]:
    """Leases and queued requests the guard still lists after settling (every repair has
    ended and the lease TTL has passed: none is expected, the leases of ``terminated``
    repairs included)."""
    if g is None:
        return []
    why = {True: "terminated, its lease never expired", False: "ended"}
    out = [f"lease of {x.repair_id} on {x.node} still held after settling (holder "
           f"{why[x.repair_id in terminated]})" for x in g.leases]
    out += [f"request of {p.repair_id} on {p.node} still queued after settling"
            for p in g.pending]
    return out
