"""Machine power through the BMC's Redfish API (``sushy`` client): reboot and power cycle.

Activities (registered on the BMC task queue, ``temporal.bmc_task_queue``, whose worker
limits starts per second to ``temporal.bmc_rate_per_s``):

- ``reboot_machine``: ``GracefulRestart`` when the BMC offers it, else ``ForceRestart``
  (``On`` when the host is off); after ``GracefulRestart`` the restart must show (power
  ``Off`` or a new boot identity) within ``RESTART_SEEN_S``, else ``ForceRestart`` once
  (a hung OS never acts on the graceful request; the window counts from the send, also
  for a retry: ``MachineActionInput.sent_at``); then wait for power ``On``;
- ``power_cycle_machine``: ``ForceOff`` → wait ``Off`` → ``On`` → wait ``On``. Guarded by the
  boot identity recorded before acting (``boot_id_before`` / ``boot_time_before``: agent
  boot id, Kubernetes ``status.nodeInfo.bootID`` or Slurm ``BootTime/SlurmdStartTime``): when
  the scheduler already reports a different boot, the host came back and nothing is done
  (docs/design.md §5: a retry never cycles a host that already came back). A retry after a crash
  between off and on finds the host ``Off`` with the old boot identity and only powers it
  on; the phase reached is reported in the activity's
  heartbeat details, its failure details and its result, and the workflow carries it
  into the next try (``MachineActionInput.resume_phase``), so a retry after ``On`` was
  sent never cycles again (issue 26, I16);

``reset_gpu`` is not here: Redfish resets hosts, not single GPUs; the GPU reset runs on
the node (:mod:`activities.reset`).

System selection: the node's ``bmc.system_id`` (an id such as ``System.Embedded.1`` or a
path under ``/redfish/v1/Systems``), else the only member of ``/redfish/v1/Systems``.
Real BMCs name their system ``System.Embedded.1`` (Dell iDRAC), ``1`` (HPE iLO,
Supermicro) or ``Self`` (OpenBMC), never after the host, so the host name is never used to
pick one; a BMC listing several systems (a chassis manager, an emulator) needs
``system_id``, and the error lists its members.

Credentials come from :mod:`activities.secrets` inside the worker; error messages name
the BMC address and user, never the password. Error classes: 401/403 → ``ERR_AUTH``,
unknown system → ``ERR_UNKNOWN_NODE``, reset type refused → ``ERR_UNSUPPORTED`` (all
non-retryable); connection errors and 5xx → retryable ``BmcUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import sushy
from sushy import exceptions as sushy_exc
from sushy.resources.system.system import System
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.secrets import CredentialsError, load_bmc_credentials
from workflows.activity_api import (
    ACT,
    ERR_AUTH,
    ERR_UNKNOWN_NODE,
    ERR_UNSUPPORTED,
    SENT_AT_DETAIL,
    ActionResult,
    MachineActionInput,
    NodeHealth,
    detail_time,
    permanent,
    phased_failure,
)
from workflows.config import AutorepairConfig, BmcConfig, NodeConfig
from workflows.lifecycle.machine_action import PHASES
from workflows.models import Action
from workflows.policy.bmc import BmcProbe

log = logging.getLogger(__name__)

#: Longest wait for a power state change, seconds (real BMCs: seconds to a few minutes;
#: the dev stack's sushy-tools fake driver applies changes 2–11 s after the request).
POWER_WAIT_S = 600.0
#: Poll interval while waiting for a power state, seconds.
POWER_POLL_S = 1.0
#: Longest wait, on a retry after a ``ForceOff`` whose answer was lost (phase
#: ``off_requested``), for the host to read other than ``On`` before ``ForceOff`` is sent
#: again, seconds. A BMC applies an accepted ``ForceOff`` within seconds (the dev stack's
#: sushy-tools fake driver: 1–11 s; BMCs cut power at once, the state read may lag by a
#: poll of their own); 120 s is ten times the emulator's worst. A host On for that long
#: never got the first one, and the one sent then is the first to reach it (I16).
FORCE_OFF_LANDED_S = 120.0
#: Longest wait, after ``GracefulRestart``, for the host to show that it restarts, seconds:
#: its power read ``Off`` / ``PoweringOff``, or the scheduler reporting a boot identity
#: other than the one recorded before acting (:meth:`NodeHealth.rebooted_since`). An OS
#: that acts on the request stops its services within systemd's ``DefaultTimeoutStopSec``
#: (90 s per unit, systemd-system.conf(5)), and a GPU server's firmware POST and boot take
#: about 5–10 min, after which the kubelet / slurmd reports the new boot: 15 min covers
#: both (and equals ``policy.rails.action_retry_max_s``'s default). A hung OS shows
#: neither: the call ends in phase ``restart_unseen`` and its retry sends ``ForceRestart``,
#: once (phase ``force_restart_sent``). With the ``On`` wait after it (``POWER_WAIT_S``)
#: a try stays well inside the workflow's 30 min start-to-close timeout. The window counts
#: from the send (``sent_at``, carried into every retry), never afresh per try.
RESTART_SEEN_S = 900.0
#: Redfish HTTP timeout per request, seconds.
BMC_TIMEOUT_S = 30

T = TypeVar("T")

#: ``(cluster, node) -> NodeHealth``: the scheduler's view, used for the boot-identity guard.
HealthReader = Callable[[str, str], Awaitable[NodeHealth]]


class BmcUnavailable(RuntimeError):
    """The BMC could not be reached or answered 5xx (retryable)."""


class RestartNotSeen(RuntimeError):
    """A reboot's ``GracefulRestart`` showed no restart within :data:`RESTART_SEEN_S`
    (retryable, phase ``restart_unseen``): the retry sends ``ForceRestart``."""


def heartbeat(details: dict[str, Any]) -> None:
    """``activity.heartbeat`` inside an activity, nothing outside."""
    if activity.in_activity():
        activity.heartbeat(details)


def resume_from(inp: MachineActionInput, phases: tuple[str, ...]) -> str:
    """The phase to resume from: the further of ``inp.resume_phase`` and the last
    heartbeat of an earlier try of this activity; raises a permanent
    ``ERR_UNSUPPORTED`` naming the field when ``inp.resume_phase`` is not one of
    ``phases``."""
    if inp.resume_phase not in phases:
        raise permanent(ERR_UNSUPPORTED, f"resume_phase: {inp.resume_phase!r} is not one of "
                        f"{', '.join(phases)}")
    beat = last_phase()
    if beat in phases and phases.index(beat) > phases.index(inp.resume_phase):
        return beat
    return inp.resume_phase


def last_sent_at() -> datetime | None:
    """The ``sent_at`` (UTC) of the last heartbeat of a previous attempt of this activity
    that has one (:data:`workflows.activity_api.SENT_AT_DETAIL`)."""
    if not activity.in_activity():
        return None
    return detail_time(activity.info().heartbeat_details)


def beat(phase: str, sent_at: datetime | None, **extra: str) -> dict[str, Any]:
    """Heartbeat details ``{"phase", "sent_at"?, **extra}``: ``sent_at`` (ISO 8601 UTC)
    when the attempt's restart request has gone out."""
    d: dict[str, Any] = {"phase": phase}
    if sent_at is not None:
        d[SENT_AT_DETAIL] = sent_at.isoformat()
    return {**d, **extra}


