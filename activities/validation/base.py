"""What both validation backends share: run names, the result line, and the verdict rules.

A backend (:class:`activities.validation.slurm.SlurmValidation`,
:class:`activities.validation.kube.KubeValidation`) places the check run on the machine,
collects its result and releases the placement in its scheduler's own terms; what a
verdict does to the machine is decided once, here, in :meth:`ValidationBackend.return_machine`:

* ``passed`` → ``pool``: made schedulable only when the drain/cordon left is the run's
  own (placement takes over the drain of the repair that handed the machine over, or of a
  repair no longer in flight); a node someone else took out keeps their reason (docs/design.md §5:
  never undo someone else's cordon). ``spare``: joins the cluster's hot-spare pool
  (:mod:`activities.spares`) and stays out of scheduling until a migrate draws it — unless
  someone else drained it meanwhile: their drain stays and it joins no pool.
* ``failed`` → stays out: drained/cordoned naming the run and the hardware ticket (an
  operator's drain keeps the operator's reason), and removed from the spare pool.
* ``aborted`` → the state recorded before placement is restored exactly, reason
  included; a drain an operator (or another repair) set while the check ran stays.

Another repair in flight on the node (the ledger's ``repairs``, other than the one that
started the run, :func:`originating_repair`) means the run is never placed and nothing of
the node is ever resumed or uncordoned by it.

The result of a run is the last line of the job's output that is a JSON object with a
``verdict`` (what ``autorepair-agent validate --json`` prints, docs/design.md §4.1).
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.spares import SparePool
from workflows.activity_api import (
    ERR_CONFIGURATION,
    ERR_UNKNOWN_NODE,
    CollectInput,
    CollectResult,
    PlacementResult,
    ReturnMachineInput,
    ReturnMachineResult,
    ValidationPlacement,
    permanent,
)
from workflows.config import ClusterConfig, ValidationConfig
from workflows.models import ValidationResult, Verdict

#: Poll interval of the collecting activity while the job runs, seconds (this module's
#: choice: a check run takes minutes, a second of latency is invisible).
COLLECT_POLL_S = 1.0


def run_slug(run_id: str) -> str:
    """A Slurm/Kubernetes-safe name for a run id: lower-case ``[a-z0-9-]``, ≤ 40 chars,
    with 8 hex digits of its sha256 so distinct runs never collide."""
    base = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:30].strip("-")
    return f"{base}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


#: ``(cluster, node) -> ids of the node's repairs not yet terminal`` (the ledger's
#: ``Ledger.repairs_in_flight``).
RepairsInFlight = Callable[[str, str], Awaitable[list[str]]]


def originating_repair(run_id: str) -> str | None:
    """The repair that started run ``run_id``: the last part of ``validate/{machine}/{n}``
    (docs/design.md §4.4) when the run is one a repair started, else None. Raises nothing."""
    parts = run_id.split("/")
    return parts[2] if len(parts) == 3 and parts[0] == "validate" and parts[2] else None


def parse_result_text(text: str, machine: str) -> ValidationResult | None:
    """The last line of ``text`` that is a JSON result object, as a ``ValidationResult``
    with ``machine`` set; ``None`` when no line parses (job died before printing)."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            data = json.loads(s)
            if not isinstance(data, dict) or "verdict" not in data:
                continue
            data["machine"] = machine
            return ValidationResult.model_validate(data)
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class JobOutput:
    """A finished check job as its scheduler reports it: ``state`` (Slurm ``JobState`` or
    ``GONE``; Kubernetes ``Complete``/``Failed``), ``text`` (its whole output), ``taken``
    (the scheduler took the job or the machine away: cancelled, preempted, Job deleted)
    and ``why`` (the scheduler's failure reason, empty when none)."""

    state: str
    text: str
    taken: bool = False
    why: str = ""


def aborted(machine: str, reason: str) -> ValidationResult:
    """An ``aborted`` result for ``machine``: the run could not judge it (nothing condemned)."""
    return ValidationResult(machine=machine, verdict=Verdict.aborted, reason=reason)


def heartbeat(*details: Any) -> None:
    """``activity.heartbeat`` inside an activity; nothing outside one (tests, benches)."""
    if activity.in_activity():
        activity.heartbeat(*details)


