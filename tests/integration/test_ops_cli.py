"""The operator CLI as a person runs it: ``autorepair`` subprocesses against a live dev stack.

One stack for the module, started the way ``autorepair up`` starts it (Temporal dev
server, embedded PostgreSQL, worker and ingest as child processes) on free ports with its
own data directory and a config with one 4-node cluster ``demo``. The commands find it
through ``--data-dir`` alone (``stack.json``, ``operator.token``).

Checks: commands that open a Temporal client exit 0 without a fatal error at interpreter
exit, 20 runs in a row each; read commands on things that do not exist yet explain
themselves (breaker before any guard, unknown repair, empty stack); ``repairs show
--watch`` follows a repair to its end and leaves cleanly on Ctrl-C; ``up --demo`` without
Slurm stops with the instruction as its last line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from workers.config import load_config
from workers.devpeers import free_port
from workers.devstack import DevStack, StackPorts
from workers.up import DEMO_HOWTO, EXIT_NO_DEMO

ROOT = Path(__file__).resolve().parents[2]
AUTOREPAIR = str(Path(sys.executable).parent / "autorepair")
RUNS = 20
"""Runs in a row of each Temporal client command (a fatal exit showed in about 1 of 20)."""

CONFIG = {
    "worker": {"watchers": False},
    "policy": {"rails": {"concurrency_fraction": 0.5, "breaker_min": 3}},
    "clusters": [{
        "name": "demo", "scheduler": "slurm",
        "nodes": [{"name": f"gpu-0{i}", "machine": f"gpu-0{i}"} for i in range(1, 5)],
    }],
}


def _ports() -> StackPorts:
    return StackPorts(
        temporal=free_port(), temporal_ui=free_port(), temporal_http=free_port(),
        temporal_metrics=free_port(), otlp_grpc=free_port(), otlp_http=free_port(),
        api=free_port(), admin=free_port(), worker_metrics=free_port(),
    )


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that would point the CLI elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AUTOREPAIR")}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200", **extra})
    return env


def cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``autorepair ARGS`` as a subprocess (as a person would), text output."""
    return subprocess.run([AUTOREPAIR, *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, env=_env(**env),
                          cwd=ROOT, check=False)


@pytest.fixture(scope="module")
async def data_dir(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Path]:
    """Data directory of a running dev stack (the ``--data-dir`` of every command)."""
    data = tmp_path_factory.mktemp("ops-stack") / "data"
    data.mkdir()
    config_path = data.parent / "autorepair.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    stack = DevStack(config=load_config(config_path, environ={}), data_dir=data,
                     ports=_ports(), config_path=config_path)
    try:
        await stack.start()
        yield data
    finally:
        await asyncio.to_thread(stack.stop)


def _no_fatal(r: subprocess.CompletedProcess[str]) -> str | None:
    """Why this run is not a clean success, or None."""
    if r.returncode != 0 or "Fatal" in r.stderr or "Traceback" in r.stderr:
        return f"exit {r.returncode}: {r.stderr.strip()[-600:]}"
    return None


async def test_temporal_client_commands_exit_cleanly_every_time(data_dir: Path) -> None:
    d = str(data_dir)
    commands = {
        "validate": ["validate", "gpu-01", "--data-dir", d],
        "breaker status": ["breaker", "status", "--cluster", "demo", "--data-dir", d],
        "breaker reset": ["breaker", "reset", "--cluster", "demo", "--by", "alice",
                          "--data-dir", d],
        # the MCP server on stdio: its input ends at once, it stops and exits 0
        "mcp": ["mcp", "--data-dir", d],
    }

    def loop(args: list[str]) -> list[str]:
        return [f"run {i}: {why}" for i in range(RUNS)
                if (why := _no_fatal(cli(*args))) is not None]

    # the commands side by side, each RUNS times in a row
    with ThreadPoolExecutor(len(commands)) as pool:
        failures = dict(zip(commands, pool.map(loop, commands.values()), strict=True))
    assert not any(failures.values()), failures


