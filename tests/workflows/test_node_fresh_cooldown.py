"""A fresh node entity applies the ledger's last ended repair of its node (I21) with the
cooldown the configuration sets, not the default's 30 minutes: found by `make crash`
(cooldown_s: 0), where every node whose first event was an operator's repair request
ignored its next Xid 79 for the rest of the run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.workflows.conftest import make_alert
from tests.workflows.helpers import start_repair
from tests.workflows.test_node import repair_result
from workflows.models import Action, AlertOutcome, Stage


@pytest.mark.parametrize("cooldown_s", [0.0, 120.0])
async def test_a_fault_after_an_operators_repair_waits_the_configured_cooldown_only(
    harness: Any, cooldown_s: float,
) -> None:
    """Operator: gpu-05 was rebooted on an operator's request (no node entity existed
    yet); its next Xid 79, after the configured cooldown, is recommended at once. It was
    answered "in cooldown" for 30 minutes: the entity timed the ended repair's cooldown
    before its first policy read, with the defaults."""
    h = harness
    h.policy.rails.cooldown_s = cooldown_s
    c = h.cluster.cluster
    node = "gpu-05"
    handle = await start_repair(h, node, Action.reboot, f"op-{int(cooldown_s)}", alerts=[])
    assert (await handle.result()).stage == Stage.succeeded
    await h.env.sleep(timedelta(seconds=cooldown_s + 30))
    now = await h.env.get_current_time()
    d = await h.deliver(make_alert(c, node, "x79", observed_at=now, received_at=now))
    assert d.outcome == AlertOutcome.recommended and d.repair_id, d
    assert (await repair_result(h, node, d.repair_id)).stage == Stage.succeeded
