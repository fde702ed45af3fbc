"""Threshold engine against hand-computed values, plus robustness properties (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.threshold import (
    MAD_TO_SIGMA,
    NodeState,
    ScoreMap,
    StragglerEvent,
    robust_threshold,
)
from workflows.config import ThresholdConfig

A = NodeState.ACTIVE


def smap(**kw: object) -> ScoreMap:
    return ScoreMap(ThresholdConfig(**kw))  # type: ignore[arg-type]


def feed(m: ScoreMap, scores: dict[str, float], now: float, *, cluster: str = "c",
         cohort: str = "training", state: NodeState = A) -> None:
    for node, s in scores.items():
        m.observe(cluster, cohort, node, s, state, now)


def test_hand_computed_threshold() -> None:
    # scores 0.90 0.92 0.94 0.96 0.98: median 0.94, |dev| 0.04 0.02 0 0.02 0.04 → MAD 0.02
    # threshold = 0.94 − 2 · 0.02 · 1.4826 = 0.880696
    m = smap()
    feed(m, {f"n{i}": v for i, v in enumerate([0.90, 0.92, 0.94, 0.96, 0.98])}, 100.0)
    (r,) = m.compute(100.0)
    assert r.median == pytest.approx(0.94)
    assert r.mad == pytest.approx(0.02)
    assert r.threshold == pytest.approx(0.94 - 2 * 0.02 * 1.4826)
    assert r.quorum_met and r.active_nodes == 5 and not r.panic
    assert MAD_TO_SIGMA == 1.4826


def test_mad_zero_flat_fleet_catches_single_dip_not_float_noise() -> None:
    m = smap()
    fleet = {f"n{i}": 0.95 for i in range(9)}
    fleet["n9"] = 0.95 + 1e-12  # float noise
    feed(m, fleet, 0.0)
    (r,) = m.compute(0.0)
    assert r.mad == pytest.approx(0.0, abs=1e-11)
    # MAD floored at mad_floor = 0.01: threshold = 0.95 − 2 · 0.01 · 1.4826 = 0.920348
    assert r.threshold == pytest.approx(0.95 - 2 * 0.01 * 1.4826)
    assert 0.95 - 1e-9 > r.threshold  # noise never crosses
    # a single dip to 0.90 is below the threshold and becomes a straggler after 3 pushes
    events = []
    for t in (1.0, 2.0, 3.0):
        feed(m, {f"n{i}": 0.95 for i in range(9)}, t)
        events.append(m.observe("c", "training", "n9", 0.90, A, t).event)
    assert events == [None, None, StragglerEvent.RAISED]


def test_one_node_has_no_quorum() -> None:
    m = smap()
    feed(m, {"solo": 0.5}, 0.0)
    (r,) = m.compute(0.0)
    assert not r.quorum_met and r.threshold == 0.0
    assert r.median == 0.5 and r.mad == 0.0 and r.active_nodes == 1
    assert r.as_api()["threshold"] == 0.0
    assert m.published("c", "training") == (0.0, False)


def test_exactly_statistical_min_nodes_meets_quorum() -> None:
    m = smap(statistical_min=5)
    feed(m, {f"n{i}": 0.9 for i in range(4)}, 0.0)
    assert not m.compute(0.0)[0].quorum_met
    feed(m, {"n4": 0.9}, 1.0)
    assert m.compute(1.0)[0].quorum_met


def test_idle_and_calibrating_nodes_excluded_from_stats_and_quorum() -> None:
    m = smap()
    feed(m, {f"a{i}": 0.9 for i in range(4)}, 0.0)
    feed(m, {"i0": 0.1, "i1": 0.1}, 0.0, state=NodeState.IDLE)
    feed(m, {"k0": 0.2}, 0.0, state=NodeState.CALIBRATING)
    (r,) = m.compute(0.0)
    assert r.active_nodes == 4 and r.idle_nodes == 2 and r.calibrating_nodes == 1
    assert not r.quorum_met  # idle nodes do not count for quorum
    assert r.median == 0.9  # idle 0.1 scores did not pull the median


def test_expiry_after_ttl() -> None:
    m = smap(push_interval_s=10, ttl_multiplier=5)  # TTL 50 s
    feed(m, {f"n{i}": 0.9 for i in range(5)}, 0.0)
    feed(m, {"late": 0.9}, 30.0)
    assert m.compute(50.0)[0].active_nodes == 6  # exactly TTL old: kept
    (r,) = m.compute(50.1)
    assert r.active_nodes == 1 and not r.quorum_met
    assert set(m.cohorts[("c", "training")].index) == {"late"}
    assert m.compute(80.1) == [] and not m.cohorts  # empty cohorts are dropped


def test_cohort_and_cluster_separation() -> None:
    m = smap()
    feed(m, {f"t{i}": 0.9 for i in range(5)}, 0.0, cohort="training")
    feed(m, {f"i{i}": 0.5 for i in range(5)}, 0.0, cohort="inference")
    feed(m, {f"x{i}": 0.7 for i in range(5)}, 0.0, cluster="other", cohort="training")
    res = {(r.cluster, r.cohort): r for r in m.compute(0.0)}
    assert res[("c", "training")].median == 0.9
    assert res[("c", "inference")].median == 0.5
    assert res[("other", "training")].median == 0.7
    # a node that changes cohort leaves its old one
    m.observe("c", "inference", "t0", 0.5, A, 1.0)
    assert "t0" not in m.cohorts[("c", "training")].index


def test_ema_seeded_by_first_valid_threshold() -> None:
    m = smap(ema_alpha=0.2)
    feed(m, {f"n{i}": 0.9 for i in range(3)}, 0.0)
    assert m.compute(0.0)[0].threshold == 0.0  # no quorum: nothing seeded
    feed(m, {f"n{i}": v for i, v in enumerate([0.90, 0.92, 0.94, 0.96, 0.98])}, 1.0)
    t0 = m.compute(1.0)[0].threshold
    assert t0 == pytest.approx(0.94 - 2 * 0.02 * MAD_TO_SIGMA)  # seed = raw
    feed(m, {f"n{i}": v for i, v in enumerate([0.91, 0.93, 0.95, 0.97, 0.99])}, 2.0)
    raw1 = 0.95 - 2 * 0.02 * MAD_TO_SIGMA
    assert m.compute(2.0)[0].threshold == pytest.approx(0.2 * raw1 + 0.8 * t0)


def test_panic_freezes_threshold() -> None:
    m = smap(ema_alpha=0.2)
    feed(m, {f"n{i}": 0.95 for i in range(10)}, 0.0)
    good = m.compute(0.0)[0].threshold
    # fleet-wide drop (storage outage): all nodes to 0.5 → candidate = 0.2·raw + 0.8·good
    # is above 0.5 → 10/10 flagged > half → panic, threshold frozen at the last good one
    feed(m, {f"n{i}": 0.5 for i in range(10)}, 1.0)
    (r,) = m.compute(1.0)
    assert r.panic and r.panic_started and r.flagged == 10
    assert r.threshold == pytest.approx(good)
    # no node straggler edges while in panic
    for t in (2.0, 3.0, 4.0):
        assert m.observe("c", "training", "n0", 0.5, A, t).event is None
    (r2,) = m.compute(5.0)
    assert r2.panic and not r2.panic_started
    # recovery: fleet back up → panic ends, EMA resumes
    feed(m, {f"n{i}": 0.95 for i in range(10)}, 6.0)
    (r3,) = m.compute(6.0)
    assert not r3.panic


def test_coverage_low_blocks_quorum() -> None:
    m = ScoreMap(ThresholdConfig(coverage=0.8), expected_nodes={"c": 10})
    feed(m, {f"n{i}": 0.9 for i in range(7)}, 0.0)
    (r,) = m.compute(0.0)
    assert r.coverage_low and not r.quorum_met
    feed(m, {"n7": 0.9}, 0.0)
    (r,) = m.compute(0.0)
    assert not r.coverage_low and r.quorum_met


def test_straggler_hysteresis() -> None:
    m = smap(straggler_pushes=2, recovery_pushes=3)
    healthy = {f"n{i}": 0.95 for i in range(9)}
    feed(m, {**healthy, "s": 0.95}, 0.0)
    m.compute(0.0)
    thr = m.published("c", "training")[0]
    ev = [m.observe("c", "training", "s", 0.5, A, t).event for t in (1, 2)]
    assert ev == [None, StragglerEvent.RAISED]
    assert m.cohorts[("c", "training")].stragglers() == ["s"]
    # one good push, then bad again: counter resets, no clear
    assert m.observe("c", "training", "s", thr + 0.01, A, 3).event is None
    assert m.observe("c", "training", "s", 0.5, A, 4).event is None
    ev = [m.observe("c", "training", "s", 0.95, A, t).event for t in (5, 6, 7)]
    assert ev == [None, None, StragglerEvent.CLEARED]
    assert m.compute(8.0)[0].stragglers == 0


def test_robust_threshold_rejects_empty_and_clamps() -> None:
    with pytest.raises(ValueError, match="scores"):
        robust_threshold(np.array([], dtype=np.float64), 2.0, 0.01)
    assert robust_threshold(np.array([0.0, 0.0, 1.0]), 2.0, 0.01)[2] == 0.0


def test_node_state_parse_names_field() -> None:
    assert NodeState.parse("Idle") is NodeState.IDLE
    with pytest.raises(ValueError, match=r"autorepair\.node\.state: 'busy'"):
        NodeState.parse("busy")


def test_slots_are_reused_and_arrays_grow() -> None:
    m = smap()
    feed(m, {f"n{i}": 0.9 for i in range(200)}, 0.0)  # > initial capacity 64
    c = m.cohorts[("c", "training")]
    assert len(c) == 200 and c.score.size >= 200
    feed(m, {f"m{i}": 0.8 for i in range(10)}, 100.0)
    m.compute(100.0)  # n* expired
    assert set(c.index) == {f"m{i}" for i in range(10)}
    r = m.compute(100.0)[0]
    assert r.median == pytest.approx(0.8)


@settings(max_examples=200, deadline=None)
@given(
    healthy=st.lists(st.floats(0.80, 1.0), min_size=6, max_size=60),
    outlier_frac=st.floats(0.0, 0.49),
    outlier_value=st.floats(0.0, 1.0),
)
def test_minority_outliers_cannot_push_threshold_past_healthy(
    healthy: list[float], outlier_frac: float, outlier_value: float
) -> None:
    """Fewer than half outliers, wherever they are, leave the threshold at or below the
    healthy nodes' median (the breakdown point of median and MAD is 50%), so the healthy
    majority is never all flagged and the threshold stays within [0, 1]."""
    n_out = math.floor(outlier_frac * len(healthy) / (1 - outlier_frac))
    n_out = min(n_out, (len(healthy) - 1))
    total = len(healthy) + n_out
    if 2 * n_out >= total:
        n_out = (total - 1) // 2
    scores = np.array(healthy + [outlier_value] * n_out)
    med, _mad, thr = robust_threshold(scores, 2.0, 0.01)
    assert 0.0 <= thr <= 1.0
    # the median stays inside the healthy range, the threshold at or below it
    assert min(healthy) - 1e-12 <= med <= max(healthy) + 1e-12
    assert thr <= med
    # the healthy majority is never mostly flagged
    h = np.array(healthy)
    assert np.count_nonzero(h < thr) <= total / 2


@settings(max_examples=100, deadline=None)
@given(
    base=st.floats(0.5, 1.0),
    n=st.integers(5, 50),
    noise=st.floats(0.0, 1e-9),
)
def test_flat_fleet_float_noise_never_flags(base: float, n: int, noise: float) -> None:
    m = smap()
    rng = np.random.default_rng(0)
    vals = np.clip(base + rng.uniform(-noise, noise, n), 0.0, 1.0)
    feed(m, {f"n{i}": float(v) for i, v in enumerate(vals)}, 0.0)
    (r,) = m.compute(0.0)
    assert r.flagged == 0 and not r.panic
