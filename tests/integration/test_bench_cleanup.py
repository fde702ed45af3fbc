"""A benchmark stopped by SIGTERM stops every process it started (issue 30 item 4).

Starts a benchmark's stack (:func:`tests.bench.support.stack.dev_stack`, the one
``orchestration.py``, ``storm.py`` and the others use: the Temporal dev server, embedded
PostgreSQL, the worker and ingest) in a subprocess with a data dir of the test's own,
waits until it is up, sends SIGTERM, and checks that the subprocess exits with 143 and
that none of those processes (nor anything in their process groups) survives. Without
:func:`workers.devstack.stop_stacks_on_exit` the children, started in sessions of their
own, outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0
#: The benchmark's side: the stack up, then wait to be stopped.
BENCH = """
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.bench.support.stack import dev_stack

async def main() -> None:
    cfg = {"clusters": [{"name": "cleanup", "gpu_nodes": 1}], "worker": {"watchers": False}}
    async with dev_stack(Path(sys.argv[1]), cfg):
        print("READY", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _postmaster(pg: Path) -> int | None:
    try:
        return int((pg / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.devserver
def test_sigterm_stops_every_process_a_benchmark_started(tmp_path: Path) -> None:
    data = tmp_path / "stack"
    out = tmp_path / "bench.log"
    log = out.open("wb")
    bench = subprocess.Popen([sys.executable, "-c", BENCH, str(data), str(ROOT)],
                             stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"READY" not in out.read_bytes():
            assert bench.poll() is None, out.read_text()[-3000:]
            if time.monotonic() > deadline:
                pytest.fail("the benchmark's stack did not come up")
            time.sleep(0.5)
        kids = psutil.Process(bench.pid).children()
        names = sorted(" ".join(k.cmdline()[1:3]) for k in kids)
        assert len(kids) == 3, names  # temporal, worker, ingest
        pm = _postmaster(data / "pg")
        assert pm is not None and _alive(pm)
        groups = {os.getpgid(k.pid) for k in kids}
        watched = [k.pid for k in kids] + [pm]
        bench.send_signal(signal.SIGTERM)
        rc = bench.wait(timeout=120)
        assert rc == 128 + signal.SIGTERM, (rc, out.read_text()[-3000:])
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and any(_alive(p) for p in watched):
            time.sleep(0.2)
        left = [p for p in watched if _alive(p)]
        in_groups = [p.pid for p in psutil.process_iter()
                     if _safe_pgid(p.pid) in groups and _alive(p.pid)]
        assert not left and not in_groups, (left, in_groups)
    finally:
        if bench.poll() is None:
            bench.kill()
        for p in psutil.process_iter():  # never leave the stack behind, pass or fail
            if str(data) in " ".join(_safe_cmdline(p)):
                p.kill()
        log.close()


def _safe_pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _safe_cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
