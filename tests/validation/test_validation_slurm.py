"""ValidationWorkflow end to end on the real loopback Slurm cluster.

The check job really runs on the virtual node: ``sbatch -w gpu-0N --reservation=...``
executes ``autorepair-agent validate --json`` (the venv's console script) with the
simulated GPU backend; faults are injected through the suite's ``sim_faults_file``
(remapped-row failure) and removed to "fix" the machine. Real Temporal (time-skipping test server), real PostgreSQL ledger.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from workers.devpeers import SlurmCluster
    from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ValidationConfig
    from workflows.models import ValidationRequest, ValidationResult, Verdict
    from workflows.protocol import workflow_id_validation
    from workflows.validation import ValidationWorkflow

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "valtest"


@dataclass
class Env:
    client: Client
    pool: Any
    slurm: SlurmCluster
    faults: Path
    task_queue: str
    config: AutorepairConfig

    def inject(self, node: str, **faults: Any) -> None:
        (self.faults / f"{node}.json").write_text(json.dumps(faults))

    def fix(self, node: str) -> None:
        (self.faults / f"{node}.json").unlink(missing_ok=True)

    def node_line(self, node: str) -> str:
        return self.slurm.run("scontrol", "-o", "show", "node", node)

    def reservations(self) -> str:
        return self.slurm.run("scontrol", "show", "reservation", check=False)

    async def validate(self, machine: str, n: str, **kw: Any) -> ValidationResult:
        req = ValidationRequest(cluster=CLUSTER, machine=machine, **kw)
        result: ValidationResult = await self.client.execute_workflow(
            ValidationWorkflow.run, req, id=workflow_id_validation(machine, n),
            task_queue=self.task_queue, result_type=ValidationResult,
        )
        return result


def _config(slurm: SlurmCluster, tmp: Path, command: list[str] | None = None,
            timeout_s: float = 120.0) -> AutorepairConfig:
    suite = tmp / "suite.yaml"
    (tmp / "scratch").mkdir(exist_ok=True)
    (tmp / "faults").mkdir(exist_ok=True)
    suite.write_text(
        "backend: simulated\n"
        "expected_gpus: 8\n"
        f"sim_faults_file: {tmp / 'faults'}/{{node}}.json\n"
        f"storage_paths: [{tmp / 'scratch'}]\n"
        "storage_bytes: 4194304\n"
        "storage_min_write_mbps: 1\n"
        "storage_min_read_mbps: 1\n"
    )
    agent_cli = Path(sys.executable).parent / "autorepair-agent"
    default = ([str(agent_cli), "validate", "--json"] if agent_cli.exists()
               else [sys.executable, "-m", "agent.validation", "--json"])
    validation = ValidationConfig(
        command=command or default,
        env={"AUTOREPAIR_VALIDATE_CONFIG": str(suite), "PYTHONPATH": str(ROOT)},
        output_dir=str(tmp / "out"), timeout_s=timeout_s, poll_s=5.0,
    )
    return AutorepairConfig(clusters=[ClusterConfig(
        name=CLUSTER, scheduler="slurm", slurm_conf=str(slurm.conf_path),
        nodes=[NodeConfig(name=n, machine=n) for n in slurm.nodes], validation=validation,
    )])


@pytest.fixture
async def env(temporal_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
              tmp_path: Path) -> AsyncIterator[Env]:
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities

    config = _config(slurm_cluster, tmp_path)
    tq = f"validation-{uuid.uuid4().hex[:8]}"
    acts = ValidationActivities(config, ledger_pool).all() + LedgerActivities(ledger_pool).all()
    async with Worker(temporal_env.client, task_queue=tq, workflows=[ValidationWorkflow],
                      activities=acts):
        yield Env(temporal_env.client, ledger_pool, slurm_cluster, tmp_path / "faults", tq,
                  config)


async def test_passing_machine_returns_to_pool(env: Env) -> None:
    from activities.ledger import Ledger

    env.slurm.run("scontrol", "update", "nodename=gpu-01", "state=drain",
                  "reason=autorepair:r-pass1 remove")
    result = await env.validate("gpu-01", "pass-1", node="gpu-01")
    assert result.verdict == Verdict.passed, result.reason
    gpu = next(c for c in result.checks if c.name == "gpu")
    assert gpu.outcome == "passed" and gpu.measurements["gpu_count"] == 8.0
    storage = next(c for c in result.checks if c.name == "storage")
    assert storage.outcome == "passed" and storage.measurements["min_write_mb_per_s"] > 0
    assert {c.outcome for c in result.checks if c.name in ("dcgm", "nccl")} == {"skipped"}
    line = env.node_line("gpu-01")
    assert "DRAIN" not in line and "State=IDLE" in line, line
    assert "autorepair-validate" not in env.reservations()
    ledger = Ledger(env.pool)
    verdict = await ledger.latest_verdict("gpu-01")
    assert verdict is not None and verdict["verdict"] == "passed"
    assert await ledger.open_tickets("gpu-01") == []
    assert result.ticket_id is None


async def test_failing_machine_gets_ticket_and_stays_out(env: Env) -> None:
    from activities.ledger import Ledger

    env.inject("gpu-02", remap_failure=True)
    try:
        result = await env.validate("gpu-02", "fail-1")
    finally:
        env.fix("gpu-02")
        env.slurm.run("scontrol", "update", "nodename=gpu-02", "state=resume", check=False)
    assert result.verdict == Verdict.failed
    gpu = next(c for c in result.checks if c.name == "gpu")
    assert gpu.outcome == "failed" and "row-remapping failure" in gpu.detail
    assert gpu.measurements["remap_failure_gpus"] == 1.0
    assert "remap_failure=True" in gpu.log
    assert result.ticket_id and result.ticket_id.startswith("HW-")
    tickets = await Ledger(env.pool).open_tickets("gpu-02")
    assert [t["ticket_id"] for t in tickets] == [result.ticket_id]
    attached = tickets[0]["result"]
    assert {c["name"] for c in attached["checks"]} == {"gpu", "dcgm", "nccl", "infiniband",
                                                      "storage"}
    assert all("log" in c and "measurements" in c for c in attached["checks"])


async def test_failing_node_line_names_ticket(env: Env) -> None:
    env.inject("gpu-02", remap_pending=True)
    try:
        result = await env.validate("gpu-02", "fail-2")
        line = env.node_line("gpu-02")
    finally:
        env.fix("gpu-02")
        env.slurm.run("scontrol", "update", "nodename=gpu-02", "state=resume", check=False)
    assert result.verdict == Verdict.failed, result.reason
    assert "DRAIN" in line and f"ticket {result.ticket_id}" in line, line


async def test_aborted_when_placement_impossible_restores_prior_state(env: Env) -> None:
    from activities.ledger import Ledger

    job = env.slurm.run("sbatch", "--parsable", "-w", "gpu-03", "--wrap", "sleep 300").strip()
    try:
        for _ in range(100):
            st = env.slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
            if st == "RUNNING":
                break
            await asyncio.sleep(0.2)
        env.slurm.run("scontrol", "update", "nodename=gpu-03", "state=drain",
                      "reason=operator: bios update")
        before = env.node_line("gpu-03")
        result = await env.validate("gpu-03", "abort-1")
        after = env.node_line("gpu-03")
        still = env.slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
    finally:
        env.slurm.run("scancel", job, check=False)
        env.slurm.run("scontrol", "update", "nodename=gpu-03", "state=resume", check=False)
    assert result.verdict == Verdict.aborted
    assert "machine reallocated" in result.reason and job in result.reason
    assert "Reason=operator: bios update" in after and "DRAIN" in after
    assert before.split("State=")[1].split()[0] == after.split("State=")[1].split()[0]
    assert still == "RUNNING"
    assert "autorepair-validate" not in env.reservations()
    assert await Ledger(env.pool).open_tickets("gpu-03") == []
    v = await Ledger(env.pool).latest_verdict("gpu-03")
    assert v is not None and v["verdict"] == "aborted"


async def test_failed_machine_fixed_passes_and_returns(env: Env) -> None:
    from activities.ledger import Ledger

    ledger = Ledger(env.pool)
    env.inject("gpu-04", remap_failure=True, ecc_uncorrectable=2)
    first = await env.validate("gpu-04", "fix-1")
    assert first.verdict == Verdict.failed and first.ticket_id
    assert "DRAIN" in env.node_line("gpu-04")
    assert len(await ledger.open_tickets("gpu-04")) == 1
    env.fix("gpu-04")  # the hardware is repaired
    second = await env.validate("gpu-04", "fix-2")
    assert second.verdict == Verdict.passed, second.reason
    assert await ledger.open_tickets("gpu-04") == []
    line = env.node_line("gpu-04")
    assert "DRAIN" not in line, line


async def test_passed_after_migrate_joins_spare_pool(env: Env) -> None:
    from prometheus_client import REGISTRY

    from activities.spares import SparePool

    env.slurm.run("scontrol", "update", "nodename=gpu-01", "state=drain",
                  "reason=autorepair:r-mig1 migrate")
    try:
        result = await env.validate("gpu-01", "mig-1", node="gpu-01",
                                    reason="node migrated off this machine", repair_id="r-mig1")
        line = env.node_line("gpu-01")
    finally:
        env.slurm.run("scontrol", "update", "nodename=gpu-01", "state=resume", check=False)
    assert result.verdict == Verdict.passed, result.reason
    spares = SparePool(env.pool)
    assert await spares.list(CLUSTER) == ["gpu-01"]
    assert REGISTRY.get_sample_value("autorepair_spare_pool_size", {"cluster_id": CLUSTER}) == 1
    assert "DRAIN" in line and "spare" in line
    assert await spares.take(CLUSTER) == "gpu-01"
    assert await spares.take(CLUSTER) is None


async def test_timeout_aborts_and_cancels_job(temporal_env: Any, ledger_pool: Any,
                                              slurm_cluster: SlurmCluster,
                                              tmp_path: Path) -> None:
    from activities.ledger import Ledger
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities

    config = _config(slurm_cluster, tmp_path, command=["sleep", "600"], timeout_s=8.0)
    tq = f"validation-{uuid.uuid4().hex[:8]}"
    acts = ValidationActivities(config, ledger_pool).all() + LedgerActivities(ledger_pool).all()
    async with Worker(temporal_env.client, task_queue=tq, workflows=[ValidationWorkflow],
                      activities=acts):
        result = await temporal_env.client.execute_workflow(
            ValidationWorkflow.run, ValidationRequest(cluster=CLUSTER, machine="gpu-03"),
            id=workflow_id_validation("gpu-03", "timeout-1"), task_queue=tq,
            result_type=ValidationResult,
        )
    assert result.verdict == Verdict.aborted and "timed out" in result.reason
    jobs = slurm_cluster.run("squeue", "-h", "-w", "gpu-03", "-o", "%i %T", check=False)
    assert "RUNNING" not in jobs
    line = slurm_cluster.run("scontrol", "-o", "show", "node", "gpu-03")
    assert "DRAIN" not in line
    assert "autorepair-validate" not in slurm_cluster.run("scontrol", "show", "reservation",
                                                          check=False)
    assert await Ledger(ledger_pool).open_tickets("gpu-03") == []
