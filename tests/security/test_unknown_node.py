"""Issue 27 item 0: an alert about a node outside the inventory never becomes a
recommendation, a repair or a notification — ingest's observed-only mark is final in the
``NodeWorkflow`` (``decide_node_action`` used to decide again from the catalogue).

End to end: a real ``Ingestor`` decodes a contract-shaped push and hands its alerts to the
harness's ``NodeWorkflow`` (time-skipping Temporal, real ledger, fake cluster)."""

from __future__ import annotations

from datetime import timedelta

from ingest.otlp import EVENT_STRAGGLER, make_fault_request
from ingest.pipeline import Ingestor
from tests.security.conftest import Harness, HarnessSink
from tests.workflows.conftest import make_alert
from workflows.config import AutorepairConfig, CatalogueConfig
from workflows.models import AlertOutcome
from workflows.policy.node_action import decide_node_action

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


def _ingestor(h: Harness, sink: HarnessSink) -> Ingestor:
    cfg = AutorepairConfig.model_validate({"clusters": [{
        "name": h.cluster.cluster, "nodes": [{"name": "gpu-01"}, {"name": "gpu-02"}]}]})
    return Ingestor(cfg, alert_sink=sink)


async def test_unknown_node_alert_is_final_end_to_end(harness: Harness) -> None:
    h = harness
    sink = HarnessSink(h)
    ing = _ingestor(h, sink)
    c = h.cluster.cluster
    # a simulated Xid 79 (catalogue: power_cycle) for sim-01, outside the inventory
    await ing.handle_logs(make_fault_request(c, "sim-01", kind="xid", code=79,
                                             gpu="0000:3b:00", body=XID79), "http")
    # and a straggler record (would ask for a diagnostic run: a notification)
    await ing.handle_logs(make_fault_request(c, "sim-01", kind="straggler", body="slow",
                                             event=EVENT_STRAGGLER), "http")
    assert [a.evidence.get("inventory") for a in sink.alerts] == ["unknown", "unknown"]
    assert all(not a.actionable for a in sink.alerts)
    assert [d.outcome for d in sink.answers] == [AlertOutcome.ignored] * 2
    assert all("inventory:unknown" in d.reason for d in sink.answers)
    await h.env.sleep(timedelta(hours=2))  # past every persistence window and timer
    assert await h.ledger.list_repairs(cluster=c) == []
    assert [n for n in h.cluster.notifications if n.node == "sim-01"] == []
    assert h.cluster.calls == []

    # the same push for an inventory node still becomes a repair (the path works)
    await ing.handle_logs(make_fault_request(c, "gpu-01", kind="xid", code=79,
                                             gpu="0000:3b:00", body=XID79), "http")
    assert sink.alerts[-1].actionable
    assert sink.answers[-1].outcome in (AlertOutcome.recommended, AlertOutcome.new)


def test_observed_mark_is_final_in_the_decision() -> None:
    """The pure decision: the mark wins over the catalogue, an override and the slow
    kinds' diagnostics (no notification either)."""
    base = make_alert("c", "sim-01", evidence={"inventory": "unknown"})
    d = decide_node_action(base, CatalogueConfig())
    assert not d.actionable and d.rule == "inventory:unknown"
    slow = base.model_copy(update={"kind": "straggler", "code": None})
    assert not decide_node_action(slow, CatalogueConfig()).diagnostic


async def test_repair_api_refuses_a_node_outside_the_inventory(harness: Harness) -> None:
    """The API path: a cluster without ``clusters[].nodes`` whose scheduler lists gpu-01;
    a request for sim-01 is a 422 naming ``node`` and records nothing."""
    import pytest

    from ingest.inventory import NodeInventory
    from workers.repairs.intake import IntakeError, RepairIntake
    from workers.repairs.models import RepairCreate
    from workflows.models import Requester, RequesterKind

    h = harness
    c = h.cluster.cluster
    cfg = AutorepairConfig.model_validate({"temporal": {"task_queue": h.task_queue},
                                           "clusters": [{"name": c}]})
    inv = NodeInventory(cfg.clusters)
    inv.replace(c, ["gpu-01"])
    intake = RepairIntake(cfg, h.ledger, h.client, known=inv.known)
    who = Requester(kind=RequesterKind.user, name="alice")
    with pytest.raises(IntakeError) as ei:
        await intake.create(RepairCreate(node="sim-01", cluster=c, mode="reboot",
                                         request_id="op-1", reason="made up"), who)
    assert ei.value.status == 422 and ei.value.field == "node"
    assert await h.ledger.list_repairs(cluster=c) == []
    ok = await intake.create(RepairCreate(node="gpu-01", cluster=c, mode="reboot",
                                          request_id="op-2", reason="real"), who)
    assert ok.created and ok.repair.node == "gpu-01"
