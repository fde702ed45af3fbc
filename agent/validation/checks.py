"""The checks of the validation suite: GPU health, DCGM diagnostics, NCCL, InfiniBand, storage.

Each check returns a :class:`CheckResult`: ``passed`` / ``failed`` with numbers and units,
or ``skipped`` when it cannot run here (tool absent, nothing configured). A check never
reports ``passed`` for something it did not measure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from agent.config import ConfigError
from agent.nvml import (
    THROTTLE_HARDWARE_MASK,
    BackendUnavailable,
    GpuBackend,
    GpuSample,
    NvmlBackend,
    SampleError,
    SimFaults,
    SimulatedBackend,
    make_backend,
)
from agent.validation.config import SuiteConfig, load_sim_faults
from agent.validation.result import FAILED, PASSED, SKIPPED, CheckResult, clip_log

#: Sample attempts before the GPU check gives up on a flaky NVML read.
GPU_SAMPLE_ATTEMPTS = 3
#: Extra simulated-fault key (not a SimFaults field): retired pages pending on GPU 0.
SIM_RETIRED_PAGES = "retired_pages_pending"
#: Throttle-reason names (nvml.h NVML_CLOCKS_EVENT_REASON_*), for the log.
_THROTTLE_NAMES = {0x8: "HW_SLOWDOWN", 0x20: "SW_THERMAL", 0x40: "HW_THERMAL",
                   0x80: "HW_POWER_BRAKE"}


# --------------------------------------------------------------------------------------
# GPU (NVML)
# --------------------------------------------------------------------------------------


def build_backend(cfg: SuiteConfig, machine: str) -> tuple[GpuBackend, dict[str, Any]]:
    """The configured backend; for ``simulated``, with the injected faults applied.

    Returns ``(backend, extra_faults)``; ``extra_faults`` holds keys that are not
    :class:`SimFaults` fields (``retired_pages_pending``). Raises :class:`ConfigError` on an
    unknown fault field.
    """
    backend = make_backend(cfg.backend, gpu_count=cfg.sim_gpu_count, seed=7)
    extra: dict[str, Any] = {}
    if isinstance(backend, SimulatedBackend):
        faults = load_sim_faults(cfg.sim_faults_file, machine)
        known = {f.name for f in fields(SimFaults)}
        sim = {k: v for k, v in faults.items() if k in known}
        extra = {k: v for k, v in faults.items() if k not in known}
        unknown = set(extra) - {SIM_RETIRED_PAGES}
        if unknown:
            raise ConfigError(
                f"sim_faults_file: unknown fault field(s) {sorted(unknown)} "
                f"(known: {sorted(known | {SIM_RETIRED_PAGES})})"
            )
        try:
            backend.faults = replace(SimFaults(), **sim)
        except TypeError as exc:
            raise ConfigError(f"sim_faults_file: {exc}") from exc
    return backend, extra


def _retired_pages_pending(backend: GpuBackend, extra: dict[str, Any], count: int) -> list[int]:
    """GPU indices with retired pages pending a reset (empty where unsupported).

    NVML: ``nvmlDeviceGetRetiredPagesPendingStatus`` (pre-Ampere parts; Ampere and later
    use row remapping and answer NotSupported, which counts as "none pending").
    """
    if isinstance(backend, SimulatedBackend):
        return [0] if extra.get(SIM_RETIRED_PAGES) and count > 0 else []
    if isinstance(backend, NvmlBackend):
        try:
            import pynvml
        except ImportError:  # pragma: no cover - declared dependency
            return []
        out: list[int] = []
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h):
                    out.append(i)
            except pynvml.NVMLError:
                continue
        return out
    return []


def _gpu_line(s: GpuSample) -> str:
    throttles = [n for bit, n in _THROTTLE_NAMES.items() if s.throttle_reasons & bit]
    return (
        f"gpu{s.index} pci={s.pci} uuid={s.uuid} "
        f"temp_c={'n/a' if s.temperature_c is None else f'{s.temperature_c:.1f}'} "
        f"sm_mhz={s.sm_clock_mhz:.0f}/{s.sm_clock_max_mhz:.0f} "
        f"ecc_uncorrectable={s.ecc_uncorrectable_volatile} "
        f"remap_pending={s.remapped_rows_pending} remap_failure={s.remapped_rows_failure} "
        f"hw_throttle={'|'.join(throttles) or 'none'}"
    )


def check_gpu(cfg: SuiteConfig, machine: str, backend: GpuBackend | None = None) -> CheckResult:
    """Device count vs expected, ECC uncorrectable, remapped rows pending/failure, retired
    pages pending, hardware clock throttling and temperature, from the NVML backend.

    ``skipped`` when the backend cannot start or never gives a sample; ``failed`` listing
    every problem otherwise found. Measurements: ``gpu_count``, ``expected_gpus``,
    ``ecc_uncorrectable_count``, ``remap_pending_gpus``, ``remap_failure_gpus``,
    ``retired_pages_pending_gpus``, ``hw_throttled_gpus``, ``temperature_max_c``.
    """
    extra: dict[str, Any] = {}
    if backend is None:
        backend, extra = build_backend(cfg, machine)
    try:
        backend.open()
    except BackendUnavailable as exc:
        return CheckResult("gpu", SKIPPED, f"GPU backend {backend.name} unavailable: {exc}")
    try:
        samples: list[GpuSample] | None = None
        errors: list[str] = []
        for _ in range(GPU_SAMPLE_ATTEMPTS):
            try:
                samples = backend.sample()
                break
            except SampleError as exc:
                errors.append(str(exc))
                time.sleep(0.2)
        if samples is None:
            return CheckResult(
                "gpu", SKIPPED, f"no GPU sample after {GPU_SAMPLE_ATTEMPTS} attempts",
                log="\n".join(errors),
            )
        retired = _retired_pages_pending(backend, extra, len(samples))
    finally:
        backend.close()

    problems: list[str] = []
    count = len(samples)
    m: dict[str, float] = {"gpu_count": float(count)}
    if cfg.expected_gpus is not None:
        m["expected_gpus"] = float(cfg.expected_gpus)
        if count != cfg.expected_gpus:
            problems.append(f"{count} GPUs visible, {cfg.expected_gpus} expected")
    ecc = sum(s.ecc_uncorrectable_volatile or 0 for s in samples)
    pending = [s.index for s in samples if s.remapped_rows_pending]
    failure = [s.index for s in samples if s.remapped_rows_failure]
    throttled = [s.index for s in samples if s.throttle_reasons & THROTTLE_HARDWARE_MASK]
    temps = [s.temperature_c for s in samples if s.temperature_c is not None]
    hot = [s.index for s in samples if (s.temperature_c or 0.0) > cfg.max_temperature_c]
    m.update(
        ecc_uncorrectable_count=float(ecc),
        remap_pending_gpus=float(len(pending)),
        remap_failure_gpus=float(len(failure)),
        retired_pages_pending_gpus=float(len(retired)),
        hw_throttled_gpus=float(len(throttled)),
    )
    if temps:
        m["temperature_max_c"] = round(max(temps), 1)
    if ecc:
        problems.append(f"{ecc} uncorrectable ECC errors (volatile)")
    if failure:
        problems.append(f"row-remapping failure on GPU {failure}")
    if pending:
        problems.append(f"row remap pending (reset needed) on GPU {pending}")
    if retired:
        problems.append(f"retired pages pending on GPU {retired}")
    if throttled:
        problems.append(f"hardware clock throttling on GPU {throttled}")
    if hot:
        problems.append(f"temperature above {cfg.max_temperature_c} °C on GPU {hot}")
    log = "\n".join(_gpu_line(s) for s in samples)
    if count == 0 and cfg.expected_gpus is None:
        return CheckResult("gpu", SKIPPED, "no GPU visible and none expected", m, log)
    if problems:
        return CheckResult("gpu", FAILED, "; ".join(problems), m, log)
    return CheckResult("gpu", PASSED, f"{count} GPUs healthy", m, log)


# --------------------------------------------------------------------------------------
# external tools
# --------------------------------------------------------------------------------------


def _run_tool(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run a tool; ``(returncode, combined output)``; returncode ``None`` on timeout."""
    try:
        cp = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
        return None, out + f"\n(timed out after {timeout_s:.0f} s)"
    return cp.returncode, cp.stdout + (("\n" + cp.stderr) if cp.stderr else "")


