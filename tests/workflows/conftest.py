"""Harness for the workflow tests: time-skipping Temporal, real ledger, fake cluster.

``FakeCluster`` is a small in-memory model of one cluster's scheduler and BMCs whose
bound methods are registered as the same-named scheduler / machine activities
(``workflows.activity_api.ACT``). It records every call, honours the idempotency rules
(cordon only once, uncordon only our cordon, power cycle guarded by the boot id) and can
be told to fail an action or to stay busy for a number of idle checks.

The ledger activities are the real ones (``activities.ledger_activities``) on the
``ledger_pool`` fixture's fresh schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from _pytest.runner import runtestprotocol
from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    PHASE_DETAIL,
    SENT_AT_DETAIL,
    ActionResult,
    CordonInput,
    CordonResult,
    DrainInput,
    DrainResult,
    IdleStatus,
    MachineActionInput,
    MigrateResult,
    NodeHealth,
    NodePolicy,
    NodeRef,
    Notification,
    PolicySnapshot,
    RejoinInput,
    RejoinResult,
)
from workflows.config import PolicyConfig
from workflows.evidence import (
    BmcCapture,
    EvidenceCapture,
    EvidenceCaptureInput,
    NodeCapture,
    SelEntry,
)
from workflows.lifecycle.machine_action import DISRUPTIVE as MA_DISRUPTIVE
from workflows.models import Action, Alert, AlertDelivery, NodeInput
from workflows.protocol import (
    NODE_UPDATE_DELIVER_ALERT,
    SEARCH_ATTRIBUTES,
    workflow_id_guard,
    workflow_id_node,
)
from workflows.registry import WORKFLOWS

#: Our workflows; the real ValidationWorkflow is replaced by the same-named fake.
OWN_WORKFLOWS = [w for w in WORKFLOWS if w.__name__ != "ValidationWorkflow"]


@dataclass
class FakeCluster:
    """In-memory cluster: scheduler state and BMC state per node."""

    cluster: str
    nodes: list[str]
    calls: list[tuple[str, str]] = field(default_factory=list)
    cordons: dict[str, str] = field(default_factory=dict)  # node -> repair id or "other"
    busy_polls: dict[str, int] = field(default_factory=dict)  # idle checks still busy
    repair_cordoned: set[str] = field(default_factory=set)  # cordons set by a repair
    idle_detail: dict[str, str] = field(default_factory=dict)  # node -> IdleStatus.detail
    fail_actions: dict[str, int] = field(default_factory=dict)  # action -> failures left
    boot: dict[str, int] = field(default_factory=dict)
    unhealthy: set[str] = field(default_factory=set)
    power_cycles: int = 0
    notifications: list[Notification] = field(default_factory=list)
    # call name -> ERR_* type raised (non-retryable) on every call, e.g. a Kubernetes 403
    broken: dict[str, str] = field(default_factory=dict)
    # call name -> retryable failures left (BMC connection refused, HTTP 5xx)
    transient: dict[str, int] = field(default_factory=dict)
    #: Answer every notification like a webhook that says 404 (non-retryable).
    notify_rejects: bool = False
    #: Reset requests each BMC received, in order: (node, "FORCE_OFF" | "ON" | "RESTART").
    resets: list[tuple[str, str]] = field(default_factory=list)
    #: node -> BMC status reads still to fail (``BmcUnavailable``) once ``On`` was sent
    #: (the host is still booting: its boot id has not changed yet).
    bmc_read_failures_after_on: dict[str, int] = field(default_factory=dict)
    #: node -> BMC status reads still to fail once ForceOff was sent (waiting for Off).
    bmc_read_failures_after_off: dict[str, int] = field(default_factory=dict)
    #: nodes whose power cycle's first ForceOff has its answer lost and never lands (the
    #: try fails at ``off_requested``; a make-safe run then reports ``nothing_landed``)
    force_off_lost: set[str] = field(default_factory=set)
    #: call name ("check_idle", "power_cycle", ...) -> coroutine function awaited with the
    #: node at the start of that call: a test sends a signal while the call is out.
    while_out: dict[str, Callable[[str], Awaitable[None]]] = field(default_factory=dict)
    #: How ``capture_evidence`` answers: "ok" (a node archive and 2 SEL entries),
    #: "fail" (a non-retryable error) or "hang" (never answers: the repair's bound ends it).
    capture_mode: str = "ok"
    #: The ``capture_evidence`` inputs received, in order.
    captures: list[EvidenceCaptureInput] = field(default_factory=list)
    #: node -> the spare machine a migrate bound it to (the ledger's binding: the
    #: policy reads report it as the node's machine). Made before the bring-up, so a
    #: migrate that fails afterwards leaves it, as the Redfish provider does.
    bound: dict[str, str] = field(default_factory=dict)
    #: When set, ``drain_node`` answers with it (after the call is logged and any injected
    #: failure raised): e.g. the real ``SchedulerActivities.drain_node`` over a fake
    #: scheduler, so a test sees the deadline the real activity hands the scheduler.
    drain_with: Callable[[DrainInput], Awaitable[DrainResult]] | None = None
    #: Nodes whose OS hangs: the BMC accepts ``GracefulRestart`` and the OS never acts on
    #: it. As activities/power.py: the call that sent it fails transiently in phase
    #: ``restart_unseen``; the retry from there sends ``FORCE_RESTART``.
    hung_os: set[str] = field(default_factory=set)
    #: When the hung OS's ``GracefulRestart`` went out, as ``reboot_machine`` reports it
    #: (``sent_at`` beside the phase in its failure details).
    restart_sent_at: str = "2026-12-07T12:00:00+00:00"
    #: The ``reboot_machine`` inputs received, in order.
    reboot_inputs: list[MachineActionInput] = field(default_factory=list)

    async def _out(self, name: str, node: str) -> None:
        hook = self.while_out.get(name)
        if hook is not None:
            await hook(node)

    def _log(self, name: str, node: str) -> None:
        self.calls.append((name, node))
        if name in self.broken:
            raise ApplicationError(
                f"{name} on {node}: injected {self.broken[name]}",
                type=self.broken[name],
                non_retryable=True,
            )
        left = self.transient.get(name, 0)
        if left > 0:
            self.transient[name] = left - 1
            raise ApplicationError(f"{name} on {node}: connection refused (injected)")

    def count(self, name: str, node: str | None = None) -> int:
        return sum(1 for n, nd in self.calls if n == name and (node is None or nd == node))

    @activity.defn(name=ACT.cordon_node)
    async def cordon_node(self, inp: CordonInput) -> CordonResult:
        await self._out("cordon", inp.node)
        self._log("cordon", inp.node)
        holder = self.cordons.get(inp.node)
        if holder is None:
            self.cordons[inp.node] = inp.repair_id
            self.repair_cordoned.add(inp.node)
            return CordonResult(cordoned_by_us=True)
        if holder == inp.repair_id:
            return CordonResult(cordoned_by_us=True, detail="already ours")
        # a holder set by a repair's cordon names that repair; one set by hand (an
        # operator's maintenance cordon) does not
        by_repair = holder if inp.node in self.repair_cordoned else None
        return CordonResult(cordoned_by_us=False, by_other=True, held_by_repair=by_repair,
                            detail=f"held by {holder}")

    @activity.defn(name=ACT.check_idle)
    async def check_idle(self, ref: NodeRef) -> IdleStatus:
        self._log("check_idle", ref.node)
        await self._out("check_idle", ref.node)
        left = self.busy_polls.get(ref.node, 0)
        if left > 0:
            self.busy_polls[ref.node] = left - 1
            return IdleStatus(idle=False, running=[f"job-{ref.node}"],
                              detail=self.idle_detail.get(ref.node, ""))
        return IdleStatus(idle=True, detail=self.idle_detail.get(ref.node, ""))

    @activity.defn(name=ACT.drain_node)
    async def drain_node(self, inp: DrainInput) -> DrainResult:
        self._log("drain", inp.node)
        await self._out("drain", inp.node)
        if self.drain_with is not None:
            return await self.drain_with(inp)
        return DrainResult(drained=True)

    @activity.defn(name=ACT.rejoin_node)
    async def rejoin_node(self, inp: RejoinInput) -> RejoinResult:
        await self._out("rejoin", inp.node)
        self._log("rejoin", inp.node)
        holder = self.cordons.get(inp.node)
        if holder == inp.repair_id:
            del self.cordons[inp.node]
            self.repair_cordoned.discard(inp.node)
            return RejoinResult(uncordoned=True)
        if holder is None:  # schedulable, nothing of ours (as the real schedulers answer)
            return RejoinResult(uncordoned=True)
        return RejoinResult(uncordoned=False, kept_reason=f"cordon held by {holder}")

    @activity.defn(name=ACT.node_health)
    async def node_health(self, ref: NodeRef) -> NodeHealth:
        self._log("node_health", ref.node)
        await self._out("node_health", ref.node)
        return NodeHealth(
            ready=ref.node not in self.unhealthy, boot_id=f"boot-{self.boot.get(ref.node, 0)}"
        )

    def _maybe_fail(self, action: str) -> None:
        """An injected definitive failure after the action touched the machine (its
        disruptive phase reached, as the real activities report it)."""
        left = self.fail_actions.get(action, 0)
        if left > 0:
            self.fail_actions[action] = left - 1
            phase = MA_DISRUPTIVE.get(Action(action))
            raise ApplicationError(
                f"{action} failed (injected)", *([{PHASE_DETAIL: phase}] if phase else []),
                type=ERR_ACTION_FAILED, non_retryable=True,
            )

    def _reboot(self, node: str) -> None:
        self.boot[node] = self.boot.get(node, 0) + 1

    @activity.defn(name=ACT.reset_gpu)
    async def reset_gpu(self, inp: MachineActionInput) -> ActionResult:
        self._log("reset_gpu", inp.node)
        self._maybe_fail("reset_gpu")
        return ActionResult(done=True)

    @activity.defn(name=ACT.reboot_machine)
    async def reboot_machine(self, inp: MachineActionInput) -> ActionResult:
        """Phased like activities/power.py: the restart is sent once per attempt."""
        self._log("reboot", inp.node)
        self.reboot_inputs.append(inp)
        await self._out("reboot", inp.node)
        self._maybe_fail("reboot")
        if inp.resume_phase == "not_started":
            self.resets.append((inp.node, "RESTART"))
            if inp.node in self.hung_os:
                raise ApplicationError(
                    f"no restart of {inp.node} seen (injected hung OS)",
                    {PHASE_DETAIL: "restart_unseen", SENT_AT_DETAIL: self.restart_sent_at},
                    type="RestartNotSeen")
        if inp.resume_phase == "restart_unseen":
            self.resets.append((inp.node, "FORCE_RESTART"))
        self._reboot(inp.node)
        return ActionResult(done=True, phase="booted")

    @activity.defn(name=ACT.power_cycle_machine)
    async def power_cycle_machine(self, inp: MachineActionInput) -> ActionResult:
        """Phased like activities/power.py (ForceOff → Off → On → On seen), resuming from
        ``inp.resume_phase``; the boot id changes once the host is seen On again. A
        status read while ``bmc_read_failures_after_on`` lasts fails with
        ``BmcUnavailable`` carrying the phase reached."""
        self._log("power_cycle", inp.node)
        await self._out("power_cycle", inp.node)
        self._maybe_fail("power_cycle")
        if (
            inp.boot_id_before is not None
            and inp.boot_id_before != f"boot-{self.boot.get(inp.node, 0)}"
        ):
            return ActionResult(done=True, skipped_reason="host already came back",
                                phase="booted")
        phase = inp.resume_phase
        lost = inp.node in self.force_off_lost
        if phase == "not_started" and lost:
            # the ForceOff's answer is lost and the request never reached the host
            raise ApplicationError(f"BMC of {inp.node} unavailable: ConnectionError "
                                   "(injected: ForceOff answer lost)",
                                   {PHASE_DETAIL: "off_requested"}, type="BmcUnavailable")
        if phase == "off_requested" and lost and inp.make_safe:
            return ActionResult(done=True, phase="booted", nothing_landed=True,
                                detail="making safe: power stayed On, the earlier ForceOff "
                                       "did not land; nothing sent")
        if phase == "off_requested" and lost:  # it never landed: the retry's is the one
            self.force_off_lost.discard(inp.node)
            phase = "not_started"
        elif phase == "off_requested":  # the fake BMC's ForceOff landed
            phase = "off_sent"
        if phase == "not_started":
            self.resets.append((inp.node, "FORCE_OFF"))
            self.power_cycles += 1
            phase = "off_sent"
        if phase == "off_sent":
            self._bmc_read(inp.node, self.bmc_read_failures_after_off, phase)
            phase = "off_seen"
        if phase == "off_seen":
            self.resets.append((inp.node, "ON"))
            phase = "on_sent"
        self._bmc_read(inp.node, self.bmc_read_failures_after_on, phase)
        self._reboot(inp.node)
        return ActionResult(done=True, phase="booted")

    @staticmethod
    def _bmc_read(node: str, failures: dict[str, int], phase: str) -> None:
        left = failures.get(node, 0)
        if left > 0:
            failures[node] = left - 1
            raise ApplicationError(f"BMC of {node} unavailable: ConnectionError (injected)",
                                   {PHASE_DETAIL: phase}, type="BmcUnavailable")

    @activity.defn(name=ACT.reprovision_machine)
    async def reprovision_machine(self, inp: MachineActionInput) -> ActionResult:
        self._log("reprovision", inp.node)
        self._maybe_fail("reprovision")
        self._reboot(inp.node)
        return ActionResult(done=True)

    @activity.defn(name=ACT.migrate_node)
    async def migrate_node(self, inp: MachineActionInput) -> MigrateResult:
        self._log("migrate", inp.node)
        self.bound[inp.node] = f"spare-{inp.node}"
        await self._out("migrate", inp.node)
        self._maybe_fail("migrate")
        self._reboot(inp.node)
        return MigrateResult(new_machine=f"spare-{inp.node}", old_machine=inp.machine)

    @activity.defn(name=ACT.remove_machine)
    async def remove_machine(self, inp: MachineActionInput) -> ActionResult:
        self._log("remove", inp.node)
        return ActionResult(done=True, ticket_id=f"RMA-{inp.machine}")

    @activity.defn(name=ACT.capture_evidence)
    async def capture_evidence(self, inp: EvidenceCaptureInput) -> EvidenceCapture:
        """A node that left an archive and a BMC whose SEL has two entries (or, by
        ``capture_mode``, a capture that fails or never answers)."""
        self._log("capture_evidence", inp.node)
        self.captures.append(inp)
        await self._out("capture_evidence", inp.node)
        if self.capture_mode == "fail":
            raise ApplicationError(f"capture_evidence on {inp.node}: injected ssh refused",
                                   type=ERR_ACTION_FAILED, non_retryable=True)
        if self.capture_mode == "hang":
            await asyncio.Event().wait()
        at = activity.info().current_attempt_scheduled_time
        return EvidenceCapture(
            node=NodeCapture(path=f"{inp.dir}/{inp.repair_id}-{inp.action.value}.tar.gz",
                             size_bytes=1_258_291, sha256="3f2a" + "0" * 60,
                             tool="nvidia-bug-report", collected_at=at),
            bmc=BmcCapture(source="SEL", collected_at=at, entries=[
                SelEntry(id="2", severity="Critical", message="Uncorrectable ECC"),
                SelEntry(id="1", severity="OK", message="System boot")]))

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> None:
        if self.notify_rejects:
            raise ApplicationError(
                "notifications.webhook_url: HTTP 404", type=ERR_ACTION_FAILED, non_retryable=True
            )
        self.notifications.append(n)

    def scheduler_activities(self) -> list[Any]:
        return [
            self.cordon_node,
            self.check_idle,
            self.drain_node,
            self.rejoin_node,
            self.node_health,
            self.notify,
        ]

    def machine_activities(self) -> list[Any]:
        return [
            self.reset_gpu,
            self.reboot_machine,
            self.power_cycle_machine,
            self.reprovision_machine,
            self.migrate_node,
            self.remove_machine,
            self.capture_evidence,
        ]


@dataclass
class Harness:
    """One test's world: client, fake cluster, real ledger, policy (mutable)."""

    env: WorkflowEnvironment
    client: Client
    cluster: FakeCluster
    ledger: Ledger
    policy: PolicyConfig
    task_queue: str
    bmc_queue: str
    gpu_nodes: int
    pools: dict[str, str] = field(default_factory=dict)
    #: node → failure domains (``PolicySnapshot.domains``, issue 29 item 2).
    domains: dict[str, list[str]] = field(default_factory=dict)
    #: Pool → ``enforce`` / ``shadow`` (``clusters[].pools[].mode``, issue 29 item 3).
    pool_modes: dict[str, str] = field(default_factory=dict)
    #: When set, ``load_policy`` fails with this (non-retryable, as a broken config does).
    policy_error: str | None = None
    #: When set, the guard's ``load_policy`` fails *retryably* with this (as the machine
    #: bindings' PostgreSQL read does while the ledger is down); the node's and repair's
    #: ``load_node_policy`` still answers.
    guard_policy_outage: str | None = None

    @activity.defn(name=ACT.load_policy)
    async def load_policy(self, cluster: str) -> PolicySnapshot:
        if self.guard_policy_outage:
            raise ApplicationError(self.guard_policy_outage, type="LedgerUnavailable")
        return self._snapshot(cluster)

    def _snapshot(self, cluster: str) -> PolicySnapshot:
        if self.policy_error:
            raise ApplicationError(self.policy_error, type="ConfigurationError",
                                   non_retryable=True)
        return PolicySnapshot(
            cluster=cluster,
            policy=self.policy,
            gpu_nodes=self.gpu_nodes,
            scheduler="slurm",
            pools=self.pools,
            domains=self.domains,
            machines={n: self.cluster.bound.get(n, f"m-{n}") for n in self.cluster.nodes},
            bmc_task_queue=self.bmc_queue,
            pool_modes=self.pool_modes,
        )

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(self, ref: NodeRef) -> NodePolicy:
        """``load_policy``'s answer cut to ``ref.node`` (the node's and repair's read,
        a local activity of theirs)."""
        return NodePolicy.of(self._snapshot(ref.cluster), ref.node)

    def policy_activities(self) -> list[Callable[..., Any]]:
        """Both policy reads: a worker that runs NodeWorkflow / RepairWorkflow needs
        ``load_node_policy`` beside the ledger activities (their local activities run in
        that worker), a guard ``load_policy``."""
        return [self.load_policy, self.load_node_policy]

    async def deliver(self, alert: Alert, history_limit: int | None = None) -> AlertDelivery:
        """Start-if-needed + ``deliver_alert`` (the time-skipping server lacks
        update-with-start; the dev-server test covers that path)."""
        carried = {"history_limit": history_limit} if history_limit else None
        h: WorkflowHandle[Any, Any] = await self.client.start_workflow(
            "NodeWorkflow",
            NodeInput(cluster=alert.cluster, node=alert.node, carried=carried),
            id=workflow_id_node(alert.cluster, alert.node),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return await h.execute_update(NODE_UPDATE_DELIVER_ALERT, alert, result_type=AlertDelivery)


async def register_search_attributes(client: Client) -> None:
    """Register docs/design.md §4.4's Keyword search attributes (idempotent)."""
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTES
                },
            )
        )
    except Exception as err:  # already registered
        if "already" not in str(err).lower():
            raise


