"""Health score, tiers and hysteresis against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from agent.config import AgentConfig, ConfigError, ScoreConfig, TierConfig
from agent.nvml import GpuSample, SimulatedBackend
from agent.score import ACTIVE, CALIBRATING, IDLE, UNKNOWN, BiasCorrectedEma, HealthScorer, combine
from agent.tiers import CACHED, FLEET, LOCAL, NONE, StragglerClassifier, ThresholdTracker

CFG = ScoreConfig()


def gpu(util: float = 100.0, clk: float = 1980.0, mx: float = 1980.0) -> GpuSample:
    return GpuSample(0, "0000:18:00", "GPU-x", util, clk, mx, 1, 2, 500.0, 60.0)


def sig(t: float, c: float, m: float, a: float) -> dict[str, float | None]:
    return {"throughput_ratio": t, "compute_efficiency": c, "memory_headroom": m,
            "cpu_availability": a}


def test_combine_hand_computed() -> None:
    assert combine(sig(1, 1, 1, 1), CFG) == pytest.approx(1.0)
    # 0.4*0.5 + 0.25*0.9 + 0.2 + 0.15 = 0.775; weakest 0.5 == zone: no penalty
    assert combine(sig(0.5, 0.9, 1, 1), CFG) == pytest.approx(0.775)
    # 0.4*0.2 + 0.25 + 0.2 + 0.15 = 0.68; penalty 1 - 0.5*(0.3/0.5) = 0.7 → 0.476
    assert combine(sig(0.2, 1, 1, 1), CFG) == pytest.approx(0.476)
    # deep stall on the lightest-weighted signal is not averaged away:
    # 0.85 + 0.15*0 = 0.85, penalty factor 0.5 → 0.425
    assert combine(sig(1, 1, 1, 0), CFG) == pytest.approx(0.425)


def test_combine_renormalises_missing_signals() -> None:
    s = sig(1, 1, 1, 1)
    s["cpu_availability"] = None
    assert combine(s, CFG) == pytest.approx(1.0)
    s["memory_headroom"] = None
    s["throughput_ratio"] = 0.5
    # (0.4*0.5 + 0.25*1) / 0.65 = 0.6923
    assert combine(s, CFG) == pytest.approx(0.45 / 0.65)
    assert combine(dict.fromkeys(s), CFG) is None


def test_bias_corrected_ema_has_no_startup_bias() -> None:
    ema = BiasCorrectedEma(0.02)
    assert ema.value is None
    for _ in range(3):
        ema.update(100.0)
    # uncorrected m would be 100*(1-0.98^3) = 5.88; corrected is exactly 100
    assert ema.m == pytest.approx(100 * (1 - 0.98**3))
    assert ema.value == pytest.approx(100.0)


def scorer(**kw: object) -> HealthScorer:
    return HealthScorer(ScoreConfig(calibration_samples=3, resume_samples=2, idle_samples=2,
                                    **kw))  # type: ignore[arg-type]


def test_states_calibrating_active_idle_resume() -> None:
    s = scorer()
    states = [s.update([gpu()], 1.0, 0.5).state for _ in range(4)]
    assert states == [CALIBRATING, CALIBRATING, ACTIVE, ACTIVE]
    assert s.update([gpu(util=0)], 1.0, 0.5).state == ACTIVE  # one idle sample: pending
    r = s.update([gpu(util=0)], 1.0, 0.5)
    assert r.state == IDLE
    assert r.signals["throughput_ratio"] is None  # idle does not score throughput
    assert r.score == pytest.approx(1.0)
    assert s.update([gpu()], 1.0, 0.5).state == CALIBRATING  # resume
    assert s.update([gpu()], 1.0, 0.5).state == ACTIVE
    assert s.baseline.n == 6  # baseline kept and re-warmed, not reset


def test_throughput_ratio_against_baseline_and_stall_gate() -> None:
    s = scorer()
    for _ in range(5):
        s.update([gpu(util=100, clk=1800)], 1.0, 0.5)
    base = s.baseline.value
    assert base == pytest.approx(1800.0)
    r = s.update([gpu(util=50, clk=1800)], 1.0, 0.5)
    assert r.signals["throughput_ratio"] == pytest.approx(0.5)
    # 0.4*0.5 + 0.25*(1800/1980) + 0.2 + 0.15; weakest 0.5 (not below zone)
    assert r.score == pytest.approx(0.2 + 0.25 * 1800 / 1980 + 0.35)
    # the stall sample did not move the baseline (stall gate 0.8)
    assert s.baseline.value == pytest.approx(base)


def test_transient_nvml_outage_is_unknown_not_low() -> None:
    s = scorer()
    for _ in range(4):
        s.update([gpu()], 1.0, 0.5)
    n = s.baseline.n
    r = s.update(None, 1.0, 0.5)
    assert r.state == UNKNOWN and r.score is None
    assert all(v is None for v in r.signals.values())
    assert s.state == ACTIVE and s.baseline.n == n  # nothing learned from the outage


def test_failed_host_reads_leave_signal_out() -> None:
    s = scorer()
    r = s.update([gpu()], None, None)
    assert r.signals["cpu_availability"] is None and r.signals["memory_headroom"] is None
    assert r.score == pytest.approx(1.0)


def test_slow_ema_floor_warns_on_sustained_degradation() -> None:
    s = HealthScorer(ScoreConfig(calibration_samples=1, slow_alpha=0.2, slow_floor=0.8))
    s.update([gpu()], 1.0, 0.5)
    assert s.update([gpu()], 1.0, 0.5).degraded == ()
    r = None
    for _ in range(10):
        r = s.update([gpu()], 0.3, 0.5)  # CPU contention, sustained
    assert r is not None and r.degraded == ("cpu_availability",)


def test_state_round_trip_skips_recalibration() -> None:
    s = scorer()
    for _ in range(5):
        s.update([gpu(clk=1700)], 1.0, 0.5)
    t = scorer()
    t.from_state(s.to_state())
    assert t.state == ACTIVE and t.baseline.value == pytest.approx(s.baseline.value)
    with pytest.raises(ValueError, match=r"state.baseline"):
        t.from_state({"version": 1, "baseline": ["x", 1], "score_ema": [0, 0]})


def test_simulated_backend_outage_and_faults() -> None:
    b = SimulatedBackend(gpu_count=2, seed=3)
    b.open()
    assert len(b.sample()) == 2
    b.faults.fail_reads = 1
    from agent.nvml import SampleError

    with pytest.raises(SampleError):
        b.sample()
    b.faults.lost_gpus = 1
    assert len(b.sample()) == 1


# ----- tiers ---------------------------------------------------------------------------


def test_tiers_fleet_cached_local_none() -> None:
    t = ThresholdTracker(TierConfig(grace_s=300, fresh_pushes=3), push_interval_s=10)
    assert t.current(0, None) == (NONE, None)
    assert t.current(0, 0.9) == (LOCAL, pytest.approx(0.675))  # 0.75 × 0.9
    assert t.observe("0.82", "true", now=100) == FLEET
    assert t.current(125, 0.9) == (FLEET, 0.82)  # 25 s ≤ 3 × 10 s
    assert t.current(131, 0.9) == (CACHED, 0.82)
    assert t.current(400, 0.9) == (CACHED, 0.82)  # 300 s grace inclusive
    assert t.current(401, 0.9)[0] == LOCAL
    assert t.current(401, None) == (NONE, None)


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "1.000001", "nan", "abc", "inf"])
def test_invalid_thresholds_keep_cached(raw: str) -> None:
    t = ThresholdTracker(TierConfig(), push_interval_s=10)
    t.observe("0.8", "true", now=0)
    assert t.observe(raw, "true", now=5) == "invalid"
    assert t.invalid_count == 1 and t.threshold == 0.8
    assert t.current(40, None) == (CACHED, 0.8)


def test_before_quorum_shape_is_not_invalid() -> None:
    t = ThresholdTracker(TierConfig(), push_interval_s=10)
    assert t.observe("0", "false", now=0) == "no_quorum"
    assert t.observe("0.7", "false", now=0) == "no_quorum"
    assert t.observe(None, None, now=0) == "absent"
    assert t.invalid_count == 0 and t.threshold is None


def test_straggler_hysteresis() -> None:
    c = StragglerClassifier(TierConfig(enter_count=3, exit_count=2, exit_margin=0.02))
    seq = [0.7, 0.7, 0.9, 0.7, 0.7, 0.7, 0.81, 0.83, 0.83]
    out = [c.evaluate(s, 0.8, ACTIVE) for s in seq]
    # a single good sample resets the entry count; 0.81 < 0.8+0.02 does not count to exit
    assert out == [None, None, None, None, None, "start", None, None, "end"]
    assert c.evaluate(None, 0.8, ACTIVE) is None  # unknown leaves state alone
    for _ in range(3):
        c.evaluate(0.5, 0.8, ACTIVE)
    assert c.straggler
    assert c.evaluate(0.5, 0.8, IDLE) == "end"  # idle ends an episode
    assert c.evaluate(0.5, None, ACTIVE) is None  # tier none: no classification


# ----- config --------------------------------------------------------------------------


def test_config_errors_name_field_and_value() -> None:
    base = {"endpoint": "http://x:4318", "cluster": "c", "node": "n"}
    assert AgentConfig.from_mapping(base).push_interval_s == 10.0
    with pytest.raises(ConfigError, match=r"push_interval_s.*-1"):
        AgentConfig.from_mapping({**base, "push_interval_s": -1})
    with pytest.raises(ConfigError, match=r"backend.*'gpu'"):
        AgentConfig.from_mapping({**base, "backend": "gpu"})
    with pytest.raises(ConfigError, match=r"score.weights"):
        AgentConfig.from_mapping({**base, "score": {"weights": [0.5, 0.5, 0.5, 0.5]}})
    with pytest.raises(ConfigError, match=r"tiers.bogus"):
        AgentConfig.from_mapping({**base, "tiers": {"bogus": 1}})
    with pytest.raises(ConfigError, match=r"endpoint.*ftp"):
        AgentConfig.from_mapping({**base, "endpoint": "ftp://x"})
    # the wire contract's name rule: ingest would reject every push of these
    for field, bad in (("cluster", "bad cluster"), ("node", "bad/node"), ("cluster", "*"),
                       ("node", "-lead"), ("node", "n" * 254)):
        with pytest.raises(ConfigError, match=rf"{field}: .* is not a valid name"):
            AgentConfig.from_mapping({**base, field: bad})
    assert AgentConfig.from_mapping({**base, "node": "gpu-01.rack-a:0@x"}).node == \
        "gpu-01.rack-a:0@x"

    cfg = AgentConfig.from_mapping({**base, "push": {"transport": "grpc"}, "expected_gpus": 8})
    assert cfg.push.transport == "grpc" and cfg.expected_gpus == 8
    assert math.isclose(sum(cfg.score.weights), 1.0)


def test_the_agents_name_rule_is_the_control_planes() -> None:
    """The agent ships alone (it imports nothing of the control plane), so it carries its
    own copy of the name rule: kept equal to ``workflows.names``."""
    from agent import config as agent_config
    from workflows import names

    assert agent_config.NAME_PATTERN == names.NAME_PATTERN
    assert agent_config.MAX_NAME_LEN == names.MAX_NAME_LEN
    assert names.RESERVED_NAMES == {"*"}  # refused by the pattern itself
