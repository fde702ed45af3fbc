"""Fixtures of the trust-boundary tests (issue 27): the workflow harness of
``tests/workflows/conftest.py`` (time-skipping Temporal, real ledger, fake cluster) reused
as is, and a sink that hands ingest's alerts to the harness's ``NodeWorkflow``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.workflows.conftest import (  # noqa: F401  (fixtures re-exported)
    Harness,
    harness,
    pytest_runtest_protocol,
    ts_env,
    ts_server,
)
from workflows.models import Alert, AlertDelivery


@dataclass
class HarnessSink:
    """An ``ingest.handoff.AlertSink`` delivering each alert straight to the harness's
    ``NodeWorkflow`` (``Harness.deliver``: start-if-needed + ``deliver_alert``), keeping
    the alerts and the workflow's answers for the test to read."""

    h: Harness
    alerts: list[Alert] = field(default_factory=list)
    answers: list[AlertDelivery] = field(default_factory=list)

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)
        self.answers.append(await self.h.deliver(alert))
