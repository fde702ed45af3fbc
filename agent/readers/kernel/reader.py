"""The streaming kernel-log reader: a table of (needle, matcher) over the family modules.

Per physical line:

1. **Split** (:func:`split_records`): mirrors that strip newlines put several kernel records
   on one line; it is cut before each record head (a timestamp prefix, ``NVRM:``, an
   SXid header) so every record is read, each once.
2. **Assemble**: a piece that an open record takes as its own next part (an SXid
   ``Data`` line, an AER status line, the fallen-off-bus block) joins that record; a
   wrapped continuation (:func:`~agent.readers.kernel.common.is_continuation_shape`,
   starting no record of its own) joins the record of the line above; anything else is
   looked up in :data:`TABLE`. A record closes after ``max_gap`` unrelated lines (blank
   lines count as unrelated; 0 for one-line records: the first line it does not take
   closes it), or on :meth:`flush` / :meth:`end_read` (the end of the input / of one read
   of a followed log: a multi-line record closed while it waited for its next part still
   takes that part from the next read, within its gap and
   :data:`~agent.readers.kernel.common.CUT_RECORD_S`, raising nothing new).
   Multi-line records (fallen off the bus, AER, SXid, XFS, RmInitAdapter, mlx5 health)
   wait :data:`~agent.readers.kernel.common.MULTI_LINE_GAP` lines for their next part, so
   another program's line between two parts breaks nothing.
3. **Fold** (:mod:`agent.readers.kernel.fold`): the Xid 79 and fallen-off-bus records of
   one GPU, and the two halves of one OOM kill, come out as one event; an Xid 79 and its
   fallen-off-bus record split across reads too, in either order, and the record of the
   same GPU printed again on the driver's next probe, within ``XID79_FOLLOW_S`` (300 s)
   after the Xid 79; the device plugin's and the kernel's line of one Xid split across
   reads too.

Lines may carry any timestamp prefix (``[secs.usecs]``, ``dmesg -T``, syslog
``Mon DD HH:MM:SS host kernel:``, journald ``kernel:``, ``dmesg -x`` ``kern  :err   :``, ISO,
the ``192.0.2.10: kern: err: [ISO]:`` forwarder prefix) or none: matchers search inside the
line. Nothing here raises on any input.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from itertools import pairwise

from agent.readers.events import MAX_LINE_CHARS, FaultEvent
from agent.readers.kernel import (
    aer,
    device_plugin,
    fs,
    gpu_lost,
    gsp,
    hung,
    ib,
    mce,
    nic,
    npd,
    oom,
    sxid,
    uvm,
    xid,
)
from agent.readers.kernel.common import (
    CUT_RECORD_S,
    Matcher,
    Record,
    Single,
    continuation_body,
    is_continuation_shape,
    maybe_continuation,
    strip_prefix,
)
from agent.readers.kernel.fold import Folder

Needle = tuple[str, str]
"""``(gate, needle)``: a matcher runs only on lines holding both (``gate`` is the family's
common marker, e.g. ``NVRM``; ``""`` when the needle alone says it)."""

_KERNEL_TABLE: list[tuple[Needle, Matcher]] = [
    (("Xid", "SXid"), sxid.match),
    (("Xid", "XidCriticalError"), device_plugin.match),
    (("Xid", ""), xid.match),
    (("NVRM", "global fatal error"), uvm.match),
    (("NVRM", "The NVIDIA GPU"), gpu_lost.match_block),
    (("NVRM", "fallen off the bus"), gpu_lost.match_fallen),
    (("NVRM", "NV_ERR_GPU_IS_LOST"), gpu_lost.match_is_lost),
    (("NVRM", "eartbeat timed out"), gsp.match_heartbeat),
    (("NVRM", "NV_ERR_RESET_REQUIRED"), gsp.match_reset_required),
    (("NVRM", "RmInitAdapter"), gsp.match_rminit),
    (("NVRM", "rm_init_adapter"), gsp.match_rminit_follow),
    (("device handle", ""), gpu_lost.match_no_handle),
    (("AER", ""), aer.match),
    (("PCIe Bus Error", ""), aer.match),
    (("XFS", ""), fs.match_xfs),
    (("only", ""), fs.match_readonly),  # "read-only", "readonly"
    (("blocked for more than", ""), hung.match),
    (("mlx", ""), nic.match_mlx),
    (("efa ", ""), nic.match_efa),
    (("rdmap", ""), nic.match_efa),
    (("mlx", ""), ib.match_mlx),
    (("ort", "port"), ib.match_port),
    (("ort", "Port"), ib.match_port),
    (("Kill", ""), oom.match_killed),  # "Killed process", "Kill process"
    (("oom-kill:", ""), oom.match_summary),
    (("EDAC", ""), mce.match_edac),
    (("mce:", ""), mce.match_mce),
    (("Hardware Error", ""), mce.match_mce),
    (("Machine Check", ""), mce.match_mce),
]
def _kernel_event(line: str) -> FaultEvent | None:
    """One kernel message → its event (records closed at once); used for NPD messages."""
    found = _lookup(line, _KERNEL_TABLE)
    if found is None:
        return None
    result = found[0]
    if isinstance(result, Record):
        events = result.finish()
        return events[0] if events else None
    if isinstance(result, list):
        return result[0] if result else None
    return result


TABLE: list[tuple[Needle, Matcher]] = [
    (("Type:", ""), npd.make_matcher(_kernel_event)),
    *_KERNEL_TABLE,
]
"""Every family: node-problem-detector reports first (their messages quote kernel lines),
then :data:`_KERNEL_TABLE`."""


_COMMON_CHARS = " :.[]-_=()/,0123456789etaoinshrdlcumwfgypbvkjxqz"
"""Characters of kernel-log text, most common first: the blank and the punctuation and digits
of timestamp prefixes, PCI addresses and ``key=value`` fields, then the lower-case letters
in English letter-frequency order (``etaoinshrdlcumwfgypbvkjxqz``, the standard ranking of
cryptanalysis texts). Any other character (capitals, other punctuation) counts as rarer
than all of these."""


def _key_char(gate: str) -> str:
    """The character of ``gate`` least likely in a log line (first of equals), by
    :data:`_COMMON_CHARS`."""
    return max(gate, key=lambda c: _COMMON_CHARS.find(c) % (len(_COMMON_CHARS) + 1))


def _table_test(table: list[tuple[Needle, Matcher]]) -> Callable[[str], bool]:
    """``line → True`` when some entry's gate and needle are both in ``line``, compiled to
    straight-line ``in`` tests: the reader's fast path for the many lines that hold no
    record (a loop over the table costs several times as much).

    Each gate is searched only on lines holding its key character (:func:`_key_char`, one
    test shared by the gates of that character): a one-character ``in`` is a ``memchr``,
    several times cheaper than the multi-character search, and most lines lack most keys.
    The key is a character of its gate, so the test is exactly "some gate and its needle
    are in the line"."""
    groups: dict[str, dict[str, list[str]]] = {}
    for (gate, needle), _ in table:
        groups.setdefault(_key_char(gate), {}).setdefault(gate, []).append(needle)
    terms = []
    for key, gates in groups.items():
        inner = []
        for gate, needles in gates.items():
            if "" in needles:
                inner.append(f"{gate!r} in line")
            else:
                alts = " or ".join(f"{n!r} in line" for n in dict.fromkeys(needles))
                inner.append(f"({gate!r} in line and ({alts}))")
        terms.append(f"({key!r} in line and ({' or '.join(inner)}))")
    # eval of repr()-quoted literals from this table only
    test: Callable[[str], bool] = eval(f"lambda line: {' or '.join(terms)}")
    return test


