"""Cluster watchers against real peers: Slurm (loopback slurmctld/slurmd), Kubernetes
(kmock + kubernetes_asyncio), Redfish (sushy-tools emulator); alerts delivered to the
real NodeWorkflow on the Temporal dev server; annotation requests through the real intake
and ledger."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ingest.handoff import TemporalAlertSink
from tests.detectors.conftest import NODES, Stack, make_config, start_stack
from workers.devpeers import RedfishEmulator, SlurmCluster
from workers.repairs.models import RepairCreate
from workers.watchers.bmc import redfish_probe
from workers.watchers.kube import (
    REQUEST_ANNOTATION,
    REQUEST_LABEL,
    RESULT_ANNOTATION,
    KubeWatcher,
)
from workers.watchers.slurm import SlurmWatcher
from workflows.config import BmcConfig
from workflows.models import Action, Alert, AlertDelivery, AlertOutcome, Requester, RequesterKind


class DeliveringSink:
    """Delivers each alert at once through ``TemporalAlertSink.deliver`` (update-with-start
    on the real NodeWorkflow) and keeps the workflow's answers."""

    def __init__(self, inner: TemporalAlertSink) -> None:
        self.inner = inner
        self.results: list[tuple[Alert, AlertDelivery]] = []

    async def submit(self, alert: Alert) -> None:
        self.results.append((alert, await self.inner.deliver(alert)))


# ------------------------------------------------------------------------- Slurm
@pytest.fixture
async def slurm_stack(slurm_cluster: SlurmCluster, ledger_pool: Any, temporal_dev_env: Any,
                      tokens_file: Path) -> AsyncIterator[Stack]:
    slurm_cluster.reset_nodes()
    cfg = make_config("s-" + uuid.uuid4().hex[:8], slurm_conf=str(slurm_cluster.conf_path))
    async for s in start_stack(cfg, ledger_pool, temporal_dev_env, tokens_file):
        yield s
    slurm_cluster.reset_nodes()


async def test_slurm_admin_drain_is_observed_not_repaired(
    slurm_stack: Stack, slurm_cluster: SlurmCluster
) -> None:
    s = slurm_stack
    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue))
    w = SlurmWatcher(s.config, s.config.clusters[0], sink)
    assert await w.scan_once() == []  # a healthy cluster says nothing
    slurm_cluster.run("scontrol", "update", "nodename=gpu-02", "state=drain",
                      "reason=Kill task failed")
    slurm_cluster.run("scontrol", "update", "nodename=gpu-03", "state=drain",
                      "reason=autorepair:req-0000 cordon for reboot")  # our own cordon
    sent = await w.scan_once()
    assert [a.node for a in sent] == ["gpu-02"]
    a = sent[0]
    assert a.kind == "slurm_node" and a.active and not a.actionable
    assert a.action == Action.none and a.source == "slurm_watcher"
    assert a.evidence["reason"] == "Kill task failed"
    assert "DRAIN" in a.evidence["state"] and a.evidence["reason_user"]
    assert sink.results[-1][1].outcome not in (AlertOutcome.recommended,)
    assert sink.results[-1][1].repair_id is None
    assert await w.scan_once() == []  # no re-delivery while nothing changes
    # a restarted watcher re-reads the same episode: same alert id, de-duplicated
    w2 = SlurmWatcher(s.config, s.config.clusters[0], sink)
    again = await w2.scan_once()
    assert [x.alert_id for x in again] == [a.alert_id]
    assert sink.results[-1][1].outcome == AlertOutcome.deduplicated
    # the admin resumes the node: a clear follows
    slurm_cluster.run("scontrol", "update", "nodename=gpu-02", "state=resume")
    cleared = await w2.scan_once()
    assert [(x.node, x.active) for x in cleared] == [("gpu-02", False)], [
        (x.evidence_text) for x in cleared]
    assert await s.ledger.list_repairs(cluster=s.cluster) == []


