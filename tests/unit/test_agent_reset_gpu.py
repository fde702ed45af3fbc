"""``autorepair-agent reset-gpu`` against the simulated NVML backend: named preconditions
(exit 2 with the reason), the reset through a real subprocess (exit 1 on failure, timeout
or a GPU that does not come back), the read-back (exit 0 only when clean), services
stopped and restarted through a systemctl stand-in script, and the console script's exit
codes and JSON shape."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.gpureset import (
    CANNOT_RUN,
    DONE,
    FAILED,
    READY,
    NvidiaSmiResetter,
    NvmlResetDevice,
    ResetOptions,
    ResetResult,
    SimulatedResetter,
    Systemctl,
    parse_pci_arg,
    reset_gpu,
)
from agent.gpureset.checks import single_reset_blocker
from agent.gpureset.command import nvsmi_bus_id
from agent.gpureset.host import device_holders, nvswitch_devices, unit_of
from agent.nvml import ResetCommandResult, SimFaults, SimulatedBackend
from tests.conftest import venv_binary

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "0000:18:00"  # SimulatedBackend.pci_of(0)


def _sim(**faults: object) -> SimulatedBackend:
    b = SimulatedBackend(gpu_count=8, seed=1)
    b.faults = SimFaults(**faults)  # type: ignore[arg-type]
    return b


@dataclass
class _Recorder:
    """A resetter that records calls and delegates to the simulated reset."""

    backend: SimulatedBackend
    calls: list[str] = field(default_factory=list)

    def preflight(self) -> str | None:
        return None

    def describe(self) -> str:
        return "recording simulated reset"

    def __call__(self, pci: str) -> ResetCommandResult:
        self.calls.append(pci)
        return self.backend.simulate_reset(pci)


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """Empty /proc and /sys trees (nothing holds a GPU, no NVSwitch)."""
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    sys_.mkdir()
    return proc, sys_


def _plant_holder(proc: Path, pid: int, comm: str, device: str, unit: str | None = None) -> None:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "fd" / "3").symlink_to("/dev/null")
    (d / "fd" / "7").symlink_to(device)
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text(f"0::/system.slice/{unit}\n" if unit else "0::/user.slice\n")


def _run(sim: SimulatedBackend, roots: tuple[Path, Path], pci: str = GPU0,
         resetter: object | None = None, systemctl: Systemctl | None = None,
         **opts: object) -> ResetResult:
    proc, sys_ = roots
    o = ResetOptions(pci=pci, proc_root=proc, sys_root=sys_, wait_timeout_s=0.3,
                     poll_interval_s=0.05, **opts)  # type: ignore[arg-type]
    return reset_gpu(o, sim, resetter or SimulatedResetter(sim),  # type: ignore[arg-type]
                     systemctl or Systemctl("/nonexistent/systemctl"))


# ---- the PCI argument ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["0000:c6:00", "0000:C6:00.0", "c6:00.0", "00000000:C6:00.0",
                                  " c6:00 "])
def test_pci_forms_normalise(text: str) -> None:
    assert parse_pci_arg(text) == "0000:c6:00"


@pytest.mark.parametrize(("text", "needle"), [
    ("gpu3", "expected a PCI address"), ("c6:00.1", "function 1"), ("c6:20.0", "above 1f"),
    ("1ffff:c6:00.0", "domain above ffff"), ("", "expected a PCI address"),
])
def test_pci_bad_forms_are_named(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="--pci") as exc:
        parse_pci_arg(text)
    assert needle in str(exc.value) and repr(text) in str(exc.value)


def test_nvsmi_bus_id_form() -> None:
    assert nvsmi_bus_id("0000:c6:00") == "00000000:C6:00.0"


# ---- preconditions: exit 2, nothing touched ----------------------------------------------


def test_nvml_processes_on_gpu_cannot_run_with_pids(roots: tuple[Path, Path]) -> None:
    sim = _sim(gpu_processes={0: [4242, 4243]}, recovery_action=1)
    rec = _Recorder(sim)
    r = _run(sim, roots, resetter=rec)
    assert r.result == CANNOT_RUN and r.exit_code == 2
    assert r.check("processes").ok is False
    assert "pid 4242" in r.check("processes").detail and "pid 4243" in r.reason
    assert rec.calls == []  # never reset
    assert r.before["recovery_action"] == "gpu_reset" and r.after == {}


def test_proc_fd_holder_cannot_run_with_pid_and_name(roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 5151, "python3", "/dev/nvidia0")
    _plant_holder(roots[0], 6161, "bash", "/dev/nvidia5")  # another GPU: not this check's
    r = _run(_sim(), roots)
    assert r.exit_code == 2
    assert r.check("processes").detail.startswith("1 process(es) hold gpu0 0000:18:00: "
                                                  "pid 5151 (python3")
    assert "6161" not in r.check("processes").detail


def test_own_process_is_not_a_holder(roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], os.getpid(), "python3", "/dev/nvidia0")
    r = _run(_sim(recovery_action=1), roots)
    assert r.check("processes").ok is True and r.result == DONE


def test_mig_enabled_cannot_run(roots: tuple[Path, Path]) -> None:
    sim = _sim(mig_gpus=[0])
    rec = _Recorder(sim)
    r = _run(sim, roots, resetter=rec)
    assert r.exit_code == 2 and r.check("mig").ok is False
    assert "MIG mode enabled" in r.reason and "instance destroyed" in r.reason
    assert rec.calls == []


def test_unknown_pci_cannot_run_with_clear_message(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(), roots, pci="0000:c6:00.0")
    assert r.exit_code == 2 and r.pci == "0000:c6:00"
    assert r.reason.startswith("pci: no GPU at 0000:c6:00 (NVML sees: gpu0 0000:18:00, "
                               "gpu1 0000:28:00")


def test_invalid_pci_cannot_run(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(), roots, pci="GPU-7")
    assert r.exit_code == 2 and r.checks[0].name == "pci" and "'GPU-7'" in r.reason


def test_nvswitch_baseboard_busy_peers_named(roots: tuple[Path, Path]) -> None:
    sim = _sim(nvswitch=True, gpu_processes={3: [777]}, recovery_action=1)
    _plant_holder(roots[0], 888, "train.py", "/dev/nvidia5")
    r = _run(sim, roots)
    nv = r.check("nvlink")
    assert r.exit_code == 2 and nv.ok is False
    assert "every GPU of the baseboard idle" in nv.detail
    assert "gpu3 0000:48:00 (pid 777" in nv.detail and "gpu5 0000:68:00 (pid 888 (train.py" in nv.detail
    assert r.check("processes").ok is True  # the target itself is idle


def test_nvswitch_found_on_pci_bus(roots: tuple[Path, Path]) -> None:
    dev = roots[1] / "bus" / "pci" / "devices"
    for addr, vendor, cls in [("0000:05:00.0", "0x10de", "0x068000"),
                              ("0000:06:00.0", "0x10de", "0x030200"),  # a GPU
                              ("0000:07:00.0", "0x8086", "0x068000")]:
        (dev / addr).mkdir(parents=True)
        (dev / addr / "vendor").write_text(vendor + "\n")
        (dev / addr / "class").write_text(cls + "\n")
    assert nvswitch_devices(roots[1]) == ["0000:05:00.0"]
    r = _run(_sim(recovery_action=1), roots)
    assert "NVSwitch baseboard (1 NVSwitch(es) on PCI" in r.check("nvlink").detail
    assert r.result == DONE


@pytest.mark.parametrize(("arch", "fabric", "fm", "blocked"), [
    ("volta", False, None, "every NVLink peer"),
    ("ampere", True, False, "Fabric Manager not running"),
    ("ampere", True, True, None),
    ("ampere", False, None, None),
    ("hopper", True, False, None),  # Hopper+ NVSwitch: no Fabric Manager dependency
    (None, True, None, None),
])
def test_single_gpu_reset_feasibility(arch: str | None, fabric: bool, fm: bool | None,
                                      blocked: str | None) -> None:
    why = single_reset_blocker(arch, fabric, fm)
    assert (why is None) if blocked is None else (why is not None and blocked in why)


# ---- services -----------------------------------------------------------------------------


def _systemctl(tmp: Path, proc: Path, fail: str = "") -> tuple[Systemctl, Path]:
    """A systemctl stand-in: logs its arguments; ``stop`` of the persistence daemon's unit
    makes its /proc entry vanish (the daemon exits), as systemd would."""
    log = tmp / "systemctl.log"
    body = (f'echo "$@" >> {log}\n'
            f'case "$1" in\n'
            f'  {fail or "never"}) echo "Job failed" >&2; exit 1;;\n'
            f'  stop) rm -rf {proc}/17;;\n'
            f'  is-active) echo inactive; exit 3;;\n'
            f'esac\n')
    return Systemctl(_script(tmp / "systemctl", body)), log


def test_daemon_holding_gpu_needs_flag(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 17, "nvidia-persiste", "/dev/nvidia0", "nvidia-persistenced.service")
    ctl, log = _systemctl(tmp_path, roots[0])
    r = _run(_sim(), roots, systemctl=ctl)
    assert r.exit_code == 2 and r.check("services").ok is False
    assert "nvidia-persistenced.service" in r.reason and "--stop-services" in r.reason
    assert r.check("processes").ok is True  # a daemon is the services check's business
    assert not log.exists()


def test_stop_services_stops_resets_and_restarts(tmp_path: Path,
                                                 roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 17, "nvidia-persiste", "/dev/nvidia0", "nvidia-persistenced.service")
    _plant_holder(roots[0], 18, "nv-fabricmanage", "/dev/nvidia0",
                  "nvidia-fabricmanager.service")
    ctl, log = _systemctl(tmp_path, roots[0])
    sim = _sim(recovery_action=4, nvswitch=True)
    r = _run(sim, roots, systemctl=ctl, stop_services=True)
    assert r.result == DONE, r.reason
    assert log.read_text().splitlines() == [
        "is-active nvidia-fabricmanager.service",
        "stop nvidia-persistenced.service",
        "start nvidia-persistenced.service",
    ]  # Fabric Manager is never stopped
    assert "left running" in r.check("services").detail
    assert [c.name for c in r.checks][-2:] == ["ecc_volatile", "restart_services"]


def test_services_restarted_even_when_reset_fails(tmp_path: Path,
                                                  roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 17, "nvidia-persiste", "/dev/nvidia0", "nvidia-persistenced.service")
    ctl, log = _systemctl(tmp_path, roots[0])
    r = _run(_sim(reset_outcome="fails"), roots, systemctl=ctl, stop_services=True)
    assert r.exit_code == 1 and "start nvidia-persistenced.service" in log.read_text()
    assert r.check("restart_services").ok is True


def test_failed_restart_fails_the_run(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 17, "nvidia-persiste", "/dev/nvidia0", "nvidia-persistenced.service")
    ctl, _ = _systemctl(tmp_path, roots[0], fail="start")
    r = _run(_sim(), roots, systemctl=ctl, stop_services=True)
    assert r.exit_code == 1 and "Job failed" in r.check("restart_services").detail


def test_daemon_outside_systemd_cannot_be_stopped(tmp_path: Path,
                                                  roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 19, "nv-hostengine", "/dev/nvidia0")
    ctl, log = _systemctl(tmp_path, roots[0])
    r = _run(_sim(), roots, systemctl=ctl, stop_services=True)
    assert r.exit_code == 2 and "outside systemd" in r.check("services").detail
    assert "stop" not in (log.read_text() if log.exists() else "")


def test_dry_run_touches_nothing(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    _plant_holder(roots[0], 17, "nvidia-persiste", "/dev/nvidia0", "nvidia-persistenced.service")
    ctl, log = _systemctl(tmp_path, roots[0])
    sim = _sim(recovery_action=1)
    rec = _Recorder(sim)
    r = _run(sim, roots, resetter=rec, systemctl=ctl, stop_services=True, dry_run=True)
    assert r.result == READY and r.exit_code == 0
    assert "would stop nvidia-persistenced.service" in r.check("services").detail
    assert rec.calls == [] and not log.exists() and r.after == {}
    assert r.before["recovery_action"] == "gpu_reset"


# ---- the reset and the read-back ---------------------------------------------------------


def test_recovery_action_cleared_exit_0(roots: tuple[Path, Path]) -> None:
    sim = _sim(recovery_action=1, remap_pending=True, ecc_uncorrectable=3)
    r = _run(sim, roots)
    assert r.result == DONE and r.exit_code == 0, r.reason
    assert r.before["index"] == 0 and r.before["remap_pending"] is True
    assert r.before["ecc_volatile_uncorrected"] == 3
    assert r.after["recovery_action"] == "none" and r.after["remap_pending"] is False
    assert r.after["ecc_volatile_uncorrected"] == 0
    assert r.check("recovery_action").detail == "none (was gpu_reset)"
    assert [c.name for c in r.checks] == [
        "pci", "reset_tool", "mig", "processes", "services", "nvlink", "reset", "gpu_back",
        "recovery_action", "remap", "ecc_volatile"]


def test_reset_that_does_not_clear_fails_with_evidence(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(recovery_action=1, reset_outcome="persists"), roots)
    assert r.result == FAILED and r.exit_code == 1
    assert r.reason.startswith("GPU reset but not clean: recovery_action: still gpu_reset")
    assert r.after["recovery_action"] == "gpu_reset"


def test_remap_failure_is_not_cleared(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(remap_failure=True), roots)
    assert r.exit_code == 1 and "a reset cannot clear it" in r.check("remap").detail


def test_gpu_not_back_fails(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(recovery_action=1, reset_outcome="lost"), roots)
    assert r.exit_code == 1 and r.check("gpu_back").ok is False
    assert "not visible to NVML" in r.reason and r.after == {}


def test_nvidia_smi_failure_exit_1_with_output(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    smi = _script(tmp_path / "nvidia-smi",
                  'echo "GPU Reset couldn\'t run because GPU $3 is the primary GPU."\nexit 3\n')
    r = _run(_sim(recovery_action=1), roots,
             resetter=NvidiaSmiResetter(smi, timeout_s=10, require_root=False))
    reset = r.check("reset")
    assert r.exit_code == 1 and reset.ok is False
    assert "--gpu-reset -i 00000000:18:00.0: rc=3 (the requested operation is not available" \
        in reset.detail
    assert "is the primary GPU" in reset.detail and r.reason.startswith("reset command failed")


def test_nvidia_smi_timeout_exit_1(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    smi = _script(tmp_path / "nvidia-smi", "echo resetting\nexec sleep 30\n")
    r = _run(_sim(recovery_action=1), roots,
             resetter=NvidiaSmiResetter(smi, timeout_s=0.5, require_root=False))
    assert r.exit_code == 1 and ": timed out after" in r.check("reset").detail
    assert r.duration_s < 10


def test_nvidia_smi_missing_cannot_run(roots: tuple[Path, Path]) -> None:
    r = _run(_sim(), roots, resetter=NvidiaSmiResetter("/nonexistent/nvidia-smi"))
    assert r.exit_code == 2 and r.check("reset_tool").ok is False
    assert "not found" in r.reason


def test_reset_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--reset-timeout"):
        NvidiaSmiResetter("nvidia-smi", timeout_s=0)


# ---- host readers ---------------------------------------------------------------------------


def test_device_holders_never_raise(tmp_path: Path) -> None:
    assert device_holders(tmp_path / "absent", {"/dev/nvidia0"}) == ({"/dev/nvidia0": []}, 0)
    (tmp_path / "42").mkdir()  # a pid whose fd table is unreadable / gone
    (tmp_path / "self").mkdir()
    found, unreadable = device_holders(tmp_path, {"/dev/nvidia0"})
    assert found == {"/dev/nvidia0": []} and unreadable == 1


def test_unit_of_cgroup_v1_and_v2(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text(
        "12:pids:/system.slice/nvidia-dcgm.service\n1:name=systemd:/system.slice/"
        "nvidia-dcgm.service\n")
    assert unit_of(tmp_path, 1) == "nvidia-dcgm.service"
    assert unit_of(tmp_path, 2) is None


def test_nvml_backend_unavailable_cannot_run(roots: tuple[Path, Path]) -> None:
    dev = NvmlResetDevice()
    try:
        dev.open()
    except Exception:
        pass
    else:  # a real GPU host: this case is covered by tests/gpu/check_nvml.py
        dev.close()
        pytest.skip("NVML is available here")
    o = ResetOptions(pci=GPU0, proc_root=roots[0], sys_root=roots[1])
    r = reset_gpu(o, NvmlResetDevice(), NvidiaSmiResetter("/nonexistent/nvidia-smi"))
    assert r.exit_code == 2 and r.checks[-1].name == "nvml" and "NVML not available" in r.reason


# ---- the console script -------------------------------------------------------------------


def _cli(tmp_path: Path, *args: str, faults: dict[str, object] | None = None
         ) -> tuple[int, dict[str, object]]:
    argv = [venv_binary("autorepair-agent"), "reset-gpu", "--json", "--backend", "simulated",
            "--proc-root", str(tmp_path / "proc"), "--sys-root", str(tmp_path / "sys"),
            "--wait-timeout", "0.5", *args]
    if faults is not None:
        (tmp_path / "faults.json").write_text(json.dumps(faults))
        argv += ["--sim-faults", str(tmp_path / "faults.json")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cp = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    lines = cp.stdout.strip().splitlines()
    assert len(lines) == 1, (cp.stdout, cp.stderr)
    return cp.returncode, json.loads(lines[0])


def _shape(out: dict[str, object]) -> None:
    assert set(out) == {"pci", "result", "reason", "checks", "before", "after", "duration_s"}
    assert isinstance(out["checks"], list)
    for c in out["checks"]:
        assert set(c) == {"name", "ok", "detail"} and c["ok"] in (True, False, None)


def test_cli_done_exit_0(tmp_path: Path) -> None:
    rc, out = _cli(tmp_path, "--pci", "0000:18:00.0", faults={"recovery_action": 1})
    _shape(out)
    assert rc == 0 and out["result"] == "done" and out["pci"] == GPU0
    assert out["before"]["recovery_action"] == "gpu_reset"  # type: ignore[index]
    assert out["after"]["recovery_action"] == "none"  # type: ignore[index]


def test_cli_processes_exit_2_with_pids(tmp_path: Path) -> None:
    rc, out = _cli(tmp_path, "--pci", "18:00.0", faults={"gpu_processes": {"0": [31337]}})
    _shape(out)
    assert rc == 2 and out["result"] == "cannot_run" and "pid 31337" in str(out["reason"])


def test_cli_failed_reset_exit_1(tmp_path: Path) -> None:
    smi = _script(tmp_path / "nvidia-smi", "echo 'Unable to reset this GPU'\nexit 255\n")
    rc, out = _cli(tmp_path, "--pci", GPU0, "--nvidia-smi", smi, faults={"recovery_action": 1})
    _shape(out)
    assert rc == 1 and out["result"] == "failed" and "rc=255" in str(out["reason"])


def test_cli_not_back_exit_1(tmp_path: Path) -> None:
    rc, out = _cli(tmp_path, "--pci", GPU0, faults={"reset_outcome": "lost"})
    assert rc == 1 and out["after"] == {} and "did not come back" in str(out["reason"])


def test_cli_mig_and_unknown_pci_exit_2(tmp_path: Path) -> None:
    rc, out = _cli(tmp_path, "--pci", GPU0, faults={"mig_gpus": [0]})
    assert rc == 2 and str(out["reason"]).startswith("mig: MIG mode enabled")
    rc, out = _cli(tmp_path, "--pci", "c6:00.0")
    assert rc == 2 and "no GPU at 0000:c6:00" in str(out["reason"])


def test_cli_dry_run_exit_0(tmp_path: Path) -> None:
    rc, out = _cli(tmp_path, "--pci", GPU0, "--dry-run", faults={"recovery_action": 1})
    _shape(out)
    assert rc == 0 and out["result"] == "ready" and out["after"] == {}


@pytest.mark.parametrize(("args", "faults", "needle"), [
    (["--backend", "cuda"], None, "--backend: must be 'nvml' or 'simulated', got 'cuda'"),
    ([], {"reset_outcom": "clears"}, "unknown field(s) ['reset_outcom']"),
    ([], {"reset_outcome": "maybe"}, "reset_outcome must be one of"),
    (["--wait-timeout", "-1"], None, "--wait-timeout: must be >= 0"),
])
def test_cli_bad_arguments_exit_2_naming_them(tmp_path: Path, args: list[str],
                                              faults: dict[str, object] | None,
                                              needle: str) -> None:
    rc, out = _cli(tmp_path, "--pci", GPU0, *args, faults=faults)
    _shape(out)
    checks = out["checks"]
    assert rc == 2 and out["result"] == "cannot_run"
    assert [(c["name"], c["ok"]) for c in checks] == [("arguments", False)]  # type: ignore[union-attr]
    assert needle in str(out["reason"])
