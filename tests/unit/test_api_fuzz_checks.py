"""The API fuzzer's properties (``tests.fuzz.api_harness.check_answer``) flag what they
must: a fuzz run that passes means nothing unless each property can fail."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis

from tests.fuzz.api_harness import PERMISSIONS, check_answer, openapi_document
from workers.repairs import auth


@pytest.fixture(scope="module")
def schema() -> Any:
    return schemathesis.openapi.from_dict(openapi_document())


@dataclass
class Answer:
    """The parts of a schemathesis ``Response`` the check reads."""

    status_code: int
    detail: Any = None
    headers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def content(self) -> bytes:
        return b"" if self.detail is None else json.dumps({"detail": self.detail}).encode()


CREATE = {"node": "gpu-01", "mode": "reboot", "request_id": "r-1", "reason": "DCGM diag"}


def case(schema: Any, verb: str, path: str, **kw: Any) -> Any:
    return schema[path][verb].Case(**kw)


def test_server_errors_fail_but_the_documented_readyz_503(schema: Any) -> None:
    c = case(schema, "GET", "/api/v1/repairs")
    assert "server error 500" in str(check_answer(c, Answer(500, "boom"), "viewer"))
    ready = case(schema, "GET", "/readyz")
    assert check_answer(ready, Answer(503, "not ready"), "anonymous") is None
    assert check_answer(ready, Answer(500, "boom"), "anonymous") is not None


def test_role_rules(schema: Any) -> None:
    create = case(schema, "POST", "/api/v1/repairs", body=CREATE)
    assert check_answer(create, Answer(201), "operator") is None
    assert check_answer(create, Answer(201), "detector") is None
    assert "viewer" in str(check_answer(create, Answer(201), "viewer"))
    assert "without a token" in str(check_answer(create, Answer(200), "anonymous"))
    remove = case(schema, "POST", "/api/v1/repairs", body={**CREATE, "mode": "remove"})
    assert check_answer(remove, Answer(201), "operator") is None
    assert "remove" in str(check_answer(remove, Answer(201), "detector"))
    other = case(schema, "POST", "/api/v1/repairs", body={**CREATE, "detector": "rival"})
    assert "rival" in str(check_answer(other, Answer(201), "detector"))
    approve = case(schema, "POST", "/api/v1/repairs/{repair_id}/approve",
                   path_parameters={"repair_id": "req-1"})
    assert check_answer(approve, Answer(200), "operator") is None
    assert "'decide'" in str(check_answer(approve, Answer(200), "detector"))
    state = case(schema, "GET", "/api/v1/state")
    assert check_answer(state, Answer(200), "viewer") is None
    assert check_answer(state, Answer(200), "anonymous") is not None
    assert check_answer(case(schema, "GET", "/api/v1/threshold", query={"cluster_id": "a"}),
                        Answer(200), "anonymous") is None


def test_422_must_name_a_field_of_the_request(schema: Any) -> None:
    sent = case(schema, "POST", "/api/v1/repairs", body={**CREATE, "colour": "red"})
    named = [{"loc": ["body", "colour"], "msg": "Extra inputs are not permitted"}]
    assert check_answer(sent, Answer(422, named), "detector") is None
    declared = [{"loc": ["body", "cluster"], "msg": "required: ..."}]
    assert check_answer(sent, Answer(422, declared), "detector") is None
    assert check_answer(sent, Answer(422, [{"loc": ["body"], "msg": "not an object"}]),
                        "detector") is None
    stray = [{"loc": ["body", "flavour"], "msg": "bad"}]
    assert "flavour" in str(check_answer(sent, Answer(422, stray), "detector"))
    assert check_answer(sent, Answer(422, "bad body"), "detector") is not None
    assert check_answer(sent, Answer(422, [{"loc": [], "msg": "x"}]), "detector") is not None
    assert check_answer(sent, Answer(422, [{"loc": ["query"], "msg": "x"}]),
                        "detector") is not None


def test_other_4xx_must_name_the_field_and_value(schema: Any) -> None:
    show = case(schema, "GET", "/api/v1/repairs/{repair_id}",
                path_parameters={"repair_id": "req%2D9"})  # kept percent-encoded
    assert check_answer(show, Answer(404, "no repair 'req-9'"), "viewer") is None
    assert check_answer(show, Answer(404, "Not Found"), "viewer") is not None
    unread = case(schema, "POST", "/api/v1/repairs", body=CREATE)
    assert check_answer(unread, Answer(400, "There was an error parsing the body"),
                        "operator") is not None
    clash = case(schema, "POST", "/api/v1/repairs", body=CREATE)
    assert check_answer(clash, Answer(409, "request_id 'r-1' of detector 'scanner' already "
                                           "names repair req-2 on c/gpu-02"), "detector") is None
    assert check_answer(case(schema, "POST", "/api/v1/repairs", body=CREATE),
                        Answer(403, "role 'viewer' may not create repairs"), "viewer") is None
    auth = Answer(401, "missing or invalid bearer token",
                  headers={"www-authenticate": ["Bearer"]})
    assert check_answer(unread, auth, "anonymous") is None
    auth.headers = {}
    assert "WWW-Authenticate" in str(check_answer(unread, auth, "anonymous"))
    # the router's own answers to requests that are not of the operation
    slash = case(schema, "GET", "/api/v1/repairs/{repair_id}",
                 path_parameters={"repair_id": "a%2Fb"})
    assert check_answer(slash, Answer(404, "Not Found"), "viewer") is None
    trace = case(schema, "GET", "/healthz", method="TRACE")
    assert check_answer(trace, Answer(405, "Method Not Allowed",
                                      headers={"allow": ["GET"]}), "viewer") is None
    assert check_answer(trace, Answer(405, "Method Not Allowed"), "viewer") is not None


def test_an_operation_without_a_rule_fails(schema: Any) -> None:
    c = case(schema, "GET", "/api/v1/repairs")
    c.operation.path = "/api/v1/new-thing"
    try:
        assert "ROUTE_RULES" in str(check_answer(c, Answer(200), "viewer"))
    finally:
        c.operation.path = "/api/v1/repairs"


def test_the_server_grants_what_the_design_says() -> None:
    assert auth.PERMISSIONS == PERMISSIONS
