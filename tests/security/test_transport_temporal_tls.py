"""Item 3 of issue 27: every Temporal client of the project (worker, ingest, CLI) takes
``temporal.tls`` (``client_cert``, ``client_key``, ``server_ca``, ``server_name``) and
``temporal.api_key_file``, so the frontend can require TLS, client certificates and an
API key. Tested against the real dev server behind a TLS-terminating proxy that requires
both (:mod:`tests.security.temporal_proxy`; ``temporal server start-dev`` has no TLS)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from temporalio.service import RetryConfig

from ingest.temporal_conn import connect, connect_options
from tests.security.temporal_proxy import TemporalTlsProxy
from tests.security.transport_pki import make_pki
from workers import ops_temporal
from workers.worker import connect_temporal
from workflows.config import AutorepairConfig, TemporalConfig, TemporalTLSConfig

API_KEY = "tk-9b1f0e7c"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("temporal-pki")
    out = make_pki(d, {"worker": ("autorepair-worker", "DNS:autorepair-worker")})
    (d / "api-key").write_text(API_KEY + "\n")
    out["api-key"] = d / "api-key"
    return out


@pytest.fixture
async def proxy(temporal_dev_env: Any, pki: dict[str, Path]) -> AsyncIterator[TemporalTlsProxy]:
    upstream = temporal_dev_env.client.service_client.config.target_host
    async with TemporalTlsProxy(upstream, pki, API_KEY) as p:
        yield p


def temporal_cfg(proxy: TemporalTlsProxy, pki: dict[str, Path], **over: Any) -> TemporalConfig:
    tls: dict[str, Any] = {"client_cert": str(pki["worker.pem"]),
                           "client_key": str(pki["worker.key"]),
                           "server_ca": str(pki["ca.pem"]), "server_name": "localhost",
                           **over.pop("tls", {})}
    return TemporalConfig(address=proxy.address, namespace="default",
                          tls=TemporalTLSConfig(**tls),
                          **{"api_key_file": str(pki["api-key"]), **over})


async def test_transport_every_temporal_client_connects_through_tls_and_api_key(
        proxy: TemporalTlsProxy, pki: dict[str, Path]) -> None:
    cfg = AutorepairConfig(temporal=temporal_cfg(proxy, pki))
    # the worker's client
    async with connect_temporal(cfg) as client:
        assert await client.service_client.check_health()
    # ingest's client (ingest.service._serve connects with this function)
    client = await connect(cfg.temporal)
    assert await client.service_client.check_health()
    # the CLI (`autorepair breaker status`)
    out = await ops_temporal.breaker_call(cfg.temporal.address, "default", cfg, "c1")
    assert out["guard_running"] is False
    assert proxy.calls >= 3 and proxy.refused == 0


async def _refused(cfg: TemporalConfig) -> None:
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(connect(cfg, retry_config=RetryConfig(max_retries=0)), 30)


async def test_transport_temporal_frontend_refuses_what_is_missing(
        proxy: TemporalTlsProxy, pki: dict[str, Path]) -> None:
    base = temporal_cfg(proxy, pki)
    await _refused(base.model_copy(update={"tls": TemporalTLSConfig()}))  # plain gRPC
    await _refused(base.model_copy(update={"tls": TemporalTLSConfig(
        server_ca=str(pki["ca.pem"]), server_name="localhost")}))  # no client certificate
    await _refused(base.model_copy(update={"api_key_file": None}))  # no API key
    assert proxy.refused >= 1
    await _refused(base.model_copy(update={"tls": base.tls.model_copy(
        update={"server_name": "not-the-frontend"})}))  # the frontend's name is checked


def test_transport_temporal_settings_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match=r"temporal\.tls: client_cert="):
        TemporalConfig(tls=TemporalTLSConfig(client_cert="c.pem"))
    with pytest.raises(ValueError, match=r"temporal\.tls\.server_ca: cannot read"):
        connect_options(TemporalConfig(tls=TemporalTLSConfig(
            server_ca=str(tmp_path / "missing.pem"))))
    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"temporal\.api_key_file: .* holds no key"):
        connect_options(TemporalConfig(api_key_file=str(empty)))
    assert connect_options(TemporalConfig()) == {"tls": False, "api_key": None}
