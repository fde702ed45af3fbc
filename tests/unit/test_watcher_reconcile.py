"""The watchers' start-up reconciliation against the ledger's last edges, without peers.

``reconcile`` reads the newest edge of each level fault the watcher raised
(``Ledger.last_level_edges``): an open raise is re-opened (its clear follows when the
condition ended meanwhile, and the episode keeps its ``alert_id``), a clear floors the
fault's next raise. Here the cluster is a stub (Slurm's node list, the Kubernetes API's
``list_node``) and the ledger a list of alerts, so each branch is pinned without Slurm,
kmock, Temporal or PostgreSQL (the integration tests in
``tests/detectors/test_watchers_converge.py`` run the same on real peers).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client as k8s

from activities.scheduler.slurm import SlurmNode
from tests.detectors.conftest import make_config
from tests.fixtures.sinks import ListSink
from workers.watchers.kube import KubeWatcher
from workers.watchers.slurm import SlurmWatcher
from workflows.config import AutorepairConfig
from workflows.models import Alert

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


class _Ledger:
    """The ledger's newest edge per fault, as ``last_level_edges`` answers it."""

    def __init__(self, edges: list[Alert]) -> None:
        self.edges = edges

    async def last_level_edges(self, cluster: str, source: str) -> list[Alert]:
        return [a for a in self.edges if a.cluster == cluster and a.source == source]


class _Slurm(SlurmWatcher):
    nodes: dict[str, SlurmNode]

    async def read_nodes(self) -> dict[str, SlurmNode]:
        return self.nodes


def _slurm(cfg: AutorepairConfig, nodes: dict[str, SlurmNode],
           ledger: _Ledger | None) -> tuple[_Slurm, ListSink]:
    sink = ListSink()
    w = _Slurm(cfg, cfg.clusters[0], sink,
               open_alerts=ledger.last_level_edges if ledger is not None else None)
    w.nodes = nodes
    return w, sink


def _not_responding(slurmd_start: datetime) -> dict[str, SlurmNode]:
    # NOT_RESPONDING without a reason: no reason time, the episode falls back to
    # slurmd's start time
    return {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", flags=["NOT_RESPONDING"],
                                slurmd_start_time=slurmd_start)}


async def _raised(w: SlurmWatcher, now: datetime) -> list[Alert]:
    # NOT_RESPONDING alone counts from its second consecutive sighting
    return [a for a in (await w.scan_once(now)) + (await w.scan_once(now)) if a.active]


