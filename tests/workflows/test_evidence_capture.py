"""Evidence captured before the action, called from the repair (issue 31 item 3): the
real RepairWorkflow on the time-skipping server, the fake cluster's ``capture_evidence``
on the BMC queue, the real ledger (embedded PostgreSQL)."""

from __future__ import annotations

from tests.workflows.conftest import Harness
from tests.workflows.helpers import start_repair
from tests.workflows.test_repair_rails import ledger_row
from workflows.activity_api import TicketInput
from workflows.evidence import ACTIVITY_MARGIN_S
from workflows.models import Action, Stage, ValidationResult, Verdict


def _notes(st: object) -> str:
    return " | ".join(t.reason for t in st.history)  # type: ignore[attr-defined]


async def test_power_cycle_captures_after_the_drain_and_records(harness: Harness) -> None:
    h = harness
    st = await (await start_repair(h, "gpu-05", Action.power_cycle, "ev-pc")).result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    (inp,) = h.cluster.captures
    assert (inp.action, inp.attempt, inp.timeout_s) == (Action.power_cycle, 1, 300.0)
    assert inp.machine_id == "m-gpu-05" and inp.repair_id == "ev-pc"
    names = [n for n, node in h.cluster.calls if node == "gpu-05"]
    assert names.index("drain") < names.index("capture_evidence") < names.index("power_cycle")
    # attached to the status (Temporal) and the history, and recorded in the ledger
    (line,) = st.evidence_captures
    assert line.startswith("before power_cycle (attempt 1): evidence: node archive")
    assert "BMC SEL 2 entries" in line and "Uncorrectable ECC" in line
    assert line in _notes(st)
    row = await ledger_row(h, "ev-pc")
    (ev,) = row["evidence"]
    assert ev["action"] == "power_cycle" and ev["attempt"] == 1
    assert ev["node"]["tool"] == "nvidia-bug-report" and len(ev["bmc"]["entries"]) == 2
    # a hardware ticket of the machine (a failed re-validation) carries it
    t = await h.ledger.open_ticket(TicketInput(
        cluster=h.cluster.cluster, machine="m-gpu-05", run_id="val-ev-pc",
        summary="dcgm diag level 3 failed",
        result=ValidationResult(machine="m-gpu-05", verdict=Verdict.failed)))
    assert t.evidence == [ev["summary"]]


async def test_reboot_is_not_in_the_list_and_captures_nothing(harness: Harness) -> None:
    h = harness
    st = await (await start_repair(h, "gpu-06", Action.reboot, "ev-rb")).result()
    assert st.stage == Stage.succeeded
    assert h.cluster.captures == [] and st.evidence_captures == []
    assert (await ledger_row(h, "ev-rb"))["evidence"] == []


async def test_a_capture_that_fails_is_a_note_and_the_repair_goes_on(harness: Harness) -> None:
    h = harness
    h.cluster.capture_mode = "fail"
    st = await (await start_repair(h, "gpu-07", Action.power_cycle, "ev-fail")).result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    (line,) = st.evidence_captures
    assert "evidence capture before power_cycle failed" in line and "ssh refused" in line
    (ev,) = (await ledger_row(h, "ev-fail"))["evidence"]
    assert ev["node"] is None and ev["bmc"] is None and "ssh refused" in ev["notes"][0]


async def test_a_capture_that_never_answers_is_bounded(harness: Harness) -> None:
    """A capture that hangs is cut at timeout_s + the margin; the repair still acts."""
    h = harness
    h.cluster.capture_mode = "hang"
    h.policy.evidence_capture.timeout_s = 1.0
    st = await (await start_repair(h, "gpu-08", Action.power_cycle, "ev-hang")).result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    (line,) = st.evidence_captures
    assert f"ran past {1.0 + ACTIVITY_MARGIN_S:g} s" in line, line


async def test_a_failed_repair_notification_summarises_the_evidence(harness: Harness) -> None:
    h = harness
    h.cluster.unhealthy.add("gpu-09")
    st = await (await start_repair(h, "gpu-09", Action.power_cycle, "ev-note")).result()
    assert st.stage == Stage.timed_out
    (n,) = [n for n in h.cluster.notifications if n.repair_id == "ev-note"]
    assert "before power_cycle (attempt 1): evidence: node archive" in n.body


async def test_a_fault_that_clears_during_the_capture_is_not_acted_on(
    harness: Harness,
) -> None:
    """The evidence is re-checked right before the action, after the capture (which may
    take up to ``timeout_s``): a level fault that cleared meanwhile ends the repair
    ``auto_resolved`` — captured, never power-cycled (docs/design.md §5 rails)."""
    from tests.workflows.conftest import make_alert

    h = harness
    lvl = make_alert(h.cluster.cluster, "gpu-10", "lvl", kind="gpu_lost", code=None,
                     level=True, action="power_cycle")
    handle = await start_repair(h, "gpu-10", Action.power_cycle, "ev-clr", alerts=[lvl])

    async def clear_now(node: str) -> None:
        await handle.signal("attach_alert",
                            lvl.model_copy(update={"alert_id": "clr", "active": False}))

    h.cluster.while_out["capture_evidence"] = clear_now
    st = await handle.result()
    assert st.stage == Stage.auto_resolved, st.history[-1]
    assert "before acting" in st.history[-1].reason
    assert len(h.cluster.captures) == 1 and h.cluster.power_cycles == 0
    assert h.cluster.count("power_cycle", "gpu-10") == 0


async def test_a_cancel_during_a_long_capture_stops_the_repair_at_once(
    harness: Harness,
) -> None:
    """A cancel while the capture runs (it may run up to ``timeout_s``, an hour at most)
    abandons the capture and ends the repair ``cancelled`` at once, before anything is
    touched, the node uncordoned (I19: a stop is never held up by a read)."""
    h = harness
    h.cluster.capture_mode = "hang"
    h.policy.evidence_capture.timeout_s = 3600.0
    handle = await start_repair(h, "gpu-11", Action.power_cycle, "ev-stop")

    async def cancel_now(node: str) -> None:
        await handle.signal("cancel", {"by": "alice", "reason": "wrong node"})

    h.cluster.while_out["capture_evidence"] = cancel_now
    st = await handle.result()
    assert st.stage == Stage.cancelled and st.history[-1].by == "alice", st.history[-1]
    assert h.cluster.power_cycles == 0 and len(h.cluster.captures) == 1
    assert "evidence capture before power_cycle abandoned" in _notes(st)
    drained_at = next(t.at for t in st.history if t.stage == Stage.draining)
    assert (st.history[-1].at - drained_at).total_seconds() < 60, st.history
    assert "gpu-11" not in h.cluster.repair_cordoned
