"""Node → provider facts (``providers:`` in config): pure rule matching, no I/O.

A node is described by :class:`NodeFacts` (cluster, node name, IP addresses, Kubernetes
node labels, and what its agent reported). :class:`ProviderResolver` walks
``providers.rules`` in file order; for each fact (``provider``, ``region``, ``gpu_type``,
``gpus_per_node``, ``hourly_rate``) the first matching rule that sets it wins, so a
catch-all rule at the end supplies defaults. The configured mapping wins over the
agent's own attributes, which fill only facts no rule set.

The facts travel under the attribute names of :data:`ATTRS` — on stored alerts (in
``evidence``), on forwarded OTLP resources and in the ingest snapshot — so the cost of a
repair is computed from what was known when its alert arrived (IP and labels included).
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from workflows.config import ProviderMatch, ProvidersConfig

ATTR_PROVIDER = "autorepair.provider"
"""Provider name attribute (resource attribute, alert evidence key)."""
ATTRS: dict[str, str] = {
    "provider": ATTR_PROVIDER,
    "region": "autorepair.provider.region",
    "gpu_type": "autorepair.provider.gpu_type",
    "gpus_per_node": "autorepair.provider.gpus_per_node",
    "hourly_rate": "autorepair.provider.hourly_rate",
    "currency": "autorepair.provider.currency",
}
"""Field of :class:`ProviderInfo` → attribute name it travels under."""
#: Agent-reported attributes read when no rule sets a fact (OpenTelemetry semantic
#: conventions ``cloud.provider`` / ``cloud.region``, then the project's own names).
REPORTED: dict[str, tuple[str, ...]] = {
    "provider": (ATTR_PROVIDER, "cloud.provider"),
    "region": (ATTRS["region"], "cloud.region"),
    "gpu_type": (ATTRS["gpu_type"],),
    "gpus_per_node": (ATTRS["gpus_per_node"],),
}
LABEL_PREFIX = "k8s.node.label."
"""Resource attribute prefix of Kubernetes node labels (OpenTelemetry ``k8s.node.label.<key>``)."""
CACHE_MAX = 65_536
"""Resolved nodes kept by a resolver (a fleet's nodes; least recently used go first)."""


class ProviderInfo(BaseModel):
    """What is known about a node's provider; ``None`` = unknown.

    ``gpus_per_node`` always has a value (``providers.default_gpus_per_node`` when nothing
    sets it); ``hourly_rate`` is the price of one GPU-hour in ``currency``."""

    provider: str | None = None
    region: str | None = None
    gpu_type: str | None = None
    gpus_per_node: int = 8
    hourly_rate: float | None = None
    currency: str = "USD"

    def attributes(self) -> dict[str, Any]:
        """The known facts under their attribute names (:data:`ATTRS`)."""
        return {ATTRS[k]: v for k, v in self.model_dump().items() if v is not None}

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> ProviderInfo | None:
        """Facts stamped by :meth:`attributes` (e.g. an alert's evidence); None when
        ``attrs`` carries no ``autorepair.provider.gpus_per_node`` (never stamped).
        Malformed values are ignored, never raised."""
        if ATTRS["gpus_per_node"] not in attrs:
            return None
        out: dict[str, Any] = {}
        for name, key in ATTRS.items():
            v = attrs.get(key)
            if v is None:
                continue
            try:
                if name == "gpus_per_node":
                    v = int(v)
                    if v < 1:
                        continue
                elif name == "hourly_rate":
                    v = float(v)
                    if not v >= 0:
                        continue
                else:
                    v = str(v)
            except (TypeError, ValueError):
                continue
            out[name] = v
        if "gpus_per_node" not in out:
            return None
        return cls(**out)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What identifies a node to the rules. ``ips``: its addresses (``host.ip``);
    ``labels``: Kubernetes node labels; ``reported``: agent-reported provider attributes."""

    cluster: str
    node: str
    ips: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    reported: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def from_resource(cls, cluster: str, node: str, attrs: Mapping[str, Any]) -> NodeFacts:
        """Facts of an OTLP resource: ``host.ip`` (string or list), ``k8s.node.label.*``
        and the :data:`REPORTED` attributes. Never raises."""
        raw = attrs.get("host.ip")
        ips = tuple(str(x) for x in raw) if isinstance(raw, list) else (
            (str(raw),) if raw else ())
        labels = tuple(sorted((k[len(LABEL_PREFIX):], str(v)) for k, v in attrs.items()
                              if k.startswith(LABEL_PREFIX)))
        names = {n for ns in REPORTED.values() for n in ns}
        reported = tuple(sorted((k, str(v)) for k, v in attrs.items()
                                if k in names and v is not None and v != ""))
        return cls(cluster, node, ips, labels, reported)


def _ip_in(ips: tuple[str, ...], cidr: str) -> bool:
    net = ipaddress.ip_network(cidr, strict=False)
    for raw in ips:
        try:
            if ipaddress.ip_address(raw.split("%", 1)[0]) in net:
                return True
        except ValueError:
            continue
    return False


def matches(m: ProviderMatch, f: NodeFacts) -> bool:
    """True when every key of ``m`` matches ``f`` (glob on the node name, CIDR on any of
    its IPs, equal label values, equal cluster id)."""
    if m.cluster is not None and m.cluster != f.cluster:
        return False
    if m.node is not None and not fnmatch.fnmatchcase(f.node, m.node):
        return False
    if m.cidr is not None and not _ip_in(f.ips, m.cidr):
        return False
    if m.labels:
        have = dict(f.labels)
        if any(have.get(k) != v for k, v in m.labels.items()):
            return False
    return True


class ProviderResolver:
    """Resolves :class:`NodeFacts` to :class:`ProviderInfo` under ``config`` (see the
    module docstring for precedence). Results are cached per facts (bounded, LRU)."""

    def __init__(self, config: ProvidersConfig) -> None:
        self.config = config
        self._cache: OrderedDict[NodeFacts, ProviderInfo] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """Whether any rule is configured."""
        return bool(self.config.rules)

    def resolve(self, facts: NodeFacts) -> ProviderInfo:
        """The node's facts: rules first (first match per fact), then the agent's."""
        hit = self._cache.get(facts)
        if hit is not None:
            self._cache.move_to_end(facts)
            return hit
        got: dict[str, Any] = {}
        for rule in self.config.rules:
            if not matches(rule.match, facts):
                continue
            for name in ("provider", "region", "gpu_type", "gpus_per_node", "hourly_rate"):
                v = getattr(rule, name)
                if v is not None and name not in got:
                    got[name] = v
        reported = dict(facts.reported)
        for name, keys in REPORTED.items():
            if name in got:
                continue
            for k in keys:
                if k in reported:
                    if name == "gpus_per_node":
                        try:
                            n = int(reported[k])
                        except ValueError:
                            continue
                        if 1 <= n <= 1024:
                            got[name] = n
                            break
                    else:
                        got[name] = reported[k]
                        break
        got.setdefault("gpus_per_node", self.config.default_gpus_per_node)
        info = ProviderInfo(currency=self.config.currency, **got)
        self._cache[facts] = info
        if len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)
        return info

    def for_node(self, cluster: str, node: str) -> ProviderInfo:
        """Facts of a node known only by cluster and name (no IP, labels or agent facts)."""
        return self.resolve(NodeFacts(cluster, node))


def info_for(
    resolver: ProviderResolver, cluster: str, node: str, evidences: list[Mapping[str, Any]]
) -> ProviderInfo:
    """Provider facts of a repair: those stamped on the first of ``evidences`` (its alerts'
    evidence, oldest first) that carries them, else the rules by cluster and node name."""
    for ev in evidences:
        got = ProviderInfo.from_attributes(ev)
        if got is not None:
            return got
    return resolver.for_node(cluster, node)