async def test_slurm_raise_after_a_restart_is_stamped_after_the_ledgers_clear() -> None:
    cfg = make_config("s-unit")
    start = T0 - timedelta(hours=3)
    first, _ = _slurm(cfg, _not_responding(start), None)
    (raise1,) = await _raised(first, T0)
    first.nodes = {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", slurmd_start_time=start)}
    (clear1,) = await first.scan_once(T0 + timedelta(minutes=5))
    assert not clear1.active and clear1.observed_at > raise1.observed_at
    # the worker restarts; slurmd was not restarted, the node stops answering again
    after, _ = _slurm(cfg, _not_responding(start), _Ledger([clear1]))
    (raise2,) = await _raised(after, T0 + timedelta(minutes=10))
    assert raise2.observed_at > clear1.observed_at
    assert raise2.alert_id != raise1.alert_id  # a new episode, not a duplicate
    # without the ledger's clear the raise sorts before it and repeats the old alert_id
    amnesiac, _ = _slurm(cfg, _not_responding(start), _Ledger([]))
    (stale,) = await _raised(amnesiac, T0 + timedelta(minutes=10))
    assert stale.observed_at < clear1.observed_at and stale.alert_id == raise1.alert_id


async def test_slurm_open_episode_keeps_its_alert_id_across_a_restart() -> None:
    cfg = make_config("s-unit")
    start = T0 - timedelta(hours=3)
    w, _ = _slurm(cfg, _not_responding(start), None)
    await _raised(w, T0)
    w.nodes = {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", slurmd_start_time=start)}
    (clear1,) = await w.scan_once(T0 + timedelta(minutes=5))
    w.nodes = _not_responding(start)
    (moved,) = await _raised(w, T0 + timedelta(minutes=6))  # moved after the clear
    assert moved.observed_at > clear1.observed_at
    # restart mid-episode: the ledger's newest edge is the moved raise
    again, _ = _slurm(cfg, _not_responding(start), _Ledger([moved]))
    assert await again.scan_once(T0 + timedelta(minutes=7)) == []  # nothing new to send
    again.nodes = {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", slurmd_start_time=start)}
    (clear2,) = await again.scan_once(T0 + timedelta(minutes=8))
    assert not clear2.active and clear2.observed_at > moved.observed_at


class _Api:
    """``CoreV1Api.list_node`` over a fixed node list."""

    def __init__(self) -> None:
        self.nodes: list[k8s.V1Node] = []

    async def list_node(self) -> k8s.V1NodeList:
        return k8s.V1NodeList(items=self.nodes)


def _node(name: str, ready: str, since: datetime) -> k8s.V1Node:
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name=name, labels={}, annotations={}),
        status=k8s.V1NodeStatus(conditions=[k8s.V1NodeCondition(
            type="Ready", status=ready, reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.", last_transition_time=since)]))


async def _kube(cfg: AutorepairConfig, api: _Api, ledger: _Ledger | None,
                bmc_off: bool = False) -> tuple[KubeWatcher, ListSink]:
    async def probe(cluster: str, node: str) -> dict[str, Any]:
        return {"power_state": "Off" if bmc_off else "On", "health": "OK", "state": "Enabled"}

    sink = ListSink()
    w = KubeWatcher(cfg, cfg.clusters[0], sink, k8s.ApiClient(),
                    bmc_probe=probe if bmc_off else None,
                    open_alerts=ledger.last_level_edges if ledger is not None else None)
    w.api = api  # type: ignore[assignment]
    return w, sink


async def test_kube_not_ready_after_a_restart_is_stamped_after_the_ledgers_clear() -> None:
    cfg = make_config("k-unit", scheduler="kubernetes")
    api = _Api()
    w, _ = await _kube(cfg, api, None)
    api.nodes = [_node("gpu-04", "Unknown", T0)]
    (raise1,) = await w.scan_once(T0 + timedelta(seconds=1))
    api.nodes = [_node("gpu-04", "True", T0 + timedelta(seconds=30))]
    (clear1,) = await w.scan_once(T0 + timedelta(seconds=31))
    # restart; NotReady again, the API server's clock 2 s behind the watcher's
    behind = clear1.observed_at - timedelta(seconds=2)
    api.nodes = [_node("gpu-04", "Unknown", behind)]
    w2, _ = await _kube(cfg, api, _Ledger([clear1]))
    (raise2,) = await w2.scan_once(T0 + timedelta(seconds=40))
    assert raise2.active and raise2.observed_at > clear1.observed_at
    assert raise2.alert_id != raise1.alert_id


async def test_kube_moved_not_ready_keeps_its_alert_ids_whichever_row_the_ledger_keeps() -> None:
    """Both NotReady alerts (observation, and power-cycle with the BMC's evidence) carry
    one stamp, and the ledger keeps one row for the two. Whichever it returns, the
    restarted watcher re-sends both with their old ``alert_id`` (de-duplicated), not new
    ones stamped before the clear ("stale raise")."""
    cfg = make_config("k-unit", scheduler="kubernetes")
    api = _Api()
    w, _ = await _kube(cfg, api, None, bmc_off=True)
    api.nodes = [_node("gpu-04", "Unknown", T0)]
    await w.scan_once(T0 + timedelta(seconds=1))
    api.nodes = [_node("gpu-04", "True", T0 + timedelta(seconds=30))]
    clears = await w.scan_once(T0 + timedelta(seconds=31))
    assert {a.active for a in clears} == {False}
    # NotReady again in the second of the clear: moved after it
    api.nodes = [_node("gpu-04", "Unknown", T0 + timedelta(seconds=30))]
    raised = await w.scan_once(T0 + timedelta(seconds=32))
    assert len(raised) == 2 and all(a.observed_at > clears[0].observed_at for a in raised)
    ids = {a.alert_id for a in raised}
    for row in raised:  # the ledger's tie between the two rows, either way
        w2, _ = await _kube(cfg, api, _Ledger([row]), bmc_off=True)
        again = await w2.scan_once(T0 + timedelta(seconds=40))
        assert {a.alert_id for a in again} <= ids, (row.actionable, again)
        assert all(a.observed_at == raised[0].observed_at for a in again)


class _FlakyLedger(_Ledger):
    """Down for the first ``down`` reads (``ConnectionRefusedError``), then answers."""

    def __init__(self, edges: list[Alert], down: int) -> None:
        super().__init__(edges)
        self.down = down
        self.reads = 0

    async def last_level_edges(self, cluster: str, source: str) -> list[Alert]:
        self.reads += 1
        if self.reads <= self.down:
            raise ConnectionRefusedError("ledger: connection refused")
        return await super().last_level_edges(cluster, source)


async def test_slurm_ledger_down_at_start_still_stamps_after_the_last_clear() -> None:
    """The ledger cannot be read when the restarted watcher starts: it scans anyway, and
    a raise the peer stamps before the previous run's clear is stamped after the first
    scan (the previous run's clears all came before it). Once the ledger answers, the
    episode keeps that stamp: one ``alert_id``, nothing re-sent."""
    cfg = make_config("s-unit")
    start = T0 - timedelta(hours=3)
    first, _ = _slurm(cfg, _not_responding(start), None)
    (raise1,) = await _raised(first, T0)
    first.nodes = {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", slurmd_start_time=start)}
    (clear1,) = await first.scan_once(T0 + timedelta(minutes=5))
    ledger = _FlakyLedger([clear1], down=2)
    after, _ = _slurm(cfg, _not_responding(start), ledger)  # type: ignore[arg-type]
    restart = T0 + timedelta(minutes=10)
    (raise2,) = await _raised(after, restart)
    assert ledger.reads == 2  # both scans found the ledger down
    assert raise2.observed_at > clear1.observed_at and raise2.observed_at > restart
    assert raise2.alert_id != raise1.alert_id
    # the ledger is back (its newest edge is still the old clear): reconciled, and the
    # open episode is neither re-sent nor moved
    assert await after.scan_once(restart + timedelta(minutes=1)) == []
    assert ledger.reads == 3 and after._edges.floor is None
    after.nodes = {"gpu-02": SlurmNode(name="gpu-02", base="IDLE", slurmd_start_time=start)}
    (clear2,) = await after.scan_once(restart + timedelta(minutes=2))
    assert not clear2.active and clear2.alert_id != clear1.alert_id
    assert clear2.observed_at > raise2.observed_at


async def test_kube_ledger_down_at_start_still_stamps_after_the_last_clear() -> None:
    cfg = make_config("k-unit", scheduler="kubernetes")
    api = _Api()
    w, _ = await _kube(cfg, api, None)
    api.nodes = [_node("gpu-04", "Unknown", T0)]
    (raise1,) = await w.scan_once(T0 + timedelta(seconds=1))
    api.nodes = [_node("gpu-04", "True", T0 + timedelta(seconds=30))]
    (clear1,) = await w.scan_once(T0 + timedelta(seconds=31))
    # restart with the ledger down; NotReady again, the API server 2 s behind
    api.nodes = [_node("gpu-04", "Unknown", clear1.observed_at - timedelta(seconds=2))]
    ledger = _FlakyLedger([clear1], down=1)
    w2, _ = await _kube(cfg, api, ledger)  # type: ignore[arg-type]
    (raise2,) = await w2.scan_once(T0 + timedelta(seconds=40))
    assert raise2.active and raise2.observed_at > clear1.observed_at
    assert raise2.alert_id != raise1.alert_id
    assert await w2.scan_once(T0 + timedelta(seconds=50)) == []  # reconciled, same stamp
    assert ledger.reads == 2 and w2._edges.floor is None


async def test_ledger_up_at_start_leaves_new_faults_on_the_peers_time() -> None:
    """The floor is only for a ledger that cannot be read: with it up, a fault the
    ledger has no edge of is stamped with the peer's time, as before."""
    cfg = make_config("k-unit", scheduler="kubernetes")
    api = _Api()
    api.nodes = [_node("gpu-04", "Unknown", T0)]
    w, _ = await _kube(cfg, api, _Ledger([]))
    (raised,) = await w.scan_once(T0 + timedelta(minutes=10))
    assert raised.observed_at == T0
