"""Cluster watchers started by the worker process (docs/design.md §2: Slurm/Kubernetes watchers).

:func:`start_watchers` starts, per configured cluster, the Slurm watcher
(:mod:`workers.watchers.slurm`) or the Kubernetes watcher (:mod:`workers.watchers.kube`:
annotation requests, node-problem-detector conditions, NotReady + BMC check). On start each
watcher reads from the ledger the last edge of each level fault it raised: it re-opens the
faults left open (their clears are sent when the condition ended while the worker was
down) and stamps the next raise of a cleared fault after its clear. Alerts go
through the same path as ingest (``ingest.handoff.TemporalAlertSink`` → NodeWorkflow
update ``deliver_alert``); annotation requests through ``workers.repairs.intake.RepairIntake``
(the ledger at ``ledger.dsn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from temporalio.client import Client

from workflows.config import AutorepairConfig
from workflows.maintenance import MaintenanceWindow

log = logging.getLogger("autorepair.watchers")


async def _run_all(config: AutorepairConfig, client: Client, stop: asyncio.Event) -> None:
    from ingest.handoff import TemporalAlertSink
    from workers.lazy_ledger import LazyLedger
    from workers.watchers.bmc import redfish_probe
    from workers.watchers.kube import KubeWatcher
    from workers.watchers.slurm import SlurmWatcher

    ledger = LazyLedger(config) if config.ledger.dsn else None
    marks = ledger.maintenance_marks() if ledger is not None else None
    sync = None
    if ledger is not None and marks is not None:
        store, view = ledger, marks

        async def sync(cluster: str, source: str, windows: list[MaintenanceWindow],
                       now: datetime) -> None:
            # a scheduler's windows, then the delivery path re-reads them at once, so a
            # fault seen in the same poll as its window is already marked
            await store.sync_maintenance(cluster, source, windows, now)
            await view.refresh(force=True)
    ic = config.ingest
    sink = TemporalAlertSink(client, config.temporal.task_queue, queue_size=ic.alert_queue,
                             max_attempts=ic.handoff_max_attempts,
                             max_value_chars=ic.max_evidence_value_chars,
                             max_alert_bytes=ic.max_alert_bytes, dead_letters=ledger,
                             maintenance=marks)
    await sink.start()
    closers: list[object] = [ledger] if ledger is not None else []
    runs = []
    intake = None
    try:
        for c in config.clusters:
            if c.scheduler == "slurm":
                runs.append(SlurmWatcher(
                    config, c, sink, bmc_probe=redfish_probe(config),
                    open_alerts=ledger.last_level_edges if ledger is not None else None,
                    maintenance=sync,
                ).run(stop))
                continue
            from kubernetes_asyncio import client as k8s
            from kubernetes_asyncio import config as k8s_config

            conf = k8s.Configuration()
            if c.kubeconfig:
                await k8s_config.load_kube_config(config_file=c.kubeconfig,
                                                  client_configuration=conf)
            else:
                k8s_config.load_incluster_config(client_configuration=conf)
            api_client = k8s.ApiClient(conf)
            closers.append(api_client)
            if intake is None and config.ledger.dsn:
                from workers.repairs.intake import LazyIntake

                lazy = LazyIntake(config, client)
                closers.append(lazy)
                intake = await lazy.get()
            runs.append(KubeWatcher(
                config, c, sink, api_client, intake=intake, bmc_probe=redfish_probe(config),
                open_alerts=ledger.last_level_edges if ledger is not None else None,
                confirm=ledger.node_bound_alert if ledger is not None else None,
                maintenance=sync,
            ).run(stop))
        log.info("event=watchers_started clusters=%d", len(runs))
        await asyncio.gather(*runs)
    finally:
        await sink.stop()
        for obj in closers:
            with contextlib.suppress(Exception):
                await obj.close()  # type: ignore[attr-defined]


def start_watchers(config: AutorepairConfig, client: Client,
                   stop: asyncio.Event | None = None) -> list[asyncio.Task[None]]:
    """Start the watchers of every configured cluster as one task (empty list when no
    cluster is configured). Cancel the tasks (or set ``stop``) to end them.

    ``client``: a connected Temporal client (pydantic data converter)."""
    if not config.clusters:
        return []
    return [asyncio.create_task(_run_all(config, client, stop or asyncio.Event()),
                                name="autorepair-watchers")]
