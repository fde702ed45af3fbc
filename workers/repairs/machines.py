"""Machines held for RMA and their return to service (issue 26 I18): the
``/api/v1/machines`` routes of the repair API, added to its router by
:func:`add_machine_routes`.

A removed machine (a succeeded ``remove`` attempt, or its ``removed_machines`` row) is
held: no repair picks it as a spare and none migrates onto it, until an operator returns
it (:meth:`activities.ledger.Ledger.return_machine`, which records who and why).

====== ========================================== ======== ==================================
method path                                       role     answer
====== ========================================== ======== ==================================
GET    /api/v1/machines/held?cluster=             viewer+  200 :class:`HeldMachines`
POST   /api/v1/machines/{cluster}/{machine}/return operator 200 :class:`MachineReturned`;
                                                           409 when the machine is not held
====== ========================================== ======== ==================================

The role is checked before the ledger is reached (401 / 403 first); ``cluster`` and
``machine`` follow the one name rule of :mod:`workflows.names` (422 naming the field);
the body's ``reason`` is required. Each return is logged as ``event=machine_returned``
(the audit line; the ledger's ``machine_returns`` row is the durable record).
"""

# No ``from __future__ import annotations``: FastAPI resolves the route annotations at
# definition time.
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from workers.repairs.auth import Principal
from workers.repairs.models import STORABLE
from workflows.names import MAX_NAME_LEN, NAME_PATTERN

log = logging.getLogger("autorepair.api.machines")

ClusterName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)]
MachineName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)]


class HeldMachine(BaseModel):
    """One machine held for RMA: since when (UTC), by which repair, why."""

    cluster: str
    machine: str
    since: datetime
    repair_id: str | None = None
    reason: str


class HeldMachines(BaseModel):
    """``GET /api/v1/machines/held``: held machines ordered by cluster and machine."""

    machines: list[HeldMachine]


class ReturnBody(BaseModel):
    """Body of a return: why the machine may serve again (recorded with the operator)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=4000, pattern=STORABLE)


class MachineReturned(BaseModel):
    """A lifted hold: the machine, the hold that was lifted, who returned it and why."""

    cluster: str
    machine: str
    returned_by: str
    reason: str
    hold: HeldMachine


def not_held(cluster: str, machine: str) -> str:
    """The 409 detail for a machine without an RMA hold (names the machine)."""
    return (f"machine {machine!r} of cluster {cluster!r} is not held for RMA (nothing to "
            "return; `autorepair machines held` lists the held machines)")


def add_machine_routes(router: APIRouter, need: Callable[..., Callable[..., Principal]],
                       intake_dep: Any) -> None:
    """Add the machine routes (module docstring) to the repair API's ``router``.

    ``need(permission, what)``: the router's role-check dependency factory;
    ``intake_dep``: its ``Annotated[RepairIntake, Depends(...)]`` (declared after the
    role check in every route, so the role is checked before the ledger is reached)."""

    @router.get("/machines/held", response_model=HeldMachines, tags=["machines"])
    async def held(
        _: Annotated[Principal, Depends(need("read", "machines"))], ix: intake_dep,
        cluster: str | None = Query(None, min_length=1, max_length=MAX_NAME_LEN,
                                    pattern=NAME_PATTERN),
    ) -> HeldMachines:
        """Machines held for RMA (removed, not yet returned), of one cluster or all."""
        rows = await ix.ledger.held_machines(cluster)
        return HeldMachines(machines=[HeldMachine(**r) for r in rows])

    @router.post("/machines/{cluster}/{machine}/return", response_model=MachineReturned,
                 tags=["machines"], responses={409: {"description": "machine not held"}})
    async def return_machine(
        cluster: ClusterName, machine: MachineName, body: ReturnBody,
        who: Annotated[Principal, Depends(need("return", "machines"))], ix: intake_dep,
    ) -> MachineReturned:
        """Return a machine held for RMA to service (operator)."""
        hold = await ix.ledger.return_machine(cluster, machine, who.user, body.reason)
        if hold is None:
            raise HTTPException(409, not_held(cluster, machine))
        log.warning("event=machine_returned cluster=%s machine=%s by=%r reason=%r "
                    "held_since=%s repair_id=%s", cluster, machine, who.user, body.reason,
                    hold["since"].isoformat(), hold["repair_id"])
        return MachineReturned(cluster=cluster, machine=machine, returned_by=who.user,
                               reason=body.reason,
                               hold=HeldMachine(cluster=cluster, **hold))
