"""``autorepair whatif`` over a ledger built by real workflow runs (issue 31 item 1): the
harness's NodeWorkflows, guard and repairs write the ledger; the what-if reads it back
(read-only queries) and replays it with the harness's policy and with consent approve."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import result_skipping
from workflows.models import AlertOutcome, Stage


async def test_whatif_over_a_ledger_of_real_runs(harness: Harness, pg_dsn: str,
                                                 tmp_path: Path) -> None:
    from workers.whatif import whatif_doc
    from workflows.config import AutorepairConfig, ClusterConfig, ConsentConfig

    h = harness
    # three automatic power cycles inside one 600 s breaker window: above the default
    # threshold of 20 GPU nodes (max(breaker_min 2, ⌈0.10 × 20⌉) = 2; a released repair
    # still counts, commit 7a5d23d), so the third would wait for a breaker reset; this test
    # is about the what-if reading real runs back, so the breaker allows three
    h.policy.rails.breaker_min = 3
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    for i in (1, 2, 3):
        # stamped on receipt as ingest stamps them, on the wall clock (the what-if
        # windows and orders alerts by receipt time)
        a = make_alert(h.cluster.cluster, f"gpu-0{i}", i,
                       observed_at=t0 + timedelta(seconds=10 * i),
                       received_at=t0 + timedelta(seconds=10 * i))
        d = await h.deliver(a)
        assert d.outcome == AlertOutcome.recommended and d.repair_id
        st = await result_skipping(h, f"gpu-0{i}", d.repair_id)
        assert st.stage == Stage.succeeded
    assert h.cluster.power_cycles == 3

    cluster = ClusterConfig(name=h.cluster.cluster, gpu_nodes=h.gpu_nodes)
    current = AutorepairConfig(policy=h.policy, clusters=[cluster])
    new_policy = h.policy.model_copy(update={"consent": ConsentConfig(mode="approve")})
    new = AutorepairConfig(policy=new_policy, clusters=[cluster])
    # the window covers the runs on both clocks: in a full run the shared time-skipping
    # server's clock is far ahead of the wall clock the alerts were stamped with, and the
    # runs' repair rows (what the what-if measures) carry workflow times
    env_now = await h.env.get_current_time()
    since = min(t0, env_now - timedelta(days=1)) - timedelta(hours=1)
    until = max(datetime.now(UTC), env_now) + timedelta(days=2)
    pool = h.ledger.pool
    doc = await whatif_doc(pool, current, new, since, until, h.cluster.cluster)
    assert doc["alerts"] == 3
    cur, nw = doc["current"], doc["new"]
    # current policy (consent automatic, as the runs): what the workflows did
    assert cur["repairs"] == 3 and cur["by_action"] == {"power_cycle": 3}
    assert cur["automatic"] == 3 and cur["outcomes"] == {"succeeded": 3}
    assert cur["disruptive_per_node"]["max"] == 1 and cur["breaker_trips"] == 0
    # approve: every repair waits for a person (no approval in the ledger to measure)
    assert nw["automatic"] == 0 and nw["waited_for_person"] == 3
    assert nw["nodes_reaching_person"] == 3 and nw["outcomes"] == {"timed_out": 3}
    assert doc["differing_alerts"] == 3
    assert [d["node"] for d in doc["differences"]] == ["gpu-01", "gpu-02", "gpu-03"]
    # the ledger's measured power-cycle stages are what the replay used
    assert any("power_cycle: " in s for s in doc["assumptions"]), doc["assumptions"]
    again = await whatif_doc(pool, current, new, since, until, h.cluster.cluster)
    assert json.dumps(again, sort_keys=True) == json.dumps(doc, sort_keys=True)

    # the same ledger with gpu-01..03 in one configured failure domain (each its own
    # pool): the third node's request opens the hold and waits; the runs recorded no
    # hold, so nobody releases it and the repair's lease wait times out
    from workflows.config import NodeConfig

    racked = ClusterConfig(name=h.cluster.cluster, gpu_nodes=h.gpu_nodes, nodes=[
        NodeConfig(name=f"gpu-0{i}", pool=f"p{i}", failure_domain="rack-1") for i in (1, 2, 3)])
    dom = await whatif_doc(pool, current, AutorepairConfig(policy=h.policy, clusters=[racked]),
                           since, until, h.cluster.cluster)
    assert dom["current"]["domain_holds"] == 0 and dom["new"]["domain_holds"] == 1
    assert dom["new"]["holds"][0]["nodes"] == ["gpu-01", "gpu-02", "gpu-03"]
    assert dom["new"]["holds"][0]["released_at"] is None
    assert [d["node"] for d in dom["differences"]] == ["gpu-03"]
    assert "(why=domain)" in dom["differences"][0]["new"]["why"]
    assert any("nobody releases a domain hold" in s for s in dom["assumptions"])
    # a hold and its release 30 min later recorded as the guard records them (raise, then
    # the clear of `<id>/release`): the replayed hold is released after that median and
    # gpu-03's repair goes on; the rows are not replayed as alerts
    from workflows.models import Alert, Severity

    hid = f"domain/{h.cluster.cluster}/rack-9/{t0.isoformat()}"
    for aid, active, at in ((hid, True, t0), (f"{hid}/release", False,
                                               t0 + timedelta(minutes=30))):
        await h.ledger.record_alert(Alert(
            alert_id=aid, cluster=h.cluster.cluster, node="*", kind="failure_domain",
            severity=Severity.critical, summary="hold", evidence={"domain": "rack-9"},
            level=True, active=active, source="guard", observed_at=at))
    dom = await whatif_doc(pool, current, AutorepairConfig(policy=h.policy, clusters=[racked]),
                           since, until, h.cluster.cluster)
    assert dom["alerts"] == 3 and dom["new"]["domain_holds"] == 1
    held = datetime.fromisoformat(dom["new"]["holds"][0]["at"])
    assert dom["new"]["holds"][0]["released_at"] == (held + timedelta(minutes=30)).isoformat()
    assert dom["new"]["outcomes"] == {"succeeded": 3}
    assert any("releases a domain hold after 1800 s" in s for s in dom["assumptions"])

    # the CLI over the same ledger (its own read-only session, search_path as a server
    # setting of the DSN): the same figures as JSON
    from typer.testing import CliRunner

    from workers.cli import app

    schema = await pool.fetchval("SELECT current_schema()")
    sep = "&" if "?" in pg_dsn else "?"
    new_yaml = tmp_path / "new.yaml"
    new_yaml.write_text(f"policy:\n  consent:\n    mode: approve\n"
                        f"  rails:\n    breaker_min: 3\n"
                        f"clusters:\n  - name: {h.cluster.cluster}\n    gpu_nodes: 20\n")
    cur_yaml = tmp_path / "current.yaml"
    cur_yaml.write_text(f"policy:\n  consent:\n    mode: automatic\n"
                        f"  rails:\n    breaker_min: 3\n"
                        f"clusters:\n  - name: {h.cluster.cluster}\n    gpu_nodes: 20\n")
    r = await asyncio.to_thread(
        CliRunner().invoke, app,
        ["whatif", "--config", str(new_yaml), "--current-config", str(cur_yaml), "--since",
         "1h", "--cluster", h.cluster.cluster, "--json",
         "--ledger-dsn", f"{pg_dsn}{sep}search_path={schema}"], env={"AUTOREPAIR_CONFIG": ""})
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["alerts"] == 3 and out["differing_alerts"] == 3
    assert out["current"]["automatic"] == 3 and out["new"]["waited_for_person"] == 3
