"""One line, no traceback, for the expected permanent failures of activities.

The Temporal SDK logs every failed activity attempt on ``temporalio.activity`` as
"Completing activity as failed" with the full traceback. For the permanent failures the
activities raise on purpose (:func:`workflows.activity_api.permanent`: an unknown node,
an unsupported action, no spare machine, refused credentials, ...) the traceback says
nothing a person needs: :class:`PermanentFailureFilter` rewrites those records to one
structured line with the error code and message, and leaves every other failure (the
unexpected ones) with its traceback.
"""

from __future__ import annotations

import logging

from temporalio.exceptions import ApplicationError

from workflows.activity_api import (
    ERR_ACTION_FAILED,
    ERR_AUTH,
    ERR_CONFIGURATION,
    ERR_DRAIN_DEADLINE,
    ERR_PLACEMENT,
    ERR_UNKNOWN_NODE,
    ERR_UNSUPPORTED,
)

EXPECTED_PERMANENT = frozenset({ERR_AUTH, ERR_UNKNOWN_NODE, ERR_UNSUPPORTED, ERR_ACTION_FAILED,
                                ERR_DRAIN_DEADLINE, ERR_PLACEMENT, ERR_CONFIGURATION})
"""Error types of :mod:`workflows.activity_api` whose failures are logged on one line."""


class PermanentFailureFilter(logging.Filter):
    """Rewrites a failed-activity record whose exception is a non-retryable
    ``ApplicationError`` of an :data:`EXPECTED_PERMANENT` type to ``event=activity_failed
    error=TYPE retryable=false message=...`` (plus the SDK's activity context) without
    the traceback. Other records pass unchanged. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if (isinstance(exc, ApplicationError) and exc.non_retryable
                and exc.type in EXPECTED_PERMANENT):
            context = record.getMessage().removeprefix("Completing activity as failed").strip()
            record.msg = "event=activity_failed error=%s retryable=false message=%r %s"
            record.args = (exc.type, exc.message, context)
            record.exc_info = None
            record.exc_text = None
        return True


def install() -> None:
    """Attach :class:`PermanentFailureFilter` to the SDK's activity logger (idempotent)."""
    logger = logging.getLogger("temporalio.activity")
    if not any(isinstance(f, PermanentFailureFilter) for f in logger.filters):
        logger.addFilter(PermanentFailureFilter())