def parse_dcgm_json(text: str) -> dict[str, int]:
    """Count test results by status in ``dcgmi diag -j`` output.

    Walks the JSON for objects with a ``status`` (DCGM 2.x/3.x nest them under
    ``test_categories[].tests[].results[]``); returns e.g. ``{"pass": 12, "fail": 1,
    "skip": 3, "warn": 0}``. Raises ``ValueError`` when ``text`` holds no JSON object.
    """
    start = text.find("{")
    if start < 0:
        raise ValueError("dcgmi output: no JSON object found")
    data = json.loads(text[start:text.rfind("}") + 1])
    counts = {"pass": 0, "fail": 0, "skip": 0, "warn": 0}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            status = node.get("status")
            if isinstance(status, str):
                key = status.strip().lower()
                key = {"passed": "pass", "failed": "fail", "skipped": "skip",
                       "warning": "warn", "not run": "skip"}.get(key, key)
                if key in counts:
                    counts[key] += 1
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    return counts


def check_dcgm(cfg: SuiteConfig) -> CheckResult:
    """``dcgmi diag -r LEVEL -j`` when DCGM is installed; ``skipped`` otherwise.

    Fails on any test with status Fail or a non-zero exit. Measurements: ``level``,
    ``tests_passed_count``, ``tests_failed_count``, ``tests_skipped_count``,
    ``tests_warned_count``, ``duration_s``.
    """
    exe = shutil.which(cfg.dcgmi_path)
    if exe is None:
        return CheckResult("dcgm", SKIPPED, f"{cfg.dcgmi_path} not installed (DCGM absent)")
    t0 = time.monotonic()
    rc, out = _run_tool([exe, "diag", "-r", str(cfg.dcgm_level), "-j"], cfg.tool_timeout_s)
    m: dict[str, float] = {"level": float(cfg.dcgm_level),
                           "duration_s": round(time.monotonic() - t0, 3)}
    log = clip_log(out, cfg.max_log_chars)
    if rc is None:
        return CheckResult("dcgm", FAILED, "dcgmi diag timed out", m, log)
    try:
        counts = parse_dcgm_json(out)
    except ValueError as exc:
        if rc == 0:
            return CheckResult("dcgm", SKIPPED, f"dcgmi diag gave no result: {exc}", m, log)
        return CheckResult("dcgm", FAILED, f"dcgmi diag rc={rc}: {exc}", m, log)
    m.update(
        tests_passed_count=float(counts["pass"]), tests_failed_count=float(counts["fail"]),
        tests_skipped_count=float(counts["skip"]), tests_warned_count=float(counts["warn"]),
    )
    if counts["fail"] or rc != 0:
        return CheckResult(
            "dcgm", FAILED, f"dcgmi diag -r {cfg.dcgm_level}: {counts['fail']} failed (rc={rc})",
            m, log,
        )
    if counts["pass"] == 0:
        return CheckResult("dcgm", SKIPPED, "dcgmi diag ran no test", m, log)
    return CheckResult("dcgm", PASSED, f"dcgmi diag -r {cfg.dcgm_level}: {counts['pass']} passed",
                       m, log)


