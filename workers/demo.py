"""The demo cluster and storyline of ``autorepair up --demo`` (docs/design.md §4.1).

What it starts (besides the dev stack): a real 4-node Slurm cluster on loopback
(slurmctld + ``slurmd -N gpu-01..gpu-04`` on ports 17001-17004, munge), the sushy-tools
Redfish emulator with one BMC system per machine, and ``autorepair-agent simulate``
pushing real OTLP for the four nodes. A machine bridge makes the emulated machines
behave like machines: a power cycle or reboot of a node's BMC system restarts that node's
slurmd and its simulated agent (new boot id, injected fault cleared); a reprovision also
resets the agent's baseline.

The storyline (about five minutes, visible in the Temporal UI and ``autorepair status``):

1. ``gpu-02`` turns slow: a straggler — observed, a diagnostic validation recommended,
   no reboot.
2. ``gpu-03`` logs a real Xid 79 line (``GPU has fallen off the bus``, from the corpus of
   real inputs): a power-cycle recommendation awaiting approval. A real ``sbatch`` job
   is running there, so after approval the repair cordons, waits for the job to finish,
   drains, power-cycles the machine through Redfish, rejoins and ends ``running`` →
   ``succeeded``. The demo approves as ``demo-operator`` after ``approve_after_s`` unless
   you run ``autorepair repairs approve ID`` first — that repair only
   (:func:`is_storyline_repair`; none with ``--no-auto-approve``): every other repair
   waits for a person.
3. ``gpu-04`` logs Xid 13 (an application error): recorded, no repair.

The demo config uses short waits (wait-for-idle 5 min, persistence 0 s, cooldown 2 min,
push interval 5 s, quorum of 3 nodes) and says so when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from workers.devstack import DevStack, find_binary, port_free

log = logging.getLogger("autorepair.demo")

CLUSTER = "demo"
NODES: tuple[str, ...] = ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
STRAGGLER, XID79_NODE, XID13_NODE = "gpu-02", "gpu-03", "gpu-04"
#: Redfish emulator port of the demo (sushy-emulator's own default).
REDFISH_PORT = 8000
#: Loopback control port of the fleet simulator.
SIM_CONTROL_PORT = 8090
#: The demo's hot-spare machine (``clusters[demo].spares``): ``migrate`` binds a node to it.
SPARE = "spare-01"
#: Price of one demo GPU for one hour, USD (an illustrative on-demand H100 price, so the
#: cost columns of ``status`` and ``report`` show figures; set in ``providers.rules``).
DEMO_HOURLY_RATE = 2.5

#: Where the corpus of real inputs lies beside a checkout (DESIGN: ``../shared/corpus``).
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "real-inputs.jsonl"


@dataclass
class DemoTimings:
    """When things happen in the storyline, seconds after the agents start."""

    straggler_at: float = 20.0
    xid79_at: float = 40.0
    xid13_at: float = 60.0
    #: Length of the real sbatch job on the Xid 79 node (wait-for-idle waits for it).
    job_s: float = 90.0
    #: The demo approves the storyline's power cycle itself after this long awaiting
    #: approval (only that repair; :func:`is_storyline_repair`).
    approve_after_s: float = 30.0
    #: Whether the demo approves the storyline's repair at all (``up --demo
    #: --no-auto-approve`` turns it off).
    auto_approve: bool = True
    push_interval_s: float = 5.0


@dataclass
class DemoCluster:
    """The demo's real peers and the config written for them."""

    workdir: Path
    config_path: Path
    slurm: Any
    redfish: Any
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    bridge: Any = None

    def stop(self) -> None:
        """Stop the simulator, the bridge, the emulator and Slurm. Idempotent."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
        self.processes.clear()
        if self.bridge is not None:
            with contextlib.suppress(Exception):
                self.bridge.stop()
            self.bridge = None
        if self.redfish is not None:
            self.redfish.stop()
            self.redfish = None
        if self.slurm is not None:
            self.slurm.stop()
            self.slurm = None


class DemoUnavailable(RuntimeError):
    """The demo cluster cannot run here; the message says why and what to do."""


def agent_binary() -> str:
    """Absolute path of the ``autorepair-agent`` console script beside this interpreter
    (the venv's), else the one on ``PATH``: the demo's Slurm jobs run it on the nodes and
    must not depend on the PATH of whoever started the demo (``make run`` does not put
    ``.venv/bin`` on it)."""
    return find_binary("autorepair-agent")


def demo_config(
    slurm_conf: Path, redfish_url: str, systems: dict[str, str], secrets_file: Path,
    timings: DemoTimings, image_url: str | None = None, agent: str | None = None,
) -> dict[str, Any]:
    """The demo's ``autorepair.yaml`` as a dict (short waits; see module docstring).

    ``image_url``: the Redfish emulator's clean image (``provision_image``, so
    ``reprovision`` runs); ``agent``: absolute path of ``autorepair-agent`` for the check
    and reset jobs (default :func:`agent_binary`). The loopback nodes have no GPU, so both
    jobs run the agent on its simulated NVML (``--backend simulated``). One spare machine
    (:data:`SPARE`) lets ``migrate`` run; one provider rule (:data:`DEMO_HOURLY_RATE`) gives
    the cost figures of ``report`` and ``status`` something to count."""
    agent = agent or agent_binary()
    return {
        "threshold": {
            "push_interval_s": timings.push_interval_s,
            "statistical_min": 3,
            "coverage": 0.75,
            "straggler_pushes": 3,
        },
        "policy": {
            "consent": {"mode": "approve"},
            "wait_for_idle": {"max_wait_s": 300, "poll_s": 5},
            "rails": {
                "persistence_s": 0,
                "cooldown_s": 120,
                "rejoin_timeout_s": 300,
                "rejoin_poll_s": 5,
                "drain_deadline_s": 120,
                "concurrency_fraction": 0.5,
                "breaker_min": 3,
            },
        },
        "clusters": [
            {
                "name": CLUSTER,
                "scheduler": "slurm",
                "gpu_nodes": len(NODES),
                "slurm_conf": str(slurm_conf),
                # the loopback cluster simulates a reboot by restarting slurmd
                "slurm_boot_identity": "slurmd_start",
                "validation": {
                    "output_dir": str(slurm_conf.parent.parent / "validation"),
                    "command": [agent, "validate", "--json", "--backend", "simulated"],
                },
                # the loopback nodes have no GPU: the agent's reset on its simulated NVML
                "reset_gpu": {
                    "output_dir": str(slurm_conf.parent.parent / "reset"),
                    "command": [agent, "reset-gpu", "--pci", "{pci}", "--json",
                                "--backend", "simulated"],
                },
                **({"provision_image": image_url} if image_url else {}),
                "spares": [SPARE],
                "nodes": [
                    {
                        "name": n,
                        "machine": n,
                        "pool": f"pool-{i % 2}",
                        "bmc": {"address": redfish_url, "system_id": systems[n],
                                "verify_tls": False},
                    }
                    for i, n in enumerate(NODES)
                ],
            }
        ],
        "providers": {
            "currency": "USD",
            "rules": [{"match": {"cluster": CLUSTER}, "provider": "demo-dc",
                       "gpu_type": "H100-SXM (simulated)", "gpus_per_node": 8,
                       "hourly_rate": DEMO_HOURLY_RATE}],
        },
        "secrets": {"bmc_credentials_file": str(secrets_file)},
    }


def prepare_demo(data_dir: Path, timings: DemoTimings | None = None,
                 redfish_port: int = REDFISH_PORT,
                 slurmd_ports: tuple[int, ...] | None = None,
                 control_port: int = SIM_CONTROL_PORT) -> DemoCluster:
    """Start Slurm and the Redfish emulator; write ``DATA/demo/autorepair.yaml``.

    ``slurmd_ports`` default to 17001-17004 (docs/design.md §3); tests pass free ports.
    ``control_port`` is the simulator's control endpoint (checked free here).
    Raises :class:`DemoUnavailable` (not root / Slurm missing / port busy)."""
    from workers.devpeers import (
        DEFAULT_SLURMD_PORTS,
        slurm_unavailable_reason,
        start_redfish_emulator,
        start_slurm_cluster,
    )

    timings = timings or DemoTimings()
    reason = slurm_unavailable_reason()
    if reason:
        raise DemoUnavailable(
            f"demo cluster unavailable: {reason}")
    ports = tuple(slurmd_ports or DEFAULT_SLURMD_PORTS)
    busy = [p for p in (*ports, redfish_port, control_port) if not port_free("127.0.0.1", p)]
    if busy:
        raise DemoUnavailable(f"demo ports in use: {busy} (another demo running?)")
    workdir = data_dir / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    slurm = start_slurm_cluster(workdir / "slurm", NODES, ports=list(ports))
    try:
        # a random BMC password per demo: it lives only in the secrets file (mode 0600)
        redfish = start_redfish_emulator(workdir / "redfish", NODES, port=redfish_port,
                                         password=secrets.token_urlsafe(16))
    except Exception:
        slurm.stop()
        raise
    secrets_file = workdir / "bmc-credentials.yaml"
    secrets_file.write_text(
        yaml.safe_dump({"default": {"username": redfish.username, "password": redfish.password}})
    )
    os.chmod(secrets_file, 0o600)
    cfg_path = workdir / "autorepair.yaml"
    cfg = demo_config(slurm.conf_path, redfish.url, redfish.systems, secrets_file, timings,
                      image_url=redfish.image_url)
    cfg_path.write_text(
        "# Demo configuration written by `autorepair up --demo`: SHORT WAITS for a 5-minute\n"
        "# storyline (wait-for-idle 5 min, cooldown 2 min, persistence 0 s, quorum 3).\n"
        + yaml.safe_dump(cfg, sort_keys=False)
    )
    return DemoCluster(workdir=workdir, config_path=cfg_path, slurm=slurm, redfish=redfish)


def kernel_lines_file(workdir: Path) -> Path:
    """A JSONL of real kernel lines for the simulator: the corpus when it is beside the
    checkout, else the simulator's built-in lines (taken from the same corpus)."""
    out = workdir / "kernel-lines.jsonl"
    if CORPUS.exists():
        lines = []
        for raw in CORPUS.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                if rec.get("expect", {}).get("kind") == "xid":
                    lines.append(json.dumps({"text": rec["text"], "source": rec.get("source")}))
        out.write_text("\n".join(lines) + "\n")
    else:
        from agent.simulator import BUILTIN_KERNEL_LINES

        out.write_text("\n".join(json.dumps({"text": t}) for t in BUILTIN_KERNEL_LINES) + "\n")
    return out


