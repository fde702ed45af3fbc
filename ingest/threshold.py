"""Straggler threshold engine: score map, robust threshold, server-side classification.

Pure computation (numpy, no I/O, no clock of its own: every call takes ``now`` in
seconds). Usable without the receivers, by the unit tests and ``tests/bench/ingest.py``.

Shape
-----
The score map is keyed by ``(cluster, cohort)``; the cohort is the workload type
(``autorepair.workload_type``: ``training`` / ``inference``; :data:`DEFAULT_COHORT` when a
node sends none). Each cohort keeps its nodes in slot-indexed numpy arrays (score, last
seen, state, consecutive-below/above counters, straggler flag), so one recompute is a
handful of vectorised passes: O(n) per cohort (``np.median`` uses introselect).

Statistics (docs/design.md §5), per cohort, every push interval
---------------------------------------------------------
* Entries not refreshed within ``TTL = push_interval_s × ttl_multiplier`` expire and are
  removed (their slot is reused).
* Only *active* nodes (``autorepair.node.state = active``) enter the median and the MAD,
  and only active nodes count for quorum; *calibrating* and *idle* nodes are counted
  (``calibrating_nodes``, ``idle_nodes``) and count for coverage because they report.
* ``median``, ``MAD = median(|x − median|)`` and the raw threshold
  ``median − k · max(MAD, mad_floor) · 1.4826`` clamped to ``[0, 1]``.
  1.4826 is the consistency constant that makes the MAD estimate the standard deviation
  of normal data (1 / Φ⁻¹(3/4)).
* **MAD = 0** (a flat fleet: all or more than half of the scores equal): the MAD is
  replaced by ``mad_floor`` (config, default 0.01 score units). A flat fleet at 0.95 then
  has the threshold ``0.95 − 2 · 0.01 · 1.4826 ≈ 0.920``: a single node dipping to 0.90
  is still caught, whereas float noise (1e-12) or one-ulp differences never cross it.
  ``max(MAD, mad_floor)`` is continuous, so the threshold does not jump when the MAD
  moves off zero.
* **EMA**: ``T_t = α · raw_t + (1 − α) · T_{t−1}``. Seeding rule: the first *valid*
  threshold (computed with quorum met) seeds the EMA as-is (``T_0 = raw_0``); until then
  the published threshold is 0 and ``quorum_met`` false. When quorum is lost the
  published threshold falls back to 0 but the EMA value is kept, and smoothing resumes
  from it when quorum returns.
* **Quorum**: ``active_nodes ≥ statistical_min`` and coverage not low. **Coverage**:
  when the cluster's expected GPU node count is known (config ``clusters[].gpu_nodes``),
  ``reporting nodes of the cluster / expected < coverage`` sets ``coverage_low``; a
  threshold computed from a small, possibly biased part of the fleet is not published.
* **Panic** (docs/design.md §5): the candidate threshold is computed; if more than
  ``panic_fraction`` (½) of the active nodes are below it, the last good threshold is
  frozen (the EMA does not move), ``panic`` is set, and the caller raises a
  cluster-level alert instead of node alerts. The median-based raw threshold alone can
  never flag more than half of the fleet; the EMA lag can (a fleet-wide drop, e.g. a
  storage outage), which is exactly the case to freeze. Panic ends at the first
  recompute in which at most half of the active nodes are below the candidate.

Server-side straggler classification
-------------------------------------
On every push of an *active* node while the cohort has quorum and is not in panic,
the score is compared with the published threshold: ``straggler_pushes`` consecutive
pushes below it make the node a straggler (:attr:`StragglerEvent.RAISED`),
``recovery_pushes`` consecutive pushes at or above it clear it
(:attr:`StragglerEvent.CLEARED`) — hysteresis, so a node hovering at the threshold does
not flap. Pushes of idle/calibrating nodes reset the below-counter and leave the flag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

import numpy as np
import numpy.typing as npt

from workflows.config import ThresholdConfig

MAD_TO_SIGMA = 1.4826
"""Consistency constant: MAD × 1.4826 estimates σ for normal data (1 / Φ⁻¹(0.75))."""

DEFAULT_COHORT = "default"
"""Cohort of nodes that send no ``autorepair.workload_type``."""

_INITIAL_CAPACITY = 64


class NodeState(IntEnum):
    """Node state of a data point (``autorepair.node.state``); ``EMPTY`` marks a free slot."""

    EMPTY = -1
    ACTIVE = 0
    CALIBRATING = 1
    IDLE = 2

    @classmethod
    def parse(cls, value: str) -> NodeState:
        """``"active" | "calibrating" | "idle"`` (case-insensitive) → state.

        Raises ``ValueError`` naming the field and the value for anything else.
        """
        v = value.strip().lower()
        if v == "active":
            return cls.ACTIVE
        if v == "calibrating":
            return cls.CALIBRATING
        if v == "idle":
            return cls.IDLE
        raise ValueError(
            f"autorepair.node.state: {value!r} is not one of active, calibrating, idle"
        )


class StragglerEvent(StrEnum):
    """Edge of the server-side straggler classification returned by :meth:`ScoreMap.observe`."""

    RAISED = "raised"
    CLEARED = "cleared"


@dataclass(slots=True)
class CohortResult:
    """Outcome of one recompute of one ``(cluster, cohort)``.

    ``threshold`` is the published threshold (0 when ``quorum_met`` is false);
    ``median`` and ``mad`` are NaN when there is no active node. ``computed_at`` is the
    ``now`` given to :meth:`ScoreMap.compute` (seconds, caller's clock).
    """

    cluster: str
    cohort: str
    threshold: float
    quorum_met: bool
    median: float
    mad: float
    raw_threshold: float
    active_nodes: int
    calibrating_nodes: int
    idle_nodes: int
    coverage_low: bool
    panic: bool
    panic_started: bool
    stragglers: int
    flagged: int
    computed_at: float

    def as_api(self) -> dict[str, object]:
        """The ``GET /api/v1/threshold`` body for this cohort (docs/design.md §4.3)."""
        return {
            "threshold": self.threshold if self.quorum_met else 0.0,
            "quorum_met": self.quorum_met,
            "median": None if math.isnan(self.median) else self.median,
            "mad": None if math.isnan(self.mad) else self.mad,
            "active_nodes": self.active_nodes,
            "idle_nodes": self.idle_nodes,
            "calibrating_nodes": self.calibrating_nodes,
            "coverage_low": self.coverage_low,
            "panic": self.panic,
            "stragglers": self.stragglers,
            "computed_at": self.computed_at,
        }


@dataclass(slots=True)
class _Published:
    threshold: float = 0.0
    quorum_met: bool = False
    panic: bool = False


class Cohort:
    """Nodes of one ``(cluster, cohort)`` in slot-indexed numpy arrays.

    Arrays grow by doubling; expired slots go to a free list and are reused.
    """

    __slots__ = (
        "_free",
        "above",
        "below",
        "cluster",
        "cohort",
        "ema",
        "index",
        "last_result",
        "last_seen",
        "names",
        "published",
        "score",
        "state",
        "straggler",
    )

    def __init__(self, cluster: str, cohort: str, capacity: int = _INITIAL_CAPACITY) -> None:
        self.cluster = cluster
        self.cohort = cohort
        self.index: dict[str, int] = {}
        self.names: list[str | None] = [None] * capacity
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self.score: npt.NDArray[np.float64] = np.zeros(capacity, dtype=np.float64)
        self.last_seen: npt.NDArray[np.float64] = np.full(capacity, -np.inf, dtype=np.float64)
        self.state: npt.NDArray[np.int8] = np.full(capacity, NodeState.EMPTY, dtype=np.int8)
        self.below: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.above: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.straggler: npt.NDArray[np.bool_] = np.zeros(capacity, dtype=np.bool_)
        self.ema: float | None = None
        self.published = _Published()
        self.last_result: CohortResult | None = None

    def __len__(self) -> int:
        return len(self.index)

    def _grow(self) -> None:
        old = self.score.size
        new = old * 2
        self.score = np.concatenate([self.score, np.zeros(old)])
        self.last_seen = np.concatenate([self.last_seen, np.full(old, -np.inf)])
        self.state = np.concatenate(
            [self.state, np.full(old, NodeState.EMPTY, dtype=np.int8)]
        )
        self.below = np.concatenate([self.below, np.zeros(old, dtype=np.int32)])
        self.above = np.concatenate([self.above, np.zeros(old, dtype=np.int32)])
        self.straggler = np.concatenate([self.straggler, np.zeros(old, dtype=np.bool_)])
        self.names.extend([None] * old)
        self._free.extend(range(new - 1, old - 1, -1))

    def slot(self, node: str) -> int:
        """Slot of ``node``, allocating one when the node is new."""
        i = self.index.get(node)
        if i is None:
            if not self._free:
                self._grow()
            i = self._free.pop()
            self.index[node] = i
            self.names[i] = node
            self.below[i] = 0
            self.above[i] = 0
            self.straggler[i] = False
        return i

    def remove_slots(self, slots: Iterable[int]) -> list[str]:
        """Free ``slots``; returns the node names removed."""
        removed: list[str] = []
        for i in slots:
            name = self.names[i]
            if name is not None:
                del self.index[name]
                removed.append(name)
            self.names[i] = None
            self.state[i] = NodeState.EMPTY
            self.last_seen[i] = -np.inf
            self.straggler[i] = False
            self._free.append(int(i))
        return removed

    def stragglers(self) -> list[str]:
        """Names of the nodes currently classified as stragglers."""
        return [n for n in (self.names[int(i)] for i in np.flatnonzero(self.straggler)) if n]


def robust_threshold(
    scores: npt.NDArray[np.float64], k: float, mad_floor: float
) -> tuple[float, float, float]:
    """``(median, MAD, raw threshold)`` of ``scores`` (1-D, non-empty, finite, 0..1).

    ``raw = clip(median − k · max(MAD, mad_floor) · 1.4826, 0, 1)``. O(n): two
    selections (``np.median`` partitions, it does not sort). Raises ``ValueError`` on an
    empty array.
    """
    if scores.size == 0:
        raise ValueError("scores: empty array, no median")
    med = float(np.median(scores))
    mad = float(np.median(np.abs(scores - med)))
    raw = med - k * max(mad, mad_floor) * MAD_TO_SIGMA
    return med, mad, min(1.0, max(0.0, raw))


@dataclass(slots=True)
class ObserveResult:
    """What :meth:`ScoreMap.observe` returns to the receiver for the push response."""

    threshold: float
    quorum_met: bool
    event: StragglerEvent | None = None


@dataclass
class ScoreMap:
    """Score map of every cluster and cohort plus the threshold engine.

    ``expected_nodes`` maps a cluster name to its expected GPU node count (0/absent:
    unknown, coverage not checked). Not thread-safe: one event loop owns it.
    """

    config: ThresholdConfig
    expected_nodes: dict[str, int] = field(default_factory=dict)
    cohorts: dict[tuple[str, str], Cohort] = field(default_factory=dict)
    computations: int = 0

    @property
    def ttl_s(self) -> float:
        """Entry TTL in seconds: ``push_interval_s × ttl_multiplier`` (design.md §5: 5 × 10 s)."""
        return self.config.push_interval_s * self.config.ttl_multiplier

    def cohort(self, cluster: str, cohort: str) -> Cohort:
        """The cohort ``(cluster, cohort)``, created empty when new."""
        key = (cluster, cohort)
        c = self.cohorts.get(key)
        if c is None:
            c = Cohort(cluster, cohort)
            self.cohorts[key] = c
        return c

    def observe(
        self,
        cluster: str,
        cohort: str,
        node: str,
        score: float,
        state: NodeState,
        now: float,
    ) -> ObserveResult:
        """Record one validated score push and classify the node.

        ``score`` must already be finite and in ``[0, 1]`` (the receiver rejects the rest);
        ``now`` is the receive time in seconds. A node that moves to another cohort is
        removed from its old one. Returns the cohort's published threshold and quorum
        for the push response, and a straggler edge when one happened on this push.
        """
        c = self.cohort(cluster, cohort)
        if node not in c.index:
            self._evict_elsewhere(cluster, cohort, node)
        i = c.slot(node)
        c.score[i] = score
        c.last_seen[i] = now
        c.state[i] = state
        pub = c.published
        event: StragglerEvent | None = None
        if state != NodeState.ACTIVE:
            c.below[i] = 0
        elif pub.quorum_met and not pub.panic:
            if score < pub.threshold:
                c.above[i] = 0
                c.below[i] += 1
                if not c.straggler[i] and c.below[i] >= self.config.straggler_pushes:
                    c.straggler[i] = True
                    event = StragglerEvent.RAISED
            else:
                c.below[i] = 0
                if c.straggler[i]:
                    c.above[i] += 1
                    if c.above[i] >= self.config.recovery_pushes:
                        c.straggler[i] = False
                        c.above[i] = 0
                        event = StragglerEvent.CLEARED
        return ObserveResult(pub.threshold, pub.quorum_met, event)

    def _evict_elsewhere(self, cluster: str, cohort: str, node: str) -> None:
        for (cl, co), other in self.cohorts.items():
            if cl == cluster and co != cohort and node in other.index:
                other.remove_slots([other.index[node]])

    def reporting_nodes(self, cluster: str) -> int:
        """Nodes of ``cluster`` (any state, any cohort) currently in the map."""
        return sum(len(c) for (cl, _), c in self.cohorts.items() if cl == cluster)

    def compute(self, now: float) -> list[CohortResult]:
        """Expire stale entries and recompute every cohort (see the module docstring).

        ``now`` in seconds on the same clock as :meth:`observe`. Returns one
        :class:`CohortResult` per cohort that still has nodes or a published state;
        cohorts left empty are dropped from the map.
        """
        cutoff = now - self.ttl_s
        for c in list(self.cohorts.values()):
            stale = np.flatnonzero((c.state != NodeState.EMPTY) & (c.last_seen < cutoff))
            if stale.size:
                c.remove_slots(stale.tolist())
        reporting: dict[str, int] = {}
        for (cl, _), c in self.cohorts.items():
            reporting[cl] = reporting.get(cl, 0) + len(c)
        results: list[CohortResult] = []
        for key, c in list(self.cohorts.items()):
            if len(c) == 0:
                del self.cohorts[key]
                continue
            results.append(self._compute_cohort(c, now, reporting.get(c.cluster, 0)))
        self.computations += 1
        return results

    def _compute_cohort(self, c: Cohort, now: float, reporting: int) -> CohortResult:
        cfg = self.config
        state = c.state
        active_mask = state == NodeState.ACTIVE
        scores = c.score[active_mask]
        n = int(scores.size)
        calibrating = int(np.count_nonzero(state == NodeState.CALIBRATING))
        idle = int(np.count_nonzero(state == NodeState.IDLE))
        expected = self.expected_nodes.get(c.cluster, 0)
        coverage_low = expected > 0 and reporting / expected < cfg.coverage
        quorum = n >= cfg.statistical_min and not coverage_low
        median = mad = raw = math.nan
        flagged = 0
        panic = False
        was_panic = c.published.panic
        if n:
            median, mad, raw = robust_threshold(scores, cfg.k, cfg.mad_floor)
        if quorum:
            prev = c.ema
            candidate = raw if prev is None else cfg.ema_alpha * raw + (1 - cfg.ema_alpha) * prev
            candidate = min(1.0, max(0.0, candidate))
            flagged = int(np.count_nonzero(scores < candidate))
            if prev is not None and flagged > cfg.panic_fraction * n:
                panic = True
                threshold = prev
            else:
                c.ema = candidate
                threshold = candidate
            c.published = _Published(threshold, True, panic)
        else:
            threshold = 0.0
            c.published = _Published(0.0, False, False)
        result = CohortResult(
            cluster=c.cluster,
            cohort=c.cohort,
            threshold=threshold,
            quorum_met=quorum,
            median=median,
            mad=mad,
            raw_threshold=raw,
            active_nodes=n,
            calibrating_nodes=calibrating,
            idle_nodes=idle,
            coverage_low=coverage_low,
            panic=panic,
            panic_started=panic and not was_panic,
            stragglers=int(np.count_nonzero(c.straggler)),
            flagged=flagged,
            computed_at=now,
        )
        c.last_result = result
        return result

    def results(self) -> Iterator[CohortResult]:
        """The last :class:`CohortResult` of every cohort that has one."""
        for c in self.cohorts.values():
            if c.last_result is not None:
                yield c.last_result

    def published(self, cluster: str, cohort: str) -> tuple[float, bool]:
        """``(threshold, quorum_met)`` currently published for the cohort (0, False if none)."""
        c = self.cohorts.get((cluster, cohort))
        if c is None:
            return 0.0, False
        return c.published.threshold, c.published.quorum_met
