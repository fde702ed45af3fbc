"""The schedulers' node lists for the ingest inventory (:mod:`ingest.inventory`).

:func:`scheduler_inventory` builds the ``InventorySource`` that ``autorepair ingest``
hands to the ingest service: per configured cluster, ``scontrol show node`` (Slurm) or the
Kubernetes node list, through the same scheduler clients the repair activities use
(:mod:`activities.scheduler`). Ingest itself does no scheduler I/O (docs/design.md §2).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from activities.scheduler.kube import KubeScheduler
from activities.scheduler.slurm import SlurmScheduler
from ingest.inventory import InventorySource
from workflows.config import AutorepairConfig

log = logging.getLogger("autorepair.inventory")


def scheduler_inventory(config: AutorepairConfig) -> InventorySource | None:
    """An ``InventorySource`` over every configured cluster's scheduler, or ``None`` when
    no cluster is configured. A cluster whose scheduler cannot be read is left out of that
    answer (logged; its previous list stays in the inventory)."""
    if not config.clusters:
        return None
    schedulers: dict[str, SlurmScheduler | KubeScheduler] = {
        c.name: SlurmScheduler(c) if c.scheduler == "slurm" else KubeScheduler(c)
        for c in config.clusters
    }

    async def one(name: str, s: SlurmScheduler | KubeScheduler) -> tuple[str, list[str] | None]:
        try:
            return name, await s.node_names()
        except Exception as e:  # one unreachable scheduler never blinds the others
            log.warning("event=inventory_read_failed cluster=%s error=%s: %s", name,
                        type(e).__name__, str(e)[:200])
            return name, None

    async def read() -> Mapping[str, Iterable[str]]:
        got = await asyncio.gather(*(one(n, s) for n, s in schedulers.items()))
        return {name: nodes for name, nodes in got if nodes is not None}

    return read
