"""Any push from a node is contact for `node_unreachable` (issue 26, "also hold"): with or
without a score, with only signals, NCCL points, an unknown metric, the agent's
empty-window push (its detection-mode gauge only), points refused as too far ahead, or a
log record that is no fault. Each variant raised `node_unreachable` while the agent
pushed every 10 s before the fix."""
from __future__ import annotations

import pytest

from ingest.otlp import make_fault_request, make_metrics_request
from ingest.pipeline import Ingestor
from workflows.config import AutorepairConfig
from workflows.models import Alert

NOW = 1_800_000_000.0


class Sink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, a: Alert) -> None:
        self.alerts.append(a)


class Clock:
    t = NOW

    def __call__(self) -> float:
        return self.t


def make() -> tuple[Ingestor, Clock, Sink]:
    cfg = AutorepairConfig.model_validate({
        "ingest": {"unreachable_after_s": 60},
        "threshold": {"push_interval_s": 10},
        "clusters": [{"name": "c", "gpu_nodes": 1,
                      "nodes": [{"name": "gpu-01", "machine": "m-1"}]}]})
    clock, sink = Clock(), Sink()
    return Ingestor(cfg, alert_sink=sink, clock=clock), clock, sink


def unreachable(sink: Sink) -> list[Alert]:
    return [a for a in sink.alerts if a.kind == "node_unreachable" and a.active]


def score_push(clock: Clock, **kw):  # type: ignore[no-untyped-def]
    return make_metrics_request("c", "gpu-01", 0.9, time_ns=int(clock.t * 1e9), **kw)


@pytest.mark.parametrize("variant", ["score", "signals_only", "score_future", "score_nan",
                                     "unknown_metric_only", "nccl_only",
                                     "non_fault_log", "fault_log"])
async def test_push_is_contact(variant: str) -> None:
    ing, clock, sink = make()
    for _ in range(20):  # 200 s of pushes every 10 s
        clock.t += 10
        if variant == "score":
            await ing.handle_metrics(score_push(clock), "test")
        elif variant == "signals_only":
            req = score_push(clock, signals={"throughput_ratio": 0.9})
            del req.resource_metrics[0].scope_metrics[0].metrics[0]
            await ing.handle_metrics(req, "test")
        elif variant == "score_future":  # sender clock 10 min ahead
            req = make_metrics_request("c", "gpu-01", 0.9, time_ns=int((clock.t + 600) * 1e9))
            await ing.handle_metrics(req, "test")
        elif variant == "score_nan":
            await ing.handle_metrics(make_metrics_request("c", "gpu-01", float("nan"),
                                                          time_ns=int(clock.t * 1e9)), "test")
        elif variant == "unknown_metric_only":
            req = score_push(clock)
            req.resource_metrics[0].scope_metrics[0].metrics[0].name = "some.other.metric"
            await ing.handle_metrics(req, "test")
        elif variant == "nccl_only":
            req = score_push(clock)
            req.resource_metrics[0].scope_metrics[0].metrics[0].name = \
                "autorepair.nccl.collective.duration_ms"
            await ing.handle_metrics(req, "test")
        elif variant == "non_fault_log":
            req = make_fault_request("c", "gpu-01", kind="xid", code=79, body="x",
                                     event="some.other.event", time_ns=int(clock.t * 1e9))
            await ing.handle_logs(req, "test")
        elif variant == "fault_log":
            req = make_fault_request("c", "gpu-01", kind="xid", code=13, body="x",
                                     time_ns=int(clock.t * 1e9))
            await ing.handle_logs(req, "test")
        await ing.unreachable.check(clock.t, ing._resource_for)
    assert not unreachable(sink), (variant, [a.evidence_text for a in unreachable(sink)])


async def test_agent_push_without_a_score_is_contact() -> None:
    """The agent's own push when no sample in the window had a known state (build_metrics
    returns only the detection-mode gauge)."""
    from agent.otlp import gauge, metrics_request
    ing, clock, sink = make()
    attrs = {"host.name": "gpu-01", "host.id": "m-1", "autorepair.cluster.id": "c",
             "autorepair.workload_type": "training"}
    for _ in range(20):
        clock.t += 10
        req = metrics_request(attrs, [gauge("autorepair.agent.detection_mode", 0,
                                            int(clock.t * 1e9),
                                            {"autorepair.agent.detection_mode": "none"})])
        await ing.handle_metrics(req, "test")
        await ing.unreachable.check(clock.t, ing._resource_for)
    assert not unreachable(sink), [a.evidence_text for a in unreachable(sink)]
