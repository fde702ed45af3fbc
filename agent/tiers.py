"""Threshold tiers and straggler self-classification (docs/design.md §1 step 2).

Tiers, best first (exported as ``autorepair.agent.detection_mode``):

* ``fleet``  (3) — a valid threshold with quorum from a push response no older than
  ``fresh_pushes × push_interval``;
* ``cached`` (2) — the last valid fleet threshold, up to ``grace_s`` (default 300 s) old;
* ``local``  (1) — ``local_fraction ×`` the node's own long-run score EMA;
* ``none``   (0) — nothing to compare against (still calibrating, control plane away).

A threshold outside (0, 1) (or not a number) sent with quorum is *invalid*: counted, and the
cached one is kept. ``threshold 0`` without quorum is the ingest's before-quorum shape
(docs/design.md §4.3) and simply means "no fleet threshold".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.config import TierConfig

FLEET = "fleet"
CACHED = "cached"
LOCAL = "local"
NONE = "none"
MODE_CODES = {FLEET: 3, CACHED: 2, LOCAL: 1, NONE: 0}


def parse_quorum(raw: str | None) -> bool:
    """``"true"``/``"1"``/``"yes"`` (any case) → True; anything else False."""
    return raw is not None and raw.strip().lower() in ("true", "1", "yes")


@dataclass
class ThresholdTracker:
    """Keeps the latest fleet threshold and decides the tier.

    Times are monotonic seconds supplied by the caller (testable without sleeping).
    """

    cfg: TierConfig = field(default_factory=TierConfig)
    push_interval_s: float = 10.0

    def __post_init__(self) -> None:
        self.threshold: float | None = None
        self.received_at: float | None = None
        self.invalid_count = 0
        self.last_invalid: str | None = None

    def observe(self, threshold_raw: str | None, quorum_raw: str | None, now: float) -> str:
        """Record one push response's headers/metadata.

        Returns ``"fleet"`` (accepted), ``"no_quorum"``, ``"invalid"`` or ``"absent"``.
        """
        if threshold_raw is None:
            return "absent"
        quorum = parse_quorum(quorum_raw)
        try:
            value = float(threshold_raw)
        except ValueError:
            value = math.nan
        if not quorum and (value == 0.0 or math.isnan(value)):
            return "no_quorum"
        # ingest clamps to [0, 1] (docs/wire-contract.md): 0 with quorum is "no straggler"
        if not math.isfinite(value) or not (0.0 <= value <= 1.0):
            self.invalid_count += 1
            self.last_invalid = threshold_raw
            return "invalid"
        if not quorum:
            return "no_quorum"
        self.threshold = value
        self.received_at = now
        return FLEET

    def current(self, now: float, local_baseline: float | None) -> tuple[str, float | None]:
        """``(mode, threshold)`` for this instant; threshold None only in mode ``none``."""
        if self.threshold is not None and self.received_at is not None:
            age = now - self.received_at
            if age <= self.cfg.fresh_pushes * self.push_interval_s:
                return FLEET, self.threshold
            if age <= self.cfg.grace_s:
                return CACHED, self.threshold
        if local_baseline is not None:
            return LOCAL, self.cfg.local_fraction * local_baseline
        return NONE, None


@dataclass
class StragglerClassifier:
    """Hysteresis: ``enter_count`` evaluations below the threshold start a straggler
    episode; ``exit_count`` evaluations at or above ``threshold + exit_margin`` end it.
    Going idle ends an episode at once (no work, no straggling). Unknown scores and
    missing thresholds leave the counters untouched.
    """

    cfg: TierConfig = field(default_factory=TierConfig)

    def __post_init__(self) -> None:
        self.straggler = False
        self._below = 0
        self._above = 0

    def evaluate(self, score: float | None, threshold: float | None, state: str) -> str | None:
        """Returns ``"start"``, ``"end"`` or None (no change)."""
        if state == "idle":
            self._below = self._above = 0
            if self.straggler:
                self.straggler = False
                return "end"
            return None
        if score is None or threshold is None or state != "active":
            return None
        if not self.straggler:
            self._below = self._below + 1 if score < threshold else 0
            if self._below >= self.cfg.enter_count:
                self.straggler, self._below = True, 0
                return "start"
        else:
            self._above = self._above + 1 if score >= threshold + self.cfg.exit_margin else 0
            if self._above >= self.cfg.exit_count:
                self.straggler, self._above = False, 0
                return "end"
        return None
