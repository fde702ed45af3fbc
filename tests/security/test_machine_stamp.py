"""Issue 27 item 6: the alert's machine is stamped at ingest from configuration and the
ledger's bindings; a sender's ``host.id`` is evidence only.

gpu-01 reporting ``host.id = m-gpu-02`` used to put its critical alerts on gpu-02's
machine (``alerts.machine_id`` → ``attempt_history`` → ``migrate_gate``). Real
``Ingestor``, the ledger on embedded PostgreSQL and its ``attempt_history``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from activities.ledger import Ledger
from ingest.otlp import make_fault_request
from ingest.pipeline import Ingestor
from workflows.activity_api import AttemptQuery
from workflows.config import AutorepairConfig
from workflows.models import Alert

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


class LedgerSink:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)
        await self.ledger.record_alert(alert)


async def test_host_id_never_reaches_another_machines_gate(ledger_pool: Any) -> None:
    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c1", "nodes": [
        {"name": "gpu-01", "machine": "m-gpu-01"}, {"name": "gpu-02", "machine": "m-gpu-02"},
        {"name": "gpu-03"}]}]})
    ledger = Ledger(ledger_pool)
    sink = LedgerSink(ledger)
    ing = Ingestor(cfg, alert_sink=sink)
    req = make_fault_request("c1", "gpu-01", kind="xid", code=79, gpu="0000:3b:00",
                             body=XID79)
    kv = req.resource_logs[0].resource.attributes.add()
    kv.key, kv.value.string_value = "host.id", "m-gpu-02"
    await ing.handle_logs(req, "http", reporter="node")
    (a,) = sink.alerts
    assert a.machine_id == "m-gpu-01"
    assert a.evidence["reported_host_id"] == "m-gpu-02"
    since = datetime.now(UTC) - timedelta(days=10)
    other = await ledger.attempt_history(AttemptQuery(
        cluster="c1", node="gpu-02", machine_id="m-gpu-02", since=since))
    assert other.critical_alerts == []
    own = await ledger.attempt_history(AttemptQuery(
        cluster="c1", node="gpu-01", machine_id="m-gpu-01", since=since))
    assert [x.alert_id for x in own.critical_alerts] == [a.alert_id]

    # a node without a configured machine: its name (as load_policy does); a migration's
    # ledger binding wins over both
    await ing.handle_logs(make_fault_request("c1", "gpu-03", kind="xid", code=79,
                                             body=XID79 + " (3)"), "http")
    assert sink.alerts[-1].machine_id == "gpu-03"
    ing.inventory.bind("c1", {"gpu-01": "spare-7"})
    await ing.handle_logs(make_fault_request("c1", "gpu-01", kind="xid", code=79,
                                             body=XID79 + " (again)"), "http")
    assert sink.alerts[-1].machine_id == "spare-7"
    # a node outside the configuration: no machine at all, whatever it says
    req = make_fault_request("c1", "sim-01", kind="xid", code=79, body=XID79)
    kv = req.resource_logs[0].resource.attributes.add()
    kv.key, kv.value.string_value = "host.id", "m-gpu-02"
    await ing.handle_logs(req, "http")
    assert sink.alerts[-1].machine_id is None


async def test_service_reads_the_ledger_bindings_into_the_stamp() -> None:
    from ingest.service import IngestService

    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c1", "nodes": [
        {"name": "gpu-01", "machine": "m-gpu-01"}]}]})

    async def bindings() -> dict[str, dict[str, str]]:
        return {"c1": {"gpu-01": "spare-3"}}

    svc = IngestService(cfg, bindings_source=bindings)
    assert svc.ingestor.inventory.machine("c1", "gpu-01") == "m-gpu-01"
    assert await svc.refresh_inventory() is False  # no scheduler lists to read
    assert svc.ingestor.inventory.machine("c1", "gpu-01") == "spare-3"
