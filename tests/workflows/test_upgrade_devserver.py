"""I24 "upgrades change nothing in flight" on the real dev server (issue 26).

Two worker processes of the same code (:mod:`tests.workflows.versioned_worker_proc`)
poll as Worker Deployment Versions ``ar-…:1.0.0`` (build A) and ``ar-…:1.1.0`` (build
B), the upgrade procedure of docs/runbook.md "Upgrade the workers": A is current (it
promoted itself at start); B runs beside it with promotion off (both processes start
at once: their start-up is most of this test's time) and is made current while a
repair waits on A, with the function a promoting worker calls
(:func:`workers.versioning.promote_current_version`); A keeps running until its pinned
workflows drain, then stops. Checked on the server's own
records (describe: versioning info, drainage info; history: the identity of the worker
that completed each task):

(a) the repair started on A stays PINNED to A after B became current and completes every
    rail there: approval, cordon, drain, power cycle, rejoin (uncordon), lease release,
    the ledger's end row; every one of its workflow and activity tasks ran on A;
(b) the node entity (PINNED like the repair) moves to B by continue-as-new at its next
    task once B is current (``workflows.upgrades``: it never replays A's history on B),
    carrying its open repair, and still reconciles with the repair's end: a later alert
    opens a new repair (on B), not ``attached`` to the ended one (reproduction 9);
(c) once the repair ended, A's version reports ``DRAINED`` (drainage info) and its
    worker can stop; B keeps serving the node.

The drainage status is refreshed by the server on its own clock (3 min by default), so
this test runs its own dev server with ``matching.wv.VersionDrainageStatus*`` shortened.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as PbVersion
from temporalio.api.enums.v1 import EventType, VersionDrainageStatus
from temporalio.api.enums.v1 import VersioningBehavior as PbBehavior
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
)
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment

from activities.ledger import Ledger
from tests.conftest import venv_binary
from tests.workflows.conftest import make_alert
from tests.workflows.helpers import eventually
from workers.versioning import promote_current_version
from workflows.config import PolicyConfig, TemporalConfig
from workflows.models import (
    AlertDelivery,
    AlertOutcome,
    ApproveSignal,
    NodeInput,
    RejectSignal,
    RepairStatus,
    Stage,
)
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    NODE_UPDATE_DELIVER_ALERT,
    REPAIR_QUERY_STATUS,
    REPAIR_SIGNAL_APPROVE,
    REPAIR_SIGNAL_REJECT,
    SEARCH_ATTRIBUTES,
    GuardStatus,
    workflow_id_guard,
    workflow_id_node,
    workflow_id_repair,
)

pytestmark = [pytest.mark.devserver, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]
BUILD_A, BUILD_B = "1.0.0", "1.1.0"
#: Drainage refresh and visibility grace of this test's dev server (server defaults: 3 min
#: and 3 min, ``matching.wv.VersionDrainageStatus*`` of Temporal server 1.32).
DRAINAGE_S = "1s"


@pytest.fixture(scope="module")
async def upgrade_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of its own (drainage refreshed every second)."""
    from temporalio.common import SearchAttributeKey
    from temporalio.contrib.pydantic import pydantic_data_converter

    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=venv_binary("temporal"),
        search_attributes=[SearchAttributeKey.for_keyword(n) for n in SEARCH_ATTRIBUTES],
        ui=False,
        dev_server_log_level="error",
        dev_server_extra_args=[
            "--dynamic-config-value",
            f'matching.wv.VersionDrainageStatusRefreshInterval="{DRAINAGE_S}"',
            "--dynamic-config-value",
            f'matching.wv.VersionDrainageStatusVisibilityGracePeriod="{DRAINAGE_S}"',
        ],
    )
    try:
        yield env
    finally:
        await env.shutdown()


