"""A reboot whose try died while it waited for its ``GracefulRestart`` to show (phase
``restart_sent``) was retried with a fresh ``RESTART_SEEN_S`` window (900 s): each retry
could wait the whole window again, so a hung OS got its ``ForceRestart`` only after
several windows. Rail: the window is absolute — the try that sends the restart records
when (UTC) in its heartbeats and failure details, the workflow carries it
(``MachineActionState.sent_at`` → ``MachineActionInput.sent_at``) and a retry waits only
what is left of the original window, then ends at ``restart_unseen`` as before."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities
from tests.activities.test_power_break6 import _Host
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator


async def test_the_try_that_sends_the_restart_reports_when(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(power, "RESTART_SEEN_S", 2.0, raising=False)
    host = _Host(hung=True)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *d: beats.extend(d)
    before = datetime.now(UTC)
    with pytest.raises(ApplicationError) as ei:
        await env.run(acts.reboot_machine, _inp("gpu-01", boot_id_before="boot-A"))
    after = datetime.now(UTC)
    assert host.sent == ["GracefulRestart"], host.sent
    det = ei.value.details[0]
    assert det["phase"] == "restart_unseen", det
    sent_at = datetime.fromisoformat(det["sent_at"])
    assert before <= sent_at <= after, (before, sent_at, after)
    waiting = [b for b in beats if isinstance(b, dict) and b.get("phase") == "restart_sent"]
    assert waiting and all(b.get("sent_at") == det["sent_at"] for b in waiting), beats


async def test_a_retry_at_restart_sent_waits_only_what_is_left_of_the_window(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(power, "RESTART_SEEN_S", 60.0, raising=False)
    host = _Host(hung=True)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    sent_at = datetime.now(UTC) - timedelta(seconds=58)  # 2 s of the 60 s window left
    inp = _inp("gpu-01", boot_id_before="boot-A", resume_phase="restart_sent",
               sent_at=sent_at)
    start = time.monotonic()
    with pytest.raises(ApplicationError) as ei:
        # before the fix the retry waited the whole 60 s again
        await asyncio.wait_for(ActivityEnvironment().run(acts.reboot_machine, inp), 30)
    assert time.monotonic() - start < 20
    assert host.sent == [], host.sent
    det = ei.value.details[0]
    assert det["phase"] == "restart_unseen", det
    assert datetime.fromisoformat(det["sent_at"]) == sent_at, det  # carried, not moved
    assert "60 s" in str(ei.value), ei.value


async def test_a_retry_past_the_window_looks_once_and_ends_unseen(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(power, "RESTART_SEEN_S", 60.0, raising=False)
    host = _Host(hung=True)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A", resume_phase="restart_sent",
               sent_at=datetime.now(UTC) - timedelta(seconds=600))
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(ActivityEnvironment().run(acts.reboot_machine, inp), 15)
    assert ei.value.details[0]["phase"] == "restart_unseen", ei.value.details
    assert host.sent == [], host.sent