GATE: tuple[str, ...] = tuple(dict.fromkeys(gate for (gate, _), _m in TABLE))
"""The distinct gates of :data:`TABLE`: a line holding none of them holds no record."""

has_needle = _table_test(TABLE)
"""True when some :data:`TABLE` entry's gate and needle are both in a line."""

_TS = (
    r"\[\s*\d{1,12}\.\d{1,9}\]"
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})? \S{1,64} kernel:"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? \S{1,64} kernel:"
    r"|\S{1,64}: kern: [a-z]{2,7}: \[[^\]]{1,40}\]:"
    r"|kern\s{0,4}:\s{0,4}[a-z]{2,7}\s{0,4}:"
    r"|(?<!\S)kernel:"
)
_MARK = r"nvidia-nvswitch\d{0,3}:[ \t]*SXid|SXid[ \t]*\(|NVRM:"
_HEAD = re.compile(rf"(?:(?:{_TS})[ \t]*)+(?:{_MARK})?|{_MARK}")


def split_records(line: str) -> list[str]:
    """``line`` cut before each kernel record head after the first; ``[line]`` when it
    holds one record. A piece that is only a prefix stays with the piece after it."""
    if line.count("NVRM:") + line.count("SXid") < 2 and (
        line.count("] ") + line.count("]: ") + line.count("kern") < 2
    ):
        return [line]  # at most one driver marker and one timestamp: nothing to cut
    if "New status generated" in line or "Conditions:[" in line:
        return [line]  # node-problem-detector quotes kernel lines inside one report
    starts = [m.start() for m in _HEAD.finditer(line) if m.end() > m.start() and m.start() > 0]
    if not starts:
        return [line]
    bounds = [0, *starts, len(line)]
    out: list[str] = []
    carry = ""
    for a, b in pairwise(bounds):
        piece = carry + line[a:b]
        if not strip_prefix(piece).strip():
            carry = piece
            continue
        out.append(piece.rstrip())
        carry = ""
    if carry:
        if out:
            out[-1] += carry.rstrip()
        else:
            out.append(carry.rstrip())
    return out


