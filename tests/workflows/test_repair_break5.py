"""Repair rails a break-test of c1940e4 found open (each test failed there):

- a level fault that cleared after an action touched the machine (a power cycle that
  failed half-way) ended the repair ``auto_resolved``, and before the next rung the
  workflow uncordoned the node (two tests: before the next rung, and while it awaits
  approval);
- an automatic escalation did not write the ledger row (``repairs show`` named the
  previous rung);
- an approved repair waiting for its lease or a maintenance window stayed
  ``awaiting_approval`` in the Temporal UI and the ledger;
- a shadow-mode repair that timed out paged on-call as a critical real failure;
- the repeat-offender rule counted repairs from before the machine's RMA removal;
- an observed-only fault (inside a maintenance window) counted as the fault recurring;
- a crash-looping host (the action skipped: it had rebooted by itself) looped the
  repair without end;
- a repair beside a person's cordon ended "node back in service" (it stayed cordoned).
"""

from __future__ import annotations

from typing import Any

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import attempt_outcomes, repair_status, start_repair
from workflows.models import Action, Stage


def _level(h: Harness, node: str, n: str = "1", **kw: Any) -> Any:
    """A level fault (raise/clear edges) behind a power cycle."""
    return make_alert(h.cluster.cluster, node, n, kind="gpu_health", code=None, level=True,
                      summary="GPU health check failing", **kw)


def _notes(st: Any) -> str:
    return " | ".join(t.reason for t in st.history)


async def test_a_level_fault_that_clears_after_a_failed_action_is_not_auto_resolved(
    harness: Harness,
) -> None:
    """The power cycle touched the machine and failed (the BMC sent ForceOff, then the
    job failed); meanwhile the level health alert cleared (the host was off, so its agent
    stopped reporting the fault). The operator finds the repair ``auto_resolved`` and the
    node uncordoned back into the scheduler: a machine whose power cycle failed half-way
    runs jobs again. Rail (docs/design.md §5 rule zero, I22): ``auto_resolved`` only
    before anything was touched; once an action touched the machine and was not
    verified, the node stays cordoned for a person."""
    h = harness
    node, rid = "gpu-04", "lv-fail"
    alert = _level(h, node)
    handle: Any = None

    async def clear_while_out(n: str) -> None:
        await handle.signal("attach_alert", alert.model_copy(update={"active": False}))

    h.cluster.fail_actions["power_cycle"] = 1
    h.cluster.while_out["power_cycle"] = clear_while_out
    handle = await start_repair(h, node, Action.power_cycle, rid, alerts=[alert])
    st = await handle.result()
    assert await attempt_outcomes(h, rid) == [("power_cycle", "failed")]
    assert st.stage != Stage.auto_resolved, _notes(st)
    assert node in h.cluster.cordons, f"node uncordoned after a failed power cycle: {_notes(st)}"


async def test_the_ledger_row_names_the_rung_that_runs(harness: Harness) -> None:
    """Two power cycles failed; the ladder moved the repair to ``reprovision``, which the
    consent policy allows, and it runs. ``autorepair repairs show`` (the ledger row) still
    says ``power_cycle`` with the first rung's rule while the Temporal UI says
    ``reprovision``: the operator reading the CLI thinks a third power cycle runs. Rail
    (docs/design.md §4.4): the ledger row and the search attributes show the repair's
    real state; the action and the rule that decided it are recorded when they change."""
    h = harness
    node, rid = "gpu-05", "lg-rung"
    seen: list[tuple[str, str, str]] = []

    async def at_capture(n: str) -> None:
        if h.cluster.captures[-1].action == Action.reprovision and not seen:
            row = await h.ledger.get_repair(rid)
            assert row is not None
            seen.append((row["action"], row["decided_by_rule"] or "", row["stage"]))

    h.cluster.fail_actions["power_cycle"] = 2
    h.cluster.while_out["capture_evidence"] = at_capture
    st = await (await start_repair(h, node, Action.power_cycle, rid)).result()
    assert st.stage == Stage.succeeded and st.action == Action.reprovision, _notes(st)
    assert seen, "no capture before reprovision"
    action, rule, _ = seen[0]
    assert action == "reprovision", f"ledger row says {action} while reprovision runs"
    assert "reprovision" in rule, rule


