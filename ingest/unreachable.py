"""``node_unreachable``: an agent that stopped pushing (docs/design.md §1 rule zero).

:class:`UnreachableTracker` remembers when each node last pushed. A node silent for longer
than ``after_s`` (config ``ingest.unreachable_after_s``; default the node TTL plus three
push intervals) gets one observed, level ``node_unreachable`` alert; its next push sends
the clear. Unreachable alone never repairs a node: the node's BMC is asked (``bmc_probe``,
at once and again every ``reprobe_s`` until it confirms, :class:`workflows.policy.bmc.
BmcChecks`), and only a BMC reporting the host powered off or dead adds a second alert
carrying that evidence, which the catalogue maps to ``power_cycle``.

Restarts: the nodes a cluster is configured with (``clusters[].nodes``) count as seen at
start, so an agent that died while ingest was down is still found; the open alerts the
ledger holds (``open_alerts``, read on the first check) are re-opened, so a node that came
back while ingest was down gets its clear on its first push.

Memory: one entry per node that pushed within ``after_s`` or is open, capped at
:data:`MAX_TRACKED` (the oldest open entries are forgotten first, with a log line).
Alert ids are stable per episode (observed at the last push plus ``after_s``: the moment
the node became unreachable), so a re-raise after a restart de-duplicates in the
NodeWorkflow. The clear is observed at the push that ended the episode. So a node's edges
always sort in the order they happened: a raise after the last push it follows, a clear
after the raise it ends (the push came after the check that raised), and a new episode's
raise after that clear. The node's workflow ignores an edge that sorts before the one it
follows (``workflows.node``, stale edges).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workflows.models import Alert
from workflows.policy.bmc import BmcChecks, BmcProbe, bmc_verdict

log = logging.getLogger("autorepair.ingest.unreachable")

KIND = "node_unreachable"
SOURCE = "ingest"
MAX_TRACKED = 100_000
"""Most nodes tracked at once (far above any one ingest's fleet)."""
MAX_PROBES = 16
"""BMC probes in flight at once."""

#: Builds an alert: ``(node identity, kind, evidence_text, evidence, observed_at, active)``.
BuildAlert = Callable[[Any, str, str, dict[str, Any], float, bool], Alert]
Submit = Callable[[Alert], Awaitable[bool]]
OpenAlerts = Callable[[str, str], Awaitable[list[Alert]]]


@dataclass(slots=True)
class _Node:
    resource: Any
    last_push: float
    open: bool = False


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


class UnreachableTracker:
    """See the module docstring. ``build``: how an alert is made from a node identity;
    ``submit``: hand it off, True when taken (False: retried at the next check).
    Raises ``ValueError`` naming ``after_s`` when it is not positive."""

    def __init__(self, after_s: float, build: BuildAlert, submit: Submit, *,
                 bmc_probe: BmcProbe | None = None, reprobe_s: float = 600.0,
                 open_alerts: OpenAlerts | None = None, clusters: Iterable[str] = ()) -> None:
        if after_s <= 0:
            raise ValueError(f"ingest.unreachable_after_s: must be > 0, got {after_s!r}")
        self.after_s = after_s
        self.build = build
        self.submit = submit
        self.bmc_probe = bmc_probe
        self.open_alerts = open_alerts
        self.clusters = list(clusters)
        self._reconciled = open_alerts is None
        self._nodes: dict[tuple[str, str], _Node] = {}
        self._returned: list[tuple[str, str]] = []
        self._bmc = BmcChecks(reprobe_s)
        self._probing: dict[tuple[str, str], asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def expect(self, resource: Any, now: float) -> None:
        """A configured node: counts as seen at ``now`` unless it pushed already."""
        key = (resource.cluster, resource.node)
        if key not in self._nodes:
            self._nodes[key] = _Node(resource, now)

    def tracks(self, resource: Any) -> bool:
        """Whether (cluster, node) of ``resource`` is watched already."""
        return (resource.cluster, resource.node) in self._nodes

    def seen(self, resource: Any, now: float) -> None:
        """A push from ``resource`` (cluster, node) at ``now``. Never raises."""
        key = (resource.cluster, resource.node)
        n = self._nodes.get(key)
        if n is None:
            self._nodes[key] = _Node(resource, now)
            return
        n.resource = resource
        n.last_push = max(n.last_push, now)
        if n.open:
            n.open = False
            self._returned.append(key)

    def _text(self, n: _Node) -> str:
        return (f"no push from the agent of {n.resource.node} since {_iso(n.last_push)} "
                f"(unreachable after {self.after_s:.0f} s)")

    def _evidence(self, n: _Node) -> dict[str, Any]:
        return {"last_push_at": _iso(n.last_push), "unreachable_after_s": self.after_s,
                "detector": "ingest"}

    async def flush(self, now: float) -> None:
        """Send the clears of nodes that pushed again since the last call."""
        returned, self._returned = self._returned, []
        for key in returned:
            n = self._nodes.get(key)
            if n is None or n.open:
                continue
            self._bmc.end(key[0] + "/" + key[1])
            task = self._probing.pop(key, None)
            if task is not None:
                task.cancel()
            clear = self.build(n.resource, KIND, self._text(n) + " (cleared)",
                               self._evidence(n), n.last_push, False)
            if not await self.submit(clear):
                self._returned.append(key)  # the queue is full: next time
                continue
            log.info("event=node_reachable cluster=%s node=%s", key[0], key[1])

    async def _reconcile(self, make_resource: Callable[[str, str], Any], now: float) -> None:
        if self.open_alerts is None:
            return
        for cluster in self.clusters:
            for a in await self.open_alerts(cluster, SOURCE):
                if a.kind != KIND:
                    continue
                key = (a.cluster, a.node)
                n = self._nodes.get(key)
                if n is None:
                    n = self._nodes[key] = _Node(make_resource(a.cluster, a.node),
                                                 a.observed_at.timestamp() - self.after_s)
                n.open = True
        self._reconciled = True

    async def check(self, now: float, make_resource: Callable[[str, str], Any]) -> None:
        """Raise ``node_unreachable`` for nodes silent longer than ``after_s``; ask the BMC
        of open ones when due. ``make_resource``: a node identity for ``(cluster, node)``
        (for alerts of nodes only the ledger knows)."""
        if not self._reconciled:
            try:
                await self._reconcile(make_resource, now)
            except Exception as e:  # the ledger is down: retried at the next check
                log.warning("event=unreachable_reconcile_failed error=%s", e)
        await self.flush(now)
        for key, n in list(self._nodes.items()):
            if n.open:
                self._maybe_probe(key, n, now)
                continue
            if now - n.last_push <= self.after_s:
                continue
            alert = self.build(n.resource, KIND, self._text(n), self._evidence(n),
                               n.last_push + self.after_s, True)
            if not await self.submit(alert):
                continue
            n.open = True
            log.warning("event=node_unreachable cluster=%s node=%s last_push=%s",
                        key[0], key[1], _iso(n.last_push))
            self._maybe_probe(key, n, now)
        self._bound()

    def _maybe_probe(self, key: tuple[str, str], n: _Node, now: float) -> None:
        name = key[0] + "/" + key[1]
        if (self.bmc_probe is None or key in self._probing or len(self._probing) >= MAX_PROBES
                or not self._bmc.due(name, n.last_push, now)):
            return
        self._probing[key] = asyncio.create_task(self._probe(key, n, now))

    async def _probe(self, key: tuple[str, str], n: _Node, now: float) -> None:
        name = key[0] + "/" + key[1]
        try:
            assert self.bmc_probe is not None
            bmc = await self.bmc_probe(key[0], key[1])
            why = bmc_verdict(bmc)
            self._bmc.record(name, n.last_push, now, why is not None)
            log.info("event=bmc_checked cluster=%s node=%s power=%s health=%s actionable=%s",
                     key[0], key[1], bmc.get("power_state"), bmc.get("health"), bool(why))
            if why is not None and n.open:
                alert = self.build(n.resource, KIND, f"{self._text(n)}; {why}",
                                   {**self._evidence(n), "bmc": bmc},
                                   n.last_push + self.after_s, True)
                if not await self.submit(alert):
                    self._bmc.end(name)  # not taken: ask (and raise) again next check
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an unreachable BMC is not evidence: asked again later
            log.warning("event=bmc_check_failed cluster=%s node=%s error=%s", key[0], key[1],
                        type(e).__name__)
        finally:
            self._probing.pop(key, None)

    def _bound(self) -> None:
        over = len(self._nodes) - MAX_TRACKED
        if over <= 0:
            return
        oldest = sorted(self._nodes, key=lambda k: self._nodes[k].last_push)[:over]
        for key in oldest:
            del self._nodes[key]
            self._bmc.end(key[0] + "/" + key[1])
        log.warning("event=unreachable_forgotten nodes=%d (over %d tracked)", over,
                    MAX_TRACKED)

    async def close(self) -> None:
        """Cancel probes in flight."""
        for t in list(self._probing.values()):
            t.cancel()
        await asyncio.gather(*self._probing.values(), return_exceptions=True)
        self._probing.clear()
