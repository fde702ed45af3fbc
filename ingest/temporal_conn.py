"""How every Temporal client of the project connects: TLS / mTLS and the API key of
``temporal`` (:class:`workflows.config.TemporalConfig`).

The worker, ingest and the CLI all pass :func:`connect_options` to
``temporalio.client.Client.connect`` (``workers.temporal_client`` and
``ingest.service``), so a frontend that requires TLS, client certificates or an API key
(Temporal Cloud; a self-hosted frontend with its authorizer) is reached the same way by
all of them. Files are read when the client is built: restart the process to take a new
certificate or key. Nothing read here is logged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from workflows.config import TemporalConfig


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{field}: cannot read {path!r}: {e.strerror}") from e


def api_key(cfg: TemporalConfig) -> str | None:
    """The API key of ``temporal.api_key_file`` (first line) or the env var named by
    ``temporal.api_key_env``; ``None`` when neither is set. Raises ``ValueError`` naming the
    field when the file cannot be read or holds no key, or the variable is empty."""
    if cfg.api_key_file:
        lines = _read(cfg.api_key_file, "temporal.api_key_file").decode().splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"temporal.api_key_file: {cfg.api_key_file!r} holds no key")
        return key
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env, "").strip()
        if not key:
            raise ValueError(f"temporal.api_key_env: ${cfg.api_key_env} is not set or empty")
        return key
    return None


def tls_config(cfg: TemporalConfig) -> TLSConfig | bool:
    """The SDK's ``TLSConfig`` of ``temporal.tls``, or ``False`` (plain gRPC) when no key of
    it is set. Raises ``ValueError`` naming the field of a file that cannot be read."""
    t = cfg.tls
    if not t.enabled:
        return False
    return TLSConfig(
        server_root_ca_cert=_read(t.server_ca, "temporal.tls.server_ca") if t.server_ca
        else None,
        domain=t.server_name,
        client_cert=_read(t.client_cert, "temporal.tls.client_cert") if t.client_cert
        else None,
        client_private_key=_read(t.client_key, "temporal.tls.client_key") if t.client_key
        else None,
    )


async def connect(cfg: TemporalConfig, **kw: Any) -> Client:
    """``Client.connect`` to ``cfg.address`` / ``cfg.namespace`` with its TLS and API key
    (:func:`connect_options`) and the pydantic data converter; ``kw`` adds arguments
    (``lazy``, ``runtime``). Raises ``ValueError`` naming the field of an unreadable file,
    ``RuntimeError`` when the frontend cannot be reached or refuses the client."""
    return await Client.connect(cfg.address, namespace=cfg.namespace,
                                data_converter=pydantic_data_converter,
                                **connect_options(cfg), **kw)


def connect_options(cfg: TemporalConfig | None) -> dict[str, Any]:
    """``tls`` and ``api_key`` keyword arguments of ``Client.connect`` for ``cfg``
    (``None``: plain gRPC, no key, as ``temporal server start-dev`` serves). Raises
    ``ValueError`` naming the field (:func:`tls_config`, :func:`api_key`)."""
    if cfg is None:
        return {}
    return {"tls": tls_config(cfg), "api_key": api_key(cfg)}