def window_left(sent_at: datetime, window_s: float) -> float:
    """Seconds left of a ``window_s``-second window opened at ``sent_at`` (UTC), read on
    this worker's UTC clock: ``window_s`` at most (a ``sent_at`` ahead of this clock, a
    skew between workers, counts as now), 0 at least."""
    elapsed = (datetime.now(UTC) - sent_at).total_seconds()
    return max(0.0, window_s - max(0.0, elapsed))


class Refused(Exception):
    """A reset request the BMC answered with a refusal (:func:`possibly_sent`): nothing
    was sent. ``err`` is the refusal (an ``ApplicationError``: auth, unsupported, unknown
    system), ``phase`` the phase the activity reports for it (the one before the send)."""

    def __init__(self, err: ApplicationError, phase: str) -> None:
        super().__init__(err.message)
        self.err = err
        self.phase = phase


async def possibly_sent(m: RedfishMachine, reset_type: str, sent: str, refused: str,
                        sent_at: datetime | None = None) -> None:
    """The "possibly sent" step of a disruptive reset (ForceOff, its resend, the restart,
    ForceRestart, the On of a reboot of a host found Off). The caller has set its phase to
    ``sent``; it is heartbeated (with ``sent_at``, :func:`beat`) before the request goes
    out, because the answer may be lost with the request landed: from here on a retry
    counts the command as sent and never sends it blind (I16). Then ``reset_type`` is
    sent. A refusal the BMC answered (an ``ApplicationError``) sent nothing: raises
    :class:`Refused` with phase ``refused``, which the activity reports in its failure
    (:func:`workflows.activity_api.phased_failure`); any other failure (connection,
    5xx: the answer lost) leaves the phase at ``sent``."""
    heartbeat(beat(sent, sent_at))
    try:
        await m.reset(reset_type)
    except ApplicationError as e:
        raise Refused(e, refused) from None


def last_phase() -> str | None:
    """The ``phase`` of the last heartbeat of a previous attempt of this activity."""
    if not activity.in_activity():
        return None
    det = activity.info().heartbeat_details
    if det and isinstance(det[-1], dict):
        phase = det[-1].get("phase")
        return str(phase) if phase is not None else None
    return None


