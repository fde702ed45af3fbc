"""``autorepair report``: what repairs cost over a window, as tables, JSON or a PNG chart.

The numbers come from the HTTP API's read-only ``GET /api/v1/report`` (viewer role), which
reads the ledger (``activities.ledger_reports.fleet_report``): the CLI needs only the API
address and a token, like ``status`` and ``repairs``, never database credentials.

Exit codes: 0 printed (and the chart written), 1 the server refused, 2 unreachable server
or a chart that cannot be written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, Group
from rich.table import Table

from workers.ops import EXIT_INTERRUPTED, ApiToken, call_api

_out = Console()
_err = Console(stderr=True)


NO_RATE = "no hourly rate configured (providers)"
"""What the cost figures say when no repair of the window was priced: no ``providers``
rule sets ``hourly_rate`` for its nodes (``0.00`` would read as "free")."""


def unpriced(doc: dict[str, Any]) -> bool:
    """Whether no cost can be told: repairs ended but none had an hourly rate."""
    return bool(doc.get("repairs")) and doc.get("unpriced_repairs") == doc.get("repairs")


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _group_table(title: str, key: str, rows: list[dict[str, Any]], currency: str) -> Table:
    t = Table(title=title)
    for col in (key, "repairs", "failed", "GPU-h lost", f"cost ({currency})"):
        t.add_column(col, justify="left" if col == key else "right", no_wrap=col == key)
    for r in rows:
        t.add_row(str(r[key]), str(r["repairs"]), str(r["failed"]), f"{r['gpu_hours']:.2f}",
                  f"{r['cost']:.2f}")
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f} %"


def reliability_tables(rel: dict[str, Any]) -> list[Table]:
    """The reliability figures (``activities.reliability.reliability_figures``) as tables:
    the headline figures, MTTR by how the repair was decided, and the machines with the
    shortest time between incidents (none when the report carries no figures)."""
    if not rel:
        return []
    s = Table(title="reliability", show_header=False)
    s.add_column("figure")
    s.add_column("value", justify="right")
    auto = rel["auto_remediation"]
    s.add_row("auto-remediation rate",
              f"{_pct(auto['rate'])} ({auto['auto_remediated']} of {auto['repairs']})")
    per = rel["disruptive_per_1k_gpu_days"]
    s.add_row("disruptive actions per 1,000 GPU-days",
              "fleet size unknown" if per is None else
              f"{per:.2f} ({rel['disruptive_actions']} in {rel['gpu_days']:.1f} GPU-days)")
    tbi = rel["time_between_incidents"]
    s.add_row("time between incidents (median)", _hours(tbi["median_s"]))
    sr = rel["second_rung"]
    s.add_row("needed a second rung",
              f"{_pct(sr['share'])} ({sr['second_rung']} of {sr['repairs_with_actions']})")
    m = Table(title="MTTR by decision (succeeded)")
    for col in ("decided", "repairs", "MTTR mean", "MTTR median"):
        m.add_column(col, justify="left" if col == "decided" else "right")
    for k, v in rel["mttr_by_decision"].items():
        m.add_row(k, str(v["repairs"]), _hours(v["mttr_s"]), _hours(v["mttr_p50_s"]))
    w = Table(title="shortest time between incidents")
    for col in ("machine", "incidents", "median gap", "shortest gap"):
        w.add_column(col, justify="left" if col == "machine" else "right", no_wrap=True)
    for r in tbi["worst"]:
        w.add_row(r["machine"], str(r["incidents"]), _hours(r["median_gap_s"]),
                  _hours(r["min_gap_s"]))
    return [s, m, w]


def report_tables(doc: dict[str, Any]) -> Group:
    """The report as rich tables: summary, outcomes, per cluster / action, top fault kinds,
    top machines, the reliability figures, the repeat-offender machines and the shadowed
    repairs by action."""
    cur = doc["currency"]
    s = Table(title=f"repairs {doc['since'][:16]} → {doc['until'][:16]}"
              + (f" (cluster {doc['cluster']})" if doc.get("cluster") else ""),
              show_header=False)
    s.add_column("figure")
    s.add_column("value", justify="right")
    s.add_row("repairs ended", str(doc["repairs"]))
    s.add_row("still open", str(doc["open"]))
    s.add_row("MTTR (mean / median, succeeded)",
              f"{_hours(doc['mttr_s'])} / {_hours(doc['mttr_p50_s'])}")
    s.add_row("GPU-hours lost", f"{doc['gpu_hours']:.2f}")
    s.add_row("  waiting for idle", f"{doc['idle_wait_gpu_hours']:.2f}")
    s.add_row("  out of service", f"{doc['out_of_service_gpu_hours']:.2f}")
    s.add_row(f"cost ({cur})", NO_RATE if unpriced(doc) else f"{doc['cost']:.2f}")
    if doc["unpriced_repairs"]:
        s.add_row("repairs without a rate", str(doc["unpriced_repairs"]))
    shadow = doc.get("shadowed") or {}
    s.add_row("shadowed (shadow mode: nothing done)", str(shadow.get("repairs", 0)))
    o = Table(title="by outcome")
    o.add_column("outcome")
    o.add_column("repairs", justify="right")
    for k, v in doc["outcomes"].items():
        o.add_row(k, str(v))
    return Group(
        s, o,
        _group_table("by cluster", "cluster", doc["by_cluster"], cur),
        _group_table("by action", "action", doc["by_action"], cur),
        _group_table("top fault kinds", "fault_kind", doc["top_fault_kinds"], cur),
        _group_table("top machines", "machine", doc["top_machines"], cur),
        *reliability_tables(doc.get("reliability") or {}),
        repeat_offenders_table(doc.get("repeat_offenders") or []),
        *shadow_tables(shadow),
    )


def shadow_tables(shadow: dict[str, Any]) -> list[Table]:
    """Shadowed repairs (``policy.mode: shadow``) by the action that would have run —
    counted apart from every other figure (none when the window has none)."""
    if not shadow.get("repairs"):
        return []
    t = Table(title="shadow mode: would have run",
              caption="nothing was done; not in the figures above")
    t.add_column("action")
    t.add_column("repairs", justify="right")
    for k, v in shadow["by_action"].items():
        t.add_row(k, str(v))
    return [t]


def repeat_offenders_table(rows: list[dict[str, Any]]) -> Table:
    """Repeat-offender machines (``policy.rails.repeat_offender``) with their repairs:
    their next recommendation is ``remove``, for a person."""
    t = Table(title="repeat offenders (next recommendation: remove, for a person)")
    for col in ("cluster", "machine", "repairs", "repair ids (actions)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["cluster"], r["machine"], str(r["disruptive_repairs"]),
                  ", ".join(f"{x['repair_id']} ({'+'.join(x['actions'])})"
                            for x in r["repairs"]))
    return t


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """A PNG with four panels: GPU-hours lost per day (waiting / total), cost per day,
    repairs by outcome, top fault kinds by GPU-hours. Raises ``OSError`` when ``path``
    cannot be written."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    days = [d["day"][5:] for d in doc["daily"]]
    ax = axes[0][0]
    ax.bar(days, [d["gpu_hours"] for d in doc["daily"]], color="#c0392b")
    ax.set_title("GPU-hours lost per day")
    ax.set_ylabel("GPU-hours")
    ax = axes[0][1]
    if unpriced(doc):
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"cost per day: {NO_RATE}", ha="center", va="center")
    else:
        ax.bar(days, [d["cost"] for d in doc["daily"]], color="#8e44ad")
        ax.set_title(f"cost per day ({doc['currency']})")
    ax = axes[1][0]
    outcomes = doc["outcomes"] or {"none": 0}
    ax.bar(list(outcomes), list(outcomes.values()), color="#2980b9")
    ax.set_title(f"repairs by outcome ({doc['repairs']} ended, {doc['open']} open)")
    ax = axes[1][1]
    kinds = doc["top_fault_kinds"][::-1]
    ax.barh([k["fault_kind"] for k in kinds] or ["none"],
            [k["gpu_hours"] for k in kinds] or [0], color="#d35400")
    ax.set_title("top fault kinds by GPU-hours lost")
    for a in axes.flat:
        a.tick_params(axis="x", labelrotation=30)
    cost = NO_RATE if unpriced(doc) else f"{doc['cost']:.2f} {doc['currency']}"
    fig.suptitle(f"autorepair report {doc['since'][:10]} → {doc['until'][:10]}: "
                 f"{doc['gpu_hours']:.1f} GPU-h lost, {cost}")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def report_command(api: str, auth: ApiToken, as_json: bool, since: str,
                   cluster: str | None, plot: Path | None) -> None:
    """``autorepair report``: GET the report, print it (table or ``--json``), and write the
    chart to ``plot`` when given. While the ledger is read and the chart drawn, a spinner
    on stderr says so (stdout stays clean for ``--json``); Ctrl-C stops with exit 130."""
    try:
        with _err.status(f"reading repairs since {since} from the ledger …"):
            doc = call_api("GET", api, "/api/v1/report", auth,
                           params={"since": since, "cluster": cluster})
        if as_json:
            typer.echo(json.dumps(doc, indent=2))
        else:
            _out.print(report_tables(doc))
        if plot is not None:
            try:
                with _err.status(f"drawing {plot} …"):
                    write_plot(doc, plot)
            except OSError as e:
                _err.print(f"error: --plot {plot}: {e.strerror or e}")
                raise typer.Exit(2) from None
            if not as_json:
                _out.print(f"chart written to {plot}")
    except KeyboardInterrupt:
        _err.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
