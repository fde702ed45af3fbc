"""Every activity the worker registers: ``build_activities(config, pool) -> WorkerActivities``.

- main task queue (``temporal.task_queue``, docs/design.md §4.4): ledger, ``load_policy``,
  ``load_node_policy``, ``notify``, scheduler (cordon, idle, drain, rejoin, node health)
  and validation (place, collect, release, return machine, post ticket) activities;
- BMC task queue (``temporal.bmc_task_queue``, rate limited by the worker to
  ``temporal.bmc_rate_per_s`` starts per second): the machine actions — ``reset_gpu``
  (a job on the node, :mod:`activities.reset`), power (reboot, power cycle) and
  provisioning (reprovision, migrate, remove).

The ledger activities and ``load_node_policy`` also run as local activities of the node
and repair workflows (:mod:`workflows.local`): they are registered on the main queue's
worker, the one that runs the workflows, which is where local activities execute.

Recommended caller settings (workflows): start-to-close 5 min and heartbeat 30 s for
``drain_node``/``power_cycle_machine``/``reboot_machine``/``reprovision_machine`` (they
heartbeat every poll, ≤ 1 s), 1 min start-to-close for the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from activities.evidence import EvidenceActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.notifications import Notifier
from activities.notify import NotifyActivities
from activities.policy_activities import PolicyActivities
from activities.power import PowerActivities
from activities.provisioning import ProvisioningActivities
from activities.reset import ResetActivities
from activities.scheduler_activities import SchedulerActivities
from activities.validation_activities import ValidationActivities
from workflows.config import AutorepairConfig


@dataclass(frozen=True, slots=True)
class WorkerActivities:
    """The activities of each task queue, for ``Worker(activities=...)``.

    ``main``: ``temporal.task_queue``; ``bmc``: ``temporal.bmc_task_queue``."""

    main: list[Callable[..., Any]]
    bmc: list[Callable[..., Any]]
    #: The notifier behind ``notify`` and the ledger's notifications (close it at
    #: shutdown: :meth:`Notifier.aclose` gives pending deliveries a moment).
    notifier: Notifier | None = None


def _node_names(sched: SchedulerActivities) -> Callable[[str], Awaitable[list[str]]]:
    """The scheduler's node list of a cluster (the guard's denominator, issue 27 item 9)."""

    async def names(cluster: str) -> list[str]:
        s: Any = sched.scheduler(cluster)
        return list(await s.node_names())

    return names


def _node_domains(sched: SchedulerActivities, config: AutorepairConfig
                  ) -> Callable[[str], Awaitable[dict[str, list[str]]]]:
    """The scheduler's failure domains of a cluster's nodes (issue 29 item 2), named as
    ``policy.domains`` says; an adapter without ``node_domains`` answers none."""

    async def domains(cluster: str) -> dict[str, list[str]]:
        s: Any = sched.scheduler(cluster)
        read = getattr(s, "node_domains", None)
        if read is None:
            return {}
        d = config.policy.domains
        return dict(await read(list(d.label_keys), d.slurm_feature_prefix))

    return domains


def build_activities(
    config: AutorepairConfig,
    pool: asyncpg.Pool,
    *,
    scheduler: SchedulerActivities | None = None,
    kube_api_client: Any = None,
    notify: Callable[..., Any] | None = None,
) -> WorkerActivities:
    """Every activity of the project, bound to ``config`` and the ledger's asyncpg ``pool``
    (ledger records, spare pool, node → machine bindings, tickets of migrate/remove).

    ``scheduler``: pre-built scheduler activities (tests pass Kubernetes clients); the
    BMC activities read boot identities through the same instance. ``kube_api_client``:
    the ``kubernetes_asyncio`` ``ApiClient`` of the validation Jobs (default: from the
    cluster's kubeconfig). ``notify``: an activity named ``notify`` registered instead of
    :class:`~activities.notify.NotifyActivities` (tests record notifications). Power
    actions follow the node → machine bindings a migrate recorded.

    Raises ``ValueError`` naming the channel when a notification secret cannot be read.
    """
    sched = scheduler or SchedulerActivities(config)
    prov = ProvisioningActivities(config, health=sched.health, pool=pool)
    if sched.bindings is None:  # the BMC probe of a powered-off node follows migrations
        sched.bindings = prov.bound_machine
    power = PowerActivities(config, health=sched.health, bindings=prov.bound_machine)
    notifier = Notifier(config.notifications)
    ledger_acts = LedgerActivities(pool, providers=config.providers, notifier=notifier)
    main: list[Callable[..., Any]] = [
        *ledger_acts.all(),
        *PolicyActivities(config, pool, node_names=_node_names(sched),
                          node_domains=_node_domains(sched, config)).all(),
        notify or NotifyActivities(config.notifications, notifier=notifier,
                                   ledger=Ledger(pool)).notify,
        *sched.all(),
        *ValidationActivities(config, pool, kube_api_client=kube_api_client).all(),
    ]
    reset = ResetActivities(config, kube_api_client=kube_api_client)
    evidence = EvidenceActivities(config, kube_api_client=kube_api_client)
    return WorkerActivities(main=main, bmc=[*reset.all(), *evidence.all(), *power.all(),
                                            *prov.all()],
                            notifier=notifier)
