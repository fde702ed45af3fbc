"""Unknown nodes are observed, not repaired, and their workflows are rate-limited per
cluster (ingest.inventory, wired into ingest.pipeline.Ingestor)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ingest.inventory import OTHER_CLUSTERS, NodeInventory, TokenBucket
from ingest.otlp import make_fault_request
from ingest.pipeline import Ingestor
from ingest.service import IngestService
from tests.fixtures.sinks import ListSink
from workflows.config import AutorepairConfig, ClusterConfig, IngestConfig, NodeConfig
from workflows.models import Action, Alert

NOW = 1_700_000_000.0
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def config(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", **ingest),
        clusters=[ClusterConfig(name="prod", nodes=[NodeConfig(name="gpu-01")]),
                  ClusterConfig(name="k8s", scheduler="kubernetes")],
    )


async def push(ing: Ingestor, cluster: str, node: str) -> None:
    await ing.handle_logs(make_fault_request(cluster, node, kind="xid", code=79,
                                             gpu="0000:3b:00.0", body=XID79,
                                             time_ns=int(NOW * 1e9)), "http")


def metric(ing: Ingestor, name: str, cluster: str) -> float:
    for line in ing.metrics.render().decode().splitlines():
        if line.startswith(f'{name}{{cluster="{cluster}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_known_node_repairs_unknown_node_is_observed() -> None:
    sink = ListSink()
    ing = Ingestor(config(), alert_sink=sink, clock=Clock())
    await push(ing, "prod", "gpu-01")
    await push(ing, "prod", "gpu-66")  # a name nobody configured or listed
    known, unknown = sink.alerts
    assert known.actionable and known.action == Action.power_cycle
    assert "inventory" not in known.evidence
    assert not unknown.actionable and unknown.action == Action.none
    assert unknown.evidence["inventory"] == "unknown" and unknown.code == 79
    assert metric(ing, "autorepair_unknown_node_alerts_total", "prod") == 1.0


async def test_scheduler_list_joins_the_inventory_and_replaces_the_last() -> None:
    sink = ListSink()
    ing = Ingestor(config(), alert_sink=sink, clock=Clock())
    ing.inventory.update({"k8s": ["node-a", "node-b"], "made-up": ["x"]})
    await push(ing, "k8s", "node-a")
    assert sink.alerts[-1].actionable
    ing.inventory.update({"k8s": ["node-b"]})  # node-a left the cluster
    await push(ing, "k8s", "node-a")
    assert not sink.alerts[-1].actionable
    assert ing.inventory.clusters == {"prod", "k8s"} and not ing.inventory.known("made-up", "x")
    assert ing.inventory.size("k8s") == 1 and ing.inventory.size("prod") == 1


async def test_unknown_node_workflows_are_rate_limited_per_cluster() -> None:
    sink = ListSink()
    clock = Clock()
    ing = Ingestor(config(unknown_node_burst=2, unknown_nodes_per_minute=60.0),
                   alert_sink=sink, clock=clock)
    for node in ("u1", "u2", "u3", "u4"):
        await push(ing, "prod", node)
    assert [a.node for a in sink.alerts] == ["u1", "u2"]
    assert metric(ing, "autorepair_unknown_nodes_limited_total", "prod") == 2.0
    await push(ing, "prod", "u1")  # its workflow exists: no token needed
    await push(ing, "prod", "gpu-01")  # known nodes never wait for the bucket
    assert [a.node for a in sink.alerts][2:] == ["u1", "gpu-01"]
    clock.t += 1.0  # 60 per minute: one token back after a second
    await push(ing, "prod", "u3")
    await push(ing, "prod", "u4")
    assert [a.node for a in sink.alerts][4:] == ["u3"]
    # other clusters have their own bucket; every unconfigured id shares one
    await push(ing, "k8s", "n1")
    for i in range(5):
        await push(ing, f"forged-{i}", "n1")
    assert [a.cluster for a in sink.alerts][5:] == ["k8s", "forged-0", "forged-1"]
    assert metric(ing, "autorepair_unknown_nodes_limited_total", OTHER_CLUSTERS) == 3.0
    text = ing.metrics.render().decode()
    assert "forged-" not in text  # bounded labels: configured clusters or "other"


def test_token_bucket_refills_up_to_capacity() -> None:
    b = TokenBucket(capacity=2, rate_per_s=0.5, tokens=2, last=0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert not b.take(1.0) and b.take(2.0)
    assert b.take(100.0) and b.take(100.0) and not b.take(100.0)  # never above capacity
    assert not TokenBucket(0, 1.0, 0, 0.0).take(5.0)  # burst 0: no unknown node, ever


def test_admitted_unknown_nodes_are_bounded() -> None:
    from ingest.inventory import UnknownNodeGate

    gate = UnknownNodeGate(NodeInventory([]), burst=10, per_minute=0.0, max_admitted=2)
    alerts = [Alert(alert_id=f"a{i}", cluster="c", node=f"n{i}", kind="xid", summary="s",
                    observed_at="2026-01-01T00:00:00Z") for i in range(3)]
    assert all(gate.admit(a, 0.0) is not None for a in alerts)
    assert len(gate._admitted) == 2  # n0 forgotten: it would take a token again
    assert gate.admit(alerts[0], 0.0) is not None and gate._buckets["other"].tokens == 6


async def test_service_refreshes_inventory_and_keeps_lists_on_failure() -> None:
    answers: list[Mapping[str, Iterable[str]] | Exception] = [
        {"k8s": ["node-a"]}, RuntimeError("API server down")]

    async def source() -> Mapping[str, Iterable[str]]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    svc = IngestService(config(), inventory_source=source)
    assert await svc.refresh_inventory()
    assert svc.ingestor.inventory.known("k8s", "node-a")
    assert not await svc.refresh_inventory()
    assert svc.ingestor.inventory.known("k8s", "node-a")
