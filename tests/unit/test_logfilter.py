"""Expected permanent activity failures log one line; the unexpected keep their traceback."""

from __future__ import annotations

import io
import logging

from workers import logfilter
from workflows.activity_api import ERR_UNKNOWN_NODE, ERR_UNSUPPORTED, permanent


def _log(exc: BaseException) -> str:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("temporalio.activity")
    logger.addHandler(handler)
    logfilter.install()
    logfilter.install()  # idempotent
    try:
        try:
            raise exc
        except BaseException:
            logger.warning("Completing activity as failed ({'activity_type': 'x'})",
                           exc_info=True)
    finally:
        logger.removeHandler(handler)
    return buf.getvalue()


def test_unsupported_action_is_one_structured_line() -> None:
    out = _log(permanent(ERR_UNSUPPORTED, "clusters[demo].provision_image: not set"))
    assert out.count("\n") == 1 and "Traceback" not in out
    assert "event=activity_failed error=UnsupportedAction retryable=false" in out
    assert "provision_image: not set" in out and "'activity_type': 'x'" in out
    assert "Traceback" not in _log(permanent(ERR_UNKNOWN_NODE, "node gpu-99"))


def test_unexpected_failures_keep_their_traceback() -> None:
    out = _log(RuntimeError("a bug"))
    assert "Traceback" in out and "RuntimeError: a bug" in out
    assert len(logging.getLogger("temporalio.activity").filters) == 1
