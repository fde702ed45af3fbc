"""A "fallen off the bus" record printed minutes after its GPU's Xid 79 (the driver's next
probe of the lost GPU) is the fault the Xid 79 raised, not a second ``gpu_lost`` fault.

Before, the reader folded the two only within :data:`~agent.readers.kernel.fold.WINDOW_LINES`
lines of each other (and 60 s across reads), so the driver's report on its next probe
came out as a second fault of the same GPU. NVIDIA NVSentinel folds a fallen-off-bus
message into an Xid of the 5 minutes before; the reader now folds a record of the same
GPU within :data:`~agent.readers.kernel.fold.XID79_FOLLOW_S` seconds after the Xid 79 it
emitted, whatever lies between (lines, reads), by the printed times when both lines print
one, else by the agent's monotonic clock. A record of another GPU, or past the window, is
a fault of its own.

Lines: Xid 79 from the corpus (``x02``, ``x01``), the one-line form corpus ``k05`` with the
Xid's GPU, noise corpus ``k13``.
"""

from __future__ import annotations

import json

from agent.readers import FaultEvent
from agent.readers.kernel.fold import WINDOW_LINES, XID79_FOLLOW_S
from tests import corpus
from tests.unit.kernel_reads import run_reads

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
XID = _RECORDS["x02"]["text"]  # "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has ..."
XID_BARE = _RECORDS["x01"]["text"]  # no time printed; GPU 0000:c6:00
FALL = _RECORDS["k05"]["text"]  # "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen ..."
NOISE = _RECORDS["k13"]["text"]


def _fall(at: float, pci: str = "0000:02:00.0") -> str:
    """The one-line fallen-off-bus record of ``pci`` printed at ``at`` s since boot."""
    return FALL.replace("[   49.261458]", f"[{at:12.6f}]").replace("0000:01:00.0", pci)


def _ids(events: list[FaultEvent]) -> list[tuple[str, int | None, str | None]]:
    return [(e.kind, e.xid, e.pci) for e in events]


_run = run_reads


ONE = [("xid", 79, "0000:02:00")]


def test_the_next_probes_fall_minutes_later_folds_into_the_xid79() -> None:
    two_min = _fall(74889.644138 + 120)
    noise = [NOISE] * (WINDOW_LINES + 5)
    # one read, many lines between
    assert _ids(_run([[XID, *noise, two_min]])) == ONE
    # across reads, with reads between
    assert _ids(_run([[XID], noise[:3], [], noise[3:], [two_min]])) == ONE
    # printed again on a later probe as well
    assert _ids(_run([[XID], [two_min], [_fall(74889.644138 + 240)]])) == ONE


def test_another_gpu_or_past_the_window_is_its_own_fault() -> None:
    other = _fall(74889.644138 + 60, pci="0000:03:00.0")
    assert _ids(_run([[XID, NOISE, other]])) == [*ONE, ("gpu_lost", None, "0000:03:00.0")]
    assert _ids(_run([[XID], [other]])) == [*ONE, ("gpu_lost", None, "0000:03:00.0")]
    late = _fall(74889.644138 + XID79_FOLLOW_S + 30)
    # printed past the window: its own fault, in one read (a log read in one go) ...
    assert _ids(_run([[XID, *[NOISE] * (WINDOW_LINES + 1), late]])) == [
        *ONE, ("gpu_lost", None, "0000:02:00.0")]
    # ... even within the line window (the printed times tell) ...
    assert _ids(_run([[XID, late]])) == [*ONE, ("gpu_lost", None, "0000:02:00.0")]
    # ... and across reads
    assert _ids(_run([[XID], [late]])) == [*ONE, ("gpu_lost", None, "0000:02:00.0")]


def test_without_printed_times_the_monotonic_clock_bounds_the_window() -> None:
    bare_fall = "NVRM: GPU at 0000:c6:00.0 has fallen off the bus."
    one = [("xid", 79, "0000:c6:00")]
    # 4 reads 60 s apart: 180 s after the Xid
    assert _ids(_run([[XID_BARE], [NOISE], [NOISE], [bare_fall]], step_s=60)) == one
    # 2 reads 310 s apart: past the window
    assert _ids(_run([[XID_BARE], [bare_fall]], step_s=XID79_FOLLOW_S + 10)) == [
        *one, ("gpu_lost", None, "0000:c6:00.0")]
