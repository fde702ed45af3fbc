"""Decoding and validation of OTLP payloads against the wire contract (docs/design.md §4.3).

Turns ``ExportMetricsServiceRequest`` / ``ExportLogsServiceRequest`` messages into plain
records (:class:`ScorePoint`, :class:`SignalPoint`, :class:`FaultRecord`) and counts what
is rejected and why. No I/O; the receivers (:mod:`ingest.http_receiver`,
:mod:`ingest.grpc_receiver`) decode bytes and call these functions.

Accepted attribute names: the project's (``host.name``, ``host.id``,
``autorepair.host.boot_id``, ``autorepair.cluster.id``, ``k8s.node.name``,
``autorepair.node_pool``, ``autorepair.workload_type``) and the Ingero aliases
(``ingero.node.id`` for the node, ``ingero.cluster.id`` for the cluster,
``ingero.node.health_score`` for the score metric, ``ingero.node.state`` for the state).

Rejected and counted, never stored: points of a resource without a node or cluster id
(or with one longer than :data:`MAX_ID_LEN`), NaN/Inf scores, scores outside ``[0, 1]``,
unknown node states, score timestamps more than ``max_future_s`` in the future or older
than the score TTL plus ``max_future_s`` (a sender's clock may run that far behind
too). A fault record is never refused for its timestamp (I17: the receipt time judges
it): one more than ``max_future_s`` ahead is stamped with the
receipt time, the sender's kept as evidence (``sender_time_unix_nano``,
``sender_clock_ahead_s``). Metrics with other names are valid OTLP and are ignored (not rejected).

Per-request limits (:class:`Limits`, from the ``ingest.max_*`` config keys): resource
blocks beyond ``max_resources_per_request`` and points / records beyond the per-request
caps are rejected; a resource, point or record whose attributes exceed the count, size or
nesting limits is rejected. Each rejection carries a reason code from :data:`REASONS` (the
``reason`` label of ``autorepair_otlp_rejected_total``) and a message for
``partial_success.error_message``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from ingest.threshold import DEFAULT_COHORT, NodeState
from workflows.catalogue.vocabulary import SENDER_RESERVED_KINDS
from workflows.config import IngestConfig
from workflows.models import MAX_FAULT_CODE
from workflows.names import name_problem

# Wire contract names (docs/design.md §4.3).
ATTR_HOST_NAME = "host.name"
ATTR_HOST_ID = "host.id"
ATTR_BOOT_ID = "autorepair.host.boot_id"
ATTR_CLUSTER = "autorepair.cluster.id"
ATTR_K8S_NODE = "k8s.node.name"
ATTR_NODE_POOL = "autorepair.node_pool"
ATTR_WORKLOAD = "autorepair.workload_type"
ATTR_STATE = "autorepair.node.state"
INGERO_NODE = "ingero.node.id"
INGERO_CLUSTER = "ingero.cluster.id"
INGERO_SCORE = "ingero.node.health_score"
INGERO_STATE = "ingero.node.state"
METRIC_SCORE = "autorepair.node.health_score"
#: NCCL collective timings (docs/design.md §4.5), decoded by ingest.nccl_wire.
METRIC_NCCL = "autorepair.nccl.collective.duration_ms"
SIGNAL_METRICS: dict[str, str] = {
    "autorepair.node.throughput_ratio": "throughput_ratio",
    "autorepair.node.compute_efficiency": "compute_efficiency",
    "autorepair.node.memory_headroom": "memory_headroom",
    "autorepair.node.cpu_availability": "cpu_availability",
}
EVENT_NAME = "event.name"
EVENT_FAULT = "autorepair.fault"
EVENT_STRAGGLER = "autorepair.straggler"
ATTR_FAULT_KIND = "autorepair.fault.kind"
ATTR_FAULT_CODE = "autorepair.fault.code"
ATTR_FAULT_ACTIVE = "autorepair.fault.active"
ATTR_GPU_PCI = "autorepair.gpu.pci"
FAULT_PREFIX = "autorepair.fault."

IDENTITY_KEYS: frozenset[str] = frozenset({
    ATTR_HOST_NAME, ATTR_HOST_ID, ATTR_BOOT_ID, ATTR_CLUSTER, ATTR_K8S_NODE, ATTR_NODE_POOL,
    ATTR_WORKLOAD, INGERO_NODE, INGERO_CLUSTER,
})
"""Resource attributes that say who reports (docs/design.md §4.3): each may appear once."""
MAX_ID_LEN = 253
"""Longest accepted node / cluster id: the DNS name limit (RFC 1035), which host names obey."""
MAX_EVIDENCE_LEN = 64 * 1024
"""Longest kept fault body (bytes of text); longer bodies are truncated, marked so."""
MAX_REASONS = 5
"""Distinct rejection reasons quoted in ``partial_success.error_message``."""
MAX_KIND_LEN = 64
"""Longest accepted ``autorepair.fault.kind`` (the catalogue's kinds are under 20)."""


REASONS = frozenset({
    "resource", "value", "timestamp", "state", "fault", "attributes", "too_many_resources",
    "too_many_records", "identity", "nccl", "limit",
})
"""Reason codes of rejected points / records (bounded: the ``reason`` label of
``autorepair_otlp_rejected_total``). ``resource``: no or bad node / cluster id;
``value``: score or signal not a finite number in range; ``timestamp``: too far in the
future or older than the TTL plus that allowance; ``state``: unknown node state;
``fault``: malformed fault record; ``attributes``: attribute count, size or nesting over the limits;
``too_many_resources`` / ``too_many_records``: per-request caps; ``identity``: reported
for a node the credential may not report for; ``nccl``: a malformed NCCL timing point
(``ingest.nccl_wire``); ``limit``: over a per-identity bound on sender-chosen values
(``ingest.limits``, :mod:`ingest.quota`)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-request decode limits (defaults and meaning: the ``ingest.max_*`` config keys)."""

    resources: int
    data_points: int
    log_records: int
    attributes: int
    value_len: int
    depth: int

    @classmethod
    def from_config(cls, cfg: IngestConfig) -> Limits:
        """Limits of ``cfg`` (an ``ingest`` config section)."""
        return cls(
            resources=cfg.max_resources_per_request,
            data_points=cfg.max_data_points_per_request,
            log_records=cfg.max_log_records_per_request,
            attributes=cfg.max_attributes,
            value_len=cfg.max_attribute_value_bytes,
            depth=cfg.max_attribute_depth,
        )


DEFAULT_LIMITS = Limits.from_config(IngestConfig())
"""The limits of a default ``ingest`` config section."""


@dataclass(frozen=True, slots=True)
class Resource:
    """Identity of the node that sent a resource block."""

    cluster: str
    node: str
    cohort: str
    machine_id: str | None
    boot_id: str | None
    node_pool: str | None
    k8s_node: str | None
    ingero: bool
    attrs: dict[str, Any]


@dataclass(slots=True)
class ScorePoint:
    """One accepted health-score data point (``score`` finite, in 0..1)."""

    resource: Resource
    score: float
    state: NodeState
    time_s: float


@dataclass(slots=True)
class SignalPoint:
    """Accepted signal gauge values of one resource, by short name (``throughput_ratio``…)."""

    resource: Resource
    values: dict[str, float]


@dataclass(slots=True)
class FaultRecord:
    """One ``event.name = autorepair.fault`` or ``autorepair.straggler`` log record."""

    resource: Resource
    event: str
    kind: str
    code: int | None
    gpu: str | None
    active: bool
    evidence_text: str
    evidence: dict[str, Any]
    time_s: float


@dataclass
class Decoded:
    """Result of decoding one export request: accepted records and rejection counts."""

    scores: list[ScorePoint] = field(default_factory=list)
    signals: list[SignalPoint] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    #: ``autorepair.nccl.collective.duration_ms`` metrics with their resource, undecoded.
    nccl: list[tuple[Resource, Any]] = field(default_factory=list)
    rejected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    ignored_metrics: int = 0

    def reject(self, code: str, reason: str, count: int = 1) -> None:
        """Count ``count`` rejected points/records for ``reason`` (a message) under
        ``code`` (one of :data:`REASONS`; ``ValueError`` otherwise)."""
        if code not in REASONS:
            raise ValueError(f"reject: code {code!r} is not one of {sorted(REASONS)}")
        if count > 0:
            self.rejected += count
            self.reasons[reason] += count
            self.codes[code] += count

    def error_message(self) -> str:
        """``partial_success.error_message``: the most frequent reasons with counts."""
        if not self.rejected:
            return ""
        parts = [f"{n}× {r}" for r, n in self.reasons.most_common(MAX_REASONS)]
        return f"rejected {self.rejected}: " + "; ".join(parts)


def any_value(v: AnyValue) -> Any:
    """Python value of an OTLP ``AnyValue`` (arrays/maps become lists/dicts)."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "bool_value":
        return v.bool_value
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bytes_value":
        return v.bytes_value.hex()
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return None


def attributes(kvs: Any) -> dict[str, Any]:
    """``repeated KeyValue`` → dict (no limits: for trusted, already checked input)."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = any_value(kv.value)
    return out


class _OverLimit(Exception):
    pass


def _bounded_value(v: AnyValue, depth: int, budget: list[int], lim: Limits) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        s = v.string_value
        if len(s) > lim.value_len:
            raise _OverLimit(f"string value longer than {lim.value_len} characters")
        return s
    if which == "bytes_value":
        b = v.bytes_value
        if len(b) > lim.value_len:
            raise _OverLimit(f"bytes value longer than {lim.value_len} bytes")
        return b.hex()
    if which in ("array_value", "kvlist_value"):
        if depth >= lim.depth:
            raise _OverLimit(f"values nested deeper than {lim.depth} levels")
        if which == "array_value":
            values = v.array_value.values
            _spend(budget, len(values), lim)
            return [_bounded_value(x, depth + 1, budget, lim) for x in values]
        kvs = v.kvlist_value.values
        _spend(budget, len(kvs), lim)
        out: dict[str, Any] = {}
        for kv in kvs:
            if len(kv.key) > lim.value_len:
                raise _OverLimit(f"key longer than {lim.value_len} characters")
            out[kv.key] = _bounded_value(kv.value, depth + 1, budget, lim)
        return out
    return any_value(v)


def _spend(budget: list[int], n: int, lim: Limits) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise _OverLimit(f"more than {lim.attributes} attributes (nested values included)")


def bounded_attributes(kvs: Any, lim: Limits) -> dict[str, Any] | str:
    """``repeated KeyValue`` → dict, or the rejection message when ``kvs`` has more than
    ``lim.attributes`` entries (nested array / key-value list elements included), a key or
    value longer than ``lim.value_len``, or nesting deeper than ``lim.depth``."""
    budget = [lim.attributes]
    out: dict[str, Any] = {}
    try:
        _spend(budget, len(kvs), lim)
        kv: KeyValue
        for kv in kvs:
            key = kv.key
            if len(key) > lim.value_len:
                raise _OverLimit(f"key {key[:64]!r}… longer than {lim.value_len} characters")
            try:
                out[key] = _bounded_value(kv.value, 0, budget, lim)
            except _OverLimit as e:
                raise _OverLimit(f"{key[:64]!r}: {e}") from None
    except _OverLimit as e:
        return f"attributes: {e}"
    return out


def _str_attr(attrs: dict[str, Any], *names: str) -> str | None:
    for n in names:
        v = attrs.get(n)
        if v is not None and v != "":
            return str(v)
    return None


def decode_resource(attrs: dict[str, Any]) -> Resource | str:
    """Build the :class:`Resource` of a resource block, or return the rejection reason.

    The node and cluster ids, and the optional cohort (``autorepair.workload_type``), node
    pool and Kubernetes node name, must each pass the one name rule
    (:func:`workflows.names.name_problem`: the repair API's, reserved names such as ``*``
    refused): each becomes a workflow id, a key, a label or a log field. A block naming
    its node (or cluster) under both the contract key and the Ingero alias with different
    values is refused (which would the credential check and the decoder read?)."""
    node = _str_attr(attrs, ATTR_HOST_NAME, INGERO_NODE)
    cluster = _str_attr(attrs, ATTR_CLUSTER, INGERO_CLUSTER)
    if node is None:
        return f"resource: no node id ({ATTR_HOST_NAME} or {INGERO_NODE})"
    if cluster is None:
        return f"resource: no cluster id ({ATTR_CLUSTER} or {INGERO_CLUSTER})"
    for key, alias in ((ATTR_HOST_NAME, INGERO_NODE), (ATTR_CLUSTER, INGERO_CLUSTER)):
        a, b = _str_attr(attrs, key), _str_attr(attrs, alias)
        if a is not None and b is not None and a != b:
            return f"resource: {key} and {alias} name different ids"
    if len(node) > MAX_ID_LEN:
        return f"resource: {ATTR_HOST_NAME} longer than {MAX_ID_LEN} characters"
    if len(cluster) > MAX_ID_LEN:
        return f"resource: {ATTR_CLUSTER} longer than {MAX_ID_LEN} characters"
    cohort = _str_attr(attrs, ATTR_WORKLOAD) or DEFAULT_COHORT
    if len(cohort) > MAX_ID_LEN:
        return f"resource: {ATTR_WORKLOAD} longer than {MAX_ID_LEN} characters"
    pool = _str_attr(attrs, ATTR_NODE_POOL)
    k8s_node = _str_attr(attrs, ATTR_K8S_NODE)
    checks = ((ATTR_HOST_NAME, node), (ATTR_CLUSTER, cluster), (ATTR_WORKLOAD, cohort),
              (ATTR_NODE_POOL, pool), (ATTR_K8S_NODE, k8s_node))
    for key, value in checks:
        if value is not None:
            why = name_problem(value, key)
            if why is not None:
                return f"resource: {why}"
    return Resource(
        cluster=cluster,
        node=node,
        cohort=cohort,
        machine_id=_str_attr(attrs, ATTR_HOST_ID),
        boot_id=_str_attr(attrs, ATTR_BOOT_ID),
        node_pool=pool,
        k8s_node=k8s_node,
        ingero=ATTR_HOST_NAME not in attrs and INGERO_NODE in attrs,
        attrs=attrs,
    )


def _point_value(dp: Any) -> float | None:
    which = dp.WhichOneof("value")
    if which == "as_double":
        return float(dp.as_double)
    if which == "as_int":
        return float(dp.as_int)
    return None


def _time_check(t_ns: int, now: float, max_future_s: float, ttl_s: float) -> float | str:
    if t_ns == 0:
        return now
    t = t_ns / 1e9
    if t > now + max_future_s:
        return f"time_unix_nano: {t_ns} is more than {max_future_s:g} s in the future"
    # I17: a sender's clock may run up to ``max_future_s`` behind as well as ahead; a
    # point is stale only when older than the TTL beyond that allowance (what counts as
    # current is judged on the receipt time: the score map observes a point at ``now``)
    if t < now - ttl_s - max_future_s:
        return (f"time_unix_nano: {t_ns} is older than the score TTL ({ttl_s:g} s) plus "
                f"the sender clock allowance ingest.max_future_s ({max_future_s:g} s)")
    return t


def _count_points(m: Any) -> int:
    which = m.WhichOneof("data")
    if which is None:
        return 0
    return len(getattr(m, which).data_points)


def repeated_identity_key(kvs: Any) -> str | None:
    """The first of :data:`IDENTITY_KEYS` that ``kvs`` (``repeated KeyValue``) holds more
    than once, or ``None``: a repeated identity key is refused whole, since a credential
    check and a decoder that read different copies would disagree on who is reported."""
    seen: set[str] = set()
    kv: KeyValue
    for kv in kvs:
        k = kv.key
        if k in IDENTITY_KEYS:
            if k in seen:
                return k
            seen.add(k)
    return None


#: Most resource blocks :func:`resource_of` keeps decoded. An agent sends the same resource
#: block with every push, so its attributes are bounded, checked and named once; the
#: cache is emptied when full. 16,384 entries (one per active node of a shard, about
#: 1.3 KB each: ~21 MB at most; docs/scaling.md sizes a 2-core ingest for 60,000 nodes,
#: beyond which the hit rate falls and a push costs what it did without the cache).
RESOURCE_CACHE_MAX = 16_384
_resources: dict[tuple[Limits, bytes], tuple[str, str] | Resource] = {}


def resource_of(resource: Any, lim: Limits) -> tuple[str, str] | Resource:
    """:func:`_resource_of` of an OTLP ``Resource`` message, remembered by its serialized
    bytes (the result is a pure function of them and ``lim``; :class:`Resource` is
    frozen, so a shared one cannot be changed by a consumer)."""
    key = (lim, resource.SerializeToString())
    hit = _resources.get(key)
    if hit is None:
        hit = _resource_of(resource.attributes, lim)
        if len(_resources) >= RESOURCE_CACHE_MAX:
            _resources.clear()
        _resources[key] = hit
    return hit


def _resource_of(attrs: Any, lim: Limits) -> tuple[str, str] | Resource:
    """The resource, or ``(code, message)`` of its rejection."""
    if len(attrs) <= lim.attributes:
        dup = repeated_identity_key(attrs)
        if dup is not None:
            return "resource", f"resource: identity attribute {dup!r} repeated"
    d = bounded_attributes(attrs, lim)
    if isinstance(d, str):
        return "attributes", f"resource {d}"
    res = decode_resource(d)
    if isinstance(res, str):
        return "resource", res
    return res


def decode_metrics(
    req: ExportMetricsServiceRequest, now: float, *, max_future_s: float, ttl_s: float,
    limits: Limits = DEFAULT_LIMITS,
) -> Decoded:
    """Decode a metrics export; ``now`` in seconds (epoch). See the module docstring."""
    out = Decoded()
    budget = limits.data_points
    for i, rm in enumerate(req.resource_metrics):
        # the resource's point count matters only when the whole block is rejected: it is
        # counted then, not for every accepted push (a quarter of this function's time)
        if i >= limits.resources:
            out.reject("too_many_resources",
                       f"request: more than {limits.resources} resource blocks",
                       _resource_points(rm))
            continue
        res = resource_of(rm.resource, limits)
        if isinstance(res, tuple):
            out.reject(*res, _resource_points(rm))
            continue
        signals: dict[str, float] = {}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                name = m.name
                is_score = name == METRIC_SCORE or name == INGERO_SCORE
                is_nccl = name == METRIC_NCCL
                short = None if is_score or is_nccl else SIGNAL_METRICS.get(name)
                which = m.WhichOneof("data")
                points = getattr(m, which).data_points if which is not None else ()
                n = len(points)
                if not is_score and not is_nccl and short is None:
                    out.ignored_metrics += n
                    continue
                if n > budget:
                    out.reject("too_many_records",
                               f"request: more than {limits.data_points} data points",
                               n - max(budget, 0))
                budget -= n
                if budget + n <= 0:
                    continue
                take = n if budget >= 0 else n + budget
                if is_nccl:
                    # decoded by ingest.nccl_wire; a metric cut by the point budget was
                    # counted as rejected above and is handed over only when whole
                    if take == n:
                        out.nccl.append((res, m))
                    continue
                if is_score:
                    _decode_scores(out, res, m, now, max_future_s, ttl_s, limits, take)
                    continue
                if which not in ("gauge", "sum"):
                    # the four signals are gauges (docs/wire-contract.md): another type is
                    # malformed, rejected and counted like a score's, never lost silently
                    out.reject("value", f"{name}: must be a gauge, got {which}", take)
                    continue
                for dp in points if take >= n else list(points)[:take]:
                    v = _point_value(dp)
                    if v is None or not math.isfinite(v):
                        out.reject("value", f"{name}: value {v!r} is not a finite number")
                        continue
                    if not 0.0 <= v <= 1.0:
                        # the four signals are ratios, gauge 0..1 (docs/wire-contract.md)
                        out.reject("value", f"{name}: value {v!r} is outside 0..1")
                        continue
                    signals[short or name] = v
        if signals:
            out.signals.append(SignalPoint(res, signals))
    return out


def _resource_points(rm: Any) -> int:
    """Data points of one ``ResourceMetrics`` block (all its metrics)."""
    return sum(_count_points(m) for sm in rm.scope_metrics for m in sm.metrics)


def _decode_scores(
    out: Decoded, res: Resource, m: Any, now: float, max_future_s: float, ttl_s: float,
    lim: Limits, take: int,
) -> None:
    which = m.WhichOneof("data")
    if which not in ("gauge", "sum"):
        out.reject("value", f"{m.name}: must be a gauge, got {which}", take)
        return
    points = getattr(m, which).data_points
    for dp in points if take >= len(points) else list(points)[:take]:
        v = _point_value(dp)
        if v is None or not math.isfinite(v):
            out.reject("value", f"{m.name}: value {v!r} is not a finite number")
            continue
        if not 0.0 <= v <= 1.0:
            out.reject("value", f"{m.name}: value {v!r} outside [0, 1]")
            continue
        t = _time_check(dp.time_unix_nano, now, max_future_s, ttl_s)
        if isinstance(t, str):
            out.reject("timestamp", t)
            continue
        if len(dp.attributes) > lim.attributes:
            out.reject("attributes", f"data point attributes: more than {lim.attributes}")
            continue
        state_raw: Any = None
        for kv in dp.attributes:
            if kv.key == ATTR_STATE or kv.key == INGERO_STATE:
                if kv.value.WhichOneof("value") in ("array_value", "kvlist_value"):
                    state_raw = "(array or key-value list)"
                else:
                    state_raw = any_value(kv.value)
                break
        if state_raw is None:
            state_raw = res.attrs.get(ATTR_STATE, res.attrs.get(INGERO_STATE, "active"))
        try:
            state = NodeState.parse(str(state_raw)[:MAX_KIND_LEN])
        except ValueError as e:
            out.reject("state", str(e)[:200])
            continue
        out.scores.append(ScorePoint(res, v, state, t))


def _as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v != 0
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
        return v.lower() in ("true", "1")
    return None


def decode_logs(
    req: ExportLogsServiceRequest, now: float, *, max_future_s: float,
    limits: Limits = DEFAULT_LIMITS,
) -> Decoded:
    """Decode a logs export: fault and straggler records; other records are ignored."""
    out = Decoded()
    budget = limits.log_records
    for i, rl in enumerate(req.resource_logs):
        n_records = sum(len(sl.log_records) for sl in rl.scope_logs)
        if i >= limits.resources:
            out.reject("too_many_resources",
                       f"request: more than {limits.resources} resource blocks", n_records)
            continue
        res = resource_of(rl.resource, limits)
        if isinstance(res, tuple):
            out.reject(*res, n_records)
            continue
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                budget -= 1
                if budget < 0:
                    out.reject("too_many_records",
                               f"request: more than {limits.log_records} log records")
                    continue
                attrs = bounded_attributes(lr.attributes, limits)
                if isinstance(attrs, str):
                    out.reject("attributes", f"log record {attrs}")
                    continue
                event = lr.event_name or str(attrs.get(EVENT_NAME, ""))
                if event not in (EVENT_FAULT, EVENT_STRAGGLER):
                    out.ignored_metrics += 1
                    continue
                rec = _decode_fault(res, event, attrs, lr, now, max_future_s, limits)
                if isinstance(rec, tuple):
                    out.reject(*rec)
                else:
                    out.faults.append(rec)
    return out


def _decode_fault(
    res: Resource, event: str, attrs: dict[str, Any], lr: Any, now: float,
    max_future_s: float, lim: Limits,
) -> FaultRecord | tuple[str, str]:
    if event == EVENT_STRAGGLER:
        kind: str | None = "straggler"
    else:
        kind = _str_attr(attrs, ATTR_FAULT_KIND)
        if kind is None:
            return "fault", f"log record: {EVENT_FAULT} without {ATTR_FAULT_KIND}"
        if len(kind) > MAX_KIND_LEN:
            return "fault", (f"{ATTR_FAULT_KIND}: {kind[:MAX_KIND_LEN]!r}… longer than "
                             f"{MAX_KIND_LEN} characters")
        why = name_problem(kind, ATTR_FAULT_KIND)
        if why is not None:
            return "fault", why
        if kind.strip().lower() in SENDER_RESERVED_KINDS:
            # control-plane kinds are raised by ingest, the guard and the intake only
            return "fault", (f"{ATTR_FAULT_KIND}: {kind!r} is a control-plane kind "
                             "that senders may not report")
    code_raw = attrs.get(ATTR_FAULT_CODE)
    code: int | None = None
    if code_raw is not None and code_raw != "":
        try:
            if isinstance(code_raw, str) and len(code_raw) > 20:
                raise ValueError(code_raw)
            # int() would read True as 1 and 79.5 as 79: another code, silently
            if isinstance(code_raw, bool) or (
                    isinstance(code_raw, float) and not code_raw.is_integer()):
                raise ValueError(code_raw)
            code = int(code_raw)
        except (TypeError, ValueError, OverflowError):
            shown = code_raw if isinstance(code_raw, bool | float) else str(code_raw)[:64]
            return "fault", f"{ATTR_FAULT_CODE}: {shown!r} is not an integer"
        if not 0 <= code <= MAX_FAULT_CODE:
            return "fault", (f"{ATTR_FAULT_CODE}: {code} is outside 0..{MAX_FAULT_CODE}")
    active_raw = attrs.get(ATTR_FAULT_ACTIVE, True)
    active = _as_bool(active_raw)
    if active is None:
        return "fault", f"{ATTR_FAULT_ACTIVE}: {str(active_raw)[:64]!r} is not a boolean"
    t_ns = lr.time_unix_nano or lr.observed_time_unix_nano
    t = _time_check(t_ns, now, max_future_s, math.inf)
    skew: dict[str, Any] = {}
    if isinstance(t, str):
        # a fault is never dropped for its sender's clock (I17: ingest's receipt time
        # judges it): stamped ``now``, the sender's own time kept as evidence
        skew = {"sender_time_unix_nano": t_ns, "sender_clock_ahead_s": round(t_ns / 1e9 - now)}
        t = now
    if lr.body.WhichOneof("value") == "string_value":
        body: Any = lr.body.string_value
    else:
        budget = [lim.attributes]
        try:
            body = _bounded_value(lr.body, 0, budget, lim)
        except _OverLimit as e:
            return "attributes", f"log record body: {e}"
    text = body if isinstance(body, str) else ("" if body is None else str(body))
    if len(text) > MAX_EVIDENCE_LEN:
        text = text[:MAX_EVIDENCE_LEN] + "\n[truncated by ingest]"
    evidence: dict[str, Any] = {}
    for k, v in attrs.items():
        if k.startswith(FAULT_PREFIX) and k not in (ATTR_FAULT_KIND, ATTR_FAULT_CODE):
            key = k[len(FAULT_PREFIX):]
            if key != "active":
                evidence[key] = v[:4096] if isinstance(v, str) else v
        elif k.startswith("autorepair.straggler.") or k.startswith("autorepair.node."):
            evidence[k.removeprefix("autorepair.")] = v
    evidence |= skew
    gpu = _str_attr(attrs, ATTR_GPU_PCI)
    return FaultRecord(
        resource=res,
        event=event,
        kind=kind or "straggler",
        code=code,
        gpu=gpu[:64] if gpu else None,
        active=active,
        evidence_text=text,
        evidence=evidence,
        time_s=t,
    )


def _kv(key: str, value: Any) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.string_value = str(value)
    return kv


def make_metrics_request(
    cluster: str,
    node: str,
    score: float,
    *,
    state: str = "active",
    workload: str | None = "training",
    signals: dict[str, float] | None = None,
    time_ns: int = 0,
    machine_id: str | None = None,
    boot_id: str | None = None,
    extra_resource: dict[str, Any] | None = None,
) -> ExportMetricsServiceRequest:
    """A contract-shaped agent push (docs/design.md §4.3): resource attributes, the health score
    gauge with its state attribute and the signal gauges (short names, e.g.
    ``throughput_ratio``). For tests, the benchmark and tools; the agent has its own."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    res = {ATTR_HOST_NAME: node, ATTR_CLUSTER: cluster}
    if workload:
        res[ATTR_WORKLOAD] = workload
    if machine_id:
        res[ATTR_HOST_ID] = machine_id
    if boot_id:
        res[ATTR_BOOT_ID] = boot_id
    rm.resource.attributes.extend(_kv(k, v) for k, v in {**res, **(extra_resource or {})}.items())
    sm = rm.scope_metrics.add()
    sm.scope.name = "autorepair-agent"
    m = sm.metrics.add()
    m.name = METRIC_SCORE
    dp = m.gauge.data_points.add()
    dp.as_double = score
    dp.time_unix_nano = time_ns
    dp.attributes.append(_kv(ATTR_STATE, state))
    short_to_name = {v: k for k, v in SIGNAL_METRICS.items()}
    for short, value in (signals or {}).items():
        sg = sm.metrics.add()
        sg.name = short_to_name[short]
        sp = sg.gauge.data_points.add()
        sp.as_double = value
        sp.time_unix_nano = time_ns
    return req


def make_fault_request(
    cluster: str,
    node: str,
    *,
    kind: str,
    body: str,
    code: int | None = None,
    gpu: str | None = None,
    active: bool = True,
    event: str = EVENT_FAULT,
    time_ns: int = 0,
    evidence: dict[str, Any] | None = None,
) -> ExportLogsServiceRequest:
    """A contract-shaped fault (or straggler) log record push (docs/design.md §4.3)."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend([_kv(ATTR_HOST_NAME, node), _kv(ATTR_CLUSTER, cluster)])
    lr = rl.scope_logs.add().log_records.add()
    lr.time_unix_nano = time_ns
    lr.body.string_value = body
    attrs: dict[str, Any] = {EVENT_NAME: event, ATTR_FAULT_KIND: kind, ATTR_FAULT_ACTIVE: active}
    if code is not None:
        attrs[ATTR_FAULT_CODE] = code
    if gpu is not None:
        attrs[ATTR_GPU_PCI] = gpu
    for k, v in (evidence or {}).items():
        attrs[FAULT_PREFIX + k] = v
    lr.attributes.extend(_kv(k, v) for k, v in attrs.items())
    return req


def identity_violation(
    req: ExportMetricsServiceRequest | ExportLogsServiceRequest,
    may_report: Callable[[str, str], bool], limits: Limits = DEFAULT_LIMITS,
) -> tuple[int, str] | None:
    """``(points or records concerned, message)`` when a resource block of ``req`` names a
    node that ``may_report(cluster, node)`` refuses; ``None`` when all may be reported.
    Blocks without a valid identity are left to the decoder (rejected there)."""
    if isinstance(req, ExportMetricsServiceRequest):
        blocks: Any = req.resource_metrics
    else:
        blocks = req.resource_logs
    bad = 0
    first: tuple[str, str] | None = None
    for i, b in enumerate(blocks):
        if i >= limits.resources:
            break
        res = _resource_of(b.resource.attributes, limits)
        if isinstance(res, tuple) or may_report(res.cluster, res.node):
            continue
        if isinstance(b, ResourceMetrics):
            bad += sum(_count_points(m) for sm in b.scope_metrics for m in sm.metrics)
        else:
            bad += sum(len(sl.log_records) for sl in b.scope_logs)
        first = first or (res.cluster, res.node)
    if first is None:
        return None
    return max(bad, 1), (f"may not report for node {first[1][:MAX_KIND_LEN]!r} of cluster "
                         f"{first[0][:MAX_KIND_LEN]!r}")
