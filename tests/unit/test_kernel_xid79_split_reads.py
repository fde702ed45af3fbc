"""An Xid 79 and its "fallen off the bus" record split across two kernel-log reads are one
fault, as in one read.

The agent's follower flushes the reader at the end of every read that reached the end of
the log, so an Xid 79 line read just before the driver printed the ``nv.c`` block (or the
one-line form) went out on its own and the block became a second, separate ``gpu_lost``
fault; one read of the same text gives one ``xid`` 79 fault carrying the block. The
reader now remembers the Xid 79 it emitted at the end of a read (per GPU, with the agent's
monotonic time and printed time) and a record of the same GPU falling off in a later
read, within :data:`~agent.readers.kernel.fold.XID79_FOLLOW_S`, raises no second fault.
Property: for every line boundary between the Xid 79 line and the last line of its record, the faults (kind, code, GPU) are those of the unsplit text.

Xid 79 lines: the corpus (``x01``, ``x02``, ``x04``); the one-line form: corpus ``k05``
with the address of the Xid's GPU; the three-line ``nv.c`` block in the driver's words
(as tests/data/signals/multiline.log); noise between: corpus ``k13`` (no fault) and a
systemd line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.kmsg import KernelLogFollower
from agent.readers import FaultEvent, KernelLogReader
from agent.readers.kernel.fold import WINDOW_LINES, XID79_FOLLOW_S
from tests import corpus

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
XID79 = [_RECORDS[i]["text"] for i in ("x01", "x02", "x04")]
ONE_LINE = _RECORDS["k05"]["text"]  # "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen ..."
NOISE = [_RECORDS["k13"]["text"], "systemd[1]: Started Session 7 of user root."]


def _prefix(xid_line: str) -> str:
    return xid_line[: xid_line.index("NVRM:")]


def _device(xid_line: str) -> str:
    m = re.search(r"PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})", xid_line)
    assert m
    return m.group(1)


def _block(xid_line: str) -> list[str]:
    p, dev = _prefix(xid_line), _device(xid_line)
    return [f"{p}NVRM: The NVIDIA GPU {dev}.0",
            f"{p}NVRM: (PCI ID: 10de:20b5) installed in this system has",
            f"{p}NVRM: fallen off the bus and is not responding to commands."]


def _one_line(xid_line: str) -> list[str]:
    return [ONE_LINE.replace("[   49.261458] ", _prefix(xid_line))
            .replace("0000:01:00.0", _device(xid_line) + ".0")]


def _cases() -> list[tuple[str, list[str]]]:
    out = []
    for i, x in enumerate(XID79):
        for name, rec in (("block", _block(x)), ("one_line", _one_line(x)),
                          ("block+one_line", _block(x) + _one_line(x))):
            for k in (0, 1, 2):
                out.append((f"x{i}-{name}-noise{k}", [x, *NOISE[:k], *rec]))
    return out


def _ids(events: list[FaultEvent]) -> list[tuple[str, int | None, str | None]]:
    return [(e.kind, e.xid, e.pci) for e in events]


def _follow(tmp: Path, parts: list[list[str]]) -> list[FaultEvent]:
    """Each part appended to a kernel log and read by one poll of the agent's follower."""
    log = tmp / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), from_start=True)
    got: list[FaultEvent] = []
    for part in parts:
        with log.open("a") as fh:
            fh.write("".join(ln + "\n" for ln in part))
        got += f.poll()
    got += f.poll()
    f.close()
    return got


