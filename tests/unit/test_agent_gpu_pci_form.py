"""Every fault the agent sends about one GPU names it in one form.

The kernel prints one GPU's address in two forms: ``NVRM: Xid (PCI:0000:18:00): 79, …``
(no function) and ``NVRM: GPU at 0000:18:00.0 has fallen off the bus.`` (with it);
nvidia-smi prints ``00000000:18:00.0`` and NVML's Xid events come out as
:func:`agent.nvml.normalise_pci` gives (``0000:18:00``). The readers keep the address as
printed (``autorepair classify``, the corpus' ``expect.pci``), and the agent sent it on the
wire so: a ``gpu_lost`` said ``0000:18:00.0`` and the ``xid`` of the same GPU ``0000:18:00``,
two devices for the control plane (the alert's ``gpu``, ``kind:code:gpu`` fault keys).
The agent now sends a GPU's address (:data:`agent.runner.GPU_KINDS`) in the kernel-log
form ``domain:bus:device`` lower case (:func:`agent.nvml.canonical_pci`); other devices
(a NIC's PCI function) as printed.

Lines: corpus ``x02`` (``[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off
the bus.``) and ``k05`` (``[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the
bus.``), the latter's address set to the Xid's GPU and its time past the fold window so the
two are two faults of one GPU; the ``GPU 0000:18:00.0: GPU has fallen off the bus`` form of
gpu_lost.py's docstring (upper-case hex as some drivers print it).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.kmsg import KernelLogFollower
from agent.nvml import SimulatedBackend, canonical_pci, normalise_pci
from agent.otlp import PushResult
from agent.readers import read_text
from agent.readers.events import KINDS
from agent.runner import GPU_KINDS, Agent
from ingest.otlp import FaultRecord, decode_logs
from tests import corpus

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
XID79 = _RECORDS["x02"]["text"]
# the one-line fall of the same GPU, printed 10 minutes later (past XID79_FOLLOW_S: a
# fault of its own, not folded into the Xid 79)
FALLEN = _RECORDS["k05"]["text"].replace("0000:01:00.0", "0000:02:00.0").replace(
    "[   49.261458]", "[75489.700000]")
XID79_GPU18 = XID79.replace("0000:02:00", "0000:18:00")
FALLEN_UPPER = "[75500.000000] NVRM: GPU 0000:1B:00.0: GPU has fallen off the bus."


class _Ingest:
    """A transport that hands each logs export to the ingest's own OTLP decoder."""

    def __init__(self) -> None:
        self.faults: list[FaultRecord] = []

    async def export_metrics(self, req: object) -> PushResult:
        return PushResult(ok=True, retryable=False, status=200)

    async def export_logs(self, req: object) -> PushResult:
        decoded = decode_logs(req, time.time(), max_future_s=300.0)  # type: ignore[arg-type]
        self.faults += decoded.faults
        return PushResult(ok=True, retryable=False, status=200)

    async def aclose(self) -> None:
        return None


def _send(tmp: Path, lines: list[str]) -> list[FaultRecord]:
    log = tmp / "kern.log"
    log.write_text("")
    ingest = _Ingest()
    cfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="c", node="gpu-01",
                      backend="simulated", state_dir=str(tmp), kernel_log="none")
    agent = Agent(cfg, SimulatedBackend(gpu_count=4, seed=1), transport=ingest,
                  kernel=KernelLogFollower(str(log), from_start=True),
                  boot_id="boot-1", host_id="m-1")
    with log.open("a") as fh:
        fh.write("".join(ln + "\n" for ln in lines))
    agent._poll_faults()
    asyncio.run(agent.close())
    return ingest.faults


def test_the_reader_keeps_each_address_as_printed() -> None:
    # the readers' contract (classify, the corpus): the two forms of one GPU
    assert [(e.kind, e.pci) for e in read_text("\n".join([XID79, FALLEN]))] == [
        ("xid", "0000:02:00"), ("gpu_lost", "0000:02:00.0")]


def test_gpu_lost_and_xid_of_one_gpu_reach_ingest_with_one_address(tmp_path: Path) -> None:
    got = _send(tmp_path, [XID79, FALLEN])
    assert [(f.kind, f.code) for f in got] == [("xid", 79), ("gpu_lost", None)]
    assert [f.gpu for f in got] == ["0000:02:00", "0000:02:00"]
    # the NVML form of the same GPU is the same string
    assert normalise_pci("00000000:02:00.0") == got[0].gpu


def test_upper_case_and_the_function_are_dropped_for_a_gpu(tmp_path: Path) -> None:
    got = _send(tmp_path, [XID79_GPU18, FALLEN_UPPER])
    assert [(f.kind, f.gpu) for f in got] == [("xid", "0000:18:00"), ("gpu_lost", "0000:1b:00")]


def test_a_nics_pci_function_is_sent_as_printed(tmp_path: Path) -> None:
    # two ports of one dual-port HCA differ only in the function: it is kept. The
    # nic.py docstring's health line, for the second function of the HCA
    line = ("mlx5_core 0000:5e:00.1: poll_health:815:(pid 0): device's health compromised "
            "- reached miss count")
    got = _send(tmp_path, [line])
    assert [(f.kind, f.gpu) for f in got] == [("nic_fatal", "0000:5e:00.1")]


@pytest.mark.parametrize(("printed", "sent"), [
    ("0000:18:00.0", "0000:18:00"), ("0000:18:00", "0000:18:00"),
    ("00000000:C6:00.0", "0000:c6:00"), ("18:00.0", "0000:18:00"),
    ("PCI:0000:3B:00", "0000:3b:00"), ("10000:e1:00.0", "10000:e1:00"),
    (None, None), ("0003:00", "0003:00"), ("unknown", "unknown"),
])
def test_canonical_pci(printed: str | None, sent: str | None) -> None:
    assert canonical_pci(printed) == sent


def test_gpu_kinds_are_reader_kinds() -> None:
    assert GPU_KINDS <= set(KINDS)
