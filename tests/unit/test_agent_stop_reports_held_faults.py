"""A fault the kernel reader holds at the end of a read is reported when the agent stops.

The follower holds a "fallen off the bus" record waiting for its Xid 79 into the next
read (agent/readers/kernel/fold.py ``release_read``). An agent stopped within that poll
(a rollout, a node drain of the DaemonSet) closed the follower and dropped it; the
restarted agent reads on from the end of the log, so the GPU's loss was never reported.
``Agent.close`` now reports what the reader still holds (``KernelSource.finish``) before
its final push. The block is the driver's three-line ``nv.c`` text, as in
tests/unit/test_kernel_xid79_split_reads.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.config import AgentConfig
from agent.kmsg import KernelLogFollower
from agent.nvml import SimulatedBackend
from agent.runner import Agent

BLOCK = ["[74889.650000] NVRM: The NVIDIA GPU 0000:18:00.0",
         "[74889.650000] NVRM: (PCI ID: 10de:20b5) installed in this system has",
         "[74889.650000] NVRM: fallen off the bus and is not responding to commands."]


def _write(log: Path, lines: list[str]) -> None:
    with log.open("a") as fh:
        fh.write("".join(ln + "\n" for ln in lines))


def test_finish_returns_the_record_a_read_end_held(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), from_start=True)
    _write(log, BLOCK)
    assert f.poll() == []  # held for its Xid 79
    held = f.finish()
    assert [(e.kind, e.pci) for e in held] == [("gpu_lost", "0000:18:00.0")]
    assert f.finish() == []  # reported once


def test_agent_stop_reports_the_held_gpu_lost(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    cfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="c", node="gpu-01",
                      backend="simulated", state_dir=str(tmp_path), kernel_log="none")
    kernel = KernelLogFollower(str(log), from_start=True)
    agent = Agent(cfg, SimulatedBackend(gpu_count=4, seed=1), kernel=kernel,
                  boot_id="boot-1", host_id="m-1")
    _write(log, BLOCK)
    agent._poll_faults()
    before = agent.faults_emitted
    logged: list[str] = []
    agent.emit_fault = lambda fault: logged.append(fault.kind)  # type: ignore[method-assign]
    asyncio.run(agent.close())
    assert logged == ["gpu_lost"], (before, logged)
