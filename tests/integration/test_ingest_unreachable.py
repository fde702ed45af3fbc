"""``node_unreachable``: an agent that stops pushing (real ingest service over OTLP/HTTP,
the Redfish emulator as the BMC, the real ledger for the restart).

* silent past ``ingest.unreachable_after_s`` → one observed (not actionable) level alert;
  a configured node that never pushed is found too;
* the BMC is asked; a healthy host adds nothing; powered off (asked again after
  ``worker.bmc_reprobe_s``) → a ``power_cycle`` alert carrying the BMC's answer;
* the next push clears it (same fault key);
* after an ingest restart the ledger's open alert is re-opened, so the node's first push
  clears it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import sushy

from activities.ledger import Ledger
from activities.power import RedfishMachine
from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from workers.devpeers import RedfishEmulator
from workers.watchers.bmc import redfish_probe
from workflows.config import AutorepairConfig
from workflows.models import Action, Alert
from workflows.protocol import fault_key

PB = {"Content-Type": "application/x-protobuf"}


class Sink:
    def __init__(self, ledger: Ledger | None = None) -> None:
        self.alerts: list[Alert] = []
        self.ledger = ledger

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)
        if self.ledger is not None:
            await self.ledger.record_alert(alert)

    def unreachable(self, **m: Any) -> list[Alert]:
        return [a for a in self.alerts if a.kind == "node_unreachable"
                and all(getattr(a, k) == v for k, v in m.items())]


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def config(emu: RedfishEmulator, secrets: Path) -> AutorepairConfig:
    return AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                   "api_port": 0, "admin_port": 0, "unreachable_after_s": 60},
        "threshold": {"push_interval_s": 10},
        "secrets": {"bmc_credentials_file": str(secrets)},
        "clusters": [{"name": "u", "gpu_nodes": 2, "nodes": [
            {"name": n, "machine": f"m-{n}",
             "bmc": {"address": emu.url, "system_id": emu.systems[n], "verify_tls": False}}
            for n in ("gpu-01", "gpu-02")]}],
    })


async def wait_for(cond: Any, what: str) -> None:
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def power(cfg: AutorepairConfig, node: str, on: bool) -> None:
    m = RedfishMachine(cfg, "u", node, f"m-{node}")
    await m.reset(sushy.RESET_ON if on else sushy.RESET_FORCE_OFF)
    await m.wait_power("On" if on else "Off", "test", 30)


async def test_silent_agent_unreachable_bmc_confirmation_clear_and_restart(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, ledger_pool: Any
) -> None:
    cfg = config(redfish_emulator, bmc_secrets_file)
    ledger = Ledger(ledger_pool)
    sink = Sink(ledger)
    clock = Clock()
    svc = IngestService(cfg, sink, clock=clock, bmc_probe=redfish_probe(cfg),
                        open_alerts=ledger.open_level_alerts)
    await svc.start()
    url = f"http://127.0.0.1:{svc.http_port}"
    try:
        async with httpx.AsyncClient(base_url=url) as c:
            push = make_metrics_request("u", "gpu-01", 0.95).SerializeToString()
            assert (await c.post("/v1/metrics", headers=PB, content=push)).status_code == 200
            clock.t += 30
            await svc.compute_now()
            assert sink.unreachable() == []  # silent 30 s of 60: nothing yet
            assert (await c.post("/v1/metrics", headers=PB, content=push)).status_code == 200
            clock.t += 45  # gpu-01 silent 45 s, gpu-02 (never pushed) 75 s since start
            await svc.compute_now()
            assert [a.node for a in sink.unreachable()] == ["gpu-02"]
            clock.t += 20
            await svc.compute_now()
            raised = sink.unreachable(node="gpu-01")
            assert len(raised) == 1 and raised[0].level and raised[0].active
            assert not raised[0].actionable and raised[0].action == Action.none
            await wait_for(lambda: not svc.ingestor.unreachable._probing, "BMC probes")
            assert not [a for a in sink.unreachable() if a.actionable]  # hosts powered on
            await power(cfg, "gpu-01", on=False)
            try:
                await svc.compute_now()  # not due again yet
                await wait_for(lambda: not svc.ingestor.unreachable._probing, "probes")
                assert not [a for a in sink.unreachable() if a.actionable]
                clock.t += cfg.worker.bmc_reprobe_s
                await svc.compute_now()
                await wait_for(lambda: bool([a for a in sink.unreachable() if a.actionable]),
                               "BMC-confirmed alert")
            finally:
                await power(cfg, "gpu-01", on=True)
            (cycle,) = [a for a in sink.unreachable() if a.actionable]
            assert cycle.node == "gpu-01" and cycle.action == Action.power_cycle
            assert cycle.evidence["bmc"]["power_state"] == "Off"
            assert fault_key(cycle) == fault_key(raised[0])
            # gpu-01 pushes again: the clear
            assert (await c.post("/v1/metrics", headers=PB, content=push)).status_code == 200
            (clear,) = sink.unreachable(node="gpu-01", active=False)
            assert clear.level and fault_key(clear) == fault_key(raised[0])
            # edges sort as they happened, also for a node that pushes once and falls
            # silent again: the node's workflow ignores a raise stamped before its clear
            assert raised[0].observed_at < clear.observed_at
            clock.t += 70
            await svc.compute_now()
            again = [a for a in sink.unreachable(node="gpu-01", active=True)
                     if a.observed_at > clear.observed_at]
            assert len(again) == 1 and again[0].alert_id != raised[0].alert_id
            assert (await c.post("/v1/metrics", headers=PB, content=push)).status_code == 200
            last = sink.unreachable(node="gpu-01", active=False)[-1]
            assert last.observed_at > again[0].observed_at
    finally:
        await svc.stop()
    # ingest restarts while gpu-02 is down; gpu-02 comes back: its first push clears
    sink2 = Sink(ledger)
    svc2 = IngestService(cfg, sink2, clock=clock, open_alerts=ledger.open_level_alerts)
    await svc2.start()
    try:
        await svc2.compute_now()  # reads the ledger's open alerts; raises nothing new
        assert sink2.unreachable() == []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc2.http_port}") as c:
            push2 = make_metrics_request("u", "gpu-02", 0.95).SerializeToString()
            assert (await c.post("/v1/metrics", headers=PB, content=push2)).status_code == 200
        assert [(a.node, a.active) for a in sink2.unreachable()] == [("gpu-02", False)]
        assert await ledger.open_level_alerts("u", "ingest") == []
        assert len(svc2.ingestor.unreachable) == 2
    finally:
        await svc2.stop()
