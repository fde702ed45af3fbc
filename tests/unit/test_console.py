"""Temporal UI text of each workflow (workflows.console): one-line summaries, markdown
details with the evidence, deterministic for the same input."""

from __future__ import annotations

from datetime import UTC, datetime

from workflows.console import (
    DETAILS_MAX,
    EVIDENCE_MAX,
    SUMMARY_MAX,
    guard_details,
    guard_summary,
    node_details,
    node_summary,
    repair_details,
    repair_summary,
    validation_details,
    validation_summary,
    waiting_details,
)
from workflows.models import (
    Action,
    Alert,
    RepairRequest,
    Requester,
    RequesterKind,
    Severity,
    ValidationRequest,
)

AT = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
LINE = "[ 4242.1] NVRM: Xid (PCI:0000:c6:00): 79, pid=1234, GPU has fallen off the bus."


def xid79(**kw: object) -> Alert:
    base: dict[str, object] = dict(
        alert_id="a1", cluster="demo", node="gpu-03", kind="xid", code=79, gpu="0000:c6:00",
        severity=Severity.critical, summary="Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-03",
        evidence_text=LINE, observed_at=AT, actionable=True, action=Action.power_cycle)
    base.update(kw)
    return Alert.model_validate(base)


def repair(**kw: object) -> RepairRequest:
    base: dict[str, object] = dict(
        repair_id="r-1", cluster="demo", node="gpu-03", machine_id="m-03",
        action=Action.power_cycle, reason="Xid 79 on gpu-03 (catalogue: RESTART_BM)",
        alerts=[xid79()])
    base.update(kw)
    return RepairRequest.model_validate(base)


def test_repair_summary_names_action_node_fault_and_requester() -> None:
    assert repair_summary(repair()) == (
        "power_cycle gpu-03 · Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-03 · "
        "requested by system autorepair")
    det = repair(alerts=[], requester=Requester(kind=RequesterKind.detector, name="scanner"),
                 reason="ECC storm\nseen by scanner", action=Action.reboot)
    assert repair_summary(det) == (
        "reboot gpu-03 · ECC storm seen by scanner · requested by detector scanner")


def test_repair_details_carry_evidence_requester_rule_and_how_to_decide() -> None:
    d = repair_details(repair(request_id="req-9", detector="scanner",
                              requester=Requester(kind=RequesterKind.detector, name="scanner")))
    assert "**power_cycle** on node **demo/gpu-03** (machine m-03)" in d
    assert "Requested by: detector scanner, request id `req-9`" in d
    assert "Rule: Xid 79 on gpu-03 (catalogue: RESTART_BM)" in d
    assert f"`{LINE}`" in d and "2026-03-01T12:00:05+00:00" in d
    assert "autorepair repairs approve r-1" in d and '{"by": "YOU"}' in d
    assert "docs/runbook.md" in d
    assert repair_details(repair()) == repair_details(repair())  # deterministic


def test_long_input_is_bounded() -> None:
    many = [xid79(alert_id=f"a{i}", evidence_text="x" * 5000) for i in range(40)]
    r = repair(alerts=many, reason="y" * 10_000)
    s = repair_summary(repair(alerts=[xid79(summary="z " * 500)]))
    assert len(s) <= SUMMARY_MAX and "\n" not in s and s.endswith("…")
    d = repair_details(r)
    assert len(d) <= DETAILS_MAX
    assert f"and {40 - EVIDENCE_MAX} more alert(s)" in d


def test_waiting_details_say_what_and_until_when() -> None:
    assert waiting_details("approval", AT, "awaiting_approval") == (
        "awaiting_approval: waiting for approval until 2026-03-01T12:00:05+00:00")
    assert waiting_details("gpu-03 to go idle") == "waiting for gpu-03 to go idle (no deadline)"


def test_node_guard_and_validation_text() -> None:
    assert node_summary("demo", "gpu-03", xid79()) == (
        "node gpu-03 · cluster demo · first alert: Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-03")
    assert LINE in node_details("demo", "gpu-03", xid79())
    assert guard_summary("demo") == "cluster guard demo · repair budget and circuit breaker"
    assert "autorepair breaker reset --cluster demo" in guard_details("demo")
    v = ValidationRequest(cluster="demo", machine="gpu-02", requested_by="alice",
                          reason="after RMA", repair_id="r-1")
    assert validation_summary(v) == (
        "validate gpu-02 · cluster demo · after RMA · requested by alice · repair r-1")
    assert "passed → back to the pool" in validation_details(v)
