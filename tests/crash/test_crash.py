"""Crash test, CI slice: 12 repairs on the dev stack while the worker, the ingest and
PostgreSQL are each killed once with SIGKILL (seeded order and times) and restarted.

The world is :mod:`tests.crash.world`: the real ``autorepair worker`` and ``autorepair
ingest`` processes of the dev stack, Temporal dev server, embedded PostgreSQL, Kubernetes
on kmock (scheduler side: cordons are read from its node objects) and the sushy-tools
Redfish emulator behind a counting proxy (machine side: every reset the emulator accepted,
:class:`tests.crash.bmc_proxy.CountingBmcProxy`; the emulator has no reset counter). Repairs come
through the real ingest: Xid 79 records over OTLP/HTTP and operator reboot requests over
the repair API. After the run :func:`tests.crash.invariants.check` must find nothing:
every repair ended exactly once and as Temporal says, no machine cycled twice for one
repair, no node left cordoned. ``make crash`` runs the long version (many repairs, many
random kills).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.crash.world import KillPlan, RunSpec, run_crash

pytestmark = [pytest.mark.devserver, pytest.mark.timeout(400)]

SEED = 13


async def test_repairs_survive_one_kill_of_each_component(tmp_path: Path) -> None:
    spec = RunSpec(nodes=12, rounds=1, deadline_s=240.0,
                   kills=KillPlan.one_each(SEED, within_s=(2.0, 20.0)))
    verdict, figures = await run_crash(spec, tmp_path)
    print(json.dumps(figures))
    assert verdict.violations == [], "\n".join(verdict.violations)
    assert figures["unfinished"] == []
    assert figures["kills"] == {"worker": 1, "ingest": 1, "postgres": 1}
    assert figures["repairs"] == 12 and figures["stages"] == {"succeeded": 12}
    assert figures["machine_cycles"] == 12
    assert figures["duplicates"] == 0 and figures["cordoned_left"] == 0
