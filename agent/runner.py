"""The node agent: sample → score → classify → push (docs/design.md §4.1 ``autorepair-agent run``).

:class:`Agent` ties the samplers (:mod:`agent.nvml`, :mod:`agent.host`,
:mod:`agent.kmsg`), the scorer (:mod:`agent.score`), the tiers (:mod:`agent.tiers`) and the
push (:mod:`agent.otlp`) together. Nothing it reads from the node can crash it: every
sampler failure is caught, reported (structured log line + counters) and the signal is
treated as unknown.

Fault sources and de-duplication: kernel-log records (through ``agent.readers``) are the
primary Xid evidence (they carry the full text). NVML critical-Xid events are emitted
only while the kernel log is unavailable, so one Xid is not reported twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.host import CpuSampler, HostReadError, IbWatcher, memory_available_fraction
from agent.kmsg import KernelLogFollower, KernelSource, PolledSource
from agent.nccl import NcclBuffer, NcclLineReader, nccl_metric
from agent.nvml import GpuBackend, GpuSample, SampleError, canonical_pci
from agent.otlp import (
    SEVERITY_INFO,
    AttrValue,
    Backoff,
    GrpcTransport,
    HttpTransport,
    Pusher,
    PushResult,
    Transport,
    gauge,
    log_record,
    metrics_request,
)
from agent.score import SIGNALS, UNKNOWN, HealthScorer, ScoreResult
from agent.tiers import MODE_CODES, NONE, StragglerClassifier, ThresholdTracker

log = logging.getLogger("autorepair.agent")

#: A persisted baseline older than this is ignored (design choice: a week-old baseline
#: no longer describes the node's workload).
BASELINE_MAX_AGE_S = 7 * 24 * 3600.0
#: How often the baseline is written to disk while running.
SAVE_EVERY_S = 60.0
#: Most NCCL points in one export request: a point is ~170 bytes on the wire (measured:
#: 100,000 points, the default ``nccl_max_points``, serialize to 16.3 MiB), so a request
#: is ~1.7 MiB, well under ingest's default ``ingest.max_body_bytes`` (4 MiB), beyond which
#: a body is refused whole.
NCCL_POINTS_PER_REQUEST = 10_000


GPU_KINDS = frozenset({
    "xid", "sxid", "gpu_lost", "reset_required", "gsp_heartbeat", "gpu_init_failed",
    "uvm_fatal", "nvsmi", "dcgm_diag",
})
"""Kinds whose ``pci`` names an NVIDIA GPU (or NVSwitch): the agent sends it in one form,
:func:`agent.nvml.canonical_pci` (``0000:18:00``, the kernel's Xid line and NVML's
:func:`~agent.nvml.normalise_pci` form), whichever line printed it (``GPU 0000:18:00.0:
… fallen off the bus``, nvidia-smi's ``00000000:18:00.0``), so every fault of one GPU
names it alike (docs/wire-contract.md, ``autorepair.gpu.pci``). Other kinds name
another device (a NIC's PCI function, an AER port), where the function tells two apart:
sent as printed."""


@dataclass(frozen=True)
class Fault:
    """One fault event as it goes on the wire (docs/design.md §4.3).

    ``details`` become ``autorepair.fault.<key>`` attributes. ``pci``: a GPU's address
    in the form of :data:`GPU_KINDS`, another device's as printed.
    """

    kind: str
    text: str
    code: int | None = None
    pci: str | None = None
    active: bool = True
    details: Mapping[str, AttrValue] = field(default_factory=dict)

    @classmethod
    def from_reader(cls, ev: Any, source: str = "kernel_log") -> Fault:
        """From an ``agent.readers.FaultEvent`` (kind, xid, pci, pid, process, summary,
        text, details, level, active); a GPU's address (:data:`GPU_KINDS`) in the one form
        the agent sends (:func:`agent.nvml.canonical_pci`), the reader's as printed."""
        details: dict[str, AttrValue] = {
            "pid": getattr(ev, "pid", None),
            "process": getattr(ev, "process", None),
            "summary": getattr(ev, "summary", None),
            "level": bool(getattr(ev, "level", False)),
            "source": source,
        }
        pci = getattr(ev, "pci", None)
        for k, v in (getattr(ev, "details", None) or {}).items():
            details[str(k)] = v if isinstance(v, str | int | float | bool | list | tuple) else (
                None if v is None else str(v)
            )
        return cls(
            kind=str(ev.kind),
            text=str(getattr(ev, "text", "") or getattr(ev, "summary", "")),
            code=getattr(ev, "xid", None),
            pci=canonical_pci(pci) if str(ev.kind) in GPU_KINDS else pci,
            active=bool(getattr(ev, "active", True)),
            details=details,
        )

    def attributes(self) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {
            "event.name": "autorepair.fault",
            "autorepair.fault.kind": self.kind,
            "autorepair.fault.code": self.code,
            "autorepair.gpu.pci": self.pci,
            "autorepair.fault.active": self.active,
        }
        for k, v in self.details.items():
            if v is not None:
                attrs[f"autorepair.fault.{k}"] = v
        return attrs


def _safe(fn: Callable[[], float]) -> Callable[[], float | None]:
    def read() -> float | None:
        try:
            return fn()
        except (HostReadError, OSError, ValueError) as exc:
            log.debug("event=host_read_failed error=%r", str(exc))
            return None

    return read


class Agent:
    """One node agent.

    Parameters let the simulator and tests plug in the parts: ``backend`` (GPU),
    ``transport`` (default from config: HTTP or gRPC), ``cpu``/``memory`` readers returning
    [0, 1] or None, ``kernel`` (a follower, or None for no kernel log), ``boot_id``,
    ``nccl`` (a source of :class:`agent.nccl.NcclRecord`; default: a follower of
    ``cfg.nccl_trace`` when set).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        *,
        transport: Transport | None = None,
        cpu: Callable[[], float | None] | None = None,
        memory: Callable[[], float | None] | None = None,
        kernel: KernelSource | None = None,
        boot_id: str = "",
        host_id: str | None = None,
        persist: bool = True,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        nccl: PolledSource | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.clock = clock
        self.persist = persist
        if transport is None:
            token = cfg.token_source()
            if cfg.push.transport == "grpc":
                transport = GrpcTransport(
                    cfg.endpoint, token=token, timeout_s=cfg.push.timeout_s,
                    ca_file=cfg.push.ca_file, client_cert=cfg.push.client_cert,
                    client_key=cfg.push.client_key,
                )
            else:
                transport = HttpTransport(
                    cfg.endpoint, token=token, timeout_s=cfg.push.timeout_s,
                    use_gzip=cfg.push.gzip, ca_file=cfg.push.ca_file,
                    client_cert=cfg.push.client_cert, client_key=cfg.push.client_key,
                )
        self.pusher = Pusher(
            transport,
            max_metric_batches=cfg.push.max_metric_batches,
            max_log_records=cfg.push.max_log_records,
            backoff=Backoff(cfg.push.backoff_base_s, cfg.push.backoff_cap_s,
                            rng=random.Random(seed)),
            on_response=self._on_response,
        )
        self.cpu = cpu or _safe(CpuSampler(cfg.proc_root).read)
        self.memory = memory or _safe(lambda: memory_available_fraction(cfg.proc_root))
        self.kernel = kernel
        if nccl is None and cfg.nccl_trace:
            # the kernel log's file follower (rotation, bounded reads) with the NCCL reader
            nccl = KernelLogFollower(cfg.nccl_trace, reader_factory=NcclLineReader,
                                     max_lines=50_000)
        self.nccl = nccl
        self.nccl_buffer = NcclBuffer(cfg.nccl_max_points)
        # announce_first: each port's current state goes out once after start (I20)
        self.ib = (IbWatcher(cfg.infiniband_root, announce_first=True) if cfg.infiniband_root
                   else None)
        self.boot_id = boot_id
        self.host_id = host_id or cfg.host_id
        self.scorer = HealthScorer(cfg.score)
        self.tracker = ThresholdTracker(cfg.tiers, cfg.push_interval_s)
        self.classifier = StragglerClassifier(cfg.tiers)
        self.last: ScoreResult | None = None
        self.mode = NONE
        self.threshold: float | None = None
        self.sample_errors = 0
        self.samples = 0
        self.faults_emitted = 0
        self.straggler_events: list[tuple[str, float | None, float | None]] = []
        self._window: list[ScoreResult] = []
        self._known_pcis: set[str] = set()
        self._level: dict[tuple[str, str], bool] = {}
        #: Level signals whose state this process has emitted (I20: each one's current
        #: state goes out once after start, a clear included).
        self._announced: set[tuple[str, str]] = set()
        self._links: dict[str, set[int]] = {}
        #: Last known state of each part of a GPU's ``nvsmi`` level (``memory``, ``nvlink``).
        self._nvsmi_parts: dict[str, dict[str, bool]] = {}
        self._readable: dict[str, set[str]] = {}
        self._raised_pci: dict[tuple[str, str], str | None] = {}
        self._degraded: set[str] = set()
        self._last_save = 0.0
        self._opened = False

    # ----- identity -------------------------------------------------------------------
    @property
    def resource_attrs(self) -> dict[str, AttrValue]:
        """Resource attributes of docs/design.md §4.3."""
        c = self.cfg
        return {
            "host.name": c.node,
            "host.id": self.host_id,
            "autorepair.host.boot_id": self.boot_id or None,
            "autorepair.cluster.id": c.cluster,
            "k8s.node.name": c.k8s_node_name,
            "autorepair.node_pool": c.node_pool,
            "autorepair.workload_type": c.workload_type,
        }

    # ----- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        """Open the GPU backend (raises ``BackendUnavailable``) and restore the baseline."""
        if not self._opened:
            self.backend.open()
            self._opened = True
            if self.persist:
                self.load_state()

    async def close(self) -> None:
        """Report what the kernel reader still holds (:meth:`KernelSource.finish`), final
        flush attempt, save the baseline, release everything."""
        if self.persist:
            self.save_state()
        if self.kernel is not None:
            try:
                for ev in self.kernel.finish():
                    self.emit_fault(Fault.from_reader(ev))
            except Exception as exc:  # a reader bug: the rest of the shutdown goes on
                log.error("event=kernel_reader_crashed error=%r", repr(exc))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pusher.flush(), timeout=self.cfg.push.timeout_s)
        await self.pusher.transport.aclose()
        if self.kernel is not None:
            self.kernel.close()
        if self.nccl is not None:
            self.nccl.close()
        self.backend.close()
        self._opened = False

    def save_state(self) -> None:
        """Write the baseline atomically to :attr:`AgentConfig.state_path`."""
        path = self.cfg.state_path
        data = {
            "node": self.cfg.node,
            "saved_at": time.time(),
            "scorer": self.scorer.to_state(),
            "threshold": self.tracker.threshold,
            "threshold_age_s": (
                None if self.tracker.received_at is None
                else self.clock() - self.tracker.received_at
            ),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("event=state_save_failed path=%s error=%r", path, exc.strerror)

    def load_state(self) -> bool:
        """Restore a saved baseline (and cached threshold); False when none usable."""
        path = self.cfg.state_path
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            log.warning("event=state_load_failed path=%s error=%r", path, str(exc))
            return False
        saved_at = data.get("saved_at") if isinstance(data, dict) else None
        if not isinstance(saved_at, int | float) or isinstance(saved_at, bool):
            # another agent version's file or a damaged one: start calibrating afresh
            log.warning("event=state_invalid path=%s error=%r", path,
                        "not an object with a numeric saved_at")
            return False
        age = time.time() - float(saved_at)
        if data.get("node") != self.cfg.node or age > BASELINE_MAX_AGE_S:
            log.info("event=state_ignored path=%s age_s=%.0f", path, age)
            return False
        try:
            self.scorer.from_state(data["scorer"])
        except (KeyError, ValueError) as exc:
            log.warning("event=state_invalid path=%s error=%r", path, str(exc))
            return False
        thr, thr_age = data.get("threshold"), data.get("threshold_age_s")
        if isinstance(thr, float) and 0 <= thr <= 1 and isinstance(thr_age, int | float):
            self.tracker.threshold = thr
            self.tracker.received_at = self.clock() - thr_age - age
        log.info("event=state_restored state=%s baseline_samples=%d",
                 self.scorer.state, self.scorer.baseline.n)
        return True

    # ----- sampling -------------------------------------------------------------------
    def sample_once(self) -> ScoreResult:
        """One sampling tick: GPU + host reads, score, fault sources. Never raises."""
        self.samples += 1
        gpus: list[GpuSample] | None
        try:
            gpus = self.backend.sample()
        except SampleError as exc:
            self.sample_errors += 1
            log.warning("event=gpu_read_failed node=%s error=%r", self.cfg.node, str(exc))
            gpus = None
        except Exception as exc:  # a driver/library bug must not kill the agent
            self.sample_errors += 1
            log.error("event=gpu_read_crashed node=%s error=%r", self.cfg.node, repr(exc))
            gpus = None
        result = self.scorer.update(gpus, self.cpu(), self.memory())
        self.last = result
        self._window.append(result)
        if gpus is not None:
            self._check_levels(gpus)
        self._check_degraded(result)
        self._poll_faults()
        self._poll_nccl()
        if self.persist and self.clock() - self._last_save >= SAVE_EVERY_S:
            self._last_save = self.clock()
            self.save_state()
        return result

    def _poll_faults(self) -> None:
        kernel_ok = False
        if self.kernel is not None:
            try:
                for ev in self.kernel.poll():
                    self.emit_fault(Fault.from_reader(ev))
            except Exception as exc:  # reader bug: report, keep sampling
                log.error("event=kernel_reader_crashed error=%r", repr(exc))
            kernel_ok = self.kernel.error is None
        try:
            xids = self.backend.poll_xid_events()
        except Exception as exc:
            log.warning("event=nvml_events_failed error=%r", repr(exc))
            xids = []
        if not kernel_ok:
            for x in xids:
                self.emit_fault(Fault("xid", x.text, code=x.xid, pci=x.pci,
                                      details={"source": "nvml_event"}))
        if self.ib is not None:
            try:
                events = self.ib.poll()
            except (HostReadError, OSError) as exc:
                log.warning("event=ib_read_failed error=%r", str(exc))
                events = []
            owner = self.cfg.rail_owner or self.cfg.node
            for kind, port, flaps in events:
                text = (f"{port.device} port {port.port}: state {port.state} phys_state "
                        f"{port.phys_state} link_downed {port.link_downed}")
                # A port's state read from sysfs is a level fault: ``ib_link_down`` raises
                # it, ``ib_link_up`` (active=False) is its clear.
                self.emit_fault(Fault(kind, text, active=kind == "ib_link_down", details={
                    "device": port.device, "port": port.port, "state": port.state,
                    "phys_state": port.phys_state, "link_downed": port.link_downed,
                    "flaps": flaps, "node": owner, "source": "sysfs", "level": True,
                }))

    def _poll_nccl(self) -> None:
        if self.nccl is None:
            return
        try:
            self.nccl_buffer.extend(self.nccl.poll())
        except Exception as exc:  # a reader bug: report, keep sampling
            log.error("event=nccl_reader_crashed error=%r", repr(exc))

    def _set_level(self, key: tuple[str, str], on: bool | None, fault: Fault) -> None:
        """Emit the raise/clear edge of a level fault when its state changes.

        ``on=None`` means the signal could not be read this sample (a partial NVML read
        failure): the state is *unknown*, so nothing is raised or cleared and the last
        known state stands. Every edge carries ``autorepair.fault.level = true`` so ingest
        treats it as a state with a matching clear, not as a one-off event.

        The first known state of each signal after the agent starts is emitted whatever
        it is (I20): a restarted agent clears what a repair fixed while it was down,
        instead of leaving the control plane with a raise that nothing clears.
        """
        if on is None:
            return
        prev = self._level.get(key, False)
        if on != prev or key not in self._announced:
            self._announced.add(key)
            self._level[key] = on
            # The clear names the device its raise named (a lost GPU is no longer
            # "missing" once it is back), so both edges share one fault identity.
            pci = fault.pci if on else self._raised_pci.pop(key, fault.pci)
            if on:
                self._raised_pci[key] = fault.pci
            self.emit_fault(Fault(fault.kind, fault.text, fault.code, pci, on,
                                  {**fault.details, "level": True}))

    def _check_levels(self, gpus: list[GpuSample]) -> None:
        for g in gpus:
            self._known_pcis.add(g.pci)
            ecc, pending, failure = (g.ecc_uncorrectable_volatile, g.remapped_rows_pending,
                                     g.remapped_rows_failure)
            values = {"ecc": None if ecc is None else ecc > 0, "remap_pending": pending,
                      "remap_failure": failure}
            read_now = {k for k, v in values.items() if v is not None}
            ever = self._readable.setdefault(g.pci, set())
            ever |= read_now
            # Raised when any counter read now says so; cleared only when no counter this
            # GPU reported before failed to read now (a counter the GPU never reports, NVML
            # "not supported", does not block the clear); unknown otherwise.
            memory: bool | None = (
                True if any(values[k] for k in read_now)
                else None if ever - read_now else False)
            seen = self._links.setdefault(g.pci, set())
            seen.update(g.nvlink_active)
            unknown = set(g.nvlink_unknown)
            down = sorted(seen - set(g.nvlink_active) - unknown)
            # A link whose state query failed is unknown, never "down": with any unknown
            # link and none known down the NVLink state is left as it was.
            links: bool | None = True if down else (None if unknown & seen else False)
            # One level signal per GPU: ingest knows a fault as kind:code:device, so the
            # memory and the NVLink state of one GPU are one ``nvsmi`` fault (two signals
            # on one identity let the NVLink clear end a pending-remap or ECC raise). Each
            # part unknown now keeps its last known state; the fault is raised while a
            # part is bad, cleared when both are good, unknown while a part never was known.
            parts = self._nvsmi_parts.setdefault(g.pci, {})
            for part, value in (("memory", memory), ("nvlink", links)):
                if value is not None:
                    parts[part] = value
            known = [parts.get("memory"), parts.get("nvlink")]
            state: bool | None = (
                True if any(k is True for k in known) else None if None in known else False)
            text = (f"NVML {g.pci}: volatile ECC uncorrectable={ecc} "
                    f"remapped rows pending={pending} failure={failure}"
                    + (f"; NVLink links down {down}" if down else ""))
            self._set_level((g.pci, "nvsmi"), state, Fault(
                "nvsmi", text, pci=g.pci, details={
                    "dram_uncorrectable": ecc, "remap_pending": pending,
                    "remap_failure": failure, "nvlink_down": down, "source": "nvml",
                }))
        expected = self.cfg.expected_gpus
        if expected is not None:
            missing = sorted(self._known_pcis - {g.pci for g in gpus})
            lost = len(gpus) < expected
            # a node-level fault: no device in its identity (the missing PCI addresses go
            # in the details), so a restarted agent's clear, which knows nothing of the
            # lost GPU, clears the raise an earlier process sent (I20)
            self._set_level(("node", "gpu_lost"), lost, Fault(
                "gpu_lost",
                f"NVML sees {len(gpus)} GPUs, expected {expected}; missing {missing}",
                pci=None,
                details={"expected": expected, "found": len(gpus), "missing": missing,
                         "source": "nvml"}))

    def _check_degraded(self, result: ScoreResult) -> None:
        now = set(result.degraded)
        for name in sorted(now ^ self._degraded):
            active = name in now
            self.pusher.enqueue_log(self.resource_attrs, log_record(
                f"signal {name} slow EMA {'below' if active else 'back above'} floor "
                f"{self.cfg.score.slow_floor}",
                {"event.name": "autorepair.degradation",
                 "autorepair.degradation.signal": name,
                 "autorepair.degradation.active": active},
                time.time_ns(), SEVERITY_INFO))
        self._degraded = now

    def emit_fault(self, fault: Fault) -> None:
        """Queue a fault log record for the next flush (logs go out as they happen)."""
        self.faults_emitted += 1
        log.info("event=fault node=%s kind=%s code=%s pci=%s active=%s",
                 self.cfg.node, fault.kind, fault.code, fault.pci, fault.active)
        self.pusher.enqueue_log(
            self.resource_attrs, log_record(fault.text, fault.attributes(), time.time_ns())
        )

    # ----- push -----------------------------------------------------------------------
    def _on_response(self, result: PushResult) -> None:
        outcome = self.tracker.observe(result.threshold, result.quorum, self.clock())
        if outcome == "invalid":
            log.warning("event=threshold_invalid node=%s value=%r",
                        self.cfg.node, self.tracker.last_invalid)

    def build_metrics(self) -> list[Any]:
        """Metrics for one push from the samples since the last push (means of known
        values; state of the latest known sample). Clears the window. The NCCL timings
        travel in requests of their own (:meth:`nccl_requests`)."""
        window = [r for r in self._window if r.state != UNKNOWN]
        self._window = []
        now_ns = time.time_ns()
        metrics = [gauge("autorepair.agent.detection_mode", MODE_CODES[self.mode], now_ns,
                         {"autorepair.agent.detection_mode": self.mode})]
        if self.threshold is not None:
            metrics.append(gauge("autorepair.agent.threshold", self.threshold, now_ns,
                                 {"autorepair.agent.detection_mode": self.mode}))
        if not window:
            return metrics
        state = window[-1].state
        scores = [r.score for r in window if r.score is not None]
        if scores:
            metrics.append(gauge("autorepair.node.health_score", sum(scores) / len(scores),
                                 now_ns, {"autorepair.node.state": state}))
        for name in SIGNALS:
            vals = [v for r in window if (v := r.signals.get(name)) is not None]
            if vals:
                metrics.append(gauge(f"autorepair.node.{name}", sum(vals) / len(vals), now_ns))
        return metrics

    def nccl_requests(self) -> list[Any]:
        """The NCCL timings read since the last push, as export requests of at most
        :data:`NCCL_POINTS_PER_REQUEST` points each (takes them from the buffer)."""
        if not len(self.nccl_buffer):
            return []
        records = self.nccl_buffer.take()
        now_ns = time.time_ns()
        n = NCCL_POINTS_PER_REQUEST
        return [metrics_request(self.resource_attrs, [nccl_metric(records[i:i + n], now_ns)])
                for i in range(0, len(records), n)]

    async def push_once(self) -> None:
        """Decide the tier, classify, queue metrics and flush. Never raises."""
        now = self.clock()
        self.mode, self.threshold = self.tracker.current(now, self.scorer.score_baseline)
        window = [r for r in self._window if r.score is not None]
        score = sum(r.score for r in window if r.score is not None) / len(window) if (
            window) else None
        state = window[-1].state if window else (self.last.state if self.last else UNKNOWN)
        change = self.classifier.evaluate(score, self.threshold, state)
        if change is not None:
            self.straggler_events.append((change, score, self.threshold))
            log.info("event=straggler_%s node=%s score=%s threshold=%s mode=%s",
                     change, self.cfg.node, score, self.threshold, self.mode)
            self.pusher.enqueue_log(self.resource_attrs, log_record(
                f"straggler {change}: score {score} threshold {self.threshold} "
                f"mode {self.mode}",
                {"event.name": "autorepair.straggler",
                 "autorepair.straggler.active": change == "start",
                 "autorepair.straggler.score": score,
                 "autorepair.straggler.threshold": self.threshold,
                 "autorepair.agent.detection_mode": self.mode},
                time.time_ns()))
        # the score first, in a request of its own: a body over ingest.max_body_bytes is
        # refused whole, and a push's NCCL points alone can be several MiB
        self.pusher.enqueue_metrics(metrics_request(self.resource_attrs, self.build_metrics()))
        for req in self.nccl_requests():
            self.pusher.enqueue_metrics(req)
        await self.pusher.flush(now)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every ``sample_interval_s``, push every ``push_interval_s``, flush fault
        logs right after the tick that found them, until ``stop`` is set."""
        self.open()
        cfg = self.cfg
        next_sample = next_push = self.clock()
        try:
            while not stop.is_set():
                now = self.clock()
                if now >= next_sample:
                    self.sample_once()
                    next_sample = max(next_sample + cfg.sample_interval_s, now)
                if now >= next_push:
                    await self.push_once()
                    next_push = max(next_push + cfg.push_interval_s, now)
                elif self.pusher.pending[0] or self.pusher.pending[1]:
                    await self.pusher.flush(now)
                delay = max(0.0, min(next_sample, next_push) - self.clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            await self.close()