_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_WRONG = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")


def parse_nccl_output(text: str) -> dict[str, float]:
    """Figures from nccl-tests output: ``avg_busbw_gbps``, ``max_busbw_gbps`` (largest
    out-of-place busbw of the size table), ``wrong_count`` (sum of the ``#wrong`` columns
    plus "Out of bounds values"). Raises ``ValueError`` when no average line is present.
    """
    avg = _AVG_BUSBW.search(text)
    if avg is None:
        raise ValueError("nccl-tests output: no '# Avg bus bandwidth' line")
    busbw: list[float] = []
    wrong = 0
    for line in text.splitlines():
        parts = line.split()
        # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
        if len(parts) >= 13 and parts[0].isdigit():
            try:
                busbw.append(float(parts[7]))
                for w in (parts[8], parts[12]):
                    if w.isdigit():
                        wrong += int(w)
            except ValueError:
                continue
    oob = _WRONG.search(text)
    if oob:
        wrong += int(oob.group(1))
    out = {"avg_busbw_gbps": float(avg.group(1)), "wrong_count": float(wrong)}
    if busbw:
        out["max_busbw_gbps"] = max(busbw)
    return out


def check_nccl(cfg: SuiteConfig, gpu_count: int | None) -> CheckResult:
    """``all_reduce_perf`` (nccl-tests) across the node's GPUs when installed.

    Fails on a non-zero exit, wrong results, or an average bus bandwidth under
    ``nccl_min_busbw_gbps``. Measurements: ``avg_busbw_gbps``, ``max_busbw_gbps``,
    ``wrong_count``, ``min_busbw_gbps`` (the floor, when set), ``duration_s``.
    """
    exe = shutil.which(cfg.nccl_binary)
    if exe is None:
        return CheckResult("nccl", SKIPPED, f"{cfg.nccl_binary} not installed (nccl-tests absent)")
    if not gpu_count:
        return CheckResult("nccl", SKIPPED, "no GPU visible to run NCCL on")
    args = [a.replace("{gpus}", str(gpu_count)) for a in cfg.nccl_args]
    t0 = time.monotonic()
    rc, out = _run_tool([exe, *args], cfg.tool_timeout_s)
    m: dict[str, float] = {"duration_s": round(time.monotonic() - t0, 3)}
    log = clip_log(out, cfg.max_log_chars)
    if rc is None:
        return CheckResult("nccl", FAILED, "all_reduce_perf timed out", m, log)
    try:
        m.update(parse_nccl_output(out))
    except ValueError as exc:
        return CheckResult("nccl", FAILED, f"all_reduce_perf rc={rc}: {exc}", m, log)
    problems = []
    if rc != 0:
        problems.append(f"exit code {rc}")
    if m["wrong_count"]:
        problems.append(f"{m['wrong_count']:.0f} wrong results")
    if cfg.nccl_min_busbw_gbps is not None:
        m["min_busbw_gbps"] = cfg.nccl_min_busbw_gbps
        if m["avg_busbw_gbps"] < cfg.nccl_min_busbw_gbps:
            problems.append(
                f"avg bus bandwidth {m['avg_busbw_gbps']:.1f} GB/s < floor "
                f"{cfg.nccl_min_busbw_gbps:.1f} GB/s"
            )
    if problems:
        return CheckResult("nccl", FAILED, "all_reduce_perf: " + "; ".join(problems), m, log)
    return CheckResult("nccl", PASSED, f"avg bus bandwidth {m['avg_busbw_gbps']:.1f} GB/s", m, log)


