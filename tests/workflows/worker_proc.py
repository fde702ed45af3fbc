"""A real worker process for scenario 11 (killed with SIGKILL by the test).

Runs our workflows, the real ledger activities and same-named fake scheduler/BMC
activities whose cluster state lives in a JSON file outside the process, so it survives
the kill: ``python -m tests.workflows.worker_proc ADDRESS TASK_QUEUE BMC_QUEUE STATE DSN
SCHEMA``. The file holds ``boot`` (int), ``power_cycles`` (int), ``events`` (list) and
the gates ``drain_release`` / ``power_release`` the test opens.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import connect
from activities.ledger_activities import LedgerActivities
from tests.workflows.fake_validation import FakeValidationWorkflow
from workflows.activity_api import (
    ACT,
    ActionResult,
    CordonInput,
    CordonResult,
    DrainInput,
    DrainResult,
    IdleStatus,
    MachineActionInput,
    NodeHealth,
    NodePolicy,
    NodeRef,
    Notification,
    PolicySnapshot,
    RejoinInput,
    RejoinResult,
)
from workflows.config import PolicyConfig
from workflows.registry import WORKFLOWS


def write_state(path: Path, doc: dict[str, Any]) -> None:
    """Replace the JSON state file at once (a temporary file renamed over it): the test
    and the worker read it while the other writes, and a plain ``write_text`` lets a
    reader see it empty or half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class FileCluster:
    """Cluster state in a JSON file (read-modify-write under an exclusive ``flock`` on
    ``STATE.lock``: the upgrade test runs two worker processes on one file)."""

    def __init__(self, path: Path, bmc_queue: str) -> None:
        self.path, self.bmc_queue = path, bmc_queue

    def load(self) -> dict[str, Any]:
        return dict(json.loads(self.path.read_text()))

    def update(self, **kw: Any) -> dict[str, Any]:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            st = self.load()
            event = kw.pop("event", None)
            st.update(kw)
            if event:
                st.setdefault("events", []).append(event)
            write_state(self.path, st)
            return st

    async def gate(self, name: str) -> None:
        while not self.load().get(name):
            activity.heartbeat(name)
            await asyncio.sleep(0.2)

    @activity.defn(name=ACT.load_policy)
    async def load_policy(self, cluster: str) -> PolicySnapshot:
        policy = PolicyConfig.model_validate(self.load()["policy"])
        return PolicySnapshot(
            cluster=cluster,
            policy=policy,
            gpu_nodes=8,
            scheduler="slurm",
            machines={},
            bmc_task_queue=self.bmc_queue,
        )

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(self, ref: NodeRef) -> NodePolicy:
        """``load_policy``'s answer for ``ref.node`` (the node's and repair's read)."""
        return NodePolicy.of(await self.load_policy(ref.cluster), ref.node)

    @activity.defn(name=ACT.cordon_node)
    async def cordon_node(self, inp: CordonInput) -> CordonResult:
        self.update(cordon=inp.repair_id, event="cordon")
        return CordonResult(cordoned_by_us=True)

    @activity.defn(name=ACT.check_idle)
    async def check_idle(self, ref: NodeRef) -> IdleStatus:
        return IdleStatus(idle=True)

    @activity.defn(name=ACT.drain_node)
    async def drain_node(self, inp: DrainInput) -> DrainResult:
        self.update(event=f"drain_started:{activity.info().attempt}")
        await self.gate("drain_release")
        self.update(event="drained")
        return DrainResult(drained=True)

    @activity.defn(name=ACT.rejoin_node)
    async def rejoin_node(self, inp: RejoinInput) -> RejoinResult:
        st = self.load()
        if st.get("cordon") == inp.repair_id:
            self.update(cordon=None, event="uncordon")
            return RejoinResult(uncordoned=True)
        return RejoinResult(uncordoned=False, kept_reason="not ours")

    @activity.defn(name=ACT.node_health)
    async def node_health(self, ref: NodeRef) -> NodeHealth:
        return NodeHealth(ready=True, boot_id=f"boot-{self.load()['boot']}")

    @activity.defn(name=ACT.power_cycle_machine)
    async def power_cycle_machine(self, inp: MachineActionInput) -> ActionResult:
        st = self.load()
        attempt = activity.info().attempt
        if inp.boot_id_before is not None and inp.boot_id_before != f"boot-{st['boot']}":
            self.update(event=f"power_cycle_skipped:{attempt}")
            return ActionResult(done=True, skipped_reason="host already came back (boot id)")
        # the host is cycled (off/on), then we wait for it: the kill lands in that wait
        self.update(
            boot=st["boot"] + 1,
            power_cycles=st["power_cycles"] + 1,
            event=f"power_cycled:{attempt}",
        )
        await self.gate("power_release")
        return ActionResult(done=True)

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> None:
        self.update(event=f"notify:{n.subject}")


async def main(argv: list[str]) -> None:
    address, tq, bmc_q, state, dsn, schema = argv
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    cluster = FileCluster(Path(state), bmc_q)
    pool = await connect(dsn, schema=schema, max_size=3)
    ledger = LedgerActivities(pool)
    workflows = [w for w in WORKFLOWS if w.__name__ != "ValidationWorkflow"]
    main_w = Worker(
        client,
        task_queue=tq,
        workflows=[*workflows, FakeValidationWorkflow],
        activities=[
            *ledger.all(),
            cluster.load_policy,
            cluster.load_node_policy,
            cluster.cordon_node,
            cluster.check_idle,
            cluster.drain_node,
            cluster.rejoin_node,
            cluster.node_health,
            cluster.notify,
            *GuardReplyActivities(client).all(),
        ],
        max_cached_workflows=0,
    )
    bmc_w = Worker(client, task_queue=bmc_q, activities=[cluster.power_cycle_machine])
    print("worker ready", flush=True)
    await asyncio.gather(main_w.run(), bmc_w.run())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