def start_simulator(demo: DemoCluster, otlp_http_port: int, timings: DemoTimings,
                    control_port: int = SIM_CONTROL_PORT, token: str | None = None
                    ) -> subprocess.Popen[bytes]:
    """``autorepair-agent simulate`` for the four nodes with the storyline's faults;
    ``token``: the dev stack's collector token (``AUTOREPAIR_AGENT_TOKEN``)."""
    # the console script, not ``python -m``: -m puts the current directory first on
    # sys.path, where any stray module (an ``h2.py`` in /tmp, say) would shadow a library
    argv = [
        find_binary("autorepair-agent"), "simulate",
        "--endpoint", f"http://127.0.0.1:{otlp_http_port}",
        "--cluster", CLUSTER, "--nodes", str(len(NODES)),
        "--push-interval", str(timings.push_interval_s),
        "--kernel-lines", str(kernel_lines_file(demo.workdir)),
        "--state-dir", str(demo.workdir / "sim"),
        "--control-port", str(control_port),
        "--fault", f"{STRAGGLER}:slow@{timings.straggler_at:g}",
        "--fault", f"{XID79_NODE}:xid79@{timings.xid79_at:g}",
        "--fault", f"{XID13_NODE}:xid13@{timings.xid13_at:g}",
    ]
    log_path = demo.workdir / "simulator.log"
    logf = log_path.open("ab")
    env = dict(os.environ)
    if token:
        env["AUTOREPAIR_AGENT_TOKEN"] = token
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                            env=env)
    logf.close()
    demo.processes.append(proc)
    from workers.devpeers import wait_port

    if not wait_port("127.0.0.1", control_port, 30) or proc.poll() is not None:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise DemoUnavailable(f"the fleet simulator did not start (log {log_path}):\n{tail}")
    return proc


