"""Issue 27 item 2: Kubernetes node conditions are not an unauthenticated repair intake.

Anyone who may patch ``nodes/status`` (cluster-wide in ``system:node-problem-detector``)
could set ``KernelDeadlock=True`` on gpu-02 and get an actionable reboot. Now a condition
is observed only unless the node's own agent (a per-node identity at ingest) reported the
same fault family within ``clusters[].kubernetes.confirm_window_s``, or the cluster opts
the condition type in (``clusters[].kubernetes.actionable_conditions``).

Real parts: kmock + the real ``kubernetes_asyncio`` client, the real ``Ingestor`` and the
ledger on embedded PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from activities.ledger import Ledger
from ingest.otlp import make_fault_request
from ingest.pipeline import Ingestor
from tests.fixtures.kube import NODES, KubeApi
from workers.watchers.kube import KubeWatcher
from workflows.config import AutorepairConfig
from workflows.models import Action, Alert

HUNG = "INFO: task python:4242 blocked for more than 120 seconds."


class LedgerSink:
    """Records every alert in the ledger (what the NodeWorkflow's first activity does)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)
        await self.ledger.record_alert(alert)


def _config(**kube: Any) -> AutorepairConfig:
    return AutorepairConfig.model_validate({"clusters": [{
        "name": "k1", "scheduler": "kubernetes", "kubernetes": kube,
        "nodes": [{"name": "gpu-01"}, {"name": "gpu-02"}]}]})


def _deadlock(kube: KubeApi, node: str, ctype: str = "KernelDeadlock") -> None:
    t = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    kube.server.objects[NODES, None, node].patch({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": t},
        {"type": ctype, "status": "True", "reason": "DockerHung", "message": HUNG,
         "lastTransitionTime": t}]}})


async def test_condition_alone_is_observed_until_the_node_agent_confirms(
    kube_api: KubeApi, ledger_pool: Any
) -> None:
    cfg = _config()
    ledger = Ledger(ledger_pool)
    sink = LedgerSink(ledger)
    for n in ("gpu-01", "gpu-02"):
        kube_api.add_node(n)
    w = KubeWatcher(cfg, cfg.clusters[0], sink, kube_api.api_client,
                    confirm=ledger.node_bound_alert)
    _deadlock(kube_api, "gpu-02")
    (cond,) = await w.scan_once()
    assert cond.kind == "hung_task" and cond.active
    assert not cond.actionable and cond.action == Action.none
    assert cond.evidence["confirmation"] == "unconfirmed"

    # a collector (or an unauthenticated sender) reporting the same fault confirms nothing
    ing = Ingestor(cfg, alert_sink=sink)
    push = make_fault_request("k1", "gpu-02", kind="hung_task", body=HUNG)
    await ing.handle_logs(push, "http", reporter="collector")
    await ing.handle_logs(push, "http")
    assert [a.evidence["reported_by"] for a in sink.alerts[-2:]] == [
        "collector", "unauthenticated"]
    # nor does a sender that writes the stamp itself (ingest overwrites it)
    forged = make_fault_request("k1", "gpu-02", kind="hung_task", body=HUNG + " (2)",
                                evidence={"reported_by": "node"})
    await ing.handle_logs(forged, "http", reporter="collector")
    assert sink.alerts[-1].evidence["reported_by"] == "collector"
    assert await w.scan_once() == []  # still the same observed alert

    # the node's own agent (per-node identity) reports the hung task: confirmed
    own = make_fault_request("k1", "gpu-02", kind="hung_task", body=HUNG + " (own)")
    await ing.handle_logs(own, "grpc", reporter="node")
    agent_alert = sink.alerts[-1]
    (confirmed,) = await w.scan_once()
    assert confirmed.actionable and confirmed.action == Action.reboot
    assert confirmed.evidence["confirmation"] == "agent"
    assert confirmed.evidence["confirmed_by"] == agent_alert.alert_id
    assert confirmed.alert_id != cond.alert_id


async def test_condition_opted_in_per_cluster_is_actionable(
    kube_api: KubeApi, ledger_pool: Any
) -> None:
    cfg = _config(actionable_conditions=["ReadonlyFilesystem"])
    sink = LedgerSink(Ledger(ledger_pool))
    kube_api.add_node("gpu-01")
    w = KubeWatcher(cfg, cfg.clusters[0], sink, kube_api.api_client)
    _deadlock(kube_api, "gpu-01", "ReadonlyFilesystem")
    (a,) = await w.scan_once()
    assert a.actionable and a.evidence["confirmation"] == "opted_in"
    # KernelDeadlock is not opted in: observed
    _deadlock(kube_api, "gpu-01", "KernelDeadlock")
    sent = await w.scan_once()
    dead = [x for x in sent if x.kind == "hung_task"]
    assert dead and not dead[0].actionable


def test_actionable_conditions_key_names_bad_values() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"kubernetes\.actionable_conditions: 'Kernel "):
        _config(actionable_conditions=["Kernel Deadlock"])
    assert _config(actionable_conditions=["KernelDeadlock"]).clusters[0].kubernetes \
        .actionable_conditions == ["KernelDeadlock"]
