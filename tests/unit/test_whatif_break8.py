"""``autorepair whatif --since`` after now is refused naming the option (exit 2), as a
malformed one is (tests/unit/test_whatif.py::test_cli_rejects_bad_since_and_bad_config):
a window that starts in the future replays nothing and printed "no difference"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from workers.fleet_models import parse_since


def test_whatif_since_in_the_future_exits_2_naming_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from workers.cli import app

    good = tmp_path / "new.yaml"
    good.write_text("policy:\n  consent:\n    mode: automatic\n")
    future = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    r = CliRunner().invoke(app, ["whatif", "--config", str(good), "--since", future,
                                 "--ledger-dsn", "postgresql://nobody@127.0.0.1:1/x"],
                           env={"AUTOREPAIR_CONFIG": ""})
    assert r.exit_code == 2, r.output
    assert "--since" in r.output and future in r.output


def test_parse_since_refuses_a_time_after_now() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert parse_since("2026-05-01T00:00:00Z", now) == datetime(2026, 5, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="2026-07-01"):
        parse_since("2026-07-01T00:00:00Z", now)
