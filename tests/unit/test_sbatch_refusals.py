"""Which ``sbatch`` refusals end a check run at once (activities/validation/slurm.py
``SBATCH_CONFIGURATION_ERRORS``): Slurm's own messages (src/common/slurm_errno.c, as the
installed sbatch prints them) that no retry fixes name the setting; the rest is retried."""

from __future__ import annotations

import pytest

from activities.validation.slurm import sbatch_configuration_error
from workflows.config import ValidationConfig

FAILED = "sbatch: error: Batch job submission failed: "


@pytest.mark.parametrize(("message", "names"), [
    ("Invalid partition name specified", "validation.partition 'gpu'"),
    ("Requested node configuration is not available", "validation.partition 'gpu'"),
    ("Requested nodes not in this partition", "validation.partition 'gpu'"),
    ("Access denied to requested reservation", "validation.reservation_user 'ops'"),
    ("User's group not permitted to use this partition", "validation.partition 'gpu'"),
    ("Invalid account or account/partition combination specified", "Slurm account"),
    ("Invalid qos specification", "QOS"),
    ("Access/permission denied", "may not submit"),
])
def test_configuration_refusals_name_the_setting(message: str, names: str) -> None:
    v = ValidationConfig(partition="gpu", reservation_user="ops")
    said = sbatch_configuration_error(FAILED + message, v)
    assert said is not None and names in said


@pytest.mark.parametrize("message", [
    "Unable to contact slurm controller (connect failure)",
    "Socket timed out on send/recv operation",
    "Slurm temporarily unable to accept job, sleeping and retrying",
    "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
    "Requested reservation is invalid",  # the run's reservation gone: placement makes it again
])
def test_passing_refusals_are_retried(message: str) -> None:
    assert sbatch_configuration_error(FAILED + message, ValidationConfig()) is None


def test_default_partition_is_named_as_such() -> None:
    said = sbatch_configuration_error(FAILED + "Requested node configuration is not available",
                                      ValidationConfig(partition=None))
    assert said is not None and "(the default partition)" in said
