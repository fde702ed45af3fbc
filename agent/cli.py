"""``autorepair-agent`` console script (docs/design.md §4.1): ``run``, ``simulate``, ``validate``,
``reset-gpu`` and ``capture``.

``validate`` runs the local validation suite of ``agent/validation/`` (docs/design.md §1 step 5);
``reset-gpu`` resets one GPU in place (``agent/gpureset/``, docs/design.md §5 ``reset_gpu``);
``capture`` writes the node's evidence before a disruptive action (``agent/capture.py``).

Exit codes: 0 normal stop (SIGINT/SIGTERM or ``--duration`` elapsed); 2 bad
configuration or an unavailable GPU backend (the message names the field/value).
``validate`` and ``reset-gpu`` have their own codes (see each command).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.config import AgentConfig, ConfigError
from agent.host import HostReadError, boot_id, machine_id
from agent.kmsg import KernelLogFollower
from agent.nvml import BackendUnavailable, make_backend
from agent.runner import Agent
from agent.simulator import (
    FleetSimulator,
    ScheduledFault,
    SimulatorError,
    load_kernel_lines,
    parse_slow_rank,
)

app = typer.Typer(
    name="autorepair-agent",
    help="GPU node agent: health score, fault events and OTLP push.",
    no_args_is_help=True,
    add_completion=False,
)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every push at INFO; the agent logs its own push failures.
    if level.lower() != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""Values of ``--log-level`` (any case): the standard :mod:`logging` level names."""


def _log_level(value: str) -> str:
    """``--log-level`` callback: a :data:`LOG_LEVELS` name (any case), else exit 2 naming
    the value (an unknown name was taken and logged at INFO)."""
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not a log level (one of "
                                 f"{', '.join(LOG_LEVELS)})")
    return value.lower()


LogLevel = Annotated[str, typer.Option(help="|".join(LOG_LEVELS), callback=_log_level)]


def _at_least_1(value: int | None) -> int | None:
    """Callback of a count option that must be >= 1 when given (exit 2 naming the value)."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not >= 1")
    return value


EXIT_REFUSED = 3
"""Exit code of ``simulate`` when the receiver refused its credential push after push."""
AGENT_TOKEN_ENV = "AUTOREPAIR_AGENT_TOKEN"
"""Environment variable holding the agent's / simulator's push token."""
COLLECTOR_TOKEN_FILE = "collector.token"
"""File in a dev stack's data directory holding its collector token (``autorepair up``)."""


def resolve_push_token(token: str | None, token_file: Path | None,
                       data_dir: Path) -> str | None:
    """The simulator's push token: ``token``, else the first line of ``token_file``
    (raises ``OSError`` when it cannot be read), else ``$AUTOREPAIR_AGENT_TOKEN``, else
    ``data_dir/collector.token`` when that file exists, else ``None``."""
    if token:
        return token
    if token_file is not None:
        lines = token_file.read_text(encoding="utf-8").strip().splitlines()
        return lines[0].strip() if lines else None
    if os.environ.get(AGENT_TOKEN_ENV):
        return os.environ[AGENT_TOKEN_ENV]
    try:
        return (data_dir / COLLECTOR_TOKEN_FILE).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _check_tls_files(cfg: AgentConfig) -> None:
    """Raise :class:`ConfigError` naming the option and path of a TLS file of ``cfg.push``
    that cannot be read (the transports read them when built, and say nothing of which)."""
    p = cfg.push
    for option, key, path in (("--ca-file", "ca_file", p.ca_file),
                              ("--client-cert", "client_cert", p.client_cert),
                              ("--client-key", "client_key", p.client_key)):
        if path:
            try:
                Path(path).open("rb").close()
            except OSError as exc:
                raise ConfigError(f"{option} (push.{key}) {path}: {exc.strerror or exc}"
                                  ) from None


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(code=2)


async def _until_stopped(stop: asyncio.Event, duration: float | None) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if duration is not None:
        loop.call_later(duration, stop.set)


