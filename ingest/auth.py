"""Bearer-token checks and TLS material for the ingest listeners.

Tokens come from a file (one a line; blank lines and ``#`` comments ignored; a line may
carry more whitespace-separated fields, only the first is the token) and/or an
environment variable holding comma-separated tokens. Comparison is constant time in the
token length and visits every configured token (``hmac.compare_digest``), so neither
timing nor early exit tells which token nearly matched. Tokens never reach logs.
"""

from __future__ import annotations

import hmac
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from workflows.config import TLSConfig

INGEST_TOKENS_ENV = "AUTOREPAIR_INGEST_TOKENS"
"""Environment variable with comma-separated receiver tokens (adds to ``tokens_file``)."""
ADMIN_TOKEN_ENV = "AUTOREPAIR_ADMIN_TOKEN"
"""Environment variable with the admin endpoint token (adds to ``admin_token_file``)."""


def load_tokens(path: str | None, env: str | None = None) -> list[bytes]:
    """Tokens from ``path`` and the env var ``env``.

    Raises ``ValueError`` naming the file when it cannot be read or holds no token.
    """
    tokens: list[bytes] = []
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"tokens file {path!r}: {e.strerror}") from e
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                tokens.append(line.split()[0].encode())
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
        cand = cand.strip()
        ok = False
        for t in self.tokens:
            ok |= hmac.compare_digest(cand, t)
        return ok


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