def submit_job(demo: DemoCluster, node: str, seconds: float) -> str:
    """A real sbatch job pinned to ``node`` (the workload the repair waits for)."""
    out = demo.slurm.run(
        "sbatch", "--parsable", "-w", node, "-J", "training-run",
        "-o", str(demo.workdir / "job-%j.out"), "--wrap", f"sleep {int(seconds)}",
    )
    return out.strip().split(";")[0]


def simulator_call(port: int, path: str) -> None:
    """POST to the simulator's loopback control endpoint (``/nodes/N/reboot`` ...)."""
    import httpx

    httpx.post(f"http://127.0.0.1:{port}{path}", timeout=10).raise_for_status()


def machine_restarted(demo: DemoCluster, control_port: int) -> Callable[[str, str], None]:
    """Callback of the machine bridge: a node's machine came back from ``event``
    (``power_cycle``/``reboot``/``reprovision``): restart its slurmd and its agent."""

    def on_event(node: str, event: str) -> None:
        log.info("event=machine_restarted node=%s cause=%s", node, event)
        demo.slurm.restart_slurmd(node)
        action = "reprovision" if event == "reprovision" else "reboot"
        simulator_call(control_port, f"/nodes/{node}/{action}")

    return on_event


async def repair_stages(client: Any, cluster: str = CLUSTER) -> dict[str, dict[str, str]]:
    """Repairs of ``cluster`` from Temporal visibility: workflow id → search attributes."""
    from workflows.protocol import REPAIR_WORKFLOW, SA_CLUSTER

    out: dict[str, dict[str, str]] = {}
    query = f"WorkflowType = '{REPAIR_WORKFLOW}' AND {SA_CLUSTER.name} = '{cluster}'"
    async for wf in client.list_workflows(query):
        attrs = {k: (v[0] if isinstance(v, list) and v else v)
                 for k, v in (wf.search_attributes or {}).items()}
        out[wf.id] = {k: str(v) for k, v in attrs.items()}
    return out


