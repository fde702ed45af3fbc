"""Folding: two records the kernel prints for ONE fault come out as one event.

- GPU lost + Xid 79: the driver prints ``Xid (PCI:…): 79, … GPU has fallen off the bus.``
  and a "fallen off the bus" line or block (``nv.c``) for the same GPU, in either order,
  within a few lines. The **Xid 79 event remains** (its code drives the catalogue: power
  cycle, per-code consent); the ``gpu_lost`` text goes to the Xid event's
  ``details["related_evidence"]`` (list of raw texts). Two ``gpu_lost`` records for the
  same GPU (the block and the one-line form) fold the same way into the first.
- Device plugin + kernel Xid: the Kubernetes device plugin's ``XidCriticalError: Xid=N on
  Device=…`` and the kernel's ``Xid (PCI:…): N`` line of the same code, in either order
  within the window (and within :data:`FOLD_SECONDS` when both print a wall-clock time):
  the **kernel event remains** (address, pid, message), with ``also_reported_by`` =
  ``"k8s-device-plugin"``, the plugin's ``device`` and its text in ``related_evidence``.
  The plugin names a GPU by UUID, the kernel by address: they fold unless the plugin
  prints an address that differs. Split across reads: a kernel Xid a read end emitted
  while it still waited is remembered (:attr:`Folder.recent`) for the lines it had left
  (and, when the lines print no clock,
  :data:`~agent.readers.kernel.common.CUT_RECORD_S` seconds): the plugin's line in a
  later read is that fault and is not emitted (the emitted event cannot take its
  details); a plugin line still waiting at a read end is held into the next read, once,
  so the kernel line of the next read folds it as in one read (alone, it is emitted at
  the end of that next read).
- OOM summary + kill: ``oom-kill:constraint=…,pid=N`` and ``Killed process N (…)`` of the
  same pid. The ``Killed process`` event remains, with the summary's ``details`` merged in
  and its text in ``related_evidence``.

Later falls of the same GPU: the driver prints "fallen off the bus" again on its next
probe of a GPU it has lost (minutes after the Xid 79; nothing but a power cycle brings the
GPU back). Every Xid 79 the folder emits is remembered per GPU (:attr:`Folder.emitted`,
with the agent's monotonic time and the line's printed time): a ``gpu_lost`` record of
the same GPU after it, within :data:`XID79_FOLLOW_S` seconds, is the fall the Xid 79
already raised and is not emitted (one fault, the Xid 79's identity ``xid:79:<gpu>``; its
text could not join the emitted Xid's ``related_evidence``), however many lines or reads
lie between. The seconds are the printed times' when both lines print one of the same
kind (``[secs.usecs]`` since boot, or a wall clock), else the monotonic clock's (a log
read in one go, or lines without time). A record of another GPU, or of the same GPU
past the window, is a fault of its own. A ``gpu_lost`` the folder emitted (no Xid 79
folded it) is remembered the same way: a later ``gpu_lost`` record, or Xid 79, of that GPU
within the window is that fall (not emitted: the fault went out as ``gpu_lost``; a second
fault of another identity would count one loss twice). Two Xid 79 lines stay two records.

Across reads: the agent's follower flushes the reader at the end of every read that
reached the end of the log, so a driver that prints the Xid 79 just before the read and
the fallen-off-bus record just after splits them into two reads; the memory above folds
them. The Xid itself is never held past a read. The other order: a ``gpu_lost`` record
still waiting for its Xid 79 at the end of a read (:meth:`Folder.release_read`, the
follower's end of a read; not :meth:`Folder.release`, the end of the input) is held into
the next read, once, so an Xid 79 printed just after the read folds it as in one read;
alone, it is emitted at the end of that next read (one poll later), and an Xid 79 of its
GPU in a later read is that fall (above).

The GPU is matched by ``bus:device`` (:func:`~agent.readers.kernel.common.device_key`), so
``0000:3b:00``, ``0000:3b:00.0`` and ``3b:00.0`` are one GPU; a record without an address
never folds. Events that can fold are held for :data:`WINDOW_LINES` lines (fewer for OOM),
then released in input order.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import CUT_RECORD_S, device_key
from agent.readers.kernel.device_plugin import REPORTER as DEVICE_PLUGIN

WINDOW_LINES = 8
"""Lines a GPU-lost or Xid 79 event waits for its counterpart (the driver prints them
back to back; a few lines of other output may come between)."""

XID79_FOLLOW_S = 300.0
"""Most seconds from an Xid 79 the folder emitted to a later fallen-off-bus record of the
same GPU that it still folds (likewise from an emitted ``gpu_lost`` to a later record or
Xid 79 of its GPU; printed times when both lines print one of the same kind,
else the agent's monotonic clock; module docstring). Source: NVIDIA NVSentinel's syslog
health monitor, ``gpufallen`` handler, which takes a "fallen off the bus" message of a
GPU with an Xid in the 5 minutes before (its ``xidWindow``, 5 min) as that Xid's. The
driver prints the message again on its next probe of the lost GPU, minutes after the Xid
79; nothing shorter than a host power cycle (the NVIDIA Xid Catalog's action for Xid 79:
RESTART_BM; the agent restarts with the host) brings the GPU back to fall again."""

OOM_WINDOW_LINES = 4
"""Lines an ``oom_kill`` event waits for the other half of the same kill."""


FOLD_SECONDS = 10
"""Most seconds between the Kubernetes device plugin's ``XidCriticalError`` line and the
kernel's Xid line of one fault when both lines print a wall-clock time (the plugin reacts
to the driver's NVML event within a second or two)."""

log = logging.getLogger("autorepair.agent.readers")

_FOLDABLE = frozenset({"gpu_lost", "xid", "oom_kill"})
_CLOCK = re.compile(r"(?<![\d:])(\d\d):(\d\d):(\d\d)(?![\d:])")


def _is_xid79(ev: FaultEvent) -> bool:
    return ev.kind == "xid" and ev.xid == 79 and ev.details.get("reporter") != DEVICE_PLUGIN


def window(ev: FaultEvent) -> int:
    """Lines ``ev`` is held for a counterpart (0: emitted at once)."""
    if (ev.kind == "gpu_lost" or _is_xid79(ev)) and device_key(ev.pci):
        return WINDOW_LINES
    if ev.kind == "xid" and ev.xid is not None:
        return WINDOW_LINES  # the device plugin's report of the same Xid may follow

    if ev.kind == "oom_kill" and ev.pid is not None and "reporter" not in ev.details:
        return OOM_WINDOW_LINES
    return 0


def _related(into: FaultEvent, other: FaultEvent) -> FaultEvent:
    rel = into.details.setdefault("related_evidence", [])
    if isinstance(rel, list):
        rel.append(other.text)
    return into


def _seconds(ev: FaultEvent) -> int | None:
    m = _CLOCK.search(ev.text[:200])
    if not m:
        return None
    h, mi, sec = (int(x) for x in m.groups())
    return h * 3600 + mi * 60 + sec if h < 24 and mi < 60 and sec < 61 else None


_BOOT_TIME = re.compile(r"\s*\[\s*(\d{1,12}\.\d{1,9})\]")
_DAY = 86400


def printed_time(ev: FaultEvent) -> tuple[str, float] | None:
    """When ``ev``'s first line says it was printed: ``("boot", seconds since boot)`` for a
    ``[secs.usecs]`` prefix (``dmesg``, ``/dev/kmsg``), ``("clock", seconds of the day)``
    for a printed ``HH:MM:SS`` (syslog, ISO, ``dmesg -T``, klog); None without one."""
    m = _BOOT_TIME.match(ev.text)
    if m:
        return "boot", float(m.group(1))
    sec = _seconds(ev)
    return None if sec is None else ("clock", float(sec))


def printed_gap(a: tuple[str, float] | None, b: tuple[str, float] | None) -> float | None:
    """Seconds from printed time ``a`` to ``b`` (negative: ``b`` is earlier; a wall clock
    taken modulo one day); None unless both are known and of one kind."""
    if a is None or b is None or a[0] != b[0]:
        return None
    gap = b[1] - a[1]
    if a[0] == "clock":
        gap = (gap + _DAY / 2) % _DAY - _DAY / 2
    return gap


def _plugin_pair(held: FaultEvent, new: FaultEvent) -> tuple[FaultEvent, FaultEvent] | None:
    """``(plugin event, kernel event)`` when ``held``/``new`` (either order) are the device
    plugin's and the kernel's report of one Xid, else None. Same code; the plugin's device,
    when printed as an address, is the kernel line's GPU; wall-clock times, when both lines
    print one, within :data:`FOLD_SECONDS` (compared modulo 30 minutes: the plugin's klog
    and the journal may print different time zones)."""
    if held.kind != "xid" or new.kind != "xid" or held.xid != new.xid:
        return None
    plugin = [e for e in (held, new) if e.details.get("reporter") == DEVICE_PLUGIN]
    if len(plugin) != 1:
        return None
    dp = plugin[0]
    kernel = new if dp is held else held
    if "reporter" in kernel.details or kernel.details.get("also_reported_by"):
        return None  # another reporter's event, or already folded with a plugin line
    if dp.pci and kernel.pci and device_key(dp.pci) != device_key(kernel.pci):
        return None
    a, b = _seconds(dp), _seconds(kernel)
    if a is not None and b is not None:
        gap = abs(a - b) % 1800
        if min(gap, 1800 - gap) > FOLD_SECONDS:
            return None
    return dp, kernel


def _is_plugin(ev: FaultEvent) -> bool:
    return ev.kind == "xid" and ev.xid is not None and ev.details.get("reporter") == DEVICE_PLUGIN


def _plugin_fold(held: FaultEvent, new: FaultEvent) -> FaultEvent | None:
    """The kernel's Xid event carrying the device plugin's report of the same Xid, when
    ``held``/``new`` are the two (:func:`_plugin_pair`), else None."""
    pair = _plugin_pair(held, new)
    if pair is None:
        return None
    dp, kernel = pair
    kernel.details["also_reported_by"] = DEVICE_PLUGIN
    for key in ("device", "all_devices"):
        if key in dp.details:
            kernel.details.setdefault(key, dp.details[key])
    return _related(kernel, dp)


def merge(held: FaultEvent, new: FaultEvent) -> FaultEvent | None:
    """The one event for ``held`` and ``new`` when they are one fault, else None."""
    folded = _plugin_fold(held, new)
    if folded is not None:
        return folded
    if held.kind == "gpu_lost" or _is_xid79(held):
        if not (new.kind == "gpu_lost" or _is_xid79(new)):
            return None
        key = device_key(held.pci)
        if key is None or key != device_key(new.pci):
            return None
        if _is_xid79(held) and _is_xid79(new):
            return None  # two Xid lines are two records
        gap = printed_gap(printed_time(held), printed_time(new))
        if gap is not None and abs(gap) > XID79_FOLLOW_S:
            return None  # printed minutes apart: two falls
        if _is_xid79(new):  # the Xid remains, carrying every gpu_lost text held so far
            earlier = held.details.get("related_evidence")
            new.details["related_evidence"] = [
                held.text,
                *(earlier if isinstance(earlier, list) else []),
            ]
            return new
        return _related(held, new)
    if held.kind == "oom_kill" and new.kind == "oom_kill" and held.pid == new.pid:
        summary_first = "constraint" in held.details and "constraint" not in new.details
        summary_last = "constraint" in new.details and "constraint" not in held.details
        if not (summary_first or summary_last):
            return None
        kill, summary = (new, held) if summary_first else (held, new)
        kill.details = {**summary.details, **kill.details}
        kill.details.pop("related_evidence", None)
        return _related(kill, summary)
    return None


@dataclass
class _Held:
    event: FaultEvent
    left: int
    carried: bool = False  # already held over the end of a read (release_read)


@dataclass
class _Emitted:
    kind: str  # "xid" (an Xid 79) or "gpu_lost"
    at: float  # clock() when the folder emitted it
    printed: tuple[str, float] | None  # printed_time() of its line


@dataclass
class _Recent:
    event: FaultEvent  # an Xid event (kernel or device plugin) a read end emitted
    at: float  # clock() then
    left: int  # lines it still waits for its other report


class Folder:
    """Holds foldable events for their window; emits everything in input order (but a
    ``gpu_lost`` or device plugin event :meth:`release_read` holds into the next read comes
    after the events of the read that brought it).
    ``clock``: monotonic seconds (the time bound of :data:`XID79_FOLLOW_S`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.held: list[_Held] = []
        self.clock = clock
        #: device key → the fault the folder emitted for that GPU falling off the bus (an
        #: Xid 79, or a ``gpu_lost`` record no Xid 79 folded): module docstring; one entry
        #: per GPU, dropped once past :data:`XID79_FOLLOW_S`
        self.emitted: dict[str, _Emitted] = {}
        #: Xid events a read end emitted while they still waited for the other reporter's
        #: line (device plugin / kernel): module docstring
        self.recent: list[_Recent] = []
        #: records not emitted: the fall of a fault emitted before (``gpu_lost`` records,
        #: and Xid 79 lines after their GPU's emitted ``gpu_lost``), and the other report
        #: of an Xid a read end emitted
        self.folded_late = 0

    def _reported(self, ev: FaultEvent) -> bool:
        """``ev`` is the other report (device plugin / kernel) of an Xid a read end
        emitted (:attr:`recent`), within its lines, and within :data:`FOLD_SECONDS` by
        the printed clocks when both lines print one, else within :data:`CUT_RECORD_S`
        seconds of the monotonic clock."""
        now = self.clock()
        for seen in self.recent:
            printed = _seconds(seen.event) is not None and _seconds(ev) is not None
            if ((printed or now - seen.at <= CUT_RECORD_S)
                    and _plugin_pair(seen.event, ev) is not None):
                self.recent.remove(seen)
                self.folded_late += 1
                log.info("event=xid_folded_into_emitted_report xid=%s pci=%s", ev.xid,
                         seen.event.pci)
                return True
        return False

    def _within(self, seen: _Emitted, ev: FaultEvent) -> bool:
        """``ev`` comes within :data:`XID79_FOLLOW_S` seconds after ``seen`` (printed
        times when both lines print one of a kind, else the monotonic clock; a second of
        slack before, for printed times of one-second resolution)."""
        gap = printed_gap(seen.printed, printed_time(ev))
        if gap is None:
            gap = self.clock() - seen.at
        return -1.0 <= gap <= XID79_FOLLOW_S

    def _emitted_fall(self, ev: FaultEvent) -> bool:
        """``ev`` (a ``gpu_lost`` record, or an Xid 79) reports the fall of a GPU that the
        folder already emitted a fault for (an Xid 79 or a ``gpu_lost``; for an Xid 79 only
        a ``gpu_lost``: two Xid lines are two records), within :data:`XID79_FOLLOW_S`."""
        key = device_key(ev.pci)
        if not key or key not in self.emitted:
            return False
        if _is_xid79(ev) and self.emitted[key].kind != "gpu_lost":
            return False
        if not self._within(self.emitted[key], ev):
            if self.clock() - self.emitted[key].at > XID79_FOLLOW_S:
                del self.emitted[key]
            return False
        self.folded_late += 1
        log.info("event=folded_into_emitted_fall kind=%s pci=%s emitted=%s",
                 ev.kind, ev.pci, self.emitted[key].kind)
        return True

    def _emit(self, ev: FaultEvent, out: list[FaultEvent]) -> None:
        """Emit ``ev``; an Xid 79 or a ``gpu_lost`` of a named GPU is remembered
        (:attr:`emitted`)."""
        out.append(ev)
        key = device_key(ev.pci) if _is_xid79(ev) or ev.kind == "gpu_lost" else None
        if key:
            self.emitted[key] = _Emitted(ev.kind, self.clock(), printed_time(ev))

    def add(self, ev: FaultEvent, out: list[FaultEvent]) -> None:
        """Take one finished event; ``out`` gets what can be emitted now."""
        if ev.kind in _FOLDABLE:
            for entry in self.held:
                merged = merge(entry.event, ev)
                if merged is not None:
                    entry.event = merged
                    return
        if (self.emitted and (ev.kind == "gpu_lost" or _is_xid79(ev))
                and self._emitted_fall(ev)):
            return
        if self.recent and ev.kind == "xid" and self._reported(ev):
            return
        w = window(ev) if ev.kind in _FOLDABLE or not self.held else 0
        if w == 0 and not self.held:
            self._emit(ev, out)
            return
        self.held.append(_Held(ev, w))

    def tick(self, out: list[FaultEvent]) -> None:
        """One input line has passed."""
        for entry in self.held:
            entry.left -= 1
        while self.held and self.held[0].left <= 0:
            self._emit(self.held.pop(0).event, out)
        for seen in self.recent:
            seen.left -= 1
        self.recent = [seen for seen in self.recent if seen.left > 0]

    def release(self, out: list[FaultEvent]) -> None:
        """Everything held, in order (end of input)."""
        self._release(out, False)

    def release_read(self, out: list[FaultEvent]) -> None:
        """The end of one read of a followed log: as :meth:`release`, except that a
        ``gpu_lost`` of a named GPU still waiting for its Xid 79, and a device plugin's
        Xid report still waiting for the kernel's line, stay held into the next read, once
        (the next end of a read releases them): the driver / the kernel may print the
        other line just after the read. No kernel Xid is held past a read; one emitted
        while it still waited for the plugin's line is remembered (:attr:`recent`)."""
        self._release(out, True)

    def _release(self, out: list[FaultEvent], read_end: bool) -> None:
        keep: list[_Held] = []
        for entry in self.held:
            ev = entry.event
            if (read_end and entry.left > 0 and not entry.carried
                    and ((ev.kind == "gpu_lost" and device_key(ev.pci)) or _is_plugin(ev))):
                entry.carried = True
                keep.append(entry)
                continue
            self._emit(ev, out)
            if (entry.left > 0 and ev.kind == "xid" and ev.xid is not None
                    and not ev.details.get("also_reported_by")):
                self.recent.append(_Recent(ev, self.clock(), entry.left))
        self.held = keep
