"""Unit tests of the local validation suite (``autorepair-agent validate``): each check
passes, fails or is skipped with numbers and units; a check that cannot run never
reports ``passed``; verdict and exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import ConfigError
from agent.nvml import BackendUnavailable, NvmlBackend, SimFaults, SimulatedBackend
from agent.validation import (
    ABORTED,
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    SuiteConfig,
    decide,
    run_suite,
)
from agent.validation.checks import (
    check_dcgm,
    check_gpu,
    check_infiniband,
    check_nccl,
    check_storage,
    parse_dcgm_json,
    parse_ib_rate,
    parse_nccl_output,
)

ROOT = Path(__file__).resolve().parents[2]


def _sim(**faults: object) -> SimulatedBackend:
    b = SimulatedBackend(gpu_count=8, seed=1)
    b.faults = SimFaults(**faults)  # type: ignore[arg-type]
    return b


# ---- GPU ---------------------------------------------------------------------------


def test_gpu_healthy_passes_with_numbers() -> None:
    r = check_gpu(SuiteConfig(backend="simulated", expected_gpus=8), "m", _sim())
    assert r.outcome == PASSED
    assert r.measurements["gpu_count"] == 8.0 and r.measurements["expected_gpus"] == 8.0
    assert 0 < r.measurements["temperature_max_c"] < 85
    assert r.log.count("\n") == 7  # one line per GPU


@pytest.mark.parametrize(
    ("faults", "needle", "key"),
    [
        ({"remap_failure": True}, "row-remapping failure", "remap_failure_gpus"),
        ({"remap_pending": True}, "row remap pending", "remap_pending_gpus"),
        ({"ecc_uncorrectable": 3}, "3 uncorrectable ECC", "ecc_uncorrectable_count"),
        ({"slow_factor": 0.5}, "hardware clock throttling", "hw_throttled_gpus"),
    ],
)
def test_gpu_faults_fail(faults: dict[str, object], needle: str, key: str) -> None:
    r = check_gpu(SuiteConfig(backend="simulated"), "m", _sim(**faults))
    assert r.outcome == FAILED and needle in r.detail
    assert r.measurements[key] >= 1.0


def test_gpu_count_mismatch_fails() -> None:
    r = check_gpu(SuiteConfig(backend="simulated", expected_gpus=8), "m", _sim(lost_gpus=1))
    assert r.outcome == FAILED and "7 GPUs visible, 8 expected" in r.detail


def test_gpu_temperature_over_limit_fails() -> None:
    r = check_gpu(SuiteConfig(backend="simulated", max_temperature_c=30.0), "m", _sim())
    assert r.outcome == FAILED and "temperature above 30.0" in r.detail


def test_gpu_unreadable_is_skipped_not_passed() -> None:
    r = check_gpu(SuiteConfig(backend="simulated"), "m", _sim(fail_reads=10))
    assert r.outcome == SKIPPED and "no GPU sample" in r.detail


def test_gpu_nvml_absent_is_skipped() -> None:
    try:
        NvmlBackend().open()
    except BackendUnavailable:
        pass
    else:  # pragma: no cover - only on a GPU host
        pytest.skip("NVML is present here")
    r = check_gpu(SuiteConfig(backend="nvml"), "m")
    assert r.outcome == SKIPPED and "unavailable" in r.detail


def test_sim_faults_file_and_retired_pages(tmp_path: Path) -> None:
    (tmp_path / "gpu-07.json").write_text(json.dumps({"retired_pages_pending": True}))
    cfg = SuiteConfig(backend="simulated", sim_faults_file=str(tmp_path / "{node}.json"))
    r = check_gpu(cfg, "gpu-07")
    assert r.outcome == FAILED and r.measurements["retired_pages_pending_gpus"] == 1.0
    assert check_gpu(cfg, "gpu-08").outcome == PASSED  # no file: no fault
    (tmp_path / "gpu-07.json").write_text(json.dumps({"melted": True}))
    with pytest.raises(ConfigError, match="melted"):
        check_gpu(cfg, "gpu-07")


# ---- tools absent / present ---------------------------------------------------------


def test_dcgm_and_nccl_absent_are_skipped() -> None:
    cfg = SuiteConfig(dcgmi_path="no-such-dcgmi", nccl_binary="no-such-all_reduce_perf")
    assert check_dcgm(cfg).outcome == SKIPPED
    assert check_nccl(cfg, 8).outcome == SKIPPED


def _tool(tmp_path: Path, name: str, output: str, rc: int = 0) -> str:
    body = tmp_path / f"{name}.out"
    body.write_text(output)
    exe = tmp_path / name
    exe.write_text(f"#!/bin/sh\ncat {body}\nexit {rc}\n")
    exe.chmod(0o755)
    return str(exe)


DCGM_JSON = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
    {"category": "Hardware", "tests": [{"name": "Memory", "results": [
        {"gpu_ids": "0", "status": "Fail", "warnings": [{"warning": "DBE"}]},
        {"gpu_ids": "1", "status": "Pass"}]}]},
]}}


def test_dcgm_parse_and_fail(tmp_path: Path) -> None:
    assert parse_dcgm_json(json.dumps(DCGM_JSON)) == {"pass": 2, "fail": 1, "skip": 0, "warn": 0}
    exe = _tool(tmp_path, "dcgmi", json.dumps(DCGM_JSON), rc=226)
    r = check_dcgm(SuiteConfig(dcgmi_path=exe, dcgm_level=2))
    assert r.outcome == FAILED and r.measurements["tests_failed_count"] == 1.0
    assert r.measurements["level"] == 2.0


NCCL_OUT = """#  Rank  0 Group  0 Pid 1 on node1 device  0 [0x18] NVIDIA H100
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     8388608       2097152     float     sum      -1    120.1   69.85  122.24      0    119.8   70.02  122.54      0
  1073741824     268435456     float     sum      -1   2641.0  406.56  711.48      0   2639.9  406.73  711.78      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 416.863
