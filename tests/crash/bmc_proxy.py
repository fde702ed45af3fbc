"""A counting Redfish proxy in front of the sushy-tools emulator: the machine side of the
crash test, and its kubelet.

The emulator keeps no count of resets, and polling its power state
(:class:`workers.devpeers.MachineBridge`) misses a reboot whose fake-driver delay ends
before the next poll (the driver's ``apply_time`` is ``int(now) + randint(1, 11)``, so a
restart can be ``Off`` for a few milliseconds). Every request the worker sends to a BMC
goes through this proxy instead (the config's ``bmc.address``) and is forwarded as is;
each ``POST …/Systems/{id}/Actions/ComputerSystem.Reset`` that the emulator accepts (2xx)
is recorded as a :class:`Reset` ``(node, reset type, wall time)``.

``ResetType`` values (Redfish ``ResetType``, DMTF DSP0268): the ones in :data:`TAKE_DOWN`
take a running host down (a power cycle's ``ForceOff``, a reboot's restart); the ones in
:data:`BRING_UP` bring it back, and on those the proxy plays the kubelet: the node gets a
new ``status.nodeInfo.bootID`` through ``on_boot(node)``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import aiohttp.web

#: Reset types that take a running host down.
TAKE_DOWN = frozenset({"ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart",
                       "PowerCycle"})
#: Reset types after which the host boots (a new boot id).
BRING_UP = frozenset({"On", "ForceOn", "ForceRestart", "GracefulRestart", "PowerCycle"})
_RESET = re.compile(r"^/redfish/v1/Systems/([^/]+)/Actions/ComputerSystem\.Reset/?$")
_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass(frozen=True)
class Reset:
    """A reset the emulator accepted: ``node``, Redfish ``reset_type``, wall time ``at``."""

    node: str
    reset_type: str
    at: float


class CountingBmcProxy:
    """Forward everything to ``upstream`` (the emulator's URL); record resets.

    ``systems``: node → Redfish system id (the emulator's). ``on_boot(node)`` runs in the
    event loop after a :data:`BRING_UP` reset was accepted. Use as ``async with``;
    ``url`` is the address to configure as the BMC's.
    """

    def __init__(self, upstream: str, systems: dict[str, str],
                 on_boot: Callable[[str], None]) -> None:
        self.upstream = upstream.rstrip("/")
        self.node_of = {sid: node for node, sid in systems.items()}
        self.on_boot = on_boot
        self.resets: list[Reset] = []
        self.url = ""
        self._runner: aiohttp.web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> CountingBmcProxy:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._http.request(request.method, self.upstream + request.path_qs,
                                      data=body, headers=headers) as r:
            payload = await r.read()
            status = r.status
            out = {k: v for k, v in r.headers.items()
                   if k.lower() in ("content-type", "etag", "location", "www-authenticate")}
        m = _RESET.match(request.path)
        if request.method == "POST" and m and 200 <= status < 300:
            self._record(m.group(1), body)
        return aiohttp.web.Response(status=status, body=payload, headers=out)

    def _record(self, system_id: str, body: bytes) -> None:
        try:
            reset_type = str(json.loads(body or b"{}").get("ResetType", ""))
        except (ValueError, AttributeError):
            reset_type = ""
        node = self.node_of.get(system_id, system_id)
        self.resets.append(Reset(node=node, reset_type=reset_type, at=time.time()))
        if reset_type in BRING_UP:
            self.on_boot(node)
