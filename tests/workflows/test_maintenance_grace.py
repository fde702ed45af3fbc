"""Grace period after maintenance (issue 29 item 1) on the real workflows: a window in
the ledger (embedded PostgreSQL), the ingest marks over the store's windows judged on
receipt time, the node entity on the time-skipping server."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata

from activities.maintenance_store import MaintenanceStore
from ingest.maintenance_marks import MaintenanceMarks
from tests.workflows.conftest import Harness, make_alert
from tests.workflows.test_node import node_status
from workers.fleet_models import NodeInput
from workers.fleet_query import FleetQuery
from workflows.config import AutorepairConfig
from workflows.models import Alert, AlertDelivery, AlertOutcome
from workflows.protocol import workflow_id_node

GRACE_S = 900.0


async def _now(h: Harness) -> datetime:
    return await h.env.get_current_time()


async def _deliver(h: Harness, store: MaintenanceStore, alert: Alert) -> AlertDelivery:
    """The mark ingest gives ``alert`` (received now on the server's clock) over the
    windows the store lists for then, and the harness's delivery."""
    at = await _now(h)
    alert = alert.model_copy(update={"received_at": at, "observed_at": at})
    windows = await store.list(h.cluster.cluster, active_at=at, grace_s=GRACE_S)
    marked = MaintenanceMarks(_nothing, grace_s=GRACE_S).mark_with(alert, windows)
    return await h.deliver(marked)


async def _nothing() -> list[Any]:
    return []


def _lost(h: Harness, node: str, n: str, active: bool = True) -> Alert:
    return make_alert(h.cluster.cluster, node, n, kind="gpu_lost", code=None, gpu=None,
                      level=True, active=active, action="power_cycle",
                      summary="NVML sees 3 of 4 GPUs", evidence={"boot_id": "b0"})


async def _window(h: Harness, node: str, started_ago_s: float, duration_s: float
                  ) -> MaintenanceStore:
    store = MaintenanceStore(h.ledger.pool)
    await store.start(cluster=h.cluster.cluster, scope="nodes", nodes=[node],
                      duration_s=duration_s, reason="planned rack reboot", created_by="ops",
                      now=await _now(h) - timedelta(seconds=started_ago_s))
    return store


async def test_a_fault_cleared_within_the_grace_repairs_nothing(harness: Harness) -> None:
    h = harness
    store = await _window(h, "gpu-14", 3600, 3590)  # ended 10 s ago
    d = await _deliver(h, store, _lost(h, "gpu-14", "r1"))
    assert d.outcome == AlertOutcome.new and d.reason.startswith("held:"), d
    assert "grace period after maintenance window" in d.reason
    st = await node_status(h, "gpu-14")
    assert list(st.held) == ["gpu_lost::"], st.held
    # the fleet's node status (API / MCP `node_status`) says it too
    fq = FleetQuery(AutorepairConfig.model_validate({"clusters": [{
        "name": h.cluster.cluster, "nodes": [{"name": "gpu-14"}]}]}), h.ledger.pool, h.client)
    ns = await fq.node_status(NodeInput(cluster=h.cluster.cluster, node="gpu-14"))
    (fault,) = ns.active_faults
    assert fault.held is not None and fault.held.startswith(
        "grace period after maintenance window"), fault
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, "gpu-14"))
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "held" in meta.current_details
    await h.env.sleep(timedelta(seconds=300))  # persistence (60 s) over, grace not
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-14") == []
    c = await _deliver(h, store, _lost(h, "gpu-14", "c1", active=False))
    assert c.outcome == AlertOutcome.cleared
    await h.env.sleep(timedelta(seconds=GRACE_S + 600))
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-14") == []
    assert h.cluster.power_cycles == 0 and h.cluster.count("cordon") == 0


async def test_a_fault_persisting_past_the_grace_is_repaired(harness: Harness) -> None:
    h = harness
    store = await _window(h, "gpu-15", 3600, 3590)
    d = await _deliver(h, store, _lost(h, "gpu-15", "r1"))
    assert d.outcome == AlertOutcome.new and "held" in d.reason
    await h.env.sleep(timedelta(seconds=GRACE_S - 60))
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-15") == []
    await h.env.sleep(timedelta(seconds=120))  # the grace ended 50 s ago: still raised
    rows = await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-15")
    assert len(rows) == 1, rows


async def test_a_fault_in_the_grace_of_a_boot_made_in_the_window_is_held(
        harness: Harness) -> None:
    """Reported on boot b0 inside the window; the window ends; ten minutes into its
    grace the node reports from boot b1 (it rebooted): held for grace_s from then, so
    an Xid recurring after the window's grace but inside the boot's repairs nothing;
    one after the boot's grace does."""
    h = harness
    store = await _window(h, "gpu-16", 600, 1200)  # ends in 600 s
    inside = await _deliver(h, store, make_alert(h.cluster.cluster, "gpu-16", "in",
                                                 evidence={"boot_id": "b0"}))
    assert inside.outcome != AlertOutcome.recommended and "maintenance" in inside.reason
    await h.env.sleep(timedelta(seconds=600 + 600))
    first = make_alert(h.cluster.cluster, "gpu-16", "x1", evidence={"boot_id": "b1"})
    d1 = await _deliver(h, store, first)
    assert d1.outcome == AlertOutcome.new and "boot b1" in d1.reason, d1
    await h.env.sleep(timedelta(seconds=400))  # the window's grace is over, the boot's not
    d2 = await _deliver(h, store, make_alert(h.cluster.cluster, "gpu-16", "x2",
                                             evidence={"boot_id": "b1"}))
    assert d2.outcome == AlertOutcome.new and "held" in d2.reason, d2
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-16") == []
    await h.env.sleep(timedelta(seconds=GRACE_S))
    d3 = await _deliver(h, store, make_alert(h.cluster.cluster, "gpu-16", "x3",
                                             evidence={"boot_id": "b1"}))
    assert d3.outcome == AlertOutcome.recommended and d3.repair_id, d3


async def test_a_gpu_lost_inside_the_window_is_repaired_after_its_grace(
        harness: Harness) -> None:
    """A GPU that does not come back from the planned reboot: lost inside the window
    (marked ``in_maintenance`` with the window's end), still lost at the end of the grace
    that follows the window, it is repaired then — not before, and not never (the first
    release observed it only and forgot it: an edge-triggered agent sends no second
    raise)."""
    h = harness
    store = await _window(h, "gpu-16", 60, 300)  # ends in 240 s
    d = await _deliver(h, store, _lost(h, "gpu-16", "r1"))
    assert d.outcome == AlertOutcome.new and d.reason.startswith("held:"), d
    assert "raised inside maintenance window" in d.reason
    await h.env.sleep(timedelta(seconds=240 + GRACE_S - 60))
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-16") == []
    await h.env.sleep(timedelta(seconds=120))
    rows = await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-16")
    assert len(rows) == 1 and rows[0]["action"] == "power_cycle", rows


async def test_a_gpu_lost_inside_the_window_and_back_after_it_is_not_repaired(
        harness: Harness) -> None:
    h = harness
    store = await _window(h, "gpu-17", 60, 300)
    await _deliver(h, store, _lost(h, "gpu-17", "r1"))
    await h.env.sleep(timedelta(seconds=300))  # the window ended; the GPU came back
    c = await _deliver(h, store, _lost(h, "gpu-17", "c1", active=False))
    assert c.outcome == AlertOutcome.cleared, c
    await h.env.sleep(timedelta(seconds=GRACE_S + 300))
    assert await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-17") == []
    assert h.cluster.count("cordon") == 0
