"""What the worker registers: ``build_activities(config) -> (main_queue, bmc_queue)``.

- main task queue (``temporal.task_queue``): scheduler activities (cordon, idle, drain,
  rejoin, node health);
- BMC task queue (``temporal.bmc_task_queue``, rate limited by the worker to
  ``temporal.bmc_rate_per_s`` starts per second): power (reset_gpu, reboot, power cycle)
  and provisioning (reprovision, migrate, remove).

The ledger, policy and validation activities are registered by their own modules.
Recommended caller settings (workflows): start-to-close 5 min and heartbeat 30 s for
``drain_node``/``power_cycle_machine``/``reboot_machine``/``reprovision_machine`` (they
heartbeat every poll, ≤ 1 s), 1 min start-to-close for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg

from activities.power import PowerActivities
from activities.provisioning import ProvisioningActivities
from activities.scheduler_activities import SchedulerActivities
from workflows.config import AutorepairConfig


def build_activities(
    config: AutorepairConfig, scheduler_acts: SchedulerActivities | None = None,
    pool: asyncpg.Pool | None = None,
) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
    """(activities for the main task queue, activities for the BMC task queue).

    ``scheduler_acts`` lets a caller pass pre-built scheduler clients (tests); the BMC
    activities read boot identities through the same instance. ``pool`` is the ledger's
    asyncpg pool (spare pool, node bindings, tickets of migrate/remove); when None the
    provisioning activities open one from ``ledger.dsn`` on first use. Power actions
    follow the node → machine bindings a migrate recorded.
    """
    sched = scheduler_acts or SchedulerActivities(config)
    prov = ProvisioningActivities(config, health=sched.health, pool=pool)
    power = PowerActivities(config, health=sched.health, bindings=prov.bound_machine)
    return sched.all(), [*power.all(), *prov.all()]
