"""Configuration models of the control plane (``autorepair.yaml``).

Pure pydantic models with every default from docs/design.md §5; loading from YAML and
environment overrides lives in :mod:`workers.config` (I/O stays out of this package).
Every section is documented key by key in ``docs/configuration.md``.

Errors: constructing :class:`AutorepairConfig` from bad data raises
``pydantic.ValidationError`` whose messages carry the field path and the bad value.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.models import Action, Severity
from workflows.queues import BMC_TASK_QUEUE, TASK_QUEUE

#: Longest duration any ``*_s`` key may hold, seconds: ten years. Beyond it a duration
#: is a typo or an attempt at "for ever" that Python's ``timedelta`` and Temporal's
#: timers cannot represent (1e30 s overflows them); "never" has keys of its own
#: (``do_not_interrupt``, ``approval_timeout_s: null``).
MAX_DURATION_S = 10 * 365 * 86400


class _Section(BaseModel):
    """A configuration section: unknown keys, NaN and ±Inf (YAML ``.nan`` / ``.inf``,
    which the workflows' JSON payloads cannot carry) and durations over
    :data:`MAX_DURATION_S` are refused, naming the key and the value."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="after")
    def _durations_bounded(self) -> Self:
        for name in type(self).model_fields:
            v = getattr(self, name)
            if name.endswith("_s") and isinstance(v, int | float) and not isinstance(v, bool) \
                    and abs(v) > MAX_DURATION_S:
                raise ValueError(f"{name}: {v!r} s is longer than {MAX_DURATION_S} s "
                                 "(ten years)")
        return self


class TemporalTLSConfig(_Section):
    """TLS of every Temporal client (worker, ingest, CLI): server verification and,
    with ``client_cert``/``client_key``, mTLS. Temporal Cloud and any frontend behind its
    own authorizer need it (docs/security.md). TLS is on when any key is set."""

    #: PEM client certificate file (mTLS); requires ``client_key``.
    client_cert: str | None = None
    #: PEM private key file of ``client_cert``.
    client_key: str | None = None
    #: PEM CA bundle that signed the frontend's certificate (None = the system roots).
    server_ca: str | None = None
    #: Name to verify in the frontend's certificate (SNI too) when it differs from the
    #: host of ``temporal.address`` (None = that host).
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        """True when the client connects with TLS (any key set)."""
        return any((self.client_cert, self.client_key, self.server_ca, self.server_name))

    @model_validator(mode="after")
    def _pair(self) -> TemporalTLSConfig:
        if bool(self.client_cert) != bool(self.client_key):
            raise ValueError(f"temporal.tls: client_cert={self.client_cert!r} and "
                             f"client_key={self.client_key!r} must both be set")
        return self


class TemporalConfig(_Section):
    """Where the Temporal frontend is and how clients authenticate to it. Defaults match
    ``temporal server start-dev`` (plain gRPC, no credential)."""

    #: Temporal frontend ``host:port``.
    address: str = "127.0.0.1:7233"
    #: Temporal namespace of every workflow.
    namespace: str = "default"
    #: Task queue of workflows and activities (docs/design.md §4.4: ``autorepair``).
    task_queue: str = TASK_QUEUE
    #: Temporal Web UI port of the dev stack (docs/design.md §4.2: 8233).
    ui_port: int = Field(8233, ge=1, le=65535)
    #: Separate task queue for BMC calls so they can be rate limited (``bmc_rate_per_s``).
    bmc_task_queue: str = BMC_TASK_QUEUE
    #: Max BMC activity starts per second across the BMC queue.
    bmc_rate_per_s: float = Field(2.0, gt=0)
    #: Temporal Worker Versioning (docs/architecture.md "Upgrades"): the worker polls as
    #: version ``deployment_name`` / ``build_id``; repairs and validations are pinned to
    #: the build that started them, node and guard entities move to the current build on
    #: continue-as-new. Off: the worker polls unversioned (a server without Worker
    #: Deployments, e.g. the time-skipping test server).
    worker_versioning: bool = True
    #: Worker Deployment name (Temporal Worker Versioning).
    deployment_name: str = Field("autorepair", min_length=1, max_length=255)
    #: Build id of this worker; empty = the package version (``workers.version``).
    build_id: str = Field("", max_length=255)
    #: At start, make this build the deployment's current version when the deployment has
    #: none or an older one (PEP 440 order of build ids); a newer current version is left
    #: as it is, so an old build's worker that restarts while it drains never takes new
    #: work back. Off: an operator promotes (``temporal worker deployment
    #: set-current-version``).
    promote_on_start: bool = True
    #: TLS / mTLS of every Temporal client (worker, ingest, CLI).
    tls: TemporalTLSConfig = Field(default_factory=TemporalTLSConfig)
    #: File holding a Temporal API key (first line; Temporal Cloud API keys, or a
    #: frontend authorizer that takes ``Authorization: Bearer``). Sent on every call; read
    #: when the process starts (restart to rotate). None = no key.
    api_key_file: str | None = None
    #: Environment variable holding the API key instead of ``api_key_file``.
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _one_key(self) -> TemporalConfig:
        if self.api_key_file and self.api_key_env:
            raise ValueError("temporal: give one of api_key_file, api_key_env")
        return self


class LedgerConfig(_Section):
    """PostgreSQL ledger. ``dsn`` empty means: use the embedded server of ``autorepair up``."""

    #: PostgreSQL DSN (``postgresql://user@host/db``); empty = the dev stack's embedded one.
    dsn: str = ""
    #: Smallest connection pool size per process.
    min_pool: int = Field(1, ge=1)
    #: Largest connection pool size per process.
    max_pool: int = Field(10, ge=1)


class TLSConfig(_Section):
    """Optional TLS (and mTLS when ``client_ca`` is set) for a listener."""

    #: PEM server certificate file; TLS is on when cert and key are set.
    cert: str | None = None
    #: PEM private key file of ``cert``.
    key: str | None = None
    #: PEM CA bundle; when set, clients must present a certificate it signed (mTLS).
    client_ca: str | None = None
    #: Cluster a client certificate identified by its subject CN alone (no SPIFFE URI
    #: SAN) reports for: ``CN=gpu-01`` is node ``gpu-01`` of this cluster only. None: the
    #: one configured cluster; with several clusters configured, CN-only certificates are
    #: refused (401 / UNAUTHENTICATED). The SPIFFE SAN ``spiffe://…/cluster/C/node/N``
    #: names the cluster itself and is the recommended form (docs/security.md).
    cn_cluster: str | None = None


class ServiceAccountTokensConfig(_Section):
    """Kubernetes ServiceAccount tokens as per-node receiver identities (the Helm chart's
    default; docs/security.md). The agent presents its pod's projected token (audience
    ``audience``, expiry of minutes); ingest verifies it with the TokenReview API and binds
    it to the node the pod runs on: the API server's ``authentication.kubernetes.io/
    node-name`` claim (Kubernetes ≥ 1.30), else the pod named by the token's pod name +
    uid claims, whose ``spec.nodeName`` is read once and cached. A token that names no pod
    is refused: anyone allowed to create tokens for the service account could mint one."""

    #: Accept ServiceAccount tokens on the OTLP receivers.
    enabled: bool = False
    #: Audience the tokens must be issued for (the projected volume's ``audience``).
    audience: str = "autorepair-ingest"
    #: Cluster id of the nodes whose pods present these tokens (None = the one configured
    #: cluster; required when several are configured).
    cluster: str | None = None
    #: Service accounts whose tokens identify agents, ``NAMESPACE/NAME`` (the agent
    #: DaemonSet's); tokens of any other account are refused. Required when enabled.
    service_accounts: list[str] = Field(default_factory=list)
    #: Kubeconfig of the API server that reviews the tokens (None = in-cluster config).
    kubeconfig: str | None = None
    #: How long a verified token's identity is kept before it is reviewed again, seconds
    #: (never past the token's own ``exp``). 60: a revoked pod's token stops within a
    #: minute while one agent costs one review a minute, not one a push.
    cache_s: float = Field(60.0, gt=0)
    #: How long a refused token stays refused without asking again, seconds.
    failure_cache_s: float = Field(10.0, ge=0)
    #: TokenReview / pod reads in flight at once; a token that would exceed it is
    #: refused (401, retried by the agent), so unknown tokens cannot flood the API server.
    max_concurrent_reviews: int = Field(8, gt=0)
    #: Most tokens remembered at once, verified and refused ones each (apart, so made-up
    #: tokens never push a node's identity out); the oldest go first.
    max_cached_tokens: int = Field(100_000, gt=0)
    #: Longest wait for one TokenReview or pod read, seconds.
    timeout_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ServiceAccountTokensConfig:
        for sa in self.service_accounts:
            ns, sep, name = sa.partition("/")
            if not sep or not ns or not name or "/" in name:
                raise ValueError(f"ingest.service_account_tokens.service_accounts: {sa!r} is "
                                 "not NAMESPACE/NAME")
        if self.enabled and not self.service_accounts:
            raise ValueError("ingest.service_account_tokens.service_accounts: required when "
                             "enabled (the agent DaemonSet's NAMESPACE/NAME)")
        return self


class IngestLimitsConfig(_Section):
    """Per-identity bounds on sender-chosen values (``ingest.limits``; docs/security.md,
    ``ingest.quota``): what one credential (a node token, a collector, a certificate, a
    ServiceAccount token) may make ingest keep, so one identity cannot evict other nodes'
    state, take the label budget or inflate ``/metrics``. Beyond a cap that identity's
    points / records are rejected (``partial_success``, reason ``limit``) or its label
    values count as ``other``, counted in ``autorepair_identity_limited_total{what}``.
    Without authentication no per-identity bound applies."""

    #: Distinct nodes outside the inventory one identity may report at once (a node is
    #: forgotten one score TTL after its last report). 32: one DGX SuperPOD scalable
    #: unit, as ``ingest.unknown_node_burst``. A node identity reports only itself.
    unknown_nodes_per_identity: int = Field(32, ge=0)
    #: Distinct ``(cluster, cohort)`` score-map cohorts one identity may feed at once
    #: (forgotten one score TTL after its last score). 16: as the cohorts exported per
    #: cluster (``ingest.metrics.MAX_COHORTS_PER_CLUSTER``).
    cohorts_per_identity: int = Field(16, ge=1)
    #: NCCL communicators one node identity may open (held until the communicator expires
    #: or is evicted). 256: a node's eight ranks in a few dozen process groups each, with
    #: room to spare. When the engine's ``nccl.max_ranks`` is full, the communicator
    #: evicted is the least recently updated of the identity holding the most ranks.
    nccl_communicators_per_identity: int = Field(256, ge=1)
    #: The same for a collector identity (it speaks for many nodes).
    nccl_communicators_per_collector: int = Field(4096, ge=1)
    #: New Prometheus label values (fault kinds outside the catalogue, clusters outside
    #: ``clusters``, cohorts) one identity may introduce out of the global budget
    #: ``ingest.max_label_values``; further ones count as ``other`` / are not exported.
    label_values_per_identity: int = Field(8, ge=0)
    #: Alerts one node identity may have waiting in the hand-off queue
    #: (``ingest.alert_queue``) at once; beyond it that identity's pushes get 503 +
    #: ``Retry-After`` while every other sender's are taken. 256: a node's storm (every
    #: GPU's Xid, ECC and PCIe errors twice over) with room to spare.
    queued_alerts_per_identity: int = Field(256, ge=1)
    #: The same for a collector identity: half of the default ``ingest.alert_queue``
    #: (as ``max_inflight_per_collector`` is half of ``max_inflight``).
    queued_alerts_per_collector: int = Field(5000, ge=1)


class IngestConfig(_Section):
    """Ingest listeners (docs/design.md §4.2) and request limits."""

    #: Address the receivers and the API bind (the admin port always binds loopback).
    host: str = "0.0.0.0"
    #: OTLP gRPC port (docs/design.md §4.2: 4317; 0 = any free port, for tests).
    otlp_grpc_port: int = Field(4317, ge=0, le=65535)
    #: OTLP HTTP port (docs/design.md §4.2: 4318).
    otlp_http_port: int = Field(4318, ge=0, le=65535)
    #: HTTP API port: threshold, repairs, health, metrics (docs/design.md §4.2: 8080).
    api_port: int = Field(8080, ge=0, le=65535)
    #: Admin port, loopback only, bearer token (docs/design.md §4.2: 8081).
    admin_port: int = Field(8081, ge=0, le=65535)
    #: Largest accepted request body (compressed or not), bytes.
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    #: Largest decompressed body (gzip bomb guard), bytes.
    max_decompressed_bytes: int = Field(32 * 1024 * 1024, gt=0)
    #: Bounded in-flight request queue; beyond it the receivers answer 429/503.
    max_inflight: int = Field(512, gt=0)
    #: Requests of one identity (a node, a collector, a client certificate) in flight at
    #: once on each receiver; beyond it that identity alone gets 429 / RESOURCE_EXHAUSTED,
    #: so one token holder cannot take every slot of ``max_inflight``. 16: an agent has at
    #: most 2 pushes in flight (metrics and logs); a collector batches.
    max_inflight_per_identity: int = Field(16, gt=0)
    #: The same cap for one collector identity (it speaks for many nodes: an OTel
    #: Collector, the fleet simulator). 256: half of ``max_inflight``, so one collector
    #: cannot take every slot. Without authentication no per-identity cap applies.
    max_inflight_per_collector: int = Field(256, gt=0)
    #: gRPC calls in flight from one peer address (IP) at once; beyond it that peer gets
    #: RESOURCE_EXHAUSTED (a neighbour opening stalled streams cannot starve others).
    #: Agents behind one NAT address share it: raise it there.
    max_inflight_per_peer: int = Field(64, gt=0)
    #: gRPC streams one HTTP/2 connection may hold open (``grpc.max_concurrent_streams``).
    max_streams_per_connection: int = Field(8, gt=0)
    #: A gRPC connection with no call in flight for this long is closed (GOAWAY; gRPC's
    #: ``grpc.max_connection_idle_ms``), seconds, so idle connections cannot pile up:
    #: opening one needs no token. 300 s: thirty push intervals (``push_interval_s``
    #: 10 s) — a live agent pushes long before; one that was closed reconnects on its
    #: next push.
    grpc_idle_timeout_s: float = Field(300.0, gt=0)
    #: Longest time a new gRPC connection may take to finish its TLS / HTTP/2 handshake,
    #: seconds (``grpc.server_handshake_timeout_ms``; gRPC's own default is 120 s).
    grpc_handshake_timeout_s: float = Field(10.0, gt=0)
    #: Longest time to receive a request's message (gRPC) or body (HTTP) after its
    #: headers, seconds; a slower sender gets DEADLINE_EXCEEDED / 408. 10 s: twice the
    #: agent's push timeout (``push.timeout_s``, 5 s).
    receive_timeout_s: float = Field(10.0, gt=0)
    #: Longest time an HTTP connection may take to send a request's headers (from the
    #: connection or the request's first byte), seconds; then the connection is closed
    #: (slowloris guard).
    header_timeout_s: float = Field(10.0, gt=0)
    #: HTTP connections plus requests one HTTP listener serves at once (uvicorn's
    #: ``limit_concurrency``); beyond it new requests get 503. Agents keep one
    #: keep-alive connection each: size it above the nodes one ingest serves.
    limit_concurrency: int = Field(8192, gt=0)
    #: TLS / mTLS of both OTLP receivers.
    tls: TLSConfig = Field(default_factory=TLSConfig)
    #: Receiver tokens file, one per line: ``TOKEN node CLUSTER/NODE`` (may report for
    #: that node only), ``TOKEN collector CLUSTER[,CLUSTER…]`` or ``… collector *`` (for any
    #: node of those clusters), or a bare ``TOKEN`` (collector of every cluster); ``TOKEN``
    #: may be ``sha256:<hex>``. See docs/security.md.
    tokens_file: str | None = None
    #: Kubernetes ServiceAccount tokens (TokenReview) as per-node identities.
    service_account_tokens: ServiceAccountTokensConfig = Field(
        default_factory=ServiceAccountTokensConfig)
    #: Serve the OTLP receivers without authentication (no tokens, no mTLS):
    #: ``autorepair ingest`` refuses to start so unless this is true (logged loudly).
    insecure_allow_unauthenticated: bool = False
    #: Admin endpoint token file (required to serve /internal/state).
    admin_token_file: str | None = None
    #: Optional downstream OTLP/HTTP endpoint (the site's collector).
    forward_endpoint: str | None = None
    #: Bounded forwarding queue (requests); the oldest is dropped and counted when full.
    forward_queue: int = Field(10_000, gt=0)
    #: Data points stamped further than this in the future are rejected, seconds; a
    #: sender's clock may run this far behind too, so a score is rejected as stale only
    #: when older than the score TTL plus this.
    max_future_s: float = Field(300.0, gt=0)
    #: Bounded alert hand-off queue to Temporal; when full, log pushes get 503.
    alert_queue: int = Field(10_000, gt=0)
    #: Largest decoded OTLP/JSON body, bytes (after gzip). JSON costs ~10x the CPU of the
    #: same protobuf and is parsed in a worker thread; an agent's push is a few KB.
    max_json_bytes: int = Field(4 * 1024 * 1024, gt=0)
    #: Most resource blocks taken from one request; the rest are rejected and reported in
    #: the response's ``partial_success`` (OTLP).
    max_resources_per_request: int = Field(1000, gt=0)
    #: Most metric data points taken from one request (the rest rejected, as above).
    max_data_points_per_request: int = Field(100_000, gt=0)
    #: Most log records taken from one request (the rest rejected, as above).
    max_log_records_per_request: int = Field(10_000, gt=0)
    #: Most attributes on one resource, data point or log record, nested array and
    #: key-value list elements included; more rejects that resource, point or record.
    max_attributes: int = Field(128, gt=0)
    #: Longest attribute key or value: characters of a string, bytes of a bytes value.
    max_attribute_value_bytes: int = Field(16 * 1024, gt=0)
    #: Deepest nesting of array / key-value list attribute values.
    max_attribute_depth: int = Field(8, gt=0)
    #: Distinct values a label chosen by senders (fault kind outside the catalogue, cluster
    #: id outside ``clusters``, cohort) may take in Prometheus series; further fault kinds
    #: are counted as ``other``, further clusters' and cohorts' gauges are not exported.
    max_label_values: int = Field(64, gt=0)
    #: NodeWorkflows started per cluster for nodes outside the inventory (``clusters[].nodes``
    #: and the scheduler's node list): a token bucket of this many, refilled at
    #: ``unknown_nodes_per_minute``. 32: one DGX SuperPOD scalable unit, so a whole new
    #: unit whose agents report before the inventory lists it still gets its alerts
    #: recorded; every cluster id outside ``clusters`` shares one bucket.
    unknown_node_burst: int = Field(32, ge=0)
    #: Refill rate of the unknown-node bucket, NodeWorkflows per minute (1: a forger
    #: inventing names creates at most 1440 entities a day per cluster).
    unknown_nodes_per_minute: float = Field(1.0, ge=0)
    #: How often ``autorepair ingest`` re-reads each cluster's node list from its scheduler
    #: (``scontrol show node`` / the Kubernetes node list), seconds.
    inventory_refresh_s: float = Field(60.0, gt=0)
    #: Longest value kept in an alert's evidence (a string's characters, or another
    #: value's JSON form); a longer one is cut and named in ``evidence.cut_by_ingest``.
    max_evidence_value_chars: int = Field(4096, ge=64)
    #: Largest alert handed to Temporal (its JSON form), bytes. Over it, the largest
    #: evidence values are dropped, then the evidence text is cut. Temporal refuses a
    #: payload over 2 MiB (server ``limit.blobSize.error``) and warns from 512 KiB; the
    #: default keeps a node's continued state far below both.
    max_alert_bytes: int = Field(256 * 1024, ge=8192, le=2 * 1024 * 1024)
    #: Delivery attempts of one alert (exponential backoff between them) before it is
    #: written to the ledger's dead-letter table and counted in
    #: ``autorepair_alerts_dead_lettered_total`` (docs/design.md §4.5); the node's later alerts
    #: then go on. Attempts that find Temporal unreachable do not count: an outage is
    #: waited out.
    handoff_max_attempts: int = Field(12, ge=1)
    #: Longest wait for PostgreSQL to store one push's alerts (the ingest's outbox, the
    #: ledger's ``alerts`` table) before the push is answered 503 + ``Retry-After`` /
    #: UNAVAILABLE, seconds. Below the agent's push timeout (``push.timeout_s``, 5 s) so the
    #: agent hears "retry" rather than a timeout; a healthy write takes milliseconds.
    outbox_timeout_s: float = Field(2.0, gt=0)
    #: How often ingest re-delivers stored alerts that no workflow has taken yet and that
    #: this ingest does not hold (left by another ingest that died), seconds.
    outbox_resubmit_every_s: float = Field(30.0, gt=0)
    #: Age a stored, undelivered alert must reach before that re-delivery takes it,
    #: seconds: well past a normal hand-off (under a second idle, a few seconds in a storm).
    outbox_resubmit_after_s: float = Field(60.0, gt=0)
    #: An agent silent for this long raises ``node_unreachable``, seconds; ``None`` =
    #: the node TTL plus 3 push intervals (``threshold.push_interval_s`` ×
    #: (``ttl_multiplier`` + 3)).
    unreachable_after_s: float | None = Field(None, gt=0)
    #: Per-identity bounds on sender-chosen values.
    limits: IngestLimitsConfig = Field(default_factory=IngestLimitsConfig)


class ThresholdConfig(_Section):
    """Straggler threshold engine (docs/design.md §5)."""

    #: MAD multiplier k (docs/design.md §5 default 2.0).
    k: float = Field(2.0, gt=0)
    #: EMA smoothing factor α (docs/design.md §5 default 0.2).
    ema_alpha: float = Field(0.2, gt=0, le=1)
    #: Minimum active nodes for quorum (docs/design.md §5 default 5).
    statistical_min: int = Field(5, ge=1)
    #: Fraction of expected nodes that must report (docs/design.md §5 default 0.80).
    coverage: float = Field(0.80, ge=0, le=1)
    #: Agent push interval, seconds (docs/design.md §5 default 10).
    push_interval_s: float = Field(10.0, gt=0)
    #: Node TTL = ttl_multiplier × push interval (docs/design.md §5 default 5).
    ttl_multiplier: float = Field(5.0, gt=0)
    #: Panic when more than this fraction of active nodes would be flagged (design.md §5: half).
    panic_fraction: float = Field(0.5, gt=0, le=1)
    #: Consecutive pushes below threshold before a node is a straggler (server side).
    straggler_pushes: int = Field(3, ge=1)
    #: Consecutive pushes at/above threshold before a straggler recovers (hysteresis).
    recovery_pushes: int = Field(3, ge=1)
    #: Lower bound on the MAD (score units) so a flat fleet (MAD = 0) still yields a
    #: threshold below the median: a dip of k·1.4826·0.01 ≈ 0.03 is caught, float noise
    #: is not (ingest.threshold).
    mad_floor: float = Field(0.01, ge=0, le=0.5)


DEFAULT_COUNT_WINDOW_S = 600.0
"""Count window of a catalogue entry or override that names none, seconds (10 minutes:
the operator example of docs/design.md §5, "Xid 43 counts after 5 in 10 min"). Single source for
the catalogue, the ``NodeWorkflow`` and ingest (:mod:`workflows.catalogue.vocabulary`)."""



class NcclConfig(_Section):
    """NCCL collective health: per-op peer lag and slow-rank attribution (ingest.nccl).

    Memory is bounded by ``max_ranks`` × 4 bytes × (``max_pending_ops`` + ``window_ops``)
    plus a few hundred bytes per communicator (see docs/scaling.md).
    """

    #: Read ``autorepair.nccl.collective.duration_ms`` points (design.md §4.5); false ignores them.
    enabled: bool = True
    #: Sliding window of completed ops per communicator for the attribution.
    window_ops: int = Field(64, ge=8, le=4096)
    #: Ops the window must hold before any rank is attributed.
    min_ops: int = Field(16, ge=4)
    #: Share of the window's ops in which a node's rank must have arrived last.
    min_share: float = Field(0.5, gt=0, le=1)
    #: Attribution clears when the share falls below this (hysteresis).
    clear_share: float = Field(0.25, ge=0, le=1)
    #: Smallest median lag (ms) that can be attributed, whatever the noise.
    min_lag_ms: float = Field(0.25, ge=0)
    #: Median lag must be at least this many noise scales (1.4826·MAD of each rank's lag).
    noise_multiplier: float = Field(4.0, gt=0)
    #: Ops an attribution must hold before the ``nccl_slow_rank`` alert is raised.
    alert_ops: int = Field(16, ge=1)
    #: Ops waiting for ranks per communicator; the oldest is closed early beyond it.
    max_pending_ops: int = Field(128, ge=2, le=65536)
    #: An op still missing ranks after this long is closed with the ranks it has, seconds.
    op_timeout_s: float = Field(30.0, gt=0)
    #: An op closed early needs at least this fraction of its ranks, else it is dropped.
    min_present_fraction: float = Field(0.5, gt=0, le=1)
    #: A communicator with no point for this long is forgotten (job ended), seconds.
    comm_ttl_s: float = Field(600.0, gt=0)
    #: Ranks kept across all communicators; the least recently updated ones go first.
    max_ranks: int = Field(131_072, ge=2)
    #: Largest accepted ``nccl.nranks``.
    max_nranks: int = Field(65_536, ge=2)

    @model_validator(mode="after")
    def _check(self) -> NcclConfig:
        if self.min_ops > self.window_ops:
            raise ValueError(
                f"nccl.min_ops: {self.min_ops} exceeds nccl.window_ops {self.window_ops}")
        if self.clear_share > self.min_share:
            raise ValueError(f"nccl.clear_share: {self.clear_share} exceeds nccl.min_share "
                             f"{self.min_share}")
        if self.max_nranks > self.max_ranks:
            raise ValueError(f"nccl.max_nranks: {self.max_nranks} exceeds nccl.max_ranks "
                             f"{self.max_ranks}")
        return self

class CatalogueOverride(_Section):
    """Operator override for one code: action, severity, count in window (docs/design.md §5)."""

    #: Action for this code (None = catalogue default).
    action: Action | None = None
    #: Severity for this code (None = catalogue default).
    severity: Severity | None = None
    #: Occurrences on one node within ``window_s`` before the alert becomes actionable.
    count: int = Field(1, ge=1)
    #: Window of ``count``, seconds.
    window_s: float = Field(DEFAULT_COUNT_WINDOW_S, gt=0)
    #: Force actionable on/off (None = catalogue default).
    actionable: bool | None = None


class CatalogueConfig(_Section):
    """Per-code overrides of the default catalogue.

    ``xid`` and ``sxid`` map a numeric code to an override; ``kinds`` maps a fault kind
    (e.g. ``ib_link_down``) to one.
    """

    #: Overrides per Xid code.
    xid: dict[int, CatalogueOverride] = Field(default_factory=dict)
    #: Overrides per NVSwitch SXid code.
    sxid: dict[int, CatalogueOverride] = Field(default_factory=dict)
    #: Overrides per fault kind (the ``classify`` kinds, ``straggler``, watcher kinds).
    kinds: dict[str, CatalogueOverride] = Field(default_factory=dict)
    #: Repeats of an app-level Xid on the same GPU/GPC within this window recommend a
    #: diagnostic validation run (docs/design.md §5 catalogue; 24 h).
    app_xid_repeat_window_s: float = Field(24 * 3600.0, gt=0)
    #: Repeats on the same GPU/GPC within the window that recommend diagnostics (docs/design.md §5).
    app_xid_repeat_count: int = Field(2, ge=2)


class ConsentConfig(_Section):
    """Who decides whether (docs/design.md §5): approve-before-repair by default."""

    #: ``approve``: every repair waits for the approve signal unless listed below;
    #: ``automatic``: every repair but ``remove`` runs without approval.
    mode: Literal["approve", "automatic"] = "approve"
    #: Actions that run without approval (remove is never automatic).
    automatic_actions: list[Action] = Field(default_factory=list)
    #: Xid codes whose repairs run without approval.
    automatic_xids: list[int] = Field(default_factory=list)
    #: A recommendation nobody approves within this long ends ``timed_out`` (its evidence
    #: is stale by then); None = wait forever. Seconds (3 days: a long weekend).
    approval_timeout_s: float | None = Field(3 * 86400.0, gt=0)

    @model_validator(mode="after")
    def _remove_is_human(self) -> ConsentConfig:
        if Action.remove in self.automatic_actions:
            raise ValueError(
                "consent.automatic_actions: 'remove' is always human-initiated (docs/design.md §5)"
            )
        return self


class WaitForIdleConfig(_Section):
    """Wait-for-idle bound (docs/design.md §5: default 2 h, cap 24 h, or do-not-interrupt)."""

    #: Longest wait for the node to go idle before draining anyway (cap 24 h).
    max_wait_s: float = Field(2 * 3600.0, gt=0, le=24 * 3600.0)
    #: Wait without bound for the workload to finish (never interrupt it).
    do_not_interrupt: bool = False
    #: First idle re-check interval, seconds; it doubles after every busy answer up to
    #: ``poll_max_s`` so a wait of days keeps its Temporal history short.
    poll_s: float = Field(30.0, gt=0)
    #: Longest idle re-check interval after backing off, seconds (10 min: the end of a
    #: job is noticed within 10 minutes; a day of waiting costs at most 144 checks).
    poll_max_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _poll_bounds(self) -> WaitForIdleConfig:
        if self.poll_max_s < self.poll_s:
            raise ValueError(
                f"wait_for_idle.poll_max_s: {self.poll_max_s:g} is below poll_s {self.poll_s:g}"
            )
        return self


class LadderConfig(_Section):
    """Escalation ladder (docs/design.md §5): 2 attempts of one action in 7 days → next rung."""

    #: Attempts of the same action (same machine, alert kind and code) before moving up.
    attempts: int = Field(2, ge=1)
    #: Window of ``attempts``, seconds (7 days).
    window_s: float = Field(7 * 86400.0, gt=0)
    #: Rungs of the automatic ladder, lightest first; above the top a human decides.
    rungs: list[Action] = Field(
        default_factory=lambda: [Action.reboot, Action.reprovision, Action.migrate]
    )


class MigrateGateConfig(_Section):
    """Migrate needs a critical alert now or on the same machine within 10 days."""

    #: How far back a critical alert on the same machine justifies migrate (10 days).
    window_s: float = Field(10 * 86400.0, gt=0)


class RepeatOffenderConfig(_Section):
    """A machine that keeps needing disruptive repairs, whatever the fault (issue 31 item
    2): at ``threshold`` disruptive repairs within ``window_s`` its next recommendation
    is ``remove``, for a person (never automatic)."""

    #: Disruptive repairs (repairs with at least one executed power cycle, reboot, GPU
    #: reset, reprovision or migrate on the machine) that make a repeat offender (3).
    threshold: int = Field(3, ge=1)
    #: Window the repairs are counted in, seconds (30 days).
    window_s: float = Field(30 * 86400.0, gt=0)


class RailsConfig(_Section):
    """Safety rails (docs/design.md §5)."""

    #: Default persistence for level signals before they become actionable, seconds.
    persistence_s: float = Field(60.0, ge=0)
    #: Per-kind persistence overrides, seconds.
    persistence_by_kind: dict[str, float] = Field(default_factory=dict)
    #: Cooldown after any repair on a node (docs/design.md §5: ~30 min).
    cooldown_s: float = Field(1800.0, ge=0)
    #: Concurrent repairs allowed = max(min_concurrent, ceil(fraction × GPU nodes)).
    concurrency_fraction: float = Field(0.05, gt=0, le=1)
    #: Floor of the concurrency budget.
    min_concurrent: int = Field(1, ge=1)
    #: One repair per node pool at a time.
    one_per_pool: bool = True
    #: Breaker trips when automatic repairs/cordons in ``breaker_window_s`` exceed
    #: ``breaker_fraction`` × GPU nodes (at least ``breaker_min``).
    breaker_fraction: float = Field(0.10, gt=0, le=1)
    #: Floor of the breaker's trip count.
    breaker_min: int = Field(2, ge=1)
    #: Window in which automatic repairs/cordons are counted, seconds.
    breaker_window_s: float = Field(600.0, gt=0)
    #: Max detector-requested repairs in flight per cluster.
    detector_cap: int = Field(3, ge=0)
    #: Lease expiry when neither renewed nor released, seconds. Holders renew from every
    #: long wait (at half the TTL), so this bounds how long a dead holder blocks its slot.
    lease_ttl_s: float = Field(24 * 3600.0, gt=0)
    #: Longest wait for a lease (budget, node pool, breaker); past it the repair ends
    #: ``timed_out`` with the guard's last reason (its evidence is stale by then), seconds
    #: (24 h: the wait-for-idle cap of docs/design.md §5).
    lease_wait_max_s: float = Field(24 * 3600.0, gt=0)
    #: Bound on waiting for a node to come back healthy after the action.
    rejoin_timeout_s: float = Field(1800.0, gt=0)
    #: How often the node's health is re-read while waiting for it to rejoin, seconds.
    rejoin_poll_s: float = Field(30.0, gt=0)
    #: Drain deadline, seconds from when the repair began draining (retries never restart
    #: it); pods / jobs still there after it are listed in the failure and the node stays
    #: cordoned for a person.
    drain_deadline_s: float = Field(1800.0, gt=0)
    #: Heartbeat timeout of drain and machine actions: a dead worker's attempt is
    #: retried after it, so a repair resumes where it was when a worker dies.
    heartbeat_timeout_s: float = Field(300.0, gt=0)
    #: How long a machine action (power cycle, reboot, reprovision, migrate, remove) that
    #: fails with a transient error (BMC connection refused, HTTP 5xx, timeout) is retried,
    #: with exponential backoff, before the failure counts as a ladder attempt, seconds
    #: (15 min: a BMC cold reset or firmware update keeps it unreachable for minutes).
    #: A permanent error (credentials refused, 4xx) counts at once.
    action_retry_max_s: float = Field(900.0, gt=0)
    #: Disruptive actions (every executed action, failed ones and those cancelled after
    #: they touched the machine included; auto-resolved ones excluded) allowed on one
    #: node within ``max_actions_window_s``;
    #: the next one waits for a person (stage ``awaiting_approval``). Default 6: one full
    #: climb of the default ladder (3 rungs × 2 attempts, docs/design.md §5 ladder).
    max_actions_per_node: int = Field(6, ge=1)
    #: Window of ``max_actions_per_node``, seconds (7 days, the ladder's window).
    max_actions_window_s: float = Field(7 * 86400.0, gt=0)
    #: Repeat-offender machines (issue 31 item 2): ``remove`` for a person.
    repeat_offender: RepeatOffenderConfig = Field(default_factory=RepeatOffenderConfig)


class BmcConfig(_Section):
    """One machine's BMC. Credentials never appear here: they come from a secret."""

    #: Redfish service root URL of the BMC, e.g. ``https://10.0.0.5``.
    address: str
    #: Redfish system id (None = the only system the BMC lists).
    system_id: str | None = None
    #: Verify the BMC's TLS certificate.
    verify_tls: bool = True


class NodeConfig(_Section):
    """A node of a cluster and the machine under it."""

    #: Node name as the scheduler knows it.
    name: str
    #: Machine id under the node (None = same as the node name).
    machine: str | None = None
    #: Node pool (one repair per pool at a time).
    pool: str = "default"
    #: The machine's BMC (None = no power actions for this node).
    bmc: BmcConfig | None = None
    #: Failure domain (rack, NVLink clique, power feed) the node shares a cause with
    #: (issue 29 item 2; ``policy.domains``). None = only the scheduler's labels/features.
    failure_domain: str | None = Field(None, min_length=1, max_length=253,
                                       pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")


#: Whether repairs act (``enforce``) or only decide and record what they would have done
#: (``shadow``, issue 29 item 3): ``policy.mode``, ``clusters[].mode``,
#: ``clusters[].pools[].mode``.
PolicyMode = Literal["enforce", "shadow"]


class PoolConfig(_Section):
    """A node pool of a cluster (its nodes name it in ``nodes[].pool``) and what differs
    for it."""

    #: Pool name, as ``nodes[].pool`` gives it (a pool with a ``mode`` must be named by
    #: at least one ``nodes[].pool``, else the config is refused).
    name: str = Field(min_length=1)
    #: ``enforce`` or ``shadow`` for the pool's repairs (None = the cluster's mode).
    mode: PolicyMode | None = None


class ValidationConfig(_Section):
    """Machine re-validation (docs/design.md §1 step 5): where and how the check job runs.

    ``command`` is what the job runs on the node (the agent's suite, JSON on stdout).
    Slurm: a maintenance reservation ``{reservation_prefix}-<run>`` on the node and an
    ``sbatch -w NODE --reservation=...`` job whose output lands in ``output_dir`` (a
    directory the worker can read: shared filesystem in production). Kubernetes: a Job in
    ``namespace`` pinned to the node, tolerating ``autorepair.io/repair:NoSchedule``.
    """

    #: The check job's command line (prints the suite's JSON result on stdout).
    command: list[str] = Field(
        default_factory=lambda: ["autorepair-agent", "validate", "--json"]
    )
    #: Extra environment for the check job (e.g. ``AUTOREPAIR_VALIDATE_CONFIG``).
    env: dict[str, str] = Field(default_factory=dict)
    #: Bound on one run from placement to result, seconds (30 min: DCGM level 3 takes
    #: ~15 min, NCCL sweeps a few; docs/design.md §5 drain deadline uses the same order).
    timeout_s: float = Field(1800.0, gt=0, le=24 * 3600.0)
    #: Longest single wait of the collecting activity before it reports "not yet", seconds.
    poll_s: float = Field(30.0, gt=0)
    #: Slurm: job output directory (must be readable by the worker).
    output_dir: str = "/var/lib/autorepair/validation"
    #: Slurm: name prefix of the maintenance reservation of a run.
    reservation_prefix: str = "autorepair-validate"
    #: Slurm: user the maintenance reservation admits (the user submitting the job).
    reservation_user: str = "root"
    #: Slurm: partition of the check job (None = the cluster default).
    partition: str | None = None
    #: Kubernetes: namespace of the validation Job.
    namespace: str = "autorepair"
    #: Kubernetes: container image of the validation Job (the agent image).
    image: str = "ghcr.io/autorepair/agent:latest"
    #: Kubernetes: ``nvidia.com/gpu`` the Job requests (0 = use the node's GPUs unclaimed).
    gpus: int = Field(0, ge=0)
    #: Optional HTTP endpoint that receives each hardware ticket (JSON POST). A URL that
    #: holds a credential belongs in ``ticket_webhook_env`` / ``ticket_webhook_file``.
    ticket_webhook: str | None = None
    #: Environment variable of the worker holding the ticket webhook URL.
    ticket_webhook_env: str | None = None
    #: File holding the ticket webhook URL (first line), read when a ticket is posted.
    ticket_webhook_file: str | None = None

    @model_validator(mode="after")
    def _one_ticket_webhook(self) -> ValidationConfig:
        given = [k for k in ("ticket_webhook", "ticket_webhook_env", "ticket_webhook_file")
                 if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"validation: give one of {', '.join(given)}")
        return self


class AllowedDetector(_Section):
    """A detector whose Kubernetes annotation requests are taken as repair requests."""

    #: Repairs this detector may have in flight in the cluster (also bounded by
    #: ``policy.rails.detector_cap`` for all detectors together).
    cap: int = Field(1, ge=0)


class DetectorsConfig(_Section):
    """Which external detectors a cluster trusts (docs/detectors.md, docs/security.md).

    Annotation requests name their detector themselves, and ``nodes/patch`` is held by many
    cluster components (the kubelet for its own Node among them): a request is a repair
    request only when its detector is listed in ``allowed``; any other is recorded as an
    observed alert for an operator to act on.
    """

    #: Detector name → its settings. Empty (the default): no annotation opens a repair.
    allowed: dict[str, AllowedDetector] = Field(default_factory=dict)
    #: Repairs in flight per detector not listed in ``allowed`` (repair-API detectors, who
    #: authenticate with a token): one, so no single detector takes the cluster's whole
    #: ``policy.rails.detector_cap``.
    default_cap: int = Field(1, ge=0)

    def cap_of(self, detector: str) -> tuple[int, str]:
        """``(cap, config key that set it)`` of ``detector`` in this cluster."""
        entry = self.allowed.get(detector)
        if entry is not None:
            return entry.cap, f"detectors.allowed.{detector}.cap"
        return self.default_cap, "detectors.default_cap"


class ResetGpuPlatform(_Section):
    """What a node pool's platform allows for ``reset_gpu`` (docs/design.md §5: "GPU reset on the
    node, where the platform allows it"). Anything it forbids moves the repair to
    ``reboot`` before acting, with the reason in the repair's rule.

    Sources: nvidia-smi(1), ``-r/--gpu-reset`` (docs.nvidia.com/deploy/nvidia-smi): the
    GPU must not be in use; on NVLink systems a single GPU can be reset alone only from
    Ampere on, on Ampere NVSwitch systems with Fabric Manager running; MIG must be off.
    """

    #: Attempt ``reset_gpu`` on these nodes at all (false: every reset becomes a reboot).
    allowed: bool = True
    #: One GPU can be reset while its NVLink/NVSwitch peers stay up: standalone PCIe GPUs,
    #: Hopper and later, Ampere NVSwitch boards with Fabric Manager running. False for
    #: pre-Ampere NVLink boards (DGX-1/DGX-2) and Ampere NVSwitch boards without Fabric
    #: Manager: every peer would have to be reset in the same command.
    single_gpu: bool = True
    #: NVSwitch baseboard (HGX/DGX): a single-GPU reset needs every GPU of the baseboard
    #: idle, so the reset runs only after the whole node was drained, with nothing else
    #: placed there (Slurm maintenance reservation / Kubernetes cordon with the repair taint).
    nvswitch: bool = False
    #: MIG mode is enabled on these GPUs: a reset needs every GPU/compute instance
    #: destroyed and MIG disabled first, which autorepair never changes.
    mig: bool = False


class ResetGpuPolicy(ResetGpuPlatform):
    """``reset_gpu`` preconditions (the platform fields apply to every node pool unless
    ``pools`` names it) and when a failed reset moves up the ladder."""

    #: Per node pool platform, replacing the fields above for that pool.
    pools: dict[str, ResetGpuPlatform] = Field(default_factory=dict)
    #: Failed resets of the same fault on the machine within the ladder window after which
    #: the next repair goes to the next rung at once (1: a reset that did not clear the
    #: fault is not repeated; nvidia-smi(1): "If any GPU is not healthy a complete reset
    #: should be instigated by power cycling the node").
    failed_attempts: int = Field(1, ge=1)

    def for_pool(self, pool: str | None) -> ResetGpuPlatform:
        """The platform of node pool ``pool`` (the top-level fields when not listed)."""
        if pool is not None and pool in self.pools:
            return self.pools[pool]
        return ResetGpuPlatform(allowed=self.allowed, single_gpu=self.single_gpu,
                                nvswitch=self.nvswitch, mig=self.mig)


class ResetGpuConfig(_Section):
    """How ``reset_gpu`` runs on a cluster's drained node (the machinery of
    ``validation``): Slurm — a maintenance reservation ``{reservation_prefix}-<run>`` and
    an ``sbatch -w NODE`` job; Kubernetes — a privileged Job pinned to the node, tolerating
    ``autorepair.io/repair:NoSchedule``, with ``hostPID`` (the agent's ``/proc`` check).

    ``command`` runs once per GPU named by the evidence; ``{gpu}`` is replaced by the GPU
    as the evidence names it (PCI address, normalised to ``0000:bb:dd``, or index) and
    ``{pci}`` by its PCI address (a GPU named only by index cannot fill ``{pci}``: the
    reset does not run and the repair moves to reboot). Exit 0 done, 1 failed, 2 cannot
    run (``autorepair-agent reset-gpu``); the agent's JSON line is the evidence.
    """

    #: Reset command per GPU (``nvidia-smi --gpu-reset -i {gpu}`` also works, without
    #: the agent's preconditions and read-back).
    command: list[str] = Field(
        default_factory=lambda: ["autorepair-agent", "reset-gpu", "--pci", "{pci}", "--json"]
    )
    #: Evidence capture before a disruptive action (``policy.evidence_capture``), run as
    #: one job with this placement: ``{dir}`` → ``policy.evidence_capture.dir``,
    #: ``{repair}`` → the repair id, ``{tool_timeout}`` → seconds each tool may run.
    capture_command: list[str] = Field(
        default_factory=lambda: ["autorepair-agent", "capture", "--dir", "{dir}", "--repair",
                                 "{repair}", "--tool-timeout", "{tool_timeout}", "--json"]
    )
    #: Extra environment for the reset job.
    env: dict[str, str] = Field(default_factory=dict)
    #: Bound on one reset job from placement to result, seconds (10 min: the agent's
    #: reset command timeout 180 s plus its 60 s wait per GPU, for two GPUs, plus queueing).
    timeout_s: float = Field(600.0, gt=0, le=24 * 3600.0)
    #: Slurm: job output directory (must be readable by the worker).
    output_dir: str = "/var/lib/autorepair/reset"
    #: Slurm: name prefix of the maintenance reservation of a reset.
    reservation_prefix: str = "autorepair-reset"
    #: Slurm: user the maintenance reservation admits (the user submitting the job; the
    #: reset needs root on the node).
    reservation_user: str = "root"
    #: Slurm: partition of the reset job (None = the cluster default).
    partition: str | None = None
    #: Kubernetes: namespace of the reset Job (its pods are privileged: the namespace's
    #: Pod Security level must be ``privileged``).
    namespace: str = "autorepair"
    #: Kubernetes: container image of the reset Job (the agent image, with ``/bin/sh``).
    image: str = "ghcr.io/autorepair/agent:latest"
    #: Kubernetes: RuntimeClass that injects the NVIDIA driver tools (None = default).
    runtime_class: str | None = "nvidia"
    #: Replaces ``policy.reset_gpu`` for this cluster (None = the fleet-wide policy).
    policy: ResetGpuPolicy | None = None


class KubernetesConfig(_Section):
    """How a Kubernetes cluster's node conditions are trusted (``workers.watchers.kube``).

    Node conditions are written by whoever may patch ``nodes/status``: the built-in
    ``system:node-problem-detector`` role grants it cluster-wide, and its token sits on
    every node running node-problem-detector; ``managedFields`` names are client-chosen.
    So a condition (``KernelDeadlock``, ``ReadonlyFilesystem``) is **observed only**
    unless the node's own agent (a per-node identity at ingest, ``reported_by: node``)
    reported the same fault family within ``confirm_window_s``, or its type is listed in
    ``actionable_conditions``."""

    #: Condition types that repair without the agent's confirmation. RISK: anyone who may
    #: patch nodes/status (every node running node-problem-detector) can then reboot any
    #: node of the cluster by setting the condition on it. Leave empty unless the
    #: condition writers are trusted (docs/security.md).
    actionable_conditions: list[str] = Field(default_factory=list)
    #: Window around a condition's ``lastTransitionTime`` in which the node agent's own
    #: report of the same fault family confirms it, seconds (15 min: three of the
    #: watcher's 15 s polls are far inside it, and a kernel hung-task report repeats every
    #: 120 s by default, ``kernel.hung_task_timeout_secs``).
    confirm_window_s: float = Field(900.0, gt=0, le=24 * 3600.0)

    @model_validator(mode="after")
    def _condition_names(self) -> KubernetesConfig:
        for c in self.actionable_conditions:
            if not c or not c[0].isalpha() or not c.isalnum():
                raise ValueError(
                    f"kubernetes.actionable_conditions: {c!r} is not a node condition type "
                    "(letters and digits, e.g. ReadonlyFilesystem)")
        return self


class ClusterConfig(_Section):
    """A cluster: its scheduler, its GPU nodes and how to reach them."""

    #: Cluster id (``autorepair.cluster.id`` of its agents).
    name: str
    #: Which scheduler runs the cluster's nodes.
    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    #: Expected GPU node count (denominator for coverage, budget and breaker).
    gpu_nodes: int = Field(0, ge=0)
    #: The cluster's GPU nodes.
    nodes: list[NodeConfig] = Field(default_factory=list)
    #: Slurm: directory holding scontrol/sinfo/sbatch, and SLURM_CONF to use.
    slurm_bin_dir: str | None = None
    #: Slurm: ``SLURM_CONF`` path to use (None = the system default).
    slurm_conf: str | None = None
    #: Slurm: how a node's reboot is recognised. ``boot_time`` (default): its
    #: ``BootTime`` advanced by more than ``BOOT_TIME_JITTER_S`` (60 s; a slurmd
    #: restart on the same boot is not a reboot). ``slurmd_start``: ``SlurmdStartTime``
    #: changed, so a slurmd restart counts as a reboot: only for a test cluster whose
    #: reboots are simulated by restarting slurmd (the dev cluster).
    slurm_boot_identity: Literal["boot_time", "slurmd_start"] = "boot_time"
    #: Kubernetes: kubeconfig path (empty = in-cluster config).
    kubeconfig: str | None = None
    #: Provisioning provider: redfish virtual media, or an operator webhook.
    provisioner: Literal["redfish", "webhook"] = "redfish"
    #: Redfish virtual-media image URL used by reprovision.
    provision_image: str | None = None
    #: Webhook provider URL (provisioner ``webhook``). A URL that holds a credential
    #: belongs in ``provision_webhook_env`` / ``provision_webhook_file``.
    provision_webhook: str | None = None
    #: Environment variable of the worker holding the provisioning webhook URL.
    provision_webhook_env: str | None = None
    #: File holding the provisioning webhook URL (first line), read at each call.
    provision_webhook_file: str | None = None
    #: Machines in the hot-spare pool.
    spares: list[str] = Field(default_factory=list)
    #: Machine re-validation (docs/design.md §1 step 5).
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    #: External detectors this cluster trusts, and their caps.
    detectors: DetectorsConfig = Field(default_factory=DetectorsConfig)
    #: ``reset_gpu`` on this cluster's nodes: how the reset job runs, optional policy.
    reset_gpu: ResetGpuConfig = Field(default_factory=ResetGpuConfig)
    #: Kubernetes: which node conditions may repair without the agent's confirmation.
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    #: ``enforce`` or ``shadow`` for the cluster's repairs (None = ``policy.mode``).
    mode: PolicyMode | None = None
    #: Node pools with settings of their own (``mode``); a pool not listed takes the
    #: cluster's.
    pools: list[PoolConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _pools_unique(self) -> ClusterConfig:
        seen: set[str] = set()
        for i, p in enumerate(self.pools):
            if p.name in seen:
                raise ValueError(f"clusters[{self.name}].pools[{i}].name: pool {p.name!r} "
                                 "is listed twice")
            seen.add(p.name)
        # a mode no node can take is a rollout control that silently does nothing (a
        # shadow pool whose nodes then act in enforce): a node's pool is nodes[].pool
        named = {n.pool for n in self.nodes if n.pool}
        for i, p in enumerate(self.pools):
            if p.mode is not None and p.name not in named:
                raise ValueError(
                    f"clusters[{self.name}].pools[{i}].mode: {p.mode!r} applies to no node "
                    f"(no clusters[{self.name}].nodes[].pool is {p.name!r}; a node's pool is "
                    "its nodes[].pool): list the pool's nodes, or set the cluster's mode")
        return self

    def mode_of(self, pool: str | None, default: PolicyMode) -> PolicyMode:
        """The mode of ``pool``'s repairs: its ``pools[].mode``, else the cluster's
        ``mode``, else ``default`` (``policy.mode``)."""
        for p in self.pools:
            if p.name == pool and p.mode is not None:
                return p.mode
        return self.mode or default

    @model_validator(mode="after")
    def _one_provision_webhook(self) -> ClusterConfig:
        given = [k for k in ("provision_webhook", "provision_webhook_env",
                             "provision_webhook_file") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"clusters[{self.name}]: give one of {', '.join(given)}")
        return self

    @property
    def has_provision_webhook(self) -> bool:
        """True when some form of ``provision_webhook`` is configured."""
        return bool(self.provision_webhook or self.provision_webhook_env
                    or self.provision_webhook_file)

    @property
    def gpu_node_count(self) -> int:
        """GPU nodes of the cluster: ``gpu_nodes`` or, when 0, the listed nodes."""
        return self.gpu_nodes or len(self.nodes)


class SecretsConfig(_Section):
    """Where secrets live (files or env vars); never copied into workflow inputs."""

    #: YAML/JSON file ``{username, password}`` or per-machine ``{machine: {username, password}}``.
    bmc_credentials_file: str | None = None
    #: Env var holding the BMC user name when no file is set.
    bmc_username_env: str = "AUTOREPAIR_BMC_USERNAME"
    #: Env var holding the BMC password when no file is set.
    bmc_password_env: str = "AUTOREPAIR_BMC_PASSWORD"
    #: Bearer tokens of the repair API (same format as ``api.tokens_file``).
    api_tokens_file: str | None = None


class ApiConfig(_Section):
    """Repair API on the API port."""

    #: Bearer tokens file: ``TOKEN ROLE USER`` per line (roles: operator, detector, viewer).
    tokens_file: str | None = None


class NotifyEvent(StrEnum):
    """What a notification is about (per-channel ``events`` filter).

    Repair events come from the ledger's stage records (``activities.ledger_activities``);
    the others from the workflow that raised them (guard, node entity, validation)."""

    #: A repair recommendation waits for an operator's approve / reject.
    approval_needed = "approval_needed"
    #: The node was cordoned: the repair is under way.
    repair_started = "repair_started"
    #: The repair ended ``succeeded``, ``auto_resolved``, ``cancelled``, ``rejected`` or
    #: ``shadowed`` (shadow mode: the subject starts ``shadow:``).
    repair_finished = "repair_finished"
    #: The repair ended ``failed`` or ``timed_out`` (the node may be left cordoned).
    repair_failed = "repair_failed"
    #: The cluster's circuit breaker opened; automatic repairs are paused.
    breaker_tripped = "breaker_tripped"
    #: A machine failed re-validation; a hardware ticket was opened.
    validation_failed = "validation_failed"
    #: Repeated application-level Xids: a diagnostic validation is recommended.
    diagnostic_recommended = "diagnostic_recommended"
    #: Any other cluster-level alert (ingest panic mode).
    cluster_alert = "cluster_alert"


class NotificationChannel(_Section):
    """One place notifications go, with its own filters.

    The URL (and a PagerDuty routing key) is a secret: give it inline, or better by
    ``url_env`` / ``url_file`` (read by the worker when it starts); errors and logs show
    only its scheme and host."""

    #: ``webhook``: generic JSON POST; ``slack``: Slack-compatible incoming webhook
    #: (Block Kit); ``pagerduty``: PagerDuty Events API v2 (trigger / acknowledge / resolve,
    #: dedup key = repair id).
    type: Literal["webhook", "slack", "pagerduty"]
    #: Channel name in logs (default: the type and its position, e.g. ``slack#0``).
    name: str | None = None
    #: Endpoint URL (pagerduty default: ``https://events.pagerduty.com/v2/enqueue``).
    url: str | None = None
    #: Environment variable holding the URL instead of ``url``.
    url_env: str | None = None
    #: File holding the URL (first line) instead of ``url``.
    url_file: str | None = None
    #: PagerDuty: environment variable holding the integration's routing key.
    routing_key_env: str | None = None
    #: PagerDuty: file holding the routing key (first line).
    routing_key_file: str | None = None
    #: Only these severities (empty = all).
    severities: list[Severity] = Field(default_factory=list)
    #: Only these clusters (empty = all).
    clusters: list[str] = Field(default_factory=list)
    #: Only these events (empty = all).
    events: list[NotifyEvent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> NotificationChannel:
        sources = [x for x in (self.url, self.url_env, self.url_file) if x]
        if len(sources) > 1:
            raise ValueError(f"notifications.channels[{self.type}]: give one of url, url_env, "
                             "url_file")
        if not sources and self.type != "pagerduty":
            raise ValueError(f"notifications.channels[{self.type}]: url, url_env or url_file "
                             "is required")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"notifications.channels[{self.type}].url: not an http(s) URL")
        if self.type == "pagerduty" and not (self.routing_key_env or self.routing_key_file):
            raise ValueError("notifications.channels[pagerduty]: routing_key_env or "
                             "routing_key_file is required")
        if self.type != "pagerduty" and (self.routing_key_env or self.routing_key_file):
            raise ValueError(f"notifications.channels[{self.type}]: routing_key_* is only for "
                             "pagerduty")
        return self


class NotificationsConfig(_Section):
    """Where notifications go: repair lifecycle, breaker trips, failed validations,
    diagnostics. Delivery is best effort: queued in the worker, retried, never blocking
    or failing a workflow."""

    #: Generic JSON webhook receiving every notification (kept for older configs; the same
    #: as a ``webhook`` channel without filters). None = none.
    webhook_url: str | None = None
    #: Channels with their filters.
    channels: list[NotificationChannel] = Field(default_factory=list)
    #: Timeout of one delivery call, seconds.
    timeout_s: float = Field(10.0, gt=0)
    #: Tries per delivery (first call included) on network errors, 408, 429 and 5xx.
    attempts: int = Field(4, ge=1, le=20)
    #: First retry delay, doubled each retry (capped at 60 s; a 429's Retry-After is
    #: honoured up to that cap), seconds.
    backoff_s: float = Field(2.0, gt=0)
    #: Deliveries queued or in flight at most; beyond it new ones are dropped and logged.
    max_pending: int = Field(1000, ge=1)


class ProviderMatch(_Section):
    """Which nodes a provider rule covers; every key given must match (at least one)."""

    #: Node-name glob (``fnmatch``: ``gpu-a*``, ``node-[0-3]?``).
    node: str | None = None
    #: Node IP address or CIDR (``10.1.0.0/16``); matched against the agent's ``host.ip``.
    cidr: str | None = None
    #: Kubernetes node labels that must all be equal (agent attributes
    #: ``k8s.node.label.<key>``).
    labels: dict[str, str] = Field(default_factory=dict)
    #: Cluster id.
    cluster: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ProviderMatch:
        if not (self.node or self.cidr or self.labels or self.cluster):
            raise ValueError("providers.rules[].match: give node, cidr, labels or cluster")
        if self.cidr is not None:
            try:
                ipaddress.ip_network(self.cidr, strict=False)
            except ValueError:
                raise ValueError(
                    f"providers.rules[].match.cidr: {self.cidr!r} is not an IP address or CIDR"
                ) from None
        return self


class ProviderRule(_Section):
    """Facts about the nodes a rule matches. Unset facts fall through to later rules."""

    #: Which nodes.
    match: ProviderMatch
    #: Provider name (``aws``, ``coreweave``, ``onprem-dc1``), exported as
    #: ``autorepair.provider``.
    provider: str | None = None
    #: Region or site.
    region: str | None = None
    #: GPU model (``H100-SXM``).
    gpu_type: str | None = None
    #: GPUs in one node.
    gpus_per_node: int | None = Field(None, ge=1, le=1024)
    #: Price of one GPU for one hour, in ``providers.currency``.
    hourly_rate: float | None = Field(None, ge=0)


class ProvidersConfig(_Section):
    """Node → provider facts (provider, region, GPU type, GPUs per node, hourly rate).

    For each fact, the first rule (in file order) that matches the node and sets it wins;
    the mapping wins over what agents report (``cloud.provider``, ``cloud.region``).
    Downtime and cost of repairs use ``gpus_per_node`` and ``hourly_rate``."""

    #: ISO 4217 code of ``hourly_rate`` and every cost figure.
    currency: str = Field("USD", min_length=3, max_length=3, pattern=r"^[A-Z]{3}$")
    #: GPUs per node when no rule sets it (8: the HGX/DGX baseboard).
    default_gpus_per_node: int = Field(8, ge=1, le=1024)
    #: Rules, first match per fact.
    rules: list[ProviderRule] = Field(default_factory=list)


class WorkerConfig(_Section):
    """The worker process."""

    #: Prometheus port of the worker (spare-pool size and worker-side metrics); 0 = off.
    metrics_port: int = Field(9464, ge=0, le=65535)
    #: Address the worker's metrics port binds.
    metrics_host: str = "0.0.0.0"
    #: Run the Slurm / Kubernetes watchers and the annotation intake in this worker.
    watchers: bool = True
    #: During a long NotReady / NOT_RESPONDING / unreachable episode the node's BMC is
    #: asked again every this many seconds until it confirms a dead host (watchers and
    #: ingest's unreachable check), seconds.
    bmc_reprobe_s: float = Field(600.0, gt=0)


EVIDENCE_ACTIONS = (Action.power_cycle, Action.reprovision, Action.migrate, Action.remove)
"""The actions evidence is captured before by default: those that destroy what the fault
left behind (the GPU's state and the kernel log go with a power cycle; the disk with a
reprovision; the machine itself with a migrate or a remove)."""


class EvidenceCaptureConfig(_Section):
    """Evidence captured before a disruptive action (docs/design.md §5): on the node, an
    ``autorepair-agent capture`` job through the node-side path of ``reset_gpu``
    (``nvidia-bug-report.sh`` where present, else ``nvidia-smi -q``, the kernel log since
    boot and the agent's NVML counters, one archive under ``dir``); from the BMC, the last
    ``bmc_entries`` entries of the Redfish System Event Log. Bounded by ``timeout_s`` in
    all; a capture that fails or runs out of time is a note on the repair, never a failure."""

    #: Capture evidence at all.
    enabled: bool = True
    #: The actions evidence is captured before.
    actions: list[Action] = Field(default_factory=lambda: list(EVIDENCE_ACTIONS))
    #: Seconds the whole capture (node and BMC) may take; past it the repair goes on.
    #: 300: nvidia-bug-report.sh takes one to a few minutes on an 8-GPU host.
    timeout_s: float = Field(300.0, gt=0, le=3600)
    #: Directory on the node the archive is written to (kept there; its path, size and
    #: sha256 go to the ledger).
    dir: str = Field("/var/lib/autorepair/evidence", min_length=1)
    #: System Event Log entries read from the BMC (the newest first), 0 = none.
    bmc_entries: int = Field(50, ge=0, le=1000)

    @model_validator(mode="after")
    def _dir_absolute(self) -> EvidenceCaptureConfig:
        if not self.dir.startswith("/"):
            raise ValueError(f"policy.evidence_capture.dir: {self.dir!r} is not an absolute path")
        return self

    def applies_to(self, action: Action) -> bool:
        """Whether evidence is captured before ``action``."""
        return self.enabled and action in self.actions


class MaintenanceConfig(_Section):
    """Planned maintenance windows (issue 29 item 1): while a window covers a node its
    alerts are recorded and marked ``in_maintenance`` and nothing is recommended; for
    ``grace_s`` after it ends they are marked ``in_grace`` and a fault must persist or
    recur past the grace end before it is recommended."""

    #: Longest window an operator may open, seconds (24 h: a window forgotten open must
    #: not switch repair off for good).
    max_s: float = Field(24 * 3600.0, gt=0, le=30 * 86400.0)
    #: Grace period after maintenance, seconds: for this long after a window ends — and
    #: after a covered node's first report from a boot it made during the window or its
    #: grace — a fault must persist (a level fault still raised) or recur (an event
    #: fault reported again) past it before a repair is recommended. 900 s: the 15 min of
    #: issue 29 (planned rack reboots raise false faults for minutes after power-on).
    grace_s: float = Field(900.0, ge=0, le=86400.0)


class DomainsConfig(_Section):
    """Failure-domain holds (issue 29 item 2): when ``threshold`` distinct nodes of one
    domain raise actionable faults (reported by each node when raised) or ask for repairs
    the platform recommended (automatic, or approved by a person; an operator's own
    request is not counted) within ``window_s``, the cluster guard holds every
    automatic repair of the domain until an operator releases it
    (``autorepair domains release``). Membership: ``nodes[].failure_domain``, the values
    of the Kubernetes node labels ``label_keys``, the Slurm node features starting with
    ``slurm_feature_prefix`` (the rest of the feature names the domain)."""

    #: Distinct nodes of one domain that open a hold (3: two independent faults in a rack
    #: happen, three at once are a shared cause more often than not — issue 29).
    threshold: int = Field(3, ge=2, le=10_000)
    #: Seconds the nodes' requests must fall within (600: the false NVLink-down of a rack
    #: reboot arrived within minutes, NVSentinel PR #1715).
    window_s: float = Field(600.0, gt=0, le=86_400.0)
    #: Kubernetes node labels whose values name a node's domains (the well-known zone
    #: label, and the NVIDIA GPU operator's NVLink clique label).
    label_keys: list[str] = Field(default_factory=lambda: [
        "topology.kubernetes.io/zone", "nvidia.com/gpu.clique"])
    #: Slurm node feature prefix naming a domain (``Features=domain=rack7`` → ``rack7``).
    slurm_feature_prefix: str = Field("domain=", min_length=1, max_length=64)

    @model_validator(mode="after")
    def _keys(self) -> DomainsConfig:
        for k in self.label_keys:
            if not k or len(k) > 317 or any(c.isspace() for c in k):
                raise ValueError(f"policy.domains.label_keys: {k!r} is not a label key")
        if any(c.isspace() or c == "," for c in self.slurm_feature_prefix):
            raise ValueError("policy.domains.slurm_feature_prefix: "
                             f"{self.slurm_feature_prefix!r} has a space or a comma")
        return self


class PolicyConfig(_Section):
    """The policy bundle handed to workflows (pure data; no secrets)."""

    catalogue: CatalogueConfig = Field(default_factory=CatalogueConfig)
    consent: ConsentConfig = Field(default_factory=ConsentConfig)
    wait_for_idle: WaitForIdleConfig = Field(default_factory=WaitForIdleConfig)
    ladder: LadderConfig = Field(default_factory=LadderConfig)
    migrate_gate: MigrateGateConfig = Field(default_factory=MigrateGateConfig)
    rails: RailsConfig = Field(default_factory=RailsConfig)
    #: ``reset_gpu`` preconditions; a cluster's ``reset_gpu.policy`` replaces it there.
    reset_gpu: ResetGpuPolicy = Field(default_factory=ResetGpuPolicy)
    #: Evidence captured before disruptive actions.
    evidence_capture: EvidenceCaptureConfig = Field(default_factory=EvidenceCaptureConfig)
    #: Planned maintenance windows (``autorepair maintenance``).
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    #: Failure-domain holds (``autorepair domains``).
    domains: DomainsConfig = Field(default_factory=DomainsConfig)
    #: ``enforce``: repairs act. ``shadow``: every decision runs and is recorded (consent,
    #: ladder, budget, breaker, maintenance), but nothing is cordoned, drained or acted
    #: on: the repair ends ``shadowed`` saying what it would have done. A cluster's
    #: ``mode`` and a pool's ``clusters[].pools[].mode`` replace it there.
    mode: PolicyMode = "enforce"


class AutorepairConfig(_Section):
    """Root of ``autorepair.yaml``."""

    temporal: TemporalConfig = Field(default_factory=TemporalConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    threshold: ThresholdConfig = Field(default_factory=ThresholdConfig)
    nccl: NcclConfig = Field(default_factory=NcclConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    clusters: list[ClusterConfig] = Field(default_factory=list)
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)
    providers: ProvidersConfig = Field(default_factory=ProvidersConfig)

    def cluster(self, name: str) -> ClusterConfig:
        """The cluster called ``name``. Raises ``KeyError`` naming it when unknown."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"clusters: no cluster named {name!r}")