class BuildWorker:
    """One build's worker process (``tests.workflows.versioned_worker_proc``)."""

    def __init__(self, args: list[str], build: str, promote: bool) -> None:
        self.args = [*args, build, "promote" if promote else "manual"]
        self.build = build
        self.proc: asyncio.subprocess.Process | None = None

    async def spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.workflows.versioned_worker_proc", *self.args,
            cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
        )

    async def ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 90)
        assert line.decode().strip() == f"worker ready {self.build}", line

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


async def _version_info(client: Client, wid: str) -> tuple[int, str]:
    """(behaviour, build id) the server records for ``wid``'s last workflow task."""
    desc = await client.get_workflow_handle(wid).describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    return info.behavior, info.deployment_version.build_id


async def _task_identities(client: Client, wid: str) -> tuple[set[str], set[str]]:
    """Identities of the workers that completed ``wid``'s workflow tasks and started its
    activity tasks."""
    hist = await client.get_workflow_handle(wid).fetch_history()
    wft = {e.workflow_task_completed_event_attributes.identity for e in hist.events
           if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED}
    act = {e.activity_task_started_event_attributes.identity for e in hist.events
           if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}
    return wft, act


async def _drainage(client: Client, deployment: str, build: str) -> int:
    desc = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=PbVersion(deployment_name=deployment, build_id=build),
        )
    )
    return int(desc.worker_deployment_version_info.drainage_info.status)


async def _current(client: Client, deployment: str) -> str:
    desc = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    return desc.worker_deployment_info.routing_config.current_deployment_version.build_id


async def _deliver(client: Client, cluster: str, node: str, tq: str, n: int,
                   **kw: Any) -> AlertDelivery:
    op: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
        "NodeWorkflow", NodeInput(cluster=cluster, node=node),
        id=workflow_id_node(cluster, node), task_queue=tq,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    alert = make_alert(cluster, node, n, observed_at=datetime.now(UTC), **kw)
    return await client.execute_update_with_start_workflow(
        NODE_UPDATE_DELIVER_ALERT, alert, start_workflow_operation=op, result_type=AlertDelivery
    )


