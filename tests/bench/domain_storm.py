"""Domain storm (issue 29 Done-when): 18 nodes of one rack raise NVLink faults within two
minutes after a planned maintenance window on the rack ends, as the false NVLink-down of a
rack reboot did (NVSentinel PR #1715: rack by rack, 18 nodes at a time).

Run: ``.venv/bin/python tests/bench/domain_storm.py [--nodes 18] [--spread 120]``
(about a minute; no dev stack).

The world is the workflow tests' harness (``tests/workflows/conftest.py``): the real
NodeWorkflow, RepairWorkflow and ClusterGuardWorkflow on the time-skipping Temporal test
server, the real ledger activities on embedded PostgreSQL, the in-memory FakeCluster as
scheduler and BMCs. 288 GPU nodes (a GB200 NVL72 fleet of four racks: budget 15, breaker
threshold 29 at the default rails), consent automatic, every rack node busy (a granted
repair cordons and waits for idle, so nothing acts during the measurement).

Four runs, printed side by side, each on a fresh test server (its clock starts at the
wall clock the windows are set on):

* ``today``: no maintenance window, no failure domains;
* ``window only``: a maintenance window covers the rack and ends 30 s before the storm;
  no failure domains;
* ``window+domains``: the same, and the rack is one failure domain (``policy.domains``
  defaults: 3 nodes in 600 s);
* ``inside window``: with domains, the storm coming while the window still covers the
  rack.

Each run delivers one Xid 74 (NVLink error, ``reset_gpu``) per node, spread evenly over
``--spread`` seconds of workflow time, as ingest delivers it (received on the server's
clock, marked ``in_maintenance`` / ``in_grace`` over the ledger's windows); then, 60 s
after the grace period (``policy.maintenance.grace_s``, 900 s) ends, the same fault again
from every node (the false NVLink-down persisted for weeks in the field); then five
minutes pass, and it counts: automatic repairs granted a lease (each cordons its node),
nodes cordoned, repairs waiting on the domain hold, ``failure_domain`` alerts in the
ledger, machine actions.

Measured here (2-core machine, 18 nodes, 120 s, Dec 2026): ``today`` and ``window only``:
15 repairs cordon (the budget), 3 wait for the budget, no alert — the grace period drops
the first storm's event faults, but their recurrence is repaired; ``window+domains``: 0
cordoned, 18 wait on the hold, one ``failure_domain`` alert — each node reports its fault
to the guard (``fault_seen``) while the grace period holds it, so the rack is held
before the first repair asks; ``inside window``: nothing is recommended (the reports are
marked ``in_maintenance``), no alert. Before fault reports (the hold judged on lease
requests only) ``window+domains`` cordoned 2: the first ``threshold - 1`` requests were
granted before a hold could exist.

Prints the table, then as the last line one JSON object with both runs' figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger, connect, migrate
from activities.ledger_activities import LedgerActivities
from activities.maintenance_store import MaintenanceStore
from ingest.maintenance_marks import MaintenanceMarks
from tests.workflows.conftest import (
    OWN_WORKFLOWS,
    FakeCluster,
    Harness,
    make_alert,
    register_search_attributes,
    terminate_all,
)
from tests.workflows.fake_validation import FakeValidationWorkflow
from workers.devstack import start_embedded_postgres
from workflows.config import PolicyConfig
from workflows.protocol import GUARD_QUERY_STATUS, GuardStatus, workflow_id_guard

RACK = "rack-07"
#: ``policy.maintenance.grace_s`` default (issue 29 item 1: 15 minutes).
GRACE_S = 900.0
GPU_NODES = 288


async def _run(env: WorkflowEnvironment, dsn: str, nodes: int, spread_s: float,
               mode: str) -> dict[str, Any]:
    """One run: ``today``, ``window+domains`` (the window ended before the storm) or
    ``inside window`` (the storm while the window still covers the rack, with domains)."""
    domains = mode in ("window+domains", "inside window")
    window = mode != "today"
    suffix = uuid.uuid4().hex[:8]
    pool = await connect(dsn, schema=f"b_{suffix}", max_size=5)
    await migrate(pool)
    names = [f"gpu-{i:02d}" for i in range(1, nodes + 1)]
    fake = FakeCluster(cluster=f"c-{suffix}", nodes=names)
    policy = PolicyConfig()
    policy.consent.mode = "automatic"
    policy.wait_for_idle.do_not_interrupt = True
    policy.wait_for_idle.poll_s = 60
    policy.wait_for_idle.poll_max_s = 60
    h = Harness(env=env, client=env.client, cluster=fake, ledger=Ledger(pool), policy=policy,
                task_queue=f"autorepair-{suffix}", bmc_queue=f"bmc-{suffix}",
                gpu_nodes=GPU_NODES)
    if domains:
        h.domains = {n: [RACK] for n in names}
    for n in names:
        fake.busy_polls[n] = 10_000
    started = time.monotonic()
    try:
        async with (
            Worker(env.client, task_queue=h.task_queue,
                   workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
                   activities=[*LedgerActivities(pool).all(), *fake.scheduler_activities(),
                               *h.policy_activities(), *GuardReplyActivities(env.client).all()]),
            Worker(env.client, task_queue=h.bmc_queue, activities=fake.machine_activities()),
        ):
            if window:
                # the rack's planned window: ended 30 s before the storm on both clocks
                # (the repair's window check reads the activity's clock, the storm is
                # timed on the workflows' skipped one), or still open on both
                now = min(await env.get_current_time(), datetime.now(UTC))
                ago = 600.0 if mode == "inside window" else 3630.0
                await MaintenanceStore(pool).start(
                    cluster=fake.cluster, scope="nodes", nodes=names, duration_s=3600.0,
                    reason="rack reboot (planned)", created_by="ops",
                    now=now - timedelta(seconds=ago))
            storm_at = await env.get_current_time()
            await _storm(h, pool, names, spread_s, "x74")
            # the false NVLink-down persists (NVSentinel PR #1715: for weeks): every node
            # reports it again after the grace period, then five minutes pass
            await _sleep(env, storm_at + timedelta(seconds=GRACE_S + 60)
                         - await env.get_current_time())
            await _storm(h, pool, names, spread_s, "x74-again")
            await _sleep(env, timedelta(minutes=5))
            st = await _guard(h)
            alerts = await h.ledger.list_alerts(cluster=fake.cluster, node="*")
            held = list(st.pending) if st else []
            holds = {d.domain for d in st.domain_holds} if st else set()
            doc = {
                "run": mode,
                "automatic_leases": sum(1 for x in (st.leases if st else []) if x.automatic),
                "cordoned": len({nd for name, nd in fake.calls if name == "cordon"}),
                "waiting_on_hold": sum(1 for p in held
                                       if holds & set(h.domains.get(p.node, []))),
                "queued_total": len(held),
                "domain_alerts": sum(1 for a in alerts if a.kind == "failure_domain"
                                     and a.active),
                "breaker_open": bool(st and st.breaker_open),
                "machine_actions": sum(fake.count(a) for a in (
                    "reset_gpu", "reboot", "power_cycle", "reprovision", "migrate",
                    "remove")),
                "stages": dict(sorted(Counter(
                    r["stage"] for r in await h.ledger.list_repairs(cluster=fake.cluster)
                ).items())),
                "seconds": round(time.monotonic() - started, 1),
            }
            await terminate_all(h)
            return doc
    finally:
        await pool.close()


async def _storm(h: Harness, pool: Any, names: list[str], spread_s: float, tag: str
                 ) -> None:
    """One Xid 74 per node, spread evenly over ``spread_s`` seconds of workflow time, as
    ingest delivers it: received then (the server's clock) and marked over the windows in
    force, or in their grace period, then."""
    store = MaintenanceStore(pool)
    marks = MaintenanceMarks(_no_windows, grace_s=GRACE_S)
    step = spread_s / max(len(names) - 1, 1)
    for i, n in enumerate(names):
        at = await h.env.get_current_time()
        alert = make_alert(h.cluster.cluster, n, f"{tag}-{i}", code=74, action="reset_gpu",
                           summary="Xid 74: NVLink error",
                           evidence_text="NVRM: Xid 74, NVLink: fatal")
        alert = alert.model_copy(update={"received_at": at, "observed_at": at})
        windows = await store.list(h.cluster.cluster, active_at=at, grace_s=GRACE_S)
        await h.deliver(marks.mark_with(alert, windows))
        if i < len(names) - 1:
            await h.env.sleep(timedelta(seconds=step))


async def _sleep(env: WorkflowEnvironment, d: timedelta) -> None:
    """``env.sleep`` in steps of a minute (one long skip over busy workflows outlasts the
    test server's RPC deadline)."""
    while d > timedelta(0):
        step = min(d, timedelta(minutes=1))
        await env.sleep(step)
        d -= step


async def _no_windows() -> list[Any]:
    return []


async def _guard(h: Harness) -> GuardStatus | None:
    try:
        return await h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster)).query(
            GUARD_QUERY_STATUS, result_type=GuardStatus)
    except Exception:
        return None


