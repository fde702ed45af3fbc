"""``autorepair whatif``: what a policy change would have done over a past window (issue 31
item 1).

Reads the window's alerts from the ledger (``activities.ledger_queries.whatif_alerts``,
keyset pages, read-only session) and what the ledger measured
(``whatif_measures``: median stage durations per action, the median approval wait,
recorded attempt outcomes; ``breaker_reset_median`` and ``domain_release_median``: how
long breakers and failure-domain holds stayed until a person reset or released them),
replays them through the production lifecycle machines with
the current configuration and with the new one (:func:`workflows.whatif.sim.replay`),
and prints the figures of each side by side (:mod:`workflows.whatif.figures`), the
alerts whose outcome differs (first 20, with why) and the assumptions made. It never
touches Temporal or a scheduler.

Exit codes: 0 printed, 2 bad arguments (the new config, ``--since``), no ledger, an
unreachable ledger or a chart that cannot be written.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import typer
from rich.console import Console, Group

from activities.ledger_queries import (
    breaker_reset_median,
    connect_read_only,
    domain_release_median,
    whatif_alerts,
    whatif_measures,
)
from activities.maintenance_store import MaintenanceStore
from workers.config import ConfigError, load_config
from workers.fleet_models import parse_since
from workers.tables import Col, fitted_table
from workflows.config import AutorepairConfig
from workflows.maintenance import MaintenanceWindow
from workflows.models import Alert
from workflows.providers import ProviderInfo, ProviderResolver
from workflows.whatif.figures import differences, figures
from workflows.whatif.sim import DEFAULT_DURATIONS_S, HORIZON_S, Durations, Facts, replay

_out = Console()
_err = Console(stderr=True)


def facts_of(cfg: AutorepairConfig, outcomes: dict[tuple[str, str, str], list[str]],
             windows: list[MaintenanceWindow] | None = None) -> Facts:
    """The inventory a replay under ``cfg`` sees: each configured cluster's GPU node count
    (``clusters[].gpu_nodes``, else its listed nodes), pools, machines and failure domains
    (``nodes[].failure_domain``: the scheduler's labels and features are not read
    offline), the ledger's attempt ``outcomes`` and its operator maintenance
    ``windows``."""
    return Facts(
        windows=list(windows or []),
        gpu_nodes={c.name: c.gpu_node_count for c in cfg.clusters},
        pools={c.name: {n.name: n.pool for n in c.nodes if n.pool} for c in cfg.clusters},
        machines={c.name: {n.name: n.machine for n in c.nodes if n.machine}
                  for c in cfg.clusters},
        outcomes=outcomes,
        domains={c.name: {n.name: [n.failure_domain] for n in c.nodes if n.failure_domain}
                 for c in cfg.clusters})


def _domains_line(cfg: AutorepairConfig) -> str:
    nodes = sum(1 for c in cfg.clusters for n in c.nodes if n.failure_domain)
    names = len({(c.name, n.failure_domain) for c in cfg.clusters for n in c.nodes
                 if n.failure_domain})
    d = cfg.policy.domains
    return (f"{nodes} nodes in {names} domains, a hold at {d.threshold} nodes within "
            f"{d.window_s:g} s")


def assumptions(d: Durations, current: AutorepairConfig | None = None,
                new: AutorepairConfig | None = None) -> list[str]:
    """What the replay assumes, in words (printed with every answer)."""
    measured = ", ".join(f"{a}: " + ", ".join(f"{s} {v:.0f} s" for s, v in sorted(st.items()))
                         for a, st in sorted(d.by_action.items())) or "none measured"
    defaults = ", ".join(f"{s} {v:.0f} s" for s, v in DEFAULT_DURATIONS_S.items())
    approval = (f"a person approves after {d.approval_s:.0f} s (the measured median wait)"
                if d.approval_s is not None else
                "nobody approves (no approval measured): a waiting repair times out as "
                "consent.approval_timeout_s says")
    return [
        "alerts are replayed at their receipt time (received_at; observed_at for rows "
        "older than migration 0014), every one whatever the policy did before it: a fault "
        "that recurred after an action recurs",
        "an action ends as the ledger's attempt of that action on that node ended (k-th "
        "replayed attempt = k-th recorded); otherwise it succeeds after the median stage "
        f"durations the ledger measured ({measured}; where none: {defaults})",
        "nodes are idle, cordon and drain succeed, nothing is open when the window starts; "
        "a repair about to cordon a node that one of the ledger's operator maintenance "
        "windows covers waits for its end (Slurm MAINT reservations and the Kubernetes "
        "annotation are not read offline)",
        approval,
        (f"a person resets a tripped breaker after {d.breaker_reset_s:.0f} s (the measured "
         "median)" if d.breaker_reset_s is not None else "nobody resets a tripped breaker "
         "(no reset measured): it stays open to the end of the replay"),
        f"the replay runs {HORIZON_S / 86400:g} days past the window; repairs still open "
        "then are counted `open`",
        "failure domains: each configuration's nodes[].failure_domain with its "
        "policy.domains.threshold / window_s"
        + (f" (current: {_domains_line(current)}; new: {_domains_line(new)})"
           if current is not None and new is not None else "")
        + "; the scheduler's domain labels (policy.domains.label_keys) and Slurm features "
        "(slurm_feature_prefix) are not available offline and are not used, nor the nodes "
        "the ledger's failure_domain alerts name (they reflect the membership then live, "
        "not either configuration's)",
        (f"a person releases a domain hold after {d.domain_release_s:.0f} s (the measured "
         "median from a failure_domain alert to its clear)" if d.domain_release_s is not None
         else "nobody releases a domain hold (no release measured): the domain's automatic "
         "repairs wait to the end of the replay (or their lease wait times out)"),
    ]


async def read_window(pool: asyncpg.Pool, since: datetime, until: datetime,
                      cluster: str | None) -> tuple[list[Alert], Durations,
                                                     dict[tuple[str, str, str], list[str]]]:
    """The window's alerts (receipt order), the measured durations, the outcomes."""
    alerts: list[Alert] = []
    async for page in whatif_alerts(pool, since, until, cluster=cluster):
        alerts.extend(page)
    by_action, approval, outcomes = await whatif_measures(pool, since, until, cluster=cluster)
    reset = await breaker_reset_median(pool, since, until, cluster=cluster)
    release = await domain_release_median(pool, since, until, cluster=cluster)
    return alerts, Durations(by_action=by_action, approval_s=approval,
                             breaker_reset_s=reset, domain_release_s=release), outcomes


