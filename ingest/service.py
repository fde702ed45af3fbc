"""The ingest service: receivers, API, admin endpoint, recompute loop, hand-off, forwarding.

:class:`IngestService` runs everything on the caller's event loop:

* OTLP/gRPC on ``ingest.otlp_grpc_port`` (4317), OTLP/HTTP on ``ingest.otlp_http_port``
  (4318), the API on ``ingest.api_port`` (8080) — all on ``ingest.host``; the admin
  endpoint on ``127.0.0.1:ingest.admin_port`` (8081), loopback only whatever ``host`` says.
  A port of 0 binds a free ephemeral port; the bound ports are ``grpc_port``,
  ``http_port``, ``api_port``, ``admin_port`` after :meth:`IngestService.start`.
* TLS (and mTLS with ``ingest.tls.client_ca``) on the OTLP receivers and the API;
  bearer tokens from ``ingest.tokens_file`` and ``$AUTOREPAIR_INGEST_TOKENS`` on the
  receivers; the admin token from ``ingest.admin_token_file`` / ``$AUTOREPAIR_ADMIN_TOKEN``.
* The threshold recompute every ``threshold.push_interval_s`` seconds.
* The node inventory (:mod:`ingest.inventory`) refreshed from ``inventory_source`` every
  ``ingest.inventory_refresh_s`` seconds, first before the receivers start.
* Alerts to ``alert_sink`` (started/stopped here when it is a managed sink), optional
  forwarding to ``ingest.forward_endpoint``.

:func:`run_ingest` is the blocking entry point of ``autorepair ingest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import APIRouter, FastAPI

from ingest.api import build_admin_app, build_api_app
from ingest.auth import (
    ADMIN_TOKEN_ENV,
    INGEST_TOKENS_ENV,
    ReceiverAuth,
    TokenCheck,
    cn_binding,
    load_identities,
    load_tokens,
    server_ssl_context,
)
from ingest.forward import OtlpForwarder
from ingest.grpc_receiver import start_grpc_server
from ingest.handoff import AlertOutbox, AlertSink, DeadLetterStore, ManagedAlertSink
from ingest.http_receiver import OtlpHttpApp, peercert_protocol
from ingest.inventory import BindingsSource, InventorySource
from ingest.maintenance_marks import MaintenanceMarks
from ingest.metrics import IngestMetrics
from ingest.pipeline import Ingestor
from ingest.repair_metrics import RepairMetricsPoller
from ingest.temporal_conn import connect as temporal_connect
from ingest.unreachable import OpenAlerts
from workflows.config import AutorepairConfig
from workflows.policy.bmc import BmcProbe

if TYPE_CHECKING:
    from ingest.kube_tokens import TokenReviewer

log = logging.getLogger("autorepair.ingest")

LOOPBACK = "127.0.0.1"
INVENTORY_TIMEOUT_S = 30.0
"""Bound on one read of the schedulers' node lists, seconds (``scontrol`` gets 30 s in
the Slurm watcher too)."""

try:  # httptools is uvicorn's fast HTTP/1.1 parser (uvicorn[standard]); h11 otherwise.
    import httptools  # noqa: F401
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Proto
except ImportError:  # pragma: no cover - depends on the environment
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Proto  # type: ignore[assignment]
#: uvicorn protocol of the listeners: the fast parser, with the TLS client certificate in
#: each request's scope (mTLS identities) and a header timeout
#: (:func:`ingest.http_receiver.peercert_protocol`, built per listener in ``_start_uvicorn``).
_HTTP_BASE = _Proto

UNAUTHENTICATED_REFUSAL = (
    "ingest: the OTLP receivers would accept data from anyone: set ingest.tokens_file "
    "(per-node or collector tokens; or $AUTOREPAIR_INGEST_TOKENS) or ingest.tls.client_ca "
    "(mTLS), or set ingest.insecure_allow_unauthenticated: true to run without "
    "authentication"
)


class _Server(uvicorn.Server):
    """uvicorn server that leaves signal handling to :func:`run_ingest`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _bind(host: str, port: int, field: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP (accepted sockets inherit it); without it a response written as headers + body
    # waits for the client's delayed ACK, 40 ms on Linux
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"ingest.{field}: cannot bind {host}:{port}: {e.strerror}") from e
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class IngestService:
    """The whole ingest service (see module docstring).

    ``alert_sink``: where alerts go (``None``: alerts are logged and counted only).
    ``temporal_ready``: async check used by ``/readyz`` (``None``: not checked).
    ``routers``: extra FastAPI routers mounted on the API app (the repair API).
    ``clock``: seconds since the epoch, for tests.
    ``require_auth``: refuse (``RuntimeError`` naming the settings) to serve the receivers
    without authentication unless ``ingest.insecure_allow_unauthenticated`` is set, which
    is then logged loudly (``autorepair ingest`` passes True; docs/design.md §4.2).
    ``inventory_source``: reads the schedulers' node lists (``None``: the inventory is
    ``clusters[].nodes`` only).
    ``bmc_probe`` / ``open_alerts``: the BMC check and the ledger's open alerts of the
    ``node_unreachable`` tracker (:mod:`ingest.unreachable`).
    ``token_reviewer``: verifies Kubernetes ServiceAccount tokens (``None``: built from
    ``ingest.service_account_tokens`` when enabled; :mod:`ingest.kube_tokens`).
    """

    def __init__(
        self,
        config: AutorepairConfig,
        alert_sink: AlertSink | None = None,
        *,
        temporal_ready: Callable[[], Awaitable[bool]] | None = None,
        routers: Sequence[APIRouter] = (),
        clock: Callable[[], float] | None = None,
        require_auth: bool = False,
        inventory_source: InventorySource | None = None,
        bmc_probe: BmcProbe | None = None,
        open_alerts: OpenAlerts | None = None,
        bindings_source: BindingsSource | None = None,
        token_reviewer: TokenReviewer | None = None,
    ) -> None:
        self.config = config
        self.inventory_source = inventory_source
        self.bindings_source = bindings_source
        self._inventory_task: asyncio.Task[None] | None = None
        cfg = config.ingest
        self.metrics = IngestMetrics()
        self.alert_sink = alert_sink
        self.forwarder: OtlpForwarder | None = None
        if cfg.forward_endpoint:
            self.forwarder = OtlpForwarder(
                cfg.forward_endpoint, cfg.forward_queue,
                on_drop=lambda n: self.metrics.forward_dropped_total.inc(n),
                on_outcome=lambda o: self.metrics.forward_total.labels(o).inc(),
            )
        kwargs: dict[str, Any] = {}
        if clock is not None:
            kwargs["clock"] = clock
        self.ingestor = Ingestor(
            config, alert_sink=alert_sink, forwarder=self.forwarder, metrics=self.metrics,
            temporal_ready=temporal_ready, bmc_probe=bmc_probe, open_alerts=open_alerts,
            **kwargs,
        )
        cn_allowed, cn_cluster = cn_binding(cfg.tls.cn_cluster,
                                            [c.name for c in config.clusters])
        self.token_reviewer = token_reviewer
        if token_reviewer is None and cfg.service_account_tokens.enabled:
            from ingest.kube_tokens import TokenReviewer  # kubernetes_asyncio: only when used

            self.token_reviewer = TokenReviewer.from_config(
                cfg.service_account_tokens, [c.name for c in config.clusters])
        self.receiver_auth = ReceiverAuth(
            load_identities(cfg.tokens_file, INGEST_TOKENS_ENV),
            mtls=bool(cfg.tls.client_ca), cn_allowed=cn_allowed, cn_cluster=cn_cluster,
            resolver=self.token_reviewer.identify if self.token_reviewer else None)
        if require_auth and not self.receiver_auth.enabled:
            if not cfg.insecure_allow_unauthenticated:
                raise RuntimeError(UNAUTHENTICATED_REFUSAL)
            log.warning("event=INSECURE_RECEIVERS ingest.insecure_allow_unauthenticated is "
                        "true: anyone who reaches the OTLP ports can report faults for any "
                        "node (and, with automatic repairs, power-cycle it)")
        self.admin_auth = TokenCheck(tuple(load_tokens(cfg.admin_token_file, ADMIN_TOKEN_ENV)))
        self.ssl_context: ssl.SSLContext | None = server_ssl_context(cfg.tls)
        # /api/v1/state: any token of the repair API's tokens file (every role may read)
        self.api_auth = TokenCheck(tuple(load_tokens(
            config.api.tokens_file or config.secrets.api_tokens_file)))
        self.api_app: FastAPI = build_api_app(self.ingestor, routers=routers,
                                              state_auth=self.api_auth)
        self.admin_app: FastAPI = build_admin_app(self.ingestor, self.admin_auth)
        self.http_app = OtlpHttpApp(self.ingestor, auth=self.receiver_auth)
        self.grpc_port = 0
        self.http_port = 0
        self.api_port = 0
        self.admin_port = 0
        self._servers: list[_Server] = []
        self._serve_tasks: list[asyncio.Task[None]] = []
        self._grpc: Any = None
        self._compute_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._started = False

    async def _start_uvicorn(self, app: Any, host: str, port: int, field: str,
                             tls: bool) -> int:
        sock = _bind(host, port, field)
        bound = int(sock.getsockname()[1])
        t = self.config.threshold
        kw: dict[str, Any] = {}
        tls_cfg = self.config.ingest.tls
        if tls and self.ssl_context is not None:
            kw = {"ssl_certfile": tls_cfg.cert, "ssl_keyfile": tls_cfg.key}
            if tls_cfg.client_ca:
                kw |= {"ssl_ca_certs": tls_cfg.client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        ic = self.config.ingest
        config = uvicorn.Config(
            app, http=peercert_protocol(_HTTP_BASE, ic.header_timeout_s), lifespan="off",
            access_log=False, log_level="warning",
            # keep connections of agents pushing every push interval open between pushes
            timeout_keep_alive=int(t.push_interval_s * 2 + 5),
            limit_concurrency=ic.limit_concurrency,
            server_header=False, date_header=False, **kw,
        )
        server = _Server(config)
        self._servers.append(server)
        self._serve_tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
        for _ in range(500):
            if server.started:
                break
            if self._serve_tasks[-1].done():
                self._serve_tasks[-1].result()
                raise RuntimeError(f"ingest.{field}: server on {host}:{bound} stopped")
            await asyncio.sleep(0.01)
        return bound

    async def start(self) -> None:
        """Bind and start every listener, the hand-off, the forwarder and the recompute loop.

        Raises ``RuntimeError`` naming the config field of a port that cannot be bound.
        """
        if self._started:
            return
        cfg = self.config.ingest
        if self.inventory_source is not None or self.bindings_source is not None:
            await self.refresh_inventory()
            self._inventory_task = asyncio.create_task(self._inventory_loop())
        if isinstance(self.alert_sink, ManagedAlertSink):
            await self.alert_sink.start()
        if self.forwarder is not None:
            await self.forwarder.start()
        self._grpc, self.grpc_port = await start_grpc_server(
            self.ingestor, cfg.host, cfg.otlp_grpc_port, auth=self.receiver_auth)
        self.http_port = await self._start_uvicorn(
            self.http_app, cfg.host, cfg.otlp_http_port, "otlp_http_port", tls=True)
        self.api_port = await self._start_uvicorn(
            self.api_app, cfg.host, cfg.api_port, "api_port", tls=True)
        self.admin_port = await self._start_uvicorn(
            self.admin_app, LOOPBACK, cfg.admin_port, "admin_port", tls=False)
        await self.ingestor.compute()
        self._compute_task = asyncio.create_task(self._compute_loop())
        self._started = True
        log.info("event=ingest_started grpc=%d http=%d api=%d admin=%d tls=%s auth=%s",
                 self.grpc_port, self.http_port, self.api_port, self.admin_port,
                 self.ssl_context is not None, self.receiver_auth.enabled)

    async def _compute_loop(self) -> None:
        interval = self.config.threshold.push_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.ingestor.compute()
            except Exception:
                log.exception("event=threshold_compute_failed")

    async def refresh_inventory(self, timeout_s: float = INVENTORY_TIMEOUT_S) -> bool:
        """Read the schedulers' node lists once into the inventory; False (logged) when
        the source failed or took longer than ``timeout_s`` (the previous lists stay).
        Reads the ledger's machine bindings too (``bindings_source``; a failure keeps the
        previous bindings and is logged)."""
        if self.bindings_source is not None:
            try:
                bound = await asyncio.wait_for(self.bindings_source(), timeout_s)
            except Exception as e:
                log.warning("event=bindings_refresh_failed error=%s", type(e).__name__)
            else:
                for cluster, b in bound.items():
                    self.ingestor.inventory.bind(cluster, b)
        if self.inventory_source is None:
            return False
        try:
            lists = await asyncio.wait_for(self.inventory_source(), timeout_s)
        except Exception as e:
            log.warning("event=inventory_refresh_failed error=%s", type(e).__name__)
            return False
        self.ingestor.inventory.update(lists)
        log.info("event=inventory_refreshed %s", " ".join(
            f"{c}={self.ingestor.inventory.size(c)}" for c in sorted(lists)))
        return True

    async def _inventory_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.ingest.inventory_refresh_s)
            await self.refresh_inventory()

    async def compute_now(self) -> None:
        """Run one recompute immediately (tests, operators)."""
        await self.ingestor.compute()

    async def stop(self) -> None:
        """Stop listeners (in-flight requests finish), the loop, forwarding and the hand-off."""
        if self._compute_task is not None:
            self._compute_task.cancel()
            await asyncio.gather(self._compute_task, return_exceptions=True)
            self._compute_task = None
        if self._inventory_task is not None:
            self._inventory_task.cancel()
            await asyncio.gather(self._inventory_task, return_exceptions=True)
            self._inventory_task = None
        if self._grpc is not None:
            await self._grpc.stop(grace=2.0)
            self._grpc = None
        for s in self._servers:
            s.should_exit = True
        await asyncio.gather(*self._serve_tasks, return_exceptions=True)
        self._servers, self._serve_tasks = [], []
        self.http_app.close()
        if self.token_reviewer is not None:
            await self.token_reviewer.close()
        if self.forwarder is not None:
            await self.forwarder.stop()
        await self.ingestor.unreachable.close()
        if isinstance(self.alert_sink, ManagedAlertSink):
            await self.alert_sink.stop()
        self._started = False
        self._stopped.set()

    async def run_forever(self) -> None:
        """Start (if needed) and serve until :meth:`stop` is called."""
        await self.start()
        await self._stopped.wait()

    async def __aenter__(self) -> IngestService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