def is_storyline_repair(attrs: dict[str, str], approved_nodes: set[str]) -> bool:
    """Whether the demo may approve this repair by itself: the storyline's power cycle of
    the Xid 79 node (search attributes ``NodeId`` = :data:`XID79_NODE`, ``RepairAction``
    = ``power_cycle``, ``AlertKind`` = ``xid``), the first time only (``approved_nodes``:
    nodes already approved once). Every other repair — a fault injected by hand, an
    operator's request, a ladder escalation — waits for a person."""
    from workflows.protocol import SA_ACTION, SA_ALERT_KIND, SA_NODE

    return (attrs.get(SA_NODE.name) == XID79_NODE and XID79_NODE not in approved_nodes
            and attrs.get(SA_ACTION.name) == "power_cycle"
            and attrs.get(SA_ALERT_KIND.name) == "xid")


async def narrate(client: Any, console: Console, stop: asyncio.Event,
                  timings: DemoTimings) -> None:
    """Print each repair's stage changes; approve the storyline's Xid 79 repair after a
    pause (:func:`is_storyline_repair`; never any other repair, and none with
    ``timings.auto_approve`` off)."""
    from workflows.models import ApproveSignal, Stage
    from workflows.protocol import SA_ACTION, SA_NODE, SA_STAGE
    from workflows.repair import RepairWorkflow

    seen: dict[str, str] = {}
    waiting_since: dict[str, float] = {}
    approved: set[str] = set()
    approved_nodes: set[str] = set()
    while not stop.is_set():
        with contextlib.suppress(Exception):
            for wf_id, attrs in (await repair_stages(client)).items():
                stage = attrs.get(SA_STAGE.name, "?")
                if seen.get(wf_id) != stage:
                    seen[wf_id] = stage
                    console.print(
                        f"[cyan]repair[/cyan] {wf_id}: [bold]{stage}[/bold] "
                        f"(action {attrs.get(SA_ACTION.name, '?')})"
                    )
                    if (stage == Stage.awaiting_approval.value
                            and not (timings.auto_approve
                                     and is_storyline_repair(attrs, approved_nodes))):
                        rid = wf_id.rsplit("/", 1)[-1]
                        console.print(
                            f"demo: {rid} waits for you: `autorepair repairs approve {rid}`, "
                            f"`reject {rid} --reason ...` or `cancel {rid}` (the demo "
                            "approves only the storyline's repair)", highlight=False)
                if (stage == Stage.awaiting_approval.value and wf_id not in approved
                        and timings.auto_approve
                        and is_storyline_repair(attrs, approved_nodes)):
                    first = waiting_since.setdefault(wf_id, time.monotonic())
                    if time.monotonic() - first >= timings.approve_after_s:
                        repair_id = wf_id.rsplit("/", 1)[-1]
                        console.print(
                            f"demo: approving {repair_id} as demo-operator (same as "
                            f"`autorepair repairs approve {repair_id}`)"
                        )
                        await client.get_workflow_handle(wf_id).signal(
                            RepairWorkflow.approve, ApproveSignal(by="demo-operator")
                        )
                        approved.add(wf_id)
                        approved_nodes.add(attrs.get(SA_NODE.name, ""))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=2.0)


