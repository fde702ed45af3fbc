"""Fixtures of the detector / repair-API tests: a real worker (every workflow, the real
ledger and policy activities) on the Temporal dev server, the real ledger on embedded
PostgreSQL, and the repair API served in-process by FastAPI."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.policy_activities import PolicyActivities
from workers.repairs.auth import ApiTokens
from workers.repairs.intake import RepairIntake
from workers.repairs.router import build_repairs_router
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig
from workflows.registry import WORKFLOWS

NODES = ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
TOKENS = {"op-token": ("operator", "alice"), "det-token": ("detector", "scanner"),
          "view-token": ("viewer", "bob")}


def make_config(cluster: str, *, detector_cap: int = 3, scheduler: str = "slurm",
                **cluster_kw: Any) -> AutorepairConfig:
    """A config with one cluster of ``NODES`` and unique task queues."""
    q = "tq-" + uuid.uuid4().hex[:8]
    return AutorepairConfig.model_validate({
        "temporal": {"task_queue": q, "bmc_task_queue": q + "-bmc"},
        "policy": {"rails": {"detector_cap": detector_cap}},
        "clusters": [ClusterConfig(
            name=cluster, scheduler=scheduler,  # type: ignore[arg-type]
            nodes=[NodeConfig(name=n, machine=f"m-{n}") for n in NODES], **cluster_kw,
        ).model_dump()],
    })


@pytest.fixture
def cluster_name() -> str:
    return "c-" + uuid.uuid4().hex[:8]


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    p = tmp_path / "tokens"
    p.write_text("# TOKEN ROLE USER\n" + "".join(
        f"{t} {r} {u}\n" for t, (r, u) in TOKENS.items()))
    return p


class Stack:
    """A running worker plus the intake and an HTTP client on the repair API."""

    def __init__(self, config: AutorepairConfig, intake: RepairIntake, http: httpx.AsyncClient,
                 ledger: Ledger, env: Any, app: FastAPI) -> None:
        self.app = app
        self.config = config
        self.intake = intake
        self.http = http
        self.ledger = ledger
        self.env = env

    @property
    def cluster(self) -> str:
        return self.config.clusters[0].name


async def start_stack(config: AutorepairConfig, pool: Any, env: Any, tokens: Path
                      ) -> AsyncIterator[Stack]:
    from temporalio.worker import Worker

    ledger = Ledger(pool)
    worker = Worker(
        env.client, task_queue=config.temporal.task_queue, workflows=WORKFLOWS,
        activities=[*LedgerActivities(pool).all(), *PolicyActivities(config).all(),
                    *GuardReplyActivities(env.client).all()],
    )
    intake = RepairIntake(config, ledger, env.client)

    async def get() -> RepairIntake:
        return intake

    app = FastAPI()
    app.include_router(build_repairs_router(get, ApiTokens.load(tokens)))
    async with worker, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as http:
        yield Stack(config, intake, http, ledger, env, app)


@pytest.fixture
async def stack(cluster_name: str, ledger_pool: Any, temporal_dev_env: Any,
                tokens_file: Path) -> AsyncIterator[Stack]:
    # the token's detector may hold the whole cluster cap: the cluster cap is what bites
    cfg = make_config(cluster_name, detector_cap=2,
                      detectors={"allowed": {"scanner": {"cap": 2}}})
    async for s in start_stack(cfg, ledger_pool, temporal_dev_env, tokens_file):
        yield s
