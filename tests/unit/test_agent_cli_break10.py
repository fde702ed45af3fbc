"""``autorepair-agent run`` refuses a bad ``--log-level`` and ``--expected-gpus 0`` with
exit 2 naming the option and the value (its help: "2 bad arguments"). Both were taken
silently: an unknown level logged at INFO, and 0 expected GPUs checked nothing (the
simulated backend even made 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app

BASE = ["run", "--endpoint", "http://127.0.0.1:9", "--cluster", "c", "--node", "n1",
        "--backend", "simulated", "--kernel-log", "none", "--duration", "0.5"]


@pytest.mark.parametrize(("args", "option", "value"), [
    (["--log-level", "bogus"], "--log-level", "bogus"),
    (["--expected-gpus", "0"], "--expected-gpus", "0"),
    (["--expected-gpus", "-2"], "--expected-gpus", "-2"),
])
def test_bad_run_arguments_exit_2_naming_the_option(
        tmp_path: Path, args: list[str], option: str, value: str) -> None:
    r = CliRunner().invoke(app, [*BASE, "--state-dir", str(tmp_path), *args],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    out = " ".join(r.output.split())
    assert option in out and value in out, out


@pytest.mark.parametrize("level", ["bogus", "verbose"])
def test_bad_simulate_log_level_exits_2(tmp_path: Path, level: str) -> None:
    r = CliRunner().invoke(app, ["simulate", "--endpoint", "http://127.0.0.1:9", "--cluster",
                                 "c", "--nodes", "1", "--duration", "0.5", "--state-dir",
                                 str(tmp_path), "--log-level", level], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "--log-level" in out and level in out, out


def test_expected_gpus_in_the_config_file_must_be_at_least_1(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("endpoint: http://127.0.0.1:9\ncluster: c\nnode: n1\nbackend: simulated\n"
                   f"kernel_log: none\nstate_dir: {tmp_path}\nexpected_gpus: 0\n")
    r = CliRunner().invoke(app, ["run", "--config", str(cfg), "--duration", "0.5"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "expected_gpus" in r.output and "0" in r.output, r.output


@pytest.mark.parametrize("level", ["DEBUG", "info", "Warning", "error"])
def test_known_log_levels_are_taken(tmp_path: Path, level: str) -> None:
    r = CliRunner().invoke(app, [*BASE, "--state-dir", str(tmp_path), "--log-level", level,
                                 "--expected-gpus", "2"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