def _info_for(cfg: AutorepairConfig) -> Any:
    resolver = ProviderResolver(cfg.providers)
    cache: dict[tuple[str, str], ProviderInfo] = {}

    def info(cluster: str, node: str) -> ProviderInfo:
        got = cache.get((cluster, node))
        if got is None:
            got = cache[(cluster, node)] = resolver.for_node(cluster, node)
        return got
    return info


def compare(alerts: list[Alert], durations: Durations,
            outcomes: dict[tuple[str, str, str], list[str]], current: AutorepairConfig,
            new: AutorepairConfig, until: datetime | None = None,
            windows: list[MaintenanceWindow] | None = None) -> dict[str, Any]:
    """Both replays (up to ``sim.HORIZON_S`` past ``until``, default the last alert) and
    their figures as one JSON-ready document (deterministic: the same alerts, measures,
    maintenance windows and configs give the same document)."""
    a = replay(alerts, current.policy, facts_of(current, outcomes, windows), durations, until)
    b = replay(alerts, new.policy, facts_of(new, outcomes, windows), durations, until)
    diff, total = differences(a, b)
    return {"alerts": len(alerts), "assumptions": assumptions(durations, current, new),
            "current": figures(a, _info_for(current)), "new": figures(b, _info_for(new)),
            "differing_alerts": total, "differences": diff}


async def whatif_doc(pool: asyncpg.Pool, current: AutorepairConfig, new: AutorepairConfig,
                     since: datetime, until: datetime, cluster: str | None) -> dict[str, Any]:
    """:func:`compare` over the ledger's window ``[since, until)`` (``cluster`` only)."""
    alerts, durations, outcomes = await read_window(pool, since, until, cluster)
    windows = await MaintenanceStore(pool).overlapping(
        since, until + timedelta(seconds=HORIZON_S), cluster)
    doc = compare(alerts, durations, outcomes, current, new, until, windows)
    return {"since": since.isoformat(), "until": until.isoformat(), "cluster": cluster, **doc}


def load_new(path: Path) -> AutorepairConfig:
    """The new configuration; raises ``ValueError`` ``--config PATH: …`` naming the field
    and value that do not validate (or the file / YAML problem)."""
    try:
        return load_config(path, environ={})
    except ConfigError as e:
        raise ValueError(f"--config {path}: {e}") from None


def _row(label: str, a: Any, b: Any) -> list[str]:
    return [label, str(a), str(b)]


