"""`status` and `repairs list` tables at 80 columns, in a pipe and on a 24-line screen
(issue 28 items 12, 13, 14)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from workers import ops


def _alert(node: str, kind: str, source: str, at: str, *, code: int | None = None,
           active: bool = True, level: bool = False, n: str = "") -> dict[str, Any]:
    mn = {"straggler": "STRAGGLER"}.get(kind, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    summary = (f"{kind} {mn} on {node}" if kind != "xid"
               else f"Xid {code} {mn} on {node} GPU 0000:18:00")
    return {"alert_id": f"{node}-{kind}-{source}-{at}{n}", "cluster": "demo", "node": node,
            "kind": kind, "code": code, "gpu": None if kind == "straggler" else "0000:18:00",
            "severity": "warning", "actionable": kind == "xid",
            "action": "power_cycle" if kind == "xid" else "none", "summary": summary,
            "level": level, "active": active, "source": source,
            "observed_at": f"2026-12-01T19:{at}:00Z"}


def _repair(i: int) -> dict[str, Any]:
    return {"repair_id": f"46320519aea2438{i}", "cluster": "demo-cluster-east",
            "node": f"gpu-0{i}", "action": "power_cycle", "stage": "awaiting_approval",
            "requester_kind": "system", "requester_name": "node-workflow",
            "updated_at": "2026-12-01T19:58:42Z", "downtime": None}


def _doc() -> dict[str, Any]:
    nodes = [{"cluster": "demo", "node": f"gpu-0{i}", "score": 0.96, "state": "active",
              "straggler": i == 2, "last_seen": 1796155077.0} for i in range(1, 5)]
    return {
        "state": {
            "cohorts": [{"cluster_id": "demo", "cohort": c, "threshold": 0.93,
                         "quorum_met": True, "median": 0.96, "mad": 0.004, "active_nodes": 3,
                         "panic": False} for c in ("training", "inference")],
            "nodes": nodes, "cluster_alerts": [],
        },
        "alerts": [
            _alert("gpu-02", "straggler", "agent", "58", level=True),
            _alert("gpu-02", "straggler", "ingest", "57", level=True),
            _alert("gpu-03", "xid", "agent", "56", code=79),
            # a departed simulator node's straggler, cleared, and another still active
            _alert("gpu-09", "straggler", "agent", "50", level=True, active=False),
            _alert("gpu-09", "straggler", "agent", "49", level=True),
            _alert("gpu-08", "straggler", "agent", "48", level=True),
        ],
        "repairs": [_repair(i) for i in range(1, 7)],
        "downtime": {"currency": "USD", "gpu_hours": 0.0, "cost": 0.0, "repairs": 0,
                     "unpriced_repairs": 0, "breakdown": []},
    }


def _render(width: int, height: int | None = None, doc: dict[str, Any] | None = None) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, height=height or 200).print(
        ops.status_tables(doc or _doc(), width=width, height=height))
    return buf.getvalue()


def test_80_columns_drop_whole_columns_and_never_cut_ids_node_stage() -> None:
    out = _render(80)
    for i in range(1, 7):
        assert f"46320519aea2438{i}" in out and f"gpu-0{i}" in out
    assert out.count("awaiting_approval") == 6
    assert "…" not in out.replace("… ", "")  # no cell cut to an ellipsis
    assert "not shown at 80 columns:" in out and "requester" in out.split("not shown")[-1]
    for line in out.splitlines():
        assert len(line) <= 80


def test_repairs_list_in_a_pipe_keeps_its_columns_whole() -> None:
    """rich takes 80 columns for a pipe; the table used to show … for cluster, node,
    requester and updated."""
    buf = io.StringIO()
    Console(file=buf).print(ops._repairs_table([_repair(1)]))
    out = buf.getvalue()
    assert "46320519aea24381" in out and "gpu-01" in out and "awaiting_approval" in out
    assert "…" not in out


def test_alerts_are_one_row_per_episode_with_their_state() -> None:
    out = _render(200)
    rows = [ln for ln in out.splitlines() if "gpu-02" in ln and "straggler on" in ln]
    assert len(rows) == 1 and "agent+ingest" in rows[0] and "active" in rows[0]
    assert "diagnostics" in rows[0] and "(none)" not in rows[0]
    assert "STRAGGLER" not in out  # the kind is not repeated in capitals
    (gone,) = [ln for ln in out.splitlines() if "gpu-09" in ln]
    assert "cleared" in gone  # the newest record of that episode cleared it
    (departed,) = [ln for ln in out.splitlines() if "gpu-08" in ln]
    assert "node gone" in departed  # active, but the node no longer reports


def test_an_event_alert_behind_a_succeeded_repair_reads_repaired() -> None:
    doc = _doc()
    doc["repairs"][2] = {**doc["repairs"][2], "stage": "succeeded", "cluster": "demo",
                         "updated_at": "2026-12-01T19:59:30Z"}  # gpu-03, after its Xid 79
    (row,) = [ln for ln in _render(200, doc=doc).splitlines() if "Xid 79" in ln]
    assert "repaired" in row and "active" not in row


def test_status_shows_the_diagnostics_recommended_for_a_straggler() -> None:
    (row,) = [ln for ln in _render(200).splitlines()
              if "gpu-02" in ln and "0.9600" in ln]
    assert "diagnostics: autorepair validate gpu-02" in row


def test_watch_at_80x24_shows_every_table() -> None:
    """status --watch at 80×24 used to lose the alerts and repairs tables below the
    screen: each table is bounded, repairs and alerts first."""
    out = _render(80, height=24)
    lines = out.splitlines()
    assert len(lines) <= 24, out
    assert "alerts (newest first" in out and "repairs" in out
    assert "46320519aea24381" in out and "… 5 more: autorepair repairs list" in out
    assert "straggler on gpu-02" in out


def test_status_lists_the_open_maintenance_windows() -> None:
    doc = _doc()
    doc["maintenance"] = [{
        "window_id": "mw-0123456789ab", "cluster": "demo", "scope": "pool", "pool": "rack-a",
        "nodes": [], "reason": "rack A firmware", "created_by": "alice",
        "starts_at": "2026-12-01T19:00:00Z", "ends_at": "2026-12-01T21:00:00Z",
        "state": "open"}]
    out = _render(160, doc=doc)
    assert "maintenance" in out and "mw-0123456789ab" in out and "pool rack-a" in out
    assert "rack A firmware" in out and "2026-12-01 21:00" in out
    assert "mw-" not in _render(160)  # no window, no row


def test_status_lists_the_failure_domain_holds() -> None:
    doc = _doc()
    doc["domains"] = [{
        "domain": "rack-07", "opened_at": "2026-12-01T19:40:00Z",
        "nodes": ["gpu-01", "gpu-02", "gpu-03"], "kinds": ["nvlink_down"],
        "alert_id": "domain/demo/rack-07/2026-12-01T19:40:00+00:00", "reason": "held"}]
    out = _render(200, doc=doc)
    assert "failure_domain" in out and "rack-07 held since 2026-12-01 19:40" in out
    assert "gpu-01, gpu-02, gpu-03" in out and "nvlink_down" in out
    assert "rack-07" not in _render(200)  # no hold, no row
def test_status_says_how_many_repairs_were_shadowed() -> None:
    """Shadow mode (issue 29 item 3): the downtime title counts shadowed repairs apart."""
    doc = _doc()
    doc["downtime"]["shadowed"] = {"repairs": 3, "by_action": {"reboot": 3},
                                   "by_cluster": {"demo": 3}}
    text = " ".join(_render(200, doc=doc).split())
    assert "3 shadowed (shadow mode: nothing done)" in text
    assert "shadowed" not in " ".join(_render(200).split())
