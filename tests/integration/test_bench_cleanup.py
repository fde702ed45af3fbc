"""A benchmark stopped by SIGTERM stops every process it started (issue 30 item 4).

Runs the guard benchmark (``tests/bench/guard_throughput.py``) in a subprocess with a
data dir of the test's own, waits until its dev stack is up (the Temporal dev server,
embedded PostgreSQL, the worker and ingest), sends SIGTERM, and checks that the
benchmark exits and that none of those processes (nor anything in their process groups)
survives. Without :func:`workers.devstack.stop_stacks_on_exit` the children, started in
sessions of their own, outlive the benchmark.
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
BENCH = ROOT / "tests" / "bench" / "guard_throughput.py"
START_TIMEOUT_S = 240.0


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
    log = (tmp_path / "bench.log").open("wb")
    bench = subprocess.Popen([sys.executable, str(BENCH), "--requests", "2000",
                              "--data-dir", str(data)], stdout=log, stderr=subprocess.STDOUT,
                             cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        kids: list[psutil.Process] = []
        pm: int | None = None
        while time.monotonic() < deadline:
            assert bench.poll() is None, (tmp_path / "bench.log").read_text()[-3000:]
            kids = psutil.Process(bench.pid).children()
            names = {" ".join(k.cmdline()[1:3]) for k in kids if _alive(k.pid)}
            pm = _postmaster(data / "pg")
            worker_up = (data / "worker.log").exists() and "worker_started" in (
                data / "worker.log").read_text()
            if pm and worker_up and any("ingest" in n for n in names):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the benchmark's stack did not come up")
        assert pm is not None
        groups = {os.getpgid(k.pid) for k in kids}
        watched = [k.pid for k in kids] + [pm]
        bench.send_signal(signal.SIGTERM)
        rc = bench.wait(timeout=120)
        assert rc == 128 + signal.SIGTERM, rc
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
