"""Every workflow class the worker registers (``workers.worker`` imports ``WORKFLOWS``).

``ValidationWorkflow`` (``workflows/validation.py``) is included when that
module exists; ``RepairWorkflow`` starts it by name either way.
"""

from __future__ import annotations

import importlib.util

from workflows.guard import ClusterGuardWorkflow
from workflows.node import NodeWorkflow
from workflows.repair import RepairWorkflow

WORKFLOWS: list[type] = [NodeWorkflow, RepairWorkflow, ClusterGuardWorkflow]

if importlib.util.find_spec("workflows.validation") is not None:
    from workflows.validation import ValidationWorkflow

    WORKFLOWS.append(ValidationWorkflow)
