"""A multi-line kernel record split across two kernel-log reads is one fault, as in one
read.

The agent's follower flushes the reader at the end of every read that reached the end of
the log; the flush closed a record still waiting for its next part, and that part, read
in the next read, started a record of its own: an NVSwitch SXid whose ``Severity`` /
``Data`` lines came after the read (corpus ``r2-h07``, parts printed 34 ms apart) was two
``sxid`` faults, likewise a PCIe AER report, an ``RmInitAdapter failed`` with its
``rm_init_adapter failed`` line and an mlx5 health report. The reader now keeps the
records a flush cut while they waited, for the rest of their own gap (lines) and
:data:`~agent.readers.kernel.common.CUT_RECORD_S`; a later part one of them accepts
joins it and raises nothing new. Property: every line boundary of the text gives the
faults (kind, code, device) of the unsplit text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.kmsg import KernelLogFollower
from agent.readers import FaultEvent, KernelLogReader
from agent.readers.kernel.common import CUT_RECORD_S, MULTI_LINE_GAP
from tests import corpus

ROOT = Path(__file__).resolve().parents[2]
_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
SXID = _RECORDS["r2-h07"]["text"]

TEXTS = {
    **{rid: r["text"] for rid, r in _RECORDS.items()
       if r["category"] not in ("nvidia-smi", "slurm") and "\n" in r["text"]},
    "multiline.log": (ROOT / "tests/data/signals/multiline.log").read_text(),
    "round3.log": (ROOT / "tests/data/signals/round3.log").read_text(),
}


def _ids(events: list[FaultEvent]) -> list[tuple[str, int | None, str | None]]:
    return [(e.kind, e.xid, e.pci) for e in events]


def _follow(tmp: Path, parts: list[str]) -> list[FaultEvent]:
    tmp.mkdir()
    log = tmp / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), from_start=True)
    got: list[FaultEvent] = []
    for part in parts:
        with log.open("a") as fh:
            fh.write(part)
        got += f.poll()
    got += f.poll()  # a read that finds nothing new
    f.close()
    return got


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_split_point_gives_the_faults_of_one_read(tmp_path: Path, name: str) -> None:
    lines = [ln + "\n" for ln in TEXTS[name].splitlines()]
    whole = _ids(_follow(tmp_path / "whole", ["".join(lines)]))
    assert whole
    for cut in range(1, len(lines)):
        split = _follow(tmp_path / f"cut{cut}", ["".join(lines[:cut]), "".join(lines[cut:])])
        # the same faults; their order may differ where a gpu_lost waited into the
        # next read for its Xid 79 (kernel.fold.Folder.release_read)
        assert sorted(_ids(split), key=str) == sorted(whole, key=str), \
            (name, cut, lines[cut][:80])


def test_the_sxid_split_from_the_corpus_is_one_fault_in_every_three_reads(
    tmp_path: Path,
) -> None:
    a, b, c = (ln + "\n" for ln in SXID.splitlines())
    got = _follow(tmp_path / "r", [a, "", b, c])
    assert _ids(got) == [("sxid", 24007, "0000:aa:00.0")]
    got = _follow(tmp_path / "s", [a, b, c])
    assert _ids(got) == [("sxid", 24007, "0000:aa:00.0")]


def test_a_cut_record_takes_its_parts_within_its_gap_and_time_only() -> None:
    head, noise, data = SXID.splitlines()
    now = [50.0]
    r = KernelLogReader(clock=lambda: now[0])
    r.feed(head)
    assert _ids(r.flush()) == [("sxid", 24007, "0000:aa:00.0")]
    r.feed(noise)
    r.feed(data)
    assert r.flush() == []  # within its gap and time: the part of the emitted record
    r = KernelLogReader(clock=lambda: now[0])
    r.feed(head)
    r.flush()
    now[0] += CUT_RECORD_S + 1  # too late: the part is a record of its own
    r.feed(data)
    assert _ids(r.flush()) == [("sxid", 24007, "0000:aa:00.0")]
    r = KernelLogReader(clock=lambda: now[0])
    r.feed(head)
    r.flush()
    for _ in range(MULTI_LINE_GAP + 1):  # too many lines between: as in one read
        r.feed(noise)
    r.feed(data)
    assert _ids(r.flush()) == [("sxid", 24007, "0000:aa:00.0")]
