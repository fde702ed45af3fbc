"""reset_gpu preconditions (workflows.policy.reset via choose_action) and the reset job's
script and output reading (activities.reset.job)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from activities.reset.job import (
    CANNOT_RUN,
    DONE,
    FAILED,
    gpu_command,
    parse_reset_output,
    reset_script,
)
from workflows.activity_api import AttemptRecord
from workflows.config import LadderConfig, MigrateGateConfig, ResetGpuPlatform, ResetGpuPolicy
from workflows.models import Action, Alert
from workflows.policy import choose_action, gpu_pci, reset_targets

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _alert(gpu: str | None = "00000000:C6:00.0", active: bool = True, n: int = 0) -> Alert:
    return Alert(alert_id=f"a{n}", cluster="c", node="gpu-01", kind="xid", code=48, gpu=gpu,
                 summary="Xid 48", observed_at=NOW, active=active)


def _choose(alerts: list[Alert], policy: ResetGpuPolicy | None, pool: str | None = "hgx",
            attempts: list[AttemptRecord] | None = None, blocked: str | None = None
            ) -> tuple[Action, str]:
    d = choose_action(Action.reset_gpu, alerts, attempts or [], [], "m1", NOW, LadderConfig(),
                      MigrateGateConfig(), reset=policy, pool=pool, reset_blocked=blocked)
    return d.action, d.rule


def test_gpu_pci_forms() -> None:
    assert gpu_pci("00000000:C6:00.0") == "0000:c6:00"
    assert gpu_pci("c6:00.0") == "0000:c6:00"
    assert gpu_pci("0000:3b:00") == "0000:3b:00"
    assert gpu_pci("3") is None and gpu_pci("GPU-1234") is None and gpu_pci("") is None


def test_targets_are_the_active_evidence_gpus_once() -> None:
    alerts = [_alert("0000:c6:00", n=1), _alert("C6:00.0", n=2), _alert("3", n=3),
              _alert(None, n=4), _alert("0000:18:00", active=False, n=5)]
    assert reset_targets(alerts) == ["0000:c6:00", "3"]


def test_allowed_reset_stays_and_says_so() -> None:
    action, rule = _choose([_alert()], ResetGpuPolicy())
    assert action == Action.reset_gpu
    assert rule.startswith("reset:allowed for GPU 0000:c6:00; ladder:first rung")
    nvs = ResetGpuPolicy(nvswitch=True)
    assert "NVSwitch baseboard: node drained" in _choose([_alert()], nvs)[1]


@pytest.mark.parametrize("platform, why", [
    (ResetGpuPlatform(allowed=False), "not allowed on pool hgx (reset_gpu.allowed=false)"),
    (ResetGpuPlatform(mig=True), "MIG mode enabled on pool hgx"),
    (ResetGpuPlatform(single_gpu=False), "cannot reset one GPU while its NVLink peers"),
])
def test_platform_forbids_moves_to_reboot_before_acting(platform: ResetGpuPlatform,
                                                         why: str) -> None:
    policy = ResetGpuPolicy(pools={"hgx": platform})
    action, rule = _choose([_alert()], policy)
    assert action == Action.reboot
    assert rule.startswith("reset:") and why in rule and "-> reboot" in rule
    # another pool keeps the top-level platform
    assert _choose([_alert()], policy, pool="pcie")[0] == Action.reset_gpu


def test_no_gpu_named_or_node_says_cannot_run() -> None:
    assert _choose([_alert(None)], ResetGpuPolicy())[1].startswith(
        "reset:the evidence names no GPU -> reboot")
    action, rule = _choose([_alert()], ResetGpuPolicy(), blocked="processes: pid 7 (python)")
    assert action == Action.reboot
    assert "reset:cannot run on the node (processes: pid 7 (python)) -> reboot" in rule


def test_failed_reset_goes_up_at_once_but_successes_follow_the_ladder() -> None:
    def att(outcome: str, days: float = 1) -> AttemptRecord:
        return AttemptRecord(repair_id="r", cluster="c", node="gpu-01", machine_id="m1",
                             action=Action.reset_gpu, alert_kind="xid", code=48,
                             outcome=outcome, at=NOW - timedelta(days=days))

    action, rule = _choose([_alert()], ResetGpuPolicy(), attempts=[att("failed")])
    assert action == Action.reboot and "reset_gpu failed x1" in rule
    # outside the ladder window, or only a success: reset again
    assert _choose([_alert()], ResetGpuPolicy(), attempts=[att("failed", 8)])[0] == \
        Action.reset_gpu
    assert _choose([_alert()], ResetGpuPolicy(), attempts=[att("succeeded")])[0] == \
        Action.reset_gpu
    two = [att("succeeded"), att("succeeded", 2)]
    assert _choose([_alert()], ResetGpuPolicy(), attempts=two)[0] == Action.reboot
    lenient = ResetGpuPolicy(failed_attempts=2)
    assert _choose([_alert()], lenient, attempts=[att("failed")])[0] == Action.reset_gpu


def test_without_reset_policy_choose_action_is_unchanged() -> None:
    action, rule = _choose([_alert(None)], None)
    assert action == Action.reset_gpu and not rule.startswith("reset:")


def test_gpu_command_placeholders() -> None:
    cmd = ["autorepair-agent", "reset-gpu", "--pci", "{pci}", "--json"]
    assert gpu_command(cmd, "0000:c6:00", "0000:c6:00")[3] == "0000:c6:00"
    assert gpu_command(["nvidia-smi", "--gpu-reset", "-i", "{gpu}"], "3", None)[-1] == "3"
    with pytest.raises(ValueError, match="'3' is not a PCI address"):
        gpu_command(cmd, "3", None)


def _run(script: str) -> str:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          check=False).stdout


def test_script_and_parse_per_gpu_outcomes() -> None:
    agent = {"pci": "0000:18:00", "result": "failed", "reason": "GPU reset but not clean",
             "checks": [{"name": "remap", "ok": False, "detail": "row remap still pending"}],
             "before": {}, "after": {}, "duration_s": 1.0}
    cmds = [["sh", "-c", f"echo noise; echo '{json.dumps(agent)}'; exit 1"],
            ["sh", "-c", "echo 'GPU 00000000:28:00.0 was successfully reset.'"],
            ["sh", "-c", "echo 'In use by another client'; exit 2"],
            ["sh", "-c", "exit 4"]]
    gpus = ["0000:18:00", "0000:28:00", "0000:38:00", "0000:48:00"]
    out = parse_reset_output(_run(reset_script(cmds)), gpus)
    assert [(r.gpu, r.result, r.exit_status) for r in out] == [
        ("0000:18:00", FAILED, 1), ("0000:28:00", DONE, 0), ("0000:38:00", CANNOT_RUN, 2),
        ("0000:48:00", FAILED, 4)]
    assert out[0].evidence["checks"][0]["detail"] == "row remap still pending"
    assert "successfully reset" in out[1].reason


def test_parse_missing_marker_is_failed_and_never_raises() -> None:
    out = parse_reset_output('{"result": "done"}\nautorepair-reset-exit 9 0\n{bad', ["a", "b"])
    assert [r.result for r in out] == [FAILED, FAILED]
    assert "ended before the command returned" in out[0].reason
    assert parse_reset_output("", ["a"])[0].exit_status is None
    dry = parse_reset_output('{"result": "ready", "reason": "dry"}\nautorepair-reset-exit 0 0',
                             ["a"])
    assert dry[0].result == CANNOT_RUN and "dry run" in dry[0].reason
