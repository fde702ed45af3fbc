"""Shared harness of the end-to-end repair tests (``test_repair_e2e_*.py``).

The real ``RepairWorkflow`` (and the guard it leases from) on the Temporal dev server,
with the real activities: scheduler (Slurm or Kubernetes), Redfish power through the
sushy-tools emulator, provisioning, ledger (embedded PostgreSQL) and policy — wired like
``workers.worker.build_workers`` (two workers; the BMC one rate limited), built with
``activities.registry.build_activities`` so a pre-built Kubernetes client can be passed
and notifications are recorded instead of logged.

The BMC worker listens on the default ``autorepair-bmc`` queue: ``load_policy`` hands
workflows ``PolicySnapshot.bmc_task_queue``'s default, not ``temporal.bmc_task_queue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.registry import build_activities
from activities.scheduler_activities import SchedulerActivities
from workers.devpeers import RedfishEmulator
from workflows.activity_api import ACT, Notification
from workflows.config import (
    AutorepairConfig,
    BmcConfig,
    ClusterConfig,
    NodeConfig,
    PolicyConfig,
    SecretsConfig,
    TemporalConfig,
)
from workflows.models import Alert, RepairRequest, RepairStatus, Stage
from workflows.protocol import workflow_id_repair
from workflows.registry import WORKFLOWS

#: The stages of an approved reboot that goes through every step, in order.
REBOOT_STAGES = [
    Stage.recommended, Stage.awaiting_approval, Stage.cordoning, Stage.waiting_for_idle,
    Stage.draining, Stage.repairing, Stage.joining, Stage.running, Stage.succeeded,
]


def e2e_config(
    kind: str, emu: RedfishEmulator, secrets_file: Path, nodes: list[str],
    slurm_conf: str | None = None,
) -> AutorepairConfig:
    """Config of one test cluster (unique name and task queue) with short waits."""
    suffix = uuid.uuid4().hex[:8]
    policy = PolicyConfig()
    policy.consent.mode = "approve"
    policy.wait_for_idle.poll_s = 1.0
    policy.wait_for_idle.max_wait_s = 300.0
    policy.rails.rejoin_timeout_s = 150.0
    policy.rails.drain_deadline_s = 60.0
    policy.rails.cooldown_s = 0.0
    return AutorepairConfig(
        temporal=TemporalConfig(task_queue=f"e2e-{suffix}"),
        policy=policy,
        clusters=[ClusterConfig(
            name=f"e2e-{kind}-{suffix}",
            scheduler="slurm" if kind == "slurm" else "kubernetes",
            slurm_conf=slurm_conf,
            slurm_boot_identity="slurmd_start",  # reboots are simulated slurmd restarts
            nodes=[NodeConfig(name=n, machine=n, pool=f"pool-{n}",
                              bmc=BmcConfig(address=emu.url, system_id=emu.systems[n]))
                   for n in nodes],
        )],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets_file)),
    )


@dataclass
class Notifications:
    """Sink of the ``notify`` activity: records what the workflows would have sent."""

    sent: list[Notification] = field(default_factory=list)

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> None:
        self.sent.append(n)


@contextlib.asynccontextmanager
async def running_workers(
    client: Client, config: AutorepairConfig, pool: asyncpg.Pool,
    sched: SchedulerActivities, notes: Notifications,
) -> AsyncIterator[None]:
    """The main and BMC workers with the real activities, running for the block."""
    acts = build_activities(config, pool, scheduler=sched, notify=notes.notify)
    workers = [
        Worker(client, task_queue=config.temporal.task_queue, workflows=list(WORKFLOWS),
               activities=[*acts.main, *GuardReplyActivities(client).all()]),
        Worker(client, task_queue=config.temporal.bmc_task_queue, activities=acts.bmc,
               max_task_queue_activities_per_second=config.temporal.bmc_rate_per_s),
    ]
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(w)
        yield


def reboot_alert(cluster: str, node: str, rid: str) -> Alert:
    """The evidence: a double-bit ECC Xid 48 (catalogue: reboot)."""
    return Alert.model_validate(dict(
        alert_id=f"{cluster}/{node}/{rid}", cluster=cluster, node=node, kind="xid", code=48,
        gpu="0000:3b:00.0", severity="critical", actionable=True, action="reboot",
        summary="Xid 48: double bit ECC error",
        evidence_text="NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, DBE",
        observed_at=datetime.now(UTC),
    ))


async def start_reboot(client: Client, config: AutorepairConfig, node: str, rid: str
                       ) -> WorkflowHandle[Any, RepairStatus]:
    c = config.clusters[0]
    req = RepairRequest(repair_id=rid, cluster=c.name, node=node, action="reboot",  # type: ignore[arg-type]
                        reason="e2e: Xid 48 on the node", alerts=[reboot_alert(c.name, node, rid)])
    return await client.start_workflow(
        "RepairWorkflow", req, id=workflow_id_repair(c.name, node, rid),
        task_queue=config.temporal.task_queue, result_type=RepairStatus,
    )


async def wait_stage(handle: WorkflowHandle[Any, RepairStatus], stage: Stage,
                     limit_s: float = 60.0) -> RepairStatus:
    """Poll the ``status`` query until the repair is at ``stage``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        st = await handle.query("status", result_type=RepairStatus)
        if st.stage == stage:
            return st
        assert loop.time() < deadline, f"stage {stage} not reached; at {st.stage}: {st.detail}"
        await asyncio.sleep(0.2)


def distinct_stages(stages: list[Any]) -> list[str]:
    """Stage names with consecutive repeats (notes) collapsed."""
    out: list[str] = []
    for s in stages:
        name = getattr(s, "value", s)
        if not out or out[-1] != name:
            out.append(str(name))
    return out


async def ledger_record(pool: asyncpg.Pool, rid: str) -> dict[str, Any]:
    rec = await Ledger(pool).get_repair(rid)
    assert rec is not None, f"repair {rid} not in the ledger"
    return rec
