"""The Kubernetes device plugin's ``XidCriticalError`` line and the kernel's Xid line of one
fault, split across kernel-log reads, are one fault, as in one read.

In one read the two fold (same code, same GPU or a plugin line naming none by address,
printed times within :data:`~agent.readers.kernel.fold.FOLD_SECONDS`): the kernel event
remains with ``also_reported_by`` = ``"k8s-device-plugin"``. The follower ends a read
whenever it reached the end of the log, so a plugin line printed a moment after (or
before) the kernel line came in the next read and was emitted as a second ``xid`` fault of
the same code and GPU. Now the kernel Xid a read end emits is remembered for the lines it
had left to wait (and, where the lines print no clock,
:data:`~agent.readers.kernel.common.CUT_RECORD_S` seconds), and a plugin line it folds in
a later read raises nothing; a plugin line still waiting at a read
end is held into the next read, once, so the kernel line of the next read folds it as in
one read. Another code, or another GPU, stays a fault of its own.

Lines: kernel Xid 48 corpus ``x14`` and Xid 64 ``x15``, the plugin's Xid 48 line as
tests/data/signals/round3.log prints it (its time set a second after the kernel line's),
noise corpus ``k13``.
"""

from __future__ import annotations

import json

import pytest

from agent.readers import FaultEvent, read_text
from agent.readers.kernel.common import CUT_RECORD_S
from agent.readers.kernel.fold import WINDOW_LINES
from tests import corpus
from tests.unit.kernel_reads import run_reads

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
KERNEL = _RECORDS["x14"]["text"]  # "Dec  2 11:38:47 node-a kernel: [ 219.47] NVRM: Xid (PCI:0000:07:00): 48, …"
OTHER_CODE = _RECORDS["x15"]["text"]  # Xid 64, same GPU
PLUGIN = ("I1202 11:38:48.532111       1 health.go:152] XidCriticalError: Xid=48 on "
          "Device=GPU-5c7b3b1e-2a9e-1d3a-8b42-2f1c1e9a0b77; marking device as unhealthy.")
NOISE = _RECORDS["k13"]["text"]
ONE = [("xid", 48, "0000:07:00", "k8s-device-plugin")]


def _ids(events: list[FaultEvent]) -> list[tuple[str, int | None, str | None, object]]:
    return [(e.kind, e.xid, e.pci, e.details.get("also_reported_by")) for e in events]


_run = run_reads


@pytest.mark.parametrize("first", ["kernel", "plugin"])
def test_a_split_pair_is_one_fault_as_in_one_read(first: str) -> None:
    pair = [KERNEL, PLUGIN] if first == "kernel" else [PLUGIN, KERNEL]
    assert _ids(read_text("\n".join(pair))) == ONE
    assert _ids(_run([pair])) == ONE
    # split: one fault, the kernel's; the plugin line first is held into the next read
    # and folds as in one read; after the kernel event went out, the plugin line only
    # raises nothing (the emitted event cannot take its details any more)
    split = ONE if first == "plugin" else [(*ONE[0][:3], None)]
    assert _ids(_run([pair[:1], pair[1:]])) == split
    assert _ids(_run([pair[:1], [NOISE, NOISE, pair[1]]])) == split
    if first == "plugin":
        ev, = _run([pair[:1], pair[1:]])
        assert ev.details["related_evidence"] == [PLUGIN]
        assert str(ev.details["device"]).startswith("GPU-5c7b3b1e")
        # alone, it is emitted at the end of the next read (one poll later)
        assert _ids(_run([[PLUGIN]])) == [("xid", 48, None, None)]


@pytest.mark.parametrize("first", ["kernel", "plugin"])
def test_another_code_or_gpu_or_past_the_window_is_its_own_fault(first: str) -> None:
    other = PLUGIN.replace("Xid=48", "Xid=64").replace(
        "Device=GPU-5c7b3b1e-2a9e-1d3a-8b42-2f1c1e9a0b77", "Device=0000:3b:00.0")
    for plugin in (PLUGIN.replace("Xid=48", "Xid=31"), PLUGIN.replace(
            "Device=GPU-5c7b3b1e-2a9e-1d3a-8b42-2f1c1e9a0b77", "Device=0000:3b:00.0"), other):
        pair = [KERNEL, plugin] if first == "kernel" else [plugin, KERNEL]
        got = _run([pair[:1], pair[1:]])
        assert len(got) == 2 and all(e.details.get("also_reported_by") is None for e in got)
    pair = [KERNEL, PLUGIN] if first == "kernel" else [PLUGIN, KERNEL]
    # past the line window, as in one read
    far = _run([pair[:1], [NOISE] * (WINDOW_LINES + 1), pair[1:]])
    assert len(far) == 2
    # a kernel line of another code after the plugin line: both faults
    if first == "kernel":
        assert len(_run([[OTHER_CODE], [PLUGIN]])) == 2
    if first == "kernel":
        # the next read long after (the agent stalled): the printed clocks still tell
        # one fault; without them, past CUT_RECORD_S the lines are not taken as one
        assert len(_run([pair[:1], pair[1:]], step_s=CUT_RECORD_S + 1)) == 1
        bare = [KERNEL.split("kernel: ", 1)[1], PLUGIN.split("] ", 1)[1]]
        assert _ids(_run([bare])) == ONE
        assert len(_run([bare[:1], bare[1:]])) == 1
        assert len(_run([bare[:1], bare[1:]], step_s=CUT_RECORD_S + 1)) == 2
