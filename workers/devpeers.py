"""Real peers for the dev stack and the tests: a loopback Slurm cluster and a Redfish BMC emulator.

Both the pytest fixtures (``tests/fixtures/{slurm,redfish}.py``) and ``autorepair up --demo``
start their peers through this module, so the demo and the tests run the same thing.

Slurm (docs/design.md §3): one ``munged`` with its own key and socket, one ``slurmctld`` and one
``slurmd -N <node>`` per node, all on loopback, with a config/state/log tree under
``workdir``. Each node advertises ``CPUs=2`` and one fake ``gpu`` GRES (``gres.conf`` with
``File=/dev/null``: slurmd counts GPUs from device files), so
``sbatch -w gpu-02 --gres=gpu:1`` places a job on a chosen node.
Requires root and Debian's ``slurmctld slurmd slurm-client munge``
(installed by ``scripts/install-slurm.sh``); :func:`slurm_unavailable_reason` says why not.

Redfish (docs/design.md §3): ``sushy-emulator`` (PyPI ``sushy-tools``) with its fake systems driver,
one system per node (power ``On``), HTTP basic auth from a bcrypt htpasswd file, and a
loopback HTTP server that serves the clean image for virtual-media reprovisioning.

Errors: :class:`PeerStartError` (a ``RuntimeError``) names the daemon that failed to come up
and carries the tail of its log.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import http.server
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

#: Default node names and slurmd ports of the demo cluster (docs/design.md §3).
DEFAULT_NODES: tuple[str, ...] = ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
DEFAULT_SLURMD_PORTS: tuple[int, ...] = (17001, 17002, 17003, 17004)
#: How long a daemon may take to answer after start, seconds (slurmctld needs ~2 s on 2 cores).
START_TIMEOUT_S = 60.0

_SLURM_BINARIES = ("slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "sinfo", "munged")


class PeerStartError(RuntimeError):
    """A dev peer did not start; the message names it and holds its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports (all sockets held open until every port is chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no log at {path})"


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    """Poll until ``host:port`` accepts a TCP connection (True) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def _stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# --------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------


def slurm_unavailable_reason() -> str | None:
    """Why a local Slurm cluster cannot start here, or ``None`` when it can.

    Needs root (slurmd runs jobs as their user and the daemons write their own state)
    and the Debian binaries ``slurmctld slurmd scontrol sbatch squeue sinfo munged``.
    """
    if os.geteuid() != 0:
        return "local Slurm cluster needs root (slurmd/munged run as root here)"
    missing = [b for b in _SLURM_BINARIES if shutil.which(b) is None]
    if shutil.which("mungekey") is None and shutil.which("create-munge-key") is None:
        missing.append("mungekey")
    if missing:
        return (
            "Slurm/munge binaries missing: " + ", ".join(missing)
            + " (run scripts/install-slurm.sh as root)"
        )
    return None


@dataclass
class SlurmCluster:
    """A running loopback Slurm cluster.

    ``env`` holds ``SLURM_CONF`` (and ``PATH``): pass it to any Slurm command, or set
    ``ClusterConfig.slurm_conf`` to ``conf_path``. ``stop()`` ends every daemon it started.
    """

    workdir: Path
    conf_path: Path
    nodes: list[str]
    slurmd_ports: list[int]
    ctld_port: int
    munge_socket: Path
    partition: str = "gpu"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def jobs_dir(self) -> Path:
        """Working directory of every client command (``WORKDIR/jobs``): an ``sbatch``
        without ``--output`` writes its ``slurm-<job>.out`` here, never into the caller's
        current directory (e.g. the repository root)."""
        path = self.workdir / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands against this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 30.0) -> str:
        """Run a Slurm client command (e.g. ``"sbatch", "-w", "gpu-01", ...``); stdout."""
        cp = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout,
            check=False, cwd=self.jobs_dir,
        )
        if check and cp.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed rc={cp.returncode}: {cp.stderr.strip()}")
        return cp.stdout

    def reset_nodes(self) -> None:
        """Resume every node and cancel every job: a clean cluster for the next test."""
        self.run("scancel", "--full", "--partition", self.partition, check=False)
        for n in self.nodes:
            self.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)

    def wait_responding(self, timeout_s: float = 90.0) -> bool:
        """Poll until no node is ``NOT_RESPONDING`` (slurmctld clears the flag at its next
        ping of the node, every ``SlurmdTimeout`` / 3 = 20 s here); False after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=5)
            if out.strip() and "not_responding" not in out.lower() and "*" not in out:
                return True
            time.sleep(0.5)
        return False

    def _wait_no_jobs(self, timeout_s: float) -> None:
        """Poll ``squeue`` until no job is left (or ``timeout_s`` passes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False, timeout=5).strip():
                return
            time.sleep(0.3)

    def slurmd_start_time(self, node: str) -> str | None:
        """The node's ``SlurmdStartTime`` as slurmctld shows it (``None`` when unreadable)."""
        out = self.run("scontrol", "-o", "show", "node", node, check=False, timeout=10)
        for part in out.split():
            if part.startswith("SlurmdStartTime="):
                return part.partition("=")[2]
        return None

    def restart_slurmd(self, node: str) -> None:
        """Restart one node's slurmd (its ``SlurmdStartTime`` changes: a simulated reboot).

        Returns once slurmctld shows the new ``SlurmdStartTime`` (the node registered
        again), so the simulated reboot is over for every later reader: a registration
        landing later would read as a second reboot to the next repair of the node.
        ``SlurmdStartTime`` has one-second resolution, so the new slurmd starts in a later
        second than the old one. Raises :class:`PeerStartError` when the port or the
        registration does not come within ``START_TIMEOUT_S``."""
        before = self.slurmd_start_time(node)
        proc = self.procs.get(f"slurmd-{node}")
        if proc is not None:
            _stop_process(proc)
        time.sleep(1.02 - time.time() % 1.0)  # into the next second
        self.procs[f"slurmd-{node}"] = self._start_slurmd(node)
        port = self.slurmd_ports[self.nodes.index(node)]
        if not wait_port("127.0.0.1", port, START_TIMEOUT_S):
            raise PeerStartError(f"slurmd {node} did not come back on port {port}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.slurmd_start_time(node) == before:
            if time.monotonic() > deadline:
                raise PeerStartError(f"slurmd {node} did not register again within "
                                     f"{START_TIMEOUT_S:.0f} s (SlurmdStartTime={before})")
            time.sleep(0.2)

    def _start_slurmd(self, node: str) -> subprocess.Popen[bytes]:
        log = self.workdir / "log" / f"slurmd-{node}.out"
        return subprocess.Popen(
            ["slurmd", "-D", "-N", node, "-f", str(self.conf_path)],
            env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True, cwd=self.jobs_dir,
        )

    def stop(self) -> None:
        """Cancel every job (so no slurmstepd outlives its slurmd), then stop slurmds,
        slurmctld and munged (in that order). Idempotent."""
        if self.procs:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", "--partition", self.partition, check=False,
                         timeout=10)
                self._wait_no_jobs(10.0)
        order = sorted(self.procs, key=lambda k: (k != "slurmd" and not k.startswith("slurmd"),
                                                   k == "munged"))
        for name in order:
            _stop_process(self.procs[name])
        self.procs.clear()


