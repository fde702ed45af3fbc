"""The evidence-capture contract (issue 31 item 3): ``policy.evidence_capture`` and the
models of :mod:`workflows.evidence` — defaults, bad input naming the field, the summary
line notifications and tickets carry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from workflows.config import EvidenceCaptureConfig, PolicyConfig
from workflows.evidence import (
    ACTIVITY_MARGIN_S,
    BmcCapture,
    EvidenceCapture,
    EvidenceCaptureInput,
    NodeCapture,
    SelEntry,
    capture_input,
)
from workflows.models import Action

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_defaults_and_which_actions() -> None:
    ec = PolicyConfig().evidence_capture
    assert ec.enabled and ec.timeout_s == 300.0 and ec.bmc_entries == 50
    assert ec.dir == "/var/lib/autorepair/evidence"
    assert ec.actions == [Action.power_cycle, Action.reprovision, Action.migrate, Action.remove]
    assert ec.applies_to(Action.power_cycle) and not ec.applies_to(Action.reboot)
    assert not ec.model_copy(update={"enabled": False}).applies_to(Action.remove)


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"policy.evidence_capture.dir: 'evidence'"):
        EvidenceCaptureConfig(dir="evidence")
    with pytest.raises(ValidationError, match="timeout_s"):
        EvidenceCaptureConfig(timeout_s=0)
    with pytest.raises(ValidationError, match="actions"):
        EvidenceCaptureConfig.model_validate({"actions": ["explode"]})


def test_bad_input_names_the_field_and_value() -> None:
    base = {"cluster": "c", "node": "n", "repair_id": "r-1", "action": "power_cycle"}
    assert EvidenceCaptureInput.model_validate(base).attempt == 1
    with pytest.raises(ValidationError, match=r"repair_id: 'r 1;rm'"):
        EvidenceCaptureInput.model_validate({**base, "repair_id": "r 1;rm"})
    with pytest.raises(ValidationError, match=r"dir: 'tmp'"):
        EvidenceCaptureInput.model_validate({**base, "dir": "tmp"})
    with pytest.raises(ValidationError, match="sha256"):
        NodeCapture(path="/x", size_bytes=1, sha256="xyz", tool="fallback", collected_at=AT)


def test_summary_line() -> None:
    cap = EvidenceCapture(
        node=NodeCapture(path="/var/lib/autorepair/evidence/a.tar.gz", size_bytes=2 * 1048576,
                         sha256="ab" * 32, tool="nvidia-bug-report", collected_at=AT),
        bmc=BmcCapture(source="SEL", collected_at=AT, entries=[
            SelEntry(id="7", severity="Critical", message="Uncorrectable ECC memory error"),
            SelEntry(id="6", severity="OK", message="Power supply restored")]),
        notes=["BMC: Managers log used"])
    assert cap.summary() == (
        "evidence: node archive /var/lib/autorepair/evidence/a.tar.gz (2.0 MiB, sha256 "
        "abababababab…, nvidia-bug-report); BMC SEL 2 entries (newest: Critical "
        '"Uncorrectable ECC memory error"; OK "Power supply restored"); BMC: Managers log used')
    assert EvidenceCapture(notes=["node: job not placed"]).summary() == (
        "evidence: node: job not placed")
    assert EvidenceCapture().summary() == "evidence: none captured"


def test_notifications_carry_the_capture_summary() -> None:
    """A repair notification built from the ledger row (``Ledger.get_repair`` adds
    ``evidence``) carries each capture's summary: a Slack section, PagerDuty's
    ``custom_details.captures``, the generic webhook's JSON."""
    from activities.notifications.channels import pagerduty_body, slack_body, webhook_body
    from activities.notifications.event import repair_event
    from workflows.config import NotifyEvent

    line = EvidenceCapture(notes=["node: capture job 7 on gpu-03 did not finish"]).summary()
    row = {"repair_id": "r-1", "cluster": "c", "node": "gpu-03", "action": "power_cycle",
           "reason": "", "workflow_id": None,
           "evidence": [{"action": "power_cycle", "attempt": 1, "summary": line}]}
    ev = repair_event(NotifyEvent.repair_failed, row, "failed", "no recovery", [])
    assert ev.captures == [line]
    slack = json.dumps(slack_body(ev))
    assert "Captured before acting" in slack and "did not finish" in slack
    assert pagerduty_body(ev, "rk")["payload"]["custom_details"]["captures"] == [line]
    assert webhook_body(ev)["captures"] == [line]
    assert repair_event(NotifyEvent.repair_failed, {**row, "evidence": []}, "failed", "x",
                        []).captures == []


def test_capture_input_follows_the_policy() -> None:
    cfg = EvidenceCaptureConfig(timeout_s=120, bmc_entries=20, dir="/data/ev")
    inp = capture_input(cfg, cluster="c", node="gpu-01", machine_id="m-1", repair_id="r-1",
                        action=Action.reprovision, attempt=2)
    assert inp is not None and (inp.timeout_s, inp.bmc_entries, inp.dir, inp.attempt) == (
        120, 20, "/data/ev", 2)
    assert inp.machine_id == "m-1" and inp.action == Action.reprovision
    assert capture_input(cfg, cluster="c", node="n", machine_id=None, repair_id="r",
                         action=Action.reboot) is None
    off = cfg.model_copy(update={"enabled": False})
    assert capture_input(off, cluster="c", node="n", machine_id=None, repair_id="r",
                         action=Action.remove) is None
    assert ACTIVITY_MARGIN_S > 0
