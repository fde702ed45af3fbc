"""Slurm implementation of :class:`activities.scheduler.base.Scheduler`.

- cordon = ``scontrol update nodename=N state=drain reason="autorepair:<repair_id> <summary>"``
  (the reason carries the repair id, so a retry recognises its own drain);
- idle = no allocation on the node (``DRAINED`` once drained); the running job ids are
  reported while it is ``DRAINING``;
- drain = requeue the jobs still running there (``scontrol requeue``: the Slurm form of
  eviction), wait until ``DRAINED``; after the deadline the remaining job ids are listed
  in a non-retryable ``ERR_DRAIN_DEADLINE`` failure;
- rejoin = ``state=resume`` only while the reason still carries our repair id (a node
  someone else drained or set DOWN is never resumed: the cordon leaves it as it is);
- node health from ``sinfo --json`` where it prints the node document (Slurm 20.11-22.05;
  ``scontrol`` has no ``--json`` there), else from ``scontrol show node`` text (older
  Slurm, and Slurm ≥ 23.02, whose ``sinfo --json`` prints partition/state groups
  without boot times).

Node states are normalised to a base state plus flags, covering the combinations in the
field corpus: ``IDLE+DRAIN``, ``DOWN+DRAIN``, ``MIXED+DRAIN`` (= DRAINING), ``DRAINED``,
``DRAINING``, ``NOT_RESPONDING`` and the ``*``/``~``/``#``/``%``/``$``/``@``/``^``/``!``/``-``
suffixes of ``scontrol``/``sinfo``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.exceptions import ApplicationError

from activities.scheduler.base import Heartbeat, no_heartbeat
from workflows.activity_api import (
    ERR_CONFIGURATION,
    ERR_DRAIN_DEADLINE,
    ERR_UNKNOWN_NODE,
    CordonResult,
    DrainResult,
    IdleStatus,
    NodeHealth,
    RejoinResult,
    permanent,
)
from workflows.config import ClusterConfig

#: Prefix of every reason autorepair writes (``autorepair:<repair_id> <summary>``).
REASON_PREFIX = "autorepair:"
#: Longest summary written into a Slurm reason, characters (keeps ``sinfo -R`` readable).
MAX_SUMMARY = 200
#: Slurm command timeout, seconds (slurmctld answers in milliseconds when healthy).
COMMAND_TIMEOUT_S = 30.0
#: Poll interval while draining, seconds.
DRAIN_POLL_S = 1.0
#: Reasons slurmctld writes on a DOWN node it lost contact with (src/slurmctld/node_mgr.c):
#: the cordon drains such a node like any other; a DOWN node with any other reason was
#: taken out by someone and is left as it is.
SLURM_UNRESPONSIVE_REASONS = frozenset({"Not responding"})

#: ``scontrol``/``sinfo`` state suffix characters and the flag each stands for
#: (Slurm man page sinfo(1), "NODE STATE CODES").
SUFFIX_FLAGS: dict[str, str] = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "!": "POWER_DOWN",
    "-": "PLANNED",
}
#: Base states and the short/long synonyms ``sinfo`` prints for them.
_BASE_SYNONYMS: dict[str, tuple[str, list[str]]] = {
    "IDLE": ("IDLE", []),
    "ALLOC": ("ALLOCATED", []),
    "ALLOCATED": ("ALLOCATED", []),
    "MIX": ("MIXED", []),
    "MIXED": ("MIXED", []),
    "DOWN": ("DOWN", []),
    "UNK": ("UNKNOWN", []),
    "UNKNOWN": ("UNKNOWN", []),
    "FUTURE": ("FUTURE", []),
    "FUTR": ("FUTURE", []),
    "ERROR": ("ERROR", []),
    "COMP": ("IDLE", ["COMPLETING"]),
    "COMPLETING": ("IDLE", ["COMPLETING"]),
    "DRAIN": ("IDLE", ["DRAIN"]),
    "DRAINED": ("IDLE", ["DRAIN"]),
    "DRNG": ("ALLOCATED", ["DRAIN"]),
    "DRAINING": ("ALLOCATED", ["DRAIN"]),
    "FAIL": ("DOWN", ["FAIL"]),
    "FAILING": ("ALLOCATED", ["FAIL"]),
    "MAINT": ("IDLE", ["MAINTENANCE"]),
    "RESV": ("IDLE", ["RESERVED"]),
    "RESERVED": ("IDLE", ["RESERVED"]),
    "INVAL": ("UNKNOWN", ["INVALID_REG"]),
    "PLND": ("IDLE", ["PLANNED"]),
    "PLANNED": ("IDLE", ["PLANNED"]),
}
_BUSY = frozenset({"ALLOCATED", "MIXED"})


def parse_slurm_state(text: str) -> tuple[str, list[str]]:
    """``"IDLE*+DRAIN"`` → ``("IDLE", ["DRAIN", "NOT_RESPONDING"])``.

    Accepts ``scontrol`` states (``BASE+FLAG+...`` with suffix characters) and ``sinfo``
    short/long forms (``drng``, ``drained``, ``down*``, ``idle~``). Raises ``ValueError``
    naming the text when it is empty.
    """
    t = text.strip().upper()
    if not t:
        raise ValueError(f"state: empty Slurm node state {text!r}")
    flags: list[str] = []
    base = ""
    for i, part in enumerate(t.split("+")):
        core = part
        while core and core[-1] in SUFFIX_FLAGS:
            flags.append(SUFFIX_FLAGS[core[-1]])
            core = core[:-1]
        if not core:
            continue
        if i == 0:
            b, extra = _BASE_SYNONYMS.get(core, (core, []))
            base = b
            flags.extend(extra)
        else:
            if core == "DRAINED" or core == "DRAINING":
                core = "DRAIN"
            elif core == "NOT_RESPONDING" or core == "NO_RESPOND":
                core = "NOT_RESPONDING"
            flags.append(core)
    seen: list[str] = []
    for f in flags:
        if f not in seen:
            seen.append(f)
    return base or "UNKNOWN", seen


@dataclass
class SlurmNode:
    """One node as Slurm reports it (normalised)."""

    name: str
    base: str
    flags: list[str] = field(default_factory=list)
    reason: str = ""
    reason_user: str | None = None
    reason_time: datetime | None = None
    boot_time: datetime | None = None
    slurmd_start_time: datetime | None = None

    @property
    def state(self) -> list[str]:
        """Base state then flags, e.g. ``["IDLE", "DRAIN"]``."""
        return [self.base, *self.flags]

    @property
    def drain(self) -> bool:
        """The DRAIN flag is set (DRAINING or DRAINED)."""
        return "DRAIN" in self.flags

    @property
    def allocated(self) -> bool:
        """Jobs hold CPUs/GRES on the node, or are still completing there."""
        return self.base in _BUSY or "COMPLETING" in self.flags

    @property
    def drained(self) -> bool:
        """DRAIN flag and no allocation left (Slurm's DRAINED)."""
        return self.drain and not self.allocated

    @property
    def ready(self) -> bool:
        """Responding, registered and not DOWN/FAIL (drain does not make it unready)."""
        bad = {"NOT_RESPONDING", "INVALID_REG", "FAIL", "POWERED_DOWN", "POWERING_UP"}
        return self.base not in ("DOWN", "UNKNOWN", "FUTURE", "ERROR") and not bad & set(
            self.flags
        )

    def owned_by(self, repair_id: str) -> bool:
        """The reason is ``autorepair:<repair_id>`` (optionally followed by a summary)."""
        tag = f"{REASON_PREFIX}{repair_id}"
        return self.reason == tag or self.reason.startswith(tag + " ")

    @property
    def boot_id(self) -> str | None:
        """Boot identity: ``<BootTime>/<SlurmdStartTime>`` in UTC ISO form.

        Slurm has no boot id; a reboot changes ``BootTime`` and restarts slurmd, but a
        slurmd restart alone changes ``SlurmdStartTime`` too: :meth:`SlurmScheduler.
        node_health` reports it only under ``slurm_boot_identity: slurmd_start``.
        """
        if self.boot_time is None and self.slurmd_start_time is None:
            return None
        parts = [t.isoformat() if t else "-" for t in (self.boot_time, self.slurmd_start_time)]
        return "/".join(parts)


def _epoch(v: object) -> datetime | None:
    if isinstance(v, dict):  # newer Slurm: {"set": true, "number": N}
        v = v.get("number") if v.get("set", True) else None
    if isinstance(v, int | float) and v > 0:
        return datetime.fromtimestamp(v, UTC)
    return None


def sinfo_json_has_nodes(text: str) -> bool:
    """Whether ``sinfo --json`` output is the node document of Slurm 20.11-22.05 (a
    top-level ``nodes`` array). Slurm 23.02 and later (data_parser v0.0.39+) print a
    ``sinfo`` array of partition/state groups instead, without boot times: those are read
    through ``scontrol show node``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("nodes"), list)


def parse_sinfo_json(text: str) -> dict[str, SlurmNode]:
    """Nodes of ``sinfo --json`` output by name (the node document of Slurm 20.11-22.05,
    :func:`sinfo_json_has_nodes`). Raises ``ValueError`` on malformed JSON."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"sinfo --json: not JSON ({e})") from e
    out: dict[str, SlurmNode] = {}
    for n in doc.get("nodes", []):
        raw_state = n.get("state", "")
        if isinstance(raw_state, list):  # Slurm ≥ 23.02 puts base + flags in one list
            joined = "+".join(str(s) for s in raw_state)
        else:
            joined = "+".join([str(raw_state), *[str(f) for f in n.get("state_flags", [])]])
        base, flags = parse_slurm_state(joined or "UNKNOWN")
        out[n["name"]] = SlurmNode(
            name=n["name"],
            base=base,
            flags=flags,
            reason=n.get("reason") or "",
            reason_user=n.get("reason_set_by_user") or None,
            reason_time=_epoch(n.get("reason_changed_at")),
            boot_time=_epoch(n.get("boot_time")),
            slurmd_start_time=_epoch(n.get("slurmd_start_time")),
        )
    return out


_REASON_RE = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^@\]\s]+)@(?P<time>[^\]]+)\]\s*$")


