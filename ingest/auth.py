"""Bearer-token checks, receiver identities and TLS material for the ingest listeners,
and the one token-file reader of the project.

Receiver identities (:class:`Identity`, :class:`ReceiverAuth`): a per-node token, a
collector token or a client certificate says which node(s) a request may report for; the
receivers reject data about any other node (docs/design.md §4.2). The admin endpoint keeps plain
bearer tokens (:class:`TokenCheck`).

Token files hold one token a line, the token first; blank lines and ``#`` comments (whole
line or trailing) are ignored (:func:`read_token_lines`). The ingest listeners use the
first field only (:func:`load_tokens`, which also adds an environment variable holding
comma-separated tokens); the repair API reads ``TOKEN ROLE USER`` lines from the same format
(``workers.repairs.auth``). Comparison is constant time in the token length and visits
every configured token (``hmac.compare_digest``, :func:`find_token`), so neither timing
nor early exit tells which token nearly matched. Tokens never reach logs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workflows.config import TLSConfig

INGEST_TOKENS_ENV = "AUTOREPAIR_INGEST_TOKENS"
"""Environment variable with comma-separated receiver tokens (adds to ``tokens_file``)."""
ADMIN_TOKEN_ENV = "AUTOREPAIR_ADMIN_TOKEN"
"""Environment variable with the admin endpoint token (adds to ``admin_token_file``)."""


def read_token_lines(path: str | Path, field: str = "tokens file") -> list[tuple[int, list[str]]]:
    """``(line number, whitespace-separated fields)`` of every token line of ``path``
    (1-based numbers; blank lines and ``#`` comments skipped, whole-line or trailing: a
    field starting with ``#`` ends the line's fields, so ``TOKEN ROLE USER  # who`` has
    three; a ``#`` inside a field, as in a token, is kept).

    ``field``: the configuration field that named the file, for messages. Raises
    ``ValueError`` ``"{field} '{path}': {reason}"`` when the file cannot be read.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{field} {str(path)!r}: {e.strerror}") from e
    out: list[tuple[int, list[str]]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        fields: list[str] = []
        for f in raw.split():
            if f.startswith("#"):
                break
            fields.append(f)
        if fields:
            out.append((n, fields))
    return out


def find_token(candidate: bytes, tokens: Sequence[bytes]) -> int | None:
    """Index of the first of ``tokens`` equal to ``candidate``, or ``None``; compares
    against every token (``hmac.compare_digest``, no early exit)."""
    found: int | None = None
    for i, t in enumerate(tokens):
        if hmac.compare_digest(candidate, t) and found is None:
            found = i
    return found


def load_tokens(path: str | None, env: str | None = None) -> list[bytes]:
    """Tokens (first field of each line) from ``path`` and the env var ``env``.

    Raises ``ValueError`` naming the file when it cannot be read or holds no token.
    """
    tokens: list[bytes] = []
    if path:
        tokens = [fields[0].encode() for _, fields in read_token_lines(path)]
        if not tokens:
            raise ValueError(f"tokens file {path!r}: no token in it")
    if env:
        tokens += [t.strip().encode() for t in os.environ.get(env, "").split(",") if t.strip()]
    return tokens


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """Bearer-token verifier. ``enabled`` is false when no token is configured."""

    tokens: tuple[bytes, ...]

    @property
    def enabled(self) -> bool:
        """True when at least one token is configured."""
        return bool(self.tokens)

    def check_header(self, value: str | bytes | None) -> bool:
        """True when ``value`` is ``Bearer <token>`` for a configured token (constant time)."""
        if value is None:
            return False
        raw = value.encode() if isinstance(value, str) else value
        scheme, _, cand = raw.partition(b" ")
        if scheme.lower() != b"bearer" or not cand:
            return False
        return find_token(cand.strip(), self.tokens) is not None


def server_ssl_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """Server TLS context from ``tls`` (``None`` when no cert); mTLS when ``client_ca`` set.

    Raises ``ValueError`` naming the field when only one of cert/key is set.
    """
    if not tls.cert and not tls.key:
        if tls.client_ca:
            raise ValueError("ingest.tls.client_ca: set, but ingest.tls.cert/key are not")
        return None
    if not tls.cert or not tls.key:
        raise ValueError(f"ingest.tls: cert={tls.cert!r} and key={tls.key!r} must both be set")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca:
        ctx.load_verify_locations(tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def grpc_tls_material(tls: TLSConfig) -> tuple[bytes, bytes, bytes | None] | None:
    """``(key, cert, client_ca or None)`` PEM bytes for ``grpc.ssl_server_credentials``."""
    if server_ssl_context(tls) is None:
        return None
    assert tls.cert and tls.key
    ca = Path(tls.client_ca).read_bytes() if tls.client_ca else None
    return Path(tls.key).read_bytes(), Path(tls.cert).read_bytes(), ca


# --------------------------------------------------------------------- receiver identities
ROLE_NODE = "node"
ROLE_COLLECTOR = "collector"
HASH_PREFIX = "sha256:"
"""A tokens-file entry ``sha256:<64 hex>`` holds the token's SHA-256, not the token."""
SPIFFE_PATH = re.compile(r"spiffe://[^/]+/cluster/([^/]+)/(?:node/([^/]+)|(collector))")
"""SPIFFE-style URI SAN: ``spiffe://<trust domain>/cluster/<cluster>/node/<node>`` (a node)
or ``spiffe://<trust domain>/cluster/<cluster>/collector`` (a collector of that cluster)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who an OTLP request comes from, and what it may report for.

    ``role`` ``node``: only ``node`` (of ``cluster``; ``None`` = the node name binds alone,
    as a certificate whose CN names the node). ``collector``: any node of ``clusters``
    (``None`` = every cluster). ``label`` names it in logs and errors (never the token).
    """

    role: str
    label: str
    cluster: str | None = None
    node: str | None = None
    clusters: frozenset[str] | None = None
    #: what tells this credential from others of the same ``label`` (two collector
    #: tokens for the same clusters: their tokens-file lines); ``None``: the label does.
    #: Not part of equality: two lines naming the same subject are the same *grant*.
    key: str | None = field(default=None, compare=False)

    @property
    def id(self) -> str:
        """Key of this credential's per-identity caps (in-flight slots, ``ingest.limits``):
        the label, with ``key`` when set. Never the token."""
        return self.label if self.key is None else f"{self.label} ({self.key})"

    def may_report(self, cluster: str, node: str) -> bool:
        """True when this identity may send data about ``node`` of ``cluster``."""
        if self.role == ROLE_COLLECTOR:
            return self.clusters is None or cluster in self.clusters
        return node == self.node and (self.cluster is None or cluster == self.cluster)


def parse_identity_line(line: str, where: str) -> tuple[bytes, bool, Identity]:
    """One tokens-file line → ``(token or its SHA-256, hashed, identity)``.

    Format ``TOKEN ROLE SUBJECT`` (the repair API's ``TOKEN ROLE USER`` shape): ``TOKEN
    node CLUSTER/NODE`` or ``TOKEN collector CLUSTER[,CLUSTER…]`` (``*`` = every cluster);
    a line with the token alone is a collector of every cluster (one token shared by all
    senders, the pre-identity format). ``TOKEN`` may be ``sha256:<hex>``. Raises
    ``ValueError`` naming ``where`` (file and line) and the bad field, never the token.
    """
    fields = line.split()
    token = fields[0]
    hashed = token.startswith(HASH_PREFIX)
    if hashed:
        digest = token[len(HASH_PREFIX):]
        if not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            raise ValueError(f"{where}: {HASH_PREFIX} must be followed by 64 hex digits")
        secret = bytes.fromhex(digest)
    else:
        secret = token.encode()
    if len(fields) == 1:
        return secret, hashed, Identity(ROLE_COLLECTOR, "shared token")
    if len(fields) != 3:
        raise ValueError(f"{where}: expected 'TOKEN node CLUSTER/NODE' or "
                         f"'TOKEN collector CLUSTERS', got {len(fields)} fields")
    role, subject = fields[1], fields[2]
    if role == ROLE_NODE:
        cluster, sep, node = subject.partition("/")
        if not sep or not cluster or not node or "/" in node:
            raise ValueError(f"{where}: node identity {subject!r} is not CLUSTER/NODE")
        return secret, hashed, Identity(ROLE_NODE, f"node {cluster}/{node}", cluster, node)
    if role == ROLE_COLLECTOR:
        clusters = None if subject == "*" else frozenset(
            c for c in subject.split(",") if c)
        if clusters is not None and not clusters:
            raise ValueError(f"{where}: collector {subject!r} names no cluster")
        return secret, hashed, Identity(ROLE_COLLECTOR, f"collector of {subject}",
                                        clusters=clusters)
    raise ValueError(f"{where}: role {role!r} is not 'node' or 'collector'")


def load_identities(path: str | None, env: str | None = None
                    ) -> list[tuple[bytes, bool, Identity]]:
    """Entries of the receivers' tokens file (:func:`parse_identity_line`) plus the bare
    tokens of the env var ``env`` (shared collector tokens). Raises ``ValueError`` naming
    the file when it cannot be read, holds no token, or a line is malformed."""
    out: list[tuple[bytes, bool, Identity]] = []
    if path:
        for i, fields in read_token_lines(path):
            secret, hashed, ident = parse_identity_line(
                " ".join(fields), f"tokens file {path!r} line {i}")
            out.append((secret, hashed, replace(ident, key=f"line {i}")))
        if not out:
            raise ValueError(f"tokens file {path!r}: no token in it")
    if env:
        for j, t in enumerate(os.environ.get(env, "").split(",")):
            if t.strip():
                out.append((t.strip().encode(), False,
                            Identity(ROLE_COLLECTOR, "shared token", key=f"{env} #{j + 1}")))
    return out


#: Resolves a bearer token that no tokens-file entry holds (a Kubernetes ServiceAccount
#: token: :class:`ingest.kube_tokens.TokenReviewer`); ``None`` = not an identity.
TokenResolver = Callable[[bytes], Awaitable["Identity | None"]]


def cn_binding(cn_cluster: str | None, clusters: Sequence[str]) -> tuple[bool, str | None]:
    """``(CN-only certificates accepted, cluster they are bound to)`` for
    ``ingest.tls.cn_cluster`` and the configured cluster names (``clusters[].name``).

    ``cn_cluster`` set: bound to it (raises ``ValueError`` naming the field when clusters
    are configured and it is none of them). Unset: one configured cluster → bound to it;
    several → CN-only certificates are refused (a CN such as ``gpu-01`` repeats across
    clusters); none configured (a dev setup) → accepted, bound to no cluster."""
    if cn_cluster is not None:
        if clusters and cn_cluster not in clusters:
            raise ValueError(f"ingest.tls.cn_cluster: {cn_cluster!r} is not a configured "
                             f"cluster ({', '.join(sorted(clusters))})")
        return True, cn_cluster
    if len(clusters) == 1:
        return True, clusters[0]
    if len(clusters) > 1:
        return False, None
    return True, None


class ReceiverAuth:
    """Authenticates OTLP requests: bearer tokens (per node, per collector, hashed or not),
    Kubernetes ServiceAccount tokens (``resolver``, verified by TokenReview) and client
    certificates (mTLS). ``enabled``: some credential is required.

    ``cn_allowed`` / ``cn_cluster``: whether a certificate naming its node by subject CN
    alone is accepted, and the cluster it is then bound to (:func:`cn_binding`)."""

    def __init__(self, entries: list[tuple[bytes, bool, Identity]], *, mtls: bool = False,
                 cn_allowed: bool = True, cn_cluster: str | None = None,
                 resolver: TokenResolver | None = None) -> None:
        self.entries = entries
        self.mtls = mtls
        self.cn_allowed = cn_allowed
        self.cn_cluster = cn_cluster
        self.resolver = resolver

    @property
    def enabled(self) -> bool:
        """True when requests must carry a token or a client certificate."""
        return bool(self.entries) or self.mtls or self.resolver is not None

    @staticmethod
    def bearer(value: str | bytes | None) -> bytes | None:
        """The token of ``Authorization: Bearer <token>`` (``None`` for another scheme)."""
        if value is None:
            return None
        raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
        scheme, _, cand = raw.partition(b" ")
        cand = cand.strip()
        if scheme.lower() != b"bearer" or not cand:
            return None
        return cand

    def from_header(self, value: str | bytes | None) -> Identity | None:
        """The tokens-file identity of ``Authorization: Bearer <token>``, or ``None``.
        Visits every entry and compares in constant time (plain tokens) or compares
        SHA-256 digests."""
        cand = self.bearer(value)
        if cand is None:
            return None
        digest = hashlib.sha256(cand).digest()
        found: Identity | None = None
        for secret, hashed, ident in self.entries:
            if hmac.compare_digest(digest if hashed else cand, secret) and found is None:
                found = ident
        return found

    async def authenticate(self, value: str | bytes | None) -> Identity | None:
        """:meth:`from_header`, then (for a token no entry holds) the ``resolver``
        (TokenReview). ``None``: no identity (the caller answers 401/UNAUTHENTICATED)."""
        ident = self.from_header(value)
        if ident is not None or self.resolver is None:
            return ident
        cand = self.bearer(value)
        if cand is None:
            return None
        return await self.resolver(cand)

    def from_peercert(self, cert: dict[str, Any] | None) -> Identity | None:
        """Identity of a verified client certificate (``ssl`` ``getpeercert()`` dict)."""
        return identity_from_peercert(cert, cn_allowed=self.cn_allowed,
                                      cn_cluster=self.cn_cluster)

    def from_auth_context(self, ctx: dict[str, list[bytes]]) -> Identity | None:
        """Identity of a verified client certificate (gRPC ``auth_context()``)."""
        return identity_from_auth_context(ctx, cn_allowed=self.cn_allowed,
                                          cn_cluster=self.cn_cluster)


def identity_from_cert(uris: list[str], common_name: str | None, *, cn_allowed: bool = True,
                       cn_cluster: str | None = None) -> Identity | None:
    """Identity of a verified client certificate: a SPIFFE-style URI SAN
    (:data:`SPIFFE_PATH`), else (when ``cn_allowed``) the subject CN as the node name of
    ``cn_cluster`` (``None``: any cluster; :func:`cn_binding` decides both)."""
    for uri in uris:
        m = SPIFFE_PATH.fullmatch(uri)
        if m:
            cluster, node, collector = m.groups()
            if collector:
                return Identity(ROLE_COLLECTOR, f"collector of {cluster} (certificate)",
                                clusters=frozenset({cluster}))
            return Identity(ROLE_NODE, f"node {cluster}/{node} (certificate)", cluster, node)
    if common_name and cn_allowed:
        where = f"{cn_cluster}/{common_name}" if cn_cluster else common_name
        return Identity(ROLE_NODE, f"node {where} (certificate CN)", cn_cluster, common_name)
    return None


def identity_from_peercert(cert: dict[str, Any] | None, **kw: Any) -> Identity | None:
    """:func:`identity_from_cert` (``kw``: its ``cn_*`` arguments) of an ``ssl``
    ``getpeercert()`` dict (HTTP receiver)."""
    if not cert:
        return None
    uris = [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]
    cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"),
              None)
    return identity_from_cert(uris, cn, **kw)


def identity_from_auth_context(ctx: dict[str, list[bytes]], **kw: Any) -> Identity | None:
    """:func:`identity_from_cert` (``kw``: its ``cn_*`` arguments) of a gRPC
    ``auth_context()`` (gRPC receiver)."""
    sans = [v.decode("utf-8", "replace") for v in ctx.get("x509_subject_alternative_name", [])]
    uris = [s for s in sans if s.startswith("spiffe://")]
    cn_raw = ctx.get("x509_common_name", [])
    cn = cn_raw[0].decode("utf-8", "replace") if cn_raw else None
    return identity_from_cert(uris, cn, **kw)
