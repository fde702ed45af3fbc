"""Agent → real receivers.

* the project's ingest service (``ingest.service.IngestService``, real OTLP/HTTP and gRPC
  receivers and threshold engine): fleet → cached → local tiers when ingest is killed,
  back to fleet when it returns; gRPC metadata;
* a small real OTLP/HTTP server (uvicorn + starlette, protobuf parsed with the
  opentelemetry-proto classes) that records every request, to check the exact wire
  attributes of fault / straggler records, invalid thresholds and the bounded retry queue.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.config import AgentConfig, PushConfig, ScoreConfig, TierConfig
from agent.nvml import SimulatedBackend
from agent.runner import Agent
from agent.simulator import FleetSimulator, InjectedKernelLog

try:
    from agent.readers import KernelLogReader
except ImportError:  # the readers package's __init__ may land later
    from agent.readers.kernel import KernelLogReader

FAST_PUSH = PushConfig(backoff_base_s=0.05, backoff_cap_s=0.3, timeout_s=2.0)


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        v = getattr(kv.value, which) if which else None
        if which == "array_value":
            v = [getattr(x, x.WhichOneof("value")) for x in v.values]
        out[kv.key] = v
    return out


@dataclass
class Recorder:
    """Real OTLP/HTTP server state: what it received and what it answers."""

    threshold: str | None = "0.9"
    quorum: str = "true"
    status: int = 200
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    logs: list[tuple[dict[str, Any], dict[str, Any], str]] = field(default_factory=list)
    #: ``Authorization`` header of every metrics request ("" when none was sent).
    auth: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        async def metrics(request: Request) -> Response:
            self.auth.append(request.headers.get("authorization", ""))
            req = ExportMetricsServiceRequest.FromString(await request.body())
            assert request.headers["content-type"] == "application/x-protobuf"
            if self.status == 200:
                self.metrics.append(req)
            return self._reply()

        async def logs(request: Request) -> Response:
            req = ExportLogsServiceRequest.FromString(await request.body())
            if self.status == 200:
                for rl in req.resource_logs:
                    res = _attrs(rl.resource.attributes)
                    for sl in rl.scope_logs:
                        for rec in sl.log_records:
                            self.logs.append((res, _attrs(rec.attributes),
                                              rec.body.string_value))
            return self._reply()

        return Starlette(routes=[Route("/v1/metrics", metrics, methods=["POST"]),
                                 Route("/v1/logs", logs, methods=["POST"])])

    def _reply(self) -> Response:
        headers = {}
        if self.threshold is not None:
            headers = {"X-Autorepair-Threshold": self.threshold,
                       "X-Autorepair-Quorum-Met": self.quorum}
        return Response(b"", status_code=self.status, headers=headers,
                        media_type="application/x-protobuf")

    def gauges(self, name: str) -> list[tuple[float, dict[str, Any]]]:
        out = []
        for req in self.metrics:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            for dp in m.gauge.data_points:
                                out.append((dp.as_double, _attrs(dp.attributes)))
        return out


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(rec.app(), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_for(lambda: server.started, 10, "recorder server")
    yield rec, f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


async def wait_for(cond: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def make_agent(endpoint: str, tmp: Path, node: str = "gpu-01", **kw: Any) -> tuple[
        Agent, SimulatedBackend, InjectedKernelLog]:
    cfg = AgentConfig(
        endpoint=endpoint, cluster="it", node=node, backend="simulated",
        push_interval_s=0.2, sample_interval_s=0.1, expected_gpus=4, state_dir=str(tmp),
        kernel_log="none", workload_type="training", push=kw.pop("push", FAST_PUSH),
        score=ScoreConfig(calibration_samples=3), **kw,
    )
    backend = SimulatedBackend(gpu_count=4, seed=7)
    kernel = InjectedKernelLog(KernelLogReader)
    agent = Agent(cfg, backend, kernel=kernel, cpu=lambda: 0.98, memory=lambda: 0.5,
                  boot_id="boot-1", host_id="machine-1", seed=1)
    return agent, backend, kernel


async def test_fault_straggler_records_and_threshold_headers(
    recorder: tuple[Recorder, str], tmp_path: Path
) -> None:
    rec, url = recorder
    rec.threshold = "0.9"
    agent, backend, kernel = make_agent(url, tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: agent.mode == "fleet" and agent.threshold == 0.9, 5, "fleet")
        # resource + metric names of docs/design.md §4.3
        res = _attrs(rec.metrics[-1].resource_metrics[0].resource.attributes)
        assert res == {"host.name": "gpu-01", "host.id": "machine-1",
                       "autorepair.host.boot_id": "boot-1", "autorepair.cluster.id": "it",
                       "autorepair.workload_type": "training"}
        await wait_for(lambda: any(a.get("autorepair.node.state") == "active"
                                   for _, a in rec.gauges("autorepair.node.health_score")),
                       5, "active score")
        for name in ("throughput_ratio", "compute_efficiency", "memory_headroom",
                     "cpu_availability"):
            assert rec.gauges(f"autorepair.node.{name}")
        mode = rec.gauges("autorepair.agent.detection_mode")[-1]
        assert mode == (3.0, {"autorepair.agent.detection_mode": "fleet"})

        # a real kernel line → fault record with the raw text as body
        line = "[74889.644138] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
        kernel.push(line)
        backend.faults.ecc_uncorrectable = 3
        # (the agent's start-up clears of its level signals come first, I20: only
        # raises are looked at here)
        def raised() -> list[tuple[Any, Any]]:
            return [(a, body) for _, a, body in rec.logs
                    if a.get("event.name") == "autorepair.fault"
                    and a.get("autorepair.fault.active") is True]

        await wait_for(lambda: len(raised()) >= 2, 5, "fault records")
        faults = {a["autorepair.fault.kind"]: (a, body) for a, body in raised()}
        a, body = faults["xid"]
        assert body == line
        assert a["autorepair.fault.code"] == 79 and a["autorepair.gpu.pci"] == "0000:18:00"
        assert a["autorepair.fault.active"] is True
        a, body = faults["nvsmi"]
        assert a["autorepair.fault.dram_uncorrectable"] == 3 and "ECC" in body
        backend.faults.ecc_uncorrectable = 0  # the level fault clears
        await wait_for(lambda: any(x[1].get("autorepair.fault.kind") == "nvsmi"
                                   and x[1]["autorepair.fault.active"] is False
                                   for x in rec.logs), 5, "nvsmi clear")

        # straggler start/end with hysteresis
        backend.faults.slow_factor = 0.5
        await wait_for(lambda: any(x[1].get("autorepair.straggler.active") is True
                                   for x in rec.logs), 10, "straggler start")
        backend.faults.slow_factor = 1.0
        await wait_for(lambda: any(x[1].get("autorepair.straggler.active") is False
                                   for x in rec.logs), 10, "straggler end")

        # an invalid threshold is counted and the cached one kept
        rec.threshold = "1.5"
        await wait_for(lambda: agent.tracker.invalid_count >= 1, 5, "invalid threshold")
        assert agent.tracker.threshold == 0.9

        # transient NVML outage: no score point, no fault, state kept
        faults_before = agent.faults_emitted
        backend.faults.fail_reads = 3
        await wait_for(lambda: agent.sample_errors >= 3, 5, "outage")
        assert agent.faults_emitted == faults_before
        assert all(v > 0.5 for v, _ in rec.gauges("autorepair.node.health_score")[-3:])

        # ingest answers 503: bounded queue, oldest dropped and counted; then recovers
        agent.pusher.max_metric_batches = 3
        rec.status = 503
        await wait_for(lambda: agent.pusher.stats.metrics_dropped >= 2, 10, "drops")
        assert agent.pusher.pending[0] <= 3
        rec.status = 200
        rec.threshold = "0.9"
        await wait_for(lambda: agent.pusher.pending == (0, 0), 10, "queue drained")
    finally:
        stop.set()
        await task
    assert (tmp_path / "agent-state.json").exists()


async def test_restart_keeps_baseline(recorder: tuple[Recorder, str], tmp_path: Path) -> None:
    _, url = recorder
    agent, _, _ = make_agent(url, tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await wait_for(lambda: agent.scorer.state == "active", 5, "active")
    stop.set()
    await task
    again, _, _ = make_agent(url, tmp_path)
    again.open()
    try:
        assert again.scorer.state == "active"
        assert again.scorer.baseline.value == pytest.approx(agent.scorer.baseline.value)
        assert again.tracker.threshold == 0.9  # cached threshold survives too
    finally:
        await again.close()


def ingest_config(http_port: int = 0, grpc_port: int = 0, nodes: int = 5,
                  statistical_min: int = 5) -> Any:
    from workflows.config import AutorepairConfig

    return AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": grpc_port,
                   "otlp_http_port": http_port, "api_port": 0, "admin_port": 0},
        "threshold": {"push_interval_s": 0.3, "statistical_min": statistical_min},
        "clusters": [{"name": "it", "gpu_nodes": nodes}],
    })


async def test_tiers_with_real_ingest_killed_and_back(tmp_path: Path) -> None:
    from ingest.service import IngestService

    svc = IngestService(ingest_config())
    await svc.start()
    port = svc.http_port
    sim = FleetSimulator(
        f"http://127.0.0.1:{port}", "it", 5, push_interval_s=0.3, inference_every=0,
        gpus_per_node=4, state_dir=tmp_path, push=FAST_PUSH, reader_factory=KernelLogReader,
        agent_overrides={"tiers": TierConfig(grace_s=2.0, fresh_pushes=3),
                         "score": ScoreConfig(calibration_samples=4)},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sim.run(stop))
    modes = lambda: {s["mode"] for s in sim.status()}  # noqa: E731
    try:
        await wait_for(lambda: modes() == {"fleet"}, 20, "fleet tier on every node")
        thr = sim.status()[0]["threshold"]
        assert 0 < thr < 1
        await svc.stop()  # ingest killed
        await wait_for(lambda: modes() == {"cached"}, 5, "cached tier")
        assert all(0 < s["threshold"] < 1 for s in sim.status())  # last fleet values
        await wait_for(lambda: modes() == {"local"}, 6, "local tier after grace")
        svc = IngestService(ingest_config(http_port=port))  # ingest back, same port
        await svc.start()
        await wait_for(lambda: modes() == {"fleet"}, 20, "fleet tier again")
    finally:
        stop.set()
        await task
        await svc.stop()


async def test_grpc_transport_reads_threshold_metadata(tmp_path: Path) -> None:
    from ingest.service import IngestService

    svc = IngestService(ingest_config(nodes=1, statistical_min=1))
    await svc.start()
    agent, _, _ = make_agent(
        f"http://127.0.0.1:{svc.grpc_port}", tmp_path,
        push=PushConfig(transport="grpc", backoff_base_s=0.05, backoff_cap_s=0.3),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: agent.mode == "fleet", 20, "fleet tier over gRPC")
        assert agent.pusher.stats.metrics_sent > 0
    finally:
        stop.set()
        await task
        await svc.stop()


async def test_simulator_control_endpoint(recorder: tuple[Recorder, str], tmp_path: Path) -> None:
    rec, url = recorder
    sim = FleetSimulator(url, "it", 3, push_interval_s=0.2, gpus_per_node=2,
                         state_dir=tmp_path, push=FAST_PUSH, reader_factory=KernelLogReader,
                         agent_overrides={"score": ScoreConfig(calibration_samples=3)})
    stop = asyncio.Event()
    task = asyncio.create_task(sim.run(stop))
    host, port = sim.serve_control(0)
    base = f"http://{host}:{port}"
    try:
        async with httpx.AsyncClient(base_url=base) as c:
            nodes = (await c.get("/nodes")).json()
            assert [n["node"] for n in nodes] == ["gpu-01", "gpu-02", "gpu-03"]
            assert (await c.post("/nodes/gpu-09/reboot")).status_code == 404
            r = await c.post("/nodes/gpu-02/fault/melt")
            assert r.status_code == 400 and "'melt'" in r.json()["error"]
            await wait_for(lambda: all(s["state"] == "active" for s in sim.status()), 10,
                           "calibrated")
            assert (await c.post("/nodes/gpu-02/fault/xid79")).status_code == 200
            await wait_for(lambda: any(
                r[0]["host.name"] == "gpu-02" and r[1].get("autorepair.fault.code") == 79
                for r in rec.logs), 5, "replayed xid79")
            (body,) = [b for r_, a, b in rec.logs if a.get("autorepair.fault.code") == 79]
            assert "fallen off the bus" in body
            old_boot = sim.nodes["gpu-02"].boot_id
            r = await c.post("/nodes/gpu-02/fault/slow")
            assert r.json()["faults"] == ["slow"]
            r = await c.post("/nodes/gpu-02/reboot")
            assert r.json()["boot_id"] != old_boot and r.json()["faults"] == []
            await wait_for(lambda: sim.nodes["gpu-02"].agent is not None
                           and sim.nodes["gpu-02"].agent.last is not None, 5, "rebooted")
            assert sim.nodes["gpu-02"].agent.scorer.state == "active"  # baseline kept
            await c.post("/nodes/gpu-03/reprovision")
            await wait_for(lambda: sim.nodes["gpu-03"].agent is not None
                           and sim.nodes["gpu-03"].agent.last is not None, 5, "reprovisioned")
            assert sim.nodes["gpu-03"].agent.scorer.state == "calibrating"  # baseline reset
            await c.post("/nodes/gpu-01/fault/silent")
            sent = rec.gauges("autorepair.node.health_score")
            n_before = len(sent)
            await asyncio.sleep(0.6)
            by_node = [r for r in rec.metrics[-3:]
                       if _attrs(r.resource_metrics[0].resource.attributes)["host.name"]
                       == "gpu-01"]
            assert by_node == [] and len(rec.gauges("autorepair.node.health_score")) > n_before
    finally:
        stop.set()
        await task


AGENT_CLI = str(Path(sys.executable).parent / "autorepair-agent")


async def _simulate(url: str, tmp: Path, *args: str, env: dict[str, str] | None = None
                    ) -> tuple[int, str]:
    """``autorepair-agent simulate`` as a person runs it (a subprocess); (rc, stderr)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("AUTOREPAIR_AGENT_TOKEN", "AUTOREPAIR_DATA_DIR")}
    proc = await asyncio.create_subprocess_exec(
        AGENT_CLI, "simulate", "--endpoint", url, "--cluster", "it", "--nodes", "2",
        "--push-interval", "0.2", "--gpus-per-node", "2", "--state-dir", str(tmp / "sim"),
        *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**base, **(env or {})}, cwd=tmp)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


