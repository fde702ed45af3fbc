"""`status --watch` when the stack stops, and `breaker reset`'s decision (issue 28 items
15 and 20)."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from workers import ops
from workers.ops_temporal import reset_decision

STATE = {"cohorts": [], "nodes": [{"cluster": "demo", "node": "gpu-01", "score": 0.97,
                                   "state": "active", "straggler": False, "last_seen": 1.0}],
         "cluster_alerts": []}
ANSWERS: dict[str, Any] = {
    "/api/v1/state": STATE, "/api/v1/repairs": {"repairs": []},
    "/api/v1/alerts": {"alerts": []},
    "/api/v1/report": {"currency": "USD", "gpu_hours": 0, "cost": 0, "repairs": 0,
                       "unpriced_repairs": 0, "breakdown": []},
    "/api/v1/maintenance": {"windows": []},
    "/api/v1/domains": {"holds": []},
}


class _Api(BaseHTTPRequestHandler):
    served = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps(ANSWERS[self.path.split("?")[0]]).encode()
        type(self).served += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_watch_says_stack_stopped_and_returns(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """The watch used to exit 2 with the last table and no error line when the API went."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}"
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(ops, "_out", Console(file=out, width=120, height=40))
    monkeypatch.setattr(ops, "_err", Console(file=err, width=200))
    real_sleep = ops.time.sleep

    def sleep_then_stop(s: float) -> None:
        real_sleep(0.05)
        if _Api.served >= 10:  # the first view and one refresh were served: stop the stack
            server.shutdown()
            server.server_close()

    monkeypatch.setattr(ops.time, "sleep", sleep_then_stop)
    auth = ops.ApiToken("tok", "--token", tmp_path / "operator.token")
    ops.status_command(api, auth, False, True, None, interval_s=0.05)  # returns: exit 0
    assert "stack stopped:" in err.getvalue() and "the view above is from" in err.getvalue()
    assert "gpu-01" in out.getvalue()
    assert ops._session is None


def test_breaker_reset_decision() -> None:
    assert reset_decision(False, "") == "already_closed"
    assert reset_decision(False, "storage fixed") == "already_closed"
    assert reset_decision(True, "  ") == "reason_required"
    assert reset_decision(True, "storage outage over") == "send"
