"""Temporal clients of the CLI release their runtime threads before the command returns
(a thread left running at interpreter exit aborts with ``PyGILState_Release``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import typer

from workers.ops_temporal import run_async
from workers.temporal_client import TemporalUnreachable, release_runtimes, temporal_client


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _address(env: Any) -> str:
    return str(env.client.service_client.config.target_host)


def test_runtime_threads_end_when_the_command_returns(temporal_dev_env: Any) -> None:
    address = _address(temporal_dev_env)
    before = _threads()

    async def count() -> int:
        async with temporal_client(address) as client:
            assert _threads() > before  # the runtime's own thread pool is running
            return (await client.count_workflows()).count

    assert run_async(count()) >= 0
    assert release_runtimes() == 0
    assert _threads() <= before


def test_a_kept_client_is_counted_as_alive(temporal_dev_env: Any) -> None:
    address = _address(temporal_dev_env)
    kept: list[Any] = []

    async def keep() -> None:
        async with temporal_client(address) as client:
            kept.append(client)

    run_async(keep())
    assert release_runtimes() == 1
    kept.clear()
    assert release_runtimes() == 0


def test_unreachable_temporal_exits_2_naming_the_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workers.devpeers import free_port

    address = f"127.0.0.1:{free_port()}"

    async def connect() -> None:
        async with temporal_client(address):
            pass

    with pytest.raises(typer.Exit) as exc:
        run_async(connect())
    assert exc.value.exit_code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert address in err and "autorepair up" in err and "Traceback" not in err
    assert release_runtimes() == 0
    assert issubclass(TemporalUnreachable, RuntimeError)
