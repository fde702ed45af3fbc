"""What-if benchmark (issue 31 item 1): replay 30 days of a 10,000-node fleet's ledger
with two policies.

Run: ``.venv/bin/python tests/bench/whatif.py [--nodes 10000] [--days 30] [--rate 0.5]
[--storm 300] [--seed 1]``.

* An embedded PostgreSQL (``workers.devstack.start_embedded_postgres``, as the test
  fixtures), migrated, filled with a generated ledger: ``--nodes`` nodes of 8 GPUs over
  ``--days`` days with ``--rate`` interruptions per 1,000 GPU-days (the fleet figure the
  issue gives: 0.5), placed uniformly at random (seeded) in time and over the nodes. An
  interruption is an Xid 79 (50 %: power cycle), an Xid 48 on one GPU (20 %: GPU reset), a
  ``gpu_lost`` level fault (15 %: power cycle) or an ``xfs_shutdown`` (15 %: reboot); level
  faults clear 20 minutes later; 10 % recur 2 hours later from a new boot. Plus a storm:
  ``--storm`` nodes losing a GPU off the bus (Xid 79) within 5 minutes on day 12 (a power
  event of consecutive racks: nodes ``gpu-01800`` on). Each interruption also has its repair as the ledger records it (stage
  transitions with durations around the defaults, an attempt, 5 % failed), so the measured
  medians and recorded outcomes are read as in production. The ledger also records
  :data:`RECORDED_HOLDS` failure-domain holds and their releases (45 min, 1 h, 2 h: the
  measured median release is 1 h).
* Both configurations list the nodes, each in its own pool (no pool rule: the figures
  differ by policy only). Current policy: consent automatic, the rails' defaults (breaker
  10 % of GPU nodes), no failure domains. New policy: breaker at 2 % (200 of 10,000: the
  storm trips it), the ladder moving up after one attempt instead of two, and the nodes in
  racks of :data:`RACK` (``nodes[].failure_domain`` ``rack-K`` = index // 18, a GB200
  NVL72 rack's 18 trays; issue 29) with the default hold (3 nodes within 600 s).
* Timed: reading the window through ``whatif_alerts`` / ``whatif_measures`` (read-only
  pool) and the two replays plus figures (``workers.whatif.compare``), in this process.

Prints the figures of both policies, then as the last line one JSON object with the
timings and the ratio to the target (issue 31: < 60 s on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET_S = 60.0
T0 = datetime(2026, 10, 1, tzinfo=UTC)
CLUSTER = "bench"
#: Nodes per failure domain of the new configuration (a GB200 NVL72 rack: 18 compute trays).
RACK = 18
#: Failure-domain holds the generated ledger records, (hold at day, release after s).
RECORDED_HOLDS = ((3.0, 2700.0), (7.5, 3600.0), (20.0, 7200.0))

_ALERT_SQL = """INSERT INTO alerts (alert_id, cluster, node, machine_id, kind, code, gpu,
  severity, mnemonic, actionable, action, summary, description, evidence_text, evidence,
  level, active, source, observed_at)
