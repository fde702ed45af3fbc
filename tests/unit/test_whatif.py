"""The what-if replay (issue 31 item 1) over a synthetic ledger: hand-checked figures of
policy changes that must change outcomes, determinism, and bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from workflows.config import AutorepairConfig, ClusterConfig, ConsentConfig, PolicyConfig
from workflows.models import Action, Alert, Severity
from workflows.whatif.figures import differences, figures, p99
from workflows.whatif.sim import Durations, Facts, replay

T0 = datetime(2026, 11, 1, tzinfo=UTC)
FACTS = Facts(gpu_nodes={"c": 100})


def xid79(i: int, node: str, t_s: float) -> Alert:
    return Alert(alert_id=f"a{i}", cluster="c", node=node, kind="xid", code=79,
                 severity=Severity.critical, summary="Xid 79", actionable=True,
                 action=Action.power_cycle, evidence={"boot_id": f"{node}-b0"},
                 observed_at=T0 + timedelta(seconds=t_s))


def five() -> list[Alert]:
    """Xid 79 on n0..n4, 10 s apart (inside one 600 s breaker window)."""
    return [xid79(i, f"n{i}", i * 10) for i in range(5)]


def automatic() -> PolicyConfig:
    return PolicyConfig(consent=ConsentConfig(mode="automatic"))


def test_automatic_policy_figures_hand_checked() -> None:
    """Five power cycles, each out of service drain 60 s + action 600 s + rejoin 120 s
    (the defaults where nothing is measured) = 780 s × 8 GPUs = 1.7333 GPU-h each."""
    f = figures(replay(five(), automatic(), FACTS))
    assert f["repairs"] == 5 and f["by_action"] == {"power_cycle": 5}
    assert f["automatic"] == 5 and f["waited_for_person"] == 0
    assert f["nodes_reaching_person"] == 0 and f["breaker_trips"] == 0
    assert f["outcomes"] == {"succeeded": 5}
    assert f["disruptive_per_node"] == {"max": 1, "p99": 1, "nodes": 5, "total": 5}
    assert f["gpu_hours"] == pytest.approx(5 * 8 * 780 / 3600, abs=1e-5)
    assert f["cost"] is None and f["domain_holds"] == 0


def test_consent_approve_makes_every_repair_wait_for_a_person() -> None:
    """consent.mode approve: all five wait; nobody approves (no approval measured), so
    each times out after consent.approval_timeout_s (3 days) and nothing is lost."""
    cur = replay(five(), automatic(), FACTS)
    new = replay(five(), PolicyConfig(consent=ConsentConfig(mode="approve")), FACTS)
    f = figures(new)
    assert f["automatic"] == 0 and f["waited_for_person"] == 5
    assert f["nodes_reaching_person"] == 5 and f["outcomes"] == {"timed_out": 5}
    assert f["gpu_hours"] == 0.0 and f["disruptive_per_node"]["total"] == 0
    r = new.repairs[new.alerts["a0"].repair_id or ""]
    assert r.transitions[-1] == ("timed_out", T0 + timedelta(days=3))
    diff, total = differences(cur, new)
    assert total == 5 and [d["alert_id"] for d in diff] == ["a0", "a1", "a2", "a3", "a4"]
    assert diff[0]["current"]["decided"] == "automatic"
    assert diff[0]["new"]["decided"] == "person"
    assert "waited for a person" in diff[0]["new"]["why"]


def test_measured_approval_wait_approves_after_it() -> None:
    """With a measured approval wait of 1 h, each repair acts 1 h after its alert."""
    new = replay(five(), PolicyConfig(consent=ConsentConfig(mode="approve")), FACTS,
                 Durations(approval_s=3600.0))
    f = figures(new)
    assert f["waited_for_person"] == 5 and f["outcomes"] == {"succeeded": 5}
    r = new.repairs[new.alerts["a0"].repair_id or ""]
    assert ("cordoning", T0 + timedelta(hours=1)) in r.transitions


def test_lower_breaker_threshold_trips() -> None:
    """breaker_fraction 0.01 of 100 GPU nodes = 1, floored to breaker_min 2: the third
    automatic repair within 600 s trips the breaker; it and the two after it wait for a
    lease that never comes (no reset) and time out after lease_wait_max_s (24 h)."""
    new_p = automatic()
    new_p.rails.breaker_fraction = 0.01
    cur = replay(five(), automatic(), FACTS)
    new = replay(five(), new_p, FACTS)
    f = figures(new)
    assert f["breaker_trips"] == 1 and f["trips"][0]["at"] == (T0 + timedelta(seconds=20)
                                                                ).isoformat()
    assert f["outcomes"] == {"succeeded": 2, "timed_out": 3}
    assert f["gpu_hours"] == pytest.approx(2 * 8 * 780 / 3600, abs=1e-5)
    diff, total = differences(cur, new)
    assert total == 3 and [d["alert_id"] for d in diff] == ["a2", "a3", "a4"]
    assert "no lease in time" in diff[0]["new"]["why"]
    assert "lease queued: circuit breaker open" in diff[0]["new"]["why"]


def test_ledger_outcome_failed_is_replayed_and_the_ladder_retries() -> None:
    """The ledger recorded the first power cycle on n0 as failed: the replayed one fails
    too; the ladder (2 attempts of an action in 7 days) tries it once more, which has no
    recorded outcome and so succeeds (the stated assumption)."""
    facts = Facts(gpu_nodes={"c": 100}, outcomes={("c", "n0", "power_cycle"): ["failed"]})
    run = replay(five(), automatic(), facts)
    r = run.repairs[run.alerts["a0"].repair_id or ""]
    assert r.attempts == [(Action.power_cycle, "failed"), (Action.power_cycle, "succeeded")]
    assert r.stage == "succeeded" and not r.asked
    f = figures(run)
    assert f["disruptive_per_node"] == {"max": 2, "p99": 2, "nodes": 5, "total": 6}


def test_replay_is_deterministic_whatever_the_input_order() -> None:
    alerts = [*five(), xid79(9, "n1", 4000)]
    one = figures(replay(alerts, automatic(), FACTS))
    two = figures(replay(list(reversed(alerts)), automatic(), FACTS))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_p99_nearest_rank() -> None:
    assert p99([]) == 0 and p99([3]) == 3
    assert p99(list(range(1, 101))) == 99 and p99([0] * 99 + [7]) == 0


def test_naive_time_is_refused_naming_the_field() -> None:
    a = xid79(0, "n0", 0).model_copy(update={"observed_at": datetime(2026, 1, 1)})
    with pytest.raises(ValueError, match=r"alerts\[0\]\.observed_at"):
        replay([a], automatic())


def test_bad_new_config_names_field_and_value(tmp_path: Path) -> None:
    from workers.whatif import load_new

    p = tmp_path / "new.yaml"
    p.write_text("policy:\n  consent:\n    mode: sometimes\n")
    with pytest.raises(ValueError, match=r"consent.*mode.*sometimes"):
        load_new(p)
    with pytest.raises(ValueError, match="not found"):
        load_new(tmp_path / "missing.yaml")


def test_cli_rejects_bad_since_and_bad_config(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from workers.cli import app

    good = tmp_path / "new.yaml"
    good.write_text("policy:\n  consent:\n    mode: automatic\n")
    env = {"AUTOREPAIR_CONFIG": ""}
    r = CliRunner().invoke(app, ["whatif", "--config", str(good), "--since", "soon",
                                 "--ledger-dsn", "postgresql://nobody@127.0.0.1:1/x"], env=env)
    assert r.exit_code == 2 and "--since" in r.output and "'soon'" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [1, 2]\n")
    r = CliRunner().invoke(app, ["whatif", "--config", str(bad), "--since", "30d",
                                 "--ledger-dsn", "postgresql://nobody@127.0.0.1:1/x"], env=env)
    assert r.exit_code == 2 and "policy" in r.output and str(bad) in r.output


def test_compare_document_is_deterministic() -> None:
    from workers.whatif import compare

    cur = AutorepairConfig(policy=automatic(), clusters=[ClusterConfig(name="c", gpu_nodes=100)])
    new = cur.model_copy(update={"policy": PolicyConfig()})
    a = compare(five(), Durations(), {}, cur, new)
    b = compare(five(), Durations(), {}, cur, new)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["differing_alerts"] == 5 and a["new"]["waited_for_person"] == 5
    assert any("observed_at" in s for s in a["assumptions"])


def test_measured_breaker_reset_frees_the_held_repairs() -> None:
    """The ledger's breakers were reset 1 h after tripping: the breaker that trips at
    00:00:20 is reset at 01:00:20; the three held repairs are granted then (counted
    before the reset, never again: I23, so no second trip) and are back in service
    780 s later, at 01:13:20."""
    new_p = automatic()
    new_p.rails.breaker_fraction = 0.01
    run = replay(five(), new_p, FACTS, Durations(breaker_reset_s=3600.0))
    f = figures(run)
    assert f["breaker_trips"] == 1 and f["outcomes"] == {"succeeded": 5}
    ends = [r.transitions[-1][1] for r in run.repairs.values()]
    assert ends[2:] == [T0 + timedelta(hours=1, minutes=13, seconds=20)] * 3


def test_replay_stops_at_the_horizon_past_the_window() -> None:
    """A breaker nobody resets holds repairs past the window: the replay stops 3 days
    (HORIZON_S) after ``until`` and counts what is still open."""
    from workflows.whatif.sim import HORIZON_S

    new_p = automatic()
    new_p.rails.breaker_fraction = 0.01
    new_p.rails.lease_wait_max_s = 30 * 86400.0
    run = replay(five(), new_p, FACTS, until=T0 + timedelta(hours=1))
    assert run.ended_at == T0 + timedelta(hours=1, seconds=HORIZON_S)
    assert run.open_at_end == 3 and figures(run)["outcomes"] == {"open": 3, "succeeded": 2}


def test_tables_and_plot_of_a_document(tmp_path: Path) -> None:
    """The table output names every figure and assumption; --plot writes a PNG."""
    from rich.console import Console

    from workers.whatif import compare, tables, write_plot

    cur = AutorepairConfig(policy=automatic(), clusters=[ClusterConfig(name="c", gpu_nodes=100)])
    new = cur.model_copy(update={"policy": PolicyConfig()})
    doc = {"since": T0.isoformat(), "until": (T0 + timedelta(days=1)).isoformat(),
           "cluster": None, **compare(five(), Durations(), {}, cur, new)}
    con = Console(record=True, width=160)
    con.print(tables(doc, 160))
    text = con.export_text()
    for want in ("waiting for a person", "breaker trips", "disruptive actions / node (p99)",
                 "GPU-hours lost", "alerts whose outcome differs (5; first 5 shown)",
                 "failure domains: each configuration", "a0"):
        assert want in text, want
    png = tmp_path / "w.png"
    write_plot(doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(OSError):
        write_plot(doc, tmp_path / "missing-dir" / "w.png")


def test_clear_while_waiting_for_a_person_resolves_the_repair() -> None:
    """A level fault (xfs_shutdown → reboot) raised at 0 s is due after the 60 s
    persistence; under consent approve its repair waits; the clear received at 600 s
    reaches the repair as the clear of its fault, which ends it auto_resolved at 600 s
    (nothing acted, nothing lost)."""
    raise_ = Alert(alert_id="x1", cluster="c", node="n0", kind="xfs_shutdown",
                   severity=Severity.critical, summary="XFS shutdown", actionable=True,
                   action=Action.reboot, level=True, evidence={"boot_id": "n0-b0"},
                   observed_at=T0)
    clear = raise_.model_copy(update={"alert_id": "x2", "active": False,
                                      "observed_at": T0 + timedelta(seconds=600)})
    run = replay([raise_, clear], PolicyConfig(), FACTS)
    (r,) = run.repairs.values()
    assert r.transitions[0] == ("recommended", T0 + timedelta(seconds=60))
    assert r.stage == "auto_resolved" and r.transitions[-1][1] == T0 + timedelta(seconds=600)
    assert figures(run)["gpu_hours"] == 0.0 and run.alerts["x2"].outcome


# ---- failure-domain holds (issue 29 item 2 in the what-if) ---------------------------
RACK = ["n0", "n1", "n2", "n4"]  # rack-1; n3 is in no domain


def storm() -> list[Alert]:
    """Xid 79 on n0 (0 s), n1 (10 s), n2 (20 s), n3 (30 s), n4 (40 s)."""
    return [xid79(i, f"n{i}", i * 10) for i in range(5)]


def rack_facts() -> Facts:
    return Facts(gpu_nodes={"c": 100}, domains={"c": {n: ["rack-1"] for n in RACK}})


def test_three_nodes_of_a_domain_hold_the_rest_of_it() -> None:
    """Hand-checked: n0 and n1 of rack-1 are granted (1 and 2 nodes counted); n2's request
    at 20 s is the third node of rack-1 within 600 s: the hold opens then, naming n0, n1,
    n2, and n2 waits (why=domain); n3 (no domain) is granted at 30 s; n4 (rack-1) at 40 s
    waits. Nobody releases (no release measured): n2 and n4 wait until lease_wait_max_s
    (24 h) and time out. Without domains (the current config) all five succeed."""
    cur = replay(storm(), automatic(), FACTS)
    new = replay(storm(), automatic(), rack_facts())
    fc, fn = figures(cur), figures(new)
    assert fc["domain_holds"] == 0 and fc["holds"] == [] and fc["domain_held_repairs"] == 0
    assert fc["outcomes"] == {"succeeded": 5}
    assert fn["domain_holds"] == 1 and fn["domain_held_repairs"] == 2
    assert fn["holds"] == [{"cluster": "c", "domain": "rack-1",
                            "at": (T0 + timedelta(seconds=20)).isoformat(),
                            "nodes": ["n0", "n1", "n2"], "released_at": None}]
    assert fn["outcomes"] == {"succeeded": 3, "timed_out": 2}
    by_node = {r.node: r for r in new.repairs.values()}
    assert [n for n, r in sorted(by_node.items()) if r.domain_held] == ["n2", "n4"]
    assert by_node["n2"].stage == "timed_out" and by_node["n3"].stage == "succeeded"
    assert fn["breaker_trips"] == 0 and fn["automatic"] == 5
    diff, total = differences(cur, new)
    assert total == 2 and [d["alert_id"] for d in diff] == ["a2", "a4"]
    why = diff[0]["new"]["why"]
    assert "lease queued: failure domain rack-1 held" in why and "(why=domain)" in why
    assert "(why=domain)" not in diff[0]["current"]["why"]


def test_measured_domain_release_frees_the_held_repairs() -> None:
    """The ledger's holds were released 1 h after opening: the hold opened at 00:00:20 is
    released at 01:00:20; n2 and n4 are granted then and are back in service 780 s later
    (drain 60 + action 600 + rejoin 120), at 01:13:20."""
    run = replay(storm(), automatic(), rack_facts(), Durations(domain_release_s=3600.0))
    f = figures(run)
    assert f["domain_holds"] == 1 and f["outcomes"] == {"succeeded": 5}
    assert f["holds"][0]["released_at"] == (T0 + timedelta(hours=1, seconds=20)).isoformat()
    by_node = {r.node: r for r in run.repairs.values()}
    for n in ("n2", "n4"):
        assert by_node[n].transitions[-1] == ("succeeded",
                                              T0 + timedelta(hours=1, minutes=13, seconds=20))
    assert ("cordoning", T0 + timedelta(hours=1, seconds=20)) in by_node["n2"].transitions


def test_domain_threshold_and_window_come_from_the_policy() -> None:
    """policy.domains.threshold 5: four rack-1 nodes never hold; window_s 15: n0 (0 s),
    n1 (10 s), n2 (20 s) are never three within 15 s."""
    p = automatic()
    p.domains.threshold = 5
    assert figures(replay(storm(), p, rack_facts()))["domain_holds"] == 0
    p = automatic()
    p.domains.window_s = 15.0
    assert figures(replay(storm(), p, rack_facts()))["domain_holds"] == 0


def test_domain_replay_is_deterministic() -> None:
    d = Durations(domain_release_s=3600.0)
    one = figures(replay(storm(), automatic(), rack_facts(), d))
    two = figures(replay(list(reversed(storm())), automatic(), rack_facts(), d))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_compare_takes_domains_from_each_config() -> None:
    """The new config puts n0..n2, n4 in rack-1 (nodes[].failure_domain); the current has
    no domains: only the new policy holds, and the assumptions say where membership came
    from and that nobody releases."""
    from workers.whatif import compare, tables
    from workflows.config import NodeConfig

    cur = AutorepairConfig(policy=automatic(), clusters=[ClusterConfig(name="c", gpu_nodes=100)])
    # each its own pool (the default pool "default" would serialize them: one_per_pool)
    nodes = [NodeConfig(name=n, pool=n, failure_domain="rack-1") for n in RACK]
    new = cur.model_copy(update={"clusters": [ClusterConfig(name="c", gpu_nodes=100,
                                                            nodes=nodes)]})
    doc = compare(storm(), Durations(), {}, cur, new)
    assert doc["current"]["domain_holds"] == 0 and doc["new"]["domain_holds"] == 1
    assert doc["differing_alerts"] == 2
    text = " ".join(doc["assumptions"])
    assert "current: 0 nodes in 0 domains" in text and "new: 4 nodes in 1 domains" in text
    assert "not available offline" in text and "nobody releases a domain hold" in text
    assert "not modelled" not in text
    from rich.console import Console

    con = Console(record=True, width=200)
    con.print(tables({"since": T0.isoformat(), "until": T0.isoformat(), "cluster": None,
                      **doc}, 200))
    out = con.export_text()
    assert "domain holds" in out and "rack-1" in out and "n0, n1, n2" in out


def test_a_persons_approval_is_not_held_by_a_domain() -> None:
    """consent approve with a measured approval wait of 1 h: every repair is approved by
    a person. Approved requests count toward the rack's hold (the shared cause is
    flagged to the approvers: one hold) but a person's request is never held (issue 29
    item 2), so no repair waits on it and all five succeed."""
    p = PolicyConfig(consent=ConsentConfig(mode="approve"))
    f = figures(replay(storm(), p, rack_facts(), Durations(approval_s=3600.0)))
    assert f["domain_holds"] == 1 and f["domain_held_repairs"] == 0
    assert f["waited_for_person"] == 5 and f["outcomes"] == {"succeeded": 5}


def test_a_maintenance_window_in_the_ledger_holds_the_repair_to_its_end() -> None:
    """An operator window on n0 from T0 to T0 + 2 h: n0's power cycle (Xid 79 at T0)
    cordons when the window ends, not at once, as RepairWorkflow waits (issue 29); n1,
    outside the window, cordons straight away; the window's end is what the replay read
    from the ledger, not a constant."""
    from workflows.maintenance import MaintenanceWindow

    w = MaintenanceWindow(window_id="mw-000000000001", cluster="c", scope="nodes",
                          nodes=["n0"], reason="firmware", created_by="op",
                          starts_at=T0 - timedelta(minutes=5), ends_at=T0 + timedelta(hours=2))
    alerts = [xid79(0, "n0", 0), xid79(1, "n1", 0)]
    run = replay(alerts, automatic(), Facts(gpu_nodes={"c": 100}, windows=[w]))
    r0 = run.repairs[run.alerts["a0"].repair_id or ""]
    r1 = run.repairs[run.alerts["a1"].repair_id or ""]
    cordon0 = [t for st, t in r0.transitions if st == "cordoning"]
    cordon1 = [t for st, t in r1.transitions if st == "cordoning"]
    assert cordon0 and cordon0[0] >= T0 + timedelta(hours=2)
    assert cordon1 and cordon1[0] < T0 + timedelta(minutes=5)
    assert r0.stage == "succeeded" and r1.stage == "succeeded"
    without = replay(alerts, automatic(), FACTS)
    r0w = without.repairs[without.alerts["a0"].repair_id or ""]
    assert next(t for st, t in r0w.transitions if st == "cordoning") < T0 + timedelta(minutes=5)
