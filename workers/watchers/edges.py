"""Edge times of one watcher's level faults: raises and clears of one fault are stamped in
the order they happened.

The ledger decides which level faults are still open by the newest edge per
(node, kind) (``activities.ledger.Ledger.open_level_alerts``: ``observed_at`` descending),
and a restarted watcher re-opens exactly those. But a watcher stamps its two edges from
different clocks: a raise carries the time the cluster recorded (Slurm's reason time,
Kubernetes' ``lastTransitionTime``, both whole seconds), a clear the time the watcher saw
the fault gone (its own clock, microseconds). A node resumed and marked DOWN again within
one second therefore got a raise stamped *before* the clear it followed, and the ledger
read the new episode as closed: after a restart nobody would clear it, or re-open it.
Clock skew between slurmctld / the API server and the watcher does the same, the other
way round (a clear stamped before its raise leaves the fault open forever).

:class:`EdgeTimes` keeps, per fault key, the time of the last edge sent and moves an edge
that would sort before it to 1 ms after it (1 ms: far below any poll interval, far above
the microsecond resolution of ``timestamptz``). A raise is stamped the same way on every
scan (the key's last clear does not change during an episode), so an episode keeps one
``alert_id``. After a restart the watcher re-opens from the ledger the raises it left
open (:meth:`reopened`), so an episode whose raise was moved keeps its ``alert_id``. The
memory is one entry per key; :meth:`retain` keeps the edges of a node that left the node
list for :data:`DEPARTED_KEEP` (a Kubernetes Node deleted and registered again, e.g. after
a reprovision, keeps its floor: its faults were cleared when it left, and its new
conditions may carry the API server's clock, seconds behind the watcher's), then forgets
them.

A restart between a clear and the next raise of its fault is covered the same way: the
watcher reads the ledger's last clear of each fault (:meth:`cleared_before`,
``Ledger.last_level_edges``), so a raise that the peer stamps before it (within the clock
skew, or much earlier when Slurm has no reason time and the episode falls back to slurmd's
start time) is still stamped after it. Without that floor the node's workflow would answer
the raise ``ignored`` as stale (``workflows.node``), the ledger would read the episode
closed, and two such Slurm episodes would share one ``alert_id``.

When the ledger cannot be read at start, the watcher scans anyway (a ledger outage must
not blind it) with a :attr:`EdgeTimes.floor`: the time of its first scan. A fault with no
edge known yet is treated as cleared at the floor, since every clear the previous run sent
was stamped before this run started; its raise is stamped after the floor, and keeps that
stamp for the episode, also once the ledger answers. The cost: an episode still open from
before the restart is raised again with a new ``alert_id`` (the node's workflow keeps the
fault's first sighting), and a new fault's ``observed_at`` is the floor rather than the
peer's time (the peer's time stays in the evidence, ``since``/``reason``). The floor
assumes the peer's clock is not ahead of the watcher's: a clear the previous run moved
after a raise stamped in the future can sort after it. Such a raise is answered "stale"
until the ledger answers; it is then stamped after the clear, under a new ``alert_id``.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import datetime, timedelta

#: The step that puts an edge after the previous one of its key (see the module text).
EDGE_STEP = timedelta(milliseconds=1)
#: How long the edges of a node that left the node list are kept: an hour, far beyond the
#: clock skew between a peer and the watcher and the time a deleted Node takes to register
#: again; memory stays bounded by the nodes that left within the last hour.
DEPARTED_KEEP = timedelta(hours=1)


class EdgeTimes:
    """Per fault key (``(node, kind)`` or any hashable whose first item is the node): the
    time of the last raise and the last clear sent."""

    def __init__(self) -> None:
        self._raised: dict[Hashable, datetime] = {}
        self._cleared: dict[Hashable, datetime] = {}
        #: Nodes not in the last node list, and when they were first missing.
        self._departed: dict[object, datetime] = {}
        #: While the ledger's last edges are unknown (it could not be read at start): the
        #: time every key with no edge known is treated as cleared at; ``None`` otherwise.
        self.floor: datetime | None = None

    def __len__(self) -> int:
        return len(self._raised.keys() | self._cleared.keys())

    def raise_at(self, key: Hashable, at: datetime) -> datetime:
        """The time to stamp a raise of ``key`` observed at ``at``: ``at``, or 1 ms after
        the key's last clear (:attr:`floor` for a key with no clear known) when ``at`` is
        not later than it. Pure: call :meth:`raised` once the raise is sent."""
        last = self._cleared.get(key, self.floor)
        return at if last is None or at > last else last + EDGE_STEP

    def raised(self, key: Hashable, at: datetime) -> None:
        """A raise of ``key`` stamped ``at`` was sent. Under a :attr:`floor`, a key with
        no clear known keeps the floor as its clear (its episode keeps its stamp once the
        floor is lifted)."""
        self._raised[key] = at
        if self.floor is not None and key not in self._cleared:
            self._cleared[key] = min(self.floor, at)

    def reopened(self, key: Hashable, at: datetime) -> None:
        """A raise of ``key`` stamped ``at`` that the ledger still holds open was re-opened
        after a restart: later raises of the key never sort before it, so the episode's
        own raise, recomputed from the peer's time, gets ``at`` again (one ``alert_id``
        across the restart, also when ``at`` had been moved after a clear)."""
        self._raised[key] = at
        floor = at - EDGE_STEP
        last = self._cleared.get(key)
        self._cleared[key] = floor if last is None else max(last, floor)

    def cleared_before(self, key: Hashable, at: datetime) -> None:
        """The ledger's last edge of ``key`` is a clear stamped ``at`` (read after a
        restart): later raises of the key are stamped after it. Keeps the later of ``at``
        and a clear already known."""
        last = self._cleared.get(key)
        self._cleared[key] = at if last is None else max(last, at)

    def clear_at(self, key: Hashable, now: datetime) -> datetime:
        """The time to stamp (and remember) a clear of ``key`` seen at ``now``: ``now``, or
        1 ms after the key's last raise when ``now`` is not later than it."""
        last = self._raised.pop(key, None)
        at = now if last is None or now > last else last + EDGE_STEP
        self._cleared[key] = at
        return at

    def retain(self, nodes: set[str], now: datetime) -> None:
        """Called with every node list read at ``now``: forget every key whose node (the
        key, or its first item) has been missing from the list for :data:`DEPARTED_KEEP`;
        a node back in the list keeps its edges."""
        known = {_node(k) for table in (self._raised, self._cleared) for k in table}
        missing = known - nodes
        self._departed = {n: self._departed.get(n, now) for n in missing}
        gone = {n for n, t in self._departed.items() if now - t >= DEPARTED_KEEP}
        for table in (self._raised, self._cleared):
            for key in [k for k in table if _node(k) in gone]:
                del table[key]
        for n in gone:
            del self._departed[n]


def _node(key: Hashable) -> object:
    return key[0] if isinstance(key, tuple) and key else key