VALUES ($1,$2,$3,$4,$5,$6,$7,$8,'',TRUE,$9,$10,'','',$11,$12,$13,'agent',$14)"""


def generate(nodes: int, days: int, rate: float, storm: int, seed: int
             ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]],
                        list[tuple[Any, ...]]]:
    """Rows of alerts, repairs, transitions and attempts (see the module docstring)."""
    rng = random.Random(seed)
    incidents = round(nodes * 8 * days * rate / 1000)
    span = days * 86400.0
    alerts: list[tuple[Any, ...]] = []
    repairs: list[tuple[Any, ...]] = []
    trans: list[tuple[Any, ...]] = []
    attempts: list[tuple[Any, ...]] = []
    kinds = [("xid", 79, None, "power_cycle", False, 0.5), ("xid", 48, "0000:3b:00.0",
             "reset_gpu", False, 0.2), ("gpu_lost", None, None, "power_cycle", True, 0.15),
             ("xfs_shutdown", None, None, "reboot", True, 0.15)]
    weights = [k[-1] for k in kinds]
    n_alert = 0

    def alert(node: str, kind: tuple[Any, ...], at: datetime, boot: int, active: bool) -> str:
        nonlocal n_alert
        n_alert += 1
        aid = f"{node}/{n_alert}"
        k, code, gpu, action, level, _ = kind
        ev = {"boot_id": f"{node}-b{boot}"}
        alerts.append((aid, CLUSTER, node, node, k, code, gpu, "critical", action,
                       f"{k} {code or ''}".strip(), ev, level, active, at))
        return aid

    def repair(node: str, kind: tuple[Any, ...], at: datetime, aid: str) -> None:
        rid = f"r-{aid}"
        action = kind[3]
        act_s = {"power_cycle": 600.0, "reset_gpu": 90.0, "reboot": 300.0}[action]
        failed = rng.random() < 0.05
        steps = [("recommended", 0.0), ("cordoning", 1.0), ("waiting_for_idle", 1.0),
                 ("draining", rng.uniform(0, 600)), ("repairing", rng.uniform(30, 120)),
                 ("joining", act_s * rng.uniform(0.8, 1.2)),
                 ("running" if not failed else "failed", rng.uniform(60, 180))]
        t = at
        for st, dt in steps:
            t = t + timedelta(seconds=dt)
            trans.append((rid, st, t))
        if not failed:
            trans.append((rid, "succeeded", t))
        repairs.append((rid, CLUSTER, node, node, action, "failed" if failed else "succeeded",
                        [aid], at, t))
        attempts.append((rid, CLUSTER, node, node, action, kind[0], kind[1],
                         "failed" if failed else "succeeded", t))

    for _ in range(incidents):
        node = f"gpu-{rng.randrange(nodes):05d}"
        kind = rng.choices(kinds, weights)[0]
        at = T0 + timedelta(seconds=rng.uniform(0, span - 3 * 3600))
        aid = alert(node, kind, at, 0, True)
        repair(node, kind, at, aid)
        if kind[4]:
            alert(node, kind, at + timedelta(minutes=20), 1, False)
        if rng.random() < 0.1:
            again = at + timedelta(hours=2)
            aid2 = alert(node, kind, again, 2, True)
            repair(node, kind, again, aid2)
    storm_at = T0 + timedelta(days=12)
    for i in range(storm):
        node = f"gpu-{(1800 + i) % nodes:05d}"
        at = storm_at + timedelta(seconds=300.0 * i / max(storm, 1))
        aid = alert(node, kinds[0], at, 5, True)
        repair(node, kinds[0], at, aid)
    for k, (day, release_s) in enumerate(RECORDED_HOLDS):
        at = T0 + timedelta(days=day)
        hold_id = f"domain/{CLUSTER}/rack-{k}/{at.isoformat()}"
        for aid, active, t in ((hold_id, True, at),
                               (f"{hold_id}/release", False,
                                at + timedelta(seconds=release_s))):
            alerts.append((aid, CLUSTER, "*", None, "failure_domain", None, None,
                           "critical", "none", f"hold on rack-{k}",
                           {"domain": f"rack-{k}"}, True, active, t))
    return alerts, repairs, trans, attempts


async def fill(pool: Any, rows: tuple[list[tuple[Any, ...]], ...]) -> None:
    alerts, repairs, trans, attempts = rows
    async with pool.acquire() as conn:
        await conn.executemany(_ALERT_SQL, alerts)
        await conn.executemany(
            """INSERT INTO repairs (repair_id, cluster, node, machine_id, action, stage,
                 requester_kind, requester_name, alert_ids, created_at, updated_at)
               VALUES ($1,$2,$3,$4,$5,$6,'system','autorepair',$7,$8,$9)""", repairs)
        await conn.executemany(
            "INSERT INTO repair_transitions (repair_id, stage, at) VALUES ($1,$2,$3)", trans)
        await conn.executemany(
            """INSERT INTO repair_attempts (repair_id, cluster, node, machine_id, action,
                 alert_kind, code, outcome, at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)""",
            attempts)


def configs(nodes: int) -> tuple[Any, Any]:
    from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, PolicyConfig

    current = PolicyConfig()
    current.consent.mode = "automatic"
    new = current.model_copy(deep=True)
    new.rails.breaker_fraction = 0.02
    new.ladder.attempts = 1
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    plain = [ClusterConfig(name=CLUSTER, gpu_nodes=nodes,
                           nodes=[NodeConfig(name=n, pool=n) for n in names])]
    racked = [ClusterConfig(name=CLUSTER, gpu_nodes=nodes, nodes=[
        NodeConfig(name=n, pool=n, failure_domain=f"rack-{i // RACK}")
        for i, n in enumerate(names)])]
    return (AutorepairConfig(policy=current, clusters=plain),
            AutorepairConfig(policy=new, clusters=racked))


#: The figures the benchmark prints per policy.
FIGURES = ("repairs", "automatic", "waited_for_person", "breaker_trips", "domain_holds",
           "domain_held_repairs", "outcomes", "gpu_hours", "disruptive_per_node")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from activities.ledger import connect, migrate
    from activities.ledger_queries import connect_read_only
    from workers.devstack import start_embedded_postgres
    from workers.whatif import compare, read_window

    rows = generate(args.nodes, args.days, args.rate, args.storm, args.seed)
    with tempfile.TemporaryDirectory(prefix="whatif-bench-") as tmp:
        server = start_embedded_postgres(Path(tmp) / "pg")
        try:
            dsn = server.get_uri()
            pool = await connect(dsn, schema="bench")
            await migrate(pool)
            t = time.perf_counter()
            await fill(pool, rows)
            fill_s = time.perf_counter() - t
            await pool.close()
            ro = await connect_read_only(dsn, schema="bench")
            current, new = configs(args.nodes)
            t = time.perf_counter()
            alerts, durations, outcomes = await read_window(
                ro, T0, T0 + timedelta(days=args.days), None)
            read_s = time.perf_counter() - t
            await ro.close()
        finally:
            server.cleanup()
    t = time.perf_counter()
    doc = compare(alerts, durations, outcomes, current, new, T0 + timedelta(days=args.days))
    replay_s = time.perf_counter() - t
    total = read_s + replay_s
    out = {"nodes": args.nodes, "days": args.days, "rate_per_1k_gpu_days": args.rate,
           "storm_nodes": args.storm, "alerts": len(alerts), "ledger_fill_s": round(fill_s, 2),
           "read_s": round(read_s, 2), "replay_both_s": round(replay_s, 2),
           "total_s": round(total, 2), "target_s": TARGET_S,
           "ratio_to_target": round(total / TARGET_S, 3),
           "current": {k: doc["current"][k] for k in FIGURES},
           "new": {k: doc["new"][k] for k in FIGURES},
           "differing_alerts": doc["differing_alerts"],
           "measured_domain_release_s": durations.domain_release_s}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--rate", type=float, default=0.5)
    ap.add_argument("--storm", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    res = asyncio.run(main(ap.parse_args()))
    for side in ("current", "new"):
        print(f"{side:8s}", json.dumps(res[side], sort_keys=True))
    print(f"alerts {res['alerts']}: read {res['read_s']} s, both replays {res['replay_both_s']} s, "
          f"total {res['total_s']} s = {res['ratio_to_target']:.2f} × the {TARGET_S:g} s target")
    print(json.dumps(res, sort_keys=True))