class ValidationBackend(ABC):
    """Validation placement on one cluster. Subclasses also derive from their scheduler
    (listed first, so its ``close`` is the one used) and fill in the hooks below.

    Errors: a node the scheduler does not know raises non-retryable ``ApplicationError``
    of type ``ERR_UNKNOWN_NODE`` from the hooks; :meth:`return_machine` turns it into a
    result with the message as ``detail``.
    """

    cluster: ClusterConfig
    v: ValidationConfig
    #: Set by the activities when the ledger is there; ``None``: no repair is known to be
    #: in flight, and only the run's own or the originating repair's marker is taken over.
    repairs_in_flight: RepairsInFlight | None = None

    async def other_repairs(self, node: str, run_id: str) -> list[str]:
        """Repairs in flight on ``node`` other than the one that started ``run_id``."""
        if self.repairs_in_flight is None:
            return []
        mine = {run_id, originating_repair(run_id)}
        return [r for r in await self.repairs_in_flight(self.cluster.name, node)
                if r not in mine]

    async def may_take_over(self, holder: str, node: str, run_id: str) -> bool:
        """Whether the run may act on a drain/cordon marked with repair id ``holder``: its
        own, the originating repair's, or (with the ledger) a repair no longer in flight."""
        if holder in (run_id, originating_repair(run_id)):
            return True
        if self.repairs_in_flight is None:
            return False
        return holder not in await self.repairs_in_flight(self.cluster.name, node)

    @abstractmethod
    async def place(self, p: ValidationPlacement) -> PlacementResult:
        """Place the check run on ``p.node``; ``placed=False`` + reason when impossible."""

    @abstractmethod
    async def collect(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` for the run to end, then read its result."""

    @abstractmethod
    async def release(self, c: CollectInput) -> None:
        """Stop the run if it still runs and remove the placement (idempotent)."""

    @abstractmethod
    async def close(self) -> None:
        """Release clients (idempotent)."""

    # -- verdict hooks: ``node`` is what _read_target returned -------------------------
    @abstractmethod
    async def _read_target(self, node: str) -> Any:
        """The scheduler's view of ``node``; raises ``ERR_UNKNOWN_NODE`` when unknown."""

    @abstractmethod
    async def _restore_prior(self, r: ReturnMachineInput, node: Any) -> str:
        """``aborted``: put back the state recorded at placement; returns the detail."""

    @abstractmethod
    async def _keep_out(self, r: ReturnMachineInput, node: Any) -> str:
        """``failed``: keep the node out of scheduling naming run and ticket; the detail."""

    @abstractmethod
    async def _hold_as_spare(self, r: ReturnMachineInput, node: Any) -> str | None:
        """``passed`` → spare: keep the node out of scheduling as a validated spare; None
        when held, else why not (someone else's drain/cordon, kept as it is)."""

    @abstractmethod
    async def _return_to_pool(self, r: ReturnMachineInput, node: Any) -> str:
        """``passed`` → pool: make it schedulable unless someone else holds it; the detail."""

    @abstractmethod
    async def _placement_state(self, node: str) -> tuple[list[str], bool]:
        """(state flags, schedulable) of ``node`` after the verdict was applied."""

    async def return_machine(
        self, r: ReturnMachineInput, spares: SparePool | None
    ) -> ReturnMachineResult:
        """Apply the verdict to the node (rules in the module docstring).

        ``spares``: the cluster's spare pool (the ledger); ``None`` without a ledger, then
        ``return_to=spare`` raises non-retryable ``ERR_CONFIGURATION`` after the node was
        taken out of scheduling."""
        try:
            n = await self._read_target(r.node)
        except ApplicationError as e:
            if e.type == ERR_UNKNOWN_NODE:
                return ReturnMachineResult(detail=str(e))
            raise
        spare = False
        if r.verdict == Verdict.aborted:
            detail = await self._restore_prior(r, n)
        elif r.verdict == Verdict.failed:
            detail = await self._keep_out(r, n)
            if spares is not None:
                await spares.remove(self.cluster.name, r.machine)
        elif r.return_to == "spare":
            kept = await self._hold_as_spare(r, n)
            if kept is not None:
                detail = kept  # a foreign drain stays; the machine joins no pool
            else:
                if spares is None:
                    raise permanent(ERR_CONFIGURATION,
                                    "return_to=spare needs the ledger (spare pool)")
                await spares.add(self.cluster.name, r.machine, r.run_id)
                detail = f"joined spare pool of {self.cluster.name}"
                spare = True
        else:
            detail = await self._return_to_pool(r, n)
        state, schedulable = await self._placement_state(r.node)
        return ReturnMachineResult(state=state, schedulable=schedulable, spare=spare,
                                   detail=detail)