#: Builds extra API routers once the Temporal client exists (called with the client and
#: the inventory's ``known(cluster, node)``); returns the routers and coroutines to await
#: at shutdown. ``autorepair ingest`` passes the repair API's
#: (``workers.repairs.router``): ingest itself depends only on ``workflows`` (docs/design.md §2).
RoutersFactory = Callable[..., tuple[list[APIRouter], list[Callable[[], Awaitable[None]]]]]


async def _serve(config: AutorepairConfig, routers_for: RoutersFactory | None = None,
                 inventory_source: InventorySource | None = None,
                 dead_letters: DeadLetterStore | None = None,
                 bmc_probe: BmcProbe | None = None,
                 open_alerts: OpenAlerts | None = None,
                 outbox: AlertOutbox | None = None,
                 bindings_source: BindingsSource | None = None,
                 maintenance: MaintenanceMarks | None = None) -> None:
    from ingest.handoff import TemporalAlertSink

    # temporal.tls and temporal.api_key_file, as every Temporal client of the project
    client = await temporal_connect(config.temporal, lazy=True)

    async def temporal_ready() -> bool:
        try:
            return bool(await asyncio.wait_for(client.service_client.check_health(), 2.0))
        except Exception:
            return False

    service: IngestService
    ic = config.ingest
    sink = TemporalAlertSink(
        client, config.temporal.task_queue, queue_size=ic.alert_queue,
        max_attempts=ic.handoff_max_attempts, max_value_chars=ic.max_evidence_value_chars,
        max_alert_bytes=ic.max_alert_bytes, dead_letters=dead_letters,
        outbox=outbox, outbox_timeout_s=ic.outbox_timeout_s,
        resubmit_every_s=ic.outbox_resubmit_every_s,
        resubmit_after_s=ic.outbox_resubmit_after_s,
        on_outcome=lambda o: service.metrics.alert_handoff_total.labels(o).inc(),
        on_dead_letter=lambda r: service.metrics.alerts_dead_lettered_total.labels(r).inc(),
        queued_per_identity=ic.limits.queued_alerts_per_identity,
        queued_per_collector=ic.limits.queued_alerts_per_collector,
        maintenance=maintenance,
    )
    service = IngestService(config, sink, temporal_ready=temporal_ready,
                            require_auth=True, inventory_source=inventory_source,
                            bmc_probe=bmc_probe, open_alerts=open_alerts,
                            bindings_source=bindings_source)
    # the repair API refuses nodes outside the same inventory the receivers gate on
    routers, closers = (routers_for(client, service.ingestor.inventory.known)
                        if routers_for is not None else ([], []))
    for r in routers:
        service.api_app.include_router(r)
    poller = RepairMetricsPoller(
        client, service.metrics,
        # configured clusters plus those admitted as metric labels: a bounded set however
        # many cluster ids senders make up (ingest.max_label_values)
        lambda: [c.name for c in config.clusters] + sorted(service.metrics.clusters.admitted),
        providers=service.ingestor.providers,
        task_queue=config.temporal.task_queue,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    poll_task = asyncio.create_task(poller.run(), name="repair-metrics")
    print(
        f"autorepair ingest: OTLP gRPC :{service.grpc_port}, OTLP HTTP :{service.http_port}, "
        f"API http://{config.ingest.host}:{service.api_port}, "
        f"admin http://{LOOPBACK}:{service.admin_port}", flush=True,
    )
    try:
        await stop.wait()
    finally:
        log.info("event=ingest_stopping")
        poll_task.cancel()
        await asyncio.gather(poll_task, return_exceptions=True)
        await service.stop()
        for close in closers:
            await close()


def run_ingest(config: AutorepairConfig, routers_for: RoutersFactory | None = None,
               inventory_source: InventorySource | None = None,
               dead_letters: DeadLetterStore | None = None, bmc_probe: BmcProbe | None = None,
               open_alerts: OpenAlerts | None = None, outbox: AlertOutbox | None = None,
               bindings_source: BindingsSource | None = None,
               maintenance: MaintenanceMarks | None = None) -> None:
    """Blocking entry point of ``autorepair ingest``: serve until SIGINT/SIGTERM.

    Connects lazily to Temporal at ``config.temporal.address`` (ingest starts and buffers
    alerts even while Temporal is down; ``/readyz`` reports it). ``routers_for`` adds API
    routers built on the Temporal client (the repair API). Raises ``RuntimeError``
    naming the port field when a listener cannot bind. ``inventory_source`` reads the
    schedulers' node lists (:mod:`ingest.inventory`); ``dead_letters`` keeps the alerts
    that cannot be delivered (``autorepair ingest`` passes the ledger's); ``bmc_probe`` /
    ``open_alerts`` serve the ``node_unreachable`` check (:mod:`ingest.unreachable`);
    ``outbox`` stores every accepted alert before the push is answered and re-delivers
    what a killed ingest left (:mod:`ingest.handoff`; ``autorepair ingest`` passes the
    ledger; ``None``: accepted alerts live in memory until delivered). ``bindings_source``
    reads the ledger's node → machine bindings, the machines alerts are stamped with.
    ``maintenance`` marks alerts of nodes inside a maintenance window before delivery
    (:mod:`ingest.maintenance_marks`; ``None``: no windows).
    """
    asyncio.run(_serve(config, routers_for, inventory_source, dead_letters, bmc_probe,
                       open_alerts, outbox, bindings_source, maintenance))
