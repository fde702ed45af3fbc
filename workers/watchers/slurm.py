"""Slurm watcher: nodes that someone other than us marked DOWN / DRAIN / NOT_RESPONDING.

Every ``interval_s`` it reads ``scontrol show node`` (all nodes; parsed by the Slurm
scheduler's own reader, :func:`activities.scheduler.slurm.parse_scontrol_show_node`) and,
for a node in a bad state whose reason does not start with ``autorepair:`` (our own
cordons), delivers a ``slurm_node`` alert carrying the state flags, the reason text
("Kill task failed", "gres/gpu count reported lower than configured"), its user and
time. These alerts are **observed, never a repair**: the scheduler state alone says
nothing about the hardware and the node may be one an admin is working on (docs/design.md §1
rule zero), so the watcher forces ``actionable=False`` / ``action=none``. When the node
leaves the bad state a clear (``active=False``) follows. ``NOT_RESPONDING`` without a
reason counts from its second consecutive poll (it flaps for one ping cycle after a resume
or a slurmd restart); an episode in that state that the ledger holds open counts at once, so
a worker restart does not clear and raise it again.

**Dead host**: a node ``NOT_RESPONDING`` or ``DOWN`` has its BMC asked (``bmc_probe``,
Redfish): power ``Off`` or a host the BMC reports dead makes a second ``slurm_node`` alert
carrying the BMC's answer as evidence, which the catalogue maps to ``power_cycle`` — the
same rule as Kubernetes NotReady. During a long episode the BMC is asked again every
``worker.bmc_reprobe_s`` until it confirms (:class:`workers.watchers.bmc.BmcChecks`).

Restarts do not replay old events as new: the alert's observation time is the reason
time Slurm recorded (else slurmd's start time), so the same episode always yields the
same ``alert_id`` and the NodeWorkflow de-duplicates it. Edges of one node never sort
out of order (:class:`workers.watchers.edges.EdgeTimes`): a raise that Slurm's
whole-second time would stamp before the clear it follows is stamped 1 ms after that
clear. Restarts do not lose clears: before its first scan the watcher re-opens the
episodes the ledger still holds open (``open_alerts``), so an episode that ended while
the worker was down gets its clear on the first scan, and a node whose episode ended
before the restart gets its next raise stamped after that clear. Memory is bounded by the node count
(a node gone from ``scontrol`` is cleared and forgotten).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from activities.evidence.node import RESERVATION_PREFIX as EVIDENCE_RESERVATION_PREFIX
from activities.scheduler.slurm import (
    REASON_PREFIX,
    SlurmNode,
    SlurmReservation,
    parse_scontrol_show_node,
    parse_scontrol_show_reservation,
)
from ingest.handoff import AlertSink
from workers.watchers.bmc import BmcChecks, BmcProbe, OpenAlerts, bmc_verdict
from workers.watchers.edges import EdgeTimes
from workflows.alerts import alert_from_fault
from workflows.catalogue.kinds import SLURM_UNRESPONSIVE_FLAGS
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.maintenance import MaintenanceWindow
from workflows.models import Action, Alert

log = logging.getLogger("autorepair.watchers.slurm")

WATCHED_FLAGS: frozenset[str] = frozenset({"DOWN", "DRAIN", "NOT_RESPONDING", "FAIL"})
"""State flags that make a node an observation (DOWN/DRAIN/NOT_RESPONDING as
``sinfo`` reports them; FAIL is Slurm's drain-on-failure)."""
DEFAULT_INTERVAL_S = 15.0
"""Poll interval, seconds: well under slurmctld's default SlurmdTimeout (300 s)."""
SOURCE = "slurm_watcher"
#: Stores a scheduler's maintenance windows: ``(cluster, source, windows, now)``
#: (``activities.maintenance_store.MaintenanceStore.sync``).
MaintenanceSync = Callable[[str, str, list[MaintenanceWindow], datetime], Awaitable[object]]


@dataclass(frozen=True)
class _Episode:
    state: tuple[str, ...]
    reason: str
    observed_at: datetime
    bmc: dict[str, str | None] | None = field(default=None, compare=False)


class SlurmWatcher:
    """Polls one Slurm cluster and delivers ``slurm_node`` alerts to ``sink``.

    ``bmc_probe``: dead-host check of NOT_RESPONDING/DOWN nodes (``None``: observed only).
    ``open_alerts``: the ledger's last edge of each level fault this watcher raised
    (``Ledger.last_level_edges``; ``Ledger.open_level_alerts``, the raises alone, also
    works, without the floor that clears give), read once before the first scan (``None``:
    no reconciliation). ``maintenance``: stores the cluster's ``Flags=MAINT``
    reservations as maintenance windows (:meth:`sync_maintenance`; ``None``: they are
    not read). ``clock``: monotonic seconds (BMC re-probe interval).
    Raises nothing from :meth:`scan_once` except ``RuntimeError`` naming the command when
    ``scontrol`` fails.
    """

    def __init__(self, config: AutorepairConfig, cluster: ClusterConfig, sink: AlertSink,
                 *, interval_s: float = DEFAULT_INTERVAL_S, bmc_probe: BmcProbe | None = None,
                 open_alerts: OpenAlerts | None = None,
                 maintenance: MaintenanceSync | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.cluster = cluster
        self.sink = sink
        self.interval_s = interval_s
        self.bmc_probe = bmc_probe
        self.open_alerts = open_alerts
        self.maintenance = maintenance
        self.clock = clock
        self._reconciled = open_alerts is None
        self._open: dict[str, _Episode] = {}
        self._dead: dict[str, _Episode] = {}
        self._bmc = BmcChecks(config.worker.bmc_reprobe_s)
        self._edges = EdgeTimes()
        self._unconfirmed: set[str] = set()
        self._machines = {n.name: n.machine for n in cluster.nodes}
        self._pools = {n.name: n.pool for n in cluster.nodes}

    async def _scontrol(self, *args: str) -> str:
        env = dict(os.environ)
        if self.cluster.slurm_conf:
            env["SLURM_CONF"] = self.cluster.slurm_conf
        exe = os.path.join(self.cluster.slurm_bin_dir, "scontrol") if (
            self.cluster.slurm_bin_dir) else "scontrol"
        proc = await asyncio.create_subprocess_exec(
            exe, *args, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30.0)
        if proc.returncode != 0:
            raise RuntimeError(
                f"clusters[{self.cluster.name}]: scontrol {' '.join(args)} "
                f"rc={proc.returncode}: {err.decode(errors='replace').strip()}"
            )
        return out.decode(errors="replace")

    async def read_nodes(self) -> dict[str, SlurmNode]:
        """Every node as ``scontrol show node`` reports it."""
        return parse_scontrol_show_node(await self._scontrol("show", "node"))

    def _alert(self, node: str, ep: _Episode, active: bool, at: datetime,
               reason_user: str | None = None, reason_time: datetime | None = None) -> Alert:
        text = f"NodeName={node} State={'+'.join(ep.state)} Reason={ep.reason}"
        if reason_user:
            text += f" [{reason_user}@{reason_time.isoformat() if reason_time else ''}]"
        evidence: dict[str, object] = {
            "state": list(ep.state), "reason": ep.reason, "reason_user": reason_user,
            "reason_time": reason_time.isoformat() if reason_time else None,
            "watcher": SOURCE,
        }
        why = bmc_verdict(ep.bmc) if ep.bmc is not None else None
        if ep.bmc is not None:
            evidence["bmc"] = ep.bmc
            text += f"; {why}"
        a = alert_from_fault(
            cluster=self.cluster.name, node=node, kind="slurm_node", code=None, gpu=None,
            evidence_text=text if active else f"{text} (cleared)", evidence=evidence,
            observed_at=at, catalogue=self.config.policy.catalogue,
            machine_id=self._machines.get(node), node_pool=self._pools.get(node),
            active=active, level=True, source=SOURCE,
        )
        if ep.bmc is None or not active:
            # The scheduler's state alone never repairs a node (docs/design.md §1 rule zero).
            a = a.model_copy(update={"actionable": False, "action": Action.none})
        return a

    @staticmethod
    def _episode_of(alert: Alert) -> _Episode:
        ev = alert.evidence
        state = ev.get("state")
        bmc = ev.get("bmc")
        return _Episode(tuple(str(x) for x in state) if isinstance(state, list) else (),
                        str(ev.get("reason") or ""), alert.observed_at,
                        bmc if isinstance(bmc, dict) else None)

    async def reconcile(self) -> int:
        """Re-open the episodes this watcher raised that the ledger holds open (a restart
        lost them); returns how many. A clear among ``open_alerts``'s answer (the ledger's
        last edge of an episode that ended) floors the stamp of the node's next raise.
        Raises what ``open_alerts`` raises."""
        if self.open_alerts is None:
            return 0
        n = 0
        for a in await self.open_alerts(self.cluster.name, SOURCE):
            if a.kind != "slurm_node":
                continue
            if not a.active:  # the episode ended: the next one is stamped after its clear
                self._edges.cleared_before(a.node, a.observed_at)
                continue
            ep = self._episode_of(a)
            table = self._dead if ep.bmc is not None else self._open
            if a.node not in table:
                table[a.node] = ep
                self._edges.reopened(a.node, a.observed_at)
                n += 1
        self._reconciled = True
        self._edges.floor = None
        log.info("event=watcher_reconciled cluster=%s source=%s open=%d",
                 self.cluster.name, SOURCE, n)
        return n

    async def _clear(self, node: str, n: SlurmNode | None, now: datetime,
                     sent: list[Alert]) -> None:
        prev = self._open.pop(node, None) or self._dead.get(node)
        self._dead.pop(node, None)
        self._bmc.end(node)
        if prev is None:
            return
        alert = self._alert(node, replace(prev, bmc=None), False,
                            self._edges.clear_at(node, now), n.reason_user if n else None,
                            n.reason_time if n else None)
        await self.sink.submit(alert)
        sent.append(alert)
        log.info("event=slurm_node_cleared cluster=%s node=%s", self.cluster.name, node)

    async def _check_bmc(self, n: SlurmNode, ep: _Episode, sent: list[Alert]) -> None:
        """A NOT_RESPONDING/DOWN node: ask its BMC (once per episode, again every
        ``bmc_reprobe_s`` until it confirms); a dead host raises the power-cycle alert."""
        if self.bmc_probe is None or not set(n.state) & SLURM_UNRESPONSIVE_FLAGS:
            return
        episode = (ep.observed_at, ep.state)
        mono = self.clock()
        if not self._bmc.due(n.name, episode, mono):
            return
        try:
            bmc = await self.bmc_probe(self.cluster.name, n.name)
        except Exception as e:  # an unreachable BMC is not evidence; asked again next poll
            log.warning("event=bmc_check_failed cluster=%s node=%s error=%s",
                        self.cluster.name, n.name, type(e).__name__)
            return
        why = bmc_verdict(bmc)
        self._bmc.record(n.name, episode, mono, why is not None)
        log.info("event=bmc_checked cluster=%s node=%s power=%s health=%s actionable=%s",
                 self.cluster.name, n.name, bmc.get("power_state"), bmc.get("health"),
                 bool(why))
        if why is None:
            return
        dead = replace(ep, bmc=bmc)
        alert = self._alert(n.name, dead, True, ep.observed_at, n.reason_user, n.reason_time)
        await self.sink.submit(alert)
        self._dead[n.name] = dead
        sent.append(alert)

    async def read_reservations(self) -> list[SlurmReservation]:
        """Every reservation as ``scontrol show reservation`` reports it."""
        out = await self._scontrol("show", "reservation")
        return parse_scontrol_show_reservation(out)

    def maintenance_windows(self, reservations: list[SlurmReservation]
                            ) -> list[MaintenanceWindow]:
        """The ``Flags=MAINT`` reservations with nodes and times as maintenance windows
        (issue 29: id ``slurm:CLUSTER:NAME``), except the project's own validation and
        GPU-reset reservations (``validation.reservation_prefix``,
        ``reset_gpu.reservation_prefix``: a node being validated is cordoned anyway) and
        the evidence capture's before a repair's action
        (``activities.evidence.node.RESERVATION_PREFIX``: a repair's own step, whose
        window and grace period would otherwise hold the node's next faults)."""
        ours = (self.cluster.validation.reservation_prefix,
                self.cluster.reset_gpu.reservation_prefix, EVIDENCE_RESERVATION_PREFIX)
        out: list[MaintenanceWindow] = []
        for r in reservations:
            if not r.maint or not r.nodes or r.start is None or r.end is None \
                    or r.end <= r.start or r.name.startswith(ours):
                continue
            out.append(MaintenanceWindow(
                window_id=f"slurm:{self.cluster.name}:{r.name}", cluster=self.cluster.name,
                scope="nodes", nodes=list(r.nodes), source="slurm", created_by="slurm",
                reason=f"Slurm maintenance reservation {r.name}", starts_at=r.start,
                ends_at=r.end))
        return out

    async def sync_maintenance(self, now: datetime) -> None:
        """Store the MAINT reservations as windows (best effort: a failure is logged and
        the node scan goes on)."""
        if self.maintenance is None:
            return
        try:
            windows = self.maintenance_windows(await self.read_reservations())
            await self.maintenance(self.cluster.name, "slurm", windows, now)
        except Exception as e:  # scontrol or the ledger failed: the next poll tries again
            log.warning("event=watcher_maintenance_sync_failed cluster=%s error=%s",
                        self.cluster.name, e)

    async def scan_once(self, now: datetime | None = None) -> list[Alert]:
        """One poll; returns the alerts delivered (raise and clear edges)."""
        now = now or datetime.now(UTC)
        if not self._reconciled:
            try:
                await self.reconcile()
            except Exception as e:  # the ledger is down: scan anyway, reconcile next time
                if self._edges.floor is None:
                    self._edges.floor = now  # after every clear the previous run sent
                log.warning("event=watcher_reconcile_failed cluster=%s error=%s",
                            self.cluster.name, e)
        await self.sync_maintenance(now)
        nodes = await self.read_nodes()
        sent: list[Alert] = []
        for name, n in sorted(nodes.items()):
            flags = set(n.state)
            ours = n.reason.startswith(REASON_PREFIX)
            bad = bool(flags & WATCHED_FLAGS) and not ours
            prev = self._open.get(name)
            if bad and not flags & (WATCHED_FLAGS - {"NOT_RESPONDING"}) and not n.reason:
                # NOT_RESPONDING alone (no reason) flaps for a ping cycle after a resume or
                # a slurmd restart: it counts from its second consecutive sighting. An
                # episode already open in this state (re-opened from the ledger after a
                # restart) is confirmed: clearing it would end a live episode.
                known = prev or self._dead.get(name)
                continuing = known is not None and known.state == tuple(n.state)
                if name not in self._unconfirmed and not continuing:
                    self._unconfirmed.add(name)
                    bad = False
                else:
                    self._unconfirmed.add(name)
            else:
                self._unconfirmed.discard(name)
            if bad:
                at = self._edges.raise_at(
                    name, n.reason_time or n.slurmd_start_time or n.boot_time or now)
                ep = _Episode(tuple(n.state), n.reason, at)
                if prev != ep:
                    alert = self._alert(name, ep, True, at, n.reason_user, n.reason_time)
                    await self.sink.submit(alert)
                    self._open[name] = ep
                    self._edges.raised(name, at)
                    sent.append(alert)
                    log.info("event=slurm_node_observed cluster=%s node=%s state=%s "
                             "reason=%r alert_id=%s", self.cluster.name, name,
                             "+".join(ep.state), ep.reason, alert.alert_id)
                if name not in self._dead:
                    await self._check_bmc(n, ep, sent)
            elif prev is not None or name in self._dead:
                await self._clear(name, n, now, sent)
        # Nodes gone from Slurm's list: their episodes ended with them.
        for name in [x for x in {*self._open, *self._dead} if x not in nodes]:
            await self._clear(name, None, now, sent)
        self._unconfirmed &= set(nodes)
        self._bmc.retain(set(nodes))
        self._edges.retain(set(nodes), now)
        return sent

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Poll until ``stop`` is set (or cancelled); errors are logged and retried."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.scan_once()
            except Exception as e:  # keep watching; the next poll retries
                log.warning("event=slurm_watch_error cluster=%s error=%s", self.cluster.name, e)
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass
