"""Dev-server tests: update-with-start as the ingest calls it, and scenario 11 — the
worker process is SIGKILLed mid-drain and again mid-power-cycle; the repair resumes and
the host is power-cycled at most once (boot-ID check)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import OWN_WORKFLOWS, FakeCluster, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.worker_proc import write_state
from workflows.activity_api import ACT, NodePolicy, NodeRef, PolicySnapshot
from workflows.config import PolicyConfig
from workflows.models import (
    Action,
    AlertDelivery,
    AlertOutcome,
    NodeInput,
    RepairRequest,
    RepairStatus,
    Stage,
)
from workflows.protocol import NODE_UPDATE_DELIVER_ALERT, workflow_id_node, workflow_id_repair

pytestmark = pytest.mark.devserver
ROOT = Path(__file__).resolve().parents[2]


async def test_update_with_start_delivers_alerts(
    temporal_dev_env: WorkflowEnvironment, ledger_pool: Any
) -> None:
    env = temporal_dev_env
    sfx = uuid.uuid4().hex[:8]
    fake = FakeCluster(cluster=f"u-{sfx}", nodes=["gpu-01"])
    policy = PolicyConfig()
    from temporalio import activity

    @activity.defn(name=ACT.load_policy)
    async def load_policy(cluster: str) -> PolicySnapshot:
        return PolicySnapshot(cluster=cluster, policy=policy, gpu_nodes=8, scheduler="slurm")

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(ref: NodeRef) -> NodePolicy:
        return NodePolicy.of(await load_policy(ref.cluster), ref.node)

    tq = f"autorepair-{sfx}"
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        activities=[
            *LedgerActivities(ledger_pool).all(),
            load_policy,
            load_node_policy,
            *fake.scheduler_activities(),
            *GuardReplyActivities(env.client).all(),
        ],
    ):
        outcomes = []
        for alert in (
            make_alert(fake.cluster, "gpu-01", 1, code=45, action="none", actionable=False),
        ) * 2:
            op = WithStartWorkflowOperation(
                "NodeWorkflow",
                NodeInput(cluster=fake.cluster, node="gpu-01"),
                id=workflow_id_node(fake.cluster, "gpu-01"),
                task_queue=tq,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
            outcomes.append(
                await env.client.execute_update_with_start_workflow(
                    NODE_UPDATE_DELIVER_ALERT,
                    alert,
                    start_workflow_operation=op,
                    result_type=AlertDelivery,
                )
            )
        assert [o.outcome for o in outcomes] == [AlertOutcome.ignored, AlertOutcome.deduplicated]
        await env.client.get_workflow_handle(workflow_id_node(fake.cluster, "gpu-01")).terminate()


class Proc:
    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.workflows.worker_proc",
            *self.args,
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no graceful shutdown, nothing reported
        await self.proc.wait()


@pytest.fixture
async def schema_dsn(pg_dsn: str, ledger_pool: Any) -> AsyncIterator[tuple[str, str]]:
    schema = await ledger_pool.fetchval("SELECT current_schema()")
    yield pg_dsn, str(schema)


def read_state(state: Path) -> dict[str, Any]:
    return dict(json.loads(state.read_text()))


async def wait_event(state: Path, prefix: str, within_s: float = 60) -> None:
    for _ in range(int(within_s / 0.1)):
        events = read_state(state).get("events", [])
        if any(e.startswith(prefix) for e in events):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no event {prefix!r} in {read_state(state)}")


async def test_scenario_11_worker_killed_mid_drain_and_mid_power_cycle(
    temporal_dev_env: WorkflowEnvironment,
    ledger_pool: Any,
    schema_dsn: tuple[str, str],
    tmp_path: Path,
) -> None:
    env = temporal_dev_env
    sfx = uuid.uuid4().hex[:8]
    cluster, tq, bmc_q = f"k-{sfx}", f"autorepair-{sfx}", f"bmc-{sfx}"
    policy = PolicyConfig()
    policy.consent.mode = "automatic"
    policy.rails.heartbeat_timeout_s = 2  # a dead worker's attempt is retried quickly
    state = tmp_path / "cluster.json"
    state.write_text(
        json.dumps(
            {"boot": 0, "power_cycles": 0, "events": [], "policy": policy.model_dump(mode="json")}
        )
    )
    dsn, schema = schema_dsn
    args = [env.client.service_client.config.target_host, tq, bmc_q, str(state), dsn, schema]
    req = RepairRequest(
        repair_id="r11",
        cluster=cluster,
        node="gpu-01",
        action=Action.power_cycle,
        alerts=[make_alert(cluster, "gpu-01", 11)],
    )
    worker = Proc(args)
    await worker.start()
    try:
        handle = await env.client.start_workflow(
            "RepairWorkflow",
            req,
            id=workflow_id_repair(cluster, "gpu-01", "r11"),
            task_queue=tq,
            result_type=RepairStatus,
        )
        await wait_event(state, "drain_started:1")
        await worker.kill()  # killed while the node is draining
        worker = Proc(args)
        await worker.start()
        await wait_event(state, "drain_started:2")  # resumed where it was: drain again
        write_state(state, {**read_state(state), "drain_release": True})
        await wait_event(state, "power_cycled:1")
        await worker.kill()  # killed while the power cycle is in flight
        worker = Proc(args)
        await worker.start()
        # the heartbeat timeout is transient: the workflow retries the action (a new
        # activity, attempt 1) within rails.action_retry_max_s and the boot id guards it
        await wait_event(state, "power_cycle_skipped:")
        st = await asyncio.wait_for(handle.result(), 90)
    finally:
        await worker.kill()
    final = json.loads(state.read_text())
    assert st.stage == Stage.succeeded, st.detail
    assert final["power_cycles"] == 1  # at most once, thanks to the boot-ID check
    assert final["events"].count("cordon") == 1 and "uncordon" in final["events"]
    row = await Ledger(ledger_pool).get_repair("r11")
    assert row is not None and row["stage"] == "succeeded"
    assert [a["outcome"] for a in row["attempts"]] == ["succeeded"]  # the kill did not count
    await env.client.get_workflow_handle(f"guard/{cluster}").terminate()
