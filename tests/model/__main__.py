"""``python -m tests.model [--depth N] [--guard-depth N] [--domain-depth N] [--node-depth N]
[--repair-depth N]
[--fleet-depth N] [--defect NAME ...] [--world-defect NAME ...]``
(``make model-check DEPTH=N GUARD_DEPTH=N NODE_DEPTH=N REPAIR_DEPTH=N FLEET_DEPTH=N``).

Checks the machine action lifecycle (:mod:`tests.model.checker`, to ``--depth``), the
cluster guard (:mod:`tests.model.guard_world`, to ``--guard-depth``; its failure-domain
world, issue 29 item 2, to ``--domain-depth``), the node
lifecycle (:mod:`tests.model.node_world`, to ``--node-depth``), the repair lifecycle
(:mod:`tests.model.repair_world`, to ``--repair-depth``) and the composed fleet
(:mod:`tests.model.fleet_world`: 3 nodes, the guard, repairs and their machine actions,
to ``--fleet-depth``, with a line per depth); each world branches its own way, so their
bounds are their own. Prints each violation
with its shortest event trace, one line per machine, then the last line
``states=… transitions=… depth=… violations=… seconds=…`` (sums; ``depth`` the largest
bound); exit 1 on a violation."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tests.model import checker, fleet_world, guard_world, node_world, repair_world
from workflows.lifecycle import guard, machine_action, node, repair

#: Default bounds: every event sequence of up to 8 machine-action events, 5 guard events,
#: 5 node events and 3 fleet events (the fleet's 3 takes about 2 s on one core, 4 about
#: 25 s; ``make model-check`` goes deeper by default).
DEFAULT_DEPTH = 8
DEFAULT_GUARD_DEPTH = 5
#: The guard's failure-domain world (issue 29 item 2): 4 events take about 6 s, 5 about
#: a minute.
DEFAULT_DOMAIN_DEPTH = 4
DEFAULT_NODE_DEPTH = 5
DEFAULT_FLEET_DEPTH = 3
#: ... and 16 repair events (a first rung fails and the person is asked for the next).
DEFAULT_REPAIR_DEPTH = 16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    ap.add_argument("--depth", type=int, default=DEFAULT_DEPTH,
                    help=f"longest machine-action event sequence (default {DEFAULT_DEPTH})")
    ap.add_argument("--guard-depth", type=int, default=DEFAULT_GUARD_DEPTH,
                    help=f"longest guard event sequence (default {DEFAULT_GUARD_DEPTH})")
    ap.add_argument("--domain-depth", type=int, default=DEFAULT_DOMAIN_DEPTH,
                    help="longest event sequence of the guard's failure-domain world "
                         f"(default {DEFAULT_DOMAIN_DEPTH})")
    ap.add_argument("--node-depth", type=int, default=DEFAULT_NODE_DEPTH,
                    help=f"longest node event sequence (default {DEFAULT_NODE_DEPTH})")
    ap.add_argument("--fleet-depth", type=int, default=DEFAULT_FLEET_DEPTH,
                    help=f"longest fleet event sequence (default {DEFAULT_FLEET_DEPTH})")
    ap.add_argument("--world-defect", action="append", default=[],
                    choices=sorted(fleet_world.WORLD_DEFECTS),
                    help="re-introduce a defect of the fleet's world (test-only; repeatable)")
    ap.add_argument("--repair-depth", type=int, default=DEFAULT_REPAIR_DEPTH,
                    help=f"longest repair event sequence (default {DEFAULT_REPAIR_DEPTH})")
    ap.add_argument("--defect", action="append", default=[],
                    choices=sorted({*machine_action.DEFECTS, *guard.DEFECTS, *node.DEFECTS,
                                    *repair.DEFECTS}),
                    help="re-introduce a known defect (test-only; repeatable)")
    args = ap.parse_args(argv)
    for name in ("depth", "guard_depth", "domain_depth", "node_depth", "repair_depth",
                 "fleet_depth"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1 "
                     f"(got {getattr(args, name)})")
    defects = frozenset(args.defect)
    runs: list[tuple[str, Any]] = [
        ("machine_action", checker.check(args.depth,
                                         defects=defects & set(machine_action.DEFECTS))),
        ("guard", guard_world.check(args.guard_depth, defects=defects & set(guard.DEFECTS))),
        ("guard_domains", guard_world.check(args.domain_depth, domains=True,
                                            defects=defects & set(guard.DEFECTS))),
        ("node", node_world.check(args.node_depth, defects=defects & set(node.DEFECTS))),
        ("repair", repair_world.check(args.repair_depth,
                                      defects=defects & set(repair.DEFECTS))),
        ("fleet", fleet_world.check(args.fleet_depth, defects=defects,
                                    world_defects=frozenset(args.world_defect), report=print)),
    ]
    total = checker.Result(depth=max(args.depth, args.guard_depth, args.domain_depth,
                                     args.node_depth,
                                     args.repair_depth, args.fleet_depth))
    shown: set[str] = set()
    for name, res in runs:
        for what, trace in res.violations:
            if what in shown:
                continue  # the shortest trace of each violation (BFS order) is enough
            shown.add(what)
            print(f"VIOLATION {what}\n  trace: {' -> '.join(trace)}")
        print(f"{name}: states={res.states} transitions={res.transitions} "
              f"depth={res.depth} violations={len(res.violations)} "
              f"seconds={res.seconds:.2f}")
        total.states += res.states
        total.transitions += res.transitions
        total.seconds += res.seconds
        total.violations += res.violations
    print(total.line())
    return 1 if total.violations else 0


if __name__ == "__main__":
    sys.exit(main())
