"""I20 after a non-booting repair (found by a break-test): a successful ``reset_gpu`` retires
the fault it acted on without the boot it was reported from (nothing rebooted), so the
fault coming back later from the same boot is judged afresh. The repair's own recurrence
check (workflows/lifecycle/decision.py) is not covered here."""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.test_node import repair_result
from workflows.models import Action, AlertOutcome, Stage


async def test_a_reset_gpu_success_does_not_make_later_raises_of_its_boot_stale(
        harness: Harness) -> None:
    """A GPU reset replaces no boot: the same fault reported from the same boot after
    the reset ended (and its cooldown) is the fault back, not a late report of a boot a
    repair replaced. The node recorded the boot with the retired fault after any success,
    so every later raise of that boot was ignored until the machine rebooted."""
    h = harness
    c = h.cluster.cluster
    node = "gpu-05"
    now = await h.env.get_current_time()
    # Xid 48 (double-bit ECC) → reset_gpu; the agent runs on boot "boot-0" (the fake
    # cluster's boot id: a GPU reset does not change it)
    x1 = make_alert(c, node, "dbe-1", code=48, action="reset_gpu",
                    summary="Xid 48: double-bit ECC", evidence={"boot_id": "boot-0"},
                    observed_at=now, received_at=now)
    d = await h.deliver(x1)
    assert d.outcome == AlertOutcome.recommended and d.repair_id, d
    st = await repair_result(h, node, d.repair_id)
    assert st.stage == Stage.succeeded and st.action == Action.reset_gpu, st
    assert h.cluster.count("reset_gpu", node) == 1
    # an hour later (cooldown over) the GPU throws Xid 48 again, same boot: nothing
    # rebooted since, so this is a fresh observation of the fault, not a late report
    await h.env.sleep(timedelta(hours=1))
    later = await h.env.get_current_time()
    x2 = make_alert(c, node, "dbe-2", code=48, action="reset_gpu",
                    summary="Xid 48: double-bit ECC", evidence={"boot_id": "boot-0"},
                    observed_at=later, received_at=later)
    d2 = await h.deliver(x2)
    assert d2.outcome == AlertOutcome.recommended, (
        f"a recurrence one hour after a GPU reset (same boot, nothing rebooted) was "
        f"answered {d2.outcome.value}: {d2.reason}")
