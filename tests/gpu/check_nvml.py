"""Run the agent's NVML backend on a real NVIDIA GPU for a while; print samples and score.

Usage: ``.venv/bin/python tests/gpu/check_nvml.py [--seconds 60] [--interval 2]``.
Exits 0 with ``SKIPPED: <reason>`` where no NVIDIA GPU/driver exists. Prints per sample
one line per GPU (util, SM clock/max, memory, power, temperature, throttle reasons, ECC,
remap, PCIe replays, NVLink links), the node score and state, any NVML Xid events, and
as the last line one JSON object with the figures.

``--reset-dry-run [--pci ADDR]``: instead, run the precondition checks of
``autorepair-agent reset-gpu`` (``--dry-run``) against real NVML for every GPU (or the one
at ADDR) and print each result as JSON, then a summary JSON line. Read-only: nothing is
stopped and no GPU is reset — the reset command handed to the checks refuses to run even
if called. Exercises the NVML reads a reset depends on (MIG mode, running processes,
NVLink remote device type, architecture, recovery action field, remapped rows, volatile
ECC) plus the ``/proc`` and sysfs scans.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from agent.config import ScoreConfig
from agent.gpureset import (
    NvidiaSmiResetter,
    NvmlResetDevice,
    ResetOptions,
    Systemctl,
    reset_gpu,
)
from agent.host import CpuSampler, HostReadError, memory_available_fraction
from agent.nvml import BackendUnavailable, NvmlBackend, ResetCommandResult, SampleError
from agent.score import HealthScorer


class _NeverReset(NvidiaSmiResetter):
    """The real resetter's preflight (binary found, root), but calling it is a bug."""

    def __call__(self, pci: str) -> ResetCommandResult:
        raise AssertionError(f"check_nvml --reset-dry-run must never reset ({pci})")


def reset_dry_run(pci: str | None) -> int:
    """Dry-run the reset preconditions per GPU; print results and a summary JSON line."""
    device = NvmlResetDevice()
    try:
        device.open()
        targets = [pci] if pci else [g.pci for g in device.gpus()]
    except (BackendUnavailable, SampleError) as exc:
        print(f"SKIPPED: {exc}")
        print(json.dumps({"skipped": True, "reason": str(exc)}))
        return 0
    finally:
        device.close()
    summary: dict[str, object] = {"skipped": False, "gpus": len(targets), "results": {}}
    for addr in targets:
        t0 = time.perf_counter()
        r = reset_gpu(ResetOptions(pci=addr, dry_run=True), NvmlResetDevice(),
                      _NeverReset(), Systemctl())
        print(json.dumps(r.to_dict()))
        summary["results"][addr] = {  # type: ignore[index]
            "result": r.result,
            "failed": [c.name for c in r.checks if c.ok is False],
            "not_measured": [c.name for c in r.checks if c.ok is None],
            "recovery_action": r.before.get("recovery_action"),
            "check_ms": round((time.perf_counter() - t0) * 1000, 1),
        }
    print(json.dumps(summary))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--reset-dry-run", action="store_true",
                    help="read-only dry run of reset-gpu's precondition checks")
    ap.add_argument("--pci", default=None, help="with --reset-dry-run: one GPU only")
    args = ap.parse_args()
    if args.reset_dry_run:
        return reset_dry_run(args.pci)
    backend = NvmlBackend()
    try:
        backend.open()
    except BackendUnavailable as exc:
        print(f"SKIPPED: {exc}")
        print(json.dumps({"skipped": True, "reason": str(exc)}))
        return 0
    scorer = HealthScorer(ScoreConfig(calibration_samples=5))
    cpu = CpuSampler()
    out: dict[str, object] = {"skipped": False, "samples": 0, "errors": 0, "xid_events": []}
    t_end = time.monotonic() + args.seconds
    sample_ms: list[float] = []
    try:
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            try:
                gpus = backend.sample()
            except SampleError as exc:
                print(f"sample failed: {exc}")
                out["errors"] = int(out["errors"]) + 1  # type: ignore[call-overload]
                gpus = None
            sample_ms.append((time.perf_counter() - t0) * 1000)
            try:
                c: float | None = cpu.read()
            except HostReadError:
                c = None
            try:
                m: float | None = memory_available_fraction()
            except HostReadError:
                m = None
            r = scorer.update(gpus, c, m)
            for g in gpus or []:
                print(f"gpu{g.index} {g.pci} util={g.utilization_pct:.0f}% "
                      f"sm={g.sm_clock_mhz:.0f}/{g.sm_clock_max_mhz:.0f}MHz "
                      f"mem={g.memory_used_bytes / 2**30:.1f}/{g.memory_total_bytes / 2**30:.1f}GiB "
                      f"power={g.power_w}W temp={g.temperature_c}C "
                      f"throttle=0x{g.throttle_reasons:x} ecc_ue={g.ecc_uncorrectable_volatile} "
                      f"remap_pending={g.remapped_rows_pending} "
                      f"remap_failure={g.remapped_rows_failure} replay={g.pcie_replay_count} "
                      f"nvlink={len(g.nvlink_active)}")
            sig = {k: None if v is None else round(v, 3) for k, v in r.signals.items()}
            print(f"state={r.state} score={r.score} signals={sig}")
            for x in backend.poll_xid_events():
                print(f"XID {x.xid} on {x.pci}")
                out["xid_events"].append([x.pci, x.xid])  # type: ignore[attr-defined]
            out["samples"] = int(out["samples"]) + 1  # type: ignore[call-overload]
            out |= {"gpus": len(gpus or []), "state": r.state, "score": r.score}
            time.sleep(max(0.0, args.interval - (time.perf_counter() - t0)))
    finally:
        backend.close()
    if sample_ms:
        out["sample_ms_mean"] = round(sum(sample_ms) / len(sample_ms), 2)
        out["sample_ms_max"] = round(max(sample_ms), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
