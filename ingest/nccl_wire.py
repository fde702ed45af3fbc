"""Decoding of ``autorepair.nccl.collective.duration_ms`` points (docs/design.md §4.5) into columns
for :class:`ingest.nccl.NcclEngine`.

The metric is a gauge (one point per rank and op, value = the rank's duration in ms) or a
histogram (value = ``sum / count`` of the point). Data-point attributes: ``nccl.comm_id_hash``
(string; an integer is read as hex), ``nccl.op_type``, ``nccl.op_seq``, ``nccl.rank``,
``nccl.nranks`` (integers), optional ``nccl.bytes``. The node is the resource's
``host.name``. A point without one of the required attributes, with one of the wrong type,
or without a value is rejected with a reason; range checks (rank < nranks, duration ≥ 0,
…) are the engine's. Never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ingest.otlp import any_value
from workflows.names import name_problem

METRIC_NCCL = "autorepair.nccl.collective.duration_ms"
ATTR_COMM = "nccl.comm_id_hash"
ATTR_OP_TYPE = "nccl.op_type"
ATTR_OP_SEQ = "nccl.op_seq"
ATTR_RANK = "nccl.rank"
ATTR_NRANKS = "nccl.nranks"
ATTR_BYTES = "nccl.bytes"
MAX_TEXT = 128
"""Longest ``nccl.comm_id_hash`` / ``nccl.op_type`` kept (a 64-bit hash is 16 hex digits).
Both must also pass the name rule of :mod:`workflows.names` (no whitespace, control
characters or separators: they become keys, metric labels and log fields)."""
_INT_KEYS = {ATTR_OP_SEQ: 0, ATTR_RANK: 1, ATTR_NRANKS: 2}


@dataclass(slots=True)
class NcclColumns:
    """The points of one resource for one (communicator, nranks), column-wise."""

    comm: str
    nranks: int
    seq: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    dur: list[float] = field(default_factory=list)
    op_type: list[str] = field(default_factory=list)


def _text(v: Any) -> str | None:
    which = v.WhichOneof("value")
    if which == "string_value":
        s = str(v.string_value)
        return s if s and len(s) <= MAX_TEXT else None
    if which == "int_value":
        return format(v.int_value & 0xFFFFFFFFFFFFFFFF, "x")
    return None


def _integer(v: Any) -> int | None:
    which = v.WhichOneof("value")
    if which == "int_value":
        return int(v.int_value)
    if which == "double_value" and float(v.double_value).is_integer():
        return int(v.double_value)
    if which == "string_value" and v.string_value.isdigit():
        return int(v.string_value)
    return None


def _value(kind: str, dp: Any) -> float | None:
    if kind == "histogram":
        return float(dp.sum) / dp.count if dp.count > 0 and dp.HasField("sum") else None
    which = dp.WhichOneof("value")
    if which == "as_double":
        return float(dp.as_double)
    if which == "as_int":
        return float(dp.as_int)
    return None


def decode_nccl(metric: Any, reject: Callable[[str], None]) -> list[NcclColumns]:
    """Columns per (communicator, nranks) from one OTLP ``Metric``; each bad point is
    passed to ``reject`` with its reason."""
    kind = metric.WhichOneof("data")
    if kind not in ("gauge", "sum", "histogram"):
        n = len(getattr(metric, kind).data_points) if kind else 0
        for _ in range(n):
            reject(f"{METRIC_NCCL}: must be a gauge or histogram, got {kind}")
        return []
    groups: dict[tuple[str, int], NcclColumns] = {}
    histogram = kind == "histogram"
    # Hot loop (one pass per point, ~10k points/s for a 1,000-rank communicator at
    # 10 ops/s): read the expected field first, ask WhichOneof only when it is empty.
    for dp in getattr(metric, kind).data_points:
        comm: str | None = None
        op_type: str | None = None
        seq: int | None = None
        rank: int | None = None
        nranks: int | None = None
        bad: str | None = None
        for kv in dp.attributes:
            k = kv.key
            v = kv.value
            if k == ATTR_COMM or k == ATTR_OP_TYPE:
                text = v.string_value
                if not text or len(text) > MAX_TEXT:
                    text = _text(v)
                if text is None:
                    bad = f"{k}: not a string of 1..{MAX_TEXT} characters"
                elif (why := name_problem(text, k)) is not None:
                    # a communicator becomes a key, a metric label and a log field
                    bad = why
                elif k == ATTR_COMM:
                    comm = text
                else:
                    op_type = text
            elif k in _INT_KEYS:
                i: int | None = v.int_value
                if not i and v.WhichOneof("value") != "int_value":
                    i = _integer(v)
                    if i is None:
                        bad = f"{k}: {str(any_value(v))[:60]!r} is not an integer"
                if k == ATTR_RANK:
                    rank = i
                elif k == ATTR_OP_SEQ:
                    seq = i
                else:
                    nranks = i
        if bad is None and (comm is None or seq is None or rank is None or nranks is None):
            missing = [name for name, val in ((ATTR_COMM, comm), (ATTR_OP_SEQ, seq),
                                              (ATTR_RANK, rank), (ATTR_NRANKS, nranks))
                       if val is None]
            bad = f"{METRIC_NCCL}: data point without {', '.join(missing)}"
        if histogram:
            value = float(dp.sum) / dp.count if dp.count > 0 and dp.HasField("sum") else None
        else:
            value = dp.as_double
            if not value:
                value = _value(kind, dp)
        if bad is None and value is None:
            bad = f"{METRIC_NCCL}: data point without a value"
        if bad is not None:
            reject(bad)
            continue
        assert comm is not None and value is not None and nranks is not None
        assert seq is not None and rank is not None
        key = (comm, nranks)
        cols = groups.get(key)
        if cols is None:
            cols = groups[key] = NcclColumns(comm, nranks)
        cols.seq.append(seq)
        cols.rank.append(rank)
        cols.dur.append(value)
        cols.op_type.append(op_type or "unknown")
    return list(groups.values())