class TimeSkippingServer:
    """The time-skipping test server shared by the workflow tests, replaced when a test
    leaves its clock locked.

    The test server stops advancing time for every later caller once a workflow is left
    with a task no worker will ever take (a workflow cut mid-task, or one started moments
    before teardown and missed by it), or with a task whose completion it refused: a task
    that cancels a timer which fired while the task was with the worker ("invalid history
    builder state for action", temporalio/sdk-java#3088; never timed out nor sent again).
    The workflows jitter the lease re-send (``LEASE_RESEND_JITTER``) so that a grant does
    not land, as a rule, on the instant of a waiter's re-send timer. Teardown probes the
    clock (:meth:`check`); a locked server is shut down and the next test gets a fresh
    one, so one test's leftovers never fail another's timing.
    """

    #: Servers found with a stuck clock, across the session (read by the rerun hook).
    stuck_total = 0

    def __init__(self) -> None:
        self.env: WorkflowEnvironment | None = None
        self.replaced = 0

    async def get(self) -> WorkflowEnvironment:
        if self.env is None:
            from temporalio.contrib.pydantic import pydantic_data_converter

            from tests.conftest import patient_sleep, venv_binary

            self.env = patient_sleep(await WorkflowEnvironment.start_time_skipping(
                data_converter=pydantic_data_converter,
                test_server_existing_path=venv_binary("temporal-test-server"),
            ))
            await register_search_attributes(self.env.client)
        return self.env

    async def check(self) -> None:
        """Replace the server when its clock no longer advances (probe: one skipped hour,
        longer than the workflows' periodic timers of at most 15 min, within 5 s of real
        time)."""
        if self.env is None:
            return
        try:
            await asyncio.wait_for(self.env.sleep(timedelta(hours=1)), 5)
        except (TimeoutError, RPCError):
            env, self.env = self.env, None
            self.replaced += 1
            TimeSkippingServer.stuck_total += 1
            with contextlib.suppress(Exception):
                await env.shutdown()

    async def close(self) -> None:
        if self.env is not None:
            await self.env.shutdown()
            self.env = None


