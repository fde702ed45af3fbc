"""``NodeHealth.rebooted_since``: how the repair and the BMC actions tell a new boot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.activity_api import BOOT_TIME_JITTER_S, NodeHealth

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "before_id", "before_time", "expected"),
    [
        # exact boot ids decide when both sides have one (Kubernetes bootID)
        (NodeHealth(ready=True, boot_id="b2", boot_time=T0), "b1", T0, True),
        (NodeHealth(ready=True, boot_id="b1", boot_time=T0 + timedelta(days=1)), "b1", T0,
         False),
        # Slurm BootTime alone: re-registration jitter is the same boot ...
        (NodeHealth(ready=True, boot_time=T0 + timedelta(seconds=1)), None, T0, False),
        (NodeHealth(ready=True, boot_time=T0 - timedelta(seconds=2)), None, T0, False),
        (NodeHealth(ready=True, boot_time=T0 + timedelta(seconds=BOOT_TIME_JITTER_S)), None,
         T0, False),
        # ... a reboot moves it by the old boot's uptime
        (NodeHealth(ready=True, boot_time=T0 + timedelta(hours=30)), None, T0, True),
        # an id on one side only: the boot times decide
        (NodeHealth(ready=True, boot_id="b1", boot_time=T0 + timedelta(hours=3)), None, T0,
         True),
        # nothing comparable: unknown
        (NodeHealth(ready=True), "b1", T0, None),
        (NodeHealth(ready=True, boot_id="b1"), None, None, None),
    ],
)
def test_rebooted_since(now: NodeHealth, before_id: str | None, before_time: datetime | None,
                        expected: bool | None) -> None:
    assert now.rebooted_since(before_id, before_time) is expected
