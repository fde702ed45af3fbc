"""Node agent configuration (``agent.yaml``): dataclasses and PyYAML, no pydantic.

The agent is deployed alone on GPU nodes, so it does not use pydantic; every field is
checked here and a bad value raises :class:`ConfigError` naming the field and the value.

Defaults and their sources:

* ``push_interval_s`` 10 s — docs/design.md §5 push interval.
* weights 0.40 / 0.25 / 0.20 / 0.15 — the agent's specified health score (four signals,
  docs/design.md §1 step 1; throughput weighs most).
* ``grace_s`` 300 s — the agent's specified cached tier: the last fleet threshold is used
  for up to 5 minutes (docs/design.md §1 step 2).
* the remaining numbers are this module's engineering choices and are documented where
  they are declared.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from agent.token import TokenFile, TokenFileError

Backend = Literal["nvml", "simulated"]
Transport = Literal["http", "grpc"]


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range.

    The message always names the field (dotted path) and the offending value.
    """


@dataclass(frozen=True)
class ScoreConfig:
    """Health-score parameters (see :mod:`agent.score`)."""

    #: Weights of throughput / compute efficiency / memory headroom / CPU availability
    #: (specified as 0.40 / 0.25 / 0.20 / 0.15; must sum to 1).
    weights: tuple[float, float, float, float] = (0.40, 0.25, 0.20, 0.15)
    #: Weakest-signal degradation zone: below it the score is penalised (design choice:
    #: 0.5 = half of nominal).
    degradation_zone: float = 0.5
    #: Largest penalty (weakest signal at 0 multiplies the score by 1 - 0.5).
    max_penalty: float = 0.5
    #: Throughput-baseline EMA factor per sample (design choice: half-life ≈ 34 samples).
    baseline_alpha: float = 0.02
    #: Active samples before the baseline is trusted (calibrating → active).
    calibration_samples: int = 20
    #: Samples of calibration after idle → resume (baseline kept, re-warmed).
    resume_samples: int = 5
    #: A sample below this fraction of the baseline does not update it once active,
    #: so a slowdown never becomes the new normal (design choice: a 20 % drop is a
    #: straggler-sized change; legitimate workload changes pass through idle, which
    #: re-calibrates).
    stall_gate: float = 0.8
    #: GPU utilisation (percent) at or below which a GPU counts as idle.
    idle_util_pct: float = 5.0
    #: Consecutive idle samples before the node state becomes idle.
    idle_samples: int = 3
    #: Slow EMA factor per signal for degradation warnings (half-life ≈ 69 samples).
    slow_alpha: float = 0.01
    #: Slow-EMA floor per signal: below it a degradation warning starts.
    slow_floor: float = 0.8
    #: Host memory kept free that counts as full headroom (fraction of MemTotal).
    memory_reserve: float = 0.10


@dataclass(frozen=True)
class TierConfig:
    """Threshold tiers and straggler hysteresis (see :mod:`agent.tiers`)."""

    #: Cached tier lifetime after the last fleet threshold (specified: 5 min).
    grace_s: float = 300.0
    #: A fleet threshold is fresh for this many push intervals.
    fresh_pushes: float = 3.0
    #: Local tier threshold = local_fraction × the node's own long-run score EMA.
    local_fraction: float = 0.75
    #: Consecutive evaluations below the threshold before straggler start
    #: (mirrors ingest ``straggler_pushes`` 3).
    enter_count: int = 3
    #: Consecutive evaluations at/above threshold + margin before straggler end.
    exit_count: int = 3
    #: Hysteresis margin added to the threshold for the exit test.
    exit_margin: float = 0.02


@dataclass(frozen=True)
class PushConfig:
    """OTLP push: transport, queues, retry and security."""

    transport: Transport = "http"
    #: Max queued metric export requests (oldest dropped and counted).
    max_metric_batches: int = 60
    #: Max queued log records (oldest dropped and counted).
    max_log_records: int = 2000
    #: Jittered exponential backoff (full jitter) base and cap, seconds.
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    #: Per-request timeout, seconds.
    timeout_s: float = 5.0
    #: Bearer token file (never logged), re-read when it changes (a rotated projected
    #: ServiceAccount token); ``AUTOREPAIR_AGENT_TOKEN`` env overrides.
    token_file: str | None = None
    #: CA bundle to verify the ingest's TLS certificate; client cert/key for mTLS.
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    #: gzip-compress request bodies.
    gzip: bool = False


