"""The BMC as the cluster watchers and ingest ask it: :func:`redfish_probe` (real Redfish,
through ``activities.power.RedfishMachine``). The rules — what counts as a dead host, when
to ask again — are pure and live in :mod:`workflows.policy.bmc`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from workflows.config import AutorepairConfig
from workflows.models import Alert
from workflows.policy.bmc import DEFAULT_REPROBE_S, BmcChecks, BmcProbe, bmc_verdict

__all__ = ["DEFAULT_REPROBE_S", "BmcChecks", "BmcProbe", "OpenAlerts", "bmc_verdict",
           "redfish_probe"]

#: ``(cluster, source) -> level alerts of that source still open in the ledger``
#: (``workers.lazy_ledger.LazyLedger.open_level_alerts``).
OpenAlerts = Callable[[str, str], Awaitable[list[Alert]]]


def redfish_probe(config: AutorepairConfig) -> BmcProbe:
    """A :data:`BmcProbe` through ``activities.power.RedfishMachine`` (real Redfish).
    Raises what the Redfish client raises (``ApplicationError`` for no BMC configured,
    credentials refused, unknown system; connection errors as they are)."""
    from activities.power import RedfishMachine

    async def probe(cluster: str, node: str) -> dict[str, str | None]:
        ncfg = next((n for n in config.cluster(cluster).nodes if n.name == node), None)
        machine = (ncfg.machine if ncfg and ncfg.machine else node)
        m = RedfishMachine(config, cluster, node, machine)

        def read(s: Any) -> dict[str, str | None]:
            st = getattr(s, "status", None)
            return {
                "power_state": str(getattr(s.power_state, "value", s.power_state)),
                "state": str(getattr(getattr(st, "state", None), "value", None) or "") or None,
                "health": str(getattr(getattr(st, "health", None), "value", None) or "")
                or None,
            }

        return await m.call(read)

    return probe
