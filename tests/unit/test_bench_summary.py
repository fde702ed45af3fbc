"""``make bench``'s closing table (tests/bench/support/summary.py) and the storm's
``breaker_trip_after_threshold_s`` (issue 30 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.storm import trip_after_threshold
from tests.bench.support import summary


def test_trip_is_measured_from_the_fault_that_exceeds_the_threshold() -> None:
    pushes = {f"n{i}": 100.0 + i for i in range(10)}  # arrivals at 100 … 109
    # threshold 3: the 4th fault (arrived at 103) takes the count past it
    assert trip_after_threshold(pushes, 3, 108.5) == pytest.approx(5.5)
    assert trip_after_threshold(pushes, 3, None) is None  # never tripped
    assert trip_after_threshold(pushes, 10, 120.0) is None  # not enough faults arrived


def test_summary_judges_each_figure_against_its_target(tmp_path: Path) -> None:
    (tmp_path / "storm.json").write_text(
        "phase 1: {}\n" + json.dumps({"breaker_trip_after_threshold_s": 4.0,
                                      "phase1_settle_s": 120.0, "duplicates": 0}))
    (tmp_path / "orchestration.json").write_text(json.dumps(
        {"alert_to_repair_p99_ms": 100.0, "temporal_cpu_ms_per_alert": 120.0,
         "worker_cpu_ms_per_alert": 40.0}))
    rows, out = summary.summarise(summary.load(tmp_path))
    verdict = {f"{r.bench}: {r.label}": ok for r, _, ok in rows}
    assert verdict["storm: breaker trip after the threshold-th fault"] is True
    assert verdict["storm: phase 1 settled"] is False  # 120 s > 90 s
    assert verdict["storm: duplicate repairs"] is True
    assert verdict["orchestration: alert → repair visible p99"] is True
    # 120 + 40 = 160 ms > 150 ms: the sum is judged, not each part
    assert verdict["orchestration: CPU per alert, Temporal + worker"] is False
    assert out["figures"]["orchestration: CPU per alert, Temporal + worker"] == 160.0
    assert verdict["guard_throughput: lease decisions"] is None  # not run: not judged
    assert sorted(out["targets_missed"]) == [
        "orchestration: CPU per alert, Temporal + worker", "storm: phase 1 settled"]
    assert out["benchmarks_run"] == ["orchestration", "storm"]


def test_summary_names_a_file_whose_last_line_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "ingest.json").write_text("Traceback (most recent call last):\n  boom\n")
    with pytest.raises(ValueError, match=r"ingest\.json"):
        summary.load(tmp_path)


def test_summary_command_prints_the_table_and_a_last_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "guard_throughput.json").write_text(json.dumps({"decisions_per_s": 12.5}))
    assert summary.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("lease decisions" in ln and "12.50 /s" in ln and "NO" in ln for ln in lines)
    assert json.loads(lines[-1])["targets_missed"] == ["guard_throughput: lease decisions"]
    assert summary.main([str(tmp_path / "absent")]) == 2
