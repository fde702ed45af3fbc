"""Level faults persist, events don't — on the real agent → ingest path.

A real :class:`agent.runner.Agent` (simulated NVML backend, injected kernel lines, a sysfs
InfiniBand tree in a temporary directory) pushes over OTLP/HTTP to the real
:class:`ingest.service.IngestService`; the alerts ingest hands off are recorded by a sink
(the hand-off boundary) and checked:

* NVML GPU lost → a *level* ``gpu_lost`` fault, and its clear (same fault key) when the GPU
  is back; the kernel's Xid line is an *event*;
* ``ib_link_up`` arrives as the clear of ``ib_link_down`` on the same port;
* a partial NVML read failure (one query errors) is unknown: no NVLink-down raise, no
  false clear of a pending ECC fault.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ingest.service import IngestService
from tests.fixtures.sinks import ListSink
from tests.integration.test_agent_push import ingest_config, make_agent, wait_for
from workflows.models import Alert
from workflows.protocol import fault_key


class Sink(ListSink):
    """Records what ingest hands off (the ``AlertSink`` protocol)."""

    def of(self, kind: str, **match: Any) -> list[Alert]:
        return [a for a in self.alerts if a.kind == kind
                and all(getattr(a, k) == v for k, v in match.items())]


def _ib_port(root: Path, state: str, downed: int) -> None:
    port = root / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(f"4: {state}\n" if state == "ACTIVE" else f"1: {state}\n")
    (port / "phys_state").write_text("5: LinkUp\n" if state == "ACTIVE" else "3: Disabled\n")
    (port / "counters" / "link_downed").write_text(f"{downed}\n")


async def test_level_faults_and_events_from_the_real_agent(tmp_path: Path) -> None:
    sink = Sink()
    svc = IngestService(ingest_config(nodes=1, statistical_min=1), sink)
    await svc.start()
    ib = tmp_path / "ib"
    _ib_port(ib, "ACTIVE", 0)
    agent, backend, kernel = make_agent(f"http://127.0.0.1:{svc.http_port}", tmp_path / "a",
                                        infiniband_root=str(ib))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: agent.mode == "fleet", 20, "fleet tier")
        # I20: on start, the current state of every level signal (healthy: clears)
        await wait_for(lambda: bool(sink.of("gpu_lost", active=False)), 10, "start clear")
        assert not sink.of("gpu_lost", active=True)
        assert sink.of("nvsmi", active=False)
        start_clears = len(sink.of("gpu_lost", active=False))
        # GPU lost (NVML sees 3 of 4 GPUs): a level fault, not an event
        backend.faults.lost_gpus = 1
        await wait_for(lambda: bool(sink.of("gpu_lost", active=True)), 10, "gpu_lost raise")
        raised = sink.of("gpu_lost", active=True)[0]
        assert raised.level is True and raised.active is True
        # an Xid kernel line is an event
        kernel.push("[74889.644138] NVRM: Xid (PCI:0000:28:00): 48, pid=1, "
                    "An uncorrectable double bit error (DBE) has been detected on GPU")
        await wait_for(lambda: bool(sink.of("xid")), 10, "xid event")
        assert sink.of("xid")[0].level is False
        # the GPU is back: the matching clear follows
        backend.faults.lost_gpus = 0
        await wait_for(lambda: len(sink.of("gpu_lost", active=False)) > start_clears, 10,
                       "gpu_lost clear")
        clear = sink.of("gpu_lost", active=False)[-1]
        assert clear.level is True and fault_key(clear) == fault_key(raised)

        # InfiniBand: ib_link_up is the clear of ib_link_down on the same port
        _ib_port(ib, "DOWN", 1)
        await wait_for(lambda: bool(sink.of("ib_link_down", active=True)), 10, "ib down")
        down = sink.of("ib_link_down", active=True)[0]
        assert down.level is True and down.gpu == "mlx5_0/1"
        _ib_port(ib, "ACTIVE", 1)
        await wait_for(lambda: bool(sink.of("ib_link_down", active=False)), 10, "ib up")
        up = sink.of("ib_link_down", active=False)[0]
        assert fault_key(up) == fault_key(down) and up.level is True
        assert not sink.of("ib_link_up")

        # ECC pending: raised; then the ECC / remap / NVLink queries fail: unknown — no
        # false clear, and no "NVLink links down" raise
        backend.faults.ecc_uncorrectable = 2
        await wait_for(lambda: bool(sink.of("nvsmi", active=True)), 10, "ecc raise")
        ecc = sink.of("nvsmi", active=True)[0]
        assert ecc.level is True and ecc.evidence["dram_uncorrectable"] == 2
        n_before = len(sink.alerts)
        backend.faults.failing_queries = {"ecc", "remap", "nvlink"}
        samples = agent.samples
        await wait_for(lambda: agent.samples >= samples + 10, 10, "samples with failed queries")
        await asyncio.sleep(0.5)  # at least one more push
        assert [a for a in sink.alerts[n_before:] if a.kind == "nvsmi"] == []
        # the queries read again and the counters are healthy: now the clear comes
        backend.faults.failing_queries = set()
        backend.faults.ecc_uncorrectable = 0
        await wait_for(lambda: any(a.evidence.get("dram_uncorrectable") == 0
                                   for a in sink.of("nvsmi", active=False)
                                   if a.alert_id not in {b.alert_id for b in
                                                         sink.alerts[:n_before]}),
                       10, "ecc clear")
        assert not any("links down [" in a.evidence_text and a.active
                       for a in sink.of("nvsmi"))
    finally:
        stop.set()
        await task
        await svc.stop()
