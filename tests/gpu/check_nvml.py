"""Run the agent's NVML backend on a real NVIDIA GPU for a while; print samples and score.

Usage: ``.venv/bin/python tests/gpu/check_nvml.py [--seconds 60] [--interval 2]``.
Exits 0 with ``SKIPPED: <reason>`` where no NVIDIA GPU/driver exists. Prints per sample
one line per GPU (util, SM clock/max, memory, power, temperature, throttle reasons, ECC,
remap, PCIe replays, NVLink links), the node score and state, any NVML Xid events, and
as the last line one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from agent.config import ScoreConfig
from agent.host import CpuSampler, HostReadError, memory_available_fraction
from agent.nvml import BackendUnavailable, NvmlBackend, SampleError
from agent.score import HealthScorer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=2.0)
    args = ap.parse_args()
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