class RedfishMachine:
    """One machine behind its BMC; every call runs the blocking ``sushy`` client in a thread."""

    def __init__(self, config: AutorepairConfig, cluster: str, node: str, machine: str) -> None:
        self.cluster = cluster
        self.node = node
        self.machine = machine
        ncfg = _node_config(config, cluster, node, machine)
        if ncfg.bmc is None:
            raise permanent(
                ERR_UNSUPPORTED,
                f"clusters[{cluster}].nodes[{ncfg.name}].bmc: no BMC configured for machine "
                f"{machine}",
            )
        self.bmc: BmcConfig = ncfg.bmc
        self.address = self.bmc.address.rstrip("/")
        try:
            self._creds = load_bmc_credentials(config.secrets, self.address)
        except CredentialsError as e:
            raise permanent(ERR_AUTH, str(e)) from None
        self._conn: sushy.Sushy | None = None

    def _where(self) -> str:
        return f"BMC {self.address} (machine {self.machine})"

    def _classify(self, e: Exception) -> Exception:
        if isinstance(e, sushy_exc.AccessError):
            return permanent(
                ERR_AUTH,
                f"{self._where()} rejected the credentials of user {self._creds.username!r} "
                f"(HTTP {getattr(e, 'status_code', '401')})",
            )
        if isinstance(e, sushy_exc.ResourceNotFoundError):
            return permanent(
                ERR_UNKNOWN_NODE,
                f"{self._where()}: no Redfish system {self.bmc.system_id or self.machine!r}",
            )
        if isinstance(e, sushy_exc.InvalidParameterValueError | sushy_exc.BadRequestError):
            return permanent(
                ERR_UNSUPPORTED,
                f"{self._where()} refused the request: {type(e).__name__}",
            )
        if isinstance(e, ApplicationError):
            return e
        return BmcUnavailable(f"{self._where()} unavailable: {type(e).__name__}")

    def _connect(self) -> sushy.Sushy:
        if self._conn is None:
            auth = sushy.auth.BasicAuth(
                username=self._creds.username, password=self._creds.password.get_secret_value()
            )
            self._conn = sushy.Sushy(
                self.address + "/redfish/v1", auth=auth, verify=self.bmc.verify_tls,
            )
        return self._conn

    def _system_sync(self) -> System:
        """The system to act on (see module docstring). Raises non-retryable
        ``ApplicationError`` (``ERR_UNKNOWN_NODE``) naming the members when there is no
        such system or no single one; sushy errors otherwise."""
        conn = self._connect()
        if self.bmc.system_id:
            sid = self.bmc.system_id
            path = sid if sid.startswith("/") else f"/redfish/v1/Systems/{sid}"
            try:
                return conn.get_system(path)
            except sushy_exc.ResourceNotFoundError:
                raise self._no_system(
                    f"bmc.system_id {sid!r} is not a system of this BMC",
                    conn.get_system_collection().members_identities) from None
        members = conn.get_system_collection().members_identities
        if len(members) == 1:
            return conn.get_system(members[0])
        raise self._no_system(
            "bmc.system_id is not set and the BMC does not list exactly one system", members)

    def _no_system(self, why: str, members: Any) -> ApplicationError:
        listed = ", ".join(sorted(str(m) for m in members)[:20]) or "none"
        return permanent(
            ERR_UNKNOWN_NODE,
            f"{self._where()}: {why}; /redfish/v1/Systems lists: {listed} "
            f"(set bmc.system_id of node {self.node} to one of them)",
        )

    async def call(self, fn: Callable[[System], T]) -> T:
        """Run ``fn(system)`` in a thread with errors classified (auth/unknown/unsupported)."""

        def run() -> T:
            return fn(self._system_sync())

        try:
            return await asyncio.to_thread(run)
        except Exception as e:
            raise self._classify(e) from None

    async def power_state(self) -> str:
        """Current power state (``On``/``Off``/``PoweringOn``/``PoweringOff``), refreshed."""
        ps = await self.call(lambda s: s.power_state)
        return str(getattr(ps, "value", ps))

    async def reset(self, reset_type: str) -> None:
        """POST ``ComputerSystem.Reset`` with ``reset_type`` (a ``sushy.RESET_*`` value)."""
        await self.call(lambda s: s.reset_system(reset_type))

    async def allowed_resets(self) -> set[str]:
        """Reset types the BMC lists as allowed."""
        return set(await self.call(lambda s: s.get_allowed_reset_system_values()))

    async def leaves_on(self, limit_s: float, phase: str,
                        came_back: Callable[[], Awaitable[str | None]] | None = None,
                        ) -> tuple[str | None, str | None]:
        """Watch the power for up to ``limit_s`` seconds (polled every
        :data:`POWER_POLL_S` seconds; heartbeats ``{"phase", "power"}``): ``(state,
        None)`` with the first power state other than ``On`` (``Off``, ``PoweringOff``)
        read; ``(None, why)`` when, at an ``On`` read, ``came_back()`` gives a reason
        (a new boot identity: the host went off and came back before this run looked);
        ``(None, None)`` when it read ``On`` throughout."""
        deadline = time.monotonic() + limit_s
        while True:
            st = await self.power_state()
            heartbeat({"phase": phase, "power": st})
            if st.lower() != "on":
                return st, None
            if came_back is not None and (why := await came_back()):
                return None, why
            if time.monotonic() >= deadline:
                return None, None
            await asyncio.sleep(POWER_POLL_S)

    async def wait_off(self, phase: str, left: str | None = None,
                       came_back: Callable[[], Awaitable[str | None]] | None = None,
                       limit_s: float | None = None) -> str | None:
        """Poll (every :data:`POWER_POLL_S` seconds, heartbeats ``{"phase", "power"}``)
        until the power reads ``Off`` → ``None``, or until the host shows that it cycled
        already → what showed it, in words:

        - power ``On`` read after a state other than ``On`` (``PoweringOff``,
          ``PoweringOn``) with no ``Off`` read in between (the host was seen leaving On
          and is back; some BMCs report ``PoweringOff`` then ``On`` within a poll).
          ``left``: such a state the caller read already (:meth:`leaves_on`);
        - power ``On`` and ``came_back()`` (asked at each such read) giving a reason, e.g.
          a new boot identity (:func:`boot_changed`): the host went off and came back
          before this run looked (between tries).

        Raises ``BmcUnavailable`` (retryable) after ``limit_s`` seconds (default
        :data:`POWER_WAIT_S`, read at the call)."""
        limit_s = POWER_WAIT_S if limit_s is None else limit_s
        deadline = time.monotonic() + limit_s
        while True:
            st = await self.power_state()
            heartbeat({"phase": phase, "power": st})
            if st.lower() == "off":
                return None
            if st.lower() == "on" and left is not None:
                return f"power read {left}, then On again without an Off read"
            if st.lower() != "on":
                left = st
            elif came_back is not None and (why := await came_back()):
                return f"power On and the host came back ({why})"
            if time.monotonic() >= deadline:
                raise BmcUnavailable(f"{self._where()}: power still {st} after {limit_s:.0f}s")
            await asyncio.sleep(POWER_POLL_S)

    async def wait_power(self, want: str, phase: str, limit_s: float = POWER_WAIT_S) -> None:
        """Poll until power is ``want``; heartbeats ``{"phase", "power"}``.

        Raises ``BmcUnavailable`` (retryable) after ``limit_s``.
        """
        deadline = time.monotonic() + limit_s
        while True:
            st = await self.power_state()
            heartbeat({"phase": phase, "power": st})
            if st.lower() == want.lower():
                return
            if time.monotonic() >= deadline:
                raise BmcUnavailable(f"{self._where()}: power still {st} after {limit_s:.0f}s")
            await asyncio.sleep(POWER_POLL_S)