def _rearm_timeout(item: pytest.Item) -> None:
    """Give the rerun a ``timeout`` of its own. pytest-timeout arms one timer around the
    whole protocol hook, which this hook's rerun runs inside: a first run that failed by
    that timer left the rerun with none, and a rerun on a server whose clock stopped too
    then waited for ever (a CI run hung at 93 % so)."""
    import pytest_timeout  # type: ignore[import-untyped]

    settings = pytest_timeout._get_item_settings(item)
    if settings.timeout is None or settings.timeout <= 0 or settings.func_only:
        return  # func_only: pytest-timeout arms a timer per call itself
    hooks = item.config.pluginmanager.hook
    hooks.pytest_timeout_cancel_timer(item=item)
    hooks.pytest_timeout_set_timer(item=item, settings=settings)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a test on the time-skipping server once more, on a fresh server, when it failed
    and its teardown found the server's clock stuck (:meth:`TimeSkippingServer.check`):
    the test server's timers stop for good at times (its own defect; activity retries,
    workflow-task timeouts and skips all wait on them), which no workflow can survive. A
    test that fails on a server whose clock still runs fails at once, and the second run's
    result is final; the report says a rerun happened."""
    if "ts_env" not in getattr(item, "fixturenames", ()):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    stuck_before = TimeSkippingServer.stuck_total
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    if any(r.failed for r in reports) and TimeSkippingServer.stuck_total > stuck_before:
        first = next(r for r in reports if r.failed)
        item._initrequest()  # type: ignore[attr-defined]  # fresh fixtures for the rerun
        _rearm_timeout(item)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        for r in reports:
            r.sections.append((
                "rerun on a fresh time-skipping server",
                "the first run failed while the test server's clock was stuck:\n"
                + str(first.longrepr)[-2000:],
            ))
    for r in reports:
        item.ihook.pytest_runtest_logreport(report=r)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.fixture(scope="session")
async def ts_server() -> AsyncIterator[TimeSkippingServer]:
    server = TimeSkippingServer()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def ts_env(ts_server: TimeSkippingServer) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping environment with our search attributes, whose clock advances."""
    yield await ts_server.get()
    await ts_server.check()


