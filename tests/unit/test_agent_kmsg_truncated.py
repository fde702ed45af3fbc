"""A kernel log truncated in place (logrotate ``copytruncate``) and written again past the
follower's offset before its next poll is read from its start.

``KernelLogFollower`` told a truncation by the file being shorter than its offset; a file
truncated and then written past that offset before the next poll (a small log rotated
just before an Xid burst, or a slow configured poll) looked like a file that had only
grown: the follower went on reading at its old offset, inside the new text, and lost
every line before it (corpus ``r2-h16``: the Xid 38 of its three lines was never
reported), starting mid-line. The follower now also keeps the last bytes it read and
checks, before reading on, that they are still where it read them.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.kmsg import KernelLogFollower
from agent.readers import KernelLogReader
from tests import corpus

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}


def _ids(events: list[object]) -> list[tuple[object, ...]]:
    return [(e.kind, e.xid, e.pci, e.pid) for e in events]  # type: ignore[attr-defined]


def test_a_log_truncated_and_written_past_the_offset_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    first, *rest = (ln + "\n" for ln in _RECORDS["r2-h16"]["text"].splitlines())
    log = tmp_path / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), KernelLogReader, from_start=True)
    log.write_text(first)
    assert f.poll() == []  # "GPU at PCI:…: GPU-…": no fault
    log.write_text("".join(rest))  # copytruncate, then the driver's next lines
    assert len("".join(rest)) > len(first)
    assert _ids(f.poll()) == [("xid", 38, "0000:07:00", 326), ("xid", 109, "0000:07:00", 326)]
    assert f.rotations == 1
    # the same file only grown: nothing read twice, not a rotation
    with log.open("a") as fh:
        fh.write(_RECORDS["x02"]["text"] + "\n")
    assert _ids(f.poll()) == [("xid", 79, "0000:02:00", None)]
    assert f.rotations == 1


def test_a_log_truncated_and_written_past_the_offset_after_a_start_at_its_end(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("systemd[1]: Started Daily apt upgrade.\n")
    f = KernelLogFollower(str(log), KernelLogReader)  # from the end: history not read
    assert f.poll() == []
    log.write_text(_RECORDS["x02"]["text"] + "\n")
    assert _ids(f.poll()) == [("xid", 79, "0000:02:00", None)]