# -------------------------------------------------------------------- Kubernetes
@pytest.fixture
async def kube_stack(kube_api: Any, redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
                     ledger_pool: Any, temporal_dev_env: Any, tokens_file: Path
                     ) -> AsyncIterator[tuple[Stack, Any, KubeWatcher, DeliveringSink]]:
    cfg = make_config("k-" + uuid.uuid4().hex[:8], detector_cap=1, scheduler="kubernetes",
                      detectors={"allowed": {"dcgm-scanner": {"cap": 2}}})
    c = cfg.clusters[0]
    for n in c.nodes:
        n.bmc = BmcConfig(address=redfish_emulator.url, system_id=redfish_emulator.systems[n.name],
                          verify_tls=False)
    cfg.secrets.bmc_credentials_file = str(bmc_secrets_file)
    for n in NODES:
        kube_api.add_node(n)
    async for s in start_stack(cfg, ledger_pool, temporal_dev_env, tokens_file):
        sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue))
        w = KubeWatcher(cfg, c, sink, kube_api.api_client, intake=s.intake,
                        bmc_probe=redfish_probe(cfg))
        yield s, kube_api, w, sink


def request(kube_api: Any, node: str, mode: str, request_id: str,
            detector: str = "dcgm-scanner") -> None:
    doc = {"detector": detector, "request_id": request_id, "mode": mode,
           "detected_at": "2026-01-05T10:00:00Z", "reason": "DCGM diag r3 failed on GPU 3"}
    kube_api.server.objects[kmock_nodes(), None, node].patch(
        {"metadata": {"labels": {REQUEST_LABEL: "true"},
                      "annotations": {REQUEST_ANNOTATION: json.dumps(doc)}}})


def kmock_nodes() -> Any:
    from tests.fixtures.kube import NODES as RES

    return RES


def result(kube_api: Any, node: str) -> dict[str, Any]:
    meta = kube_api.node(node)["metadata"]
    assert REQUEST_LABEL not in (meta.get("labels") or {}), "label not removed"
    return dict(json.loads(meta["annotations"][RESULT_ANNOTATION]))


