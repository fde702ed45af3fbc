"""Watchers converge after restarts (real peers: loopback Slurm, kmock, the Redfish
emulator; the real NodeWorkflow on the Temporal dev server; the real ledger).

* a level fault whose condition ended while the watcher was down gets its clear from the
  restarted watcher (re-opened from the ledger); without the ledger nothing would clear it;
* the BMC is asked again during a long NotReady / DOWN episode, so a host that powers off
  mid-episode becomes a ``power_cycle`` with the BMC's evidence;
* Slurm ``DOWN`` / ``NOT_RESPONDING`` + BMC power Off is an actionable ``power_cycle``
  (the Kubernetes rule), ``DOWN`` with a healthy BMC is observed only;
* the watchers' memory (open episodes, BMC checks) is bounded: a node that is healthy
  again or deleted is forgotten.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sushy
from kubernetes_asyncio import client as k8s

from activities.power import RedfishMachine
from ingest.handoff import TemporalAlertSink
from tests.detectors.conftest import Stack, make_config, start_stack
from tests.detectors.test_watchers import DeliveringSink, kube_stack, set_conditions
from workers.devpeers import RedfishEmulator, SlurmCluster
from workers.watchers.bmc import redfish_probe
from workers.watchers.kube import KubeWatcher
from workers.watchers.slurm import SlurmWatcher
from workflows.config import AutorepairConfig, BmcConfig
from workflows.models import Action, Alert, AlertOutcome

__all__ = ["kube_stack"]  # the fixture, re-used from the watcher tests

NOT_READY = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
             "message": "Kubelet stopped posting node status.",
             "lastTransitionTime": "2026-01-05T10:00:00Z"}
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "lastTransitionTime": "2026-01-05T11:00:00Z"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def power(cfg: AutorepairConfig, cluster: str, node: str, on: bool) -> None:
    m = RedfishMachine(cfg, cluster, node, f"m-{node}")
    await m.reset(sushy.RESET_ON if on else sushy.RESET_FORCE_OFF)
    await m.wait_power("On" if on else "Off", "test", 30)


async def test_kube_restart_clears_what_ended_while_down(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    s, kube, w, sink = kube_stack
    c = s.config.clusters[0]
    await power(s.config, s.cluster, "gpu-04", on=False)
    set_conditions(kube, "gpu-04", [NOT_READY])
    try:
        sent = await w.scan_once()
        cycle = [a for a in sent if a.node == "gpu-04" and a.actionable]
        assert cycle and cycle[0].action == Action.power_cycle
        # the worker dies here; meanwhile the host is powered on and the node is Ready
    finally:
        await power(s.config, s.cluster, "gpu-04", on=True)
    set_conditions(kube, "gpu-04", [READY])
    open_before = await s.ledger.open_level_alerts(s.cluster, "kube_watcher")
    assert {a.node for a in open_before} == {"gpu-04"}
    # a watcher that remembers nothing sends no clear: the fault would stay open forever
    amnesiac = KubeWatcher(s.config, c, sink, kube.api_client)
    assert await amnesiac.scan_once() == []
    # the restarted watcher re-opens the ledger's open faults and clears them
    w2 = KubeWatcher(s.config, c, sink, kube.api_client,
                     open_alerts=s.ledger.open_level_alerts)
    cleared = await w2.scan_once()
    assert {(a.node, a.kind, a.active) for a in cleared} == {
        ("gpu-04", "node_not_ready", False)}
    assert all(d.outcome == AlertOutcome.cleared for a, d in sink.results if not a.active)
    assert await s.ledger.open_level_alerts(s.cluster, "kube_watcher") == []
    assert await w2.scan_once() == [] and w2._open == {}
    # the worker restarts again, then the node goes NotReady once more with the API
    # server's clock 2 s behind the watcher's: lastTransitionTime sorts before the clear.
    # The restarted watcher read that clear from the ledger: the raise is stamped after
    # it, so the node's workflow takes it (not "stale") and the ledger reads it open.
    behind = cleared[0].observed_at - timedelta(seconds=2)
    set_conditions(kube, "gpu-04", [
        {**NOT_READY, "lastTransitionTime": behind.strftime("%Y-%m-%dT%H:%M:%SZ")}])
    w3 = KubeWatcher(s.config, c, sink, kube.api_client,
                     open_alerts=s.ledger.last_level_edges)
    (again,) = await w3.scan_once()
    assert again.active and again.observed_at > cleared[0].observed_at, again
    (taken,) = [d for a, d in sink.results if a.alert_id == again.alert_id]
    assert "stale" not in taken.reason, taken  # observed only: "maps to no node action"
    assert [a.alert_id for a in await s.ledger.open_level_alerts(
        s.cluster, "kube_watcher")] == [again.alert_id]
    set_conditions(kube, "gpu-04", [READY])
    assert [(a.active, a.observed_at > again.observed_at)
            for a in await w3.scan_once()] == [(False, True)]
    assert await s.ledger.open_level_alerts(s.cluster, "kube_watcher") == []


async def test_kube_bmc_reprobed_during_long_not_ready_and_memory_bounded(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    s, kube, _, sink = kube_stack
    clock = Clock()
    w = KubeWatcher(s.config, s.config.clusters[0], sink, kube.api_client,
                    bmc_probe=redfish_probe(s.config), clock=clock)
    set_conditions(kube, "gpu-03", [NOT_READY])
    first = await w.scan_once()  # BMC: powered on, healthy → observed only
    assert [(a.node, a.actionable) for a in first] == [("gpu-03", False)]
    await power(s.config, s.cluster, "gpu-03", on=False)
    try:
        assert await w.scan_once() == []  # not due yet
        clock.t += s.config.worker.bmc_reprobe_s
        later = await w.scan_once()
        assert [(a.node, a.actionable, a.action) for a in later] == [
            ("gpu-03", True, Action.power_cycle)]
        assert later[0].evidence["bmc"]["power_state"] == "Off"
        clock.t += s.config.worker.bmc_reprobe_s
        assert await w.scan_once() == []  # confirmed: not asked again
    finally:
        await power(s.config, s.cluster, "gpu-03", on=True)
    assert len(w._bmc) == 1 and len(w._open) == 2
    # the node is deleted from the cluster: its faults are cleared and forgotten
    await k8s.CoreV1Api(kube.api_client).delete_node("gpu-03")
    gone = await w.scan_once()
    assert {(a.node, a.active) for a in gone} == {("gpu-03", False)}
    assert w._open == {} and len(w._bmc) == 0


@pytest.fixture
async def slurm_bmc_stack(slurm_cluster: SlurmCluster, redfish_emulator: RedfishEmulator,
                          bmc_secrets_file: Path, ledger_pool: Any, temporal_dev_env: Any,
                          tokens_file: Path) -> AsyncIterator[Stack]:
    slurm_cluster.reset_nodes()
    cfg = make_config("s-" + uuid.uuid4().hex[:8], slurm_conf=str(slurm_cluster.conf_path))
    for n in cfg.clusters[0].nodes:
        n.bmc = BmcConfig(address=redfish_emulator.url, system_id=redfish_emulator.systems[n.name],
                          verify_tls=False)
    cfg.secrets.bmc_credentials_file = str(bmc_secrets_file)
    try:
        async for st in start_stack(cfg, ledger_pool, temporal_dev_env, tokens_file):
            yield st
    finally:
        slurm_cluster.reset_nodes()


async def _until_power_cycle(w: SlurmWatcher, clock: Clock, slurm_cluster: SlurmCluster,
                             reprobe_s: float) -> Alert:
    """Scan until gpu-03's DOWN episode turns into the power-cycle alert (its BMC now says
    Off), checking on the way that the BMC is not asked again within one episode before
    ``reprobe_s``. Slurm is real: a loaded slurmctld that missed a ping can add
    NOT_RESPONDING (a new episode: asked at once) or, with ReturnToService=2, return the
    node to service on its next registration (the episode ends with a clear). The node is
    then set DOWN again, a new episode, and the scan goes on (at most a few times)."""
    quiet_checked = False
    history: list[list[tuple[str, bool, bool]]] = []
    for _ in range(8):
        before = w._open.get("gpu-03")
        sent = await w.scan_once()
        history.append([(a.node, a.active, a.actionable) for a in sent])
        acts = [a for a in sent if a.actionable]
        if acts:
            assert quiet_checked or before != w._open.get("gpu-03"), history
            return acts[0]
        if before is not None and w._open.get("gpu-03") == before:
            quiet_checked = True  # the same episode, asked < reprobe_s ago: not asked again
            clock.t += reprobe_s
        elif "gpu-03" not in w._open:  # slurmctld returned the node: a new DOWN episode
            slurm_cluster.run("scontrol", "update", "nodename=gpu-03", "state=down",
                              "reason=node unresponsive")
    raise AssertionError(f"no power-cycle alert for gpu-03; scans: {history}")


async def test_slurm_down_with_bmc_off_is_a_power_cycle_and_converges(
    slurm_bmc_stack: Stack, slurm_cluster: SlurmCluster
) -> None:
    s = slurm_bmc_stack
    c = s.config.clusters[0]
    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue))
    clock = Clock()
    w = SlurmWatcher(s.config, c, sink, bmc_probe=redfish_probe(s.config), clock=clock)
    slurm_cluster.run("scontrol", "update", "nodename=gpu-03", "state=down",
                      "reason=node unresponsive")
    first = await w.scan_once()  # DOWN, BMC healthy: observed only
    assert [(a.node, a.actionable) for a in first] == [("gpu-03", False)]
    assert "DOWN" in first[0].evidence["state"]
    await power(s.config, s.cluster, "gpu-03", on=False)
    try:
        cycle = await _until_power_cycle(w, clock, slurm_cluster, s.config.worker.bmc_reprobe_s)
        assert cycle.actionable and cycle.action == Action.power_cycle
        assert cycle.evidence["bmc"]["power_state"] == "Off"
        assert cycle.mnemonic == "SLURM_NODE_DEAD_BMC"
        assert sink.results[-1][1].outcome in (AlertOutcome.new, AlertOutcome.recommended)
    finally:
        await power(s.config, s.cluster, "gpu-03", on=True)
    # the worker dies; the admin resumes the node meanwhile
    try:
        slurm_cluster.run("scontrol", "update", "nodename=gpu-03", "state=resume")
    except RuntimeError as e:
        # ReturnToService=2: a loaded slurmctld that lost and re-heard slurmd's pings has
        # already returned the node to service when it re-registered
        assert "Invalid node state" in str(e), e
    for _ in range(100):  # slurmd answers its next ping (about a second on loopback)
        st = slurm_cluster.run("scontrol", "-o", "show", "node", "gpu-03")
        if not any(f in st.split("State=")[1].split()[0]
                   for f in ("DOWN", "NOT_RESPONDING", "DRAIN")):
            break
        await asyncio.sleep(0.1)
    assert await SlurmWatcher(s.config, c, sink).scan_once() == []  # amnesiac: no clear
    w2 = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.open_level_alerts)
    cleared = await w2.scan_once()
    assert [(a.node, a.active) for a in cleared] == [("gpu-03", False)]
    assert await s.ledger.open_level_alerts(s.cluster, "slurm_watcher") == []
    assert w2._open == {} and w2._dead == {} and len(w2._bmc) == 0


class _Gpu02:
    """gpu-02 as the Slurm edge-order tests drive it. Slurm is real: a loaded slurmctld
    may flag other nodes NOT_RESPONDING meanwhile (not these tests' business), and with
    ReturnToService=2 one that lost and re-heard slurmd's pings returns gpu-02 to service
    by itself when it re-registers."""

    DOWN = ("scontrol", "update", "nodename=gpu-02", "state=down", "reason=flapping psu")

    def __init__(self, s: Stack, slurm_cluster: SlurmCluster) -> None:
        self.s, self.slurm = s, slurm_cluster

    @staticmethod
    def mine(alerts: list[Alert]) -> list[Alert]:
        return [a for a in alerts if a.node == "gpu-02"]

    def down(self) -> None:
        self.slurm.run(*self.DOWN)

    def resume(self) -> None:
        try:
            self.slurm.run("scontrol", "update", "nodename=gpu-02", "state=resume")
        except RuntimeError as e:  # ReturnToService=2 returned it already
            assert "Invalid node state" in str(e), e

    async def still_open(self) -> list[str]:
        return [a.alert_id for a in self.mine(
            await self.s.ledger.open_level_alerts(self.s.cluster, "slurm_watcher"))]


async def test_slurm_down_again_right_after_a_clear_stays_open_in_the_ledger(
    slurm_bmc_stack: Stack, slurm_cluster: SlurmCluster
) -> None:
    """A clear is stamped by the watcher's clock, a raise by Slurm's whole-second reason
    time: a node resumed and marked DOWN again in the same second (or a watcher whose
    clock runs ahead of slurmctld's) must still read as open in the ledger, so a restarted
    watcher re-opens it and sends its clear when it ends."""
    s = slurm_bmc_stack
    c = s.config.clusters[0]
    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue))
    node = _Gpu02(s, slurm_cluster)
    mine = node.mine

    w = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.open_level_alerts)
    node.down()
    assert [(a.node, a.active) for a in mine(await w.scan_once())] == [("gpu-02", True)]
    node.resume()
    ahead = datetime.now(UTC) + timedelta(seconds=5)  # the watcher's clock is 5 s ahead
    cleared = mine(await w.scan_once(now=ahead))
    assert [(a.node, a.active) for a in cleared] == [("gpu-02", False)]
    node.down()  # reason time: slurmctld's clock, before `ahead`
    (again,) = mine(await w.scan_once())
    assert again.active and again.observed_at > cleared[0].observed_at
    assert await node.still_open() == [again.alert_id]
    # a watcher restarted mid-episode re-opens it and sends no new raise: the moved stamp
    # is kept, so the episode keeps its alert_id
    w3 = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.open_level_alerts)
    sent = mine(await w3.scan_once())
    assert [a for a in sent if a.active] == [], sent
    if sent:  # a loaded slurmctld returned the node to service meanwhile (ReturnToService=2)
        assert await node.still_open() == []
        return
    # a restarted watcher re-opens it and clears it once the node is back
    node.resume()
    w2 = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.last_level_edges)
    assert [(a.node, a.active) for a in mine(await w2.scan_once())] == [("gpu-02", False)]
    assert await node.still_open() == []


async def test_slurm_raise_after_a_restart_sorts_after_the_ledgers_last_clear(
    slurm_bmc_stack: Stack, slurm_cluster: SlurmCluster
) -> None:
    """The watcher restarts between a clear and the next DOWN, and its clock runs 5 s
    ahead of slurmctld's: the new DOWN's reason time is before the clear. The restarted
    watcher read that clear from the ledger (``last_level_edges``), so the raise is
    stamped after it, the node's workflow does not answer it "stale", and the ledger
    reads the episode open. Without the floor the raise sorted before the clear."""
    s = slurm_bmc_stack
    c = s.config.clusters[0]
    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue))
    node = _Gpu02(s, slurm_cluster)

    async def raise_down(w: SlurmWatcher) -> Alert:
        for _ in range(3):  # a loaded slurmctld may return the node at once: DOWN again
            node.down()
            raised = [a for a in node.mine(await w.scan_once()) if a.active]
            if raised:
                return raised[0]
        raise AssertionError("gpu-02 never stayed DOWN for one scan")

    w = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.last_level_edges)
    first = await raise_down(w)
    node.resume()
    (clear,) = node.mine(await w.scan_once(now=datetime.now(UTC) + timedelta(seconds=5)))
    assert not clear.active and clear.observed_at > first.observed_at
    assert await node.still_open() == []
    restarted = SlurmWatcher(s.config, c, sink, open_alerts=s.ledger.last_level_edges)
    again = await raise_down(restarted)
    assert again.observed_at > clear.observed_at and again.alert_id != first.alert_id
    reasons = [d.reason for a, d in sink.results if a.alert_id == again.alert_id]
    assert reasons and not any("stale" in r for r in reasons), reasons
    assert await node.still_open() == [again.alert_id]
    node.resume()
