"""The machine action through the pure machine (issue 26): reproduction 2, I19, I22.

Driven with the project's harness (FakeCluster's phased BMC: ``resets`` logs every
reset request, ``bmc_read_failures_after_on`` / ``_after_off`` fail status reads)."""

from __future__ import annotations

from typing import Any

from tests.workflows.conftest import Harness
from tests.workflows.helpers import attempt_outcomes, eventually, repair_status, start_repair
from workflows.models import Action, CancelSignal, Stage


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
    assert await attempt_outcomes(h, "rep2") == [("power_cycle", "succeeded")]


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
    assert await attempt_outcomes(h, "i19") == [("power_cycle", "cancelled")]
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
    assert await attempt_outcomes(h, "i19b") == []
    assert "gpu-18" not in h.cluster.cordons  # nothing touched: uncordoned


async def test_shell_ran_what_the_machine_decided(harness: Harness) -> None:
    """Fidelity (issue 26 item 5, for the machine action): the machine action's commands
    in the repair's history (each power_cycle_machine's resume phase and key, the
    back-off timers between tries) are what ``step`` returns for the outcomes the history
    records, replayed through the pure machine."""
    import json
    from datetime import UTC, datetime

    from temporalio.api.enums.v1 import EventType

    from workflows.lifecycle.machine_action import (
        ActivityOk,
        BmcReadFailed,
        RunActivity,
        Start,
        StartTimer,
        TimerFired,
        new_state,
        step,
    )
    from workflows.protocol import workflow_id_repair

    h = harness
    h.cluster.bmc_read_failures_after_on["gpu-19"] = 2
    await (await start_repair(h, "gpu-19", Action.power_cycle, "fid")).result()
    hist = await h.client.get_workflow_handle(
        workflow_id_repair(h.cluster.cluster, "gpu-19", "fid")).fetch_history()
    ran: list[tuple[str, str]] = []  # what the shell executed: ("run", phase) / ("timer", s)
    outcomes: list[Any] = []
    scheduled: dict[int, bool] = {}
    for e in hist.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name == "power_cycle_machine":
                inp = json.loads(a.input.payloads[0].data)
                ran.append(("run", inp["resume_phase"]))
                scheduled[e.event_id] = True
        elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            secs = e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            if ran and ran[-1][0] == "run" and outcomes and not isinstance(outcomes[-1],
                                                                            ActivityOk):
                ran.append(("timer", f"{secs.total_seconds():g}"))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a2 = e.activity_task_failed_event_attributes
            if scheduled.get(a2.scheduled_event_id):
                det = json.loads(a2.failure.cause.application_failure_info.details.payloads[0]
                                 .data) if a2.failure.cause.HasField(
                    "application_failure_info") else json.loads(
                    a2.failure.application_failure_info.details.payloads[0].data)
                outcomes.append(BmcReadFailed(phase=det["phase"]))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a3 = e.activity_task_completed_event_attributes
            if scheduled.get(a3.scheduled_event_id):
                outcomes.append(ActivityOk(phase="booted"))
    # the same outcomes through the pure machine
    m = new_state(Action.power_cycle, "fid/power_cycle/0", h.policy.rails.action_retry_max_s)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    decided: list[tuple[str, str]] = []
    events: list[Any] = [Start()]
    pending = list(outcomes)
    while events:
        m, cmds = step(m, events.pop(0), now)
        for c in cmds:
            if isinstance(c, RunActivity):
                decided.append(("run", c.resume_phase))
                events.append(pending.pop(0))
            elif isinstance(c, StartTimer):
                decided.append(("timer", f"{c.seconds:g}"))
                events.append(TimerFired())
    assert decided == ran, (decided, ran)
    assert decided == [("run", "not_started"), ("timer", "10"), ("run", "on_sent"),
                       ("timer", "20"), ("run", "on_sent")]
