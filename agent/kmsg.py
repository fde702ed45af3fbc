"""Follow the kernel log from its current position and turn lines into fault events.

Sources: ``/dev/kmsg`` (one record per ``read``; ``EPIPE`` when the ring buffer overwrote
records we had not read yet — counted and skipped; its ``\\xHH`` escapes decoded and a
message of several lines fed as its lines, :func:`kmsg_to_lines`), or any text file (e.g.
``/var/log/kern.log``) followed across rotation (inode change, or truncation: the file
shorter than the offset, or the bytes before the offset changed, :data:`TAIL_BYTES`). Lines go
through a reader with ``feed(line) -> list[event]`` / ``flush() -> list[event]``; the
production reader is ``agent.readers.KernelLogReader``. The reader holds a record until the
next line shows it is complete (a one-line record may be wrapped onto the next line), so a
poll that reads to the end of what is available ends the read (the reader's
``end_read()``, else ``flush()``): events come out in the poll that read them, except a GPU
lost without its Xid 79 yet, or a device plugin's Xid line without the kernel's, which
comes one poll later (the other line may follow). A poll that
lands between a record's lines emits it with the lines read so far; its later lines, in
the next poll, join it and raise no second fault (as an Xid 79's fallen-off-the-bus record
does: ``agent.readers.kernel.reader``).

A source that cannot be opened (missing, permission denied) is reported through
:attr:`KernelLogFollower.error` and a log line, and retried every ``retry_s``; the agent
keeps running.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("autorepair.agent.kmsg")


TAIL_BYTES = 64
"""Bytes before the file offset the follower keeps to tell a file truncated in place and
written again past the offset between two polls (logrotate ``copytruncate``) from one
that only grew: 64 bytes hold a timestamp prefix and the start of a kernel line, so two
different lines rarely share them."""


class LineReader(Protocol):
    """What the follower needs from a kernel-log reader."""

    def feed(self, line: str) -> list[Any]: ...

    def flush(self) -> list[Any]: ...


class PolledSource(Protocol):
    """What the agent polls for events (a follower or an in-memory feed)."""

    error: str | None

    def poll(self) -> list[Any]: ...

    def close(self) -> None: ...


class KernelSource(PolledSource, Protocol):
    """What the agent polls for kernel fault events; ``finish()`` returns what its reader
    still holds when the agent stops."""

    def finish(self) -> list[Any]: ...


def default_reader() -> LineReader:
    """``agent.readers.KernelLogReader()`` (imported lazily: it is another module's)."""
    from agent.readers import KernelLogReader

    reader: LineReader = KernelLogReader()
    return reader


def _kmsg_seq(record: str) -> int | None:
    """The sequence number of a ``/dev/kmsg`` record (``"6,1234,5678901,-;…"`` → 1234)."""
    fields = record.partition(";")[0].split(",")
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


_KMSG_ESCAPES = re.compile(r"(?:\\x[0-9A-Fa-f]{2})+")
"""A run of the escapes ``/dev/kmsg`` writes for bytes of a message that are not printable
ASCII: ``\\xHH`` for every byte below 0x20 or from 0x7f, and for ``\\`` itself (kernel
``printk.c``, ``msg_add_ext_text``; ``Documentation/ABI/testing/dev-kmsg``), so every
``\\x`` in a record's message is one."""

_KEPT_ESCAPED = frozenset(range(0x20)) - {0x09, 0x0A} | {0x7F}
"""Bytes :func:`unescape_kmsg` leaves escaped: control characters other than tab and newline
(an ESC, a carriage return or a NUL in evidence text would act on the terminal or tool
that shows it, not read as text)."""


def _unescape_run(m: re.Match[str]) -> str:
    raw = bytes(int(m.group(0)[i + 2:i + 4], 16) for i in range(0, len(m.group(0)), 4))
    out: list[str] = []
    text = bytearray()
    for b in raw:
        if b in _KEPT_ESCAPED:
            out.append(text.decode("utf-8", "backslashreplace"))
            text.clear()
            out.append(f"\\x{b:02x}")
        else:
            text.append(b)
    out.append(text.decode("utf-8", "backslashreplace"))
    return "".join(out)


def unescape_kmsg(message: str) -> str:
    """A ``/dev/kmsg`` message as the kernel printed it: ``\\xHH`` escapes decoded
    (``\\x0a`` a newline, ``\\x09`` a tab, ``\\x5c`` a backslash, runs of bytes from 0x80
    as UTF-8); bytes that are not UTF-8 and control characters other than tab and newline
    stay ``\\xHH`` (:data:`_KEPT_ESCAPED`)."""
    if "\\x" not in message:
        return message
    return _KMSG_ESCAPES.sub(_unescape_run, message)


def kmsg_to_lines(record: str) -> list[str] | None:
    """``"6,1234,5678901,-;NVRM: Xid ..."`` → ``["[    5.678901] NVRM: Xid ..."]``: the
    record's message, unescaped (:func:`unescape_kmsg`), one line per line it holds (a
    message printed with embedded newlines, as the driver prints its fallen-off-the-bus
    block, is one record), each with the record's timestamp; empty lines are left out.

    Continuation lines (`` KEY=value`` dictionary entries) are dropped; returns None for
    a record without the ``;`` prefix separator.
    """
    head, sep, rest = record.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    lines = [ln for ln in unescape_kmsg(rest.split("\n", 1)[0]).split("\n") if ln.strip()]
    try:
        ts = int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return lines
    return [f"[{ts:12.6f}] {ln}" for ln in lines]


def kmsg_to_line(record: str) -> str | None:
    """The lines of :func:`kmsg_to_lines` joined with ``\\n`` (one line for most records);
    None for a record without the ``;`` prefix separator."""
    lines = kmsg_to_lines(record)
    return None if lines is None else "\n".join(lines)


class KernelLogFollower:
    """Non-blocking follower; call :meth:`poll` from the agent loop.

    ``max_lines`` bounds one poll so a burst cannot starve sampling; the rest is read on
    the next poll (the kernel keeps it in its ring buffer / the file keeps it).
    """

    def __init__(
        self,
        source: str = "/dev/kmsg",
        reader_factory: Callable[[], LineReader] = default_reader,
        *,
        max_lines: int = 5000,
        retry_s: float = 60.0,
        from_start: bool = False,
    ) -> None:
        self.source = source
        self.reader = reader_factory()
        self.max_lines = max_lines
        self.retry_s = retry_s
        self.from_start = from_start
        self.is_kmsg = source.startswith("/dev/kmsg")
        self.error: str | None = None
        self.lines_read = 0
        self.records_lost = 0
        self.rotations = 0
        self._fd: int | None = None
        self._ino: int | None = None
        self._buf = b""
        self._backlog: list[bytes] = []
        self._next_open = 0.0
        self._first_open = True
        #: Where to go on after a read error closed the source: the file offset reached
        #: (same file) / the last ``/dev/kmsg`` sequence number read. Reopening must not
        #: replay what was already read (every old Xid would be reported again).
        self._resume: int | None = None
        self._last_seq: int | None = None
        #: The last bytes before the file offset, as read: a file truncated in place and
        #: written again past the offset before the next poll no longer holds them there.
        self._tail = b""

    def _open(self) -> bool:
        now = time.monotonic()
        if now < self._next_open:
            return False
        try:
            fd = os.open(self.source, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            msg = f"{self.source}: {exc.strerror}"
            if msg != self.error:
                log.warning("event=kernel_log_unavailable source=%s error=%r",
                            self.source, exc.strerror)
            self.error = msg
            self._next_open = now + self.retry_s
            return False
        st = os.fstat(fd)
        if self._first_open and not self.from_start:
            os.lseek(fd, 0, os.SEEK_END)  # current position: don't replay old history
        elif self._resume is not None and self.is_kmsg and self._last_seq is None:
            # reopened after a read error before any record was read: history stays unread
            os.lseek(fd, 0, os.SEEK_END)
        elif (self._resume is not None and not self.is_kmsg and st.st_ino == self._ino
              and st.st_size >= self._resume):
            os.lseek(fd, self._resume, os.SEEK_SET)  # the same file: go on where we were
        self._resume = None
        self._first_open = False
        self._fd = fd
        self._ino = st.st_ino
        self._tail = b""
        if not self.is_kmsg:
            with contextlib.suppress(OSError):
                pos = os.lseek(fd, 0, os.SEEK_CUR)
                n = min(TAIL_BYTES, pos)
                self._tail = os.pread(fd, n, pos - n) if n else b""
        if self.error is not None:
            log.info("event=kernel_log_available source=%s", self.source)
        self.error = None
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def finish(self) -> list[Any]:
        """The end of the input (the agent stops): the reader's ``flush()`` — every open
        record and every event :meth:`poll`'s read ends held for the next read (a
        ``gpu_lost`` waiting for its Xid 79, a device plugin line waiting for the kernel's).
        A restarted agent reads on from the end of the log, so what is held now would
        never be reported otherwise. Lines read but not fed (a partial last line, a
        backlog past ``max_lines``) stay unread."""
        return list(self.reader.flush())

    def poll(self) -> list[Any]:
        """Read what is new; return the events the reader produced. Never raises OSError."""
        if self._fd is None and not self._open():
            return []
        events: list[Any] = []
        if self.is_kmsg:
            self._poll_kmsg(events)
        else:
            self._poll_file(events)
        return events

    def _end_read(self) -> list[Any]:
        """A poll read all there was: the reader's ``end_read()`` when it has one (it may
        keep a record whose counterpart the next read brings), else its ``flush()``."""
        end = getattr(self.reader, "end_read", None)
        return list(end() if callable(end) else self.reader.flush())

    def _feed(self, line: str, events: list[Any]) -> None:
        self.lines_read += 1
        events.extend(self.reader.feed(line))

    def _poll_kmsg(self, events: list[Any]) -> None:
        assert self._fd is not None
        drained = False
        for _ in range(self.max_lines):
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                drained = True
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.records_lost += 1
                    continue
                self.error = f"{self.source}: {exc.strerror}"
                self._resume = 0  # reopened from the start, records up to _last_seq skipped
                self.close()
                break
            if not chunk:
                drained = True
                break
            record = chunk.decode("utf-8", "replace")
            seq = _kmsg_seq(record)
            if seq is not None:
                if self._last_seq is not None and seq <= self._last_seq:
                    continue  # read before the source was reopened
                self._last_seq = seq
            for line in kmsg_to_lines(record) or []:
                self._feed(line, events)
        if drained:  # nothing more to read now: close what the reader still holds
            events.extend(self._end_read())

    def _poll_file(self, events: list[Any]) -> None:
        assert self._fd is not None
        if not self._backlog and self._rewritten():
            # truncated in place and written again past our offset: the new text is read
            # from its start (what was read of the old text stays read)
            self._reopen_rotated(events)
            return
        budget = self.max_lines
        while budget > 0:
            if self._backlog:
                take, self._backlog = self._backlog[:budget], self._backlog[budget:]
                for raw in take:
                    self._feed(raw.decode("utf-8", "replace"), events)
                budget -= len(take)
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except OSError as exc:
                self.error = f"{self.source}: {exc.strerror}"
                with contextlib.suppress(OSError):
                    # the offset of what was read (``_buf`` holds a partial line of it)
                    self._resume = os.lseek(self._fd, 0, os.SEEK_CUR)
                self.close()
                return
            if not chunk:
                break
            self._tail = (self._tail + chunk)[-TAIL_BYTES:]
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            self._backlog.extend(lines)
        if budget > 0 and self._rotated():
            self._reopen_rotated(events)
            return
        if budget > 0:  # read to the end: close what the reader still holds
            events.extend(self._end_read())

    def _reopen_rotated(self, events: list[Any]) -> None:
        """The old file is done (its unterminated last line read as a line): read the
        new one from its start."""
        if self._buf:
            self._feed(self._buf.decode("utf-8", "replace"), events)
            self._buf = b""
        self.close()
        self.rotations += 1
        if self._open_rotated():
            self._poll_file(events)
        else:  # the new file cannot be opened yet: what was read is complete
            events.extend(self._end_read())

    def _rewritten(self) -> bool:
        """The same file, no shorter than our offset, whose bytes before the offset are no
        longer those we read there: truncated and written again between two polls."""
        assert self._fd is not None
        if not self._tail:
            return False
        try:
            pos = os.lseek(self._fd, 0, os.SEEK_CUR)
            if pos < len(self._tail) or os.stat(self.source).st_ino != self._ino:
                return False  # shorter or replaced: _rotated() tells, after the read
            return os.pread(self._fd, len(self._tail), pos - len(self._tail)) != self._tail
        except OSError:
            return False

    def _rotated(self) -> bool:
        assert self._fd is not None
        try:
            st = os.stat(self.source)
        except OSError:
            return False  # moved away, new file not there yet: keep the old one
        if st.st_ino != self._ino:
            return True
        return st.st_size < os.lseek(self._fd, 0, os.SEEK_CUR)

    def _open_rotated(self) -> bool:
        # A rotated-in file is read from its start: every line in it is new.
        self._next_open = 0.0
        return self._open()
