"""A versioned worker process for the upgrade test (issue 26 I24).

``python -m tests.workflows.versioned_worker_proc ADDRESS TASK_QUEUE BMC_QUEUE STATE DSN
SCHEMA DEPLOYMENT BUILD_ID PROMOTE``: the project's versioned registry
(:data:`workflows.versioned.VERSIONED_WORKFLOWS`, a same-named pinned stand-in for
``ValidationWorkflow``), the real ledger activities and the file-backed cluster of
:mod:`tests.workflows.worker_proc`, both queues polling as Worker Deployment Version
``DEPLOYMENT`` / ``BUILD_ID`` through :func:`workers.versioning.deployment_config`. Once
its workers poll it promotes its build as ``autorepair worker`` does
(:func:`workers.versioning.promote_current_version`) when ``PROMOTE`` is ``promote``
(``temporal.promote_on_start``; ``manual``: promotion off, an operator promotes) and
prints ``worker ready BUILD_ID``. Its client identity is ``build-BUILD_ID``, so a history
names the build whose worker completed each task.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import connect
from activities.ledger_activities import LedgerActivities
from tests.workflows.fake_validation import PinnedFakeValidationWorkflow
from tests.workflows.worker_proc import FileCluster
from workers.versioning import deployment_config, promote_current_version
from workflows.config import TemporalConfig
from workflows.versioned import VERSIONED_WORKFLOWS


async def main(argv: list[str]) -> None:
    address, tq, bmc_q, state, dsn, schema, deployment, build, promote = argv
    if promote not in ("promote", "manual"):
        raise SystemExit(f"PROMOTE: 'promote' or 'manual' (got {promote!r})")
    cfg = TemporalConfig(address=address, task_queue=tq, bmc_task_queue=bmc_q,
                         deployment_name=deployment, build_id=build,
                         promote_on_start=promote == "promote")
    client = await Client.connect(address, data_converter=pydantic_data_converter,
                                  identity=f"build-{build}")
    cluster = FileCluster(Path(state), bmc_q)
    pool = await connect(dsn, schema=schema, max_size=3)
    ledger = LedgerActivities(pool)
    dc = deployment_config(cfg)
    wfs = [w for w in VERSIONED_WORKFLOWS if w.__name__ != "VersionedValidationWorkflow"]
    main_w = Worker(
        client,
        task_queue=tq,
        workflows=[*wfs, PinnedFakeValidationWorkflow],
        activities=[
            *ledger.all(),
            cluster.load_policy,
            cluster.load_node_policy,
            cluster.cordon_node,
            cluster.check_idle,
            cluster.drain_node,
            cluster.rejoin_node,
            cluster.node_health,
            cluster.notify,
            *GuardReplyActivities(client).all(),
        ],
        deployment_config=dc,
    )
    bmc_w = Worker(client, task_queue=bmc_q, activities=[cluster.power_cycle_machine],
                   deployment_config=dc)
    async with main_w, bmc_w:
        await promote_current_version(client, cfg)
        print(f"worker ready {build}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
