"""Provisioning behind one interface: ``reprovision``, ``migrate``, ``remove``.

Providers (``ClusterConfig.provisioner``):

- ``redfish`` — ``reprovision`` through Redfish virtual media: insert the clean image
  (``ClusterConfig.provision_image``) in the virtual CD, one-time boot override to CD,
  restart (or power on), wait for power ``On``; the image stays inserted for the
  installer the host is about to boot (power On is the start of POST: ejecting then
  left the one-time CD boot nothing to read) and is replaced by the next reprovision;
  the override is one-time, so later boots go to the disk. The phase reached
  (``workflows.lifecycle.machine_action.PHASES``: ``provision_started`` from the moment
  the restart request goes out — possibly sent, since its answer may be lost; only a
  refusal the BMC answered puts it back) is heartbeated and carried by every failure
  (:func:`workflows.activity_api.phased_failure`); a retry resumes from
  ``MachineActionInput.resume_phase`` (which the repair carries) or the last heartbeat,
  so one attempt never restarts twice (I16), and a failure after the restart counts as
  an attempt (I22). ``migrate`` reports ``started`` (bound) and ``restart_sent`` (the new
  machine's restart requested) the same way. A restart that never landed is not sent a
  second time blind: the repair's rejoin check wants a new boot identity after either.
- ``webhook`` — for platforms with their own control plane: ``POST {provision_webhook}``
  with ``{"action", "cluster", "node", "machine", "repair_id", "image"}`` and the header
  ``Idempotency-Key: <action>/<repair_id>``; the answer ``{"id", "status"}`` is polled at
  ``GET {provision_webhook}/{id}`` until ``status`` is ``succeeded`` (result fields
  ``new_machine``, ``ticket_id`` read when present) or ``failed`` (non-retryable
  ``ERR_ACTION_FAILED`` with the endpoint's ``detail``). 4xx → non-retryable; 5xx, 408,
  429, 409 (the key's first request still being processed) and network errors → retried.

``migrate`` and ``remove`` need a spare pool and a hardware-ticket system; with the
``webhook`` provider the operator's endpoint owns both. With ``redfish`` the ledger
(PostgreSQL) owns them:

- ``migrate``: takes the oldest machine of the cluster's hot-spare pool
  (:class:`activities.spares.MachineBindings` over ``spare_machines``; an empty pool is
  seeded from ``ClusterConfig.spares``), binds the node identity to it in
  ``node_bindings`` and records the move under the repair id, all in one transaction.
  Then it brings the new machine up as the node through its BMC: virtual-media
  reprovision with ``provision_image`` when set, else power on / restart. Returns
  ``MigrateResult(old_machine, new_machine)``; the RepairWorkflow hands the old machine
  to re-validation. No spare → non-retryable ``ERR_UNSUPPORTED`` naming the cluster
  (nothing touched).
- ``remove``: opens a hardware ticket in the ledger (``Ledger.open_ticket``, run id
  ``remove/<repair_id>``), marks the machine out of the pool (``removed_machines``; also
  leaves the spare pool) and returns the ticket id in ``ActionResult.ticket_id``.

Both recognise their own work by repair id on a retry (``machine_moves``). The node's
current machine is its binding when one exists (a node migrated earlier), else
``MachineActionInput.machine``. The ledger pool is passed in, or opened on first use
from ``ledger.dsn``; without either, migrate/remove raise non-retryable
``ERR_UNSUPPORTED`` naming ``ledger.dsn``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import sushy
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.ledger import Ledger, connect
from activities.power import (
    POWER_POLL_S,
    HealthReader,
    RedfishMachine,
    heartbeat,
    resume_from,
)
from activities.secrets import CredentialsError, redact_url, scrub_url, secret_url
from activities.spares import MachineBindings
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    ERR_AUTH,
    ERR_UNSUPPORTED,
    ActionResult,
    MachineActionInput,
    MigrateResult,
    TicketInput,
    permanent,
    phased_failure,
)
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig
from workflows.lifecycle.machine_action import PHASES
from workflows.models import Action, ValidationResult, Verdict

log = logging.getLogger(__name__)

#: Longest wait for a webhook operation, seconds (a reimage takes minutes; a rebuild on
#: new hardware up to an hour).
WEBHOOK_WAIT_S = 3600.0
#: Webhook HTTP timeout per request, seconds.
WEBHOOK_HTTP_TIMEOUT_S = 30.0


def _phase_marker(reached: list[str], phase: str) -> Callable[[bool], None]:
    """The callback that records ``phase`` in ``reached`` (heartbeated) when its command is
    about to go out (``True``: possibly sent from then on), and takes it back when the BMC
    answered a refusal (``False``: nothing sent; the phase before it is heartbeated)."""

    def mark(sent: bool = True) -> None:
        if sent:
            reached.append(phase)
        elif len(reached) > 1 and reached[-1] == phase:
            reached.pop()
        heartbeat({"phase": reached[-1]})

    return mark


async def _send_restart(m: RedfishMachine, kind: Any,
                        on_restart: Callable[[bool], None]) -> None:
    """Send ``kind`` (``On`` / ``ForceRestart``) once: ``on_restart(True)`` first (the
        restart is possibly sent from here on: an answer lost after the BMC applied it
        must not be followed by a second restart, I16), ``on_restart(False)`` when the BMC
    answered a refusal (``ApplicationError``: nothing sent), then re-raised."""
    on_restart(True)
    try:
        await m.reset(kind)
    except ApplicationError:
        on_restart(False)
        raise


def machine_config(c: ClusterConfig, machine: str) -> NodeConfig | None:
    """The node entry whose machine is ``machine`` (``machine`` unset: the node name)."""
    for n in c.nodes:
        if (n.machine or n.name) == machine:
            return n
    return None


class ProvisioningActivities:
    """``reprovision_machine``, ``migrate_node``, ``remove_machine`` (BMC task queue).

    ``pool``: the ledger's asyncpg pool (spare pool, bindings, tickets); when None it is
    opened on first use from ``config.ledger.dsn`` (close it with :meth:`close`).
    """

    def __init__(
        self, config: AutorepairConfig, health: HealthReader | None = None,
        pool: asyncpg.Pool | None = None,
    ) -> None:
        self.config = config
        self.health = health
        self._pool = pool
        self._own_pool = False
        self._pool_lock = asyncio.Lock()

    # ---- ledger ----------------------------------------------------------------------
    async def ledger_pool(self) -> asyncpg.Pool | None:
        """The ledger pool, opened from ``ledger.dsn`` on first use; None without a DSN."""
        if self._pool is None and self.config.ledger.dsn:
            async with self._pool_lock:
                if self._pool is None:
                    self._pool = await connect(
                        self.config.ledger.dsn, min_size=1,
                        max_size=max(2, min(self.config.ledger.max_pool, 4)),
                    )
                    self._own_pool = True
        return self._pool

    async def close(self) -> None:
        """Close the pool this instance opened itself (never a pool passed in)."""
        if self._own_pool and self._pool is not None:
            await self._pool.close()
            self._pool = None
            self._own_pool = False

    async def _bindings(self, what: str) -> MachineBindings:
        pool = await self.ledger_pool()
        if pool is None:
            raise permanent(
                ERR_UNSUPPORTED,
                f"ledger.dsn: not set; {what} with provisioner 'redfish' keeps the spare "
                "pool, node bindings and tickets in the ledger",
            )
        return MachineBindings(pool)

    async def bound_machine(self, cluster: str, node: str) -> str | None:
        """The machine a migrate bound ``node`` to, or None (no ledger / no binding)."""
        pool = await self.ledger_pool()
        if pool is None:
            return None
        return await MachineBindings(pool).machine_of(cluster, node)

    async def current(self, inp: MachineActionInput) -> MachineActionInput:
        """``inp`` with ``machine`` replaced by the node's bound machine, if any."""
        bound = await self.bound_machine(inp.cluster, inp.node)
        if bound and bound != inp.machine:
            return inp.model_copy(update={"machine": bound})
        return inp

    def _cluster(self, name: str) -> ClusterConfig:
        try:
            return self.config.cluster(name)
        except KeyError as e:
            raise permanent(ERR_UNSUPPORTED, str(e)) from None

    # ---- redfish virtual media ------------------------------------------------------
    async def _redfish_reprovision(
        self, c: ClusterConfig, inp: MachineActionInput, restarted: bool,
        on_restart: Callable[[bool], None],
    ) -> ActionResult:
        """Insert the clean image, boot once from it, restart, wait On; the image stays
        inserted for the installer (module docstring). With ``restarted`` (an earlier try
        of this attempt sent the restart) only the wait runs: the restart is sent once per
        attempt (I16). ``on_restart(True)`` runs right *before* the restart goes out (the
        caller records its phase: the restart is possibly sent from then on, since its
        answer may be lost), ``on_restart(False)`` when the BMC answered a refusal (nothing
        sent). A restart that never landed is not sent blind a second time: the repair's
        rejoin check wants a new boot identity after a reprovision."""
        if not c.provision_image:
            raise permanent(
                ERR_UNSUPPORTED,
                f"clusters[{c.name}].provision_image: not set; reprovision needs the clean "
                "image URL",
            )
        image = c.provision_image
        m = RedfishMachine(self.config, inp.cluster, inp.node, inp.machine)
        steps: list[str] = []

        def insert(s: Any) -> str:
            for vm in s.virtual_media.get_members():
                types = {getattr(t, "value", t) for t in vm.media_types}
                if not types & {"CD", "DVD"}:
                    continue
                if vm.inserted and vm.image == image:
                    return "image already inserted"
                if vm.inserted:
                    vm.eject_media()
                vm.insert_media(image, inserted=True, write_protected=True)
                return f"inserted {image} in {vm.identity}"
            raise permanent(
                ERR_UNSUPPORTED,
                f"BMC {m.address}: no virtual CD/DVD device on machine {inp.machine}",
            )

        def boot_once(s: Any) -> None:
            s.set_system_boot_options(
                target=sushy.BOOT_SOURCE_TARGET_CD, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE
            )

        if not restarted:
            steps.append(await m.call(insert))
            await m.call(boot_once)
            steps.append("boot override Cd once")
            kind = (sushy.RESET_ON if (await m.power_state()).lower() == "off"
                    else sushy.RESET_FORCE_RESTART)
            await _send_restart(m, kind, on_restart)
            steps.append("On" if kind == sushy.RESET_ON else "ForceRestart")
        else:
            steps.append("restart already sent by an earlier try of this attempt")
        await m.wait_power("On", "restart_sent")
        steps.append("image left inserted for the installer")
        return ActionResult(done=True, detail="; ".join(steps))

    # ---- webhook ---------------------------------------------------------------------
    async def _webhook(
        self, c: ClusterConfig, action: str, inp: MachineActionInput,
        on_accepted: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        try:
            configured = secret_url(c.provision_webhook, c.provision_webhook_env,
                                    c.provision_webhook_file,
                                    f"clusters[{c.name}].provision_webhook")
        except CredentialsError as e:
            raise permanent(ERR_UNSUPPORTED, str(e)) from None
        if not configured:
            raise permanent(
                ERR_UNSUPPORTED,
                f"clusters[{c.name}].provision_webhook: not set for provisioner 'webhook'",
            )
        url = configured.rstrip("/")
        shown = redact_url(url)  # the path/query may hold the endpoint's credential
        payload = {"action": action, "cluster": inp.cluster, "node": inp.node,
                   "machine": inp.machine, "repair_id": inp.repair_id,
                   "image": c.provision_image}
        key = f"{action}/{inp.repair_id}"

        def check(r: httpx.Response) -> dict[str, Any]:
            if r.status_code in (401, 403):
                raise permanent(
                    ERR_AUTH,
                    f"provisioning webhook {shown} refused access (HTTP {r.status_code})",
                )
            # 409: a request with this Idempotency-Key is still being processed (the
            # Idempotency-Key header draft, §2.6): retried like 408/429, never a refusal
            if 400 <= r.status_code < 500 and r.status_code not in (408, 409, 429):
                raise permanent(
                    ERR_ACTION_FAILED,
                    f"provisioning webhook {shown} rejected {action} of {inp.machine}: "
                    f"HTTP {r.status_code} {scrub_url(r.text[:300], url)}",
                )
            if r.status_code >= 400:  # 5xx/408/409/429 → retried by Temporal
                raise RuntimeError(f"provisioning webhook {shown}: HTTP {r.status_code}")
            try:
                body = r.json()
            except ValueError:
                body = None
            if not isinstance(body, dict) or "id" not in body:
                raise permanent(
                    ERR_ACTION_FAILED,
                    f"provisioning webhook {shown}: answer has no 'id' field: "
                    f"{scrub_url(str(body)[:200], url)}",
                )
            return body

        async def call(method: str, target: str, **kw: Any) -> httpx.Response:
            try:
                return await http.request(method, target, **kw)
            except httpx.HTTPError as exc:  # its text and cause may quote the URL
                raise RuntimeError(
                    f"provisioning webhook {shown}: {type(exc).__name__}") from None

        async with httpx.AsyncClient(timeout=WEBHOOK_HTTP_TIMEOUT_S) as http:
            op = check(await call("POST", url, json=payload, headers={"Idempotency-Key": key}))
            if on_accepted is not None:
                on_accepted()  # the operation runs: a retry re-POSTs the same key
            deadline = time.monotonic() + WEBHOOK_WAIT_S
            while True:
                status = str(op.get("status", "")).lower()
                heartbeat({"phase": "webhook", "id": op["id"], "status": status})
                if status == "succeeded":
                    return op
                if status == "failed":
                    raise permanent(
                        ERR_ACTION_FAILED,
                        f"provisioning webhook {shown}: {action} of {inp.machine} failed: "
                        f"{scrub_url(str(op.get('detail', ''))[:300], url)}",
                    )
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"provisioning webhook {shown}: {action} still {status}")
                await asyncio.sleep(POWER_POLL_S)
                op = check(await call("GET", f"{url}/{op['id']}"))

    # ---- activities --------------------------------------------------------------------
    @activity.defn(name=ACT.reprovision_machine)
    async def reprovision_machine(self, inp: MachineActionInput) -> ActionResult:
        """Reimage the machine with the clean image (redfish virtual media or webhook).

        Phases (``workflows.lifecycle.machine_action.PHASES``): ``not_started`` →
        ``provision_started`` (the restart requested, or the webhook's operation accepted) →
        ``booted``, resumed from ``inp.resume_phase`` (or the last heartbeat of an
        earlier try): the restart is sent once per attempt, whatever fails after it
        (a BMC that stops answering while the host boots the installer; I16). A failure
        carries the phase reached (:func:`workflows.activity_api.phased_failure`), so
        the repair counts a touched machine as an attempt (I22)."""
        reached = [resume_from(inp, PHASES[Action.reprovision])]

        started = _phase_marker(reached, "provision_started")

        try:
            c = self._cluster(inp.cluster)
            if c.provisioner == "webhook":
                op = await self._webhook(c, "reprovision", inp,
                                         on_accepted=lambda: started(True))
                return ActionResult(done=True, detail=f"webhook operation {op['id']} succeeded",
                                    phase="booted")
            res = await self._redfish_reprovision(
                c, await self.current(inp), reached[-1] != "not_started", started)
        except Exception as e:
            raise phased_failure(e, reached[-1]) from None
        return res.model_copy(update={"phase": "booted"})

    async def _bring_up(self, c: ClusterConfig, inp: MachineActionInput, restarted: bool,
                        on_restart: Callable[[bool], None]) -> str:
        """Boot ``inp.machine`` (the new machine of a migrate) as the node; with
        ``restarted`` (an earlier try of this attempt sent the restart) only wait for it
        (I16). ``on_restart`` as in :meth:`_redfish_reprovision` (before the request;
        ``False`` after a refusal)."""
        ncfg = machine_config(c, inp.machine)
        if ncfg is None or ncfg.bmc is None:
            return (f"no BMC configured for machine {inp.machine} "
                    f"(clusters[{c.name}].nodes[].machine); left as it is")
        if c.provision_image:
            res = await self._redfish_reprovision(c, inp, restarted, on_restart)
            return f"reprovisioned {inp.machine}: {res.detail}"
        m = RedfishMachine(self.config, inp.cluster, inp.node, inp.machine)
        if restarted:
            await m.wait_power("On", "restart_sent")
            return f"{inp.machine}: restart already sent by an earlier try of this attempt"
        if (await m.power_state()).lower() == "off":
            await _send_restart(m, sushy.RESET_ON, on_restart)
            what = "powered on"
        else:
            await _send_restart(m, sushy.RESET_FORCE_RESTART, on_restart)
            what = "ForceRestart sent"
        await m.wait_power("On", "restart_sent")
        return f"{inp.machine}: {what}"

    @activity.defn(name=ACT.migrate_node)
    async def migrate_node(self, inp: MachineActionInput) -> MigrateResult:
        """Bind the node identity to a spare machine (ledger spare pool, or the webhook).

        Redfish provider: one ledger transaction takes the spare and records the binding
        under the repair id (a retry gets the same machine), then the new machine is
        brought up as the node. Raises non-retryable ``ERR_UNSUPPORTED`` naming the
        cluster when no spare is available (nothing touched).
        """
        reached = [resume_from(inp, PHASES[Action.migrate])]

        restarted = _phase_marker(reached, "restart_sent")

        try:
            return await self._migrate(inp, reached, restarted)
        except Exception as e:
            raise phased_failure(e, reached[-1]) from None

    async def _migrate(self, inp: MachineActionInput, reached: list[str],
                       restarted: Callable[[bool], None]) -> MigrateResult:
        """:meth:`migrate_node`'s steps; ``reached[-1]`` is the phase reached so far (the
        binding made: ``started``; the new machine's restart sent: ``restart_sent``)."""
        c = self._cluster(inp.cluster)
        if c.provisioner == "webhook":
            def accepted() -> None:
                reached.append("started")
                heartbeat({"phase": "started"})

            op = await self._webhook(c, "migrate", inp, on_accepted=accepted)
            new = op.get("new_machine")
            if not new:
                raise permanent(
                    ERR_ACTION_FAILED,
                    f"provisioning webhook: migrate of {inp.machine} succeeded without "
                    "new_machine",
                )
            return MigrateResult(new_machine=str(new), old_machine=inp.machine,
                                 detail=f"webhook operation {op['id']}")
        bindings = await self._bindings("migrate")
        old = await self.current(inp)
        move = await bindings.migrate(c.name, inp.node, old.machine, inp.repair_id,
                                      seed=c.spares)
        if move is None:
            # nothing was touched: the repair treats it as an action that cannot run
            raise permanent(
                ERR_UNSUPPORTED,
                f"cluster {c.name}: no spare machine to migrate node {inp.node} to (hot-spare "
                f"pool empty; clusters[{c.name}].spares = {c.spares})",
            )
        assert move.new_machine is not None
        if reached[-1] == "not_started":
            reached.append("started")
        heartbeat({"phase": reached[-1], "new_machine": move.new_machine})
        log.info("event=node_migrated cluster=%s node=%s old=%s new=%s repair=%s retry=%s",
                 c.name, inp.node, move.old_machine, move.new_machine, inp.repair_id,
                 not move.created)
        up = await self._bring_up(c, inp.model_copy(update={"machine": move.new_machine}),
                                  reached[-1] == "restart_sent", restarted)
        bound = ("bound" if move.created else "already bound by a previous attempt")
        return MigrateResult(
            new_machine=move.new_machine, old_machine=move.old_machine,
            detail=f"node {inp.node} {bound} to spare {move.new_machine}; {up}",
        )

    @activity.defn(name=ACT.remove_machine)
    async def remove_machine(self, inp: MachineActionInput) -> ActionResult:
        """Take the machine out of the pool and open a hardware ticket.

        Redfish provider: ticket ``HW-…`` in the ledger (run id ``remove/<repair_id>``,
        once), machine recorded in ``removed_machines`` and taken out of the spare pool.
        Webhook provider: the operator's endpoint does both and returns ``ticket_id``.
        """
        c = self._cluster(inp.cluster)
        if c.provisioner == "webhook":
            op = await self._webhook(c, "remove", inp)
            return ActionResult(done=True, detail=f"webhook operation {op['id']}",
                                ticket_id=op.get("ticket_id"))
        bindings = await self._bindings("remove")
        cur = await self.current(inp)
        reason = f"removed for RMA by repair {inp.repair_id} (node {inp.node})"
        ticket = await Ledger(bindings.pool).open_ticket(TicketInput(
            cluster=c.name, machine=cur.machine, run_id=f"remove/{inp.repair_id}",
            summary=f"machine {cur.machine} {reason}",
            result=ValidationResult(machine=cur.machine, verdict=Verdict.failed, reason=reason),
        ))
        move = await bindings.remove(c.name, inp.node, cur.machine, inp.repair_id,
                                     ticket.ticket_id, reason)
        log.info("event=machine_removed cluster=%s node=%s machine=%s repair=%s ticket=%s "
                 "retry=%s", c.name, inp.node, cur.machine, inp.repair_id, ticket.ticket_id,
                 not move.created)
        what = "removed" if move.created else "already removed by a previous attempt"
        return ActionResult(
            done=True, ticket_id=move.ticket_id or ticket.ticket_id,
            detail=f"machine {cur.machine} {what} from the pool of {c.name}; hardware ticket "
                   f"{move.ticket_id or ticket.ticket_id}",
        )

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.reprovision_machine, self.migrate_node, self.remove_machine]
