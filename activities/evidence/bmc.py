"""The BMC's System Event Log through Redfish (DMTF DSP0268 ``LogService`` / ``LogEntry``),
for the evidence captured before a disruptive action.

Where (first that answers with entries wins):

1. the machine's system (``bmc.system_id``, else the only member of
   ``/redfish/v1/Systems``, the rule of :mod:`activities.power`): its ``LogServices``
   (the system's link, else ``{system}/LogServices``), the member named ``SEL``, else
   ``Log1`` (HPE iLO's IML is ``IML``, Dell iDRAC's ``Sel``/``SEL``, OpenBMC's
   ``EventLog``), else the first member whose ``LogEntryType`` is ``SEL``;
2. the same search in each manager's ``LogServices`` (``/redfish/v1/Managers/*``) —
   source ``Managers/<id>/<log>``.

Entries: the log service's ``Entries`` collection (inline members or links, following
``Members@odata.nextLink`` up to :data:`MAX_PAGES` pages), the newest ``n`` by
``Created`` then numeric ``Id``, newest first.

Credentials come from :mod:`activities.secrets` (never in a message). Raises
:class:`SelUnavailable` with a sentence naming the BMC (and never the password) when the
log cannot be read; the caller turns it into a note.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from activities.secrets import CredentialsError, load_bmc_credentials
from workflows.config import AutorepairConfig, BmcConfig
from workflows.evidence import BmcCapture, SelEntry

PREFERRED = ("SEL", "Sel", "Log1", "EventLog")
"""Log service ids tried in order (DMTF's examples and the vendors' names)."""
MAX_PAGES = 20
"""Pages of an entries collection followed at most (a BMC keeps a few thousand entries)."""
MAX_LINKED = 200
"""Entries fetched one by one at most when a collection lists only links."""


class SelUnavailable(RuntimeError):
    """The SEL could not be read; the message says why (BMC address, HTTP status)."""


def bmc_of(config: AutorepairConfig, cluster: str, node: str, machine: str
           ) -> BmcConfig | None:
    """The BMC of ``machine`` (else of ``node``, unless its entry names another machine)
    of ``cluster`` from the configuration, as :mod:`activities.power` finds it (``None``:
    none set). Raises ``KeyError`` naming the
    cluster when it is unknown."""
    nodes = config.cluster(cluster).nodes
    for n in nodes:
        if n.machine == machine or n.name == machine:
            return n.bmc
    for n in nodes:
        if n.name == node and not (n.machine and n.machine != machine):
            return n.bmc  # never the BMC of the machine a migrate moved the node off
    return None


def _sort_key(e: SelEntry) -> tuple[str, int, str]:
    try:
        num = int(e.id)
    except ValueError:
        num = -1
    return (e.created or "", num, e.id)


def _entry(doc: dict[str, Any]) -> SelEntry:
    return SelEntry(id=str(doc.get("Id", "")), created=doc.get("Created"),
                    severity=doc.get("Severity"), message=str(doc.get("Message") or ""),
                    entry_type=doc.get("EntryType"), sensor_type=doc.get("SensorType"),
                    message_id=doc.get("MessageId"))


class SelReader:
    """Reads one BMC's SEL (see the module docstring). ``timeout_s``: each request's."""

    def __init__(self, config: AutorepairConfig, bmc: BmcConfig, timeout_s: float) -> None:
        self.bmc = bmc
        self.address = bmc.address.rstrip("/")
        try:
            creds = load_bmc_credentials(config.secrets, self.address)
        except CredentialsError as e:
            raise SelUnavailable(str(e)) from None
        self._auth = httpx.BasicAuth(creds.username, creds.password.get_secret_value())
        self._user = creds.username
        self._timeout = timeout_s

    async def _get(self, client: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
        """GET ``path``: its JSON, ``None`` on 404; :class:`SelUnavailable` otherwise."""
        try:
            r = await client.get(path)
        except httpx.HTTPError as e:
            raise SelUnavailable(f"BMC {self.address}: {type(e).__name__}") from None
        if r.status_code == 404:
            return None
        if r.status_code in (401, 403):
            raise SelUnavailable(f"BMC {self.address} rejected user {self._user!r} "
                                 f"(HTTP {r.status_code})")
        if r.status_code >= 400:
            raise SelUnavailable(f"BMC {self.address} answered HTTP {r.status_code} for {path}")
        try:
            doc = r.json()
        except ValueError:
            raise SelUnavailable(f"BMC {self.address}: {path} is not JSON") from None
        return doc if isinstance(doc, dict) else None

    @staticmethod
    def _members(doc: dict[str, Any] | None) -> list[str]:
        return [str(m["@odata.id"]) for m in (doc or {}).get("Members", [])
                if isinstance(m, dict) and "@odata.id" in m]

    async def _system(self, client: httpx.AsyncClient) -> str:
        sid = self.bmc.system_id
        if sid:
            return sid if sid.startswith("/") else f"/redfish/v1/Systems/{sid}"
        members = self._members(await self._get(client, "/redfish/v1/Systems"))
        if len(members) != 1:
            raise SelUnavailable(
                f"BMC {self.address}: bmc.system_id is not set and /redfish/v1/Systems "
                f"lists {len(members)} systems")
        return members[0]

    async def _log_service(self, client: httpx.AsyncClient, owner: str
                           ) -> tuple[str, dict[str, Any]] | None:
        doc = await self._get(client, owner)
        link = ((doc or {}).get("LogServices") or {}).get("@odata.id") or f"{owner}/LogServices"
        members = self._members(await self._get(client, link))
        by_id = {m.rstrip("/").rsplit("/", 1)[-1]: m for m in members}
        for want in PREFERRED:
            if want in by_id:
                svc = await self._get(client, by_id[want])
                if svc is not None:
                    return want, svc
        for m in members:
            svc = await self._get(client, m)
            if svc is not None and svc.get("LogEntryType") == "SEL":
                return m.rstrip("/").rsplit("/", 1)[-1], svc
        return None

    async def _entries(self, client: httpx.AsyncClient, svc: dict[str, Any]) -> list[SelEntry]:
        link = (svc.get("Entries") or {}).get("@odata.id")
        if not link:
            return []
        out: list[SelEntry] = []
        linked: list[str] = []
        page: str | None = link
        for _ in range(MAX_PAGES):
            if page is None:
                break
            doc = await self._get(client, page)
            if doc is None:
                break
            for m in doc.get("Members", []):
                if not isinstance(m, dict):
                    continue
                if "Id" in m or "Message" in m:
                    out.append(_entry(m))
                elif "@odata.id" in m:
                    linked.append(str(m["@odata.id"]))
            page = doc.get("Members@odata.nextLink")
        for path in linked[-MAX_LINKED:]:
            d = await self._get(client, path)
            if d is not None:
                out.append(_entry(d))
        return out

    async def read(self, n: int) -> BmcCapture:
        """The newest ``n`` SEL entries (module docstring). Raises :class:`SelUnavailable`."""
        async with httpx.AsyncClient(base_url=self.address, auth=self._auth,
                                     verify=self.bmc.verify_tls, timeout=self._timeout) as c:
            owners = [("", await self._system(c))]
            managers = self._members(await self._get(c, "/redfish/v1/Managers"))
            owners += [(f"Managers/{m.rstrip('/').rsplit('/', 1)[-1]}/", m) for m in managers]
            for prefix, owner in owners:
                found = await self._log_service(c, owner)
                if found is None:
                    continue
                name, svc = found
                entries = sorted(await self._entries(c, svc), key=_sort_key, reverse=True)
                return BmcCapture(entries=entries[:n], source=prefix + name,
                                  collected_at=datetime.now(UTC))
        raise SelUnavailable(f"BMC {self.address}: no System Event Log (no SEL or Log1 log "
                             "service under the system or its managers)")
