"""Best-effort delivery of notifications to the configured channels.

:meth:`Notifier.publish` logs the notification (one structured line), picks the channels
whose filters (severity, cluster, event) accept it, and starts one background delivery
per channel; it never waits and never raises, so no workflow is blocked or failed by a
dead receiver. A delivery tries ``notifications.attempts`` times: network errors, 408,
429 and 5xx are retried after ``backoff_s`` doubling each try (capped at
:data:`BACKOFF_MAX_S`; a 429's ``Retry-After`` is honoured up to the same cap); any other
4xx gives up at once. At most ``max_pending`` deliveries are queued or in flight; beyond
that new ones are dropped and logged. Outcomes are counted in :attr:`Notifier.counts`.

URLs and PagerDuty routing keys are secrets: they are read once when the notifier is
built (``url`` / ``url_env`` / ``url_file``) and only ``scheme://host`` of a URL ever
appears in a log line or error (:func:`activities.secrets.redact_url`).

Errors: building a :class:`Notifier` raises ``ValueError`` naming the channel and the
env var or file when a secret cannot be read (the worker refuses to start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from activities.notifications.channels import (
    PAGERDUTY_URL,
    pagerduty_body,
    slack_body,
    webhook_body,
)
from activities.notifications.event import NotificationEvent
from activities.secrets import redact_url
from workflows.config import NotificationChannel, NotificationsConfig

log = logging.getLogger("autorepair.notify")

BACKOFF_MAX_S = 60.0
"""Longest wait between two tries of one delivery, seconds."""
_GIVE_UP = frozenset(range(400, 500)) - {408, 429}


@dataclass(frozen=True, slots=True)
class Channel:
    """A channel with its secrets read. ``where``: the redacted URL."""

    name: str
    config: NotificationChannel
    url: str
    routing_key: str | None
    where: str

    def accepts(self, ev: NotificationEvent) -> bool:
        """Whether the channel's filters let ``ev`` through (an empty filter passes all)."""
        c = self.config
        return ((not c.severities or ev.severity in {s.value for s in c.severities})
                and (not c.clusters or ev.cluster in c.clusters)
                and (not c.events or ev.event in c.events))

    def request(self, ev: NotificationEvent) -> tuple[dict[str, Any], dict[str, str]]:
        """JSON body and headers of the delivery of ``ev``."""
        if self.config.type == "slack":
            return slack_body(ev), {}
        if self.config.type == "pagerduty":
            assert self.routing_key is not None
            return pagerduty_body(ev, self.routing_key), {}
        return webhook_body(ev), {"Idempotency-Key": ev.idempotency_key()}


def _secret(value: str | None, env: str | None, file: str | None, what: str,
            environ: Mapping[str, str]) -> str | None:
    if value:
        return value
    if env:
        got = environ.get(env, "").strip()
        if not got:
            raise ValueError(f"{what}: environment variable {env} is empty or unset")
        return got
    if file:
        try:
            got = Path(file).read_text(encoding="utf-8").strip().splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError):
            raise ValueError(f"{what}: cannot read a value from {file}") from None
        if not got:
            raise ValueError(f"{what}: {file} is empty")
        return got
    return None


def build_channels(config: NotificationsConfig,
                   environ: Mapping[str, str] | None = None) -> list[Channel]:
    """The configured channels with secrets read (``webhook_url`` first, as an unfiltered
    ``webhook`` channel). Raises ``ValueError`` naming what could not be read."""
    environ = os.environ if environ is None else environ
    specs: list[NotificationChannel] = []
    if config.webhook_url:
        specs.append(NotificationChannel(type="webhook", name="webhook_url",
                                         url=config.webhook_url))
    specs.extend(config.channels)
    out: list[Channel] = []
    for i, c in enumerate(specs):
        name = c.name or f"{c.type}#{i}"
        what = f"notifications.channels[{name}]"
        url = _secret(c.url, c.url_env, c.url_file, f"{what}.url", environ)
        if url is None:
            url = PAGERDUTY_URL
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{what}.url: not an http(s) URL ({redact_url(url)})")
        key = None
        if c.type == "pagerduty":
            key = _secret(None, c.routing_key_env, c.routing_key_file,
                          f"{what}.routing_key", environ)
        out.append(Channel(name, c, url, key, redact_url(url)))
    return out


