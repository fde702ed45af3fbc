"""GPU sampling backends: real NVML (``nvidia-ml-py``) and a simulated one.

Both implement :class:`GpuBackend`. The backend is chosen explicitly by configuration
(``backend: nvml|simulated``, see :func:`make_backend`); the agent never falls back from
NVML to the simulator silently — an unavailable NVML raises :class:`BackendUnavailable`.

Units: clocks MHz, memory bytes, power watts, temperature °C, utilisation percent.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

#: Clocks-event (throttle) reason bits from nvml.h (NVML_CLOCKS_EVENT_REASON_*).
THROTTLE_GPU_IDLE = 0x1
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
#: Reasons that mean the hardware is holding the GPU back (not idle / app settings).
THROTTLE_HARDWARE_MASK = (
    THROTTLE_HW_SLOWDOWN | THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE
)


class BackendUnavailable(RuntimeError):
    """The configured GPU backend cannot start (e.g. no NVIDIA driver / libnvidia-ml)."""


class SampleError(RuntimeError):
    """One sampling attempt failed; the agent reports the sample as *unknown*."""


@dataclass(frozen=True)
class GpuSample:
    """One GPU's counters at one instant. ``None`` = not supported on this GPU/driver."""

    index: int
    pci: str  # kernel-log form "0000:c6:00" (domain:bus:device, lower case)
    uuid: str
    utilization_pct: float
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float | None
    temperature_c: float | None
    throttle_reasons: int = 0
    ecc_uncorrectable_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_replay_count: int | None = None
    nvlink_active: tuple[int, ...] = ()
    #: Links whose state query failed this sample (an NVML error other than "not
    #: supported"): their state is *unknown*, neither up nor down.
    nvlink_unknown: tuple[int, ...] = ()


#: GPU recovery action codes, nvml.h ``nvmlDeviceGpuRecoveryAction_t`` (read through the
#: field value ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, id 230, R550+ drivers).
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def recovery_action_name(code: int | None) -> str | None:
    """``1`` → ``"gpu_reset"``; ``None`` (not reported) → ``None``; unknown → ``"code_N"``."""
    if code is None:
        return None
    return RECOVERY_ACTIONS.get(code, f"code_{code}")


@dataclass(frozen=True)
class GpuInfo:
    """Identity of one GPU as NVML enumerates it. ``minor`` names ``/dev/nvidia{minor}``."""

    index: int
    pci: str  # kernel-log form "0000:c6:00"
    uuid: str
    minor: int | None


@dataclass(frozen=True)
class GpuState:
    """The state a GPU reset is meant to clear, read from NVML. ``None`` = not reported.

    ``recovery_action``: nvml.h code (see :data:`RECOVERY_ACTIONS`); ``remap_pending`` /
    ``remap_failure``: ``nvmlDeviceGetRemappedRows``; ``ecc_volatile_*``:
    ``nvmlDeviceGetTotalEccErrors(..., NVML_VOLATILE_ECC)`` counts since the last driver
    load or reset.
    """

    recovery_action: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form; ``recovery_action`` by name (``"none"``, ``"gpu_reset"``, …)."""
        return {
            "recovery_action": recovery_action_name(self.recovery_action),
            "remap_pending": self.remap_pending,
            "remap_failure": self.remap_failure,
            "ecc_volatile_corrected": self.ecc_volatile_corrected,
            "ecc_volatile_uncorrected": self.ecc_volatile_uncorrected,
        }


@dataclass(frozen=True)
class NvLinkInfo:
    """NVLink facts of one GPU: active link count and whether a link ends on an NVSwitch
    (``nvmlDeviceGetNvLinkRemoteDeviceType`` = ``NVML_NVLINK_DEVICE_TYPE_SWITCH``)."""

    active_links: int
    to_switch: bool


@dataclass(frozen=True)
class ResetCommandResult:
    """What a GPU reset command did: argv, exit status (``None`` = timed out), output."""

    argv: tuple[str, ...]
    returncode: int | None
    output: str
    duration_s: float


@dataclass(frozen=True)
class XidEvent:
    """A critical Xid reported by NVML's event API (``nvmlEventSetWait``)."""

    pci: str
    xid: int
    text: str


