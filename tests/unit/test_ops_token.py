"""Where the client commands find the API token (docs/design.md §4.1: ``--data-dir`` /
``AUTOREPAIR_DATA_DIR``, default ``.autorepair``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.ops import resolve_token


def test_explicit_token_wins_over_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "operator.token").write_text("from-file")
    t = resolve_token("from-flag", tmp_path)
    assert (t.token, t.source) == ("from-flag", "--token")


def test_token_file_in_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "operator.token").write_text("  tok-123\n")
    t = resolve_token(None, tmp_path)
    assert t.token == "tok-123" and t.source == str(tmp_path / "operator.token")
    assert str(tmp_path) in t.help_401() and "refused" in t.help_401()


def test_relative_data_dir_is_taken_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".autorepair").mkdir()
    (tmp_path / ".autorepair" / "operator.token").write_text("dev")
    assert resolve_token(None).token == "dev"
    assert resolve_token(None).token_file == tmp_path / ".autorepair" / "operator.token"


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_missing_or_empty_file_is_no_token_and_says_where_it_looked(
    tmp_path: Path, content: str | None
) -> None:
    if content is not None:
        (tmp_path / "operator.token").write_text(content)
    t = resolve_token(None, tmp_path)
    assert t.token is None
    msg = t.help_401()
    assert str(tmp_path / "operator.token") in msg
    for hint in ("--token", "AUTOREPAIR_TOKEN", "--data-dir", "AUTOREPAIR_DATA_DIR"):
        assert hint in msg


def test_unreadable_token_path_is_no_token(tmp_path: Path) -> None:
    (tmp_path / "operator.token").mkdir()  # a directory where the file should be
    assert resolve_token(None, tmp_path).token is None
