"""Bearer-token checks and TLS material for the ingest listeners, and the one token-file
reader of the project.

Token files hold one token a line, the token first; blank lines and ``#`` comments are
ignored (:func:`read_token_lines`). The ingest listeners use the first field only
(:func:`load_tokens`, which also adds an environment variable holding comma-separated
tokens); the repair API reads ``TOKEN ROLE USER`` lines from the same format
(``workers.repairs.auth``). Comparison is constant time in the token length and visits
every configured token (``hmac.compare_digest``, :func:`find_token`), so neither timing
nor early exit tells which token nearly matched. Tokens never reach logs.
"""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workflows.config import TLSConfig

INGEST_TOKENS_ENV = "AUTOREPAIR_INGEST_TOKENS"
"""Environment variable with comma-separated receiver tokens (adds to ``tokens_file``)."""
ADMIN_TOKEN_ENV = "AUTOREPAIR_ADMIN_TOKEN"
"""Environment variable with the admin endpoint token (adds to ``admin_token_file``)."""


def read_token_lines(path: str | Path, field: str = "tokens file") -> list[tuple[int, list[str]]]:
    """``(line number, whitespace-separated fields)`` of every token line of ``path``
    (1-based numbers; blank lines and ``#`` comments skipped).

    ``field``: the configuration field that named the file, for messages. Raises
    ``ValueError`` ``"{field} '{path}': {reason}"`` when the file cannot be read.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{field} {str(path)!r}: {e.strerror}") from e
    out: list[tuple[int, list[str]]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((n, line.split()))
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
