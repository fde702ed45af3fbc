"""Driver of the stateful rails property test (``test_rails_property.py``).

One *world* per example: a time-skipping server of its own, a fresh cluster name and task
queues, the real ledger, and :class:`RecordingCluster` (the workflow
tests' ``FakeCluster`` that also logs every call in order, with the calling repair and
the activity attempt). A *program* is a list of steps drawn by hypothesis; the driver runs
it against the real NodeWorkflow / RepairWorkflow / guard, then settles the world (faults
healed, open repairs approved, level faults cleared, whatever is still open cancelled) and
checks the rails of docs/design.md §5 as properties:

- a node cordoned by one of our repairs when that repair ended stays cordoned only with a
  hold reason in the ledger ("node left cordoned: …", docs/runbook.md "What happens when a
  repair ends badly"); terminated repairs cannot clean up and are exempt;
- at most one repair acts on a node at a time (acting windows, in call order, of two
  repairs on one node never overlap);
- at most one lease per node and per node pool, and no more than the budget, whenever the
  guard is asked (after every step, across guard terminations): a clash counts only
  between holders that are both still running (a fresh guard rebuilds every open ledger
  row, then drops the ones whose workflow is gone);
- a fresh guard (after ``guard`` terminated the old one) has the budget, breaker
  threshold, GPU node count and breaker state the old one had;
- no lease and no queued request is left after settling: settling runs past
  ``lease_ttl_s`` (short in this world, so holders renew and the guard asks them at
  expiry), so even terminated holders' leases have expired;
- no repair waits for a lease for ever: the guard knows every waiter once waiters have
  re-sent (:data:`~workflows.protocol.LEASE_RESEND_S`) after its last restart, and a
  repair waiting for a lease early in settling (the guard lists it as queued, its detail
  says so) is no longer waiting :data:`WAIT_CHECK_S` later unless it was granted a lease
  meanwhile (its wait ends after ``lease_wait_max_s``);
- every repair that closed other than by termination has a terminal ledger row;
- no disruptive step (cordon, drain, machine action) is scheduled by a workflow task that
  already saw the clear of all the repair's evidence (read from its history);
- an approval sent to an open repair is never lost;
- the per-node action cap holds: an attempt beyond ``max_actions_per_node`` ran only with a
  person's approval, also for a repair that queued for the lease behind repairs of its
  node that acted (it decides again when granted; first found by this test,
  ``test_repair_rails.py::test_node_action_cap_holds_for_a_repair_queued_on_the_same_node``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.testservice.v1 import UnlockTimeSkippingRequest
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import OWN_WORKFLOWS, FakeCluster, Harness, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import unlock_if_cut
from tests.workflows.rails_leases import (
    LeaseWaiters,
    granted_since,
    lease_clashes,
    lease_waiters,
    leftover_leases,
    rebuild_changes,
)
from workflows.activity_api import (
    ACT,
    ERR_AUTH,
    ERR_CONFIGURATION,
    ERR_UNKNOWN_NODE,
    CordonInput,
    CordonResult,
)
from workflows.config import PolicyConfig
from workflows.models import (
    AUTO_APPROVED,
    Action,
    Alert,
    ApproveSignal,
    CancelSignal,
    RejectSignal,
    RepairRequest,
    RepairStatus,
    Stage,
)
from workflows.protocol import (
    GUARD_WORKFLOW,
    REPAIR_SIGNAL_ATTACH_ALERT,
    GuardInput,
    GuardStatus,
    NodeStatus,
    workflow_id_guard,
    workflow_id_node,
    workflow_id_repair,
)
from workflows.repair import MACHINE_ACTIVITY

NODES = ("gpu-01", "gpu-02", "gpu-03")
#: Two nodes share a pool (the guard serialises them), one has a pool of its own.
POOLS = {"gpu-01": "pool-a", "gpu-02": "pool-a", "gpu-03": "pool-b"}
TERMINAL = {s.value for s in (
    Stage.succeeded, Stage.failed, Stage.rejected, Stage.cancelled, Stage.auto_resolved,
    Stage.timed_out,
)}
#: Calls that disturb a node (the repair "acts" from the first of them).
DISRUPTIVE = {"cordon", "drain", "reset_gpu", "reboot", "power_cycle", "reprovision",
              "migrate", "remove"}
ACTIONS = DISRUPTIVE - {"cordon", "drain"}
#: Calls a repair makes on the node while it holds it.
NODE_CALLS = DISRUPTIVE | {"check_idle", "node_health", "rejoin"}
#: The per-node action cap of the world's policy (low, so the programs reach it).
CAP = 3
#: Lease TTL and lease wait bound of the world's policy, seconds: short, so that holders
#: renew (every TTL / 2), the guard asks holders at expiry and terminated holders' leases
#: expire within a program, and waiters time out while settling.
LEASE_TTL_S = 1200.0
LEASE_WAIT_MAX_S = 1200.0
#: Settling checks lease waiters after ``WAIT_MARK_S`` (past ``LEASE_RESEND_S``: every
#: waiter has re-sent to the last fresh guard) and again ``WAIT_CHECK_S`` later (twice
#: ``LEASE_WAIT_MAX_S``: a wait that began before the mark has ended, with slack for a
#: holder whose renewal was refused and that re-acquires after its idle wait).
WAIT_MARK_S = 1200.0
WAIT_CHECK_S = 2400.0
DEBUG = bool(os.environ.get("RAILS_PROPERTY_DEBUG"))
#: Leaked time-skipping locks one ``skip`` gives back before it calls the clock stopped:
#: each terminated run with a workflow task in flight can leak one, and a program
#: terminates at most a few (``terminate`` and ``guard`` steps).
MAX_LEAKED_LOCKS = 4


class ClockStopped(AssertionError):
    """The time-skipping server's clock did not advance when asked (:meth:`World.skip`).

    Usually the server's own failure (sdk-java#3088 family: a timer that fires while the
    task cancelling it is with the worker wedges its clock; a transport error from its
    sleep RPC), not a rail violation: the property test runs the same program again in a
    fresh world (:data:`~tests.workflows.test_rails_property.CLOCK_RETRIES` times) and
    fails only when the clock stops on every try — a program that stalls time by itself
    does so each time."""


class TaskRefused(ClockStopped):
    """The time-skipping server refuses, on every retry, the completion of a workflow
    task that requests the cancel of an activity which completed while that task ran
    (temporalio/sdk-java#2391: ``ACTIVITY_UNKNOWN for scheduledEventId=…``; the official
    server goes on): the repair can never take another step. Not a rail violation: the
    program runs again in a fresh world, as after :class:`ClockStopped`."""


@dataclass
class Call:
    seq: int
    name: str
    node: str
    rid: str | None  # repair id of the calling workflow (None: not a repair)
    attempt: int
    by_us: bool = False  # cordon only: this repair holds the cordon afterwards


class RecordingCluster(FakeCluster):
    """``FakeCluster`` that logs each call (order, caller's repair id, attempt)."""

    def __init__(self, cluster: str, nodes: list[str]) -> None:
        super().__init__(cluster=cluster, nodes=nodes)
        self.log: list[Call] = []
        self._seq = itertools.count()

    def _log(self, name: str, node: str) -> None:
        rid: str | None = None
        attempt = 1
        try:
            info = activity.info()
            parts = info.workflow_id.split("/") if info.workflow_id else []
            rid = parts[3] if len(parts) == 4 and parts[0] == "repair" else None
            attempt = info.attempt
        except RuntimeError:
            pass  # not inside an activity
        self.log.append(Call(next(self._seq), name, node, rid, attempt))
        super()._log(name, node)

    @activity.defn(name=ACT.cordon_node)
    async def cordon_node(self, inp: CordonInput) -> CordonResult:
        res = await super().cordon_node(inp)
        self.log[-1].by_us = res.cordoned_by_us
        return res

    def scheduler_activities(self) -> list[Any]:
        return [self.cordon_node, *super().scheduler_activities()[1:]]


# ---- steps ------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One operation of a program: ``op`` and its arguments (hypothesis draws these)."""

    op: str
    node: str = ""
    arg: str = ""
    n: int = 0

    def __str__(self) -> str:
        return f"{self.op}({', '.join(str(x) for x in (self.node, self.arg, self.n) if x)})"


#: Fault knobs a ``fault`` step sets on the fake: (call, how).
FAULTS = (
    ("check_idle", ERR_AUTH),  # Kubernetes 403 on the idle check
    ("cordon", ERR_CONFIGURATION),  # slurm binary missing
    ("drain", ERR_UNKNOWN_NODE),  # 404: the node object is gone
    ("rejoin", ERR_AUTH),
    ("power_cycle", "transient"),  # BMC connection refused for a while
    ("reboot", "transient"),
    ("power_cycle", "fail"),  # a definitive action failure (ladder attempt)
    ("reboot", "fail"),
)


@dataclass
class Tracked:
    rid: str
    node: str
    via: str  # "node" (NodeWorkflow child) or "api"
    level: bool = False  # evidence is a level fault (can clear)
    approved: bool = False  # an approve signal reached it while open
    terminated: bool = False


@dataclass
class World:
    env: WorkflowEnvironment
    h: Harness
    fake: RecordingCluster
    repairs: dict[str, Tracked] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    n: itertools.count[int] = field(default_factory=itertools.count)
    #: Violations seen while the program ran (guard samples after each step, rebuilds)
    #: and while settling (lease waiters); :func:`check` reports them with the rest.
    seen: list[str] = field(default_factory=list)
    #: Guard terminations that landed (each followed by a fresh guard).
    guard_restarts: int = 0
    #: Guard workflow tasks those terminations cut (their time-skipping lock given back).
    cut_tasks: int = 0
    #: Time-skipping locks the test server leaked and :meth:`skip` gave back.
    forced_unlocks: int = 0
    #: Run ids of the guards those terminated (shown when time stops skipping).
    guard_runs: list[str] = field(default_factory=list)
    #: Lease waiters settling found at its first mark (checked again later).
    waiters_checked: int = 0

    @property
    def cluster(self) -> str:
        return self.fake.cluster

    def handle(self, t: Tracked) -> WorkflowHandle[Any, Any]:
        return self.h.client.get_workflow_handle(workflow_id_repair(self.cluster, t.node, t.rid))

    async def discover(self) -> None:
        """Repairs the NodeWorkflows started (found through the ledger)."""
        for row in await self.h.ledger.list_repairs(cluster=self.cluster):
            rid = row["repair_id"]
            if rid not in self.repairs:
                level = any(a.rsplit("/", 1)[-1].startswith("l") for a in row["alert_ids"])
                self.repairs[rid] = Tracked(rid, row["node"], "node", level=level)

    async def is_open(self, t: Tracked) -> bool:
        try:
            d = await self.handle(t).describe()
        except RPCError:
            return True  # started, not yet visible
        return d.status == WorkflowExecutionStatus.RUNNING

    async def open_on(self, node: str) -> list[Tracked]:
        await self.discover()
        return [t for t in self.repairs.values() if t.node == node and await self.is_open(t)]

    # ---- operations ----------------------------------------------------------------
    async def run(self, step: Step) -> None:
        self.trace.append(str(step))
        if DEBUG:
            print(f"{time.monotonic():.1f} step {step}", flush=True)
        op = getattr(self, f"op_{step.op}")
        await op(step)
        await asyncio.sleep(0.05)  # let workers pick up what the step caused
        await self.sample_guard(f"after step {len(self.trace)} {step}")

    async def live(self, rid: str) -> bool:
        """Whether repair ``rid`` still runs and was not terminated by the program."""
        t = self.repairs.get(rid)
        if t is None:
            await self.discover()
            t = self.repairs.get(rid)
        return t is not None and not t.terminated and await self.is_open(t)

    async def sample_guard(self, when: str) -> None:
        """Ask the guard for its leases and note clashes between live holders."""
        g = await self.guard()
        if g is None:
            return
        clashes = lease_clashes(g)
        if not clashes:
            return
        live = {x.repair_id for x in g.leases if await self.live(x.repair_id)}
        self.seen += [f"{when}: {text}" for text in lease_clashes(g, live)]

    async def _now_alert(self, node: str, kind: str, active: bool = True) -> Alert:
        """A level fault (``ib_link_down`` → reboot, or its clear) or an event (Xid 79 →
        power cycle), observed now (server time)."""
        i = next(self.n)
        now = await self.env.get_current_time()
        if kind == "level":
            return make_alert(
                self.cluster, node, f"l{i}", kind="ib_link_down", code=None, level=True,
                action="reboot", summary="InfiniBand link down", active=active,
                observed_at=now,
            )
        return make_alert(self.cluster, node, f"x{i}", observed_at=now)

    async def op_alert(self, s: Step) -> None:
        await self.h.deliver(await self._now_alert(s.node, s.arg))

    async def op_clear(self, s: Step) -> None:
        clear = await self._now_alert(s.node, "level", active=False)
        await self.h.deliver(clear)
        for t in await self.open_on(s.node):  # API repairs hear the clear directly
            if t.via == "api" and t.level:
                try:
                    await self.handle(t).signal(REPAIR_SIGNAL_ATTACH_ALERT, clear)
                except RPCError:
                    pass  # closed meanwhile

    async def op_api(self, s: Step) -> None:
        rid = f"api{next(self.n)}-{self.cluster}"  # repair ids are unique ledger-wide
        alert = await self._now_alert(s.node, s.arg)
        action = Action.reboot if s.arg == "level" else Action.power_cycle
        req = RepairRequest(repair_id=rid, cluster=self.cluster, node=s.node, action=action,
                            alerts=[alert])
        self.repairs[rid] = Tracked(rid, s.node, "api", level=s.arg == "level")
        await self.h.client.start_workflow(
            "RepairWorkflow", req, id=workflow_id_repair(self.cluster, s.node, rid),
            task_queue=self.h.task_queue, result_type=RepairStatus,
        )

    async def _targets(self, s: Step) -> list[Tracked]:
        open_ = await self.open_on(s.node)
        return open_[-1:] if open_ else []

    async def op_approve(self, s: Step) -> None:
        for t in await self._targets(s):
            try:
                await self.handle(t).signal("approve", ApproveSignal(by="alice"))
                t.approved = True
            except RPCError:
                pass

    async def op_reject(self, s: Step) -> None:
        for t in await self._targets(s):
            try:
                await self.handle(t).signal("reject", RejectSignal(by="bob", reason="not now"))
            except RPCError:
                pass

    async def op_cancel(self, s: Step) -> None:
        for t in await self._targets(s):
            try:
                await self.handle(t).signal("cancel", CancelSignal(by="carol", reason="stop"))
            except RPCError:
                pass

    async def _parked(self, t: Tracked) -> bool:
        """Wait (up to 2 s) for ``t`` to park in a wait (approval, lease, idle) between
        tasks. The time-skipping server keeps an activity that was in flight when its
        workflow was terminated pending for ever, and time stops skipping; so
        terminations land only there. A real server has no such quirk."""
        for _ in range(40):
            try:
                st = await self.handle(t).query("status", result_type=RepairStatus)
                raw = (await self.handle(t).describe()).raw_description
            except RPCError:
                return False
            parked = st.stage in (Stage.awaiting_approval, Stage.waiting_for_idle) or (
                "lease" in st.detail)
            if parked and not raw.pending_activities and not raw.HasField(
                    "pending_workflow_task"):
                return True
            await asyncio.sleep(0.05)
        return False

    async def op_terminate(self, s: Step) -> None:
        for t in await self._targets(s):
            if await self._parked(t):
                try:
                    await self.handle(t).terminate("property test: terminated from the CLI")
                    t.terminated = True
                except RPCError:
                    pass

    async def _between_tasks(self, handle: WorkflowHandle[Any, Any]) -> bool:
        """Whether ``handle`` has no activity or workflow task in flight on three reads
        50 ms apart (bounded: False when it stays busy); see :meth:`_parked`."""
        for _ in range(40):
            quiet = 0
            for _ in range(3):
                try:
                    raw = (await handle.describe()).raw_description
                except RPCError:
                    return False
                if raw.pending_activities or raw.HasField("pending_workflow_task"):
                    break
                quiet += 1
                await asyncio.sleep(0.05)
            if quiet == 3 and not await self._signals_in_flight(handle):
                return True
            await asyncio.sleep(0.05)
        return False

    async def _unlock_if_cut(self, workflow_id: str, run_id: str) -> None:
        """See :func:`tests.workflows.helpers.unlock_if_cut`; counted in ``cut_tasks``."""
        if await unlock_if_cut(self.h, workflow_id, run_id):
            self.cut_tasks += 1

    async def _signals_in_flight(self, handle: WorkflowHandle[Any, Any]) -> bool:
        """Whether ``handle`` has a signal to another workflow in flight (initiated, not yet
        answered): describe does not show one, and its answer schedules a workflow task at
        once — the guard replies to holders one signal at a time."""
        try:
            events = (await handle.fetch_history()).events
        except RPCError:
            return True
        open_: set[int] = set()
        for e in events:
            if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
                open_.add(e.event_id)
            elif e.HasField("external_workflow_execution_signaled_event_attributes"):
                open_.discard(e.external_workflow_execution_signaled_event_attributes
                              .initiated_event_id)
            elif e.HasField("signal_external_workflow_execution_failed_event_attributes"):
                open_.discard(e.signal_external_workflow_execution_failed_event_attributes
                              .initiated_event_id)
        return bool(open_)

    async def _describe_all(
        self, include_guard: bool
    ) -> list[tuple[str, WorkflowExecutionDescription]]:
        """(workflow id, description) of the world's node and repair workflows (and its
        guard when ``include_guard``); ids that do not exist (yet) are left out."""
        ids = [workflow_id_guard(self.cluster)] if include_guard else []
        ids += [workflow_id_node(self.cluster, n) for n in NODES]
        ids += [workflow_id_repair(self.cluster, t.node, t.rid) for t in self.repairs.values()]
        out = []
        for wid in ids:
            try:
                out.append((wid, await self.h.client.get_workflow_handle(wid).describe()))
            except RPCError:
                continue
        return out

    async def quiet(self, include_guard: bool = False) -> bool:
        """Whether no workflow of this world has a task in flight (one read each): a guard
        terminated now is not sent a signal in the next moment by a repair mid-task."""
        for _, d in await self._describe_all(include_guard):
            raw = d.raw_description
            if d.status == WorkflowExecutionStatus.RUNNING and (
                    raw.pending_activities or raw.HasField("pending_workflow_task")):
                return False
        return True

    async def op_guard(self, s: Step) -> None:
        """Terminate ``guard/{cluster}`` (as an operator would from the Temporal UI) and
        start a fresh one, as the next re-send or ``autorepair breaker status`` would, in
        one call (``TERMINATE_EXISTING``), while the world is quiet and the guard between
        tasks with no signal of its own in flight: the time-skipping server stops skipping
        time for good when a workflow is cut mid-task (:meth:`_unlock_if_cut` undoes that
        for a signal that slips in anyway) or starts a child under the id of a terminated
        one (the repairs' own restart path, so the fresh guard is started here, as in
        ``test_leases.py``). The fresh guard rebuilds from the ledger; its budget and
        breaker are compared with the old one's."""
        gid = workflow_id_guard(self.cluster)
        if await self.guard() is None:
            return
        for _ in range(40):
            if await self.quiet() and await self._between_tasks(
                    self.h.client.get_workflow_handle(gid)):
                break
            await asyncio.sleep(0.05)
        else:
            return
        # Read only now: a guard just started by a lease request answers with the default
        # policy until its first load_policy returns (an activity in flight, so not
        # "between tasks"); that is not what a rebuild must keep.
        before = await self.guard()
        if before is None:
            return
        try:
            old = (await self.h.client.get_workflow_handle(gid).describe()).run_id
            handle = await self.h.client.start_workflow(
                GUARD_WORKFLOW, GuardInput(cluster=self.cluster), id=gid,
                task_queue=self.h.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            )
        except RPCError:
            return
        self.guard_restarts += 1
        self.guard_runs.append(old)
        await self._unlock_if_cut(gid, old)
        after = None
        for _ in range(100):
            try:
                after = await handle.query("status", result_type=GuardStatus)
            except RPCError:
                after = None
            if after is not None and after.rebuilt_at is not None:
                break
            await asyncio.sleep(0.05)
        if after is None or after.rebuilt_at is None:
            self.seen.append(f"guard restart {self.guard_restarts}: no fresh guard rebuilt "
                             "from the ledger")
            return
        self.seen += [f"guard restart {self.guard_restarts}: {x}"
                      for x in rebuild_changes(before, after)]

    async def op_fault(self, s: Step) -> None:
        name, how = FAULTS[s.n]
        if how == "transient":
            self.fake.transient[name] = 3
        elif how == "fail":
            self.fake.fail_actions[name] = 1
        else:
            self.fake.broken[name] = how

    async def op_heal(self, s: Step) -> None:
        self.fake.broken.clear()
        self.fake.transient.clear()

    async def op_busy(self, s: Step) -> None:
        self.fake.busy_polls[s.node] = s.n

    async def op_advance(self, s: Step) -> None:
        await self.skip(s.n)

    async def skip(self, seconds: float) -> None:
        """Skip server time; on a stall, say which workflow holds time still.

        A stall while no workflow of this world has a task or activity in flight is the
        test server's own leak (a lock it took for a workflow task it never counts back,
        see :meth:`_unlock_if_cut`, which cannot see every case; a terminated run can leak
        more than one): each leaked lock is given back (counted in ``forced_unlocks``) and
        the skip tried again, up to ``MAX_LEAKED_LOCKS`` times. The server refuses an unlock
        that no lock balances, so an unlock that succeeds proves a leaked lock; a refused
        one, a stall with work in flight, or one past that bound fails with what holds
        time still."""
        for attempt in range(MAX_LEAKED_LOCKS + 1):
            try:
                await asyncio.wait_for(self.env.sleep(timedelta(seconds=seconds)), 45)
                return
            except (TimeoutError, RPCError) as e:
                if attempt == MAX_LEAKED_LOCKS or not await self.quiet(include_guard=True):
                    raise ClockStopped(f"time did not skip {seconds} s: {e}; "
                                       f"{await self.pending()}") from e
                try:
                    await self.env.client.test_service.unlock_time_skipping(
                        UnlockTimeSkippingRequest())
                except RPCError as unbalanced:  # no lock was leaked after all
                    raise ClockStopped(f"time did not skip {seconds} s: {e}; "
                                       f"{await self.pending()}") from unbalanced
                self.forced_unlocks += 1

    async def pending(self) -> str:
        out = []
        for wid, d in await self._describe_all(include_guard=True):
            raw = d.raw_description
            acts = [(a.activity_type.name, a.attempt, a.last_failure.message[:80])
                    for a in raw.pending_activities]
            out.append(f"{wid}: {d.status.name if d.status else '?'} acts={acts} "
                       f"wft={raw.pending_workflow_task.state if raw.HasField('pending_workflow_task') else None}")
        for run_id in self.guard_runs:  # the guards ``guard`` steps terminated: last events
            try:
                events = (await self.h.client.get_workflow_handle(
                    workflow_id_guard(self.cluster), run_id=run_id).fetch_history()).events
            except RPCError:
                continue
            out.append(f"guard run {run_id[:8]} (terminated): "
                       f"{[EventType.Name(e.event_type)[11:] for e in events[-4:]]}")
        return "\n".join(out)

    # ---- settle --------------------------------------------------------------------
    async def settle(self) -> list[str]:
        """Heal, approve what is open, let it run, clear level faults, cancel the rest.
        Returns the repairs still open after all that (none expected)."""
        self.fake.broken.clear()
        self.fake.transient.clear()
        self.fake.fail_actions.clear()
        self.fake.busy_polls.clear()
        for node in NODES:
            await self.op_approve(Step("approve", node))
        await self.skip_by(WAIT_MARK_S)
        waiting = await self.lease_waiters()
        self.seen += [f"settling: {x}" for x in waiting.forgotten]
        mark = await self.env.get_current_time()
        self.waiters_checked += len(waiting.waiting)
        await self.skip_by(WAIT_CHECK_S)
        for rid in waiting.waiting:
            t = self.repairs[rid]
            if (not await self.is_open(t) or rid not in (await self.lease_waiters()).waiting
                    or await granted_since(self.handle(t), mark)):
                continue
            self.seen.append(f"settling: {rid} still waits for a lease {WAIT_CHECK_S:g} s "
                             f"after it was seen waiting (lease_wait_max_s "
                             f"{LEASE_WAIT_MAX_S:g} s), never granted meanwhile")
        for node in NODES:
            await self.op_clear(Step("clear", node))
        for _ in range(3):
            for node in NODES:
                for t in await self.open_on(node):
                    try:
                        await self.handle(t).signal("cancel", CancelSignal(by="settle"))
                    except RPCError:
                        pass
            await self.skip(600)
            await asyncio.sleep(0.05)
        await self.discover()
        still = [t for t in self.repairs.values() if await self.is_open(t)]
        for t in still:
            why = await self.task_refused(t)
            if why is not None:
                raise TaskRefused(f"{t.rid}: {why}")
        return [t.rid for t in still]

    async def task_refused(self, t: Tracked) -> str | None:
        """Why repair ``t`` cannot take another step because the server refuses its
        workflow task's completion (:class:`TaskRefused`), or None. Signature: a workflow
        task pending at attempt 2 or more, and no ``WorkflowTaskFailed`` since the last
        completed task — a failure of the workflow's own code (an exception, the
        deadlock detector) is a ``WorkflowTaskFailed`` and stays a violation."""
        handle = self.handle(t)
        try:
            raw = (await handle.describe()).raw_description
        except RPCError:
            return None
        if not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < 2:
            return None
        for e in reversed((await handle.fetch_history()).events):
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                return None
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                break
        return (f"workflow task at attempt {raw.pending_workflow_task.attempt}, none "
                "completed since and none failed by the workflow's code: the server "
                "refuses its completion (temporalio/sdk-java#2391)")

    async def skip_by(self, seconds: float, step_s: float = 600) -> None:
        """Skip ``seconds`` of server time in steps of ``step_s``."""
        left = seconds
        while left > 0:
            await self.skip(min(step_s, left))
            left -= step_s
            await asyncio.sleep(0.05)

    async def lease_waiters(self) -> LeaseWaiters:
        """Open repairs waiting for a lease (detail), and those of them the guard does not
        list (neither queued nor holding)."""
        details: dict[str, str] = {}
        await self.discover()
        for t in self.repairs.values():
            if t.terminated or not await self.is_open(t):
                continue
            try:
                st = await self.handle(t).query("status", result_type=RepairStatus)
            except RPCError:
                continue
            details[t.rid] = st.detail
        return lease_waiters(await self.guard(), details)

    async def guard(self) -> GuardStatus | None:
        try:
            return await self.h.client.get_workflow_handle(
                workflow_id_guard(self.cluster)).query("status", result_type=GuardStatus)
        except RPCError:
            return None

    async def shutdown(self) -> None:
        """Terminate every workflow of this world: the session's server is shared and a
        leftover with no worker (a repair a NodeWorkflow just started, a validation
        child) would keep time from skipping for the next example."""
        client = self.h.client
        for n in NODES:  # first the nodes, so they start nothing more; note their repair
            handle = client.get_workflow_handle(workflow_id_node(self.cluster, n))
            try:
                st = await handle.query("status", result_type=NodeStatus)
                if st.repair_id and st.repair_id not in self.repairs:
                    self.repairs[st.repair_id] = Tracked(st.repair_id, n, "node")
            except RPCError:
                pass
            try:
                await handle.terminate("example finished")
            except RPCError:
                pass
        await self.discover()
        ids = [workflow_id_guard(self.cluster)]
        for t in self.repairs.values():
            ids.append(workflow_id_repair(self.cluster, t.node, t.rid))
            ids.append(f"validate/m-{t.node}/{t.rid}")
        for wid in ids:
            try:
                await client.get_workflow_handle(wid).terminate("example finished")
            except RPCError:
                pass


def world_policy(approve: bool, lease_wait_max_s: float = LEASE_WAIT_MAX_S) -> PolicyConfig:
    """Short waits so a program of minutes reaches every stage; a low per-node cap.
    ``lease_wait_max_s``: other than :data:`LEASE_WAIT_MAX_S` only where a test shows that
    a wait beyond the bound is flagged."""
    p = PolicyConfig()
    p.consent.mode = "approve" if approve else "automatic"
    p.consent.approval_timeout_s = 3600.0
    p.rails.cooldown_s = 0.0
    p.rails.persistence_s = 60.0
    p.rails.min_concurrent = 3
    p.rails.breaker_min = 1000  # the breaker has tests of its own
    p.rails.rejoin_timeout_s = 900.0
    p.rails.action_retry_max_s = 300.0
    p.rails.max_actions_per_node = CAP
    p.rails.lease_ttl_s = LEASE_TTL_S
    p.rails.lease_wait_max_s = lease_wait_max_s
    p.wait_for_idle.poll_s = 30.0
    p.wait_for_idle.max_wait_s = 1200.0
    return p


@asynccontextmanager
async def world(
    pool: Any, approve: bool, lease_wait_max_s: float = LEASE_WAIT_MAX_S
) -> AsyncIterator[World]:
    """A time-skipping server of its own (one example's leftovers — an activity in flight
    when its workflow closed — cannot hold time still for the next), a running worker
    pair over a fresh cluster; every workflow terminated afterwards."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    from tests.conftest import venv_binary
    from tests.workflows.conftest import register_search_attributes

    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=venv_binary("temporal-test-server"),
    )
    try:
        await register_search_attributes(env.client)
        sfx = uuid.uuid4().hex[:8]
        fake = RecordingCluster(cluster=f"p-{sfx}", nodes=list(NODES))
        h = Harness(
            env=env, client=env.client, cluster=fake, ledger=Ledger(pool),
            policy=world_policy(approve, lease_wait_max_s), task_queue=f"prop-{sfx}",
            bmc_queue=f"prop-bmc-{sfx}", gpu_nodes=len(NODES), pools=dict(POOLS),
        )
        w = World(env=env, h=h, fake=fake)
        async with (
            Worker(env.client, task_queue=h.task_queue,
                   workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
                   activities=[*LedgerActivities(pool).all(), *fake.scheduler_activities(),
                               *h.policy_activities(), *GuardReplyActivities(env.client).all()]),
            Worker(env.client, task_queue=h.bmc_queue, activities=fake.machine_activities()),
        ):
            try:
                yield w
            finally:
                await w.shutdown()
    finally:
        await env.shutdown()


# ---- invariants ----------------------------------------------------------------------
#: Activities that disturb a node (cordon, drain, every machine action).
DISRUPTIVE_ACTIVITIES = {ACT.cordon_node, ACT.drain_node, *MACHINE_ACTIVITY.values()}


async def acted_after_clear(handle: WorkflowHandle[Any, Any]) -> str | None:
    """The first disruptive activity a repair scheduled after it saw its last clear, from
    its history: a workflow task started after the ``attach_alert`` signal carrying the
    clear (``active: false``) is the first to see it; an activity that task (or a later
    one) schedules ran on cleared evidence. None when there is none."""
    events = (await handle.fetch_history()).events
    clear_at = None
    started: dict[int, int] = {}
    for e in events:
        if e.HasField("workflow_execution_signaled_event_attributes"):
            a = e.workflow_execution_signaled_event_attributes
            if a.signal_name == REPAIR_SIGNAL_ATTACH_ALERT and a.input.payloads:
                if json.loads(a.input.payloads[0].data).get("active") is False:
                    clear_at = e.event_id
        elif e.HasField("workflow_task_completed_event_attributes"):
            started[e.event_id] = e.workflow_task_completed_event_attributes.started_event_id
        elif clear_at is not None and e.HasField("activity_task_scheduled_event_attributes"):
            a2 = e.activity_task_scheduled_event_attributes
            if (a2.activity_type.name in DISRUPTIVE_ACTIVITIES
                    and started.get(a2.workflow_task_completed_event_id, 0) > clear_at):
                return (f"{a2.activity_type.name} scheduled (event {e.event_id}) after the "
                        f"clear of all its evidence (event {clear_at})")
    return None


async def check(w: World, still_open: list[str]) -> list[str]:
    """Every rail of the module docstring; returns the violations (empty: all hold)."""
    bad: list[str] = []
    ledger: dict[str, dict[str, Any]] = {}
    for r in await w.h.ledger.list_repairs(cluster=w.cluster):
        full = await w.h.ledger.get_repair(r["repair_id"])
        if full is not None:
            ledger[r["repair_id"]] = full
    closed: dict[str, Tracked] = {}
    statuses: dict[str, RepairStatus] = {}
    for t in w.repairs.values():
        if t.rid in still_open:
            bad.append(f"{t.rid}: still open after settling (stuck)")
            continue
        closed[t.rid] = t
        if t.terminated:
            continue
        try:
            statuses[t.rid] = await w.handle(t).query("status", result_type=RepairStatus)
        except RPCError as e:
            bad.append(f"{t.rid}: status query failed: {e}")
    if DEBUG:
        ends = sorted(f"{'T' if t.terminated else ''}{statuses[t.rid].stage.value}"
                      if t.rid in statuses else "T" for t in closed.values())
        acts = sum(1 for c in w.fake.log if c.name in ACTIONS)
        g = await w.guard()
        expired = [x.repair_id for x in g.expired] if g else []
        print(f"  ends={ends} actions={acts} cordons={w.fake.cordons} "
              f"guard_restarts={w.guard_restarts} cut={w.cut_tasks} "
              f"unlocks={w.forced_unlocks} expired={expired} "
              f"lease_timeouts={sum(1 for st in statuses.values() if st.history and 'lease_wait_max_s' in st.history[-1].reason)} "
              f"waiters_checked={w.waiters_checked}", flush=True)
    # a repair's ledger row is terminal once its workflow closed (not terminated)
    for rid, t in closed.items():
        row = ledger.get(rid)
        if t.terminated:
            continue
        st = statuses.get(rid)
        if row is None:
            if st is not None and st.history:
                bad.append(f"{rid}: closed at {st.stage.value} with no ledger row")
            continue
        if row["stage"] not in TERMINAL:
            bad.append(f"{rid}: closed but the ledger row is {row['stage']}")
    # cordons left: ours only with a hold reason
    for node, holder in w.fake.cordons.items():
        t = w.repairs.get(holder)
        if t is None or t.terminated:
            continue
        row = ledger.get(holder)
        last = row["transitions"][-1]["reason"] if row and row["transitions"] else ""
        if "left cordoned" not in last:
            bad.append(f"{node} left cordoned by {holder} without a hold reason ({last!r})")
    # at most one acting repair per node: acting windows in call order never overlap
    windows: dict[str, list[tuple[int, int, str]]] = {}
    for rid in w.repairs:
        calls = [c for c in w.fake.log if c.rid == rid and c.name in NODE_CALLS]
        acting = [c for c in calls if c.name in DISRUPTIVE - {"cordon"}
                  or (c.name == "cordon" and c.by_us)]
        if acting:
            node = w.repairs[rid].node
            windows.setdefault(node, []).append((acting[0].seq, calls[-1].seq, rid))
    for node, ws in windows.items():
        ws.sort()
        for (s1, e1, r1), (s2, _e2, r2) in itertools.pairwise(ws):
            if s2 <= e1:
                bad.append(f"{node}: {r2} acted at call {s2} while {r1} held it "
                           f"(calls {s1}..{e1})")
    # no disruptive step after the repair heard the clear of all its evidence
    for rid, st in statuses.items():
        if st.evidence and not any(a.active for a in st.evidence):
            late = await acted_after_clear(w.handle(w.repairs[rid]))
            if late:
                bad.append(f"{rid}: {late}")
    # an approval is never lost
    for rid, st in statuses.items():
        t = w.repairs[rid]
        if not t.approved:
            continue
        reasons = " ".join(x.reason for x in st.history)
        if st.stage == Stage.timed_out and "no approval" in st.history[-1].reason:
            if "ladder" not in reasons and "cap" not in reasons and "cannot run" not in reasons:
                bad.append(f"{rid}: approved, yet timed out waiting for approval")
        asked = any(x.stage == Stage.awaiting_approval for x in st.history)
        if asked and st.approved_by is None and st.stage not in (
            Stage.rejected, Stage.cancelled, Stage.auto_resolved, Stage.timed_out,
        ):
            bad.append(f"{rid}: approved while open, ended {st.stage.value} with no approver")
    # per-node action cap: attempts beyond it ran only with a person's approval
    for node in NODES:
        attempts = sorted(
            (a["at"], r["repair_id"]) for r in ledger.values() if r["node"] == node
            for a in r.get("attempts") or []
        )
        for i, (_at, rid) in enumerate(attempts):
            if i < CAP:
                continue
            st = statuses.get(rid)
            human = st is not None and st.approved_by not in (None, AUTO_APPROVED)
            if human or (w.repairs.get(rid) and w.repairs[rid].terminated):
                continue
            bad.append(f"{node}: attempt {i + 1} by {rid} beyond the cap of {CAP} without a "
                       "person's approval")
    # what the run and settling saw (lease clashes, rebuilds, lease waiters)
    bad += w.seen
    # every repair has ended and settling ran past the lease TTL: nothing is held or queued
    bad += leftover_leases(await w.guard(),
                           {t.rid for t in w.repairs.values() if t.terminated})
    return bad
