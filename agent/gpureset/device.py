"""What ``reset-gpu`` needs from NVML: :class:`ResetDevice`, implemented by
:class:`NvmlResetDevice` (real NVML through ``nvidia-ml-py``) and by
:class:`agent.nvml.SimulatedBackend` (tests, demo).

NVML is opened for the checks and the read-back only: the process must close it before
``nvidia-smi --gpu-reset`` runs, because an NVML client holds the GPU's device node and
nvidia-smi(1) refuses a reset while any application ("monitoring application like other
instance of nvidia-smi") uses the device.
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.nvml import (
    BackendUnavailable,
    GpuInfo,
    GpuState,
    NvLinkInfo,
    SampleError,
    normalise_pci,
)

#: nvml.h ``NVML_DEVICE_ARCH_*`` codes → names; codes below 7 (Ampere) cannot reset one
#: NVLink-connected GPU alone (nvidia-smi(1), ``--gpu-reset``).
ARCHITECTURES: dict[int, str] = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
    8: "ada", 9: "hopper", 10: "blackwell", 13: "rubin",
}
#: Architecture order, oldest first (for "pre-Ampere" decisions on names).
ARCH_ORDER: tuple[str, ...] = (
    "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper",
    "blackwell", "rubin",
)


class ResetDevice(Protocol):
    """NVML as ``reset-gpu`` uses it. ``open`` raises :class:`BackendUnavailable`;
    enumeration failures raise :class:`SampleError`; optional reads give ``None``."""

    name: str

    def open(self) -> None:
        """Initialise NVML (again, after a reset)."""

    def close(self) -> None:
        """Shut NVML down (releases this process's hold on the device nodes)."""

    def gpus(self) -> list[GpuInfo]:
        """Every GPU NVML can open, in index order."""

    def processes(self, index: int) -> list[int] | None:
        """Pids NVML lists on GPU ``index`` (compute, graphics, MPS); ``None`` = cannot list."""

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """``(current, pending)`` MIG mode enabled; ``None`` where MIG is not supported."""

    def nvlink(self, index: int) -> NvLinkInfo:
        """Active NVLinks of GPU ``index`` and whether one ends on an NVSwitch."""

    def architecture(self, index: int) -> str | None:
        """``"ampere"``, ``"hopper"``, …; ``None`` when NVML does not say."""

    def gpu_state(self, index: int) -> GpuState:
        """Recovery action, remap flags, volatile ECC counts of GPU ``index``."""


def find_gpu(device: ResetDevice, pci: str) -> GpuInfo | None:
    """The GPU at kernel-log PCI address ``pci`` (``"0000:c6:00"``), or ``None``.
    Raises :class:`SampleError` when NVML cannot enumerate."""
    return next((g for g in device.gpus() if g.pci == pci), None)


class NvmlResetDevice:
    """:class:`ResetDevice` over ``pynvml``. Handles are looked up per call (by index), so
    a re-initialised NVML after a reset is used without stale handles."""

    name = "nvml"

    def __init__(self) -> None:
        self._nv: Any = None

    def open(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - dependency is declared
            raise BackendUnavailable("backend nvml: nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"backend nvml: NVML not available ({exc})") from exc
        self._nv = pynvml

    def close(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
            self._nv = None

    def _handle(self, index: int) -> Any:
        if self._nv is None:
            raise SampleError("backend nvml: not opened")
        try:
            return self._nv.nvmlDeviceGetHandleByIndex(index)
        except self._nv.NVMLError as exc:
            raise SampleError(f"backend nvml: GPU {index}: {exc}") from exc

    def _opt(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (self._nv.NVMLError, AttributeError):
            return None

    def gpus(self) -> list[GpuInfo]:
        nv = self._nv
        if nv is None:
            raise SampleError("backend nvml: not opened")
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise SampleError(f"backend nvml: cannot count GPUs: {exc}") from exc
        out: list[GpuInfo] = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                pci = normalise_pci(nv.nvmlDeviceGetPciInfo(h).busId)
                uuid = nv.nvmlDeviceGetUUID(h)
            except (nv.NVMLError, ValueError):
                continue  # a GPU NVML cannot open is not one we can reset
            minor = self._opt(nv.nvmlDeviceGetMinorNumber, h)
            out.append(GpuInfo(i, pci, uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                               None if minor is None else int(minor)))
        return out

    def processes(self, index: int) -> list[int] | None:
        nv, h = self._nv, self._handle(index)
        pids: set[int] = set()
        listed = False
        for fname in ("nvmlDeviceGetComputeRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses",
                      "nvmlDeviceGetMPSComputeRunningProcesses"):
            fn = getattr(nv, fname, None)
            if fn is None:
                continue
            procs = self._opt(fn, h)
            if procs is None:
                continue
            listed = True
            pids.update(int(p.pid) for p in procs)
        return sorted(pids) if listed else None

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        nv = self._nv
        mode = self._opt(nv.nvmlDeviceGetMigMode, self._handle(index))
        if mode is None:
            return None
        enable = nv.NVML_DEVICE_MIG_ENABLE
        return (mode[0] == enable, mode[1] == enable)

    def nvlink(self, index: int) -> NvLinkInfo:
        nv, h = self._nv, self._handle(index)
        active, to_switch = 0, False
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            if self._opt(nv.nvmlDeviceGetNvLinkState, h, link) != nv.NVML_FEATURE_ENABLED:
                continue
            active += 1
            remote = self._opt(nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if remote == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                to_switch = True
        return NvLinkInfo(active, to_switch)

    def architecture(self, index: int) -> str | None:
        code = self._opt(self._nv.nvmlDeviceGetArchitecture, self._handle(index))
        return None if code is None else ARCHITECTURES.get(int(code))

    def _recovery_action(self, h: Any) -> int | None:
        nv = self._nv
        fid = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if fid is None:
            return None  # an older binding without the field
        values = self._opt(nv.nvmlDeviceGetFieldValues, h, [fid])
        if not values or values[0].nvmlReturn != nv.NVML_SUCCESS:
            return None  # an older driver, or the GPU does not report it
        v = values[0]
        member = {nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                  nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
                  nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                  nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
                  nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}.get(v.valueType, "uiVal")
        return int(getattr(v.value, member))

    def gpu_state(self, index: int) -> GpuState:
        nv, h = self._nv, self._handle(index)
        remap = self._opt(nv.nvmlDeviceGetRemappedRows, h)
        corr = self._opt(nv.nvmlDeviceGetTotalEccErrors, h,
                         nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        unc = self._opt(nv.nvmlDeviceGetTotalEccErrors, h,
                        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        return GpuState(
            recovery_action=self._recovery_action(h),
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            ecc_volatile_corrected=None if corr is None else int(corr),
            ecc_volatile_uncorrected=None if unc is None else int(unc),
        )
