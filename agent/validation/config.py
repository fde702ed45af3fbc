"""Configuration of the local validation suite (``autorepair-agent validate``): dataclasses
and PyYAML, no pydantic.

Read from a YAML file (``--config``, or ``AUTOREPAIR_VALIDATE_CONFIG``) whose top level is
the mapping below; every field is optional. A bad value raises
:class:`agent.config.ConfigError` naming the field and the value.

Defaults and their sources are documented field by field. Thresholds that depend on the
site's hardware (NCCL bus bandwidth, InfiniBand rate) default to ``None`` = "measure and
report, no floor"; set them per fleet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.config import ConfigError

#: Check names, in the order the suite runs them.
CHECK_NAMES: tuple[str, ...] = ("gpu", "dcgm", "nccl", "infiniband", "storage")
_LIST_FIELDS = frozenset({"checks", "required", "storage_paths", "nccl_args"})


@dataclass(frozen=True)
class SuiteConfig:
    """Everything the suite needs. Units: seconds, °C, bytes, MB/s (10^6 B/s), GB/s, Gb/s."""

    #: Machine name reported in the result (default: :func:`default_machine`).
    machine: str | None = None
    #: GPU backend (``nvml`` | ``simulated``), chosen explicitly as for the agent.
    backend: str = "nvml"
    #: Expected GPU count; ``None`` = do not compare (count is still reported).
    expected_gpus: int | None = None
    #: Simulated backend: GPUs on the node (8 = an HGX board).
    sim_gpu_count: int = 8
    #: Simulated backend: JSON file with injected faults (fields of
    #: :class:`agent.nvml.SimFaults` plus ``retired_pages_pending``); ``{node}`` in the
    #: path is replaced by the machine name. A missing file means "no fault".
    sim_faults_file: str | None = None
    #: Hottest acceptable GPU temperature at validation time, °C. Engineering choice: below
    #: the ~87-90 °C "GPU Slowdown Temp" that ``nvidia-smi -q`` prints for H100/A100 parts.
    max_temperature_c: float = 85.0
    #: Checks to run (subset of :data:`CHECK_NAMES`).
    checks: tuple[str, ...] = CHECK_NAMES
    #: Checks that must run: when one is skipped the run is *aborted*, never *passed*.
    required: tuple[str, ...] = ("gpu",)
    #: ``dcgmi diag -r N`` level: 1 quick (~1 min), 2 medium (~2 min), 3 long (~15 min)
    #: (NVIDIA DCGM user guide, "Run levels").
    dcgm_level: int = 1
    dcgmi_path: str = "dcgmi"
    #: nccl-tests binary and arguments (nccl-tests README: ``-b`` min size, ``-e`` max size,
    #: ``-f`` factor, ``-g`` GPUs per process; ``{gpus}`` is replaced by the GPU count).
    nccl_binary: str = "all_reduce_perf"
    nccl_args: tuple[str, ...] = ("-b", "8M", "-e", "1G", "-f", "2", "-g", "{gpus}")
    #: Minimum average bus bandwidth, GB/s (site specific; ``None`` = report only).
    nccl_min_busbw_gbps: float | None = None
    #: sysfs root of InfiniBand devices (Linux ``/sys/class/infiniband``).
    ib_root: str = "/sys/class/infiniband"
    #: Expected active IB ports; ``None`` = skip when the node has none.
    ib_expected_ports: int | None = None
    #: Minimum port rate, Gb/s (e.g. 400 for NDR; ``None`` = report only).
    ib_min_rate_gbps: float | None = None
    #: Run a loopback ``ib_write_bw`` per device (perftest) when the binary is present.
    ib_loopback: bool = False
    ib_write_bw: str = "ib_write_bw"
    #: Minimum loopback bandwidth, Gb/s (``None`` = report only).
    ib_min_loopback_gbps: float | None = None
    #: Scratch paths to exercise (write, fsync, read back, compare). Empty = skipped.
    storage_paths: tuple[str, ...] = ()
    #: Bytes written per path (64 MiB: large enough to leave the page-cache fast path
    #: with fsync + fadvise(DONTNEED), small enough to take well under a second on NVMe).
    storage_bytes: int = 64 * 1024 * 1024
    #: Throughput floors, MB/s. Engineering choice: 100 MB/s is ~20x below a datacenter
    #: NVMe drive and catches a degraded/failing disk or a fallback to a network mount.
    storage_min_write_mbps: float = 100.0
    storage_min_read_mbps: float = 100.0
    #: Bound on each external tool (dcgmi, all_reduce_perf, ib_write_bw), seconds.
    tool_timeout_s: float = 1800.0
    #: Largest log excerpt kept per check, characters (keeps workflow histories small).
    max_log_chars: int = 8000

    def __post_init__(self) -> None:
        if self.backend not in ("nvml", "simulated"):
            raise ConfigError(f"backend: must be 'nvml' or 'simulated', got {self.backend!r}")
        for name in self.checks:
            if name not in CHECK_NAMES:
                raise ConfigError(f"checks: unknown check {name!r} (known: {list(CHECK_NAMES)})")
        for name in self.required:
            if name not in CHECK_NAMES:
                raise ConfigError(
                    f"required: unknown check {name!r} (known: {list(CHECK_NAMES)})"
                )
        if self.expected_gpus is not None and self.expected_gpus < 0:
            raise ConfigError(f"expected_gpus: must be >= 0, got {self.expected_gpus!r}")
        if self.sim_gpu_count < 0:
            raise ConfigError(f"sim_gpu_count: must be >= 0, got {self.sim_gpu_count!r}")
        if self.dcgm_level not in (1, 2, 3, 4):
            raise ConfigError(f"dcgm_level: must be 1..4, got {self.dcgm_level!r}")
        if self.storage_bytes <= 0:
            raise ConfigError(f"storage_bytes: must be > 0, got {self.storage_bytes!r}")
        for fname in ("tool_timeout_s", "max_temperature_c"):
            if getattr(self, fname) <= 0:
                raise ConfigError(f"{fname}: must be > 0, got {getattr(self, fname)!r}")
        if self.max_log_chars < 100:
            raise ConfigError(f"max_log_chars: must be >= 100, got {self.max_log_chars!r}")

    @property
    def machine_name(self) -> str:
        """``machine`` or :func:`default_machine`."""
        return self.machine or default_machine()

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> SuiteConfig:
        """Build from parsed YAML; unknown keys and wrong types raise :class:`ConfigError`."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                raise ConfigError(f"validation.{key}: unknown field (value {value!r})")
            if key in _LIST_FIELDS:
                if not isinstance(value, list | tuple) or not all(
                    isinstance(v, str) for v in value
                ):
                    raise ConfigError(
                        f"validation.{key}: expected a list of strings, got {value!r}"
                    )
                value = tuple(value)
            kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"validation: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path | None, **overrides: Any) -> SuiteConfig:
        """Read ``path`` (YAML; ``None`` = defaults), apply non-None ``overrides``.

        Raises :class:`ConfigError` on an unreadable or invalid file.
        """
        data: dict[str, Any] = {}
        if path is not None:
            try:
                loaded = yaml.safe_load(Path(path).read_text()) or {}
            except OSError as exc:
                raise ConfigError(f"config file {str(path)!r}: {exc.strerror}") from exc
            except yaml.YAMLError as exc:
                raise ConfigError(f"config file {str(path)!r}: invalid YAML: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file {str(path)!r}: expected a mapping at the top")
            data.update(loaded)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(data)


def default_machine() -> str:
    """The node this runs on: ``SLURMD_NODENAME`` (inside a Slurm job), ``NODE_NAME``
    (Kubernetes downward API), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def load_sim_faults(path_template: str | None, machine: str) -> dict[str, Any]:
    """Injected faults for the simulated backend (``{}`` when no file).

    Raises :class:`ConfigError` naming the file when it is not a JSON object.
    """
    if not path_template:
        return {}
    path = Path(path_template.replace("{node}", machine))
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"sim_faults_file {str(path)!r}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"sim_faults_file {str(path)!r}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"sim_faults_file {str(path)!r}: expected a JSON object, got {data!r}")
    return data


__all__ = ["CHECK_NAMES", "SuiteConfig", "default_machine", "load_sim_faults"]
