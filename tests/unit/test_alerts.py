"""Alert building from real reader lines, and what the node policy makes of the alerts:
scenarios 1, 2, 9 and level clears, from kernel text to decision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.readers import read_text
from workflows.alerts import alert_from_fault
from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Alert, Severity
from workflows.policy import count_in_window, decide_node_action, repeat_key

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
    assert a.summary == "Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on gpu-01 GPU 0000:c6:00"
    other_pid = XID79.replace("1101234", "42")
    assert _alert(other_pid, T0).summary == a.summary
    assert a.evidence["xid"] == 79 and a.evidence["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
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
    d = decide_node_action(a, DEFAULT)
    assert not d.actionable and d.action is Action.none


def test_scenario_1_secondary_xid_storm_no_repair() -> None:
    times: list[datetime] = []
    for i in range(200):
        line = f"NVRM: Xid (PCI:0000:1a:00): 45, pid={1000 + i}, name=python, Ch 0000001{i % 8}"
        at = T0 + timedelta(seconds=3 * i)
        times.append(at)
        n = count_in_window(times, at, DEFAULT.app_xid_repeat_window_s)
        d = decide_node_action(_alert(line, at), DEFAULT, occurrences_in_window=n,
                               repeats_same_gpu=n)
        assert not d.actionable and not d.diagnostic and d.action is Action.none
    root = "NVRM: Xid (PCI:0000:1a:00): 45, pid=1, name=p, Ch 00000010, caused by previous Xid 43"
    a = _alert(root, T0)
    assert a.evidence["caused_by_xid"] == 43
    d = decide_node_action(a, DEFAULT, repeats_same_gpu=5)
    assert d.rule == "xid:45:secondary" and "root Xid 43" in d.reason and not d.actionable


def test_scenario_2_same_gpu_gpc_repeat_key() -> None:
    line = (
        "NVRM: Xid (PCI:0000:cb:00): 13, pid=9, name=p, Graphics SM Warp Exception on "
        "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
    )
    first, again = _alert(line, T0), _alert(line, T0 + timedelta(hours=5))
    assert repeat_key(first) == repeat_key(again)
    assert repeat_key(first) != repeat_key(_alert(line.replace("GPC 7", "GPC 2"), T0))
    assert repeat_key(first) != repeat_key(_alert(line.replace("0000:cb:00", "0000:10:00"), T0))
    times = [first.observed_at, again.observed_at]
    n = count_in_window(times, again.observed_at, DEFAULT.app_xid_repeat_window_s)
    assert n == 2
    d = decide_node_action(again, DEFAULT, repeats_same_gpu=n)
    assert d.diagnostic and not d.actionable
    late = T0 + timedelta(hours=25)
    assert count_in_window([T0, late], late, DEFAULT.app_xid_repeat_window_s) == 1
    assert not decide_node_action(first, DEFAULT, repeats_same_gpu=1).diagnostic


def test_scenario_9_xid_43_five_in_ten_minutes() -> None:
    cat = CatalogueConfig(
        xid={43: CatalogueOverride(action=Action.reset_gpu, count=5, window_s=600)}
    )
    line = "NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a"
    times: list[datetime] = []
    results = []
    for i in range(5):
        at = T0 + timedelta(minutes=2 * i)
        times.append(at)
        n = count_in_window(times, at, 600)
        results.append(decide_node_action(_alert(line, at, cat=cat), cat, occurrences_in_window=n))
    assert [r.action for r in results] == [Action.none] * 4 + [Action.reset_gpu]
    assert results[-1].actionable and results[-1].rule == "xid:43:override"
    spread = [T0 + timedelta(minutes=3 * i) for i in range(10)]
    assert max(count_in_window(spread[: i + 1], t, 600) for i, t in enumerate(spread)) < 5


def test_level_clear_is_never_actionable() -> None:
    cat = CatalogueConfig(kinds={"ib_link_down": CatalogueOverride(action=Action.reboot)})
    down = _alert("mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link DOWN", T0, cat=cat)
    assert down.level and down.active
    assert decide_node_action(down, cat).action is Action.reboot
    up = _alert("mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link ACTIVE", T0, cat=cat)
    assert up.active is False and not up.actionable
    assert not decide_node_action(up, cat).actionable
