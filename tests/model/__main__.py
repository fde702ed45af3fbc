"""``python -m tests.model [--depth N] [--guard-depth N] [--defect NAME ...]``
(``make model-check DEPTH=N``).

Checks the machine action (:mod:`tests.model.checker`, to ``--depth``) and the cluster
guard (:mod:`tests.model.guard_world`, to ``--guard-depth``: its world branches wider).
Prints each violation with its shortest event trace, then the last line
``states=… transitions=… depth=… violations=… seconds=…`` (both machines summed; depth
the deeper bound); exit 1 on a violation."""

from __future__ import annotations

import argparse
import sys

from tests.model import guard_world
from tests.model.checker import check
from workflows.lifecycle import guard as gm
from workflows.lifecycle.machine_action import DEFECTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    ap.add_argument("--depth", type=int, default=8, help="longest event sequence (default 8)")
    ap.add_argument("--guard-depth", type=int, default=5,
                    help="longest event sequence for the guard (default 5)")
    ap.add_argument("--defect", action="append", default=[],
                    choices=sorted(DEFECTS) + sorted(gm.DEFECTS),
                    help="re-introduce a known defect (test-only; repeatable)")
    args = ap.parse_args(argv)
    for name in ("depth", "guard_depth"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1 "
                     f"(got {getattr(args, name)})")
    res = check(args.depth, defects=frozenset(d for d in args.defect if d in DEFECTS))
    g = guard_world.check(args.guard_depth,
                          defects=frozenset(d for d in args.defect if d in gm.DEFECTS))
    res.states += g.states
    res.transitions += g.transitions
    res.depth = max(res.depth, g.depth)
    res.seconds += g.seconds
    res.violations += g.violations
    shown: set[str] = set()
    for what, trace in res.violations:
        if what in shown:
            continue  # the shortest trace of each violation (BFS order) is enough
        shown.add(what)
        print(f"VIOLATION {what}\n  trace: {' -> '.join(trace)}")
    print(f"guard: {g.line()}")
    print(res.line())
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main())
