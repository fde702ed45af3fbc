"""Failure-domain holds through the API (issue 29 item 2): the ``/api/v1/domains`` routes
of the repair API, added to its router by :func:`add_domain_routes`, over the cluster
guard (``guard/{cluster}``: query ``status``, signal ``release_domain``).

====== ========================================= ======== ===================================
method path                                      role     answer
====== ========================================= ======== ===================================
GET    /api/v1/domains?cluster=C                 viewer+  200 :class:`DomainsView`
POST   /api/v1/domains/{cluster}/{domain}/release operator 200 :class:`DomainsView` after the
                                                          release; 409 when not held
====== ========================================= ======== ===================================

The role is checked first (401 / 403); ``cluster`` and ``domain`` follow the one name
rule of :mod:`workflows.names` (422 naming the field); a cluster the config does not
list (when it lists any) is a 422 naming it and the configured clusters. A configured
cluster whose guard has not started holds nothing (``guard_running`` false). Each
release is logged as ``event=domain_released`` (the audit line; the guard records it in
the ledger as the clear of the hold's ``failure_domain`` alert).
"""

# No ``from __future__ import annotations``: FastAPI resolves the route annotations at
# definition time.
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, Field
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workers.repairs.auth import Principal
from workflows.config import AutorepairConfig
from workflows.names import MAX_NAME_LEN, NAME_PATTERN
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    GUARD_SIGNAL_RELEASE_DOMAIN,
    DomainFault,
    DomainHold,
    DomainRelease,
    GuardStatus,
    ReleaseDomainSignal,
    workflow_id_guard,
)

log = logging.getLogger("autorepair.api.domains")

ClusterName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)]
DomainName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)]


class DomainsView(BaseModel):
    """A cluster's failure-domain holds: in force (``holds``), the counts inside the
    window (``recent``), the newest releases, and the rule (``threshold`` nodes within
    ``window_s`` seconds, ``policy.domains``)."""

    cluster: str
    guard_running: bool
    threshold: int
    window_s: float
    holds: list[DomainHold] = Field(default_factory=list)
    recent: list[DomainFault] = Field(default_factory=list)
    releases: list[DomainRelease] = Field(default_factory=list)


class ReleaseBody(BaseModel):
    """Body of a release: why repairs of the domain may go again (recorded)."""

    reason: str = Field("", max_length=1000)


def domains_view(cfg: AutorepairConfig, cluster: str, st: GuardStatus | None) -> DomainsView:
    """The view of ``st`` (None: the guard has not started: nothing held, the configured
    rule)."""
    if st is None:
        d = cfg.policy.domains
        return DomainsView(cluster=cluster, guard_running=False, threshold=d.threshold,
                           window_s=d.window_s)
    return DomainsView(cluster=cluster, guard_running=True, threshold=st.domain_threshold,
                       window_s=st.domain_window_s, holds=st.domain_holds,
                       recent=st.domain_faults, releases=st.domain_releases)


async def guard_status(client: Client, cluster: str) -> GuardStatus | None:
    """The guard's ``status`` of ``cluster`` (None when no guard runs for it). Raises
    ``RPCError`` other than not-found."""
    h = client.get_workflow_handle(workflow_id_guard(cluster))
    try:
        return await h.query(GUARD_QUERY_STATUS, result_type=GuardStatus)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return None


async def release_domain(client: Client, cluster: str, domain: str, by: str,
                         reason: str) -> GuardStatus | None:
    """Signal ``release_domain`` when ``domain`` is held; returns the guard's status
    before the signal (None: no guard). The caller answers 409 when it is not held."""
    st = await guard_status(client, cluster)
    if st is None or all(h.domain != domain for h in st.domain_holds):
        return st
    await client.get_workflow_handle(workflow_id_guard(cluster)).signal(
        GUARD_SIGNAL_RELEASE_DOMAIN, ReleaseDomainSignal(domain=domain, by=by, reason=reason))
    return st


def known_cluster(cfg: AutorepairConfig, cluster: str,
                  where: Literal["query", "path"] = "query") -> None:
    """Raise 422 naming ``cluster`` and the configured clusters when the config lists
    clusters and not this one (a typo would read as "nothing held"); ``where``: the
    parameter's location, first in the error's ``loc`` as FastAPI's own errors have it."""
    names = [c.name for c in cfg.clusters]
    if names and cluster not in names:
        raise HTTPException(422, [{"loc": [where, "cluster"], "type": "value_error",
                                   "msg": f"unknown cluster {cluster!r} (configured: {names})"}])


def add_domain_routes(router: APIRouter, need: Callable[..., Callable[..., Principal]],
                      intake: Any) -> None:
    """Add the ``/domains`` routes (module docstring) to the repair API's ``router``;
    ``need(perm, what)`` is its role check and ``intake`` its intake dependency type
    (whose ``client`` and ``config`` are used)."""

    @router.get("/domains", response_model=DomainsView)
    async def domains_status(
        _: Annotated[Principal, Depends(need("read", "domains"))], ix: intake,
        cluster: str = Query(..., min_length=1, max_length=MAX_NAME_LEN,
                             pattern=NAME_PATTERN),
    ) -> DomainsView:
        """Failure-domain holds of ``cluster`` (issue 29 item 2)."""
        known_cluster(ix.config, cluster)
        return domains_view(ix.config, cluster, await guard_status(ix.client, cluster))

    @router.post("/domains/{cluster}/{domain}/release", response_model=DomainsView)
    async def domains_release(
        cluster: ClusterName, domain: DomainName,
        who: Annotated[Principal, Depends(need("decide", "domains"))], ix: intake,
        body: ReleaseBody | None = None,
    ) -> DomainsView:
        """Release the hold of ``domain``: its waiting repairs go as the rails allow."""
        known_cluster(ix.config, cluster, "path")
        reason = body.reason if body else ""
        st = await release_domain(ix.client, cluster, domain, who.user, reason)
        if st is None or all(h.domain != domain for h in st.domain_holds):
            held = ", ".join(h.domain for h in st.domain_holds) if st else ""
            raise HTTPException(409, f"domain {domain!r} is not held on cluster {cluster!r}"
                                     f" (held: {held or 'none'})")
        log.info("event=domain_released cluster=%s domain=%s by=%s reason=%r", cluster,
                 domain, who.user, reason)
        after = st.model_copy(update={
            "domain_holds": [h for h in st.domain_holds if h.domain != domain]})
        return domains_view(ix.config, cluster, after)