def tables(doc: dict[str, Any], width: int) -> Group:
    """The document as tables: figures side by side, differing alerts, assumptions."""
    cur, new = doc["current"], doc["new"]
    rows = [_row("repairs", cur["repairs"], new["repairs"])]
    for act in sorted({*cur["by_action"], *new["by_action"]}):
        rows.append(_row(f"  {act}", cur["by_action"].get(act, 0), new["by_action"].get(act, 0)))
    rows += [
        _row("automatic", cur["automatic"], new["automatic"]),
        _row("waiting for a person", cur["waited_for_person"], new["waited_for_person"]),
        _row("nodes reaching a person", cur["nodes_reaching_person"],
             new["nodes_reaching_person"]),
        _row("breaker trips", cur["breaker_trips"], new["breaker_trips"]),
        _row("domain holds", cur["domain_holds"], new["domain_holds"]),
        _row("repairs waiting for a domain hold", cur["domain_held_repairs"],
             new["domain_held_repairs"]),
        _row("disruptive actions / node (max)", cur["disruptive_per_node"]["max"],
             new["disruptive_per_node"]["max"]),
        _row("disruptive actions / node (p99)", cur["disruptive_per_node"]["p99"],
             new["disruptive_per_node"]["p99"]),
        _row("GPU-hours lost", f"{cur['gpu_hours']:.2f}", f"{new['gpu_hours']:.2f}"),
        _row(f"cost ({cur['currency']})",
             "no hourly rate" if cur["cost"] is None else f"{cur['cost']:.2f}",
             "no hourly rate" if new["cost"] is None else f"{new['cost']:.2f}"),
    ]
    for st in sorted({*cur["outcomes"], *new["outcomes"]}):
        rows.append(_row(f"ended {st}", cur["outcomes"].get(st, 0), new["outcomes"].get(st, 0)))
    fig = fitted_table(f"what-if {doc['since'][:19]} → {doc['until'][:19]}: "
                       f"{doc['alerts']} alerts", [Col("figure", keep=True),
                       Col("current", keep=True, justify="right"),
                       Col("new", keep=True, justify="right")], rows, width)
    drows = [[d["at"][:19], d["node"], d["alert_id"],
              f"{d['current']['outcome']} {d['current']['action']} {d['current']['end']}",
              f"{d['new']['outcome']} {d['new']['action']} {d['new']['end']}",
              f"current: {d['current']['why']} | new: {d['new']['why']}"]
             for d in doc["differences"]]
    shown = len(drows)
    diff = fitted_table(
        f"alerts whose outcome differs ({doc['differing_alerts']}; first {shown} shown)",
        [Col("at", priority=2), Col("node", keep=True), Col("alert", keep=True),
         Col("current", priority=3), Col("new", priority=3), Col("why", wrap=True, priority=1)],
        drows, width)
    hrows = [[side, h["at"][:19], h["cluster"], h["domain"], ", ".join(h["nodes"]),
              (h["released_at"] or "never")[:19]]
             for side in ("current", "new") for h in doc[side]["holds"]]
    holds = fitted_table(
        f"domain holds (current {cur['domain_holds']}, new {new['domain_holds']})",
        [Col("policy", keep=True), Col("at", priority=2), Col("cluster", priority=3),
         Col("domain", keep=True), Col("nodes", wrap=True, priority=1),
         Col("released", priority=2)], hrows, width)
    notes = "\n".join(f"- {a}" for a in doc["assumptions"])
    return Group(fig, holds, diff, f"assumptions:\n{notes}")


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """A PNG of the two policies' figures side by side (matplotlib, a dependency of
    ``autorepair report``). Raises ``OSError`` when ``path`` cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("repairs", "repairs"), ("automatic", "automatic"),
            ("waited_for_person", "waiting for a person"),
            ("nodes_reaching_person", "nodes reaching a person"),
            ("breaker_trips", "breaker trips"), ("domain_holds", "domain holds")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    xs = range(len(keys))
    for off, side in ((-0.2, "current"), (0.2, "new")):
        axes[0].bar([x + off for x in xs], [doc[side][k] for k, _ in keys], width=0.4,
                    label=side)
        axes[1].bar([side], [doc[side]["gpu_hours"]])
    axes[0].set_xticks(list(xs), [label for _, label in keys], rotation=20)
    axes[0].legend()
    axes[1].set_title("GPU-hours lost")
    fig.suptitle(f"autorepair whatif {doc['since'][:10]} → {doc['until'][:10]}")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def whatif_command(current: AutorepairConfig, new_path: Path, since: str,
                   cluster: str | None, as_json: bool, plot: Path | None,
                   now: datetime) -> None:
    """``autorepair whatif`` (module docstring); ``now`` ends the window."""
    import asyncio

    try:
        start = parse_since(since, now)
    except ValueError as e:
        typer.echo(f"error: --since: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        new = load_new(new_path)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

    async def go() -> dict[str, Any]:
        pool = await connect_read_only(current.ledger.dsn)
        try:
            return await whatif_doc(pool, current, new, start, now, cluster)
        finally:
            await pool.close()

    try:
        with _err.status(f"replaying the ledger's alerts since {since} …"):
            doc = asyncio.run(go())
    except (OSError, asyncpg.PostgresError) as e:
        typer.echo(f"error: ledger {current.ledger.dsn.split('@')[-1]}: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _out.print(tables(doc, _out.width))
    if plot is not None:
        try:
            write_plot(doc, plot)
        except OSError as e:
            typer.echo(f"error: --plot {plot}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from None