@app.command()
def run(
    endpoint: Annotated[str | None, typer.Option(help="Ingest OTLP endpoint, e.g. "
                                                 "http://ingest:4318 (gRPC: :4317)")] = None,
    cluster: Annotated[str | None, typer.Option(help="Cluster id")] = None,
    node: Annotated[str | None, typer.Option(help="Node name (host.name)")] = None,
    config: Annotated[Path | None, typer.Option(help="agent.yaml; flags override it")] = None,
    backend: Annotated[str | None, typer.Option(help="nvml | simulated (explicit)")] = None,
    transport: Annotated[str | None, typer.Option(help="http (default) | grpc")] = None,
    token_file: Annotated[str | None, typer.Option(
        envvar="AUTOREPAIR_AGENT_TOKEN_FILE",
        help="Bearer token file, re-read when it changes (the projected ServiceAccount "
             "token on Kubernetes); $AUTOREPAIR_AGENT_TOKEN wins over it")] = None,
    ca_file: Annotated[str | None, typer.Option(
        help="CA bundle that verifies the ingest's TLS certificate")] = None,
    client_cert: Annotated[str | None, typer.Option(
        help="Client certificate (mTLS identity; URI SAN spiffe://…/cluster/C/node/N)")] = None,
    client_key: Annotated[str | None, typer.Option(help="Key of --client-cert")] = None,
    push_interval: Annotated[float | None, typer.Option(help="Seconds between pushes")] = None,
    sample_interval: Annotated[float | None, typer.Option(help="Seconds between samples")] = None,
    expected_gpus: Annotated[int | None, typer.Option(
        help="GPUs this node must show (at least 1)", callback=_at_least_1)] = None,
    state_dir: Annotated[str | None, typer.Option(help="Where the baseline is kept")] = None,
    kernel_log: Annotated[str | None, typer.Option(
        help="/dev/kmsg (default), a log file to follow, or 'none'")] = None,
    infiniband_root: Annotated[str | None, typer.Option(
        help="Host mode: sysfs InfiniBand root, e.g. /sys/class/infiniband")] = None,
    rail_owner: Annotated[str | None, typer.Option(help="Host mode: node owning the rails")]
    = None,
    workload_type: Annotated[str | None, typer.Option(help="training | inference")] = None,
    node_pool: Annotated[str | None, typer.Option(help="autorepair.node_pool")] = None,
    nccl_trace: Annotated[str | None, typer.Option(
        help="JSON-lines file of NCCL collective timings written by an NCCL profiler "
             "plugin or wrapper (docs/wire-contract.md)")] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds")] = None,
    log_level: LogLevel = "info",
) -> None:
    """Run the node agent until SIGINT/SIGTERM."""
    _logging(log_level)
    overrides: dict[str, Any] = {
        "endpoint": endpoint, "cluster": cluster, "node": node, "backend": backend,
        "push_interval_s": push_interval, "sample_interval_s": sample_interval,
        "expected_gpus": expected_gpus, "state_dir": state_dir, "kernel_log": kernel_log,
        "infiniband_root": infiniband_root, "rail_owner": rail_owner,
        "workload_type": workload_type, "node_pool": node_pool, "nccl_trace": nccl_trace,
        "push": {k: v for k, v in (("transport", transport), ("token_file", token_file),
                                   ("ca_file", ca_file), ("client_cert", client_cert),
                                   ("client_key", client_key)) if v} or None,
    }
    try:
        if config is not None:
            cfg = AgentConfig.load(config, **overrides)
        else:
            data = {k: v for k, v in overrides.items() if v is not None}
            for required in ("endpoint", "cluster", "node"):
                if required not in data:
                    raise ConfigError(f"{required}: required (--{required} or --config)")
            cfg = AgentConfig.from_mapping(data)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    try:
        gpu = make_backend(cfg.backend, gpu_count=cfg.expected_gpus or 8)
        kernel = None if cfg.kernel_log == "none" else KernelLogFollower(cfg.kernel_log)
        try:
            boot = boot_id(cfg.proc_root)
        except HostReadError:
            boot = ""
        _check_tls_files(cfg)
        try:
            agent = Agent(cfg, gpu, kernel=kernel, boot_id=boot,
                          host_id=cfg.host_id or machine_id())
        except ssl.SSLError as exc:  # a readable file that is not a usable PEM
            raise ConfigError(f"--ca-file / --client-cert / --client-key (push.ca_file, "
                              f"push.client_cert, push.client_key): {exc}") from None
        agent.open()
    except (BackendUnavailable, ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None

    async def main() -> None:
        stop = asyncio.Event()
        await _until_stopped(stop, duration)
        await agent.run(stop)

    asyncio.run(main())


@app.command()
def simulate(
    endpoint: Annotated[str, typer.Option(help="Ingest OTLP/HTTP endpoint")],
    cluster: Annotated[str, typer.Option(help="Cluster id")],
    nodes: Annotated[int, typer.Option(help="Number of simulated nodes")] = 8,
    node_prefix: Annotated[str, typer.Option(help="Node names PREFIX01..PREFIXNN")] = "gpu-",
    fault: Annotated[list[str] | None, typer.Option(
        help="NODE:KIND@SECONDS, repeatable. KIND: slow | xidNN | sxidNN | kernel | lost | "
             "ecc | remap | outage | idle | silent. 'kernel' replays the next line of "
             "--kernel-lines; xidNN replays a real line with that code "
             "(e.g. gpu-02:xid79@30).")] = None,
    kernel_lines: Annotated[Path | None, typer.Option(
        help="Real kernel lines to replay: text (one a line) or JSONL with 'text'")] = None,
    push_interval: Annotated[float, typer.Option(help="Seconds between pushes")] = 10.0,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    state_dir: Annotated[str, typer.Option(help="Baselines of the simulated nodes")] =
    ".autorepair/sim",
    control_port: Annotated[int | None, typer.Option(
        help="Loopback control endpoint port (0 = any free port): GET /nodes, "
             "POST /nodes/N/fault/KIND, /nodes/N/clear, /nodes/N/reboot, "
             "/nodes/N/reprovision")] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (reproducible telemetry)")] = 1,
    nccl_comm: Annotated[int | None, typer.Option(
        help="Also run one NCCL communicator of RANKS ranks (GPUs per node ranks per node) "
             "and push its collective timings")] = None,
    nccl_ops_per_s: Annotated[float, typer.Option(help="Collectives per second")] = 10.0,
    slow_rank: Annotated[list[str] | None, typer.Option(
        help="NODE[:MS], repeatable: NODE's ranks arrive MS late (default 2) at every "
             "collective")] = None,
    token: Annotated[str | None, typer.Option(
        help="Bearer token of every push: a collector token of the ingest "
             "(ingest.tokens_file). Default: --token-file, else $AUTOREPAIR_AGENT_TOKEN, "
             "else DATA_DIR/collector.token of a dev stack")] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the bearer token (first line)")] = None,
    data_dir: Annotated[Path, typer.Option(
        envvar="AUTOREPAIR_DATA_DIR",
        help="Data directory of a dev stack (`autorepair up --data-dir`): its "
             "collector.token is used when no other token is given")] = Path(".autorepair"),
    log_level: LogLevel = "info",
) -> None:
    """Run N simulated agents in one process, pushing real OTLP, with injected faults.

    Credentials: the ingest refuses pushes without a collector token (outside a stack
    started with ingest.insecure_allow_unauthenticated). After 10 pushes in a row
    refused with 401/403 the simulator stops with exit 3 and says which token it sent.
    Exit codes: 0 stopped (Ctrl-C or --duration), 2 bad arguments, 3 credentials
    refused."""
    _logging(log_level)
    try:
        push_token = resolve_push_token(token, token_file, data_dir)
    except OSError as exc:
        raise _fail(f"--token-file {token_file}: {exc}") from None
    if control_port is not None and not 0 <= control_port <= 65535:
        raise _fail(f"--control-port: must be 0..65535 (0: any free port), got {control_port}")
    if duration is not None and not duration >= 0:
        raise _fail(f"--duration: must be a number of seconds >= 0, got {duration:g}")
    try:
        schedule = [ScheduledFault.parse(f) for f in fault or []]
        lines = load_kernel_lines(kernel_lines) if kernel_lines else None
        late = dict(parse_slow_rank(s) for s in slow_rank or [])
        sim = FleetSimulator(
            endpoint, cluster, nodes, node_prefix=node_prefix, gpus_per_node=gpus_per_node,
            push_interval_s=push_interval, state_dir=state_dir, kernel_lines=lines, seed=seed,
            nccl_ranks=nccl_comm, nccl_ops_per_s=nccl_ops_per_s, slow_ranks=late or None,
            # one credential for the whole fleet: a collector token (docs/security.md)
            token=push_token,
        )
        for f in schedule:
            sim._node(f.node)
    except (SimulatorError, ConfigError) as exc:
        raise _fail(str(exc)) from None

    async def main() -> None:
        stop = asyncio.Event()
        await _until_stopped(stop, duration)
        if control_port is not None:
            host, port = sim.serve_control(control_port)
            typer.echo(json.dumps({"control": f"http://{host}:{port}"}), err=True)
        await sim.run(stop, schedule)

    asyncio.run(main())
    if sim.refused:
        typer.echo(f"error: {sim.refused}", err=True)
        raise typer.Exit(EXIT_REFUSED)


@app.command()
def validate(
    json_out: Annotated[bool, typer.Option("--json", help="print the structured result")] = False,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="suite YAML (default $AUTOREPAIR_VALIDATE_CONFIG)"),
    ] = None,
    machine: Annotated[str | None, typer.Option("--machine", help="machine name")] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="GPU backend: nvml | simulated")
    ] = None,
) -> None:
    """Local validation suite (GPU, DCGM, NCCL, InfiniBand, storage): exit 0 passed,
    1 failed, 2 aborted."""
    from agent.validation import run_validate

    raise typer.Exit(
        run_validate(json_out=json_out, config=config, machine=machine, backend=backend)
    )