def _slurm_conf(
    workdir: Path, nodes: list[str], ports: list[int], ctld_port: int, sock: Path, cpus: int
) -> str:
    host = socket.gethostname()
    lines = [
        "# generated by workers.devpeers: loopback dev cluster (docs/design.md §3)",
        "ClusterName=autorepair",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock}",
        f"StateSaveLocation={workdir / 'state'}",
        f"SlurmdSpoolDir={workdir / 'spool'}/%n",
        f"SlurmctldPidFile={workdir / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={workdir / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={workdir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={workdir / 'log'}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        "MpiDefault=none",
        "JobRequeue=1",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "MinJobAge=30",
        "KillWait=2",
        "SchedulerParameters=sched_interval=1",
    ]
    for name, port in zip(nodes, ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory=1000 Gres=gpu:1 State=UNKNOWN"
        )
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def start_slurm_cluster(
    workdir: str | Path,
    nodes: list[str] | tuple[str, ...] = DEFAULT_NODES,
    ports: list[int] | tuple[int, ...] | None = None,
    ctld_port: int | None = None,
    cpus: int = 2,
) -> SlurmCluster:
    """Start munged, slurmctld and one slurmd per node under ``workdir``; return the handle.

    ``ports`` are the slurmd ports (one per node; default: free ephemeral ports — the
    demo passes ``DEFAULT_SLURMD_PORTS``); ``ctld_port`` likewise. Waits until every node
    answers (state not ``UNKNOWN``/``NOT_RESPONDING``), at most ``START_TIMEOUT_S``.

    Raises ``PeerStartError`` (daemon and log tail named) when a daemon does not come up,
    ``ValueError`` when ``ports`` and ``nodes`` differ in length, and ``RuntimeError``
    with :func:`slurm_unavailable_reason` when Slurm cannot run here.
    """
    reason = slurm_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    nodes = list(nodes)
    if not nodes:
        raise ValueError("nodes: at least one node name is needed, got []")
    ports_l = list(ports) if ports is not None else free_ports(len(nodes))
    if len(ports_l) != len(nodes):
        raise ValueError(f"ports: {len(ports_l)} ports given for {len(nodes)} nodes ({ports_l})")
    ctld = ctld_port or free_port()
    wd = Path(workdir).resolve()
    for sub in ("munge", "state", "spool", "run", "log", "etc", "jobs"):
        (wd / sub).mkdir(parents=True, exist_ok=True)
    for n in nodes:
        (wd / "spool" / n).mkdir(exist_ok=True)
    os.chmod(wd / "munge", 0o700)

    key = wd / "munge" / "munge.key"
    if not key.exists():
        if shutil.which("mungekey"):
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True,
                           capture_output=True)
        else:
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
    sock = wd / "munge" / "munge.socket"
    conf = wd / "etc" / "slurm.conf"
    conf.write_text(_slurm_conf(wd, nodes, ports_l, ctld, sock, cpus))
    (wd / "etc" / "gres.conf").write_text(
        f"NodeName={','.join(nodes)} Name=gpu File=/dev/null\n"
    )
    cluster = SlurmCluster(
        workdir=wd, conf_path=conf, nodes=nodes, slurmd_ports=ports_l, ctld_port=ctld,
        munge_socket=sock,
    )
    try:
        munge_log = wd / "log" / "munged.log"
        cluster.procs["munged"] = subprocess.Popen(
            [
                "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                f"--pid-file={wd / 'run' / 'munged.pid'}", f"--seed-file={wd / 'munge' / 'seed'}",
                f"--log-file={munge_log}",
            ],
            stdout=subprocess.DEVNULL, stderr=(wd / "log" / "munged.out").open("ab"),
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sock.exists():
            if cluster.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise PeerStartError(f"munged did not start:\n{_tail(wd / 'log' / 'munged.out')}")
            time.sleep(0.05)

        ctld_log = wd / "log" / "slurmctld.out"
        cluster.procs["slurmctld"] = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)],
            env=cluster.env, stdout=ctld_log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True, cwd=wd / "jobs",
        )
        if not wait_port("127.0.0.1", ctld, START_TIMEOUT_S):
            raise PeerStartError(
                f"slurmctld did not listen on {ctld}:\n{_tail(wd / 'log' / 'slurmctld.log')}"
            )
        for n in nodes:
            cluster.procs[f"slurmd-{n}"] = cluster._start_slurmd(n)
        _wait_nodes_up(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_nodes_up(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                fname = f"{name}.log" if name != "munged" else "munged.out"
                log = cluster.workdir / "log" / fname
                raise PeerStartError(f"{name} exited rc={proc.returncode}:\n{_tail(log)}")
        last = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
        states = dict(line.split() for line in last.splitlines() if line.strip())
        if len(states) == len(cluster.nodes) and all(
            not s.endswith("*")
            and not any(bad in s.lower() for bad in ("unknown", "down", "not_responding", "inval"))
            for s in states.values()
        ):
            return
        time.sleep(0.3)
    raise PeerStartError(
        f"Slurm nodes not up after {START_TIMEOUT_S}s: {last!r}\n"
        f"{_tail(cluster.workdir / 'log' / 'slurmctld.log')}"
    )


# --------------------------------------------------------------------------------------
# Redfish
# --------------------------------------------------------------------------------------


@dataclass
class RedfishEmulator:
    """A running ``sushy-emulator`` (fake driver) plus the clean-image HTTP server.

    ``url`` is the BMC base URL (``http://127.0.0.1:PORT``); ``systems`` maps each node
    name to its Redfish system id (a UUID); ``image_url`` is the clean image for
    virtual-media reprovisioning. ``username``/``password`` are the basic-auth pair.
    """

    workdir: Path
    url: str
    port: int
    systems: dict[str, str]
    username: str
    password: str
    image_url: str
    proc: subprocess.Popen[bytes] | None = None
    image_server: http.server.ThreadingHTTPServer | None = None

    def stop(self) -> None:
        """Stop the emulator and the image server. Idempotent."""
        if self.proc is not None:
            _stop_process(self.proc)
            self.proc = None
        if self.image_server is not None:
            self.image_server.shutdown()
            self.image_server.server_close()
            self.image_server = None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


def start_redfish_emulator(
    workdir: str | Path,
    nodes: list[str] | tuple[str, ...] = DEFAULT_NODES,
    port: int | None = None,
    username: str = "admin",
    password: str = "password",
    system_ids: dict[str, str] | None = None,
) -> RedfishEmulator:
    """Start ``sushy-emulator --config`` with the fake driver, one system per node (``On``).

    System ids are ``system_ids[node]`` when given (e.g. ``System.Embedded.1``, as real
    BMCs name them), else UUIDs derived from the node names (stable across restarts of the
    same workdir). The emulator's fake driver applies power changes 2–11 s after the request
    (its model of "hardware actions are not immediate", with the floor of
    ``workers.sushy_launch``). Raises ``PeerStartError`` with
    the emulator log when it does not answer within ``START_TIMEOUT_S``.
    """
    import bcrypt  # sushy-tools' own dependency (auth_basic)

    wd = Path(workdir).resolve()
    (wd / "state").mkdir(parents=True, exist_ok=True)
    (wd / "images").mkdir(exist_ok=True)
    image = wd / "images" / "clean-node.iso"
    if not image.exists():
        image.write_bytes(b"autorepair clean node image\n" * 64)
    port = port or free_port()
    systems = {n: (system_ids or {}).get(n) or str(uuid.uuid5(uuid.NAMESPACE_DNS,
                                                                f"{n}.autorepair.dev"))
               for n in nodes}
    htpasswd = wd / "htpasswd"
    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    htpasswd.write_text(f"{username}:{digest}\n")
    os.chmod(htpasswd, 0o600)
    fake = [
        {"uuid": u, "name": n, "power_state": "On", "external_notifier": False,
         "nics": [{"mac": f"52:54:00:00:00:{i:02x}", "ip": f"127.0.0.{10 + i}"}]}
        for i, (n, u) in enumerate(systems.items())
    ]
    conf = wd / "emulator.conf"
    conf.write_text(
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(wd / 'state')!r}\n"
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
    )
    handler = functools.partial(_QuietHandler, directory=str(wd / "images"))
    image_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=image_server.serve_forever, daemon=True).start()
    image_url = f"http://127.0.0.1:{image_server.server_address[1]}/{image.name}"
    log = wd / "emulator.log"
    proc = subprocess.Popen(
        # -P: the caller's current directory stays off sys.path (a stray module there
        # would shadow a library)
        [sys.executable, "-P", "-m", "workers.sushy_launch", "--config", str(conf)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    emu = RedfishEmulator(
        workdir=wd, url=f"http://127.0.0.1:{port}", port=port, systems=systems,
        username=username, password=password, image_url=image_url, proc=proc,
        image_server=image_server,
    )
    if not wait_port("127.0.0.1", port, START_TIMEOUT_S) or proc.poll() is not None:
        emu.stop()
        raise PeerStartError(f"sushy-emulator did not start on {port}:\n{_tail(log)}")
    return emu


# --------------------------------------------------------------------------------------
# Machine bridge: emulated BMC power edges -> the node's "reboot" in the dev peers
# --------------------------------------------------------------------------------------

#: Bridge poll interval, seconds. The dev emulator keeps a restarted system ``Off`` for
#: 2-11 s (``workers.sushy_launch``), ten polls or more, so the bridge sees every edge.
BRIDGE_POLL_S = 0.2
#: Event names passed to the bridge callback.
EVENT_POWER_ON = "power_on"
EVENT_REPROVISION = "reprovision"

#: ``callback(node, event)``: the machine under ``node`` came back on (``event`` is
#: :data:`EVENT_REPROVISION` when virtual media was inserted while it was off, else
#: :data:`EVENT_POWER_ON`: reboot, power cycle and power on look alike on Redfish).
BridgeCallback = Callable[[str, str], None]


class MachineBridge:
    """Makes emulated machines behave like machines: a power-on edge restarts the node.

    A background thread polls ``GET /redfish/v1/Systems/{id}`` of every node's system
    every ``poll_s`` seconds. When a system seen ``Off`` (or in a transitional state) is
    ``On`` again, ``callback(node, event)`` runs in a worker thread (calls for different
    nodes run concurrently, calls for one node in order) — e.g.
    ``SlurmCluster.restart_slurmd(node)`` in the dev Slurm cluster, where a Redfish power
    action alone does not restart slurmd, or a new ``bootID`` in a Kubernetes emulator.
    While a system is off its ``VirtualMedia`` members are read once; an inserted image
    makes the event :data:`EVENT_REPROVISION`.

    ``systems`` maps node name → Redfish system id (default: the emulator's own, one
    system per node). :meth:`bind` moves a node identity onto another machine's system
    (after a migrate). Every edge is appended to ``edges`` as ``(node, event, monotonic
    time)``. Unreachable emulator or HTTP errors are logged and retried next poll; a
    failing callback is logged and does not stop the bridge.

    Usage: ``MachineBridge(emulator, cb).start()`` ... ``.stop()``; also a context manager.
    """

    def __init__(
        self,
        redfish: RedfishEmulator,
        callback: BridgeCallback,
        systems: Mapping[str, str] | None = None,
        poll_s: float = BRIDGE_POLL_S,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s: must be > 0, got {poll_s!r}")
        self.url = redfish.url.rstrip("/")
        self.callback = callback
        self.poll_s = poll_s
        self._auth = (redfish.username, redfish.password)
        self._lock = threading.Lock()
        self._systems: dict[str, str] = dict(systems if systems is not None else redfish.systems)
        self._off: dict[str, bool] = {}
        self._media: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callers: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self.edges: list[tuple[str, str, float]] = []

    # -- mapping ------------------------------------------------------------------------
    def bind(self, node: str, system_id: str) -> None:
        """Watch ``system_id`` for ``node`` from now on (its machine changed)."""
        with self._lock:
            self._systems[node] = system_id
            self._off.pop(node, None)
            self._media.pop(node, None)

    @property
    def systems(self) -> dict[str, str]:
        """A copy of the node → system id mapping."""
        with self._lock:
            return dict(self._systems)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> MachineBridge:
        """Start polling in a daemon thread (idempotent); returns ``self``."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="machine-bridge", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and wait for running callbacks (at most ``timeout_s``). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        callers, self._callers = self._callers, {}
        for ex in callers.values():
            ex.shutdown(wait=True)

    def __enter__(self) -> MachineBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- polling --------------------------------------------------------------------------
    def _run(self) -> None:
        with httpx.Client(auth=self._auth, timeout=5.0) as http:
            while not self._stop.is_set():
                for node, sid in self.systems.items():
                    try:
                        self._poll(http, node, sid)
                    except (httpx.HTTPError, ValueError, KeyError) as e:
                        log.info("event=bridge_poll_failed node=%s error=%s", node,
                                 type(e).__name__)
                self._stop.wait(self.poll_s)

    def _poll(self, http: httpx.Client, node: str, sid: str) -> None:
        r = http.get(f"{self.url}/redfish/v1/Systems/{sid}")
        r.raise_for_status()
        power = str(r.json().get("PowerState", ""))
        with self._lock:
            if self._systems.get(node) != sid:
                return  # rebound meanwhile
            was_off = self._off.get(node)
        if power.lower() != "on":
            if not was_off:
                with self._lock:
                    self._off[node] = True
                    self._media[node] = False
            if not self._media.get(node):
                inserted = self._media_inserted(http, sid)
                with self._lock:
                    self._media[node] = self._media.get(node, False) or inserted
            return
        with self._lock:
            self._off[node] = False
            media = self._media.pop(node, False)
        if was_off:
            self._edge(node, EVENT_REPROVISION if media else EVENT_POWER_ON)

    def _media_inserted(self, http: httpx.Client, sid: str) -> bool:
        r = http.get(f"{self.url}/redfish/v1/Systems/{sid}/VirtualMedia")
        if r.status_code == 404:
            return False
        r.raise_for_status()
        for member in r.json().get("Members", []):
            m = http.get(self.url + str(member.get("@odata.id", "")))
            if m.status_code == 200 and m.json().get("Inserted"):
                return True
        return False

    def _edge(self, node: str, event: str) -> None:
        self.edges.append((node, event, time.monotonic()))
        log.info("event=machine_power_on node=%s cause=%s", node, event)
        if self._stop.is_set():
            return
        ex = self._callers.get(node)
        if ex is None:  # one thread per node: its callbacks run in order
            ex = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"machine-bridge-{node}"
            )
            self._callers[node] = ex

        def call() -> None:
            try:
                self.callback(node, event)
            except Exception as e:  # a broken callback must not stop the bridge
                log.warning("event=bridge_callback_failed node=%s cause=%s error=%s: %s",
                            node, event, type(e).__name__, e)

        ex.submit(call)

