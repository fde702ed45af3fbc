"""Validation activities on the main task queue (re-validation, docs/design.md §1 step 5):
``place_validation``, ``collect_validation``, ``release_validation``, ``return_machine``,
``post_ticket``.

Each resolves the cluster's validation backend (Slurm or Kubernetes,
``ClusterConfig.scheduler``; :func:`activities.validation.validation_backend_for`) per
call and delegates to it; the verdict rules are in :mod:`activities.validation.base`.
Unknown cluster → non-retryable ``ERR_UNKNOWN_NODE``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
from temporalio import activity

from activities.ledger import Ledger
from activities.secrets import CredentialsError, redact_url, secret_url
from activities.spares import SparePool
from activities.validation import ValidationBackend, validation_backend_for
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    ERR_UNKNOWN_NODE,
    CollectInput,
    CollectResult,
    PlacementResult,
    ReturnMachineInput,
    ReturnMachineResult,
    TicketPost,
    ValidationPlacement,
    permanent,
)
from workflows.config import AutorepairConfig


class ValidationActivities:
    """Bound methods are the validation activities; register ``.all()`` on a worker.

    ``pool`` (the ledger's asyncpg pool) backs the spare pool; ``kube_api_client`` is an
    optional ``kubernetes_asyncio`` ``ApiClient`` for Kubernetes clusters (default: from
    the cluster's kubeconfig / in-cluster config).
    """

    def __init__(
        self, config: AutorepairConfig, pool: asyncpg.Pool | None = None,
        kube_api_client: Any = None,
    ) -> None:
        self.config = config
        self.spares = SparePool(pool) if pool is not None else None
        self.ledger = Ledger(pool) if pool is not None else None
        self.kube_api_client = kube_api_client

    def _backend(self, cluster: str) -> ValidationBackend:
        try:
            c = self.config.cluster(cluster)
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e
        b = validation_backend_for(c, kube_api_client=self.kube_api_client)
        if self.ledger is not None:
            # another repair in flight on the node is never resumed by a validation
            b.repairs_in_flight = self.ledger.repairs_in_flight
        return b

    @activity.defn(name=ACT.place_validation)
    async def place_validation(self, p: ValidationPlacement) -> PlacementResult:
        """Place the check run on ``p.node``; ``placed=False`` + reason when impossible."""
        b = self._backend(p.cluster)
        try:
            return await b.place(p)
        finally:
            await b.close()

    @activity.defn(name=ACT.collect_validation)
    async def collect_validation(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` (heartbeating) for the run's structured result."""
        b = self._backend(c.cluster)
        try:
            return await b.collect(c)
        finally:
            await b.close()

    @activity.defn(name=ACT.release_validation)
    async def release_validation(self, c: CollectInput) -> None:
        """Stop the job if still running and remove the placement (reservation / Job)."""
        b = self._backend(c.cluster)
        try:
            await b.release(c)
        finally:
            await b.close()

    @activity.defn(name=ACT.return_machine)
    async def return_machine(self, r: ReturnMachineInput) -> ReturnMachineResult:
        """Apply the verdict: back to pool / spare pool, kept out, or prior state restored."""
        b = self._backend(r.cluster)
        try:
            return await b.return_machine(r, self.spares)
        finally:
            await b.close()

    @activity.defn(name=ACT.post_ticket)
    async def post_ticket(self, t: TicketPost) -> bool:
        """POST the ticket to the cluster's ``validation.ticket_webhook`` (inline, ``_env``
        or ``_file``, :func:`activities.secrets.secret_url`; JSON body,
        ``Idempotency-Key: <ticket_id>`` so a retried post is recognised); False when no
        webhook is configured. 4xx → non-retryable ``ActionFailed``; 5xx/network → retry."""
        try:
            v = self.config.cluster(t.cluster).validation
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e
        try:
            url = secret_url(v.ticket_webhook, v.ticket_webhook_env, v.ticket_webhook_file,
                             f"clusters[{t.cluster}].validation.ticket_webhook")
        except CredentialsError as e:
            raise permanent(ERR_ACTION_FAILED, str(e)) from None
        if not url:
            return False
        shown = redact_url(url)  # the path/query may hold the endpoint's credential
        try:
            async with httpx.AsyncClient(timeout=30.0) as client:
                resp = await client.post(url, json=t.model_dump(mode="json"),
                                         headers={"Idempotency-Key": t.ticket_id})
        except httpx.HTTPError as exc:  # its text and cause may quote the URL
            raise RuntimeError(f"ticket webhook {shown}: {type(exc).__name__}") from None
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            raise permanent(
                ERR_ACTION_FAILED,
                f"ticket webhook {shown} answered {resp.status_code} for {t.ticket_id}",
            )
        if resp.status_code >= 400:  # 5xx/408/429: retried by Temporal
            raise RuntimeError(f"ticket webhook {shown} answered {resp.status_code}")
        return True

    def all(self) -> list[Callable[..., Any]]:
        """Every validation activity, for ``Worker(activities=...)``."""
        return [self.place_validation, self.collect_validation, self.release_validation,
                self.return_machine, self.post_ticket]