def _lookup(
    line: str, table: list[tuple[Needle, Matcher]]
) -> tuple[FaultEvent | Record | list[FaultEvent], Matcher] | None:
    tried: list[Matcher] = []
    for (gate, needle), matcher in table:
        if gate in line and needle in line:
            if matcher in tried:
                continue
            tried.append(matcher)
            result = matcher(line)
            if result is not None and result != []:
                return result, matcher
    return None


def match_line(line: str) -> list[Record]:
    """The records ``line`` starts (empty when it starts none)."""
    found = _lookup(line, TABLE)
    if found is None:
        return []
    result, matcher = found
    if isinstance(result, Record):
        return [result]
    if isinstance(result, FaultEvent):
        return [Single(result, matcher)]
    return [Single(ev, None) for ev in result]


class KernelLogReader:
    """Streaming kernel-log reader.

    ``feed(line)`` returns the events completed by that line; ``flush()`` returns what is
    still open or held at end of input. A record is complete when the next line shows it
    does not continue (a one-line record waits one line, for a wrapped continuation); a
    GPU-lost or Xid 79 event waits up to :data:`~agent.readers.kernel.fold.WINDOW_LINES`
    lines for its counterpart; a fallen-off-bus record of a GPU whose Xid 79 was emitted
    before, within ``XID79_FOLLOW_S`` seconds (printed times, else ``clock``, monotonic
    seconds), is that fault, not a new one (:mod:`agent.readers.kernel.fold`). Each record
    is emitted at most once, in input order (a ``gpu_lost`` or device plugin event that
    :meth:`end_read` holds into the next read comes after that read's other events).
    Never raises on any ``str`` input.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._open: list[Record] = []
        self._last: Record | None = None
        self._prev: str | None = None  # the line above, when it started no record
        self._clock = clock
        self._folder = Folder(clock)
        #: multi-line records a flush closed while they waited for their next part, with
        #: when: a later read's part joins one (no new record) within its gap and
        #: CUT_RECORD_S
        self._cut: list[tuple[Record, float]] = []

    def feed(self, line: str) -> list[FaultEvent]:
        """Read one line (with or without its line ending); returns completed events."""
        out: list[FaultEvent] = []
        try:
            if type(line) is not str:
                line = str(line)
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS]
            line = line.rstrip("\r\n")
            needle: bool | None = None  # has_needle(line), once computed
            if not self._open and self._last is None and not self._cut:
                needle = has_needle(line)
                if not needle and not (
                    # maybe_continuation(), inlined: this is the path of most lines
                    self._prev
                    and (line[:1] in " \t" or "]  " in line or ":  " in line or "\t" in line)
                ):
                    self._prev = line  # may head a record wrapped onto the next line
                    if self._folder.held or self._folder.recent:
                        self._folder.tick(out)
                    return out  # nothing open, no record here
            for piece in split_records(line):
                self._piece(piece, out, needle if piece is line else None)
            if self._folder.held or self._folder.recent:
                self._folder.tick(out)
        except Exception:  # a reader never takes the agent down
            self._open, self._last, self._prev, self._cut = [], None, None, []
        return out

    def flush(self) -> list[FaultEvent]:
        """Close and return every open record and held event (the end of the input)."""
        return self._close(final=True)

    def end_read(self) -> list[FaultEvent]:
        """The end of one read of a followed log (the follower's poll read all there was):
        as :meth:`flush`, except that a ``gpu_lost`` still waiting for its Xid 79, and a
        device plugin's Xid line still waiting for the kernel's, are held into the next
        read, once (:meth:`~agent.readers.kernel.fold.Folder.release_read`)."""
        return self._close(final=False)

    def _close(self, final: bool) -> list[FaultEvent]:
        out: list[FaultEvent] = []
        try:
            now = self._clock()
            waiting = [(rec, now) for rec in self._open if rec.max_gap > 0
                       and not rec.closed and len(rec.lines) < rec.max_lines]
            for rec in self._open:
                rec.closed = True
            self._drain(out)
            if final:
                self._folder.release(out)
            else:
                self._folder.release_read(out)
            self._cut = [c for c in self._cut if now - c[1] <= CUT_RECORD_S] + waiting
        except Exception:
            self._folder = Folder(self._clock)
            self._cut = []
        self._open, self._last, self._prev = [], None, None
        return out

    def _cut_takes(self, piece: str | None) -> bool:
        """Whether a record a flush cut takes ``piece`` as its own next part (None: a blank
        line); every other one counts an unrelated line and is let go past its gap or
        :data:`~agent.readers.kernel.common.CUT_RECORD_S`."""
        now = self._clock()
        taken = False
        keep: list[tuple[Record, float]] = []
        for rec, at in self._cut:
            if now - at > CUT_RECORD_S:
                continue
            if (not taken and piece is not None and len(rec.lines) < rec.max_lines
                    and rec.accepts(piece)):
                rec.add(piece)
                taken = True
            else:
                rec.gap += 1
                if rec.gap > rec.max_gap:
                    continue
            keep.append((rec, at))
        self._cut = keep
        return taken

    def _unrelated_line(self, out: list[FaultEvent]) -> None:
        """A line no open record takes (a blank one, or the already-reported part of a
        cut record): every open record counts it against its ``max_gap`` (closed past
        it), wrapped continuations end, and what closed is emitted to ``out``."""
        for rec in self._open:
            rec.gap += 1
            if rec.gap > rec.max_gap:
                rec.closed = True
        self._last = self._prev = None
        self._drain(out)

    def _piece(self, piece: str, out: list[FaultEvent], needle: bool | None = None) -> None:
        """Assemble one record piece; ``needle`` is ``has_needle(piece)`` when the caller
        already computed it (None: not yet)."""
        if not piece.strip():
            # a blank line ends wrapped continuations; a record waiting for its own next
            # part counts it as one unrelated line (max_gap)
            if self._cut:
                self._cut_takes(None)
            self._unrelated_line(out)
            return
        taken: Record | None = None
        for rec in reversed(self._open):
            if not rec.closed and len(rec.lines) < rec.max_lines and rec.accepts(piece):
                rec.add(piece)
                taken = rec
                break
        new: list[Record] = []
        if self._cut and self._cut_takes(None if taken is not None else piece) \
                and taken is None:
            # the next part of a record the last read's flush emitted: already reported
            self._unrelated_line(out)
            return
        if taken is None:
            cont = maybe_continuation(piece) and is_continuation_shape(piece)
            last = self._last
            if cont and last is None and self._prev:
                new = self._joined(self._prev, piece)
            if not new:
                if needle is None:
                    needle = has_needle(piece)
                new = match_line(piece) if needle else []
            if (
                cont
                and not new
                and last is not None
                and not last.closed
                and len(last.lines) < last.max_lines
            ):
                last.add_continuation(piece)
                taken = last
        for rec in self._open:
            if rec is not taken:
                rec.gap += 1
                if rec.gap > rec.max_gap:
                    rec.closed = True
        self._open.extend(new)
        self._last = taken if taken is not None else (new[-1] if new else None)
        self._prev = piece if self._last is None else None
        self._drain(out)

    @staticmethod
    def _joined(prev: str, piece: str) -> list[Record]:
        """Records of a line that started none, read with its wrapped continuation (the
        marker may sit on the continuation: ``EXT4-fs error … lblock 0;`` +
        ``    Remounting filesystem read-only``)."""
        joined = prev.rstrip() + " " + continuation_body(piece)
        if not has_needle(joined):
            return []
        new = match_line(joined)
        for rec in new:
            rec.lines = [prev, piece]
            rec.continued = []
            if isinstance(rec, Single):
                rec.event.text = rec.text
        return new

    def _drain(self, out: list[FaultEvent]) -> None:
        while self._open and self._open[0].closed:
            for ev in self._open.pop(0).finish():
                self._folder.add(ev, out)


def read_kernel_lines(lines: list[str], sink: Callable[[FaultEvent], None]) -> None:
    """Feed ``lines`` through a fresh :class:`KernelLogReader`, passing each event to ``sink``."""
    reader = KernelLogReader()
    for line in lines:
        for ev in reader.feed(line):
            sink(ev)
    for ev in reader.flush():
        sink(ev)
