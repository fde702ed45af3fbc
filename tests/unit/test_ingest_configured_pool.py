"""An alert of a configured node carries its configured pool (``clusters[].nodes[].pool``),
whatever pool (or none) its agent reports, so a pool-scoped maintenance window marks it an
observation: before, the sender's pool decided, the alert was recommended and the planned
work's Xid was repaired once the window ended."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ingest.maintenance_marks import MaintenanceMarks
from ingest.otlp import make_fault_request
from ingest.pipeline import Ingestor
from workflows.config import AutorepairConfig
from workflows.maintenance import IN_MAINTENANCE, MaintenanceWindow
from workflows.models import Alert

NOW = 1_800_000_000.0
T = datetime.fromtimestamp(NOW, UTC)


class Sink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, a: Alert) -> None:
        self.alerts.append(a)


async def _none() -> list[MaintenanceWindow]:
    return []


@pytest.mark.parametrize("reported_pool", [None, "rack-b"])
async def test_pool_window_marks_by_configured_pool(reported_pool: str | None) -> None:
    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c", "gpu_nodes": 1,
        "nodes": [{"name": "gpu-01", "machine": "m-1", "pool": "rack-a"}]}]})
    sink = Sink()
    ing = Ingestor(cfg, alert_sink=sink, clock=lambda: NOW)
    req = make_fault_request("c", "gpu-01", kind="xid", code=79, gpu="0000:3b:00.0",
                             body="NVRM: Xid 79", time_ns=int(NOW * 1e9))
    if reported_pool:
        from ingest.otlp import _kv  # type: ignore[attr-defined]
        req.resource_logs[0].resource.attributes.append(_kv("autorepair.node_pool",
                                                            reported_pool))
    await ing.handle_logs(req, "test")
    (a,) = sink.alerts
    assert a.node_pool == "rack-a"
    w = MaintenanceWindow(window_id="mw-1", cluster="c", scope="pool", pool="rack-a",
                          reason="rack A firmware", created_by="op",
                          starts_at=T - timedelta(minutes=5), ends_at=T + timedelta(hours=1))
    marked = MaintenanceMarks(_none).mark_with(a, [w])
    assert marked.evidence.get(IN_MAINTENANCE) == "mw-1", (a.node_pool, marked.actionable)
