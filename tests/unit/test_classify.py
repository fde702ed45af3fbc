"""``autorepair classify``: files, stdin, invalid UTF-8, errors, output shape."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import corpus
from workers.classify import BASE_FIELDS, classify_command, classify_text

ROOT = Path(__file__).resolve().parents[2]
CORPUS = corpus.CORPUS


def test_whole_corpus_as_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [json.loads(x) for x in CORPUS.read_text().splitlines() if x.strip()]
    f = tmp_path / "all.log"
    f.write_text("\n\n".join(r["text"] for r in records) + "\n")
    assert classify_command(str(f)) == 0
    lines = capsys.readouterr().out.splitlines()
    objs = [json.loads(x) for x in lines]
    # records apart by a blank line never interact: the file gives each record's own
    # events, in order (a ``multi`` record gives several; each record is checked alone
    # against its ``expect`` in test_readers)
    expected = [o["kind"] for r in records for o in classify_text(r["text"])]
    assert [o["kind"] for o in objs] == expected
    for o in objs:
        assert list(o)[: len(BASE_FIELDS)] == list(BASE_FIELDS)


def test_stdin_and_invalid_utf8(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b"\xff\xfe[1.0] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n\xc3(\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    out = io.StringIO()
    assert classify_command("-", out=out) == 0
    (obj,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert obj["xid"] == 79 and obj["action"] == "power_cycle"


def test_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.log"
    assert classify_command(str(missing)) == 2
    assert str(missing) in capsys.readouterr().err


def test_negative_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "neg.log"
    f.write_text("EXT4-fs (nvme0n1p5): re-mounted. Opts: errors=remount-ro. Quota mode: none.\n")
    assert classify_command(str(f)) == 0
    assert capsys.readouterr().out == ""


def test_cli_end_to_end_subprocess(tmp_path: Path) -> None:
    f = tmp_path / "k.log"
    f.write_text("[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n")
    code = (
        "import sys; from workers.classify import classify_command; "
        "sys.exit(classify_command(sys.argv[1]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(f)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["kind"] == "gpu_lost" and obj["pci"] == "0000:01:00.0"


def test_vendored_corpus_copy_is_current() -> None:
    if not corpus.SHARED_CORPUS.exists():
        pytest.skip("../shared/corpus is not beside this checkout; the vendored copy is used")
    assert corpus.VENDORED_CORPUS.read_bytes() == corpus.SHARED_CORPUS.read_bytes(), (
        "tests/data/signals/real-inputs.jsonl is stale: copy ../shared/corpus/real-inputs.jsonl"
    )


def test_slurm_fields_printed_once() -> None:
    (obj,) = classify_text(
        "NodeName=gpu-07 Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=1\n"
        "   Reason=Kill task failed [root@2024-02-03T04:05:06]\n"
    )
    assert obj["state"] == ["IDLE", "DRAIN"] and obj["reason"] == "Kill task failed"
    assert obj["reason_user"] == "root" and obj["reason_time"] == "2024-02-03T04:05:06"
    assert not any(k.startswith("error_") for k in obj), obj


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_json_flag_is_accepted_and_changes_nothing(tmp_path: Path, flags: list[str]) -> None:
    # docs/design.md §4.1: --json works on every read command; classify always prints JSON lines
    from typer.testing import CliRunner

    from workers.cli import app

    f = tmp_path / "k.log"
    f.write_text("[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n")
    r = CliRunner().invoke(app, ["classify", *flags, str(f)])
    assert r.exit_code == 0, r.output
    assert [json.loads(ln)["kind"] for ln in r.output.splitlines()] == ["gpu_lost"]
