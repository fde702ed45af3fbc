"""Node health score in [0, 1] from four signals (docs/design.md §1 step 1).

Signals, each normalised to [0, 1]:

* **throughput_ratio** — the node's work rate ``Σ_gpu util/100 × SM clock`` (MHz-equivalent)
  over its own rolling baseline, a bias-corrected EMA (Adam-style correction
  ``m / (1 - (1-α)^n)``, so early samples are not biased toward 0). Capped at 1.
* **compute_efficiency** — mean ``SM clock / max SM clock`` over busy GPUs (throttling by
  power, thermal or hardware slowdown lowers it).
* **memory_headroom** — host ``MemAvailable/MemTotal`` over the reserve
  (:attr:`ScoreConfig.memory_reserve`, 10 %), capped at 1. GPU memory is sampled but not
  scored: frameworks pre-allocate it (PyTorch caching allocator, vLLM), so "used" says
  nothing about health.
* **cpu_availability** — from :class:`agent.host.CpuSampler` (PSI, /proc/stat fallback).

Score = Σ wᵢ·sᵢ over the signals read (weights renormalised over those), times a penalty
``1 - max_penalty·(zone - weakest)/zone`` when the weakest signal is below the
degradation zone, so one deeply stalled signal is not averaged away.

States: ``calibrating`` (fewer than ``calibration_samples`` baseline samples, or the first
``resume_samples`` busy samples after idle) → ``active`` → ``idle`` (every GPU at or below
``idle_util_pct`` for ``idle_samples`` samples) → ``calibrating`` on resume. A failed GPU read
gives state ``unknown`` and no score: a transient NVML outage never looks like a fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agent.config import ScoreConfig
from agent.nvml import GpuSample

SIGNALS = ("throughput_ratio", "compute_efficiency", "memory_headroom", "cpu_availability")

ACTIVE = "active"
CALIBRATING = "calibrating"
IDLE = "idle"
UNKNOWN = "unknown"


@dataclass
class BiasCorrectedEma:
    """EMA ``m ← (1-α)·m + α·x`` with bias correction ``m / (1 - (1-α)^n)``."""

    alpha: float
    m: float = 0.0
    n: int = 0

    def update(self, x: float) -> None:
        self.m = (1.0 - self.alpha) * self.m + self.alpha * x
        self.n += 1

    @property
    def value(self) -> float | None:
        """The corrected mean, or None before the first sample."""
        if self.n == 0:
            return None
        return self.m / (1.0 - (1.0 - self.alpha) ** self.n)


@dataclass(frozen=True)
class ScoreResult:
    """One scored sample. ``score`` is None exactly when ``state == 'unknown'``."""

    state: str
    score: float | None
    signals: dict[str, float | None]
    raw_throughput: float | None = None
    degraded: tuple[str, ...] = ()


def combine(signals: dict[str, float | None], cfg: ScoreConfig) -> float | None:
    """Weighted score with the weakest-signal penalty; None when no signal was read.

    Example (weights 0.40/0.25/0.20/0.15, zone 0.5, max penalty 0.5): signals
    (0.2, 1, 1, 1) → weighted 0.68, penalty factor 1 - 0.5·0.3/0.5 = 0.7 → 0.476.
    """
    pairs = [
        (w, v) for w, name in zip(cfg.weights, SIGNALS, strict=True)
        if (v := signals.get(name)) is not None
    ]
    total_w = sum(w for w, _ in pairs)
    if not pairs or total_w <= 0:
        return None
    weighted = sum(w * v for w, v in pairs) / total_w
    weakest = min(v for _, v in pairs)
    zone = cfg.degradation_zone
    if zone > 0 and weakest < zone:
        weighted *= 1.0 - cfg.max_penalty * (zone - weakest) / zone
    return max(0.0, min(1.0, weighted))


@dataclass
class HealthScorer:
    """Stateful scorer; feed one sample per sampling interval to :meth:`update`.

    Persist with :meth:`to_state` / :meth:`from_state` so a restart keeps the baseline.
    """

    cfg: ScoreConfig = field(default_factory=ScoreConfig)

    def __post_init__(self) -> None:
        self.baseline = BiasCorrectedEma(self.cfg.baseline_alpha)
        self.score_ema = BiasCorrectedEma(self.cfg.baseline_alpha)
        self.slow = {name: BiasCorrectedEma(self.cfg.slow_alpha) for name in SIGNALS}
        self.state = CALIBRATING
        self._idle_run = 0
        self._resume_left = 0

    @property
    def score_baseline(self) -> float | None:
        """Long-run EMA of the score while active (the local tier's reference)."""
        if self.score_ema.n < self.cfg.calibration_samples:
            return None
        return self.score_ema.value

    def update(
        self,
        gpus: list[GpuSample] | None,
        cpu_availability: float | None,
        mem_available_fraction: float | None,
    ) -> ScoreResult:
        """Score one sample. ``gpus`` None means the GPU read failed (→ ``unknown``).

        ``cpu_availability`` / ``mem_available_fraction`` None mean that read failed; the
        signal is left out (weights renormalised), never counted as low.
        """
        cfg = self.cfg
        empty: dict[str, float | None] = dict.fromkeys(SIGNALS)
        if gpus is None:
            return ScoreResult(UNKNOWN, None, empty)
        busy = [g for g in gpus if g.utilization_pct > cfg.idle_util_pct]
        if not busy:
            self._idle_run += 1
            if self._idle_run >= cfg.idle_samples:
                self.state = IDLE
        else:
            if self.state == IDLE:
                self.state = CALIBRATING
                self._resume_left = cfg.resume_samples
            self._idle_run = 0

        signals = dict(empty)
        raw: float | None = None
        if busy:
            raw = sum(g.utilization_pct / 100.0 * g.sm_clock_mhz for g in gpus)
            base = self.baseline.value
            signals["throughput_ratio"] = 1.0 if not base else min(1.0, raw / base)
            effs = [
                min(1.0, g.sm_clock_mhz / g.sm_clock_max_mhz)
                for g in busy if g.sm_clock_max_mhz > 0
            ]
            signals["compute_efficiency"] = sum(effs) / len(effs) if effs else None
        if mem_available_fraction is not None:
            reserve = cfg.memory_reserve
            signals["memory_headroom"] = (
                1.0 if reserve <= 0 else min(1.0, mem_available_fraction / reserve)
            )
        if cpu_availability is not None:
            signals["cpu_availability"] = max(0.0, min(1.0, cpu_availability))
        score = combine(signals, cfg)

        if busy and raw is not None and self.state != IDLE:
            base = self.baseline.value
            if self.state == CALIBRATING or base is None or raw >= cfg.stall_gate * base:
                self.baseline.update(raw)
            if self.state == CALIBRATING:
                if self._resume_left > 0:
                    self._resume_left -= 1
                if self.baseline.n >= cfg.calibration_samples and self._resume_left == 0:
                    self.state = ACTIVE
            elif score is not None:
                self.score_ema.update(score)

        degraded: tuple[str, ...] = ()
        if self.state == ACTIVE:
            for name, value in signals.items():
                if value is not None:
                    self.slow[name].update(value)
            degraded = tuple(
                name for name in SIGNALS
                if (v := self.slow[name].value) is not None and v < cfg.slow_floor
            )
        return ScoreResult(self.state, score, signals, raw, degraded)

    def to_state(self) -> dict[str, Any]:
        """JSON-able baseline state (EMAs and counters)."""
        return {
            "version": 1,
            "baseline": [self.baseline.m, self.baseline.n],
            "score_ema": [self.score_ema.m, self.score_ema.n],
            "slow": {k: [e.m, e.n] for k, e in self.slow.items()},
        }

    def from_state(self, data: dict[str, Any]) -> None:
        """Restore :meth:`to_state` output; a full baseline starts ``active``.

        Raises ``ValueError`` naming the field when the state is malformed.
        """
        if not isinstance(data, dict):
            raise ValueError(f"state: expected an object, got {type(data).__name__}")
        if data.get("version") != 1:
            raise ValueError(f"state.version: expected 1, got {data.get('version')!r}")
        slow = data.get("slow") or {}
        if not isinstance(slow, dict):
            raise ValueError(f"state.slow: expected an object, got {slow!r}")
        # every field is checked before any is applied: a bad field leaves the scorer as it was
        pairs = [(ema, _pair(data.get(key), f"state.{key}"))
                 for key, ema in (("baseline", self.baseline), ("score_ema", self.score_ema))]
        pairs += [(self.slow[name], _pair(pair, f"state.slow.{name}"))
                  for name, pair in slow.items() if name in self.slow]
        for ema, (m, n) in pairs:
            ema.m, ema.n = m, n
        self.state = (
            ACTIVE if self.baseline.n >= self.cfg.calibration_samples else CALIBRATING
        )


def _pair(value: Any, name: str) -> tuple[float, int]:
    if (
        not isinstance(value, list | tuple) or len(value) != 2
        or not isinstance(value[0], int | float) or not math.isfinite(value[0])
        or not isinstance(value[1], int) or value[1] < 0
    ):
        raise ValueError(f"{name}: expected [mean, count], got {value!r}")
    return float(value[0]), int(value[1])