async def test_annotation_exactly_one_repair_cap_and_remove(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    s, kube, w, _ = kube_stack
    request(kube, "gpu-01", "reboot", "r-1")
    await w.scan_once()
    r1 = result(kube, "gpu-01")
    assert r1["request_id"] == "r-1" and not r1["refused"] and r1["repair_id"]
    row = await s.ledger.get_repair(r1["repair_id"])
    assert row is not None
    assert (row["requester_kind"], row["requester_name"]) == ("detector", "dcgm-scanner")
    # re-asserted on every scan: still the one repair
    for _ in range(3):
        request(kube, "gpu-01", "reboot", "r-1")
        await w.scan_once()
        assert result(kube, "gpu-01")["repair_id"] == r1["repair_id"]
    # detector requests skip approval (they go straight for the guard lease)
    for _ in range(100):
        live = await s.intake.get(r1["repair_id"])
        if live.live is not None and live.live.stage.value == "cordoning":
            break
        await asyncio.sleep(0.1)
    assert live.live is not None and "detector_request" in (live.live.decided_by_rule or "")
    assert live.live.approved_by == "auto-approved"
    assert "awaiting_approval" not in [t.stage for t in live.transitions]
    # cap (1) reached: the next detector request is refused, with the reason recorded
    request(kube, "gpu-02", "reboot", "r-2")
    await w.scan_once()
    r2 = result(kube, "gpu-02")
    assert r2["refused"] and "detector cap" in r2["reason"]
    row2 = await s.ledger.get_repair(r2["repair_id"])
    assert row2 is not None and row2["stage"] == "rejected"
    assert "detector_cap=1" in row2["transitions"][-1]["reason"]
    # remove is human-only
    request(kube, "gpu-03", "remove", "r-3")
    await w.scan_once()
    r3 = result(kube, "gpu-03")
    assert r3["refused"] and "human-only" in r3["reason"]
    # a malformed request is answered, not retried forever
    kube.server.objects[kmock_nodes(), None, "gpu-04"].patch(
        {"metadata": {"labels": {REQUEST_LABEL: "true"},
                      "annotations": {REQUEST_ANNOTATION: '{"detector": "x", "mode": "nuke"}'}}})
    await w.scan_once()
    assert "mode" in result(kube, "gpu-04")["error"]
    # a finished repair (the refused one is terminal) keeps its key: re-asserting it
    # maps to the same record and opens nothing new, even with the cap free again
    for _ in range(2):
        request(kube, "gpu-02", "reboot", "r-2")
        await w.scan_once()
        again = result(kube, "gpu-02")
        assert again["repair_id"] == r2["repair_id"] and again["stage"] == "rejected"
    rows = await s.ledger.list_repairs(cluster=s.cluster)
    assert sorted(r["node"] for r in rows) == ["gpu-01", "gpu-02", "gpu-03"]


async def test_annotation_from_a_detector_not_allowed_is_observed_only(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    """Whoever holds nodes/patch (here: a kubelet writing on its own Node, naming itself)
    opens no repair: the request becomes an observed alert for an operator."""
    s, kube, w, _ = kube_stack
    for _ in range(2):  # re-asserted: the same observation, nothing new
        request(kube, "gpu-02", "reboot", "k-1", detector="kubelet")
        await w.scan_once()
        r = result(kube, "gpu-02")
        assert r["observed"] and r["refused"] and r["repair_id"] is None
        assert "detectors.allowed" in r["reason"] and r["alert_id"] in r["reason"]
    assert await s.ledger.list_repairs(cluster=s.cluster) == []
    (alert,) = [a for a in await s.ledger.list_alerts(cluster=s.cluster, node="gpu-02",
                                                      limit=10)
                if a.alert_id == r["alert_id"]]
    assert not alert.actionable and alert.action == Action.none
    assert alert.evidence["requested_action"] == "reboot"
    assert alert.evidence["detector"] == "kubelet"
    # an operator acts on it: a person's repair citing the observed alert
    made = await s.intake.create(
        RepairCreate(node="gpu-02", request_id="op-k-1", mode="reboot", reason="checked",
                     evidence_alert=alert.alert_id),
        Requester(kind=RequesterKind.user, name="alice"))
    assert not made.refused and alert.alert_id in made.repair.alert_ids
    # the allowed detector still opens its repair the usual way
    request(kube, "gpu-03", "reboot", "d-1")
    await w.scan_once()
    assert not result(kube, "gpu-03")["refused"]


def set_conditions(kube: Any, node: str, conds: list[dict[str, Any]]) -> None:
    kube.server.objects[kmock_nodes(), None, node].patch({"status": {"conditions": conds}})


async def test_not_ready_needs_bmc_evidence_and_npd_conditions(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    import sushy

    from activities.power import RedfishMachine

    s, kube, w, sink = kube_stack
    t = "2026-01-05T10:00:00Z"
    not_ready = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status.", "lastTransitionTime": t}
    # gpu-03: NotReady, BMC says powered on and healthy → observed, no repair
    set_conditions(kube, "gpu-03", [not_ready])
    # gpu-04: NotReady and the BMC reports the host powered off → power-cycle evidence
    bmc4 = RedfishMachine(s.config, s.cluster, "gpu-04", "m-gpu-04")
    await bmc4.reset(sushy.RESET_FORCE_OFF)
    await bmc4.wait_power("Off", "test", 30)
    set_conditions(kube, "gpu-04", [not_ready])
    # gpu-02: node-problem-detector KernelDeadlock
    set_conditions(kube, "gpu-02", [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": t},
        {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
         "message": "task docker:7 blocked for more than 120 seconds.",
         "lastTransitionTime": t},
    ])
    try:
        sent = await w.scan_once()
    finally:
        await RedfishMachine(s.config, s.cluster, "gpu-04", "m-gpu-04").reset(sushy.RESET_ON)
    by = {(a.node, a.kind, a.actionable): a for a in sent}
    assert set(by) == {("gpu-03", "node_not_ready", False), ("gpu-04", "node_not_ready", False),
                       ("gpu-04", "node_not_ready", True), ("gpu-02", "hung_task", False)}
    cycle = by[("gpu-04", "node_not_ready", True)]
    assert cycle.action == Action.power_cycle and cycle.evidence["bmc"]["power_state"] == "Off"
    assert by[("gpu-03", "node_not_ready", False)].action == Action.none
    # a condition alone is observed: nothing confirms it (issue 27 item 2)
    deadlock = by[("gpu-02", "hung_task", False)]
    assert deadlock.evidence["condition"] == "KernelDeadlock"
    assert deadlock.evidence["confirmation"] == "unconfirmed"
    outcomes = {(a.node, a.actionable): d for a, d in sink.results}
    assert outcomes[("gpu-03", False)].repair_id is None
    # nothing changes → nothing re-sent; a restarted watcher de-duplicates by alert id
    assert await w.scan_once() == []
    w2 = KubeWatcher(s.config, s.config.clusters[0], sink, w.api.api_client, intake=s.intake)
    again = await w2.scan_once()
    assert {a.alert_id for a in again} <= {a.alert_id for a in sent}
    # back to Ready: clears
    set_conditions(kube, "gpu-03", [{"type": "Ready", "status": "True",
                                     "reason": "KubeletReady", "lastTransitionTime": t}])
    cleared = await w.scan_once()
    assert ("gpu-03", False) in {(a.node, a.active) for a in cleared}
    rows = await s.ledger.list_repairs(cluster=s.cluster, node="gpu-03")
    assert rows == []


async def test_slurm_maint_reservation_is_a_maintenance_window(
    slurm_stack: Stack, slurm_cluster: SlurmCluster
) -> None:
    """Issue 29: a ``Flags=MAINT`` reservation on the loopback cluster becomes a window in
    the ledger (the delivery path's marks read it: a drain inside it is recorded with
    ``in_maintenance``); the project's own validation reservation does not; deleting the
    reservation ends the window."""
    from activities.maintenance_store import MaintenanceStore
    from ingest.maintenance_marks import MaintenanceMarks

    s = slurm_stack
    store = MaintenanceStore(s.ledger.pool)
    cl = s.config.clusters[0]

    async def sync(cluster: str, source: str, windows: list[Any], now: Any) -> None:
        await store.sync(cluster, source, windows, now)

    async def load() -> list[Any]:
        from datetime import UTC, datetime
        return await store.list(cl.name, active_at=datetime.now(UTC))

    marks = MaintenanceMarks(load, refresh_s=0.001)
    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue,
                                            maintenance=marks))
    w = SlurmWatcher(s.config, cl, sink, maintenance=sync)
    res = "rack-a-" + uuid.uuid4().hex[:6]
    own = f"{cl.validation.reservation_prefix}-{uuid.uuid4().hex[:6]}"
    slurm_cluster.run("scontrol", "create", "reservation", f"ReservationName={res}",
                      "Nodes=gpu-01,gpu-02", "StartTime=now", "Duration=60", "Users=root",
                      "Flags=MAINT")
    slurm_cluster.run("scontrol", "create", "reservation", f"ReservationName={own}",
                      "Nodes=gpu-04", "StartTime=now", "Duration=60", "Users=root",
                      "Flags=MAINT")
    try:
        await w.scan_once()
        open_ws = await load()
        assert [x.window_id for x in open_ws] == [f"slurm:{cl.name}:{res}"]
        assert open_ws[0].nodes == ["gpu-01", "gpu-02"] and open_ws[0].source == "slurm"
        slurm_cluster.run("scontrol", "update", "nodename=gpu-02", "state=drain",
                          "reason=rack maintenance")
        sent = await w.scan_once()
        assert [a.node for a in sent] == ["gpu-02"]
        answer = sink.results[-1][1]
        assert answer.repair_id is None and "maintenance" in answer.reason, answer
        assert marks.marked == 1
        slurm_cluster.run("scontrol", "delete", f"ReservationName={res}")
        await w.scan_once()
        assert await load() == []
        ended = await store.get(f"slurm:{cl.name}:{res}")
        assert ended is not None and ended.ended_at is not None and ended.ended_by == "slurm"
    finally:
        for r in (res, own):
            slurm_cluster.run("scontrol", "delete", f"ReservationName={r}", check=False)


async def test_kube_maintenance_annotation_pauses_that_node_only(
    kube_stack: tuple[Stack, Any, KubeWatcher, DeliveringSink]
) -> None:
    """Issue 29: a node annotated ``autorepair.io/maintenance`` (value: the reason) is a
    window, bounded by ``policy.maintenance.max_s``; its NotReady-with-BMC-off alert, which
    would power-cycle, is delivered marked and repairs nothing; removing the annotation
    ends the window."""
    from datetime import UTC, datetime, timedelta

    import sushy

    from activities.maintenance_store import MaintenanceStore
    from activities.power import RedfishMachine
    from ingest.maintenance_marks import MaintenanceMarks
    from workflows.maintenance import MAINTENANCE_ANNOTATION

    s, kube, w0, _ = kube_stack
    store = MaintenanceStore(s.ledger.pool)

    async def load() -> list[Any]:
        return await store.list(s.cluster, active_at=datetime.now(UTC))

    marks = MaintenanceMarks(load, refresh_s=3600)

    async def sync(cluster: str, source: str, windows: list[Any], now: Any) -> None:
        await store.sync(cluster, source, windows, now)
        await marks.refresh(force=True)

    sink = DeliveringSink(TemporalAlertSink(s.env.client, s.config.temporal.task_queue,
                                            maintenance=marks))
    w = KubeWatcher(s.config, s.config.clusters[0], sink, w0.api.api_client, intake=s.intake,
                    bmc_probe=w0.bmc_probe, maintenance=sync)
    kube.server.objects[kmock_nodes(), None, "gpu-04"].patch(
        {"metadata": {"annotations": {MAINTENANCE_ANNOTATION: "PSU swap, ticket OPS-7"}}})
    bmc4 = RedfishMachine(s.config, s.cluster, "gpu-04", "m-gpu-04")
    await bmc4.reset(sushy.RESET_FORCE_OFF)
    await bmc4.wait_power("Off", "test", 30)
    set_conditions(kube, "gpu-04", [{"type": "Ready", "status": "Unknown",
                                     "reason": "NodeStatusUnknown", "message": "stopped",
                                     "lastTransitionTime": "2026-01-05T10:00:00Z"}])
    try:
        sent = await w.scan_once()
    finally:
        await RedfishMachine(s.config, s.cluster, "gpu-04", "m-gpu-04").reset(sushy.RESET_ON)
    ws = await load()
    assert [x.window_id for x in ws] == [f"k8s:{s.cluster}:gpu-04"]
    assert ws[0].reason == "node annotation: PSU swap, ticket OPS-7"
    assert ws[0].ends_at - ws[0].starts_at == timedelta(
        seconds=s.config.policy.maintenance.max_s)
    assert any(a.node == "gpu-04" and a.actionable for a in sent)  # would power-cycle
    assert all(d.repair_id is None for _, d in sink.results), sink.results
    assert marks.marked >= 1
    assert await s.ledger.list_repairs(cluster=s.cluster, node="gpu-04") == []
    # the annotation removed: the window ends
    kube.server.objects[kmock_nodes(), None, "gpu-04"].patch(
        {"metadata": {"annotations": {MAINTENANCE_ANNOTATION: None}}})
    await w.scan_once()
    assert await load() == []
