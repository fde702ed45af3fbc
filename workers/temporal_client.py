"""Temporal clients whose runtime threads end before the interpreter does.

A Temporal client runs on a :class:`temporalio.runtime.Runtime`: a Rust (Tokio) thread
pool that completes Python futures from its own threads. The SDK's default runtime lives
in a module global until interpreter shutdown, so a short-lived command that exits right
after a call can finalize the interpreter while one of those threads still holds a
Python thread state; CPython then aborts with ``Fatal Python error: PyGILState_Release:
thread state … must be current when releasing`` (exit 134, or a segfault, 139) —
temporalio/sdk-python issue #300, seen here in about one ``autorepair validate`` run in
twenty.

:func:`temporal_client` gives each use its own runtime and :func:`release_runtimes`
drops it: the last reference to a runtime shuts its thread pool down, with the GIL
released, and joins the threads (the bridge's ``CoreRuntimeHandle`` drop). Every process
entry point that opens a client (the CLI's client commands, the worker, the demo) runs
its async work through them, so no runtime thread outlives ``main``.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime, TelemetryConfig

from ingest.temporal_conn import connect_options
from workflows.config import TemporalConfig

__all__ = ["TemporalSettingError", "TemporalUnreachable", "check_address", "release_runtimes",
           "temporal_client"]

_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()


class TemporalUnreachable(RuntimeError):
    """Temporal cannot be reached at the given address; the message names it."""


class TemporalSettingError(RuntimeError, ValueError):
    """A Temporal setting cannot be used (a TLS / API key file that cannot be read, an
    address that is not ``host:port``); the message names the setting and the value. A
    ``RuntimeError`` so the CLI exits 2 with the message (``ops_temporal.run_async``), a
    ``ValueError`` for the callers that caught the unreadable-file error as one."""


def check_address(address: str) -> str | None:
    """What is wrong with a Temporal frontend ``address`` (``host:port``, the port 1-65535;
    ``[v6]:port`` for IPv6), or None."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port:
        return "not host:port"
    if not (port.isascii() and port.isdecimal()) or not 1 <= int(port) <= 65535:
        return f"port {port!r} is not a number 1-65535"
    return None


@asynccontextmanager
async def temporal_client(address: str, namespace: str = "default", *,
                          lazy: bool = False, config: TemporalConfig | None = None
                          ) -> AsyncIterator[Client]:
    """A client for ``address`` (``host:port``) and ``namespace`` with the pydantic data
    converter, on a runtime of its own that :func:`release_runtimes` can shut down.

    ``config``: ``temporal`` of the configuration, for its TLS and API key
    (:func:`ingest.temporal_conn.connect_options`; ``None`` = plain gRPC, no key).
    ``lazy``: connect on first use instead of now. Raises :class:`TemporalUnreachable`
    naming the address when the connection fails, :class:`TemporalSettingError` naming the
    field of a TLS / API key file that cannot be read or an address that is not
    ``host:port``. Callers must not keep the client past
    the ``async with`` block (a kept reference keeps the runtime's threads alive)."""
    try:
        options = connect_options(config)  # names the field of a file it cannot read
    except ValueError as exc:
        raise TemporalSettingError(str(exc)) from None
    problem = check_address(address)
    if problem is not None:
        raise TemporalSettingError(
            f"Temporal address {address!r} (--temporal-address or temporal.address): "
            f"{problem}")
    runtime = Runtime(telemetry=TelemetryConfig())
    _runtimes.add(runtime)
    try:
        client = await Client.connect(address, namespace=namespace, runtime=runtime,
                                      data_converter=pydantic_data_converter, lazy=lazy,
                                      **options)
    except ValueError as exc:  # e.g. "invalid target URL: invalid port number"
        raise TemporalSettingError(
            f"Temporal address {address!r} (--temporal-address or temporal.address): "
            f"{exc}") from None
    except RuntimeError as exc:
        raise TemporalUnreachable(
            f"cannot reach Temporal at {address} (namespace {namespace}): {exc}") from None
    del runtime  # the client holds it; nothing else here should
    try:
        yield client
    finally:
        del client


def release_runtimes() -> int:
    """Collect unreferenced clients and runtimes so their threads are joined now, before
    interpreter shutdown; returns how many runtimes of :func:`temporal_client` are still
    referenced (their threads still running): 0 unless something kept a client."""
    gc.collect()
    return len(_runtimes)