async def test_upgrade_keeps_pinned_repair_on_its_build_and_moves_the_node(
    upgrade_env: WorkflowEnvironment, ledger_pool: Any, pg_dsn: str, tmp_path: Path
) -> None:
    client = upgrade_env.client
    sfx = uuid.uuid4().hex[:8]
    cluster, node = f"up-{sfx}", "gpu-01"
    tq, bmc_q, deployment = f"autorepair-{sfx}", f"bmc-{sfx}", f"ar-{sfx}"
    policy = PolicyConfig()  # consent "approve": the repair waits for a person
    policy.rails.cooldown_s = 0  # a later fault may open a new repair at once
    state = tmp_path / "cluster.json"
    state.write_text(json.dumps({
        "boot": 0, "power_cycles": 0, "events": [], "drain_release": True,
        "power_release": True, "policy": policy.model_dump(mode="json"),
    }))
    schema = str(await ledger_pool.fetchval("SELECT current_schema()"))
    args = [client.service_client.config.target_host, tq, bmc_q, str(state), pg_dsn, schema,
            deployment]
    a = BuildWorker(args, BUILD_A, promote=True)
    b = BuildWorker(args, BUILD_B, promote=False)
    nid = workflow_id_node(cluster, node)
    try:
        await a.spawn()
        await b.spawn()
        await a.ready()
        await b.ready()
        assert await _current(client, deployment) == BUILD_A  # B polls, not current
        first = await _deliver(client, cluster, node, tq, 1)
        assert first.outcome == AlertOutcome.recommended and first.repair_id, first
        rid = workflow_id_repair(cluster, node, first.repair_id)
        repair = client.get_workflow_handle(rid, result_type=RepairStatus)

        async def awaiting() -> bool:
            st = await repair.query(REPAIR_QUERY_STATUS, result_type=RepairStatus)
            return st.stage == Stage.awaiting_approval

        await eventually(awaiting, "repair awaiting approval on build A", tries=60 * 20)

        # build B, beside A, becomes the deployment's current version
        cfg_b = TemporalConfig(address=args[0], task_queue=tq, bmc_task_queue=bmc_q,
                               deployment_name=deployment, build_id=BUILD_B)
        assert await promote_current_version(client, cfg_b) == BUILD_B
        assert await _current(client, deployment) == BUILD_B

        # (b) the node entity's next task sees B current: it continues as new onto B
        nudge = await _deliver(client, cluster, node, tq, 2, code=45, action="none",
                               actionable=False)
        # (an application Xid: attached to the repair as evidence, it drives nothing)
        assert nudge.outcome == AlertOutcome.attached, nudge

        async def node_on_b() -> bool:
            return await _version_info(client, nid) == (
                PbBehavior.VERSIONING_BEHAVIOR_PINNED, BUILD_B)

        await eventually(node_on_b, "node entity moved to build B", tries=30 * 20)
        # (a) the repair stays pinned on A
        assert await _version_info(client, rid) == (PbBehavior.VERSIONING_BEHAVIOR_PINNED,
                                                    BUILD_A)

        await repair.signal(REPAIR_SIGNAL_APPROVE, ApproveSignal(by="oncall"))
        st = await asyncio.wait_for(repair.result(), 90)
        assert st.stage == Stage.succeeded, st.detail
        wft, act = await _task_identities(client, rid)
        assert wft == {f"build-{BUILD_A}"}, wft  # every workflow task of the repair on A
        assert act == {f"build-{BUILD_A}"}, act  # and every activity, BMC queue included
        events = json.loads(state.read_text())["events"]
        assert events.count("cordon") == 1 and "uncordon" in events, events
        assert json.loads(state.read_text())["power_cycles"] == 1
        row = await Ledger(ledger_pool).get_repair(first.repair_id)
        assert row is not None and row["stage"] == "succeeded", row
        guard = client.get_workflow_handle(workflow_id_guard(cluster))

        async def lease_released() -> bool:
            gs = await guard.query(GUARD_QUERY_STATUS, result_type=GuardStatus)
            return not gs.leases and not gs.pending

        await eventually(lease_released, "lease released to the guard", tries=30 * 20)
        # the guard (started by the pinned repair on A, pinned itself) moved to B by
        # continue-as-new once B was current: it holds nothing of A's back from draining

        async def guard_on_b() -> bool:
            return await _version_info(client, workflow_id_guard(cluster)) == (
                PbBehavior.VERSIONING_BEHAVIOR_PINNED, BUILD_B)

        await eventually(guard_on_b, "guard moved to build B", tries=30 * 20)

        # (b) the node, now on B, reconciled with the repair's end: a new fault opens a
        # new repair (reproduction 9: never "attached" to the ended one), started on B
        again = await _deliver(client, cluster, node, tq, 3)
        assert again.outcome == AlertOutcome.recommended, again  # not "attached"
        assert again.repair_id and again.repair_id != first.repair_id, again
        rid2 = workflow_id_repair(cluster, node, again.repair_id)

        async def second_on_b() -> bool:
            return await _version_info(client, rid2) == (
                PbBehavior.VERSIONING_BEHAVIOR_PINNED, BUILD_B)

        await eventually(second_on_b, "the new repair pinned to build B", tries=30 * 20)
        assert (await _version_info(client, nid))[1] == BUILD_B

        # (c) A's pinned workflows have ended: the server reports A drained, A stops
        async def a_drained() -> bool:
            return await _drainage(client, deployment, BUILD_A) == int(
                VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED)

        await eventually(a_drained, "build A drained", tries=30 * 20)
        await a.stop()
        second = client.get_workflow_handle(rid2, result_type=RepairStatus)
        await second.signal(REPAIR_SIGNAL_REJECT, RejectSignal(by="oncall", reason="test"))
        st2 = await asyncio.wait_for(second.result(), 60)
        assert st2.stage == Stage.rejected, st2.detail
        wft2, _ = await _task_identities(client, rid2)
        assert wft2 == {f"build-{BUILD_B}"}, wft2
    finally:
        await a.stop()
        await b.stop()