async def test_a_level_fault_that_clears_while_the_next_rung_awaits_approval_is_not_auto_resolved(
    harness: Harness,
) -> None:
    """The approved power cycle touched the machine and failed; the next attempt waits for
    a person. The level alert clears meanwhile (the host is off, its agent silent): the
    repair ends ``auto_resolved`` — "the fault went away by itself" — for a machine whose
    power cycle failed half-way and may be powered off. Rail (docs/design.md §5):
    auto-resolve when the alert clears *before action*; after an action touched the
    machine without a verified recovery the repair does not say the fault resolved."""
    from tests.workflows.helpers import wait_stage
    from workflows.models import ApproveSignal

    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-06", "lv-appr"
    alert = _level(h, node)
    h.cluster.fail_actions["power_cycle"] = 1
    handle = await start_repair(h, node, Action.power_cycle, rid, alerts=[alert])
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="oncall"))

    async def asked_again() -> bool:
        st = await repair_status(h, node, rid)
        return st.stage == Stage.awaiting_approval and h.cluster.count("power_cycle") == 1

    from tests.workflows.helpers import eventually
    await eventually(asked_again, "the next rung asked for")
    await handle.signal("attach_alert", alert.model_copy(update={"active": False}))
    st = await handle.result()
    assert await attempt_outcomes(h, rid) == [("power_cycle", "failed")]
    assert st.stage != Stage.auto_resolved, _notes(st)
    assert node in h.cluster.cordons


async def test_a_shadow_repair_nobody_approved_does_not_page_as_a_real_one(
    harness: Harness,
) -> None:
    """A pool runs in shadow mode (evaluation: nothing will ever act). Nobody approves a
    shadow recommendation within the approval timeout; it ends ``timed_out`` and the
    on-call gets a *critical* notification "repair … timed_out" that says nothing of
    shadow mode — a page for a repair that could never have touched anything. Rail
    (docs/runbook.md shadow mode): every channel marks a shadow repair as such (the
    ``repair_finished`` subject reads ``shadow: …``); shadow mode changes nothing an
    operator must act on."""
    h = harness
    h.policy.mode = "shadow"
    h.policy.consent.mode = "approve"
    h.policy.consent.approval_timeout_s = 600
    st = await (await start_repair(h, "gpu-08", Action.reboot, "sh-to")).result()
    assert st.stage == Stage.timed_out and st.mode == "shadow", st
    (n,) = [n for n in h.cluster.notifications if n.repair_id == "sh-to"]
    assert "shadow" in n.subject.lower(), n
    assert n.severity != "critical", n


async def test_a_machine_returned_from_rma_is_not_recommended_for_rma_again_at_once(
    harness: Harness,
) -> None:
    """A repeat offender (3 disruptive repairs in 30 days) was removed for RMA; the vendor
    replaced its board and an operator returned it (``autorepair machines return … --reason
    "board replaced, validation passed"``). Its first fault after the return — an Xid
    79, a power cycle — is turned into ``remove`` for a person again, the rule citing the
    repairs from *before* the RMA: the repaired machine is condemned by the history of
    the hardware it no longer has. Rail (docs/design.md §5 repeat offenders; runbook
    "Return a machine held for RMA"): the rule counts a machine's disruptive repairs; a
    return ends the RMA hold and the machine comes back as repaired, so what the removal
    already answered is not counted again."""
    from datetime import timedelta

    from workflows.activity_api import AttemptRecord

    h = harness
    node, machine = "gpu-07", "m-gpu-07"
    now = await h.env.get_current_time()
    for rid, action, kind, days in [("old-1", Action.power_cycle, "xid", 20),
                                    ("old-2", Action.reboot, "ecc", 15),
                                    ("old-3", Action.reset_gpu, "nvlink", 12),
                                    ("old-rma", Action.remove, "xid", 10)]:
        await h.ledger.record_attempt(AttemptRecord(
            repair_id=rid, cluster=h.cluster.cluster, node=node, machine_id=machine,
            action=action, alert_kind=kind, code=None, outcome="succeeded",
            at=now - timedelta(days=days)))
    assert await h.ledger.machine_hold(h.cluster.cluster, machine) is not None
    assert await h.ledger.return_machine(h.cluster.cluster, machine, "alice",
                                         "board replaced, validation passed") is not None
    st = await (await start_repair(h, node, Action.power_cycle, "after-rma")).result()
    assert "repeat offender" not in (st.decided_by_rule or ""), st.decided_by_rule
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1, _notes(st)


