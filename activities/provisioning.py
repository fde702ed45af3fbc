"""Provisioning behind one interface: ``reprovision``, ``migrate``, ``remove``.

Providers (``ClusterConfig.provisioner``):

- ``redfish`` — ``reprovision`` through Redfish virtual media: insert the clean image
  (``ClusterConfig.provision_image``) in the virtual CD, one-time boot override to CD,
  restart (or power on), wait for power ``On``, eject. Each step checks the current state
  first (image already inserted, host already restarted by a previous attempt: the phase
  is kept in heartbeat details), so a retry never restarts twice.
- ``webhook`` — for platforms with their own control plane: ``POST {provision_webhook}``
  with ``{"action", "cluster", "node", "machine", "repair_id", "image"}`` and the header
  ``Idempotency-Key: <action>/<repair_id>``; the answer ``{"id", "status"}`` is polled at
  ``GET {provision_webhook}/{id}`` until ``status`` is ``succeeded`` (result fields
  ``new_machine``, ``ticket_id`` read when present) or ``failed`` (non-retryable
  ``ERR_ACTION_FAILED`` with the endpoint's ``detail``). 4xx → non-retryable, 5xx/network
  → retried.

``migrate`` and ``remove`` need a spare pool and a hardware-ticket system; with the
``webhook`` provider the operator's endpoint owns both. With ``redfish`` they raise
non-retryable ``ERR_UNSUPPORTED`` naming the setting to change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import sushy
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.power import POWER_POLL_S, HealthReader, RedfishMachine, heartbeat, last_phase
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    ERR_AUTH,
    ERR_UNSUPPORTED,
    ActionResult,
    MachineActionInput,
    MigrateResult,
)
from workflows.config import AutorepairConfig, ClusterConfig

#: Longest wait for a webhook operation, seconds (a reimage takes minutes; a rebuild on
#: new hardware up to an hour).
WEBHOOK_WAIT_S = 3600.0
#: Webhook HTTP timeout per request, seconds.
WEBHOOK_HTTP_TIMEOUT_S = 30.0


class ProvisioningActivities:
    """``reprovision_machine``, ``migrate_node``, ``remove_machine`` (BMC task queue)."""

    def __init__(self, config: AutorepairConfig, health: HealthReader | None = None) -> None:
        self.config = config
        self.health = health

    def _cluster(self, name: str) -> ClusterConfig:
        try:
            return self.config.cluster(name)
        except KeyError as e:
            raise ApplicationError(str(e), type=ERR_UNSUPPORTED, non_retryable=True) from None

    # ---- redfish virtual media ------------------------------------------------------
    async def _redfish_reprovision(self, c: ClusterConfig, inp: MachineActionInput) -> ActionResult:
        if not c.provision_image:
            raise ApplicationError(
                f"clusters[{c.name}].provision_image: not set; reprovision needs the clean "
                "image URL", type=ERR_UNSUPPORTED, non_retryable=True,
            )
        image = c.provision_image
        m = RedfishMachine(self.config, inp.cluster, inp.node, inp.machine)
        phase = last_phase()
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
            raise ApplicationError(
                f"BMC {m.address}: no virtual CD/DVD device on machine {inp.machine}",
                type=ERR_UNSUPPORTED, non_retryable=True,
            )

        def boot_once(s: Any) -> None:
            s.set_system_boot_options(
                target=sushy.BOOT_SOURCE_TARGET_CD, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE
            )

        def eject(s: Any) -> str:
            out = "nothing to eject"
            for vm in s.virtual_media.get_members():
                if vm.inserted and vm.image == image:
                    vm.eject_media()
                    out = f"ejected from {vm.identity}"
            return out

        if phase not in ("restart_sent", "ejected"):
            steps.append(await m.call(insert))
            heartbeat({"phase": "media_inserted"})
            await m.call(boot_once)
            steps.append("boot override Cd once")
            heartbeat({"phase": "boot_set"})
            if (await m.power_state()).lower() == "off":
                await m.reset(sushy.RESET_ON)
                steps.append("On")
            else:
                await m.reset(sushy.RESET_FORCE_RESTART)
                steps.append("ForceRestart")
            heartbeat({"phase": "restart_sent"})
        else:
            steps.append("restart already sent by a previous attempt")
        await m.wait_power("On", "restart_sent")
        steps.append(await m.call(eject))
        heartbeat({"phase": "ejected"})
        return ActionResult(done=True, detail="; ".join(steps))

    # ---- webhook ---------------------------------------------------------------------
    async def _webhook(
        self, c: ClusterConfig, action: str, inp: MachineActionInput
    ) -> dict[str, Any]:
        if not c.provision_webhook:
            raise ApplicationError(
                f"clusters[{c.name}].provision_webhook: not set for provisioner 'webhook'",
                type=ERR_UNSUPPORTED, non_retryable=True,
            )
        url = c.provision_webhook.rstrip("/")
        payload = {"action": action, "cluster": inp.cluster, "node": inp.node,
                   "machine": inp.machine, "repair_id": inp.repair_id,
                   "image": c.provision_image}
        key = f"{action}/{inp.repair_id}"

        def check(r: httpx.Response) -> dict[str, Any]:
            if r.status_code in (401, 403):
                raise ApplicationError(
                    f"provisioning webhook {url} refused access (HTTP {r.status_code})",
                    type=ERR_AUTH, non_retryable=True,
                )
            if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                raise ApplicationError(
                    f"provisioning webhook {url} rejected {action} of {inp.machine}: "
                    f"HTTP {r.status_code} {r.text[:300]}",
                    type=ERR_ACTION_FAILED, non_retryable=True,
                )
            r.raise_for_status()  # 5xx/408/429 → retried by Temporal
            body = r.json()
            if not isinstance(body, dict) or "id" not in body:
                raise ApplicationError(
                    f"provisioning webhook {url}: answer has no 'id' field: {str(body)[:200]}",
                    type=ERR_ACTION_FAILED, non_retryable=True,
                )
            return body

        async with httpx.AsyncClient(timeout=WEBHOOK_HTTP_TIMEOUT_S) as http:
            op = check(await http.post(url, json=payload, headers={"Idempotency-Key": key}))
            deadline = time.monotonic() + WEBHOOK_WAIT_S
            while True:
                status = str(op.get("status", "")).lower()
                heartbeat({"phase": "webhook", "id": op["id"], "status": status})
                if status == "succeeded":
                    return op
                if status == "failed":
                    raise ApplicationError(
                        f"provisioning webhook {url}: {action} of {inp.machine} failed: "
                        f"{op.get('detail', '')}", type=ERR_ACTION_FAILED, non_retryable=True,
                    )
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"provisioning webhook {url}: {action} still {status}")
                await asyncio.sleep(POWER_POLL_S)
                op = check(await http.get(f"{url}/{op['id']}"))

    # ---- activities --------------------------------------------------------------------
    @activity.defn(name=ACT.reprovision_machine)
    async def reprovision_machine(self, inp: MachineActionInput) -> ActionResult:
        """Reimage the machine with the clean image (redfish virtual media or webhook)."""
        c = self._cluster(inp.cluster)
        if c.provisioner == "webhook":
            op = await self._webhook(c, "reprovision", inp)
            return ActionResult(done=True, detail=f"webhook operation {op['id']} succeeded")
        return await self._redfish_reprovision(c, inp)

    @activity.defn(name=ACT.migrate_node)
    async def migrate_node(self, inp: MachineActionInput) -> MigrateResult:
        """Bind the node identity to a spare machine (webhook provider)."""
        c = self._cluster(inp.cluster)
        if c.provisioner != "webhook":
            raise ApplicationError(
                f"clusters[{c.name}].provisioner: migrate needs provisioner 'webhook' (the "
                "platform's spare pool); 'redfish' can only reprovision in place",
                type=ERR_UNSUPPORTED, non_retryable=True,
            )
        op = await self._webhook(c, "migrate", inp)
        new = op.get("new_machine")
        if not new:
            raise ApplicationError(
                f"provisioning webhook: migrate of {inp.machine} succeeded without new_machine",
                type=ERR_ACTION_FAILED, non_retryable=True,
            )
        return MigrateResult(new_machine=str(new), old_machine=inp.machine,
                             detail=f"webhook operation {op['id']}")

    @activity.defn(name=ACT.remove_machine)
    async def remove_machine(self, inp: MachineActionInput) -> ActionResult:
        """Take the machine out of the pool and open a hardware ticket (webhook provider)."""
        c = self._cluster(inp.cluster)
        if c.provisioner != "webhook":
            raise ApplicationError(
                f"clusters[{c.name}].provisioner: remove needs provisioner 'webhook' (the "
                "platform's pool and ticket system)", type=ERR_UNSUPPORTED, non_retryable=True,
            )
        op = await self._webhook(c, "remove", inp)
        return ActionResult(done=True, detail=f"webhook operation {op['id']}",
                            ticket_id=op.get("ticket_id"))

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.reprovision_machine, self.migrate_node, self.remove_machine]
