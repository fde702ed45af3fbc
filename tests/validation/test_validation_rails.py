"""Re-validation never undoes a human or another repair (real loopback Slurm cluster and
kmock Kubernetes; the validation activities driven directly; the real ledger).

* Slurm: a drain an operator sets while the check runs keeps the operator's reason on
  every verdict (passed → pool, passed → spare, failed, aborted); ``aborted`` without
  meddling restores the exact prior drain, reason included; placement is refused on an
  operator's drain and on a node another repair holds; a validation never resumes a node
  another repair has in flight.
* Kubernetes: the validation's own cordon marker decides, not whoever holds the node: a
  cordon of another repair in flight survives a pass; the originating repair's cordon is
  taken over at placement and handed back exactly on ``aborted``; a foreign cordon is
  never turned into a spare.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import pytest

from activities.ledger import Ledger
from activities.scheduler.kube import ANN_REPAIR_ID, TAINT_KEY, KubeScheduler
from activities.spares import SparePool
from activities.validation_activities import ValidationActivities
from workers.devpeers import SlurmCluster
from workflows.activity_api import (
    CollectInput,
    RepairRecord,
    ReturnMachineInput,
    ValidationPlacement,
)
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ValidationConfig
from workflows.models import Action, Requester, RequesterKind, Stage, Verdict

OPERATOR = "operator: cable swap"


async def in_flight(ledger: Ledger, cluster: str, node: str, repair_id: str) -> None:
    """A repair acting on ``node`` (its ledger row at ``waiting_for_idle``)."""
    await ledger.upsert_repair(RepairRecord(
        repair_id=repair_id, cluster=cluster, node=node, action=Action.reboot,
        stage=Stage.waiting_for_idle, requester=Requester(kind=RequesterKind.system, name="t"),
        updated_at=datetime.now(UTC)))


# --------------------------------------------------------------------------- Slurm
class SlurmEnv:
    def __init__(self, slurm: SlurmCluster, acts: ValidationActivities, ledger: Ledger,
                 cluster: str) -> None:
        self.slurm, self.acts, self.ledger, self.cluster = slurm, acts, ledger, cluster

    def line(self, node: str) -> str:
        return self.slurm.run("scontrol", "-o", "show", "node", node)

    def drain(self, node: str, reason: str) -> None:
        self.slurm.run("scontrol", "update", f"nodename={node}", "state=drain",
                       f"reason={reason}")

    async def place(self, node: str, run_id: str) -> Any:
        return await self.acts.place_validation(ValidationPlacement(
            cluster=self.cluster, machine=node, node=node, run_id=run_id))

    async def release(self, node: str, run_id: str, job_id: str) -> None:
        await self.acts.release_validation(CollectInput(
            cluster=self.cluster, machine=node, node=node, run_id=run_id, job_id=job_id))

    async def back(self, node: str, run_id: str, verdict: Verdict, prior: dict[str, Any],
                   return_to: str = "pool") -> Any:
        return await self.acts.return_machine(ReturnMachineInput(
            cluster=self.cluster, machine=node, node=node, run_id=run_id, verdict=verdict,
            prior_state=prior, return_to=return_to, ticket_id="HW-T"))


@pytest.fixture
async def senv(slurm_cluster: SlurmCluster, ledger_pool: Any,
               tmp_path: Path) -> AsyncIterator[SlurmEnv]:
    cluster = "vr-" + uuid.uuid4().hex[:6]
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name=cluster, scheduler="slurm", slurm_conf=str(slurm_cluster.conf_path),
        nodes=[NodeConfig(name=n, machine=n) for n in slurm_cluster.nodes],
        validation=ValidationConfig(command=["sleep", "60"], output_dir=str(tmp_path / "out"),
                                    timeout_s=120.0, poll_s=5.0),
    )])
    slurm_cluster.reset_nodes()
    try:
        yield SlurmEnv(slurm_cluster, ValidationActivities(cfg, ledger_pool),
                       Ledger(ledger_pool), cluster)
    finally:
        slurm_cluster.reset_nodes()


@pytest.mark.parametrize("verdict,return_to", [
    (Verdict.passed, "pool"), (Verdict.passed, "spare"), (Verdict.failed, "pool"),
    (Verdict.aborted, "pool")])
async def test_slurm_operator_drain_during_check_keeps_its_reason(
    senv: SlurmEnv, verdict: Verdict, return_to: str
) -> None:
    node, run = "gpu-02", f"validate/gpu-02/rep-mig-{verdict.value}"
    senv.drain(node, f"autorepair:rep-mig-{verdict.value} migrate")  # the handing repair
    placed = await senv.place(node, run)
    assert placed.placed, placed.reason
    assert "DRAIN" not in senv.line(node)  # taken over and resumed for the run
    senv.drain(node, OPERATOR)  # an operator drains while the check runs
    await senv.release(node, run, placed.job_id)
    back = await senv.back(node, run, verdict, placed.prior_state, return_to)
    line = senv.line(node)
    assert "DRAIN" in line and f"Reason={OPERATOR}" in line, (back.detail, line)
    assert not back.schedulable and not back.spare
    assert await SparePool(senv.ledger.pool).list(senv.cluster) == []


async def test_slurm_aborted_restores_exact_prior_drain(senv: SlurmEnv) -> None:
    node, run = "gpu-02", "validate/gpu-02/rep-abort"
    senv.drain(node, "autorepair:rep-abort migrate off m-2")
    placed = await senv.place(node, run)
    assert placed.placed, placed.reason
    await senv.release(node, run, placed.job_id)
    await senv.back(node, run, Verdict.aborted, placed.prior_state)
    assert "Reason=autorepair:rep-abort migrate off m-2" in senv.line(node)


async def test_slurm_never_places_on_or_resumes_what_is_not_its_own(senv: SlurmEnv) -> None:
    # an operator's drain: not placed, untouched
    senv.drain("gpu-03", OPERATOR)
    p = await senv.place("gpu-03", "validate/gpu-03/rep-a")
    assert not p.placed and "drained by" in p.reason
    assert f"Reason={OPERATOR}" in senv.line("gpu-03")
    # another repair in flight on the node: not placed, and a pass never resumes it
    await in_flight(senv.ledger, senv.cluster, "gpu-04", "rep-other")
    senv.drain("gpu-04", "autorepair:rep-other reboot")
    p = await senv.place("gpu-04", "validate/gpu-04/rep-b")
    assert not p.placed and "rep-other" in p.reason and "in flight" in p.reason
    for verdict, to in ((Verdict.passed, "pool"), (Verdict.passed, "spare"),
                        (Verdict.aborted, "pool")):
        back = await senv.back("gpu-04", "validate/gpu-04/rep-b", verdict,
                               {"scheduler": "slurm", "drain": False, "reason": ""}, to)
        assert "Reason=autorepair:rep-other reboot" in senv.line("gpu-04"), back.detail
    # the run's own drain is not resumed either while another repair is in flight
    senv.drain("gpu-04", "autorepair:validate/gpu-04/rep-b spare (validated)")
    back = await senv.back("gpu-04", "validate/gpu-04/rep-b", Verdict.aborted,
                           {"scheduler": "slurm", "drain": False, "reason": ""})
    assert "DRAIN" in senv.line("gpu-04") and "in flight" in back.detail


# ---------------------------------------------------------------------- Kubernetes
JOBS = kmock.resource("batch", "v1", "jobs")
KNODE = "gpu-01"


@pytest.fixture
async def kenv(kube_api: Any, ledger_pool: Any) -> AsyncIterator[tuple[Any, Any, Ledger, str]]:
    kube_api.server.resources[JOBS] = kmock.ResourceInfo(kind="Job", namespaced=True)
    cluster = "kr-" + uuid.uuid4().hex[:6]
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name=cluster, scheduler="kubernetes", nodes=[NodeConfig(name=KNODE, machine=KNODE)],
        validation=ValidationConfig(command=["true"], namespace="autorepair"))])
    acts = ValidationActivities(cfg, ledger_pool, kube_api_client=kube_api.api_client)
    yield kube_api, acts, Ledger(ledger_pool), cluster


def marker(kube: Any) -> tuple[bool, str | None, list[str]]:
    n = kube.node(KNODE)
    return (bool(n["spec"].get("unschedulable")),
            (n["metadata"].get("annotations") or {}).get(ANN_REPAIR_ID),
            [t.get("value") for t in n["spec"].get("taints") or [] if t["key"] == TAINT_KEY])


def kback(cluster: str, run: str, verdict: Verdict, prior: dict[str, Any],
          return_to: str = "pool") -> ReturnMachineInput:
    return ReturnMachineInput(cluster=cluster, machine=KNODE, node=KNODE, run_id=run,
                              verdict=verdict, prior_state=prior, return_to=return_to,
                              ticket_id="HW-K")


async def test_kube_pass_never_uncordons_another_repairs_cordon(kenv: Any) -> None:
    kube, acts, ledger, cluster = kenv
    kube.add_node(KNODE)
    await KubeScheduler(acts.config.cluster(cluster), api_client=kube.api_client).cordon(
        KNODE, "rep-other", "reboot")
    await in_flight(ledger, cluster, KNODE, "rep-other")
    run = f"validate/{KNODE}/rep-mig"
    p = await acts.place_validation(ValidationPlacement(cluster=cluster, machine=KNODE,
                                                        node=KNODE, run_id=run))
    assert not p.placed and "rep-other" in p.reason
    for verdict, to in ((Verdict.passed, "pool"), (Verdict.passed, "spare"),
                        (Verdict.aborted, "pool")):
        back = await acts.return_machine(kback(cluster, run, verdict, p.prior_state, to))
        assert marker(kube) == (True, "rep-other", ["rep-other"]), back.detail
        assert not back.spare
    assert await SparePool(ledger.pool).list(cluster) == []


async def test_kube_takes_over_the_handing_repairs_cordon_and_gives_it_back(kenv: Any) -> None:
    kube, acts, _ledger, cluster = kenv
    kube.add_node(KNODE)
    sched = KubeScheduler(acts.config.cluster(cluster), api_client=kube.api_client)
    run = f"validate/{KNODE}/rep-mig"
    await sched.cordon(KNODE, "rep-mig", "migrate")
    p = await acts.place_validation(ValidationPlacement(cluster=cluster, machine=KNODE,
                                                        node=KNODE, run_id=run))
    assert p.placed and p.prior_state["holder"] == "rep-mig"
    assert marker(kube) == (True, run, [run])  # the run's own marker now
    await acts.release_validation(CollectInput(cluster=cluster, machine=KNODE, node=KNODE,
                                               run_id=run, job_id=p.job_id or ""))
    await acts.return_machine(kback(cluster, run, Verdict.aborted, p.prior_state))
    assert marker(kube) == (True, "rep-mig", ["rep-mig"])  # exactly as before
    # a later run (rep-mig is not in flight) takes the cordon over; its pass returns the
    # machine: the run's own marker decides
    run2 = f"validate/{KNODE}/rep-later"
    p2 = await acts.place_validation(ValidationPlacement(cluster=cluster, machine=KNODE,
                                                         node=KNODE, run_id=run2))
    assert p2.placed and marker(kube) == (True, run2, [run2])
    back = await acts.return_machine(kback(cluster, run2, Verdict.passed, p2.prior_state))
    assert marker(kube) == (False, None, []), back.detail


async def test_kube_foreign_cordon_never_becomes_a_spare(kenv: Any) -> None:
    kube, acts, ledger, cluster = kenv
    kube.add_node(KNODE, unschedulable=True)  # kubectl cordon by an operator
    run = f"validate/{KNODE}/rep-s"
    p = await acts.place_validation(ValidationPlacement(cluster=cluster, machine=KNODE,
                                                        node=KNODE, run_id=run))
    assert p.placed
    for verdict, to in ((Verdict.passed, "spare"), (Verdict.passed, "pool"),
                        (Verdict.aborted, "pool")):
        back = await acts.return_machine(kback(cluster, run, verdict, p.prior_state, to))
        assert marker(kube) == (True, None, []) and not back.spare, back.detail
    assert await SparePool(ledger.pool).list(cluster) == []
