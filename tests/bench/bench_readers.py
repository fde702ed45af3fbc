"""Reader throughput: KernelLogReader and read_text on a synthetic mixed kernel log.

Plain script (not collected by pytest): ``python tests/bench/bench_readers.py``.
Prints a table, then as the LAST line one JSON object with every figure.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.readers import KernelLogReader, read_text  # noqa: E402
from workers.classify import classify_text  # noqa: E402

NOISE = [
    "systemd[1]: Started Session {n} of user root.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
    "nvidia-persistenced: device 0000:{b:02x}:00.0 - persistence mode enabled.",
    'audit: type=1400 audit({n}.123:42): apparmor="STATUS" operation="profile_load"',
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Opts: errors=remount-ro",
    "NVRM: GPU at PCI:0000:{b:02x}:00: GPU-bc0fa0b9-cac2-f507-b715-9bebdb69c71e",
]
FAULTS = [
    "NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid={n}, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={n}, name=python, Graphics SM Warp Exception on "
    "(GPC 1, TPC 2, SM 0): Out Of Range Address",
    "nvidia-nvswitch1: SXid (PCI:0000:{b:02x}:00.0): 12028, Non-fatal, Link 32 egress error",
    "pcieport 0000:00:{b:02x}.0: AER: Corrected error received: 0000:00:1c.5",
    "mlx5_core 0000:{b:02x}:00.0 mlx5_3: Port: 1 Link DOWN",
]


def make_lines(n: int, fault_rate: float, seed: int = 7) -> list[str]:
    """``n`` prefixed kernel lines, ``fault_rate`` of them fault lines."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tmpl = rng.choice(FAULTS) if rng.random() < fault_rate else rng.choice(NOISE)
        out.append(
            f"[{i / 100:12.6f}] " + tmpl.format(n=rng.randint(1, 10**6), b=rng.randint(1, 255))
        )
    return out


def main() -> None:
    n = 200_000
    lines = make_lines(n, 0.02)
    reader = KernelLogReader()
    t0 = time.perf_counter()
    events = 0
    for line in lines:
        events += len(reader.feed(line))
    events += len(reader.flush())
    stream_s = time.perf_counter() - t0
    text = "\n".join(lines)
    t0 = time.perf_counter()
    n_text = len(read_text(text))
    text_s = time.perf_counter() - t0
    small = "\n".join(lines[:20_000])
    t0 = time.perf_counter()
    n_cls = len(classify_text(small))
    cls_s = time.perf_counter() - t0
    long_line = "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=" + "A," * 500_000
    t0 = time.perf_counter()
    read_text(long_line)
    long_ms = (time.perf_counter() - t0) * 1000
    fig = {
        "lines": n,
        "fault_rate": 0.02,
        "stream_lines_per_s": round(n / stream_s),
        "stream_events": events,
        "read_text_lines_per_s": round(n / text_s),
        "read_text_events": n_text,
        "classify_lines_per_s": round(20_000 / cls_s),
        "classify_events": n_cls,
        "one_mib_line_ms": round(long_ms, 2),
    }
    print(f"{'figure':<24}{'value':>14}")
    for k, v in fig.items():
        print(f"{k:<24}{v:>14}")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