class GpuBackend(Protocol):
    """What the agent needs from a GPU source."""

    name: str

    def open(self) -> None:
        """Initialise; raises :class:`BackendUnavailable`."""

    def sample(self) -> list[GpuSample]:
        """One sample per visible GPU; raises :class:`SampleError` on a failed read."""

    def poll_xid_events(self) -> list[XidEvent]:
        """Critical Xid events since the last call (never blocks); [] when unsupported."""

    def close(self) -> None:
        """Release the library."""


def normalise_pci(bus_id: str | bytes) -> str:
    """``"00000000:C6:00.0"`` → ``"0000:c6:00"`` (the form printed in ``NVRM: Xid`` lines).

    Raises ``ValueError`` naming the value if it is not a PCI bus id.
    """
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    parts = text.strip().lower().split(":")
    if len(parts) != 3:
        raise ValueError(f"pci bus id: expected domain:bus:device.fn, got {text!r}")
    domain, bus, devfn = parts
    return f"{int(domain, 16):04x}:{bus}:{devfn.split('.')[0]}"


_PRINTED_PCI = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9A-Fa-f]{4,8}):)?(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})"
    r"(?:\.[0-7])?$"
)


def canonical_pci(printed: str | None) -> str | None:
    """A GPU address as any reader printed it, in the one form the agent sends for a GPU:
    :func:`normalise_pci`'s kernel-log form ``domain:bus:device``, lower case, no function
    (``"0000:18:00.0"``, ``"00000000:18:00.0"``, ``"0000:18:00"``, ``"18:00.0"``,
    ``"PCI:0000:18:00"`` → ``"0000:18:00"``; a domain of 5+ digits, behind Intel VMD, keeps
    its digits). None stays None; text that is not such an address (the oldest driver's
    two-part ``0003:00``, ``"unknown"``) is returned unchanged. Never raises."""
    if printed is None:
        return None
    m = _PRINTED_PCI.match(printed.strip())
    if m is None:
        return printed
    dom = int(m["dom"], 16) if m["dom"] else 0
    return f"{dom:04x}:{m['bus'].lower()}:{m['dev'].lower()}"