class Notifier:
    """Filters and delivers :class:`NotificationEvent` objects (module docstring).

    ``channels``: default :func:`build_channels` of ``config``. ``counts``: deliveries
    ``delivered``, ``failed`` (given up), ``retried`` (extra tries), ``dropped`` (over
    ``max_pending``)."""

    def __init__(self, config: NotificationsConfig, *,
                 channels: list[Channel] | None = None) -> None:
        self.config = config
        self.channels = build_channels(config) if channels is None else channels
        self.counts: dict[str, int] = {"delivered": 0, "failed": 0, "retried": 0, "dropped": 0}
        self._pending: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None

    def publish(self, ev: NotificationEvent) -> int:
        """Log ``ev`` and start its deliveries; returns how many channels take it.
        Never raises, never waits (needs a running event loop when a channel takes it)."""
        try:
            log.log(
                logging.WARNING if ev.severity in ("warning", "critical") else logging.INFO,
                "event=notification kind=%s cluster=%s node=%s repair=%s severity=%s "
                "subject=%r", ev.event.value, ev.cluster, ev.node or "-", ev.repair_id or "-",
                ev.severity, ev.subject,
            )
            started = 0
            for ch in self.channels:
                if not ch.accepts(ev):
                    continue
                if len(self._pending) >= self.config.max_pending:
                    self.counts["dropped"] += 1
                    log.warning("event=notification_dropped channel=%s kind=%s repair=%s "
                                "pending=%d", ch.name, ev.event.value, ev.repair_id or "-",
                                len(self._pending))
                    continue
                task = asyncio.get_running_loop().create_task(self._deliver(ch, ev))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
                started += 1
            return started
        except Exception as exc:  # never let a notification break its caller
            log.warning("event=notification_error kind=%s error=%s", ev.event.value,
                        type(exc).__name__)
            return 0

    def pending(self) -> int:
        """Deliveries queued or in flight."""
        return len(self._pending)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the pending deliveries (``timeout_s``: at most that long); True when
        none is left."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
        return not self._pending

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Give pending deliveries up to ``timeout_s``, cancel the rest, close the client."""
        if not await self.drain(timeout_s):
            left = list(self._pending)
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            log.warning("event=notifications_abandoned count=%d", len(left))
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.config.timeout_s)
        return self._client

    async def _deliver(self, ch: Channel, ev: NotificationEvent) -> None:
        body, headers = ch.request(ev)
        delay = self.config.backoff_s
        why = ""
        for attempt in range(1, self.config.attempts + 1):
            wait = delay
            try:
                r = await self._http().post(ch.url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                why = type(exc).__name__
            except Exception as exc:  # a bug must not leak as an unhandled task error
                why = type(exc).__name__
                break
            else:
                if r.status_code < 400:
                    self.counts["delivered"] += 1
                    log.info("event=notification_delivered channel=%s url=%s kind=%s "
                             "repair=%s status=%d attempt=%d", ch.name, ch.where,
                             ev.event.value, ev.repair_id or "-", r.status_code, attempt)
                    return
                why = f"HTTP {r.status_code}"
                if r.status_code in _GIVE_UP:
                    break
                if r.status_code == 429:
                    with contextlib.suppress(ValueError):
                        wait = max(wait, float(r.headers.get("Retry-After", "")))
            if attempt < self.config.attempts:
                self.counts["retried"] += 1
                await asyncio.sleep(min(wait, BACKOFF_MAX_S))
                delay = min(delay * 2, BACKOFF_MAX_S)
        self.counts["failed"] += 1
        log.warning("event=notification_failed channel=%s url=%s kind=%s repair=%s "
                    "error=%r", ch.name, ch.where, ev.event.value, ev.repair_id or "-", why)
