"""A lease lost while a machine action backs off before a retry that touched nothing
(a break-test of bb83125): the retry re-acquires it first, never reuses it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError

from tests.workflows.conftest import Harness
from tests.workflows.helpers import eventually, guard_status, repair_status, start_repair
from workflows.models import Action, Requester, RequesterKind
from workflows.protocol import GUARD_SIGNAL_RELEASE, LeaseRelease, workflow_id_guard

USER = Requester(kind=RequesterKind.user, name="ops")


def lease_lost_during_backoff(h: Harness) -> dict[str, Any]:
    """The world of these tests: gpu-01 and gpu-02 in pool p1, leases renewed every
    60 s. The first ``power_cycle`` try of r1 on gpu-01 makes the guard forget r1's
    lease (a guard reset to an earlier point) and starts r2 on gpu-02, which takes the
    pool and holds it (gpu-02 stays busy); r1's BMC refuses its first five tries
    (about 10+20+40+80+120 s of back-off, nothing sent). Returns ``{"tries": n, "r2":
    r2's handle}`` as they happen."""
    h.gpu_nodes = 100
    h.pools = {"gpu-01": "p1", "gpu-02": "p1"}
    h.policy.rails.lease_ttl_s = 120  # renew every 60 s
    h.policy.wait_for_idle.do_not_interrupt = True
    h.cluster.busy_polls["gpu-02"] = 10_000  # r2 holds the pool's lease for long
    seen: dict[str, Any] = {"tries": 0, "r2": None}

    async def bmc_down_at_first(node: str) -> None:
        if node != "gpu-01":
            return
        seen["tries"] += 1
        if seen["tries"] == 1:
            guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
            await guard.signal(GUARD_SIGNAL_RELEASE,
                               LeaseRelease(repair_id="r1", outcome="forgotten"))
            seen["r2"] = await start_repair(h, "gpu-02", Action.reboot, "r2",
                                            requester=USER, alerts=[])

            async def r2_holds() -> bool:
                g = await guard_status(h)
                return "r2" in {x.repair_id for x in g.leases}

            await eventually(r2_holds, "r2 holding pool p1")
        if seen["tries"] <= 5:
            raise ApplicationError(f"BMC of {node}: connection refused (injected)")

    h.cluster.while_out["power_cycle"] = bmc_down_at_first
    return seen


async def test_power_cycle_retry_after_the_lease_lapsed_does_not_send_force_off(
    harness: Harness,
) -> None:
    """r1's BMC refuses connections (nothing sent yet). Meanwhile the guard loses r1's
    lease (a guard reset to an earlier point) and grants pool p1 to r2, which cordons
    gpu-02. r1's renewal during its back-off is refused, yet its next try sends
    ForceOff to gpu-01 with no lease, while r2 holds the pool: two nodes of one pool
    disrupted at once (docs/design.md §5: an expired lease is never silently reused;
    one repair per node pool)."""
    h = harness
    seen = lease_lost_during_backoff(h)
    r1 = await start_repair(h, "gpu-01", Action.power_cycle, "r1", requester=USER, alerts=[])

    async def sent_or_waiting() -> bool:
        st = await repair_status(h, "gpu-01", "r1")
        return bool(h.cluster.resets) or (seen["tries"] >= 1 and "lease" in st.detail) or (
            st.stage.value in ("succeeded", "failed", "cancelled"))

    for _ in range(300):
        if await sent_or_waiting():
            break
        await h.env.sleep(timedelta(seconds=5))
    g = await guard_status(h)
    holders = [x.repair_id for x in g.leases]
    queued = [(x.repair_id, getattr(x, "reason", "")) for x in g.pending]
    st = await repair_status(h, "gpu-01", "r1")
    assert h.cluster.resets == [], (
        f"r1 sent {h.cluster.resets} while the guard's leases are {holders} (queued: {queued}) "
        f"(r2 cordoned gpu-02: {h.cluster.cordons.get('gpu-02')}); r1 tries={seen['tries']}, "
        f"history={[ (t.stage.value, t.reason[:80]) for t in st.history]}")
    notes = " | ".join(t.reason for t in st.history)
    assert "lease not held before retrying power_cycle" in notes, notes
    await r1.cancel()