"""


def test_nccl_parse_and_floor(tmp_path: Path) -> None:
    m = parse_nccl_output(NCCL_OUT)
    assert m == {"avg_busbw_gbps": 416.863, "wrong_count": 0.0, "max_busbw_gbps": 711.48}
    exe = _tool(tmp_path, "all_reduce_perf", NCCL_OUT)
    ok = check_nccl(SuiteConfig(nccl_binary=exe, nccl_min_busbw_gbps=300.0), 8)
    assert ok.outcome == PASSED and ok.measurements["min_busbw_gbps"] == 300.0
    low = check_nccl(SuiteConfig(nccl_binary=exe, nccl_min_busbw_gbps=450.0), 8)
    assert low.outcome == FAILED and "< floor 450.0 GB/s" in low.detail
    assert check_nccl(SuiteConfig(nccl_binary=exe), None).outcome == SKIPPED


# ---- InfiniBand (a sysfs tree in the kernel's format) -------------------------------


def _ib_port(root: Path, dev: str, port: int, state: str, phys: str, rate: str) -> None:
    p = root / dev / "ports" / str(port)
    p.mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text("InfiniBand\n")


def test_infiniband_ports(tmp_path: Path) -> None:
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == 400.0
    _ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)")
    _ib_port(tmp_path, "mlx5_1", 1, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)")
    ok = check_infiniband(SuiteConfig(ib_root=str(tmp_path), ib_expected_ports=2))
    assert ok.outcome == PASSED and ok.measurements["active_ports_count"] == 2.0
    slow = check_infiniband(SuiteConfig(ib_root=str(tmp_path), ib_min_rate_gbps=400.0))
    assert slow.outcome == FAILED and "mlx5_1/1=200.0" in slow.detail
    _ib_port(tmp_path, "mlx5_2", 1, "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)")
    down = check_infiniband(SuiteConfig(ib_root=str(tmp_path)))
    assert down.outcome == FAILED and "mlx5_2/1 DOWN/Disabled" in down.detail
    assert down.measurements["min_rate_gbps"] == 200.0


def test_infiniband_absent_skipped_or_failed(tmp_path: Path) -> None:
    none = tmp_path / "none"
    assert check_infiniband(SuiteConfig(ib_root=str(none))).outcome == SKIPPED
    r = check_infiniband(SuiteConfig(ib_root=str(none), ib_expected_ports=4))
    assert r.outcome == FAILED and r.measurements["expected_ports_count"] == 4.0


# ---- storage ------------------------------------------------------------------------


def test_storage_measures_and_floors(tmp_path: Path) -> None:
    cfg = SuiteConfig(storage_paths=(str(tmp_path),), storage_bytes=2 * 1024 * 1024,
                      storage_min_write_mbps=0.001, storage_min_read_mbps=0.001)
    r = check_storage(cfg)
    assert r.outcome == PASSED
    assert r.measurements["path0_write_mb_per_s"] > 0 and r.measurements["path0_fsync_s"] >= 0
    assert list(tmp_path.iterdir()) == []  # the test file is removed
    slow = check_storage(SuiteConfig(storage_paths=(str(tmp_path),), storage_bytes=1024 * 1024,
                                     storage_min_write_mbps=1e9))
    assert slow.outcome == FAILED and "write" in slow.detail and "MB/s" in slow.detail


def test_storage_missing_or_readonly_fails(tmp_path: Path) -> None:
    r = check_storage(SuiteConfig(storage_paths=(str(tmp_path / "nope"),)))
    assert r.outcome == FAILED and "not a directory" in r.detail
    assert check_storage(SuiteConfig()).outcome == SKIPPED
    if os.geteuid() != 0:  # root ignores directory permissions
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert check_storage(SuiteConfig(storage_paths=(str(ro),))).outcome == FAILED


# ---- verdict ------------------------------------------------------------------------


def test_verdict_rules() -> None:
    p = CheckResult("gpu", PASSED)
    s = CheckResult("nccl", SKIPPED, "absent")
    f = CheckResult("storage", FAILED, "slow")
    assert decide("m", [p, s], ("gpu",)).verdict == PASSED
    assert decide("m", [p, s, f], ("gpu",)).verdict == FAILED
    assert decide("m", [CheckResult("gpu", SKIPPED, "no NVML"), s], ("gpu",)).verdict == ABORTED
    assert decide("m", [s], ()).verdict == ABORTED  # nothing ran: never passed
    assert decide("m", [p], ("gpu", "storage")).verdict == ABORTED


def test_run_suite_exit_codes(tmp_path: Path) -> None:
    cfg = SuiteConfig(machine="m1", backend="simulated", storage_paths=(str(tmp_path),),
                      storage_bytes=1024 * 1024, storage_min_write_mbps=0.001,
                      storage_min_read_mbps=0.001)
    ok = run_suite(cfg, backend=_sim())
    assert (ok.verdict, ok.exit_code) == (PASSED, 0)
    bad = run_suite(cfg, backend=_sim(remap_failure=True))
    assert (bad.verdict, bad.exit_code) == (FAILED, 1) and "gpu:" in bad.reason
    aborted = run_suite(SuiteConfig(machine="m1", backend="simulated", checks=("gpu",)),
                        backend=_sim(fail_reads=10))
    assert (aborted.verdict, aborted.exit_code) == (ABORTED, 2)


def test_config_errors_name_field_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"backend: .*'gpu'"):
        SuiteConfig(backend="gpu")
    with pytest.raises(ConfigError, match=r"validation\.bogus: unknown field \(value 3\)"):
        SuiteConfig.from_mapping({"bogus": 3})
    with pytest.raises(ConfigError, match=r"checks: unknown check 'disk'"):
        SuiteConfig.from_mapping({"checks": ["disk"]})


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "agent.validation", *args], capture_output=True,
                          text=True, env=e, timeout=60, check=False)


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    cfg = tmp_path / "v.yaml"
    cfg.write_text(f"backend: simulated\nsim_faults_file: {faults}\nchecks: [gpu, dcgm]\n")
    ok = _cli("--json", "--config", str(cfg), "--machine", "gpu-09")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["machine"] == "gpu-09" and out["verdict"] == "passed"
    assert set(out["checks"][0]) == {"name", "outcome", "detail", "measurements", "log"}
    faults.write_text(json.dumps({"remap_failure": True}))
    bad = _cli("--json", "--config", str(cfg))
    assert bad.returncode == 1 and json.loads(bad.stdout)["verdict"] == "failed"
    broken = tmp_path / "broken.yaml"
    broken.write_text("backend: quantum\n")
    ab = _cli("--json", env={"AUTOREPAIR_VALIDATE_CONFIG": str(broken)})
    assert ab.returncode == 2 and "backend" in json.loads(ab.stdout)["reason"]
    table = _cli("--config", str(cfg))
    assert table.returncode == 1 and "FAILED" in table.stdout


def test_json_matches_control_plane_model(tmp_path: Path) -> None:
    from workflows.models import ValidationResult

    cfg = SuiteConfig(machine="m", backend="simulated", checks=("gpu", "nccl"))
    res = run_suite(cfg, backend=_sim())
    model = ValidationResult.model_validate(res.to_dict())
    assert model.verdict.value == PASSED and model.checks[0].measurements["gpu_count"] == 8.0