async def main(nodes: int, spread_s: float) -> list[dict[str, Any]]:
    from tests.conftest import venv_binary

    with tempfile.TemporaryDirectory(prefix="domain-storm-") as tmp:
        pg = start_embedded_postgres(Path(tmp) / "pg")
        runs = []
        try:
            for mode in ("today", "window only", "window+domains", "inside window"):
                # a fresh server per run: its clock starts at the wall clock, which the
                # windows are set on (a shared one runs ahead after the first run's skips)
                env = await WorkflowEnvironment.start_time_skipping(
                    data_converter=pydantic_data_converter,
                    test_server_existing_path=venv_binary("temporal-test-server"))
                try:
                    await register_search_attributes(env.client)
                    runs.append(await _run(env, pg.get_uri(), nodes, spread_s, mode))
                finally:
                    await env.shutdown()
            return runs
        finally:
            pg.cleanup()


def _print(runs: list[dict[str, Any]]) -> None:
    rows = [("automatic repairs granted (cordon)", "automatic_leases"),
            ("nodes cordoned", "cordoned"), ("repairs waiting (guard queue)", "queued_total"),
            ("... of them on the domain hold", "waiting_on_hold"),
            ("failure_domain alerts", "domain_alerts"), ("breaker open", "breaker_open"),
            ("machine actions", "machine_actions"), ("seconds (real)", "seconds")]
    print(f"{'':38}" + "".join(f"{r['run']:>17}" for r in runs))
    for label, key in rows:
        print(f"{label:38}" + "".join(f"{r[key]!s:>17}" for r in runs))
    print(json.dumps({r["run"]: r for r in runs}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=18)
    ap.add_argument("--spread", type=float, default=120.0,
                    help="seconds of workflow time the faults are spread over")
    a = ap.parse_args()
    _print(asyncio.run(main(a.nodes, a.spread)))