def _node_config(config: AutorepairConfig, cluster: str, node: str, machine: str) -> NodeConfig:
    try:
        c = config.cluster(cluster)
    except KeyError:
        raise permanent(ERR_UNKNOWN_NODE, f"clusters: no cluster named {cluster!r}") from None
    for n in c.nodes:
        if n.machine == machine or n.name == machine:
            return n
    for n in c.nodes:
        if n.name == node and n.machine and n.machine != machine:
            # the node runs on another machine now (a migrate's spare): its own entry is
            # the OLD machine's BMC, which must never be acted on in its place
            raise permanent(
                ERR_UNSUPPORTED,
                f"clusters[{cluster}].nodes: no entry (no BMC) for machine {machine!r}, "
                f"which node {node!r} now runs on (its entry is machine {n.machine!r}); "
                "nothing was touched",
            )
        if n.name == node:
            return n
    raise permanent(
        ERR_UNKNOWN_NODE,
        f"clusters[{cluster}].nodes: no node {node!r} / machine {machine!r}",
    )


async def boot_changed(
    health: HealthReader | None, cluster: str, node: str,
    boot_id_before: str | None, boot_time_before: datetime | None,
) -> str | None:
    """Why the host has already rebooted since the recorded identity, or ``None``.

    Compares the scheduler's current boot id / boot time with the values recorded before
    acting (:meth:`NodeHealth.rebooted_since`: a boot time must advance by more than
    ``BOOT_TIME_JITTER_S``). Unknown (no recorded identity, no reader, scheduler
    unreachable) → ``None``.
    """
    return (await boot_read(health, cluster, node, boot_id_before, boot_time_before))[1]


async def boot_read(
    health: HealthReader | None, cluster: str, node: str,
    boot_id_before: str | None, boot_time_before: datetime | None,
) -> tuple[bool, str | None]:
    """``(judged, why)``: ``judged`` when the scheduler gave a boot identity comparable with
    the recorded one (:meth:`NodeHealth.rebooted_since` not ``None``); ``why`` as
    :func:`boot_changed`. Not judged (no reader, no recorded identity, scheduler
    unreachable, no comparable identity in its answer) → ``(False, None)``."""
    if health is None or (boot_id_before is None and boot_time_before is None):
        return False, None
    try:
        h = await health(cluster, node)
    except Exception as e:  # the scheduler view is advisory here
        log.info("event=boot_identity_unavailable cluster=%s node=%s error=%s", cluster, node,
                 type(e).__name__)
        return False, None
    rebooted = h.rebooted_since(boot_id_before, boot_time_before)
    if not rebooted:
        return rebooted is not None, None
    if boot_id_before is not None and h.boot_id is not None:
        return True, f"boot id changed {boot_id_before} -> {h.boot_id}"
    assert boot_time_before is not None and h.boot_time is not None
    return True, (f"boot time advanced {boot_time_before.isoformat()} -> "
                  f"{h.boot_time.isoformat()}")


