"""Redfish-provider migrate/remove: ledger spare pool, node bindings, tickets, BMC emulator.

Real peers: the sushy-tools Redfish emulator (session fixture) and the embedded
PostgreSQL ledger (fresh schema per test).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.activity import Info
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ledger import Ledger
from activities.power import PowerActivities
from activities.provisioning import ProvisioningActivities
from activities.spares import MachineBindings, SparePool
from workers.devpeers import RedfishEmulator
from workflows.activity_api import ERR_UNSUPPORTED, MachineActionInput
from workflows.config import AutorepairConfig, BmcConfig, ClusterConfig, NodeConfig, SecretsConfig


def _config(emu: RedfishEmulator, secrets: Path, name: str, spares: list[str]) -> AutorepairConfig:
    nodes = [NodeConfig(name=n, machine=n, bmc=BmcConfig(address=emu.url, system_id=sid))
             for n, sid in emu.systems.items()]
    return AutorepairConfig(
        clusters=[ClusterConfig(name=name, scheduler="slurm", nodes=nodes, spares=spares)],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets)),
    )


def _inp(cluster: str, node: str, rid: str) -> MachineActionInput:
    return MachineActionInput(cluster=cluster, node=node, machine=node, repair_id=rid)


def _retry_env(phase: str) -> ActivityEnvironment:
    """An activity environment whose previous attempt heartbeated ``phase``."""
    env = ActivityEnvironment()
    env.info = Info(**{**env.info.__dict__, "attempt": 2, "heartbeat_details": [{"phase": phase}]})
    return env


@pytest.fixture()
def cluster_name() -> str:
    return "prov-" + uuid.uuid4().hex[:8]


async def test_migrate_takes_seeded_spare_binds_node_and_is_idempotent(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, ledger_pool: Any,
    cluster_name: str,
) -> None:
    cfg = _config(redfish_emulator, bmc_secrets_file, cluster_name, spares=["gpu-04"])
    prov = ProvisioningActivities(cfg, pool=ledger_pool)
    bindings = MachineBindings(ledger_pool)
    spares = SparePool(ledger_pool)

    res = await ActivityEnvironment().run(prov.migrate_node, _inp(cluster_name, "gpu-02", "r-m1"))
    assert (res.old_machine, res.new_machine) == ("gpu-02", "gpu-04")
    assert "bound to spare gpu-04" in res.detail and "gpu-04:" in res.detail
    assert await bindings.machine_of(cluster_name, "gpu-02") == "gpu-04"
    assert await bindings.node_of(cluster_name, "gpu-04") == "gpu-02"
    assert await spares.list(cluster_name) == []  # taken out of the pool
    move = await bindings.move("r-m1", "migrate")
    assert move is not None and move.new_machine == "gpu-04" and move.old_machine == "gpu-02"

    # a retry after a crash past the restart recognises its own work: same machine, no
    # second spare taken, no second restart
    again = await _retry_env("restart_sent").run(
        prov.migrate_node, _inp(cluster_name, "gpu-02", "r-m1"))
    assert (again.old_machine, again.new_machine) == ("gpu-02", "gpu-04")
    assert "already bound by a previous attempt" in again.detail
    assert "restart already sent" in again.detail
    assert await bindings.bindings(cluster_name) == {"gpu-02": "gpu-04"}

    # the BMC side follows the binding: a reboot of node gpu-02 goes to machine gpu-04
    power = PowerActivities(cfg, bindings=prov.bound_machine)
    cur = await power.current(_inp(cluster_name, "gpu-02", "r-next"))
    assert cur.machine == "gpu-04"
    # the pool is not re-seeded with a machine that serves a node: no spare left
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(prov.migrate_node, _inp(cluster_name, "gpu-01", "r-m2"))
    err = ei.value
    assert err.type == ERR_UNSUPPORTED and err.non_retryable  # nothing touched
    assert f"cluster {cluster_name}" in str(err) and "no spare" in str(err)
    assert await bindings.move("r-m2", "migrate") is None


async def test_second_migrate_moves_off_the_bound_machine(
    ledger_pool: Any, cluster_name: str
) -> None:
    """Ledger level: a node migrated twice moves off its bound machine, not the config one."""
    b = MachineBindings(ledger_pool)
    await b.spares.seed(cluster_name, ["s1", "s2"])
    first = await b.migrate(cluster_name, "n1", "m1", "r1")
    assert first is not None and (first.old_machine, first.new_machine) == ("m1", "s1")
    second = await b.migrate(cluster_name, "n1", "m1", "r2")
    assert second is not None and (second.old_machine, second.new_machine) == ("s1", "s2")
    assert await b.bindings(cluster_name) == {"n1": "s2"}


async def test_racing_migrations_never_share_a_spare(ledger_pool: Any, cluster_name: str) -> None:
    b = MachineBindings(ledger_pool)
    await b.spares.seed(cluster_name, ["spare-a"])
    moves = await asyncio.gather(*(
        b.migrate(cluster_name, f"n{i}", f"m{i}", f"race-{i}") for i in range(4)
    ))
    won = [m for m in moves if m is not None]
    assert len(won) == 1 and won[0].new_machine == "spare-a"
    assert await b.spares.size(cluster_name) == 0


async def test_remove_opens_ticket_marks_out_of_pool_idempotent(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, ledger_pool: Any,
    cluster_name: str,
) -> None:
    cfg = _config(redfish_emulator, bmc_secrets_file, cluster_name, spares=["gpu-03"])
    prov = ProvisioningActivities(cfg, pool=ledger_pool)
    bindings = MachineBindings(ledger_pool)
    ledger = Ledger(ledger_pool)
    await bindings.spares.add(cluster_name, "gpu-03")  # a spare that turns out broken

    res = await ActivityEnvironment().run(prov.remove_machine, _inp(cluster_name, "gpu-03", "r-x"))
    assert res.done and res.ticket_id and res.ticket_id.startswith("HW-")
    assert "removed from the pool" in res.detail
    tickets = await ledger.open_tickets("gpu-03")
    assert [t["ticket_id"] for t in tickets] == [res.ticket_id]
    assert tickets[0]["run_id"] == "remove/r-x" and "r-x" in tickets[0]["summary"]
    assert await bindings.removed(cluster_name) == ["gpu-03"]
    assert await bindings.spares.list(cluster_name) == []

    again = await ActivityEnvironment().run(
        prov.remove_machine, _inp(cluster_name, "gpu-03", "r-x"))
    assert again.ticket_id == res.ticket_id and "already removed" in again.detail
    assert len(await ledger.open_tickets("gpu-03")) == 1

    # a removed machine is never seeded back as a spare
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(prov.migrate_node, _inp(cluster_name, "gpu-01", "r-y"))
    assert ei.value.type == ERR_UNSUPPORTED and cluster_name in str(ei.value)