async def test_simulator_exits_3_when_every_push_is_refused(
        recorder: tuple[Recorder, str], tmp_path: Path) -> None:
    """Without a token the receiver answers 401 forever: the simulator stops after
    MAX_AUTH_REFUSALS pushes in a row with exit 3 and says how to pass one (it used to log
    401 forever and exit 0)."""
    rec, url = recorder
    rec.status = 401
    rc, err = await _simulate(url, tmp_path, "--duration", "30")
    assert rc == 3, err
    assert "refused with HTTP 401" in err and "no token was sent" in err
    assert "--token-file" in err and len(rec.auth) < 30
    assert set(rec.auth) == {""}


async def test_simulator_finds_the_collector_token_through_data_dir(
        recorder: tuple[Recorder, str], tmp_path: Path) -> None:
    """--data-dir (as every other client): DATA_DIR/collector.token is sent; --token
    wins over it; a refused token says it was refused."""
    rec, url = recorder
    data = tmp_path / "stack"
    data.mkdir()
    (data / "collector.token").write_text("tok-from-stack\n")
    rc, err = await _simulate(url, tmp_path, "--duration", "1.5", "--data-dir", str(data))
    assert rc == 0, err
    assert rec.auth and set(rec.auth) == {"Bearer tok-from-stack"}
    rec.auth.clear()
    rc, err = await _simulate(url, tmp_path, "--duration", "1.5", "--data-dir", str(data),
                              "--token", "explicit")
    assert rc == 0 and set(rec.auth) == {"Bearer explicit"}, err
    rec.status = 403
    token_file = tmp_path / "tok"
    token_file.write_text("wrong\n")
    rc, err = await _simulate(url, tmp_path, "--duration", "30", "--token-file",
                              str(token_file))
    assert rc == 3 and "HTTP 403" in err and "the token was refused" in err, err
