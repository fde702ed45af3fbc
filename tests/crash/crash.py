"""Crash run: repairs on the dev stack while the worker, the ingest and PostgreSQL are
killed with SIGKILL at seeded random points and restarted (``make crash``).

Run: ``.venv/bin/python tests/crash/crash.py [--nodes 16] [--rounds 4] [--seed 1]
[--gap 6 18]``. The world, the kills and the invariants are those of
:mod:`tests.crash.world` and :mod:`tests.crash.invariants`; CI runs a small fixed-seed
slice of the same (``tests/crash/test_crash.py``).

Prints each violation, then as the last line one JSON object with the figures
(``repairs``, ``kills`` by component, ``duplicates``, ``cordoned_left``, ``violations``,
``seconds``, ...). Exit status 1 when an invariant failed or a repair did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.crash.world import KillPlan, RunSpec, run_crash


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16, help="nodes (one repair each per round)")
    ap.add_argument("--rounds", type=int, default=4, help="repairs per node, one after another")
    ap.add_argument("--seed", type=int, default=1, help="seed of the kills and request paths")
    ap.add_argument("--gap", type=float, nargs=2, default=(6.0, 18.0), metavar=("MIN", "MAX"),
                    help="seconds between kills (uniform)")
    ap.add_argument("--deadline", type=float, default=1200.0,
                    help="seconds after the first push before unfinished repairs count")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (logs)")
    args = ap.parse_args()
    if args.nodes < 1 or args.rounds < 1:
        ap.error(f"--nodes and --rounds must be >= 1, got {args.nodes} and {args.rounds}")
    spec = RunSpec(nodes=args.nodes, rounds=args.rounds, deadline_s=args.deadline,
                   kills=KillPlan(seed=args.seed, gap_s=(args.gap[0], args.gap[1])))
    tmp = tempfile.mkdtemp(prefix="autorepair-crash-")
    verdict, figures = asyncio.run(run_crash(spec, Path(tmp)))
    for line in verdict.violations:
        print("VIOLATION", line)
    if args.keep:
        print(f"data directory: {tmp}")
    print(json.dumps(figures))
    return 1 if verdict.violations or figures["unfinished"] else 0


if __name__ == "__main__":
    sys.exit(main())
