"""Temporal activities over the ledger (names ``ACT.ledger_*`` in workflows.activity_api).

Each activity is a thin, idempotent call into :class:`activities.ledger.Ledger`;
database errors propagate as retryable failures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from temporalio import activity

from activities.ledger import Ledger
from workflows.activity_api import (
    ACT,
    AttemptHistory,
    AttemptQuery,
    AttemptRecord,
    ClaimInput,
    ClaimResult,
    RepairRecord,
    TicketInput,
    TicketResult,
    TransitionRecord,
    VerdictRecord,
)
from workflows.models import Alert


class LedgerActivities:
    """Bound methods are the ledger activities; register ``.all()`` on a worker."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.ledger = Ledger(pool)

    @activity.defn(name=ACT.ledger_record_alert)
    async def record_alert(self, alert: Alert) -> bool:
        """Record an alert; True when it was new."""
        return await self.ledger.record_alert(alert)

    @activity.defn(name=ACT.ledger_upsert_repair)
    async def upsert_repair(self, rec: RepairRecord) -> None:
        await self.ledger.upsert_repair(rec)

    @activity.defn(name=ACT.ledger_record_transition)
    async def record_transition(self, t: TransitionRecord) -> None:
        await self.ledger.record_transition(t)

    @activity.defn(name=ACT.ledger_record_attempt)
    async def record_attempt(self, a: AttemptRecord) -> None:
        await self.ledger.record_attempt(a)

    @activity.defn(name=ACT.ledger_attempt_history)
    async def attempt_history(self, q: AttemptQuery) -> AttemptHistory:
        return await self.ledger.attempt_history(q)

    @activity.defn(name=ACT.ledger_claim_request)
    async def claim_request(self, c: ClaimInput) -> ClaimResult:
        return await self.ledger.claim_request(c)

    @activity.defn(name=ACT.ledger_record_verdict)
    async def record_verdict(self, v: VerdictRecord) -> None:
        await self.ledger.record_verdict(v)

    @activity.defn(name=ACT.ledger_open_ticket)
    async def open_ticket(self, t: TicketInput) -> TicketResult:
        return await self.ledger.open_ticket(t)

    def all(self) -> list[Callable[..., Any]]:
        """Every ledger activity, for ``Worker(activities=...)``."""
        return [
            self.record_alert,
            self.upsert_repair,
            self.record_transition,
            self.record_attempt,
            self.attempt_history,
            self.claim_request,
            self.record_verdict,
            self.open_ticket,
        ]