async def test_breaker_before_any_repair_is_closed_with_the_configured_budget(
    data_dir: Path,
) -> None:
    r = await asyncio.to_thread(cli, "breaker", "status", "--cluster", "demo", "--json",
                                "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # budget: ceil(0.5 × 4 configured nodes); trip threshold: max(3, ceil(0.10 × 4))
    assert (doc["breaker_open"], doc["gpu_nodes"], doc["budget"], doc["breaker_threshold"]) \
        == (False, 4, 2, 3)
    assert doc["leases"] == doc["pending"] == [] and doc["guard_running"] is False
    r = await asyncio.to_thread(cli, "breaker", "status", "--cluster", "demo",
                                "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "closed" in text and "starts with the first lease request" in text
    r = await asyncio.to_thread(cli, "breaker", "reset", "--cluster", "demo",
                                "--data-dir", str(data_dir))
    assert r.returncode == 0 and "nothing to reset" in r.stdout, r.stdout + r.stderr


async def test_unknown_repair_is_a_404_naming_it(data_dir: Path) -> None:
    r = await asyncio.to_thread(cli, "repairs", "show", "no-such-repair",
                                "--data-dir", str(data_dir))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "404" in r.stderr and "no-such-repair" in r.stderr, r.stderr


async def test_status_of_an_empty_stack_says_how_to_start_agents(data_dir: Path) -> None:
    otlp = json.loads((data_dir / "stack.json").read_text())["otlp_http"]
    r = await asyncio.to_thread(cli, "status", "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    note = " ".join(r.stderr.split())
    token = f"AUTOREPAIR_AGENT_TOKEN=$(cat {data_dir / 'collector.token'})"
    assert f"{token} autorepair-agent run --endpoint {otlp}" in note
    # the simulator finds the token through --data-dir, under names of its own (the
    # hint's `--cluster demo --nodes 8` collided with the demo's gpu-01..gpu-04)
    assert (f"autorepair-agent simulate --endpoint {otlp} --data-dir {data_dir} "
            "--cluster sim --node-prefix sim- --nodes 8") in note
    assert "autorepair up --demo" in note


async def _create_remove(data_dir: Path, request_id: str) -> str:
    r = await asyncio.to_thread(
        cli, "repairs", "create", "--node", "gpu-03", "--cluster", "demo", "--mode", "remove",
        "--request-id", request_id, "--reason", "GPU fell off the bus twice", "--json",
        "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    rid: str = json.loads(r.stdout)["repair"]["repair_id"]
    return rid


def _watch(repair_id: str, data_dir: Path) -> subprocess.Popen[str]:
    """``autorepair repairs show ID --watch`` running in the background."""
    return subprocess.Popen([AUTOREPAIR, "repairs", "show", repair_id, "--watch",
                             "--data-dir", str(data_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)


async def test_repair_watch_follows_it_to_the_outcome(data_dir: Path) -> None:
    # remove always waits for a person: the watch sees awaiting_approval, then the reject
    rid = await _create_remove(data_dir, "watch-1")
    proc = _watch(rid, data_dir)
    try:
        deadline = time.monotonic() + 60
        while True:
            r = await asyncio.to_thread(cli, "repairs", "show", rid, "--json",
                                        "--data-dir", str(data_dir))
            if json.loads(r.stdout)["stage"] == "awaiting_approval":
                break
            assert time.monotonic() < deadline, r.stdout
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)  # at least one poll of the watch sees it waiting
        r = await asyncio.to_thread(cli, "repairs", "reject", rid, "--reason", "RMA instead",
                                    "--data-dir", str(data_dir))
        assert r.returncode == 0, r.stderr
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"repair {rid}: remove on demo/gpu-03"), out
    assert any(" awaiting_approval (by " in ln for ln in lines), out
    assert any("awaiting_approval took " in ln for ln in lines), out
    assert lines[-1].startswith("outcome: rejected"), out


async def test_repair_watch_leaves_cleanly_on_ctrl_c(data_dir: Path) -> None:
    rid = await _create_remove(data_dir, "watch-2")
    proc = _watch(rid, data_dir)
    try:
        # Ctrl-C once the watch has answered (a fixed sleep could land while the
        # interpreter still imports on a loaded machine, which is not what is tested)
        assert proc.stdout is not None
        first = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert first.strip(), "the watch printed nothing before it ended"
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"stopped watching; repair {rid} goes on" in " ".join(err.split())


def test_up_demo_without_slurm_stops_with_the_instruction_last(tmp_path: Path) -> None:
    # Slurm hidden: PATH holds only this interpreter's bin directory (temporal, autorepair)
    env = _env(PATH=str(Path(sys.executable).parent),
               AUTOREPAIR__TEMPORAL__ADDRESS=f"127.0.0.1:{free_port()}",
               AUTOREPAIR__INGEST__API_PORT=str(free_port()))
    r = subprocess.run([AUTOREPAIR, "up", "--demo", "--data-dir", str(tmp_path / "d")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60, env=env, cwd=tmp_path, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert r.returncode == EXIT_NO_DEMO, r.stdout
    assert lines[-1] == DEMO_HOWTO, r.stdout  # COLUMNS=200: one line, not wrapped
    assert "Slurm" in r.stdout or "root" in r.stdout
    assert not (tmp_path / "d" / "temporal.db").exists()  # nothing was started


async def test_workflows_started_here_carry_their_console_summary(data_dir: Path) -> None:
    from temporalio.api.sdk.v1 import WorkflowMetadata

    from workers.temporal_client import temporal_client
    from workflows.protocol import workflow_id_repair

    rid = await _create_remove(data_dir, "console-1")
    r = await asyncio.to_thread(cli, "validate", "gpu-02", "--json", "--by", "alice",
                                "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    vid = json.loads(r.stdout)["workflow_id"]
    address = json.loads((data_dir / "stack.json").read_text())["temporal_address"]
    async with temporal_client(address) as client:
        d = await client.get_workflow_handle(workflow_id_repair("demo", "gpu-03", rid)).describe()
        assert await d.static_summary() == (
            "remove gpu-03 · GPU fell off the bus twice · requested by user operator")
        details = await d.static_details() or ""
        assert f"Repair id: `{rid}`" in details and "request id `console-1`" in details
        # current details while it waits: what for and until when (approval_timeout_s)
        handle = client.get_workflow_handle(workflow_id_repair("demo", "gpu-03", rid))
        current = ""
        for _ in range(100):
            meta = await handle.query("__temporal_workflow_metadata",
                                      result_type=WorkflowMetadata)
            current = meta.current_details
            if current.startswith("awaiting_approval"):
                break
            await asyncio.sleep(0.2)
        assert current.startswith("awaiting_approval: waiting for approval of remove on "
                                  f"gpu-03 (`autorepair repairs approve {rid}`"), current
        assert " until 20" in current, current
        d = await client.get_workflow_handle(vid).describe()
        assert await d.static_summary() == (
            "validate gpu-02 · cluster demo · operator request · requested by alice")