@dataclass(frozen=True)
class AgentConfig:
    """Everything ``autorepair-agent run`` needs.

    Raises :class:`ConfigError` from :meth:`from_mapping` on bad input.
    """

    endpoint: str
    cluster: str
    node: str
    backend: Backend = "nvml"
    push_interval_s: float = 10.0
    sample_interval_s: float = 2.0
    expected_gpus: int | None = None
    node_pool: str | None = None
    workload_type: Literal["training", "inference"] | None = None
    k8s_node_name: str | None = None
    host_id: str | None = None
    state_dir: str = "/var/lib/autorepair-agent"
    #: Kernel log source: ``/dev/kmsg``, a file path to follow, or ``none``.
    kernel_log: str = "/dev/kmsg"
    #: Host mode: read InfiniBand ports under this sysfs root (None = off).
    infiniband_root: str | None = None
    #: Node that owns the IB rails (host mode); defaults to ``node``.
    rail_owner: str | None = None
    proc_root: str = "/proc"
    #: JSON-lines file of NCCL collective timings an NCCL profiler plugin or a wrapper
    #: appends to (agent.nccl; docs/wire-contract.md); None = off.
    nccl_trace: str | None = None
    #: NCCL points waiting for the next push; beyond it the oldest are dropped and counted.
    nccl_max_points: int = 100_000
    score: ScoreConfig = field(default_factory=ScoreConfig)
    tiers: TierConfig = field(default_factory=TierConfig)
    push: PushConfig = field(default_factory=PushConfig)

    def __post_init__(self) -> None:
        _check_nonempty("endpoint", self.endpoint)
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"endpoint: must start with http:// or https://, got {self.endpoint!r}"
            )
        _check_nonempty("cluster", self.cluster)
        _check_nonempty("node", self.node)
        _check_name("cluster", self.cluster)
        _check_name("node", self.node)
        # resource attributes under the same name rule at ingest (a bad one refuses the
        # whole resource: every push); empty means unset, as ingest reads it
        for name in ("node_pool", "k8s_node_name"):
            value = getattr(self, name)
            if value is not None and value != "":
                if not isinstance(value, str):
                    raise ConfigError(f"{name}: must be a string, got {value!r}")
                _check_name(name, value)
        if self.backend not in ("nvml", "simulated"):
            raise ConfigError(f"backend: must be 'nvml' or 'simulated', got {self.backend!r}")
        _check_positive("push_interval_s", self.push_interval_s)
        _check_positive("sample_interval_s", self.sample_interval_s)
        if self.nccl_max_points < 1:
            raise ConfigError(f"nccl_max_points: must be >= 1, got {self.nccl_max_points!r}")
        if self.nccl_trace is not None and not self.nccl_trace.strip():
            raise ConfigError("nccl_trace: must be a file path or unset, got ''")
        if self.expected_gpus is not None and self.expected_gpus < 1:
            raise ConfigError(f"expected_gpus: must be >= 1 when set, got {self.expected_gpus!r}")
        if self.workload_type not in (None, "training", "inference"):
            raise ConfigError(
                "workload_type: must be 'training' or 'inference', "
                f"got {self.workload_type!r}"
            )
        s = self.score
        if len(s.weights) != 4 or any(w < 0 for w in s.weights):
            raise ConfigError(f"score.weights: need four weights >= 0, got {s.weights!r}")
        if not math.isclose(sum(s.weights), 1.0, abs_tol=1e-6):
            raise ConfigError(f"score.weights: must sum to 1, got {s.weights!r}")
        for name in ("degradation_zone", "max_penalty", "stall_gate", "slow_floor",
                     "memory_reserve"):
            _check_unit(f"score.{name}", getattr(s, name))
        for name in ("baseline_alpha", "slow_alpha"):
            v = getattr(s, name)
            if not (0 < v <= 1):
                raise ConfigError(f"score.{name}: must be in (0, 1], got {v!r}")
        for name in ("calibration_samples", "resume_samples", "idle_samples"):
            if getattr(s, name) < 1:
                raise ConfigError(f"score.{name}: must be >= 1, got {getattr(s, name)!r}")
        t = self.tiers
        _check_positive("tiers.grace_s", t.grace_s)
        _check_positive("tiers.fresh_pushes", t.fresh_pushes)
        _check_unit("tiers.local_fraction", t.local_fraction)
        if t.enter_count < 1 or t.exit_count < 1:
            raise ConfigError(
                f"tiers.enter_count/exit_count: must be >= 1, got {t.enter_count!r}/"
                f"{t.exit_count!r}"
            )
        p = self.push
        if p.transport not in ("http", "grpc"):
            raise ConfigError(f"push.transport: must be 'http' or 'grpc', got {p.transport!r}")
        if p.max_metric_batches < 1 or p.max_log_records < 1:
            raise ConfigError("push.max_metric_batches/max_log_records: must be >= 1, got "
                              f"{p.max_metric_batches!r}/{p.max_log_records!r}")
        _check_positive("push.backoff_base_s", p.backoff_base_s)
        _check_positive("push.backoff_cap_s", p.backoff_cap_s)
        _check_positive("push.timeout_s", p.timeout_s)

    @property
    def state_path(self) -> Path:
        """The baseline state file: ``{state_dir}/agent-state.json``."""
        return Path(self.state_dir) / "agent-state.json"

    def token(self) -> str | None:
        """Bearer token from ``AUTOREPAIR_AGENT_TOKEN`` or ``push.token_file`` (read now).

        Raises :class:`ConfigError` when the token file cannot be read.
        """
        return self.token_source()()

    def token_source(self) -> Callable[[], str | None]:
        """What the transports call before each push for the bearer token: the
        ``AUTOREPAIR_AGENT_TOKEN`` value, else the ``push.token_file`` re-read whenever it
        changes (:class:`agent.token.TokenFile`: a rotated projected ServiceAccount
        token), else no token. Raises :class:`ConfigError` when the file cannot be read."""
        env = os.environ.get("AUTOREPAIR_AGENT_TOKEN")
        if env:
            value = env.strip()
            return lambda: value
        if self.push.token_file is None:
            return lambda: None
        try:
            return TokenFile(self.push.token_file)
        except TokenFileError as exc:
            raise ConfigError(str(exc)) from None

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> AgentConfig:
        """Build from a mapping (parsed YAML); unknown keys are errors.

        Raises :class:`ConfigError` naming the field and value.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"agent config: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        nested: dict[str, Any] = {}
        for key, sub in (("score", ScoreConfig), ("tiers", TierConfig), ("push", PushConfig)):
            raw = data.pop(key, None) or {}
            if not isinstance(raw, dict):
                raise ConfigError(f"{key}: expected a mapping, got {raw!r}")
            if key == "score" and "weights" in raw:
                raw = {**raw, "weights": tuple(raw["weights"])}
            nested[key] = _build(sub, raw, key)
        top = _build_kwargs(cls, data, "")
        try:
            return cls(**top, **nested)
        except TypeError as exc:
            raise ConfigError(f"agent config: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path, **overrides: Any) -> AgentConfig:
        """Read ``path`` (YAML), apply non-None ``overrides`` on top, validate.

        Raises :class:`ConfigError` on unreadable/invalid files or values.
        """
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"config file {str(path)!r}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r}: invalid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r}: expected a mapping at the top")
        return cls.from_mapping(merge(data, overrides))


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the non-None ``overrides`` on top; nested mappings merge key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _build_kwargs(cls: type, raw: dict[str, Any], prefix: str) -> dict[str, Any]:
    names = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(f"{dotted}: unknown field (value {value!r})")
        f = names[key]
        expected = str(f.type)
        if value is None and "None" in expected:
            out[key] = None
            continue
        if "float" in expected and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected.startswith("int") and not (
            isinstance(value, int) and not isinstance(value, bool)
        ):
            raise ConfigError(f"{dotted}: expected an integer, got {value!r}")
        if expected.startswith("float") and not isinstance(value, float):
            raise ConfigError(f"{dotted}: expected a number, got {value!r}")
        if expected == "bool" and not isinstance(value, bool):
            raise ConfigError(f"{dotted}: expected true/false, got {value!r}")
        out[key] = value
    return out


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    return cls(**_build_kwargs(cls, raw, prefix))


#: The wire contract's node and cluster name rule (docs/wire-contract.md; the control
#: plane's ``workflows.names.NAME_PATTERN``, which this package may not import: it ships
#: alone to GPU nodes; a test keeps the two equal). Ingest rejects every push from a
#: resource whose name breaks it, so an agent with such a name refuses to start.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
#: Longest name (RFC 1123: 253 characters), as ``workflows.names.MAX_NAME_LEN``.
MAX_NAME_LEN = 253


def _check_name(name: str, value: str) -> None:
    if len(value) > MAX_NAME_LEN or not re.fullmatch(NAME_PATTERN, value):
        raise ConfigError(
            f"{name}: {value[:64]!r} is not a valid name (letters, digits and ._:@- only, "
            f"starting with a letter or digit, at most {MAX_NAME_LEN} characters); ingest "
            "would reject every push")


def _check_nonempty(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name}: must be a non-empty string, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a finite number > 0, got {value!r}")


def _check_unit(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not (0 <= value <= 1):
        raise ConfigError(f"{name}: must be in [0, 1], got {value!r}")