@pytest.mark.parametrize(("name", "lines"), _cases(), ids=[c[0] for c in _cases()])
def test_every_split_point_gives_the_faults_of_one_read(
    tmp_path: Path, name: str, lines: list[str]
) -> None:
    (tmp_path / "whole").mkdir()
    whole = _follow(tmp_path / "whole", [lines])
    assert _ids(whole) == [("xid", 79, _device(lines[0]))], name
    for cut in range(1, len(lines)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        split = _follow(d, [lines[:cut], lines[cut:]])
        assert _ids(split) == _ids(whole), (name, cut)


def test_the_reader_folds_a_later_reads_record_within_the_window_only() -> None:
    now = [1000.0]
    x, block = XID79[1], _block(XID79[1])
    r = KernelLogReader(clock=lambda: now[0])
    r.feed(x)
    assert _ids(r.flush()) == [("xid", 79, "0000:02:00")]
    now[0] += XID79_FOLLOW_S / 2
    for ln in block:
        r.feed(ln)
    assert r.flush() == []
    # past the time window: a later fall of the same GPU is a fault of its own (the
    # monotonic clock where the lines print no time; the printed time where they do)
    r.feed(XID79[0])
    r.flush()
    now[0] += XID79_FOLLOW_S + 1
    for ln in _block(XID79[0]):
        r.feed(ln)
    assert _ids(r.flush()) == [("gpu_lost", None, "0000:c6:00.0")]
    r.feed(x)
    r.flush()
    later = f"[{74889.644138 + XID79_FOLLOW_S + 1:12.6f}] "
    for ln in block:
        r.feed(ln.replace(_prefix(x), later))
    assert _ids(r.flush()) == [("gpu_lost", None, "0000:02:00.0")]
    # past the line window but within the time window: the same fall (the driver's
    # next probe prints it again)
    r.feed(x)
    r.flush()
    for _ in range(WINDOW_LINES + 1):
        r.feed(NOISE[1])
    for ln in block:
        r.feed(ln)
    assert r.flush() == []
    # another GPU is not folded
    r.feed(x)
    r.flush()
    other = [ln.replace("0000:02:00", "0000:03:00") for ln in block]
    for ln in other:
        r.feed(ln)
    assert _ids(r.flush()) == [("gpu_lost", None, "0000:03:00.0")]


# --- The other order: the fallen-off-bus record first, its Xid 79 in the next read -------


def _reverse_cases() -> list[tuple[str, list[str]]]:
    out = []
    for i, x in enumerate(XID79):
        for name, rec in (("block", _block(x)), ("one_line", _one_line(x))):
            for k in (0, 2):
                out.append((f"x{i}-{name}-noise{k}-xid", [*rec, *NOISE[:k], x]))
    return out


@pytest.mark.parametrize(("name", "lines"), _reverse_cases(),
                         ids=[c[0] for c in _reverse_cases()])
def test_a_record_before_its_xid79_gives_the_faults_of_one_read_at_every_split(
    tmp_path: Path, name: str, lines: list[str]
) -> None:
    (tmp_path / "whole").mkdir()
    whole = _follow(tmp_path / "whole", [lines])
    assert _ids(whole) == [("xid", 79, _device(lines[-1]))], name
    assert whole[0].details["related_evidence"]
    for cut in range(1, len(lines)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        split = _follow(d, [lines[:cut], lines[cut:]])
        assert _ids(split) == _ids(whole), (name, cut)
        assert split[0].details["related_evidence"], (name, cut)


def test_a_fall_without_its_xid79_is_reported_by_the_next_read(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), from_start=True)
    with log.open("a") as fh:
        fh.write("".join(ln + "\n" for ln in _one_line(XID79[1])))
    assert f.poll() == []  # its Xid 79 may come in the next read
    assert _ids(f.poll()) == [("gpu_lost", None, "0000:02:00.0")]
    # read_text and flush() (the end of the input) hold nothing
    r = KernelLogReader()
    r.feed(_one_line(XID79[1])[0])
    assert _ids(r.flush()) == [("gpu_lost", None, "0000:02:00.0")]


# --- More than one read end between the record and its Xid 79 ----------------------------


@pytest.mark.parametrize("between", [[[]], [[], []], [[NOISE[0]], [NOISE[1]]]],
                         ids=["two_ends", "three_ends", "noise_reads"])
def test_an_xid79_after_its_emitted_record_raises_no_second_fault(
    tmp_path: Path, between: list[list[str]]
) -> None:
    """The fallen-off-bus record, held over one read end for its Xid 79, goes out at the
    next; an Xid 79 of the same GPU in a later read, within XID79_FOLLOW_S, is that fall
    (one fault: the ``gpu_lost`` already emitted). Another GPU's Xid 79 is a fault."""
    for i, x in enumerate(XID79):
        for name, rec in (("block", _block(x)), ("one_line", _one_line(x))):
            d = tmp_path / f"{i}-{name}"
            d.mkdir()
            got = _follow(d, [rec, *between, [x]])
            assert _ids(got) == [("gpu_lost", None, _device(x) + ".0")], (i, name)
            d = tmp_path / f"{i}-{name}-other"
            d.mkdir()
            other = x.replace(_device(x), "0000:3f:00")
            got = _follow(d, [rec, *between, [other]])
            assert _ids(got) == [("gpu_lost", None, _device(x) + ".0"),
                                 ("xid", 79, "0000:3f:00")], (i, name)


def test_an_xid79_past_the_window_after_its_gpus_record_is_a_fault() -> None:
    now = [1000.0]
    r = KernelLogReader(clock=lambda: now[0])
    x = XID79[0]  # no printed time: the monotonic clock bounds the window
    for ln in _block(x):
        r.feed(ln)
    assert r.end_read() == []
    assert _ids(r.end_read()) == [("gpu_lost", None, "0000:c6:00.0")]
    now[0] += XID79_FOLLOW_S + 1
    r.feed(x)
    assert _ids(r.end_read()) == [("xid", 79, "0000:c6:00")]
    # the driver's next probe prints the record again: the fall that Xid 79 raised
    now[0] += 60
    for ln in _block(x):
        r.feed(ln)
    assert r.end_read() == [] and r.end_read() == []
