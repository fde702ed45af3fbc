"""The BMC as the cluster watchers and ingest ask it: :func:`redfish_probe` (real Redfish,
``activities.power.redfish_probe``). The rules — what counts as a dead host, when to ask
again — are pure and live in :mod:`workflows.policy.bmc`; both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from activities.power import redfish_probe
from workflows.models import Alert
from workflows.policy.bmc import DEFAULT_REPROBE_S, BmcChecks, BmcProbe, bmc_verdict

__all__ = ["DEFAULT_REPROBE_S", "BmcChecks", "BmcProbe", "OpenAlerts", "bmc_verdict",
           "redfish_probe"]

#: ``(cluster, source) -> the ledger's newest edge of each level fault of that source``
#: (``workers.lazy_ledger.LazyLedger.last_level_edges``: raises still open, and clears;
#: ``open_level_alerts``, the open raises alone, also fits).
OpenAlerts = Callable[[str, str], Awaitable[list[Alert]]]
