"""The table ``make bench`` ends with: every figure issue 30 names, beside its target.

Usage: ``python -m tests.bench.support.summary DIR`` where ``DIR/<bench>.json`` holds the
last line each benchmark printed (its figures as one JSON object; ``make bench`` writes
them). Prints one row per figure — benchmark, figure, value, target, whether it is met
(``yes`` / ``NO`` / ``—`` where the figure has no target or the benchmark did not run) —
and, last, one JSON line ``{"figures": {...}, "targets_missed": [...]}``. Exit status 0:
a missed target is a finding to report, not a broken build (the benchmarks themselves
fail when they cannot measure).

The targets are issue 30's table (measured on 2 cores): the storm's breaker ≤ 10 s after
the fault that brings the count to the threshold, phase 1 settled ≤ 90 s, clears → every
repair ended ≤ 60 s; alert → repair visible p99 ≤ 120 ms; Temporal + worker CPU per alert
≤ 150 ms; repair overhead beyond waits ≤ 10 s (the median of the runs); HTTP ingest over
bare uvicorn at saturation ≥ 0.5; the guard ≥ 100 lease decisions/s.
"""

from __future__ import annotations

import json
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

Figures = dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Row:
    """One figure: ``read`` takes every benchmark's figures and returns the value (None
    when the benchmark or its key is absent); ``target`` is ``(op, bound)`` or None."""

    bench: str
    label: str
    unit: str
    read: Callable[[Figures], float | None]
    target: tuple[str, float] | None = None


def key(bench: str, name: str) -> Callable[[Figures], float | None]:
    """Reader of ``figures[bench][name]`` (None when absent or not a number)."""

    def read(f: Figures) -> float | None:
        v = f.get(bench, {}).get(name)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return read


def total(bench: str, *names: str) -> Callable[[Figures], float | None]:
    """Reader of the sum of several figures of one benchmark (None when one is absent)."""

    def read(f: Figures) -> float | None:
        parts = [key(bench, n)(f) for n in names]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    return read


ROWS: tuple[Row, ...] = (
    Row("storm", "breaker trip after the threshold-th fault", "s",
        key("storm", "breaker_trip_after_threshold_s"), ("<=", 10.0)),
    Row("storm", "breaker trip after the first fault", "s", key("storm", "breaker_trip_s")),
    Row("storm", "phase 1 settled", "s", key("storm", "phase1_settle_s"), ("<=", 90.0)),
    Row("storm", "clears sent → every repair ended", "s",
        key("storm", "clear_to_all_ended_s"), ("<=", 60.0)),
    Row("storm", "peak workflow starts", "/s", key("storm", "peak_workflow_starts_per_s")),
    Row("storm", "Temporal CPU, phase 1", "cores", key("storm", "temporal_cpu_cores_phase1")),
    Row("storm", "worker CPU, phase 1", "cores", key("storm", "worker_cpu_cores_phase1")),
    Row("storm", "duplicate repairs", "", key("storm", "duplicates"), ("<=", 0.0)),
    Row("storm", "repairs that acted after the reset", "", key("storm", "acted_after_reset"),
        ("<=", 0.0)),
    Row("storm", "alerts in the ledger within 10 s", "%", key("storm", "ledger_complete_pct"),
        (">=", 100.0)),
    Row("orchestration", "alert → repair visible p50", "ms",
        key("orchestration", "alert_to_repair_p50_ms")),
    Row("orchestration", "alert → repair visible p99", "ms",
        key("orchestration", "alert_to_repair_p99_ms"), ("<=", 120.0)),
    Row("orchestration", "bare start_workflow p50", "ms",
        key("orchestration", "bare_start_p50_ms")),
    Row("orchestration", "CPU per alert, Temporal + worker", "ms",
        total("orchestration", "temporal_cpu_ms_per_alert", "worker_cpu_ms_per_alert"),
        ("<=", 150.0)),
    Row("orchestration", "CPU per alert, ingest", "ms",
        key("orchestration", "ingest_cpu_ms_per_alert")),
    Row("repair_overhead", "repair overhead beyond waits, median", "s",
        key("repair_overhead", "overhead_median_s"), ("<=", 10.0)),
    Row("repair_overhead", "repair overhead, worst run", "s",
        key("repair_overhead", "overhead_max_s")),
    Row("ingest", "HTTP ingest / bare uvicorn at saturation", "×",
        key("ingest", "http_ingest_over_bare_throughput_ratio"), (">=", 0.5)),
    Row("ingest", "gRPC ingest / bare at saturation", "×",
        key("ingest", "grpc_ingest_over_bare_throughput_ratio")),
    Row("guard_throughput", "lease decisions", "/s",
        key("guard_throughput", "decisions_per_s"), (">=", 100.0)),
    Row("guard_throughput", "lease decision latency p99", "ms",
        key("guard_throughput", "decision_p99_ms")),
    Row("guard_throughput", "last reply after the last request", "s",
        key("guard_throughput", "last_reply_after_last_request_s")),
    Row("signal_floor", "signals into one workflow, 4 in flight", "/s",
        key("signal_floor", "into_one_c4_per_s")),
    Row("signal_floor", "Temporal CPU of a signal that wakes a workflow", "ms",
        key("signal_floor", "wake_to_completion_temporal_ms")),
)

_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


def met(value: float | None, target: tuple[str, float] | None) -> bool | None:
    """Whether ``value`` meets ``target`` (None: no target, or no value to judge)."""
    if target is None or value is None or math.isnan(value):
        return None
    op, bound = target
    return _OPS[op](value, bound)


def load(directory: Path) -> Figures:
    """``{bench: figures}`` from ``directory/<bench>.json``; a file that is not one JSON
    object raises ``ValueError`` naming the file."""
    out: Figures = {}
    for path in sorted(directory.glob("*.json")):
        text = path.read_text().strip()
        try:
            value = json.loads(text.splitlines()[-1]) if text else None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: the benchmark's last line is not JSON ({err})") from err
        if not isinstance(value, dict):
            raise ValueError(f"{path}: the benchmark's last line is not a JSON object")
        out[path.stem] = value
    return out


def summarise(figures: Figures) -> tuple[list[tuple[Row, float | None, bool | None]],
                                          dict[str, Any]]:
    """Rows with value and verdict, and the JSON summary (figures by ``bench.label``,
    and the labels of missed targets)."""
    rows = [(r, r.read(figures), met(r.read(figures), r.target)) for r in ROWS]
    summary = {
        "figures": {f"{r.bench}: {r.label}": v for r, v, _ in rows},
        "targets": {f"{r.bench}: {r.label}": f"{r.target[0]} {r.target[1]:g}"
                    for r, _, _ in rows if r.target},
        "targets_missed": [f"{r.bench}: {r.label}" for r, _, ok in rows if ok is False],
        "benchmarks_run": sorted(figures),
    }
    return rows, summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.bench.support.summary DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    if not directory.is_dir():
        print(f"summary: {directory} is not a directory of benchmark figures", file=sys.stderr)
        return 2
    rows, summary = summarise(load(directory))
    table = Table(title="make bench: issue 30's figures and targets")
    for name, justify in (("benchmark", "left"), ("figure", "left"), ("value", "right"),
                          ("target", "right"), ("met", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r, v, ok in rows:
        value = "not run" if v is None else f"{v:,.2f} {r.unit}".strip()
        target = "—" if r.target is None else f"{r.target[0]} {r.target[1]:g} {r.unit}".strip()
        table.add_row(r.bench, r.label, value, target,
                      "—" if ok is None else ("yes" if ok else "NO"))
    Console(width=120).print(table)
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
