"""Decoding of ``autorepair.nccl.collective.duration_ms`` points (DESIGN §4.5) into columns
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

METRIC_NCCL = "autorepair.nccl.collective.duration_ms"
ATTR_COMM = "nccl.comm_id_hash"
ATTR_OP_TYPE = "nccl.op_type"
ATTR_OP_SEQ = "nccl.op_seq"
ATTR_RANK = "nccl.rank"
ATTR_NRANKS = "nccl.nranks"
ATTR_BYTES = "nccl.bytes"
MAX_TEXT = 128
"""Longest ``nccl.comm_id_hash`` / ``nccl.op_type`` kept (a 64-bit hash is 16 hex digits)."""
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
    for dp in getattr(metric, kind).data_points:
        comm: str | None = None
        op_type: str | None = None
        ints: list[int | None] = [None, None, None]
        bad: str | None = None
        for kv in dp.attributes:
            k = kv.key
            if k == ATTR_COMM:
                comm = _text(kv.value)
                if comm is None:
                    bad = f"{ATTR_COMM}: not a string of 1..{MAX_TEXT} characters"
            elif k == ATTR_OP_TYPE:
                op_type = _text(kv.value)
                if op_type is None:
                    bad = f"{ATTR_OP_TYPE}: not a string of 1..{MAX_TEXT} characters"
            elif k in _INT_KEYS:
                i = _integer(kv.value)
                if i is None:
                    bad = f"{k}: {str(any_value(kv.value))[:60]!r} is not an integer"
                ints[_INT_KEYS[k]] = i
        if bad is None:
            missing = [name for name, v in ((ATTR_COMM, comm), (ATTR_OP_SEQ, ints[0]),
                                            (ATTR_RANK, ints[1]), (ATTR_NRANKS, ints[2]))
                       if v is None]
            if missing:
                bad = f"{METRIC_NCCL}: data point without {', '.join(missing)}"
        value = _value(kind, dp)
        if bad is None and value is None:
            bad = f"{METRIC_NCCL}: data point without a value"
        if bad is not None:
            reject(bad)
            continue
        assert comm is not None and value is not None
        seq, rank, nranks = ints
        key = (comm, int(nranks))  # type: ignore[arg-type]
        cols = groups.get(key)
        if cols is None:
            cols = groups[key] = NcclColumns(comm, int(nranks))  # type: ignore[arg-type]
        cols.seq.append(int(seq))  # type: ignore[arg-type]
        cols.rank.append(int(rank))  # type: ignore[arg-type]
        cols.dur.append(value)
        cols.op_type.append(op_type or "unknown")
    return list(groups.values())
