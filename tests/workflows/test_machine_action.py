"""The machine action through the pure machine (issue 26): reproduction 2, I19, I22.

Driven with the project's harness (FakeCluster's phased BMC: ``resets`` logs every
reset request, ``bmc_read_failures_after_on`` / ``_after_off`` fail status reads)."""

from __future__ import annotations

from typing import Any

from tests.workflows.conftest import Harness
from tests.workflows.helpers import eventually, repair_status, start_repair
from workflows.models import Action, CancelSignal, Stage


async def _attempts(h: Harness, rid: str) -> list[tuple[str, str]]:
    row: dict[str, Any] | None = await h.ledger.get_repair(rid)
    assert row is not None, rid
    return [(a["action"], a["outcome"]) for a in row["attempts"]]


def _resets(h: Harness, node: str) -> list[str]:
    return [r for n, r in h.cluster.resets if n == node]


async def test_bmc_read_failure_after_on_never_power_cycles_again(harness: Harness) -> None:
    """Reproduction 2: ForceOff → Off → On, then one status read raises BmcUnavailable
    while the host boots (boot id unchanged). The retry resumes from ``on_sent``: the
    BMC gets FORCE_OFF, ON once each (on de70c4e: FORCE_OFF, ON, FORCE_OFF, ON)."""
    h = harness
    h.cluster.bmc_read_failures_after_on["gpu-16"] = 1
    st = await (await start_repair(h, "gpu-16", Action.power_cycle, "rep2")).result()
    assert st.stage == Stage.succeeded
    assert _resets(h, "gpu-16") == ["FORCE_OFF", "ON"]
    assert h.cluster.count("power_cycle", "gpu-16") == 2 and h.cluster.power_cycles == 1
    assert await _attempts(h, "rep2") == [("power_cycle", "succeeded")]


async def test_cancel_during_backoff_after_forceoff_powers_the_host_on(harness: Harness) -> None:
    """I19: the BMC fails reads after ForceOff; a cancel during the back-off sends On (the
    host is not left off), takes no further action and ends cancelled; the attempt
    touched the machine, so it is recorded (I22) and the node stays cordoned."""
    h = harness
    h.policy.rails.action_retry_max_s = 3600
    h.cluster.bmc_read_failures_after_off["gpu-17"] = 2
    handle = await start_repair(h, "gpu-17", Action.power_cycle, "i19")

    async def backing_off() -> bool:
        return "transient failure" in (await repair_status(h, "gpu-17", "i19")).detail

    await eventually(backing_off, "power cycle backing off after ForceOff")
    await handle.signal("cancel", CancelSignal(by="oncall", reason="stop"))
    st = await handle.result()
    assert st.stage == Stage.cancelled
    assert _resets(h, "gpu-17") == ["FORCE_OFF", "ON"]
    assert h.cluster.count("reprovision", "gpu-17") == 0
    assert await _attempts(h, "i19") == [("power_cycle", "cancelled")]
    assert h.cluster.cordons.get("gpu-17") == "i19"  # touched: left for a human


async def test_cancel_during_backoff_before_anything_was_sent(harness: Harness) -> None:
    """I19/I22: the BMC refuses connections before ForceOff; a cancel during the
    back-off ends the repair cancelled at once, nothing sent, no attempt."""
    h = harness
    h.policy.rails.action_retry_max_s = 3600
    h.cluster.transient["power_cycle"] = 10_000
    handle = await start_repair(h, "gpu-18", Action.power_cycle, "i19b")

    async def backing_off() -> bool:
        return "transient failure" in (await repair_status(h, "gpu-18", "i19b")).detail

    await eventually(backing_off, "power cycle backing off")
    await handle.signal("cancel", CancelSignal(by="oncall", reason="stop"))
    st = await handle.result()
    assert st.stage == Stage.cancelled
    assert _resets(h, "gpu-18") == []
    assert await _attempts(h, "i19b") == []
    assert "gpu-18" not in h.cluster.cordons  # nothing touched: uncordoned