@app.command("reset-gpu")
def reset_gpu(
    pci: Annotated[str, typer.Option("--pci", help="GPU PCI address: 0000:c6:00, "
                                     "0000:C6:00.0 or c6:00.0")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="run the precondition checks only: stop nothing, reset nothing")]
    = False,
    stop_services: Annotated[bool, typer.Option(
        "--stop-services", help="stop NVIDIA daemons holding the GPU (nvidia-persistenced, "
        "DCGM nv-hostengine) through systemctl and restart them afterwards; without it "
        "they make the reset exit 2")] = False,
    backend: Annotated[str, typer.Option(help="nvml | simulated (explicit)")] = "nvml",
    sim_faults: Annotated[Path | None, typer.Option(
        help="simulated backend: JSON object of SimFaults fields (gpu_processes, "
             "mig_gpus, nvswitch, recovery_action, remap_pending, reset_outcome, …)")] = None,
    sim_gpus: Annotated[int, typer.Option(help="simulated backend: GPU count")] = 8,
    nvidia_smi: Annotated[str | None, typer.Option(
        help="reset command (default nvidia-smi; with --backend simulated the simulated "
             "reset unless given)")] = None,
    systemctl: Annotated[str, typer.Option(help="systemctl binary")] = "systemctl",
    reset_timeout: Annotated[float, typer.Option(
        help="seconds the reset command may run")] = 180.0,
    wait_timeout: Annotated[float, typer.Option(
        help="seconds to wait for the GPU to come back after the reset")] = 60.0,
    proc_root: Annotated[Path, typer.Option(help="procfs root (who holds /dev/nvidiaN)")]
    = Path("/proc"),
    sys_root: Annotated[Path, typer.Option(help="sysfs root (NVSwitch PCI devices)")]
    = Path("/sys"),
) -> None:
    """Reset one GPU in place: exit 0 done, 1 reset failed, 2 cannot run (with the reason)."""
    from agent.gpureset.cli import run_reset_gpu

    raise typer.Exit(run_reset_gpu(
        pci=pci, json_out=json_out, dry_run=dry_run, stop_services=stop_services,
        backend=backend, sim_faults=sim_faults, sim_gpus=sim_gpus, nvidia_smi=nvidia_smi,
        systemctl=systemctl, reset_timeout=reset_timeout, wait_timeout=wait_timeout,
        proc_root=proc_root, sys_root=sys_root,
    ))


