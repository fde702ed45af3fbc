"""``python -m tests.model [--depth N] [--defect NAME ...]`` (``make model-check DEPTH=N``).

Prints each violation with its shortest event trace, then the last line
``states=… transitions=… depth=… violations=… seconds=…``; exit 1 on a violation."""

from __future__ import annotations

import argparse
import sys

from tests.model.checker import check
from workflows.lifecycle.machine_action import DEFECTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    ap.add_argument("--depth", type=int, default=8, help="longest event sequence (default 8)")
    ap.add_argument("--defect", action="append", default=[], choices=sorted(DEFECTS),
                    help="re-introduce a known defect (test-only; repeatable)")
    args = ap.parse_args(argv)
    if args.depth < 1:
        ap.error(f"--depth: must be at least 1 (got {args.depth})")
    res = check(args.depth, defects=frozenset(args.defect))
    shown: set[str] = set()
    for what, trace in res.violations:
        if what in shown:
            continue  # the shortest trace of each violation (BFS order) is enough
        shown.add(what)
        print(f"VIOLATION {what}\n  trace: {' -> '.join(trace)}")
    print(res.line())
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main())