# --------------------------------------------------------------------------------------
# InfiniBand
# --------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def parse_ib_rate(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` → 400.0 (Gb/s); ``None`` when unparsable."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def read_ib_ports(root: str | Path) -> list[dict[str, Any]]:
    """Every port under the sysfs root: ``device``, ``port``, ``state`` (e.g. ``ACTIVE``),
    ``phys_state`` (e.g. ``LinkUp``), ``rate_gbps``, ``link_layer``."""
    base = Path(root)
    out: list[dict[str, Any]] = []
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: p.name):
            state = _read(port / "state")
            phys = _read(port / "phys_state")
            out.append({
                "device": dev.name,
                "port": port.name,
                "state": state.split(":", 1)[-1].strip() if state else "UNKNOWN",
                "phys_state": phys.split(":", 1)[-1].strip() if phys else "UNKNOWN",
                "rate_gbps": parse_ib_rate(_read(port / "rate")),
                "link_layer": _read(port / "link_layer") or "InfiniBand",
            })
    return out


def _ib_loopback(cfg: SuiteConfig, device: str) -> tuple[float | None, str]:
    """Loopback ``ib_write_bw`` (server and client on this host); (Gb/s, log)."""
    exe = shutil.which(cfg.ib_write_bw)
    if exe is None:
        return None, f"{cfg.ib_write_bw} not installed"
    server = subprocess.Popen(
        [exe, "-d", device, "--report_gbits", "-F"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    try:
        time.sleep(1.0)  # the server must listen before the client connects
        rc, out = _run_tool([exe, "-d", device, "--report_gbits", "-F", "127.0.0.1"],
                            min(cfg.tool_timeout_s, 120.0))
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.kill()
        server.wait(5)
    for line in out.splitlines():
        parts = line.split()
        # #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]
        if len(parts) >= 4 and parts[0].isdigit():
            try:
                return float(parts[3]), out
            except ValueError:
                continue
    return None, out + f"\n(rc={rc}: no bandwidth line)"


def check_infiniband(cfg: SuiteConfig) -> CheckResult:
    """Port state and rate from sysfs (``/sys/class/infiniband/*/ports/*``), plus an
    optional loopback ``ib_write_bw``.

    ``skipped`` when the node has no IB device and none is expected; ``failed`` when a
    port is not ACTIVE/LinkUp, fewer ports than ``ib_expected_ports`` are active, a rate
    is under ``ib_min_rate_gbps`` or loopback bandwidth under ``ib_min_loopback_gbps``.
    Measurements: ``ports_count``, ``active_ports_count``, ``min_rate_gbps``,
    ``loopback_min_gbps`` (when run).
    """
    ports = read_ib_ports(cfg.ib_root)
    if not ports:
        if cfg.ib_expected_ports:
            return CheckResult(
                "infiniband", FAILED,
                f"no InfiniBand port under {cfg.ib_root}, {cfg.ib_expected_ports} expected",
                {"ports_count": 0.0, "expected_ports_count": float(cfg.ib_expected_ports)},
            )
        return CheckResult("infiniband", SKIPPED, f"no InfiniBand device under {cfg.ib_root}")
    problems: list[str] = []
    active = [p for p in ports if p["state"] == "ACTIVE" and p["phys_state"] == "LinkUp"]
    for p in ports:
        if p not in active:
            problems.append(f"{p['device']}/{p['port']} {p['state']}/{p['phys_state']}")
    rates = [p["rate_gbps"] for p in active if p["rate_gbps"] is not None]
    m: dict[str, float] = {
        "ports_count": float(len(ports)), "active_ports_count": float(len(active)),
    }
    if rates:
        m["min_rate_gbps"] = min(rates)
    if cfg.ib_expected_ports is not None:
        m["expected_ports_count"] = float(cfg.ib_expected_ports)
        if len(active) < cfg.ib_expected_ports:
            problems.append(f"{len(active)} active ports, {cfg.ib_expected_ports} expected")
    if cfg.ib_min_rate_gbps is not None:
        slow = [f"{p['device']}/{p['port']}={p['rate_gbps']}" for p in active
                if (p["rate_gbps"] or 0.0) < cfg.ib_min_rate_gbps]
        if slow:
            problems.append(f"rate under {cfg.ib_min_rate_gbps} Gb/s: {', '.join(slow)}")
    log_lines = [
        f"{p['device']}/{p['port']} state={p['state']} phys={p['phys_state']} "
        f"rate_gbps={p['rate_gbps']} link_layer={p['link_layer']}" for p in ports
    ]
    if cfg.ib_loopback:
        bws: list[float] = []
        for dev in sorted({p["device"] for p in active}):
            bw, out = _ib_loopback(cfg, dev)
            log_lines.append(f"-- ib_write_bw {dev}: {bw} Gb/s\n{out[-1000:]}")
            if bw is not None:
                bws.append(bw)
        if bws:
            m["loopback_min_gbps"] = min(bws)
            if cfg.ib_min_loopback_gbps is not None and min(bws) < cfg.ib_min_loopback_gbps:
                problems.append(
                    f"loopback bandwidth {min(bws):.1f} Gb/s < {cfg.ib_min_loopback_gbps} Gb/s"
                )
    log = clip_log("\n".join(log_lines), cfg.max_log_chars)
    if problems:
        return CheckResult("infiniband", FAILED, "; ".join(problems), m, log)
    return CheckResult("infiniband", PASSED, f"{len(active)} ports active", m, log)


# --------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------

_BLOCK = 1024 * 1024


def _storage_one(path: Path, nbytes: int) -> dict[str, float]:
    """Write ``nbytes`` (1 MiB blocks) + fsync, drop the file's cache, read back, compare.

    Returns ``write_mb_per_s``, ``read_mb_per_s``, ``fsync_s``, ``verified`` (1.0/0.0).
    Raises ``OSError`` from the filesystem (read-only, full, missing).
    """
    target = path / f".autorepair-validate-{uuid.uuid4().hex[:8]}"
    block = os.urandom(_BLOCK)
    digest = hashlib.sha256()
    try:
        t0 = time.perf_counter()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            written = 0
            while written < nbytes:
                chunk = block[: min(_BLOCK, nbytes - written)]
                os.write(fd, chunk)
                digest.update(chunk)
                written += len(chunk)
            t1 = time.perf_counter()
            os.fsync(fd)
            t2 = time.perf_counter()
        finally:
            os.close(fd)
        fd = os.open(target, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            check = hashlib.sha256()
            t3 = time.perf_counter()
            while True:
                data = os.read(fd, _BLOCK)
                if not data:
                    break
                check.update(data)
            t4 = time.perf_counter()
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            target.unlink()
    mb = nbytes / 1e6
    return {
        "write_mb_per_s": round(mb / max(t2 - t0, 1e-9), 1),
        "read_mb_per_s": round(mb / max(t4 - t3, 1e-9), 1),
        "fsync_s": round(t2 - t1, 4),
        "verified": 1.0 if check.digest() == digest.digest() else 0.0,
    }


def check_storage(cfg: SuiteConfig) -> CheckResult:
    """Write / fsync / read-back / compare on each configured scratch path.

    ``skipped`` when no path is configured; ``failed`` when a path is missing or not
    writable (read-only filesystem, full disk), the data read back differs, or write /
    read throughput is under the floors (MB/s = 10^6 bytes/s). Measurements per path
    index ``i``: ``path{i}_write_mb_per_s``, ``path{i}_read_mb_per_s``, ``path{i}_fsync_s``,
    plus ``min_write_mb_per_s`` and ``min_read_mb_per_s`` over all paths.
    """
    if not cfg.storage_paths:
        return CheckResult("storage", SKIPPED, "no scratch path configured (storage_paths)")
    problems: list[str] = []
    m: dict[str, float] = {"bytes_per_path": float(cfg.storage_bytes)}
    lines: list[str] = []
    writes: list[float] = []
    reads: list[float] = []
    for i, raw in enumerate(cfg.storage_paths):
        path = Path(raw)
        if not path.is_dir():
            problems.append(f"{raw}: not a directory / not mounted")
            lines.append(f"path{i}={raw} missing")
            continue
        try:
            r = _storage_one(path, cfg.storage_bytes)
        except OSError as exc:
            problems.append(f"{raw}: {exc.strerror or exc}")
            lines.append(f"path{i}={raw} error={exc!r}")
            continue
        for k, v in r.items():
            if k != "verified":
                m[f"path{i}_{k}"] = v
        writes.append(r["write_mb_per_s"])
        reads.append(r["read_mb_per_s"])
        lines.append(f"path{i}={raw} " + " ".join(f"{k}={v}" for k, v in r.items()))
        if not r["verified"]:
            problems.append(f"{raw}: data read back differs from data written")
        if r["write_mb_per_s"] < cfg.storage_min_write_mbps:
            problems.append(f"{raw}: write {r['write_mb_per_s']} MB/s < "
                            f"{cfg.storage_min_write_mbps} MB/s")
        if r["read_mb_per_s"] < cfg.storage_min_read_mbps:
            problems.append(f"{raw}: read {r['read_mb_per_s']} MB/s < "
                            f"{cfg.storage_min_read_mbps} MB/s")
    if writes:
        m["min_write_mb_per_s"] = min(writes)
        m["min_read_mb_per_s"] = min(reads)
    log = "\n".join(lines)
    if problems:
        return CheckResult("storage", FAILED, "; ".join(problems), m, log)
    return CheckResult(
        "storage", PASSED,
        f"{len(writes)} path(s): write >= {min(writes)} MB/s, read >= {min(reads)} MB/s", m, log,
    )
