"""Bad Temporal settings of a client command exit 2 with a message naming the setting or
option and its value, as other configuration errors do: ``autorepair breaker status`` /
``autorepair validate`` with a ``temporal.tls.server_ca`` file that cannot be read, or
``--temporal-address 127.0.0.1:99999``, exited 1 with ``error: ValueError: …`` (the
address one naming neither the option nor the value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from workers.cli import app


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, [*args, "--data-dir", str(tmp_path / "dd")],
                           env={"COLUMNS": "200", "AUTOREPAIR_CONFIG": None})
    return r.exit_code, " ".join(r.output.split())


@pytest.mark.parametrize("command", [
    ("breaker", "status", "--cluster", "c1"),
    ("breaker", "reset", "--cluster", "c1", "--reason", "x"),
    ("validate", "m1", "--cluster", "c1", "--api", "http://127.0.0.1:9", "--token", "t"),
])
def test_an_unreadable_server_ca_exits_2_naming_the_setting(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "missing-ca.pem"
    cfg = tmp_path / "autorepair.yaml"
    cfg.write_text(f"temporal:\n  tls:\n    server_ca: {missing}\n"
                   "clusters:\n  - name: c1\n    scheduler: slurm\n")
    code, out = _run(tmp_path, *command, "--config", str(cfg))
    assert code == 2, out
    assert "temporal.tls.server_ca" in out and str(missing) in out, out
    assert "ValueError" not in out, out


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:http",
                                     "127.0.0.1", ":7233"])
@pytest.mark.parametrize("command", [
    ("breaker", "status", "--cluster", "c1"),
    ("validate", "m1", "--cluster", "c1", "--api", "http://127.0.0.1:9", "--token", "t"),
])
def test_a_bad_temporal_address_exits_2_naming_the_option(
        tmp_path: Path, address: str, command: tuple[str, ...]) -> None:
    code, out = _run(tmp_path, *command, "--temporal-address", address)
    assert code == 2, out
    assert "--temporal-address" in out and repr(address) in out, out
    assert "ValueError" not in out, out


def test_a_bad_configured_address_exits_2_naming_the_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "autorepair.yaml"
    cfg.write_text("temporal:\n  address: 127.0.0.1:99999\n")
    code, out = _run(tmp_path, "breaker", "status", "--cluster", "c1", "--config", str(cfg))
    assert code == 2, out
    assert "temporal.address" in out and "127.0.0.1:99999" in out, out
    assert "ValueError" not in out, out
