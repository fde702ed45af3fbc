"""A kernel log source reopened after a read error is not read again from its start.

``KernelLogFollower`` closes its source on a read error (``EIO`` on a file, anything but
``EPIPE`` on ``/dev/kmsg``) and reopens it on the next poll. It then read the source from
its beginning: every line of the file, and every record of the kernel's ring buffer since
boot, was reported again, so an Xid 79 that a repair had already fixed came back as a
fresh fault stamped with the receipt time (I17), and would be repaired again.
"""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path
from typing import Any
from unittest import mock

from agent import kmsg as K
from agent.readers import KernelLogReader

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
XID48 = XID79.replace("79,", "48,")


def _failing_once(real: Any) -> Any:
    calls = {"n": 0}

    def read(fd: int, n: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        data: bytes = real(fd, n)
        return data

    return read


def test_a_file_reopened_after_a_read_error_goes_on_where_it_was(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("boot history\n")
    f = K.KernelLogFollower(str(log), KernelLogReader)
    assert f.poll() == []
    with log.open("a") as fh:
        fh.write(XID79 + "\n")
    assert [e.xid for e in f.poll()] == [79]
    with mock.patch.object(K.os, "read", _failing_once(os.read)):
        assert f.poll() == []
    assert f.error is not None and "Input/output error" in f.error
    with log.open("a") as fh:
        fh.write(XID48 + "\n")
    assert [e.xid for e in f.poll()] == [48]  # the new line only, not the Xid 79 again
    assert f.error is None
    # a rotation still reads the new file from its start
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text(XID79 + "\n")
    assert [e.xid for e in f.poll()] == [79]


class FakeKmsg:
    """``/dev/kmsg``: one record per read, ``BlockingIOError`` when drained, a read
    error once when :attr:`fail_next` is set; ``SEEK_END`` skips the records so far."""

    def __init__(self) -> None:
        self.records: list[str] = []
        self.pos: dict[int, int] = {}
        self.fail_next = False
        self.next_fd = 100

    def add(self, text: str) -> None:
        seq = len(self.records) + 1
        self.records.append(f"3,{seq},{seq * 1000},-;{text.split('] ', 1)[1]}\n")

    def module(self) -> Any:
        def open_(path: str, flags: int) -> int:
            self.next_fd += 1
            self.pos[self.next_fd] = 0
            return self.next_fd

        def read(fd: int, n: int) -> bytes:
            if self.fail_next:
                self.fail_next = False
                raise OSError(errno.ENODEV, "No such device")
            if self.pos[fd] >= len(self.records):
                raise BlockingIOError(errno.EAGAIN, "again")
            self.pos[fd] += 1
            return self.records[self.pos[fd] - 1].encode()

        def lseek(fd: int, off: int, how: int) -> int:
            if how == os.SEEK_END:
                self.pos[fd] = len(self.records)
            return self.pos[fd]

        return types.SimpleNamespace(
            open=open_, read=read, lseek=lseek, close=lambda fd: None,
            fstat=lambda fd: types.SimpleNamespace(st_ino=1, st_size=0),
            O_RDONLY=os.O_RDONLY, O_NONBLOCK=os.O_NONBLOCK, SEEK_END=os.SEEK_END,
            SEEK_SET=os.SEEK_SET, SEEK_CUR=os.SEEK_CUR)


def test_dev_kmsg_reopened_after_a_read_error_skips_the_records_already_read() -> None:
    dev = FakeKmsg()
    dev.add(XID48)  # before the agent started: history, never reported
    with mock.patch.object(K, "os", dev.module()):
        f = K.KernelLogFollower("/dev/kmsg", KernelLogReader)
        assert f.poll() == []
        dev.add(XID79)
        assert [e.xid for e in f.poll()] == [79]
        dev.fail_next = True
        assert f.poll() == []
        assert f.error is not None
        dev.add(XID48.replace("48,", "31,"))
        assert [e.xid for e in f.poll()] == [31]  # not 48 (history) nor 79 (already read)
