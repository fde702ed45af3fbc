"""Reader throughput: the stream (KernelLogReader), read_text and classify on a synthetic
mixed kernel log, for this tree and for round 2's reader side by side in the same run.

Plain script (not collected by pytest): ``python tests/bench/bench_readers.py [--lines N]
[--rounds R] [--baseline REF]``. Round 2's code (``agent``, ``workers``, ``workflows`` at git
ref ``REF``, default ``main``) is unpacked with ``git archive`` into a temporary directory;
each tree is measured in its own child process (``--child DIR``), the two alternating
``R`` times, best figure of each kept (the machine is shared: the best run is the least
disturbed one; times are CPU time of the child, `time.process_time`). Prints a table, then as the LAST line one JSON object with every figure
(``new``, ``baseline``, and ``ratio`` = new / baseline per lines/s figure).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
"""Round 2's fault mix: both trees read every line of it (equal work)."""
FAULTS_R3 = [
    *FAULTS,
    "mlx5_core 0000:{b:02x}:00.0: poll_health:835:(pid 0): device's health compromised - "
    "reached miss count",
    "pcieport 0000:00:{b:02x}.0: AER: Correctable error message received from 0000:41:00.0",
]
"""With round 3's new fault lines (nic_fatal, AER Correctable): round 2 skips those, so it
does less work here."""


def make_lines(
    n: int, fault_rate: float, seed: int = 7, faults: list[str] | None = None
) -> list[str]:
    """``n`` prefixed kernel lines, ``fault_rate`` of them fault lines (from ``faults``,
    default :data:`FAULTS`)."""
    rng = random.Random(seed)
    out = []
    pool = faults if faults is not None else FAULTS
    for i in range(n):
        tmpl = rng.choice(pool) if rng.random() < fault_rate else rng.choice(NOISE)
        out.append(
            f"[{i / 100:12.6f}] " + tmpl.format(n=rng.randint(1, 10**6), b=rng.randint(1, 255))
        )
    return out


MIXES = {"r2mix": FAULTS, "r3mix": FAULTS_R3}
FIGURES = tuple(
    f"{mix}_{k}"
    for mix in MIXES
    for k in ("stream_lines_per_s", "read_text_lines_per_s", "classify_lines_per_s")
)


def measure(n: int) -> dict[str, float]:
    """Figures of the tree first on ``sys.path`` for each fault mix (run in a child
    process), keys ``<mix>_<figure>``."""
    out: dict[str, float] = {}
    for mix, faults in MIXES.items():
        out.update({f"{mix}_{k}": v for k, v in _measure(n, faults).items()})
    return out


def _measure(n: int, faults: list[str]) -> dict[str, float]:
    from agent.readers import KernelLogReader, read_text
    from workers.classify import classify_text

    lines = make_lines(n, 0.02, faults=faults)
    reader = KernelLogReader()
    t0 = time.process_time()
    events = 0
    for line in lines:
        events += len(reader.feed(line))
    events += len(reader.flush())
    stream_s = time.process_time() - t0
    text = "\n".join(lines)
    t0 = time.process_time()
    n_text = len(read_text(text))
    text_s = time.process_time() - t0
    m = n // 10
    small = "\n".join(lines[:m])
    t0 = time.process_time()
    n_cls = len(classify_text(small))
    cls_s = time.process_time() - t0
    long_line = "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=" + "A," * 500_000
    t0 = time.process_time()
    read_text(long_line)
    long_ms = (time.process_time() - t0) * 1000
    return {
        "stream_lines_per_s": round(n / stream_s),
        "stream_events": events,
        "read_text_lines_per_s": round(n / text_s),
        "read_text_events": n_text,
        "classify_lines_per_s": round(m / cls_s),
        "classify_events": n_cls,
        "one_mib_line_ms": round(long_ms, 2),
    }


def _child(tree: Path, n: int) -> dict[str, float]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(tree)!r}); "
        f"sys.path.insert(1, {str(ROOT / 'tests' / 'bench')!r}); "
        f"import bench_readers as b; print(json.dumps(b.measure({n})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=tree).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _best(runs: list[dict[str, float]]) -> dict[str, float]:
    best = dict(runs[0])
    for run in runs[1:]:
        for k in FIGURES:
            best[k] = max(best[k], run[k])
        for k in best:
            if k.endswith("one_mib_line_ms"):
                best[k] = min(best[k], run[k])
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default="main", help="git ref of round 2's reader")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-r2-") as tmp:
        try:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline, "agent", "workers",
                 "workflows"],
                check=True, capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            # no git or no such ref (a tarball, a shallow CI clone): this tree alone
            print(f"baseline {args.baseline!r} unavailable ({exc}); measuring this tree only")
            run = _best([_child(ROOT, args.lines) for _ in range(args.rounds)])
            for k, v in run.items():
                print(f"{k:<32}{v:>12}")
            print(json.dumps({"lines": args.lines, "fault_rate": 0.02, "new": run}))
            return
        new_runs, old_runs = [], []
        for _ in range(args.rounds):
            old_runs.append(_child(Path(tmp), args.lines))
            new_runs.append(_child(ROOT, args.lines))
    new, old = _best(new_runs), _best(old_runs)
    ratio = {k: round(new[k] / old[k], 3) for k in FIGURES}
    print(f"{'figure':<32}{'new':>12}{args.baseline:>12}{'new/base':>10}")
    for k in new:
        print(f"{k:<32}{new[k]:>12}{old[k]:>12}{ratio.get(k, ''):>10}")
    print(json.dumps({"lines": args.lines, "fault_rate": 0.02, "baseline": old, "new": new,
                      "ratio": ratio}))


if __name__ == "__main__":
    main()