async def test_a_fault_reported_inside_a_maintenance_window_is_no_recurrence(
    harness: Harness,
) -> None:
    """While the power cycle runs, the rack's planned maintenance starts (a window covers
    the node) and the freshly booted host reports Xid 79 once more: the delivery path
    marks it ``in_maintenance`` and the node records it *observed only* — a planned
    maintenance's false fault repairs nothing. The running repair attaches it all the
    same and counts it as the fault coming back: the power cycle is recorded failed and
    the repair climbs the ladder (another power cycle). Rail (docs/design.md §5 maintenance
    windows, rule zero): an alert inside a window is observed only and never recommends —
    nor escalates — anything; only the repair's evidence (actionable faults) can recur."""
    h = harness
    node, rid = "gpu-11", "mw-recur"
    handle: Any = None

    async def window_fault(n: str) -> None:
        now = await h.env.get_current_time()
        await handle.signal("attach_alert", make_alert(
            h.cluster.cluster, n, "in-window", actionable=False, action="none",
            evidence={"boot_id": "boot-1", "in_maintenance": "mw-0123456789ab"},
            received_at=now, observed_at=now))

    h.cluster.while_out["power_cycle"] = window_fault
    handle = await start_repair(h, node, Action.power_cycle, rid)
    st = await handle.result()
    assert await attempt_outcomes(h, rid) == [("power_cycle", "succeeded")], _notes(st)
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1, _notes(st)


async def test_a_crash_looping_host_does_not_loop_the_repair(harness: Harness) -> None:
    """The host crash-loops on its GPU fault: it panics and reboots by itself, and each
    boot reports Xid 79 again. The power cycle finds the host already came back (boot id
    changed) and sends nothing — no attempt — then the fault recurs, the ladder sees no
    attempt, decides the same power cycle, which is skipped again, and so on: the repair
    goes round without end (a dozen evidence captures, no attempt recorded, the node cap
    never reached, nobody told). Rail (docs/design.md §5 ladder, per-node cap): a fault
    that keeps coming back climbs the ladder or goes to a person; a repair never repeats
    an action without bound."""
    h = harness
    node, rid = "gpu-12", "crash-loop"
    handle: Any = None
    loops = [0]

    async def crash_loop(n: str) -> None:
        loops[0] += 1
        if loops[0] > 12:
            return  # the test's own bound: the host finally stays down
        h.cluster.boot[n] = h.cluster.boot.get(n, 0) + 1
        now = await h.env.get_current_time()
        await handle.signal("attach_alert", make_alert(
            h.cluster.cluster, n, f"again-{loops[0]}",
            evidence={"boot_id": f"boot-{h.cluster.boot[n]}"}, received_at=now,
            observed_at=now))

    h.cluster.while_out["power_cycle"] = crash_loop
    handle = await start_repair(h, node, Action.power_cycle, rid)
    st = await handle.result()
    assert h.cluster.count("power_cycle", node) <= 3, (
        f"{h.cluster.count('power_cycle', node)} power cycle calls: {_notes(st)[-600:]}")


async def test_a_repair_on_a_node_a_person_cordoned_does_not_say_back_in_service(
    harness: Harness,
) -> None:
    """Alice cordoned the node by hand before the repair; the repair goes on beside her
    cordon, power-cycles the machine and never lifts her cordon (right). Its record says
    nothing of her cordon when it starts and ends ``node back in service`` — the node is
    not in service, it is cordoned by Alice, and ``repairs show`` tells the operator the
    opposite. Rail (docs/design.md §5: a node cordoned by someone else is never
    uncordoned by a repair; §4.4 the record shows the real state): the record names the
    cordon the repair found and an ending that leaves the node out of service says so."""
    h = harness
    node, rid = "gpu-13", "oc-alice"
    h.cluster.cordons[node] = "alice"
    st = await (await start_repair(h, node, Action.power_cycle, rid)).result()
    assert st.stage == Stage.succeeded and h.cluster.cordons.get(node) == "alice"
    notes = _notes(st)
    assert "already cordoned by someone else" in notes, notes
    assert "back in service" not in st.history[-1].reason, st.history[-1].reason
    assert "left cordoned" in st.history[-1].reason, st.history[-1].reason
