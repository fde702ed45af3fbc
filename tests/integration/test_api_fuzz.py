"""Schemathesis against the repair API's ``/api/v1/openapi.json`` (CI slice of
``make fuzz-api``).

The API runs as ``autorepair ingest`` serves it, on the real ledger and the Temporal dev
server (:class:`tests.fuzz.api_harness.ApiServer`). Every operation of the served document
is called as operator, detector, viewer and without a token, with schemathesis' examples,
coverage and fuzzing phases (positive and negative data). Properties
(:func:`tests.fuzz.api_harness.check_answer` plus schemathesis' ``not_a_server_error`` and
``response_schema_conformance``): no 5xx, every 4xx names the field, 2xx bodies match the
documented models, role rules hold. ``derandomize`` fixes the examples, so a CI failure
reproduces; the long run is ``make fuzz-api``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.fuzz.api_harness import (
    DOCUMENTED_5XX,
    ROLES,
    ROUTE_RULES,
    ApiServer,
    Seeds,
    check_answer,
    headers_for,
    openapi_document,
    register_hooks,
)

SEEDS = Seeds()
"""Ids the module's server seeds, read by the generation hooks."""


@pytest.fixture(scope="module")
def api_server(pg_dsn: str, temporal_dev_env: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    # approved repairs go on to cordon, whose activities this worker lacks: quiet retries
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    target = temporal_dev_env.client.service_client.config.target_host
    server = ApiServer(pg_dsn, target, Path(tmp_path_factory.mktemp("api-fuzz")), SEEDS)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        logging.getLogger("temporalio").setLevel(logging.NOTSET)


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@pytest.fixture(params=ROLES)
def role(request: pytest.FixtureRequest) -> str:
    """The caller: a token of each role, or none."""
    return str(request.param)


#: Parametrized at import from the document the server serves (checked below);
#: schemathesis' ``from_fixture`` loader does not run under pytest 9 (it sets
#: ``Node._nodeid``, which pytest 9 no longer has).
schema = schemathesis.openapi.from_dict(openapi_document())
register_hooks(schema, SEEDS)


@schema.parametrize()
@settings(max_examples=3, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_answer_holds_the_properties(case: Any, role: str, api_server: ApiServer,
                                           session: requests.Session) -> None:
    response = case.call(base_url=api_server.base_url, session=session,
                         headers=headers_for(role), timeout=60)
    problem = check_answer(case, response, role)
    assert problem is None, f"{problem}\n{case.as_curl_command(base_url=api_server.base_url)}"
    key = (case.operation.method.upper(), case.operation.path)
    if response.status_code not in DOCUMENTED_5XX.get(key, frozenset()):
        case.validate_response(response, checks=[not_a_server_error,
                                                 response_schema_conformance],
                               headers=headers_for(role))


def test_the_fuzzed_document_is_the_served_one(api_server: ApiServer,
                                               session: requests.Session) -> None:
    served = session.get(f"{api_server.base_url}/api/v1/openapi.json", timeout=30)
    assert served.status_code == 200
    assert served.json() == openapi_document()


def test_every_served_operation_has_a_role_rule() -> None:
    ops = {(r.ok().method.upper(), r.ok().path) for r in schema.get_all_operations()}
    assert ops == set(ROUTE_RULES), ops ^ set(ROUTE_RULES)
