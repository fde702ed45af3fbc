"""``autorepair-agent run`` with a TLS file it cannot read exits 2 naming the option and
the path; it crashed with a traceback ("FileNotFoundError: [Errno 2] No such file or
directory", no path, exit 1) from building the TLS context."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("option", ["--ca-file", "--client-cert"])
def test_an_unreadable_tls_file_exits_2_naming_it(
        tmp_path: Path, option: str, transport: str) -> None:
    missing = tmp_path / "missing.pem"
    extra = ["--client-key", str(missing)] if option == "--client-cert" else []
    r = CliRunner().invoke(app, [
        "run", "--endpoint", "https://127.0.0.1:9", "--cluster", "c", "--node", "gpu-01",
        "--backend", "simulated", "--kernel-log", "none", "--state-dir", str(tmp_path),
        "--transport", transport, "--duration", "1", option, str(missing), *extra],
        env={"COLUMNS": "300"})
    assert r.exit_code == 2, (r.output, r.exception)
    out = " ".join(r.output.split())
    assert option in out and str(missing) in out, out