@pytest.fixture
async def harness(ts_env: WorkflowEnvironment, ledger_pool: Any) -> AsyncIterator[Harness]:
    """A running worker (main + BMC queue) over a fresh cluster name and ledger schema."""
    suffix = uuid.uuid4().hex[:8]
    fake = FakeCluster(cluster=f"c-{suffix}", nodes=[f"gpu-{i:02d}" for i in range(1, 21)])
    policy = PolicyConfig()
    policy.consent.mode = "automatic"
    h = Harness(
        env=ts_env,
        client=ts_env.client,
        cluster=fake,
        ledger=Ledger(ledger_pool),
        policy=policy,
        task_queue=f"autorepair-{suffix}",
        bmc_queue=f"bmc-{suffix}",
        gpu_nodes=20,
    )
    ledger_acts = LedgerActivities(ledger_pool)
    async with (
        Worker(
            ts_env.client,
            task_queue=h.task_queue,
            workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
            activities=[*ledger_acts.all(), *fake.scheduler_activities(), *h.policy_activities(),
                        *GuardReplyActivities(ts_env.client).all()],
            # the recording interpreter check (issue 26 item 5): a call the machine did
            # not command fails the workflow, and the test
            interceptors=[FidelityInterceptor()],
            workflow_failure_exception_types=[FidelityViolation],
        ),
        Worker(ts_env.client, task_queue=h.bmc_queue, activities=fake.machine_activities()),
    ):
        try:
            yield h
        finally:
            await terminate_all(h)


