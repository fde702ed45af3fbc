"""Alert building and per-node state: scenarios 1, 2, 9; level edges; JSON state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from agent.readers import read_text
from workflows.alerts import AlertState, CountWindow, LevelTracker, alert_from_fault, decide
from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Alert, Severity

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DEFAULT = CatalogueConfig()


def _alert(line: str, at: datetime, node: str = "gpu-01", cat: CatalogueConfig = DEFAULT) -> Alert:
    (ev,) = read_text(line)
    return alert_from_fault(
        cluster="c1",
        node=node,
        kind=ev.kind,
        code=ev.xid,
        gpu=ev.pci,
        evidence_text=ev.text,
        evidence={**ev.details, "pid": ev.pid, "process": ev.process},
        observed_at=at,
        catalogue=cat,
        level=ev.level,
        active=ev.active,
    )


XID79 = "[5.1] NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."


def test_alert_fields_stable_id_summary_and_evidence() -> None:
    a = _alert(XID79, T0)
    b = _alert(XID79, T0)
    assert a.alert_id == b.alert_id and len(a.alert_id) == 64
    assert _alert(XID79, T0 + timedelta(seconds=1)).alert_id != a.alert_id
    assert a.summary == "Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on gpu-01 GPU 0000:c6:00"
    other_pid = XID79.replace("1101234", "42")
    assert _alert(other_pid, T0).summary == a.summary
    assert a.evidence["xid"] == 79 and a.evidence["mnemonic"] == "GPU_HAS_FALLEN_OFF_THE_BUS"
    assert a.evidence["pci"] == "0000:c6:00" and a.evidence["process"] == "nvc:[driver]"
    assert a.severity is Severity.critical and a.actionable and a.action is Action.power_cycle
    assert "power-cycle" in a.description and "nvc:[driver]" in a.description
    assert a.evidence_text == XID79
    # the same strings survive a JSON round trip (ledger, Temporal UI, notifications)
    again = Alert.model_validate_json(a.model_dump_json())
    assert again == a


def test_naive_and_aware_times_give_the_same_id() -> None:
    naive = T0.replace(tzinfo=None)
    assert _alert(XID79, naive).alert_id == _alert(XID79, T0).alert_id


def test_bad_input_names_field() -> None:
    kw = dict(
        kind="xid",
        code=79,
        gpu=None,
        evidence_text="x",
        evidence={},
        observed_at=T0,
        catalogue=DEFAULT,
    )
    with pytest.raises(ValueError, match="cluster"):
        alert_from_fault(cluster="", node="n", **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node"):
        alert_from_fault(cluster="c", node=" ", **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="evidence"):
        alert_from_fault(cluster="c", node="n", **{**kw, "evidence": []})  # type: ignore[arg-type]


def test_unmapped_kind_is_recorded_and_marked() -> None:
    a = alert_from_fault(
        cluster="c",
        node="n",
        kind="fan_failure",
        code=None,
        gpu=None,
        evidence_text="fan 3 stopped",
        evidence={"fan": 3},
        observed_at=T0,
        catalogue=DEFAULT,
    )
    assert a.evidence["unmapped"] is True and not a.actionable
    d = decide(a, AlertState(), DEFAULT)
    assert d.recommend is None and "no action mapping" in d.reason


def test_scenario_1_secondary_xid_storm_no_repair() -> None:
    state = AlertState()
    for i in range(200):
        line = f"NVRM: Xid (PCI:0000:1a:00): 45, pid={1000 + i}, name=python, Ch 0000001{i % 8}"
        d = decide(_alert(line, T0 + timedelta(seconds=3 * i)), state, DEFAULT)
        assert d.recommend is None and not d.diagnose
    root = "NVRM: Xid (PCI:0000:1a:00): 45, pid=1, name=p, Ch 00000010, caused by previous Xid 43"
    d = decide(_alert(root, T0), state, DEFAULT)
    assert d.root_xid == 43 and d.recommend is None


def test_scenario_2_same_gpu_gpc_twice_in_24h_diagnoses() -> None:
    line = (
        "NVRM: Xid (PCI:0000:cb:00): 13, pid=9, name=p, Graphics SM Warp Exception on "
        "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
    )
    state = AlertState()
    d1 = decide(_alert(line, T0), state, DEFAULT)
    assert d1.recommend is None and not d1.diagnose
    d2 = decide(_alert(line, T0 + timedelta(hours=5)), state, DEFAULT)
    assert d2.diagnose and d2.recommend is None
    # spread over different GPUs / nodes: nothing
    for i, node in enumerate(["n1", "n2", "n3"]):
        s = AlertState()
        other = line.replace("0000:cb:00", f"0000:{i + 10}:00")
        assert not decide(_alert(other, T0, node=node), s, DEFAULT).diagnose
    # same GPU, different GPC: not the same repeat
    s = AlertState()
    decide(_alert(line, T0), s, DEFAULT)
    other_gpc = line.replace("GPC 7", "GPC 2")
    assert not decide(_alert(other_gpc, T0 + timedelta(hours=1)), s, DEFAULT).diagnose
    # outside the 24 h window
    s = AlertState()
    decide(_alert(line, T0), s, DEFAULT)
    assert not decide(_alert(line, T0 + timedelta(hours=25)), s, DEFAULT).diagnose


def test_scenario_9_xid_43_five_in_ten_minutes() -> None:
    cat = CatalogueConfig(
        xid={43: CatalogueOverride(action=Action.reset_gpu, count=5, window_s=600)}
    )
    line = "NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a"
    state = AlertState()
    results = [
        decide(_alert(line, T0 + timedelta(minutes=2 * i), cat=cat), state, cat) for i in range(5)
    ]
    assert [r.recommend for r in results] == [None, None, None, None, Action.reset_gpu]
    # a burst (same fault within seconds) counts once
    state = AlertState()
    burst = [decide(_alert(line, T0 + timedelta(seconds=i), cat=cat), state, cat) for i in range(8)]
    assert sum(not b.duplicate for b in burst) == 1 and all(b.recommend is None for b in burst)
    # spread over more than the window: never five inside it
    state = AlertState()
    spread = [
        decide(_alert(line, T0 + timedelta(minutes=3 * i), cat=cat), state, cat) for i in range(10)
    ]
    assert all(r.recommend is None for r in spread)


def test_level_fault_persistence_counts_from_first_observation() -> None:
    cat = CatalogueConfig(kinds={"ib_link_down": CatalogueOverride(action=Action.reboot)})
    down = "mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link DOWN"
    up = "mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link ACTIVE"
    state = AlertState()
    d = decide(_alert(down, T0, cat=cat), state, cat, persistence_s=300)
    assert d.edge == "raise" and d.recommend is None
    d = decide(_alert(down, T0 + timedelta(seconds=200), cat=cat), state, cat, persistence_s=300)
    assert d.edge is None and d.recommend is None
    d = decide(_alert(down, T0 + timedelta(seconds=301), cat=cat), state, cat, persistence_s=300)
    assert d.recommend is Action.reboot  # not reset by the re-report at 200 s
    tracker = LevelTracker()
    assert tracker.observe("k", 0, True) == "raise"
    assert tracker.observe("k", 10, False) == "clear"
    assert tracker.observe("k", 20, True) == "raise"
    assert not tracker.persisted("k", 25, 10)
    up_alert = _alert(up, T0)
    assert up_alert.active is False and not up_alert.actionable


def test_state_is_json_serialisable_and_round_trips() -> None:
    state = AlertState()
    decide(_alert(XID79, T0), state, DEFAULT)
    decide(_alert("mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link DOWN", T0), state, DEFAULT)
    blob = json.loads(json.dumps(state.to_json()))
    again = AlertState.from_json(blob)
    assert again.to_json() == state.to_json()
    w = CountWindow()
    assert [w.observe("k", t, 10) for t in (0, 5, 9, 20)] == [1, 2, 3, 1]
    w.prune(20, 10)
    assert w.times == {"k": [20.0]}
    with pytest.raises(ValueError, match="window_s"):
        w.observe("k", 1, 0)
    with pytest.raises(ValueError, match="times"):
        CountWindow.from_json({"times": [1]})