def _local_time(v: str | None) -> datetime | None:
    if not v or v in ("None", "Unknown", "(null)", "N/A"):
        return None
    try:
        return datetime.fromisoformat(v).astimezone(UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class SlurmReservation:
    """One reservation of ``scontrol show reservation``: ``nodes`` expanded from the
    hostlist, each once in the order listed, ``flags`` upper case, times in UTC (None when
    Slurm prints none)."""

    name: str
    nodes: tuple[str, ...]
    flags: frozenset[str]
    start: datetime | None
    end: datetime | None

    @property
    def maint(self) -> bool:
        """A maintenance reservation (``Flags=MAINT``)."""
        return "MAINT" in self.flags


def parse_scontrol_show_reservation(text: str) -> list[SlurmReservation]:
    """Reservations of ``scontrol show reservation`` (multi-line or ``-o``) text; "No
    reservations in the system" gives ``[]``. A record without ``ReservationName=`` is
    skipped; times are read like the node times (Slurm prints the controller's local
    time without a zone: this process's zone is assumed)."""
    from agent.readers.slurm import expand_hostlist

    out: list[SlurmReservation] = []
    for record in re.split(r"\n\s*\n|(?=^ReservationName=)", text.strip(), flags=re.M):
        kv: dict[str, str] = {}
        for tok in record.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv.setdefault(k, v)
        name = kv.get("ReservationName")
        if not name:
            continue
        hosts = kv.get("Nodes", "")
        # a node the hostlist names twice (``gpu-[01-02],gpu-01``) is reserved once: kept
        # at its first place, as a window stores it (MaintenanceWindow.nodes)
        nodes = tuple(dict.fromkeys(expand_hostlist(hosts))) \
            if hosts and hosts != "(null)" else ()
        flags = frozenset(f.strip().upper() for f in kv.get("Flags", "").split(",")
                          if f.strip() and f.strip() != "(null)")
        out.append(SlurmReservation(name=name, nodes=nodes, flags=flags,
                                    start=_local_time(kv.get("StartTime")),
                                    end=_local_time(kv.get("EndTime"))))
    return out


def parse_scontrol_show_node(text: str) -> dict[str, SlurmNode]:
    """Nodes of ``scontrol show node`` (multi-line or ``-o``) text by name.

    The ``Reason=`` value runs to the end of its line and its ``[user@time]`` suffix is
    split off. Raises ``ValueError`` when a record has no ``State=``.
    """
    out: dict[str, SlurmNode] = {}
    for record in re.split(r"\n\s*\n|(?=^NodeName=)", text.strip(), flags=re.M):
        if not record.strip():
            continue
        kv: dict[str, str] = {}
        reason = ""
        for line in record.splitlines():
            body = line.strip()
            rpos = body.find("Reason=")
            if rpos >= 0 and (rpos == 0 or body[rpos - 1] == " "):
                reason = body[rpos + len("Reason="):]
                body = body[:rpos]
            last: str | None = None
            for tok in body.split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    kv[k] = v
                    last = k
                elif last is not None:
                    kv[last] += " " + tok
        if "NodeName" not in kv:
            continue
        if "State" not in kv:
            raise ValueError(f"scontrol show node: record {kv['NodeName']!r} has no State=")
        base, flags = parse_slurm_state(kv["State"])
        user: str | None = None
        rtime: datetime | None = None
        m = _REASON_RE.match(reason)
        if m:
            reason, user, rtime = m["text"], m["user"], _local_time(m["time"])
        out[kv["NodeName"]] = SlurmNode(
            name=kv["NodeName"], base=base, flags=flags, reason=reason.strip(),
            reason_user=user, reason_time=rtime,
            boot_time=_local_time(kv.get("BootTime")),
            slurmd_start_time=_local_time(kv.get("SlurmdStartTime")),
        )
    return out


def parse_node_features(text: str) -> dict[str, list[str]]:
    """Features of each node of ``scontrol show node -o`` text: ``AvailableFeatures=``
    (``Features=`` on Slurm before 17.11), comma separated; ``(null)`` gives none."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        kv: dict[str, str] = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv.setdefault(k, v)
        name = kv.get("NodeName")
        if not name:
            continue
        raw = kv.get("AvailableFeatures", kv.get("Features", ""))
        out[name] = [f for f in raw.split(",") if f and f != "(null)"]
    return out


def feature_domains(features: list[str], prefix: str) -> list[str]:
    """The failure domains ``features`` name (issue 29 item 2): each feature starting
    with ``prefix`` (``policy.domains.slurm_feature_prefix``) names the domain after it
    (``domain=rack7`` → ``rack7``), sorted; an empty rest names none."""
    return sorted({f[len(prefix):] for f in features if f.startswith(prefix)
                   and len(f) > len(prefix)})


class SlurmCommandError(RuntimeError):
    """A Slurm command failed (retryable unless converted to an ``ApplicationError``)."""


class SlurmScheduler:
    """Scheduler backed by the Slurm client commands (``scontrol``, ``sinfo``, ``squeue``).

    ``ClusterConfig.slurm_bin_dir`` names where the commands live (default: ``PATH``) and
    ``ClusterConfig.slurm_conf`` the ``SLURM_CONF`` to use (default: the system one).
    """

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._json: bool | None = None  # sinfo --json supported? (probed on first read)

    # ---- commands ------------------------------------------------------------------
    def _bin(self, name: str) -> str:
        if self.cluster.slurm_bin_dir:
            return os.path.join(self.cluster.slurm_bin_dir, name)
        return name

    async def _run(self, *args: str, check: bool = True) -> tuple[int, str, str]:
        env = dict(os.environ)
        if self.cluster.slurm_conf:
            env["SLURM_CONF"] = self.cluster.slurm_conf
        try:
            proc = await asyncio.create_subprocess_exec(
                self._bin(args[0]), *args[1:], env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError as e:
            raise permanent(
                ERR_CONFIGURATION,
                f"Slurm command {args[0]!r} not found (slurm_bin_dir="
                f"{self.cluster.slurm_bin_dir!r})",
            ) from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmCommandError(f"{args[0]} timed out after {COMMAND_TIMEOUT_S}s") from None
        rc = proc.returncode or 0
        so, se = out.decode(errors="replace"), err.decode(errors="replace")
        if check and rc != 0:
            raise SlurmCommandError(f"{' '.join(args[:3])} rc={rc}: {(se or so).strip()}")
        return rc, so, se

    def _unknown(self, node: str) -> ApplicationError:
        return permanent(
            ERR_UNKNOWN_NODE,
            f"cluster {self.cluster.name}: Slurm has no node {node!r}",
        )

    async def read_node(self, node: str) -> SlurmNode:
        """The node's current Slurm view. Raises non-retryable ``ERR_UNKNOWN_NODE``."""
        if self._json is not False:
            rc, out, err = await self._run("sinfo", "--json", check=False)
            if rc == 0 and sinfo_json_has_nodes(out):
                self._json = True
                nodes = parse_sinfo_json(out)
                if node not in nodes:
                    raise self._unknown(node)
                return nodes[node]
            if rc == 0:
                self._json = False  # Slurm >= 23.02: no node document; scontrol below
            elif ("unrecognized option" in err or "invalid option" in err
                  or "json" in err.lower()):
                self._json = False
            else:
                raise SlurmCommandError(f"sinfo --json rc={rc}: {err.strip()}")
        rc, out, err = await self._run("scontrol", "show", "node", node, check=False)
        if rc != 0:
            if "not found" in (out + err):
                raise self._unknown(node)
            raise SlurmCommandError(f"scontrol show node {node} rc={rc}: {(err or out).strip()}")
        nodes = parse_scontrol_show_node(out)
        if node not in nodes:
            raise self._unknown(node)
        return nodes[node]

    async def jobs_on(self, node: str) -> list[str]:
        """Ids of jobs running, completing, suspended or configuring on ``node``."""
        rc, out, err = await self._run(
            "squeue", "--noheader", f"--nodelist={node}", "--states=R,CG,S,CF",
            "--format=%i", check=False,
        )
        if rc != 0:
            if "Invalid node name" in err:
                raise self._unknown(node)
            raise SlurmCommandError(f"squeue -w {node} rc={rc}: {err.strip()}")
        return [j.strip() for j in out.splitlines() if j.strip()]

    async def _update(self, node: str, *fields: str) -> None:
        rc, out, err = await self._run("scontrol", "update", f"nodename={node}", *fields,
                                       check=False)
        if rc != 0:
            if "not found" in (out + err).lower() or "invalid node name" in (out + err).lower():
                raise self._unknown(node)
            raise SlurmCommandError(f"scontrol update nodename={node} rc={rc}: {err.strip()}")

    # ---- Scheduler -----------------------------------------------------------------
    async def cordon(self, node: str, repair_id: str, reason: str) -> CordonResult:
        """Drain ``node`` with reason ``autorepair:<repair_id> <summary>``; no-op when ours.

        A node already drained with another reason, or DOWN with a reason other than
        Slurm's "Not responding" (:data:`SLURM_UNRESPONSIVE_REASONS`), is left as it is
        with its reason (``by_other=True``): the rejoin then never resumes it.
        """
        n = await self.read_node(node)
        if n.drain:
            if n.owned_by(repair_id):
                return CordonResult(cordoned_by_us=True, detail=f"already drained: {n.reason}")
            other = (
                n.reason.removeprefix(REASON_PREFIX).split(" ", 1)[0] or None
                if n.reason.startswith(REASON_PREFIX)
                else None
            )
            return CordonResult(
                cordoned_by_us=False, by_other=True, held_by_repair=other,
                detail=f"already drained by {n.reason_user or 'someone else'}: {n.reason}",
            )
        if n.base == "DOWN" and n.reason and n.reason not in SLURM_UNRESPONSIVE_REASONS:
            # someone (an admin, a health check, slurmctld for a job it could not kill)
            # took the node DOWN with a reason: draining it would overwrite the reason
            # and make our rejoin resume it, so it stays. A node Slurm merely lost
            # contact with ("Not responding") is drained as usual: that is what a repair
            # fixes, and the drain holds it until the repair has verified it
            return CordonResult(
                cordoned_by_us=False, by_other=True,
                detail=f"node is DOWN, set by {n.reason_user or 'someone else'}: "
                f"{n.reason or 'no reason'} (left as it is)",
            )
        summary = " ".join(reason.split())[:MAX_SUMMARY]
        text = f"{REASON_PREFIX}{repair_id} {summary}".strip()
        await self._update(node, "state=drain", f"reason={text}")
        return CordonResult(cordoned_by_us=True, detail=f"drained: {text}")

    async def check_idle(self, node: str) -> IdleStatus:
        """Idle = no allocation on the node; ``running`` lists the job ids still there."""
        n = await self.read_node(node)
        jobs = await self.jobs_on(node)
        return IdleStatus(idle=not jobs and not n.allocated, running=jobs)

    async def drain(
        self, node: str, repair_id: str, deadline_s: float, heartbeat: Heartbeat = no_heartbeat
    ) -> DrainResult:
        """Requeue the jobs left on ``node`` and wait until it is DRAINED.

        Requires the node drained (by this repair or by someone else: the jobs must go
        either way); an undrained node is drained with this repair's reason first.
        Heartbeats ``{"running": [job ids]}`` every poll. Raises non-retryable
        ``ERR_DRAIN_DEADLINE`` listing the remaining job ids after ``deadline_s``.
        """
        n = await self.read_node(node)
        if not n.drain:
            await self.cordon(node, repair_id, "drain")
        deadline = time.monotonic() + deadline_s
        requeued: set[str] = set()
        while True:
            n = await self.read_node(node)
            jobs = await self.jobs_on(node)
            if not jobs and not n.allocated:
                return DrainResult(
                    drained=True,
                    detail=f"requeued {sorted(requeued)}" if requeued else "no jobs left",
                )
            for job in jobs:
                if job not in requeued:
                    rc, _, err = await self._run("scontrol", "requeue", job, check=False)
                    requeued.add(job)  # a job Slurm refuses to requeue is not retried
                    if rc != 0:
                        heartbeat({"job": job, "requeue_refused": err.strip()})
            heartbeat({"running": jobs})
            if time.monotonic() >= deadline:
                raise permanent(
                    ERR_DRAIN_DEADLINE,
                    f"cluster {self.cluster.name} node {node}: jobs still running after the "
                    f"{deadline_s:.0f}s drain deadline: {', '.join(jobs)}",
                    DrainResult(drained=False, remaining=jobs).model_dump(),
                )
            await asyncio.sleep(DRAIN_POLL_S)

    async def rejoin(self, node: str, repair_id: str) -> RejoinResult:
        """Resume ``node`` only while its reason carries ``repair_id``; someone else's drain
        stays."""
        n = await self.read_node(node)
        if n.drain:
            if not n.owned_by(repair_id):
                return RejoinResult(
                    uncordoned=False,
                    kept_reason=f"drained by {n.reason_user or 'someone else'}: {n.reason}",
                )
            await self._update(node, "state=resume")
            return RejoinResult(uncordoned=True)
        if n.base == "DOWN":
            return RejoinResult(
                uncordoned=False,
                kept_reason=f"node is DOWN ({n.reason or 'no reason'}), not drained by "
                f"repair {repair_id}",
            )
        return RejoinResult(uncordoned=True)  # already schedulable (a retried rejoin)

    async def node_health(self, node: str) -> NodeHealth:
        """Readiness, ``[base, flags...]``, boot identity, reason.

        The boot is ``BootTime`` alone (compared with slack,
        :meth:`NodeHealth.rebooted_since`), or with ``slurm_boot_identity:
        slurmd_start`` the exact ``SlurmdStartTime`` (a slurmd restart reads as a reboot:
        the dev cluster's simulated reboots; a real reboot restarts slurmd too). Not
        ``BootTime`` there: slurmctld recomputes it as now − uptime at every slurmd
        registration, so it moves by a second without any reboot (``BOOT_TIME_JITTER_S``);
        ``BootTime/SlurmdStartTime`` when Slurm gives no start time."""
        n = await self.read_node(node)
        boot_id = None
        if self.cluster.slurm_boot_identity == "slurmd_start":
            boot_id = (n.slurmd_start_time.isoformat() if n.slurmd_start_time is not None
                       else n.boot_id)
        return NodeHealth(
            ready=n.ready, state=n.state, boot_id=boot_id, boot_time=n.boot_time,
            reason=n.reason,
        )

    async def node_names(self) -> list[str]:
        """Names of every node ``scontrol show node`` lists (the cluster's inventory).
        Raises :class:`SlurmCommandError` when the command fails."""
        _, out, _ = await self._run("scontrol", "show", "node")
        return sorted(parse_scontrol_show_node(out))

    async def node_domains(self, label_keys: list[str], prefix: str) -> dict[str, list[str]]:
        """node → its failure domains from the node features (:func:`feature_domains`;
        ``label_keys`` is Kubernetes's and unused here); nodes with none are left out.
        Raises :class:`SlurmCommandError` when ``scontrol`` fails."""
        _, out, _ = await self._run("scontrol", "show", "node", "-o")
        found = {n: feature_domains(fs, prefix) for n, fs in parse_node_features(out).items()}
        return {n: ds for n, ds in sorted(found.items()) if ds}

    async def close(self) -> None:
        """Nothing to release (commands are one-shot)."""
        return None
