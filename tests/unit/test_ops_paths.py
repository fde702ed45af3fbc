"""The CLI puts ids into API paths as one percent-encoded segment: an id with ``/``, ``?``
or ``#`` can never reach another route (``cancel "ID/reject?"`` once rejected the
repair), an empty id is refused naming the field, and an answer that is not a 2xx JSON
document is an error, not a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from workers import maintenance_cli, ops

AUTH = ops.ApiToken(token="t", source="--token", token_file=Path("/nonexistent"))


@pytest.fixture
def api() -> Iterator[list[httpx.Request]]:
    """The API as an in-process transport that records each request and answers the
    repair view (``/weird`` paths: a 307 with no body, as a router redirect does)."""
    seen: list[httpx.Request] = []

    def answer(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.url.raw_path.endswith(b"/weird"):
            return httpx.Response(307, headers={"location": "/elsewhere"})
        if req.url.raw_path.endswith(b"/notjson"):
            return httpx.Response(200, text="<html>proxy</html>")
        return httpx.Response(200, json={"stage": "cancelled", "repair_id": "x",
                                         "ended_now": True, "window_id": "w"})

    ops._session = httpx.Client(transport=httpx.MockTransport(answer))
    try:
        yield seen
    finally:
        ops._session.close()
        ops._session = None


@pytest.mark.parametrize("rid", ["req-1/reject?", "req-1#x", "a/../../machines", "r%2F"])
def test_a_repair_id_is_one_path_segment(api: list[httpx.Request], rid: str) -> None:
    ops.repairs_decide("cancel", "http://api", AUTH, True, rid, {"reason": "x"})
    path = api[-1].url.raw_path.decode()
    assert path.startswith("/api/v1/repairs/") and path.endswith("/cancel")
    segment = path.removeprefix("/api/v1/repairs/").removesuffix("/cancel")
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert httpx.URL("http://x/" + segment).path.removeprefix("/") == rid
    ops.get_repair("http://api", AUTH, rid)
    assert api[-1].url.raw_path.decode() == f"/api/v1/repairs/{segment}"
    maintenance_cli.end("http://api", AUTH, True, rid)
    assert api[-1].url.raw_path.decode() == f"/api/v1/maintenance/{segment}"


@pytest.mark.parametrize("rid", ["", "  "])
def test_an_empty_id_is_refused_naming_the_field(
    api: list[httpx.Request], rid: str, capsys: Any,
) -> None:
    with pytest.raises(typer.Exit) as e:
        ops.get_repair("http://api", AUTH, rid)
    assert e.value.exit_code == 2 and not api
    assert "repair_id: must not be empty" in capsys.readouterr().err
    with pytest.raises(typer.Exit):
        maintenance_cli.end("http://api", AUTH, False, rid)
    assert "window_id: must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize(("rid", "said"), [("weird", "HTTP 307"), ("notjson", "not JSON")])
def test_an_answer_that_is_not_a_json_2xx_is_an_error(
    api: list[httpx.Request], rid: str, said: str, capsys: Any,
) -> None:
    with pytest.raises(typer.Exit) as e:
        ops.get_repair("http://api", AUTH, rid)
    assert e.value.exit_code == 1
    assert said in capsys.readouterr().err


def test_validate_refuses_an_unknown_cluster_before_starting(tmp_path: Path) -> None:
    """``validate MACHINE --cluster NAME`` with a cluster the configuration does not list
    exits 2 naming it; before, a workflow started and failed at its first activity while
    the command said ``started`` and exited 0. (No Temporal is reached: nothing starts.)"""
    from typer.testing import CliRunner

    from workers.cli import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text("clusters:\n  - name: c1\n    nodes: [{name: gpu-01}]\n")
    r = CliRunner().invoke(app, ["validate", "gpu-01", "--cluster", "nosuch", "--config",
                                 str(cfg), "--data-dir", str(tmp_path / "none"),
                                 "--temporal-address", "127.0.0.1:1"])
    assert r.exit_code == 2, r.output
    assert "--cluster: unknown cluster 'nosuch' (configured: ['c1'])" in r.output
