"""The BMC's word on a host that stopped answering (docs/design.md §1 rule zero: NotReady /
unreachable alone never repairs a node; the BMC's evidence of a dead host does).

Pure and sandbox-safe (no I/O): shared by the cluster watchers (``workers.watchers``) and
ingest's unreachable check (``ingest.unreachable``), which do the asking.

- :func:`bmc_verdict`: why the BMC's answer is evidence of a dead host, or ``None``.
- :class:`BmcChecks`: when to ask during one unhealthy episode — at its start, then again
  every ``reprobe_s`` until the BMC confirms a dead host (a host that powers off an hour
  into a NotReady episode is seen), with memory bounded by the number of nodes watched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: ``(cluster, node) -> {"power_state": ..., "state": ..., "health": ...}`` from the BMC.
BmcProbe = Callable[[str, str], Awaitable[dict[str, str | None]]]

DEFAULT_REPROBE_S = 600.0
"""Re-ask the BMC every 10 minutes during a long episode (config ``worker.bmc_reprobe_s``)."""


def bmc_verdict(bmc: dict[str, str | None]) -> str | None:
    """Why the BMC's answer is actionable evidence, or ``None`` for a healthy host: power
    ``Off``, ``Status.State`` ``UnavailableOffline`` or ``Status.Health`` ``Critical``
    (Redfish ``ComputerSystem`` schema)."""
    if (bmc.get("power_state") or "").lower() == "off":
        return "BMC reports host power Off"
    if (bmc.get("state") or "") == "UnavailableOffline":
        return "BMC reports the host UnavailableOffline"
    if (bmc.get("health") or "") == "Critical":
        return "BMC reports host health Critical"
    return None


@dataclass(slots=True)
class _Check:
    episode: object
    last_at: float
    confirmed: bool


class BmcChecks:
    """Per node: the current unhealthy episode, when its BMC was last asked, and whether
    it confirmed a dead host. One entry per node (a new episode replaces the old one);
    :meth:`end` drops a node that is healthy again, :meth:`retain` those no longer listed.

    ``reprobe_s``: seconds between two probes of one episode (> 0, else ``ValueError``).
    """

    def __init__(self, reprobe_s: float = DEFAULT_REPROBE_S) -> None:
        if reprobe_s <= 0:
            raise ValueError(f"reprobe_s: must be > 0, got {reprobe_s!r}")
        self.reprobe_s = reprobe_s
        self._checks: dict[str, _Check] = {}

    def __len__(self) -> int:
        return len(self._checks)

    def due(self, node: str, episode: object, now: float) -> bool:
        """Whether to ask ``node``'s BMC now: a new episode, or an unconfirmed one last
        asked ``reprobe_s`` ago or more."""
        c = self._checks.get(node)
        if c is None or c.episode != episode:
            return True
        return not c.confirmed and now - c.last_at >= self.reprobe_s

    def record(self, node: str, episode: object, now: float, confirmed: bool) -> None:
        """The BMC of ``node`` was asked at ``now`` during ``episode``."""
        self._checks[node] = _Check(episode, now, confirmed)

    def end(self, node: str) -> None:
        """``node`` is healthy again: forget its episode."""
        self._checks.pop(node, None)

    def retain(self, nodes: set[str]) -> None:
        """Forget every node not in ``nodes`` (deleted from the cluster)."""
        for n in [n for n in self._checks if n not in nodes]:
            del self._checks[n]
