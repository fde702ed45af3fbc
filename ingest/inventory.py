"""Which nodes a cluster has, and what happens to alerts about nodes it does not have.

A fault report names its node itself (``host.name``). An authenticated collector can name
any node of its clusters, and a compromised one can invent names; each new name would
start a ``NodeWorkflow`` (``node/{cluster}/{node}``) and, with the catalogue's action, a
repair recommendation. So ingest checks every alert against the **inventory**:

* :class:`NodeInventory`: per cluster, the nodes of ``clusters[].nodes`` plus the node
  list its scheduler reported last (``scontrol show node`` / the Kubernetes node list,
  refreshed every ``ingest.inventory_refresh_s`` by ``autorepair ingest``).
* :class:`UnknownNodeGate`: an alert about a node outside the inventory is **observed,
  not repaired** — passed on with ``actionable=False``, ``action=none`` and
  ``evidence["inventory"] = "unknown"`` — and the ``NodeWorkflow``\\ s started for such
  nodes are rate-limited per cluster and sender identity by a token bucket
  (``ingest.unknown_node_burst``, ``ingest.unknown_nodes_per_minute``; one bucket per
  identity, so one collector cannot spend every other sender's starts). An alert that
  finds the bucket empty is dropped and counted
  (``autorepair_unknown_nodes_limited_total{cluster}``); alerts for an unknown node
  already let through pass without taking a token (its workflow exists).

Bounded memory whatever senders make up: per identity (bounded by the tokens file and
the pods of the agents) one bucket per configured cluster plus one shared by every other
cluster id (label :data:`OTHER_CLUSTERS`), and at most
:data:`MAX_ADMITTED` unknown nodes remembered (least recently seen forgotten first; a
forgotten node takes a token again).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from workflows.config import ClusterConfig
from workflows.models import Action, Alert
from workflows.policy.node_action import UNKNOWN_INVENTORY

log = logging.getLogger("autorepair.ingest.inventory")

OTHER_CLUSTERS = "other"
"""Bucket and metric label of every cluster id outside ``clusters`` (bounded labels)."""
MAX_ADMITTED = 10_000
"""Unknown nodes remembered as already started (an entry is ~200 bytes: ~2 MB at most)."""
UNKNOWN = UNKNOWN_INVENTORY
"""``Alert.evidence["inventory"]`` of an alert about a node outside the inventory; the
``NodeWorkflow`` treats it as final (``workflows.policy.node_action``)."""

#: Reads the schedulers' node lists: ``{cluster: node names}`` for every cluster it could
#: read (a cluster missing from the answer keeps its previous list). ``autorepair ingest``
#: passes ``workers.inventory.scheduler_inventory``; ingest itself does no scheduler I/O.
InventorySource = Callable[[], Awaitable[Mapping[str, Iterable[str]]]]
#: Reads the ledger's node → machine bindings (migrations rebind a node to a spare):
#: ``{cluster: {node: machine}}`` for every cluster it could read. ``autorepair ingest``
#: passes ``workers.lazy_ledger.LazyLedger.machine_bindings``.
BindingsSource = Callable[[], Awaitable[Mapping[str, Mapping[str, str]]]]


class NodeInventory:
    """Nodes of each cluster: ``clusters[].nodes`` plus the scheduler's last node list.

    ``clusters``: the configured clusters. A cluster id outside them has no nodes.
    """

    def __init__(self, clusters: Iterable[ClusterConfig]) -> None:
        clusters = list(clusters)
        self._configured: dict[str, frozenset[str]] = {
            c.name: frozenset(n.name for n in c.nodes) for c in clusters}
        self._listed: dict[str, frozenset[str]] = {}
        #: configured machine of each configured node (its name when none is set: the
        #: worker's ``load_policy`` does the same)
        self._machines: dict[tuple[str, str], str] = {
            (c.name, n.name): n.machine or n.name for c in clusters for n in c.nodes}
        self._bound: dict[str, dict[str, str]] = {}
        #: configured pool of each configured node (``clusters[].nodes[].pool``)
        self._pools: dict[tuple[str, str], str] = {
            (c.name, n.name): n.pool for c in clusters for n in c.nodes}

    def bind(self, cluster: str, bindings: Mapping[str, str]) -> None:
        """Take ``bindings`` (node → machine, the ledger's ``node_bindings``) as the
        current bindings of ``cluster`` (replacing the previous ones)."""
        self._bound[cluster] = dict(bindings)

    def machine(self, cluster: str, node: str) -> str | None:
        """The machine ``node`` runs on: the ledger's binding, else the configured
        machine (the node name for a configured node without one), else ``None``. Never
        what the node's telemetry says (``host.id`` is evidence only)."""
        bound = self._bound.get(cluster, {}).get(node)
        return bound if bound is not None else self._machines.get((cluster, node))

    def pool(self, cluster: str, node: str, reported: str | None = None) -> str | None:
        """The node pool of ``node``: the configured one (``clusters[].nodes[].pool``) for
        a configured node, whatever its telemetry says; ``reported`` (the sender's) only
        for a node the configuration does not list. The workers' ``load_policy`` uses the
        same configured pool, so a pool-scoped maintenance window judges an alert as it
        judges the repair."""
        return self._pools.get((cluster, node), reported)

    @property
    def clusters(self) -> frozenset[str]:
        """Names of the configured clusters."""
        return frozenset(self._configured)

    def replace(self, cluster: str, nodes: Iterable[str]) -> None:
        """Take ``nodes`` as the scheduler's current node list of ``cluster`` (replacing
        the previous one). A cluster outside the configuration is ignored."""
        if cluster in self._configured:
            self._listed[cluster] = frozenset(nodes)

    def update(self, lists: Mapping[str, Iterable[str]]) -> None:
        """:meth:`replace` for every cluster in ``lists`` (clusters absent keep theirs)."""
        for cluster, nodes in lists.items():
            self.replace(cluster, nodes)

    def known(self, cluster: str, node: str) -> bool:
        """True when ``node`` is configured in ``cluster`` or its scheduler lists it."""
        return node in self._configured.get(cluster, ()) or node in self._listed.get(
            cluster, ())

    def size(self, cluster: str) -> int:
        """Nodes known in ``cluster`` (configured and listed together)."""
        return len(self._configured.get(cluster, frozenset()) | self._listed.get(
            cluster, frozenset()))


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` tokens, refilled at ``rate_per_s``; :meth:`take` spends one.

    Times are seconds on any monotonic-enough clock (the caller's)."""

    capacity: float
    rate_per_s: float
    tokens: float
    last: float

    def take(self, now: float) -> bool:
        """Spend one token if there is one (after refilling up to ``now``)."""
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate_per_s)
            self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class UnknownNodeGate:
    """Observed-only handling and the per-cluster start limit of unknown nodes (see the
    module docstring).

    ``burst``: bucket capacity (``ingest.unknown_node_burst``); ``per_minute``: refill
    (``ingest.unknown_nodes_per_minute``). ``limited`` counts dropped alerts and
    ``observed`` the alerts passed on as observations, by cluster label.
    """

    def __init__(self, inventory: NodeInventory, *, burst: int, per_minute: float,
                 max_admitted: int = MAX_ADMITTED) -> None:
        self.inventory = inventory
        self.burst = burst
        self.rate_per_s = per_minute / 60.0
        self.max_admitted = max_admitted
        self._buckets: dict[str, TokenBucket] = {}
        self._owner_buckets: dict[tuple[str, str], TokenBucket] = {}
        self._admitted: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.limited: dict[str, int] = {}
        self.observed: dict[str, int] = {}

    def label(self, cluster: str) -> str:
        """Bucket / metric label of ``cluster``: its name when configured, else
        :data:`OTHER_CLUSTERS`."""
        return cluster if cluster in self.inventory.clusters else OTHER_CLUSTERS

    def _bucket(self, label: str, owner: str | None, now: float) -> TokenBucket:
        b = self._buckets.get(label) if owner is None else self._owner_buckets.get(
            (label, owner))
        if b is None:
            b = TokenBucket(float(self.burst), self.rate_per_s, float(self.burst), now)
            if owner is None:
                self._buckets[label] = b
            else:
                self._owner_buckets[(label, owner)] = b
        return b

    def admit(self, alert: Alert, now: float, owner: str | None = None) -> Alert | None:
        """``alert`` unchanged for a known node; an observed copy for an unknown node
        whose workflow may start (or already did); ``None`` when the bucket is empty (the
        caller drops the alert and counts it). ``owner``: the sender identity's label —
        each identity has its own bucket per cluster (``ingest.limits``), so one
        collector inventing names cannot spend the starts of every other sender;
        ``None`` (no authentication, ingest's own alerts) shares the cluster's."""
        if self.inventory.known(alert.cluster, alert.node):
            return alert
        key = (alert.cluster, alert.node)
        label = self.label(alert.cluster)
        if key in self._admitted:
            self._admitted.move_to_end(key)
        elif self._bucket(label, owner, now).take(now):
            self._admitted[key] = None
            if len(self._admitted) > self.max_admitted:
                self._admitted.popitem(last=False)
            log.warning("event=unknown_node_admitted cluster=%s node=%s", alert.cluster,
                        alert.node)
        else:
            self.limited[label] = self.limited.get(label, 0) + 1
            return None
        self.observed[label] = self.observed.get(label, 0) + 1
        return observed(alert)


def observed(alert: Alert) -> Alert:
    """``alert`` as an observation: not actionable, action ``none``, marked
    ``evidence["inventory"] = "unknown"`` (docs/design.md §1 rule zero: no repair without a
    trusted failed check; a node outside the inventory is not trusted)."""
    return alert.model_copy(update={
        "actionable": False, "action": Action.none,
        "evidence": {**alert.evidence, "inventory": UNKNOWN},
    })
