"""Forwarding of everything received to a downstream OTLP/HTTP endpoint (the site's collector).

The receivers call :meth:`OtlpForwarder.enqueue` with the serialized protobuf request; it
never waits. A background task takes up to ``batch_max`` queued payloads of one signal,
concatenates them (serialized ``Export*ServiceRequest`` messages concatenate into one
valid message whose repeated ``resource_*`` fields are the union — protobuf merge
semantics) and POSTs them to ``{endpoint}/v1/metrics`` or ``/v1/logs`` as
``application/x-protobuf``. Failures (transport errors, 429, 5xx) are retried with
exponential backoff (tenacity, capped at ``max_backoff_s``); other 4xx drop the batch
(``rejected``). The queue is bounded: when it is full the oldest payload is dropped and
counted (``dropped``), so a dead downstream costs at most ``queue_size`` payloads of
memory and never slows the agents' pushes.

With ``providers`` rules configured, each forwarded resource carries the node's provider
facts as resource attributes (:func:`stamp_providers`), so downstream cost dashboards
can group by ``autorepair.provider``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import httpx
import tenacity

from ingest.otlp import _kv, attributes, decode_resource
from workflows.providers import ATTRS, NodeFacts, ProviderResolver

log = logging.getLogger("autorepair.ingest.forward")

Signal = Literal["metrics", "logs"]


class _Retryable(Exception):
    pass


class OtlpForwarder:
    """Bounded, batched, retried forwarding (see module docstring).

    ``endpoint``: base URL such as ``http://collector:4318`` (a trailing ``/`` is
    ignored). ``queue_size``: payloads kept at most (config ``ingest.forward_queue``).
    ``on_drop(n)`` / ``on_outcome(outcome)`` feed the service metrics.
    """

    def __init__(
        self,
        endpoint: str,
        queue_size: int,
        *,
        batch_max: int = 256,
        timeout_s: float = 5.0,
        max_backoff_s: float = 10.0,
        on_drop: Callable[[int], None] | None = None,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"ingest.forward_endpoint: {endpoint!r} is not an http(s) URL")
        if queue_size <= 0:
            raise ValueError(f"ingest.forward_queue: {queue_size} must be > 0")
        self.endpoint = endpoint.rstrip("/")
        self.queue_size = queue_size
        self.batch_max = batch_max
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.on_drop = on_drop
        self.on_outcome = on_outcome
        self._queue: deque[tuple[Signal, bytes]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.dropped = 0
        self.counts: dict[str, int] = {"sent": 0, "retried": 0, "rejected": 0}

    def depth(self) -> int:
        """Payloads waiting to be forwarded."""
        return len(self._queue)

    def enqueue(self, signal: Signal, payload: bytes) -> None:
        """Queue one serialized export request; drops the oldest when full. Never blocks."""
        if len(self._queue) >= self.queue_size:
            self._queue.popleft()
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(1)
        self._queue.append((signal, payload))
        self._wake.set()

    async def start(self) -> None:
        """Start the forwarding task (idempotent)."""
        if self._task is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop forwarding; what is still queued is dropped (counted in ``dropped``)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def _take_batch(self) -> tuple[Signal, bytes, int]:
        signal = self._queue[0][0]
        parts: list[bytes] = []
        while self._queue and len(parts) < self.batch_max and self._queue[0][0] == signal:
            parts.append(self._queue.popleft()[1])
        return signal, b"".join(parts), len(parts)

    async def _post(self, signal: Signal, body: bytes) -> None:
        assert self._client is not None
        try:
            r = await self._client.post(
                f"{self.endpoint}/v1/{signal}", content=body,
                headers={"Content-Type": "application/x-protobuf"},
            )
        except httpx.HTTPError as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from e
        if r.status_code == 429 or r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}")
        if r.status_code >= 400:
            self._count("rejected")
            log.warning("event=forward_rejected status=%d signal=%s", r.status_code, signal)
            return
        self._count("sent")

    async def _run(self) -> None:
        def before_sleep(rs: tenacity.RetryCallState) -> None:
            self._count("retried")

        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            signal, body, n = self._take_batch()
            retrying = tenacity.AsyncRetrying(
                wait=tenacity.wait_exponential_jitter(
                multiplier=0.1, max=self.max_backoff_s, jitter=0.1),
                retry=tenacity.retry_if_exception_type(_Retryable),
                stop=tenacity.stop_never,
                before_sleep=before_sleep,
            )
            try:
                await retrying(self._post, signal, body)
            except Exception:
                log.exception("event=forward_error signal=%s payloads=%d", signal, n)


def stamp_providers(req: Any, resolver: ProviderResolver) -> int:
    """Set the provider facts (``autorepair.provider``, ``autorepair.provider.region`` …,
    :data:`workflows.providers.ATTRS`) on every identified resource of an OTLP metrics
    or logs export request, in place, replacing any the sender set (the configured
    mapping wins). Returns the resources stamped; unidentified resources are left alone.
    Never raises on odd attributes."""
    names = set(ATTRS.values())
    blocks = getattr(req, "resource_metrics", None) or getattr(req, "resource_logs", None) or []
    n = 0
    for block in blocks:
        attrs = attributes(block.resource.attributes)
        res = decode_resource(attrs)
        if isinstance(res, str):
            continue
        info = resolver.resolve(NodeFacts.from_resource(res.cluster, res.node, attrs))
        keep = [kv for kv in block.resource.attributes if kv.key not in names]
        del block.resource.attributes[:]
        block.resource.attributes.extend(keep)
        block.resource.attributes.extend(_kv(k, v) for k, v in info.attributes().items())
        n += 1
    return n
