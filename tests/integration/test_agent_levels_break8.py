"""I20 for InfiniBand ports: a started agent sends the current state of every port.

An agent that raised ``ib_link_down`` and was restarted while the link came back never
saw the edge; unless the new process sends the port's current state, ingest keeps the
raise open with nothing to clear it (the GPU level signals already go out at start:
tests/integration/test_agent_levels.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ingest.service import IngestService
from tests.integration.test_agent_levels import Sink, _ib_port
from tests.integration.test_agent_push import ingest_config, make_agent, wait_for


async def test_a_started_agent_sends_the_clear_of_an_active_ib_port(tmp_path: Path) -> None:
    sink = Sink()
    svc = IngestService(ingest_config(nodes=1, statistical_min=1), sink)
    await svc.start()
    ib = tmp_path / "ib"
    _ib_port(ib, "ACTIVE", 3)  # came back while no agent ran (link_downed counted before)
    agent, _backend, _kernel = make_agent(f"http://127.0.0.1:{svc.http_port}", tmp_path / "a",
                                          infiniband_root=str(ib))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: bool(sink.of("gpu_lost", active=False)), 10, "start clears")
        await wait_for(lambda: bool(sink.of("ib_link_down", active=False)), 5,
                       "the start clear of the ACTIVE port mlx5_0/1")
        clear = sink.of("ib_link_down", active=False)[0]
        assert clear.evidence["device"] == "mlx5_0" and clear.evidence["port"] == 1
        assert not sink.of("ib_link_down", active=True)
        # once only: later samples of the same healthy port send nothing more
        await asyncio.sleep(0.5)
        assert len(sink.of("ib_link_down", active=False)) == 1
        # and the edges still work after the start state
        _ib_port(ib, "DOWN", 4)
        await wait_for(lambda: bool(sink.of("ib_link_down", active=True)), 10, "ib down")
        _ib_port(ib, "ACTIVE", 4)
        await wait_for(lambda: len(sink.of("ib_link_down", active=False)) == 2, 10, "ib up")
    finally:
        stop.set()
        await task
        await svc.stop()


async def test_a_started_agent_sends_the_raise_of_a_down_ib_port(tmp_path: Path) -> None:
    sink = Sink()
    svc = IngestService(ingest_config(nodes=1, statistical_min=1), sink)
    await svc.start()
    ib = tmp_path / "ib"
    _ib_port(ib, "DOWN", 1)
    agent, _backend, _kernel = make_agent(f"http://127.0.0.1:{svc.http_port}", tmp_path / "a",
                                          infiniband_root=str(ib))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: bool(sink.of("ib_link_down", active=True)), 10, "start raise")
        await asyncio.sleep(0.5)
        assert len(sink.of("ib_link_down", active=True)) == 1
        assert not sink.of("ib_link_down", active=False)
    finally:
        stop.set()
        await task
        await svc.stop()
