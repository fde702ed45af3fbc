"""Slurm watcher: nodes that someone other than us marked DOWN / DRAIN / NOT_RESPONDING.

Every ``interval_s`` it reads ``scontrol show node`` (all nodes; parsed by the Slurm
scheduler's own reader, :func:`activities.scheduler.slurm.parse_scontrol_show_node`) and,
for a node in a bad state whose reason does not start with ``autorepair:`` (our own
cordons), delivers a ``slurm_node`` alert carrying the state flags, the reason text
("Kill task failed", "gres/gpu count reported lower than configured"), its user and
time. These alerts are **observed, never a repair**: the scheduler state alone says
nothing about the hardware and the node may be one an admin is working on (DESIGN §1
rule zero), so the watcher forces ``actionable=False`` / ``action=none`` whatever the
catalogue says. When the node leaves the bad state a clear (``active=False``) follows.
``NOT_RESPONDING`` without a reason counts from its second consecutive poll (it flaps
for one ping cycle after a resume or a slurmd restart).

Restarts do not replay old events as new: the alert's observation time is the reason
time Slurm recorded (else slurmd's start time), so the same episode always yields the
same ``alert_id`` and the NodeWorkflow de-duplicates it; clears are only sent for
episodes this process saw begin.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from activities.scheduler.slurm import REASON_PREFIX, SlurmNode, parse_scontrol_show_node
from ingest.handoff import AlertSink
from workflows.alerts import alert_from_fault
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.models import Action, Alert

log = logging.getLogger("autorepair.watchers.slurm")

WATCHED_FLAGS: frozenset[str] = frozenset({"DOWN", "DRAIN", "NOT_RESPONDING", "FAIL"})
"""State flags that make a node an observation (DOWN/DRAIN/NOT_RESPONDING as
``sinfo`` reports them; FAIL is Slurm's drain-on-failure)."""
DEFAULT_INTERVAL_S = 15.0
"""Poll interval, seconds: well under slurmctld's default SlurmdTimeout (300 s)."""
SOURCE = "slurm_watcher"


@dataclass(frozen=True)
class _Episode:
    state: tuple[str, ...]
    reason: str
    observed_at: datetime


class SlurmWatcher:
    """Polls one Slurm cluster and delivers ``slurm_node`` alerts to ``sink``.

    ``clock``: timezone-aware now, for tests. Raises nothing from :meth:`scan_once`
    except ``RuntimeError`` naming the command when ``scontrol`` fails.
    """

    def __init__(self, config: AutorepairConfig, cluster: ClusterConfig, sink: AlertSink,
                 *, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.config = config
        self.cluster = cluster
        self.sink = sink
        self.interval_s = interval_s
        self._open: dict[str, _Episode] = {}
        self._unconfirmed: set[str] = set()
        self._machines = {n.name: n.machine for n in cluster.nodes}
        self._pools = {n.name: n.pool for n in cluster.nodes}

    async def read_nodes(self) -> dict[str, SlurmNode]:
        """Every node as ``scontrol show node`` reports it."""
        env = dict(os.environ)
        if self.cluster.slurm_conf:
            env["SLURM_CONF"] = self.cluster.slurm_conf
        exe = os.path.join(self.cluster.slurm_bin_dir, "scontrol") if (
            self.cluster.slurm_bin_dir) else "scontrol"
        proc = await asyncio.create_subprocess_exec(
            exe, "show", "node", env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30.0)
        if proc.returncode != 0:
            raise RuntimeError(
                f"clusters[{self.cluster.name}]: scontrol show node rc={proc.returncode}: "
                f"{err.decode(errors='replace').strip()}"
            )
        return parse_scontrol_show_node(out.decode(errors="replace"))

    def _alert(self, n: SlurmNode, ep: _Episode, active: bool, at: datetime) -> Alert:
        text = f"NodeName={n.name} State={'+'.join(ep.state)} Reason={ep.reason}"
        if n.reason_user:
            text += f" [{n.reason_user}@{n.reason_time.isoformat() if n.reason_time else ''}]"
        evidence = {
            "state": list(ep.state), "reason": ep.reason, "reason_user": n.reason_user,
            "reason_time": n.reason_time.isoformat() if n.reason_time else None,
            "watcher": SOURCE,
        }
        a = alert_from_fault(
            cluster=self.cluster.name, node=n.name, kind="slurm_node", code=None, gpu=None,
            evidence_text=text if active else f"{text} (cleared)", evidence=evidence,
            observed_at=at, catalogue=self.config.policy.catalogue,
            machine_id=self._machines.get(n.name), node_pool=self._pools.get(n.name),
            active=active, level=True, source=SOURCE,
        )
        # The scheduler's state alone never repairs a node (DESIGN §1 rule zero).
        return a.model_copy(update={"actionable": False, "action": Action.none})

    async def scan_once(self, now: datetime | None = None) -> list[Alert]:
        """One poll; returns the alerts delivered (raise and clear edges)."""
        now = now or datetime.now(UTC)
        nodes = await self.read_nodes()
        sent: list[Alert] = []
        for name, n in sorted(nodes.items()):
            flags = set(n.state)
            ours = n.reason.startswith(REASON_PREFIX)
            bad = bool(flags & WATCHED_FLAGS) and not ours
            if bad and not flags & (WATCHED_FLAGS - {"NOT_RESPONDING"}) and not n.reason:
                # NOT_RESPONDING alone (no reason) flaps for a ping cycle after a resume or
                # a slurmd restart: it counts from its second consecutive sighting.
                if name not in self._unconfirmed:
                    self._unconfirmed.add(name)
                    bad = False
            else:
                self._unconfirmed.discard(name)
            prev = self._open.get(name)
            if bad:
                at = n.reason_time or n.slurmd_start_time or n.boot_time or now
                ep = _Episode(tuple(n.state), n.reason, at)
                if prev == ep:
                    continue
                alert = self._alert(n, ep, True, at)
                await self.sink.submit(alert)
                self._open[name] = ep
                sent.append(alert)
                log.info("event=slurm_node_observed cluster=%s node=%s state=%s reason=%r "
                         "alert_id=%s", self.cluster.name, name, "+".join(ep.state), ep.reason,
                         alert.alert_id)
            elif prev is not None:
                alert = self._alert(n, prev, False, now)
                await self.sink.submit(alert)
                del self._open[name]
                sent.append(alert)
                log.info("event=slurm_node_cleared cluster=%s node=%s", self.cluster.name, name)
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
