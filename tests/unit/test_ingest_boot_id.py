"""The boot an agent's fault was reported from reaches the node entity (I20, the grace
after maintenance; found by a break-test).

The agent sends its boot id only as the OTLP resource attribute ``autorepair.host.boot_id``
(docs/wire-contract.md); the node machine and the repair's recurrence check judge by the
alert's ``evidence["boot_id"]``. Ingest decoded the attribute and never put it on the
alert, so in production every boot rule was dead code. Ingest now stamps it on every
fault alert of the sender (replacing an evidence key of that name the record had);
alerts the control plane raises carry none. The last test takes the alert ingest built
through the node machine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ingest.otlp import ATTR_BOOT_ID, _kv, make_fault_request
from ingest.pipeline import Ingestor
from tests.unit.test_node_machine import known, raised, replies, run, starts
from workflows.config import AutorepairConfig
from workflows.lifecycle import node as nm
from workflows.models import Action, Alert, AlertOutcome, Stage

NOW = 1_800_000_000.0
#: the node in the inventory (a node outside it is observed only)
CONFIG = AutorepairConfig.model_validate(
    {"clusters": [{"name": "c", "nodes": [{"name": "gpu-01", "machine": "m-1"}]}]})


class _Sink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


def _push(node: str, boot: str | None, **kw: Any) -> Any:
    req = make_fault_request("c", node, time_ns=int(NOW * 1e9), **kw)
    if boot is not None:
        req.resource_logs[0].resource.attributes.append(_kv(ATTR_BOOT_ID, boot))
    return req


async def _ingest(req: Any, at: float = NOW) -> Alert:
    sink = _Sink()
    ing = Ingestor(CONFIG, alert_sink=sink, clock=lambda: at)
    await ing.handle_logs(req, "test")
    (a,) = sink.alerts
    return a


def _lost(boot: str | None, evidence: dict[str, Any] | None = None, **kw: Any) -> Any:
    ev = {"level": True, "expected": 4, "found": 3, **(evidence or {})}
    return _push("gpu-01", boot, kind="gpu_lost", body="NVML sees 3", evidence=ev, **kw)


async def test_an_agents_fault_carries_its_boot_id_to_the_node_entity() -> None:
    a = await _ingest(_lost("3c1e-boot-after-the-cycle", active=True))
    assert a.evidence.get("boot_id") == "3c1e-boot-after-the-cycle", sorted(a.evidence)


async def test_the_resource_boot_id_replaces_one_the_record_carries() -> None:
    a = await _ingest(_lost("real-boot", {"boot_id": "forged"}, active=True))
    assert a.evidence["boot_id"] == "real-boot"


async def test_a_push_without_a_boot_id_keeps_the_record_as_it_is() -> None:
    a = await _ingest(_lost(None, active=True))
    assert "boot_id" not in a.evidence


async def test_the_node_tells_the_new_boot_from_the_old_by_what_ingest_stamped() -> None:
    """Through the node machine: a GPU lost on boot b-old is power-cycled; a late report
    of boot b-old received after the success is stale, the same fault reported from the
    boot the power cycle brought (b-new) re-confirms it (I20)."""
    t0 = datetime.fromtimestamp(NOW, UTC)
    first = await _ingest(_lost("b-old", active=True))
    s = known(t0)
    s, _ = run(s, raised(first), t0)
    due = t0 + timedelta(minutes=5)
    s, cmds = run(s, nm.TimerFired(), due)
    (start,) = starts(cmds)
    assert start.action == Action.power_cycle
    assert s.repair is not None and set(s.repair.boots.values()) == {"b-old"}
    end = due + timedelta(minutes=10)
    s, _ = run(s, nm.RepairFinishedEv(repair_id=start.repair_id, stage=Stage.succeeded,
                                      at=end, actions=[Action.power_cycle]), end)
    assert not s.active
    after = end + timedelta(hours=1)  # past the cooldown
    late = await _ingest(_lost("b-old", active=True), after.timestamp())
    s, cmds = run(s, raised(late.model_copy(update={"alert_id": "late"})), after)
    (r,) = replies(cmds)
    assert r.outcome == AlertOutcome.ignored and "b-old" in r.reason, r
    again = await _ingest(_lost("b-new", active=True), after.timestamp())
    s, cmds = run(s, raised(again.model_copy(update={"alert_id": "again"})), after)
    (r,) = replies(cmds)
    assert r.outcome != AlertOutcome.ignored, r
    assert s.active and next(iter(s.active.values())).alert.evidence["boot_id"] == "b-new"