#: ``(cluster, node) -> machine | None``: the machine a migrate bound the node to (ledger).
BindingReader = Callable[[str, str], Awaitable[str | None]]


class PowerActivities:
    """``reboot_machine``, ``power_cycle_machine`` (BMC task queue).

    ``bindings`` (e.g. ``ProvisioningActivities.bound_machine``) makes the actions hit
    the machine a node was migrated to, even when the caller still names the node's
    configured machine.
    """

    def __init__(
        self, config: AutorepairConfig, health: HealthReader | None = None,
        bindings: BindingReader | None = None,
    ) -> None:
        self.config = config
        self.health = health
        self.bindings = bindings

    def machine(self, inp: MachineActionInput) -> RedfishMachine:
        """The BMC handle of ``inp.machine``."""
        return RedfishMachine(self.config, inp.cluster, inp.node, inp.machine)

    async def current(self, inp: MachineActionInput) -> MachineActionInput:
        """``inp`` with ``machine`` set to the node's bound machine when a migrate moved it."""
        if self.bindings is None:
            return inp
        bound = await self.bindings(inp.cluster, inp.node)
        if bound and bound != inp.machine:
            log.info("event=machine_rebound cluster=%s node=%s named=%s bound=%s", inp.cluster,
                     inp.node, inp.machine, bound)
            return inp.model_copy(update={"machine": bound})
        return inp

    @activity.defn(name=ACT.reboot_machine)
    async def reboot_machine(self, inp: MachineActionInput) -> ActionResult:
        """Restart the host in place; skipped when it already rebooted since ``*_before``.

        Phases (``workflows.lifecycle.machine_action.PHASES``): ``not_started`` →
        ``restart_sent`` → (``restart_unseen`` → ``force_restart_sent``) →
        ``restart_seen`` → ``booted``, resumed from ``inp.resume_phase`` (or the last
        heartbeat of an earlier try): each command is sent at most once per attempt; a
        restart request whose answer was lost counts as sent (``restart_sent``: the retry
        waits for it to show; a refusal the BMC answered reports ``not_started`` and no
        ``sent_at``: nothing went out). After
        ``GracefulRestart`` the host must show that it restarts within
        :data:`RESTART_SEEN_S` seconds of the send (power ``Off``, or a new boot identity
        in the scheduler). The window is absolute: the try that sends the restart records
        when (``sent_at``, UTC, in its heartbeats and failure details), the workflow
        carries it (``inp.sent_at``, else the last heartbeat of an earlier try) and a
        retry resumed at ``restart_sent`` waits only what is left of it. A hung OS
        accepts the request through its BMC and never restarts, so the call then fails
        (retryable, :class:`RestartNotSeen`) in phase
        ``restart_unseen``, and the retry resumed there sends ``ForceRestart``, once, as
        its own phase (a reboot action's purpose is the reboot; the ladder's next rung is
        for a reboot that did not fix the fault). The ``ForceRestart`` is never sent by
        the call that waited: the workflow learns of a cancel only when a call returns
        and runs no retry after one (I19). Without a boot identity to compare (no recorded
        one, no scheduler reader, or none the scheduler could give during the wait) only
        the power can show the restart, which a warm restart may never do: the activity
        then waits for power ``On`` as before and says the restart was not observed. A
        failure carries the phase reached (:func:`workflows.activity_api.phased_failure`)."""
        phase = resume_from(inp, PHASES[Action.reboot])
        # when the restart request went out (UTC): carried by the workflow, else the
        # last heartbeat of an earlier try; a retry's RESTART_SEEN_S window counts from it
        sent_at = inp.sent_at or last_sent_at()
        try:
            why = await boot_changed(self.health, inp.cluster, inp.node, inp.boot_id_before,
                                     inp.boot_time_before)
            if why:
                return ActionResult(done=True, skipped_reason=f"host already rebooted: {why}",
                                    phase="booted")
            inp = await self.current(inp)
            m = self.machine(inp)
            steps: list[str] = []
            if phase == "not_started":
                if (await m.power_state()).lower() == "off":
                    # nothing to observe: On is the restart. Possibly sent from here on
                    # (its answer may be lost): a retry only waits for power On, never
                    # restarts the host it powered on
                    phase = "restart_seen"
                    await possibly_sent(m, sushy.RESET_ON, phase, refused="not_started")
                    steps.append("host was off: powered on")
                else:
                    allowed = await m.allowed_resets()
                    graceful = sushy.RESET_GRACEFUL_RESTART in allowed
                    kind = (sushy.RESET_GRACEFUL_RESTART if graceful
                            else sushy.RESET_FORCE_RESTART)
                    # the restart possibly sent from here on (its answer may be lost): a
                    # retry resumes waiting for it to show, never sends it again blind,
                    # and only for what is left of the window opened now
                    phase = "restart_sent"
                    sent_at = datetime.now(UTC)
                    try:
                        await possibly_sent(m, kind, phase, refused="not_started",
                                            sent_at=sent_at)
                    except Refused:
                        # the BMC answered with a refusal: no restart went out, so there
                        # is no send time to report (the failure says not_started only)
                        sent_at = None
                        raise
                    steps.append(f"{kind.value} sent")
                    phase = "restart_sent" if graceful else "force_restart_sent"
                heartbeat(beat(phase, sent_at))
                log.info("event=reboot_sent cluster=%s node=%s machine=%s repair=%s key=%s "
                         "steps=%s", inp.cluster, inp.node, inp.machine, inp.repair_id,
                         inp.idempotency_key, "/".join(steps))
            else:
                steps.append(f"resumed at {phase}: restart already requested by an earlier "
                             "try of this attempt")
                if phase == "restart_sent" and sent_at is None:
                    # no try reported when it went out (a history from before sent_at was
                    # carried): the window counts from now, and from now on is carried
                    sent_at = datetime.now(UTC)
                    steps.append("its send time was not reported: the restart window "
                                 "counts from this try")
                elif phase == "restart_sent" and sent_at is not None:
                    steps.append(f"sent at {sent_at.isoformat()}: "
                                 f"{window_left(sent_at, RESTART_SEEN_S):.0f} s of the "
                                 f"{RESTART_SEEN_S:g} s window left")
                heartbeat(beat(phase, sent_at))
            if phase == "restart_sent":
                assert sent_at is not None  # set above whenever phase is restart_sent
                observable = self.health is not None and (
                    inp.boot_id_before is not None or inp.boot_time_before is not None)
                seen, judged = await self._restart_seen(m, inp, observable, sent_at)
                if seen is None and observable and not judged:
                    # the scheduler never gave a comparable boot identity: as without one
                    # (a warm restart may keep the power On), never a blind ForceRestart
                    observable = False
                    steps.append("boot identity could not be read within "
                                 f"{RESTART_SEEN_S:g} s")
                if seen is not None and seen.startswith("boot"):
                    steps.append(f"restart seen ({seen})")
                    return ActionResult(done=True, detail="; ".join(steps), phase="booted")
                if seen is not None:
                    steps.append(f"restart seen ({seen})")
                    phase = "restart_seen"
                    heartbeat(beat(phase, sent_at))
                elif not observable:
                    steps.append("restart not observed (no boot identity to compare): "
                                 "waiting for power On")
                    phase = "restart_seen"
                else:
                    # the OS did not act on the request (hung). The ForceRestart is the
                    # retry's (resumed at restart_unseen), never this call's: the workflow
                    # hears of a cancel only when a call returns, and runs no retry once
                    # a stop came (I19)
                    phase = "restart_unseen"
                    heartbeat(beat(phase, sent_at))
                    raise RestartNotSeen(
                        f"no restart of {inp.node} seen within {RESTART_SEEN_S:g} s of "
                        "GracefulRestart (power stayed On, boot identity unchanged): "
                        "ForceRestart follows on the retry")
            if phase == "restart_unseen":
                st = await m.power_state()
                if st.lower() in ("off", "poweringoff"):
                    steps.append(f"restart seen late (power {st}): ForceRestart not sent")
                    phase = "restart_seen"
                else:
                    # possibly sent from here on (its answer may be lost, and a forced
                    # restart need not show Off): a retry only waits for power On
                    phase = "force_restart_sent"
                    await possibly_sent(m, sushy.RESET_FORCE_RESTART, phase,
                                        refused="restart_unseen")
                    steps.append(f"no restart seen within {RESTART_SEEN_S:g} s of "
                                 "GracefulRestart (power stayed On, boot identity "
                                 "unchanged): ForceRestart sent")
                    log.info("event=reboot_forced cluster=%s node=%s machine=%s repair=%s "
                             "key=%s", inp.cluster, inp.node, inp.machine, inp.repair_id,
                             inp.idempotency_key)
                heartbeat({"phase": phase})
            await m.wait_power("On", phase)
        except Refused as r:
            raise phased_failure(r.err, r.phase, sent_at) from None
        except Exception as e:
            raise phased_failure(e, phase, sent_at) from None
        return ActionResult(done=True, detail="; ".join(steps), phase="booted")

    async def _restart_seen(self, m: RedfishMachine, inp: MachineActionInput,
                            observable: bool, sent_at: datetime) -> tuple[str | None, bool]:
        """Poll every :data:`POWER_POLL_S` seconds, until :data:`RESTART_SEEN_S` seconds
        after ``sent_at`` (UTC, when the restart request went out: a retry waits only
        what is left of the window, :func:`window_left`; the host is looked at once even
        when none is), until the host shows that it restarts: its power read ``Off`` /
        ``PoweringOff`` (``"power Off"``) or a new boot identity (``"boot id changed …"``
        / ``"boot time advanced …"``). Not ``observable`` (no boot identity to compare):
        the power is read once. Heartbeats phase ``restart_sent`` with ``sent_at``.
        Returns ``(seen, judged)``: ``seen`` None when nothing showed; ``judged`` whether
        the scheduler gave a comparable boot identity at least once (:func:`boot_read`):
        never judged, an unchanged identity proves nothing."""
        # this worker's monotonic clock times the wait; the absolute send time only
        # decides how long it may be
        deadline = time.monotonic() + window_left(sent_at, RESTART_SEEN_S)
        judged = False
        while True:
            st = await m.power_state()
            heartbeat(beat("restart_sent", sent_at, power=st))
            if st.lower() in ("off", "poweringoff"):
                return f"power {st}", judged
            if not observable:
                # a warm restart may keep the power On: nothing else shows it
                return None, judged
            read, why = await boot_read(self.health, inp.cluster, inp.node,
                                        inp.boot_id_before, inp.boot_time_before)
            judged = judged or read
            if why:
                return why, judged
            if time.monotonic() >= deadline:
                return None, judged
            await asyncio.sleep(POWER_POLL_S)

    @activity.defn(name=ACT.power_cycle_machine)
    async def power_cycle_machine(self, inp: MachineActionInput) -> ActionResult:
        """ForceOff → wait Off → On → wait On, at most once per attempt (I16).

        Phases: ``not_started`` → ``off_requested`` → ``off_sent`` → ``off_seen`` →
        ``on_sent`` → ``booted``, resumed from ``inp.resume_phase`` (the workflow carries
        the phase the earlier try reached) or the last heartbeat of an earlier try,
        whichever is further: a retry after ``On`` only waits for the host, never sends
        ForceOff again, and one resumed at ``off_seen`` that finds the host On already
        does not send ``On`` again. ``off_requested`` is reported before ForceOff goes
        out (its answer may be lost, the request landed or not): a retry from there waits
        up to :data:`FORCE_OFF_LANDED_S` for the power to leave ``On`` and sends ForceOff
        only when it never did — the first never reached the host, so the one sent then is
        the only one that does (I16). Power read ``Off`` by the run and ``On`` again after
        it (the ForceOff landed and the host came back by itself: the BMC's power-restore
        policy, a person at the button) is the cycle: neither ForceOff nor On is sent
        again, the run goes on as after ``On`` (phase ``on_sent``) and says what it read.
        So is power read leaving ``On`` (``PoweringOff``) and then ``On`` with no ``Off``
        read in between (:meth:`RedfishMachine.wait_off`: some BMCs report
        ``PoweringOff`` then ``On`` within a poll): the host was seen going off, so the
        run does not wait :data:`POWER_WAIT_S` for an Off that already passed. A host
        that went Off and came back On before the run looked (between tries: a retry
        resumed at ``off_sent``) reads ``On``, as one the accepted ForceOff has not reached
        yet, or (a BMC that answered and never acted) never will: the power cannot tell
        them apart, nor can the time since the send (the earlier try may have watched it
        stay On all along). The boot identity can: the wait for Off asks it at every
        ``On`` read, and a new one (the kubelet / slurmd reported the new boot) is the
        cycle, as above; so does the retry resumed at ``off_requested`` while it watches
        the power leave ``On``: a new boot read there is the cycle, and ForceOff is not
        sent. Without one the run waits for Off as before (the safe side: a
        host taken as cycled that never was would be verified as if the cycle had run,
        on readiness alone where the scheduler gives no boot identity).
        A ForceOff the BMC refused (auth, unsupported: it answered) reports
        ``not_started``. ``inp.make_safe`` (after a cancel) never sends
        ForceOff: a host that stayed On is safe. Guarded too by the boot identity
        (docs/design.md §5) and by a host found ``Off`` (resumes at On). A failure carries
        the phase reached (:func:`workflows.activity_api.phased_failure`)."""
        phase = resume_from(inp, PHASES[Action.power_cycle])
        steps: list[str] = []
        off_read = False  # this run read the power Off after the ForceOff (or found it Off)
        # this run read the host leave On (PoweringOff) and come back On without an Off
        # read: the cycle happened (what it read, in words); "" otherwise
        cycled = ""
        left: str | None = None  # a state other than On read at off_requested
        try:
            why = await boot_changed(self.health, inp.cluster, inp.node, inp.boot_id_before,
                                     inp.boot_time_before)
            if why:
                return ActionResult(done=True, skipped_reason=f"host already came back: {why}",
                                    phase="booted")
            inp = await self.current(inp)
            m = self.machine(inp)

            # a host that went off and came back before this run looked (between tries)
            # shows nothing in its power (On, as one the ForceOff never reached): only a
            # new boot identity tells them apart, asked at every On read of the waits
            # below. ForceOff is never sent to such a host (I16)
            async def came_back() -> str | None:
                return await boot_changed(self.health, inp.cluster, inp.node,
                                          inp.boot_id_before, inp.boot_time_before)

            if phase == "not_started":
                if inp.make_safe:
                    # nothing was sent in this attempt: the host's power is as it was
                    return ActionResult(done=True, phase="booted",
                                        detail="making safe: no ForceOff was sent, nothing "
                                        "to do")
                if (await m.power_state()).lower() == "off":
                    steps.append("found Off (cycle interrupted after off): resuming")
                else:
                    # ForceOff possibly sent from here on: its answer may be lost
                    phase = "off_requested"
                    await possibly_sent(m, sushy.RESET_FORCE_OFF, phase, refused="not_started")
                    steps.append("ForceOff")
                phase = "off_sent"
                heartbeat({"phase": phase})
            elif phase == "off_requested":
                left, back = await m.leaves_on(FORCE_OFF_LANDED_S, phase, came_back)
                if left:
                    steps.append("resumed at off_requested: the earlier ForceOff landed "
                                 f"(power read {left}), not sent again")
                elif back:
                    # the earlier ForceOff landed and the host is back (a new boot
                    # reported while the power read On): the cycle happened
                    cycled = (f"resumed at off_requested: power On and the host came back "
                              f"({back}): the cycle happened, ForceOff and On not sent "
                              "again")
                elif inp.make_safe:
                    return ActionResult(done=True, phase="booted", nothing_landed=True,
                                        detail=(
                        f"making safe: power stayed On for {FORCE_OFF_LANDED_S:g} s, the "
                        "earlier ForceOff did not land; nothing sent"))
                else:
                    # the earlier one never reached the host: this one is possibly sent
                    # as it was (a refusal keeps off_requested, as before the resend)
                    await possibly_sent(m, sushy.RESET_FORCE_OFF, phase, refused=phase)
                    steps.append(f"resumed at off_requested: power stayed On for "
                                 f"{FORCE_OFF_LANDED_S:g} s, the earlier ForceOff did not "
                                 "land: ForceOff")
                phase = "off_sent"
                heartbeat({"phase": phase})
                if cycled:
                    phase = "off_seen"
                    heartbeat({"phase": phase})
                elif left is not None and left.lower() == "off":
                    # the Off was read already: waiting for it again would miss a host
                    # that came back On by itself meanwhile (power-restore policy, the
                    # button) and wait out POWER_WAIT_S for an Off that never comes
                    phase = "off_seen"
                    heartbeat({"phase": phase})
                    off_read = True
            if phase == "off_sent":
                # ForceOff is never sent from here (I16)
                seen = await m.wait_off("off_sent", left, came_back)
                phase = "off_seen"
                heartbeat({"phase": phase})
                off_read = True
                if seen is not None:
                    cycled = f"{seen}: the cycle happened, ForceOff and On not sent again"
            if phase == "off_seen":
                # a retry after an On whose answer was lost finds the host On already: a
                # second On is refused by some BMCs (iDRAC: 409) and is never needed; nor
                # is one to a host read Off by this run that came back On by itself (the
                # ForceOff landed: the cycle happened)
                if (await m.power_state()).lower() != "on":
                    await m.reset(sushy.RESET_ON)
                    steps.append("On")
                elif cycled:
                    steps.append(cycled)
                elif off_read:
                    steps.append("power read Off, then On again by itself (power-restore "
                                 "policy or a person): the cycle happened, ForceOff and On "
                                 "not sent again")
                else:
                    steps.append("resumed at off_seen: host already On, On not resent")
                phase = "on_sent"
                heartbeat({"phase": phase})
            else:
                steps.append(f"resumed at {phase}: On already sent")
            log.info("event=power_cycle cluster=%s node=%s machine=%s repair=%s key=%s steps=%s",
                     inp.cluster, inp.node, inp.machine, inp.repair_id, inp.idempotency_key,
                     "/".join(steps))
            await m.wait_power("On", "on_sent")
        except Refused as r:
            raise phased_failure(r.err, r.phase) from None
        except Exception as e:
            raise phased_failure(e, phase) from None
        return ActionResult(done=True, detail="; ".join(steps), phase="booted")

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.reboot_machine, self.power_cycle_machine]


def redfish_probe(config: AutorepairConfig, bindings: BindingReader | None = None
                  ) -> BmcProbe:
    """The BMC's view of a node's host, ``(cluster, node) -> {"power_state", "state",
    "health"}`` (Redfish ``ComputerSystem``: ``PowerState``, ``Status.State``,
    ``Status.Health``), through :class:`RedfishMachine` on the machine the node runs on:
    its binding (``bindings``, the machine a migrate moved it to) else its configured
    machine — never the BMC of a machine it was moved off. The probe raises what the
    Redfish client raises (``ApplicationError`` for no BMC configured, credentials
    refused, unknown system; connection errors as they are)."""

    async def probe(cluster: str, node: str) -> dict[str, str | None]:
        ncfg = next((n for n in config.cluster(cluster).nodes if n.name == node), None)
        machine = (ncfg.machine if ncfg and ncfg.machine else node)
        bound = await bindings(cluster, node) if bindings is not None else None
        m = RedfishMachine(config, cluster, node, bound or machine)

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