async def run_demo(stack: DevStack, demo: DemoCluster, console: Console, stop: asyncio.Event,
                   timings: DemoTimings | None = None,
                   control_port: int = SIM_CONTROL_PORT) -> None:
    """Start the simulator, the workload and the bridge; narrate until ``stop``."""
    from workers.devpeers import MachineBridge
    from workers.worker import connect_temporal

    timings = timings or DemoTimings()
    console.print(
        "[yellow]demo:[/yellow] short waits for a storyline of a few minutes (wait-for-idle 5 min, "
        f"cooldown 2 min, push every {timings.push_interval_s:g} s); config in "
        f"{demo.config_path}"
    )
    job = await asyncio.to_thread(submit_job, demo, XID79_NODE, timings.job_s)
    console.print(f"demo: sbatch job {job} ('training-run', {timings.job_s:g} s) on {XID79_NODE}")
    try:
        await asyncio.to_thread(start_simulator, demo, stack.ports.otlp_http, timings,
                                control_port, stack.collector_token())
    except DemoUnavailable as exc:
        console.print(f"[red]demo stopped:[/red] {exc}")
        return
    # default 0.2 s polling: the emulator's Off window can be well under a second
    demo.bridge = MachineBridge(demo.redfish, machine_restarted(demo, control_port))
    demo.bridge.start()
    console.print(
        f"demo: 4 simulated agents pushing; {STRAGGLER} turns slow at +{timings.straggler_at:g}s,"
        f" {XID79_NODE} logs Xid 79 at +{timings.xid79_at:g}s, {XID13_NODE} logs Xid 13 at "
        f"+{timings.xid13_at:g}s. Watch: Temporal UI http://127.0.0.1:{stack.ports.temporal_ui}"
        " and `autorepair status --watch`."
    )
    cfg = stack.config.model_copy(deep=True)
    cfg.temporal.address = f"{stack.host}:{stack.ports.temporal}"
    async with connect_temporal(cfg) as client:
        await narrate(client, console, stop, timings)