@app.command()
def capture(
    directory: Annotated[Path, typer.Option("--dir", help="directory the archive is written "
                                            "to (policy.evidence_capture.dir)")],
    repair: Annotated[str, typer.Option("--repair", help="repair id (names the archive)")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    tool_timeout: Annotated[float, typer.Option(
        help="seconds the tools (nvidia-bug-report.sh, nvidia-smi, journalctl) may run "
             "together")]
    = 240.0,
    backend: Annotated[str, typer.Option(help="NVML counters from: nvml | simulated")]
    = "nvml",
    kmsg: Annotated[Path, typer.Option(help="kernel log device, the last fallback")]
    = Path("/dev/kmsg"),
) -> None:
    """Capture the node's evidence into one archive before a disruptive action: exit 0
    written (path, size, sha256, tool), 2 cannot run (the directory)."""
    from agent.capture import run_capture

    raise typer.Exit(run_capture(directory=directory, repair_id=repair, json_out=json_out,
                                 tool_timeout_s=tool_timeout, backend=backend, kmsg=kmsg))


def main() -> None:
    """Console-script entry point (plain help: :func:`agent.clihelp.plain_help`)."""
    from agent.clihelp import plain_help

    plain_help(app)(prog_name="autorepair-agent")


if __name__ == "__main__":
    main()
