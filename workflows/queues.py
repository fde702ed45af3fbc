"""Task queue names (docs/design.md §4.4), in a module without Temporal imports so that
configuration (``workflows.config``) and the pure lifecycle machines
(``workflows.lifecycle``, import-linter contract ``lifecycle-pure``) can use them;
:mod:`workflows.protocol` re-exports both."""

from __future__ import annotations

TASK_QUEUE = "autorepair"
"""Task queue of every workflow and activity (docs/design.md §4.4)."""
BMC_TASK_QUEUE = "autorepair-bmc"
"""Default task queue of the machine-side (BMC) activities, kept apart so their start
rate can be limited (``temporal.bmc_task_queue``, ``temporal.bmc_rate_per_s``)."""