async def terminate_all(h: Harness) -> None:
    """Terminate every workflow this test left running (the session server is shared,
    and time skipping is global: leftovers would hold time for the next test)."""
    # nodes (which start repairs), then repairs (which start a guard when it is gone),
    # then the guard: a workflow left running without its worker holds the session's
    # time skipping for good
    # A repair a node started moments ago may not have written its ledger row yet: its
    # node's pending children name it.
    ids = [workflow_id_node(h.cluster.cluster, n) for n in h.cluster.nodes]
    children: list[str] = []
    for wid in ids:
        try:
            raw = (await h.client.get_workflow_handle(wid).describe()).raw_description
        except RPCError:
            continue
        children += [c.workflow_id for c in raw.pending_children]
    ids += children
    ids += [
        r["workflow_id"]
        for r in await h.ledger.list_repairs(cluster=h.cluster.cluster)
        if r["workflow_id"]
    ]
    ids += [workflow_id_guard(h.cluster.cluster)]
    for wid in dict.fromkeys([*ids, workflow_id_guard(h.cluster.cluster)]):
        handle = h.client.get_workflow_handle(wid)
        # between tasks where possible: the time-skipping server stops skipping time for
        # the rest of the session when a workflow is cut mid-task
        for _ in range(100):
            try:
                raw = (await handle.describe()).raw_description
            except RPCError:
                break
            if not raw.pending_activities and not raw.HasField("pending_workflow_task"):
                break
            await asyncio.sleep(0.05)
        try:
            await handle.terminate("test finished")
        except RPCError:
            pass  # not running


def make_alert(cluster: str, node: str, n: int | str = 1, **kw: Any) -> Alert:
    """An alert with sensible defaults (an actionable Xid 79 → power cycle)."""
    from datetime import UTC, datetime

    base: dict[str, Any] = dict(
        alert_id=f"{cluster}/{node}/{n}",
        cluster=cluster,
        node=node,
        kind="xid",
        code=79,
        gpu="0000:3b:00.0",
        severity="critical",
        actionable=True,
        action="power_cycle",
        summary="Xid 79: GPU has fallen off the bus",
        evidence_text="NVRM: Xid 79",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    base.update(kw)
    return Alert.model_validate(base)