class NvmlBackend:
    """Real NVML through ``pynvml`` (package ``nvidia-ml-py``).

    Per-field ``NVMLError_NotSupported`` gives ``None`` for that field; a failure to
    enumerate devices raises :class:`SampleError` (the sample is *unknown*).
    """

    name = "nvml"

    def __init__(self) -> None:
        self._nvml: Any = None
        self._event_set: Any = None
        self._lock = threading.Lock()

    def open(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - dependency is declared
            raise BackendUnavailable("backend nvml: nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(
                f"backend nvml: NVML not available ({exc}); install the NVIDIA driver or "
                "set backend: simulated explicitly"
            ) from exc
        self._nvml = pynvml
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return
        registered = 0
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
                registered += 1
            except nv.NVMLError:
                continue
        self._event_set = es if registered else None

    def _opt(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _link_state(self, h: Any, link: int) -> bool | str | None:
        """One NVLink's state: True (active), False (inactive), ``"absent"`` (NVML says the
        link does not exist or is not supported), None (the query failed: unknown)."""
        nv = self._nvml
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError as exc:
            absent = tuple(
                c for c in (getattr(nv, "NVMLError_NotSupported", None),
                            getattr(nv, "NVMLError_InvalidArgument", None)) if c is not None
            )
            return "absent" if absent and isinstance(exc, absent) else None
        return bool(state == nv.NVML_FEATURE_ENABLED)

    def sample(self) -> list[GpuSample]:
        nv = self._nvml
        if nv is None:
            raise SampleError("backend nvml: not opened")
        out: list[GpuSample] = []
        try:
            count = nv.nvmlDeviceGetCount()
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                clk_max = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
                pci = normalise_pci(nv.nvmlDeviceGetPciInfo(h).busId)
                uuid = nv.nvmlDeviceGetUUID(h)
                power_mw = self._opt(nv.nvmlDeviceGetPowerUsage, h)
                temp = self._opt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
                reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
                    nv.nvmlDeviceGetCurrentClocksThrottleReasons
                )
                reasons = self._opt(reasons_fn, h) or 0
                ecc = self._opt(
                    nv.nvmlDeviceGetTotalEccErrors,
                    h,
                    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nv.NVML_VOLATILE_ECC,
                )
                remap = self._opt(nv.nvmlDeviceGetRemappedRows, h)
                replay = self._opt(nv.nvmlDeviceGetPcieReplayCounter, h)
                links: list[int] = []
                unknown: list[int] = []
                for link in range(nv.NVML_NVLINK_MAX_LINKS):
                    state = self._link_state(h, link)
                    if state is None:
                        unknown.append(link)
                    elif state is True:
                        links.append(link)
                out.append(
                    GpuSample(
                        index=i,
                        pci=pci,
                        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        utilization_pct=float(util.gpu),
                        sm_clock_mhz=float(clk),
                        sm_clock_max_mhz=float(clk_max),
                        memory_used_bytes=int(mem.used),
                        memory_total_bytes=int(mem.total),
                        power_w=None if power_mw is None else power_mw / 1000.0,
                        temperature_c=None if temp is None else float(temp),
                        throttle_reasons=int(reasons),
                        ecc_uncorrectable_volatile=None if ecc is None else int(ecc),
                        remapped_rows_pending=None if remap is None else bool(remap[2]),
                        remapped_rows_failure=None if remap is None else bool(remap[3]),
                        pcie_replay_count=None if replay is None else int(replay),
                        nvlink_active=tuple(links),
                        nvlink_unknown=tuple(unknown),
                    )
                )
        except nv.NVMLError as exc:
            raise SampleError(f"backend nvml: read failed: {exc}") from exc
        return out

    def poll_xid_events(self) -> list[XidEvent]:
        nv = self._nvml
        if nv is None or self._event_set is None:
            return []
        events: list[XidEvent] = []
        for _ in range(64):  # bounded per call: a storm cannot stall the sampler
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                break
            pci = "unknown"
            try:
                pci = normalise_pci(nv.nvmlDeviceGetPciInfo(data.device).busId)
            except (nv.NVMLError, ValueError):
                pass
            xid = int(data.eventData)
            events.append(XidEvent(pci=pci, xid=xid, text=f"NVML event: Xid {xid} on {pci}"))
        return events

    def close(self) -> None:
        if self._nvml is not None:
            try:
                if self._event_set is not None:
                    self._nvml.nvmlEventSetFree(self._event_set)
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None


@dataclass
class SimFaults:
    """Faults a :class:`SimulatedBackend` currently shows."""

    #: Work-rate multiplier (1.0 healthy; 0.55 a straggler): lowers util and clocks.
    slow_factor: float = 1.0
    ecc_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    lost_gpus: int = 0
    #: Next N sample() calls raise SampleError (a transient NVML outage).
    fail_reads: int = 0
    #: Queries of GPU 0 that fail (NVML error) while the rest of the sample reads fine:
    #: ``ecc`` (volatile uncorrectable count), ``remap`` (remapped rows), ``nvlink``
    #: (every link state). A failed query is reported unknown (``None`` / unknown links).
    failing_queries: set[str] = field(default_factory=set)
    idle: bool = False
    # --- state read by ``autorepair-agent reset-gpu`` (GPU 0 unless a field says) ---
    #: GPU index → pids NVML lists as running compute processes on it.
    gpu_processes: dict[int, list[int]] = field(default_factory=dict)
    #: GPU indices with MIG mode enabled.
    mig_gpus: list[int] = field(default_factory=list)
    #: NVLinks end on NVSwitches (an HGX/DGX baseboard) instead of peer GPUs.
    nvswitch: bool = False
    #: GPU 0's NVML recovery action code (:data:`RECOVERY_ACTIONS`; 1 = GPU reset).
    recovery_action: int = 0
    #: What the simulated ``nvidia-smi -r`` does: ``clears`` (recovery action none, remap
    #: applied, volatile ECC zeroed), ``persists`` (exit 0, state unchanged), ``fails``
    #: (exit 3 "not supported", state unchanged), ``lost`` (exit 0, the GPU never comes
    #: back on the bus).
    reset_outcome: str = "clears"


#: Outcomes :attr:`SimFaults.reset_outcome` accepts.
SIM_RESET_OUTCOMES = ("clears", "persists", "fails", "lost")


#: Nominal H100-SXM figures for synthetic telemetry (NVIDIA H100 datasheet: max SM clock
#: 1980 MHz, 700 W TDP, 80 GB HBM3).
_H100_MAX_MHZ = 1980.0
_H100_MEM = 80 * 1024**3


@dataclass
class SimulatedBackend:
    """Synthetic but plausible GPU telemetry with noise, for tests, the demo and the simulator.

    ``profile`` ``training`` runs GPUs near 97 % busy at a power-capped clock; ``inference``
    varies load around 60 %. ``seed`` makes a run reproducible. Faults are set through
    :attr:`faults` and :meth:`inject_xid`.
    """

    gpu_count: int = 8
    profile: str = "training"
    seed: int | None = None
    pci_base: int = 0x18
    faults: SimFaults = field(default_factory=SimFaults)
    name: str = "simulated"

    def __post_init__(self) -> None:
        if self.gpu_count < 0:
            raise ValueError(f"gpu_count: must be >= 0, got {self.gpu_count!r}")
        if self.profile not in ("training", "inference"):
            raise ValueError(f"profile: must be training|inference, got {self.profile!r}")
        self._rng = random.Random(self.seed)
        self._xids: list[XidEvent] = []
        self._replay = [0] * self.gpu_count
        self._opened = False
        self._gone: set[int] = set()  # GPUs a simulated reset lost from the bus

    def pci_of(self, index: int) -> str:
        """Kernel-log PCI form of simulated GPU ``index``."""
        return f"0000:{self.pci_base + index * 0x10:02x}:00"

    def open(self) -> None:
        self._opened = True

    def inject_xid(self, index: int, xid: int, text: str | None = None) -> None:
        """Queue an NVML-style critical Xid event on GPU ``index``."""
        pci = self.pci_of(index)
        body = text or f"NVML event: Xid {xid} on {pci}"
        self._xids.append(XidEvent(pci=pci, xid=xid, text=body))

    def sample(self) -> list[GpuSample]:
        if not self._opened:
            raise SampleError("backend simulated: not opened")
        f = self.faults
        if f.fail_reads > 0:
            f.fail_reads -= 1
            raise SampleError("backend simulated: injected read failure (NVML outage)")
        rng = self._rng
        out: list[GpuSample] = []
        for i in range(max(0, self.gpu_count - f.lost_gpus)):
            if i in self._gone:
                continue
            if f.idle:
                util, clk = 0.0, 345.0
            elif self.profile == "training":
                util = min(100.0, rng.gauss(97.0, 1.5))
                clk = rng.gauss(1755.0, 25.0)
            else:
                util = min(100.0, max(5.0, rng.gauss(60.0, 12.0)))
                clk = rng.gauss(1850.0, 40.0)
            reasons = THROTTLE_GPU_IDLE if f.idle else THROTTLE_SW_POWER_CAP
            if f.slow_factor < 1.0 and not f.idle:
                util *= f.slow_factor ** 0.5
                clk *= f.slow_factor ** 0.5
                reasons |= THROTTLE_HW_SLOWDOWN
            self._replay[i] += 1 if rng.random() < 0.01 else 0
            out.append(
                GpuSample(
                    index=i,
                    pci=self.pci_of(i),
                    uuid=f"GPU-sim-{self.seed or 0:08x}-{i:04d}",
                    utilization_pct=max(0.0, util),
                    sm_clock_mhz=min(_H100_MAX_MHZ, max(0.0, clk)),
                    sm_clock_max_mhz=_H100_MAX_MHZ,
                    memory_used_bytes=int(_H100_MEM * (0.01 if f.idle else 0.88)),
                    memory_total_bytes=_H100_MEM,
                    power_w=90.0 if f.idle else rng.gauss(640.0, 20.0) * f.slow_factor,
                    temperature_c=rng.gauss(33.0 if f.idle else 64.0, 1.5),
                    throttle_reasons=reasons,
                    ecc_uncorrectable_volatile=(
                        None if i == 0 and "ecc" in f.failing_queries
                        else f.ecc_uncorrectable if i == 0 else 0),
                    remapped_rows_pending=(
                        None if i == 0 and "remap" in f.failing_queries
                        else f.remap_pending if i == 0 else False),
                    remapped_rows_failure=(
                        None if i == 0 and "remap" in f.failing_queries
                        else f.remap_failure if i == 0 else False),
                    pcie_replay_count=self._replay[i],
                    nvlink_active=(
                        () if i == 0 and "nvlink" in f.failing_queries else tuple(range(18))),
                    nvlink_unknown=(
                        tuple(range(18)) if i == 0 and "nvlink" in f.failing_queries else ()),
                )
            )
        return out

    def poll_xid_events(self) -> list[XidEvent]:
        events, self._xids = self._xids, []
        return events

    def close(self) -> None:
        self._opened = False

    def reset_faults(self) -> None:
        """Clear every injected fault (what a reboot does to a simulated node)."""
        self.faults = replace(SimFaults())
        self._xids.clear()
        self._gone.clear()

    # --- the device interface of ``agent.gpureset`` (same methods as NvmlResetDevice) ---

    def _present(self) -> list[int]:
        n = max(0, self.gpu_count - self.faults.lost_gpus)
        return [i for i in range(n) if i not in self._gone]

    def _visible(self) -> list[int]:
        if not self._opened:
            raise SampleError("backend simulated: not opened")
        return self._present()

    def gpus(self) -> list[GpuInfo]:
        """Every visible GPU (index, PCI, UUID, minor = index)."""
        return [
            GpuInfo(i, self.pci_of(i), f"GPU-sim-{self.seed or 0:08x}-{i:04d}", i)
            for i in self._visible()
        ]

    def processes(self, index: int) -> list[int]:
        """Pids planted in :attr:`SimFaults.gpu_processes` for GPU ``index``."""
        procs = {int(k): v for k, v in self.faults.gpu_processes.items()}
        return sorted(int(p) for p in procs.get(index, []))

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """``(current, pending)`` MIG mode; both as planted in :attr:`SimFaults.mig_gpus`."""
        on = index in {int(i) for i in self.faults.mig_gpus}
        return (on, on)

    def nvlink(self, index: int) -> NvLinkInfo:
        """18 active links (an H100 SXM), to NVSwitches when :attr:`SimFaults.nvswitch`."""
        return NvLinkInfo(active_links=18, to_switch=self.faults.nvswitch)

    def architecture(self, index: int) -> str | None:
        """Always ``hopper`` (the simulated board is an H100 HGX)."""
        return "hopper"

    def gpu_state(self, index: int) -> GpuState:
        """GPU 0 carries the planted faults; the others are clean."""
        f = self.faults
        if index != 0:
            return GpuState(0, False, False, 0, 0)
        return GpuState(f.recovery_action, f.remap_pending, f.remap_failure, 0,
                        f.ecc_uncorrectable)

    def simulate_reset(self, pci: str) -> ResetCommandResult:
        """What ``nvidia-smi --gpu-reset -i PCI`` would do here, per
        :attr:`SimFaults.reset_outcome`; only GPU 0 carries faults to clear. Never raises:
        an unknown outcome comes back as exit status 2 naming the field."""
        f = self.faults
        argv = ("simulated-nvidia-smi", "--gpu-reset", "-i", pci)
        if f.reset_outcome not in SIM_RESET_OUTCOMES:
            return ResetCommandResult(
                argv, 2,
                f"reset_outcome: must be one of {SIM_RESET_OUTCOMES}, got {f.reset_outcome!r}",
                0.0,
            )
        index = next((i for i in self._present() if self.pci_of(i) == pci), None)
        if index is None:
            return ResetCommandResult(argv, 6, f"No devices were found matching {pci}", 0.0)
        if f.reset_outcome == "fails":
            return ResetCommandResult(
                argv, 3, f"GPU Reset couldn't run because GPU {pci} is not supported.", 0.0
            )
        if f.reset_outcome == "lost":
            self._gone.add(index)
        elif f.reset_outcome == "clears" and index == 0:
            f.recovery_action = 0
            f.remap_pending = False
            f.ecc_uncorrectable = 0
        return ResetCommandResult(argv, 0, f"GPU {pci} was successfully reset.", 0.0)


def make_backend(
    backend: str, *, gpu_count: int = 8, profile: str = "training", seed: int | None = None
) -> GpuBackend:
    """The backend named by config: ``nvml`` or ``simulated``; never a silent fallback.

    Raises ``ValueError`` naming ``backend`` for any other value.
    """
    if backend == "nvml":
        return NvmlBackend()
    if backend == "simulated":
        return SimulatedBackend(gpu_count=gpu_count, profile=profile, seed=seed)
    raise ValueError(f"backend: must be 'nvml' or 'simulated', got {backend!r}")
