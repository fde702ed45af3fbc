"""Shadow mode's configuration and pure decisions (issue 29 item 3): ``policy.mode`` per
cluster and per pool, the error naming a bad value, what a shadowed repair says it would
have done, and which attempts the rails count in each mode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.policy_activities import PolicyActivities
from tests.workflows.conftest import make_alert
from workers.config import ConfigError, load_config
from workflows.config import AutorepairConfig, LadderConfig, WaitForIdleConfig
from workflows.models import TERMINAL_STAGES, Action, AttemptRecord, Stage
from workflows.policy import SHADOWED, choose_action, rail_attempts, would_do
from workflows.protocol import repair_state

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _cfg(tmp_path: Path, text: str) -> AutorepairConfig:
    p = tmp_path / "autorepair.yaml"
    p.write_text(text)
    return load_config(p, environ={})


def test_mode_defaults_to_enforce_and_resolves_pool_then_cluster_then_policy(
    tmp_path: Path,
) -> None:
    assert AutorepairConfig().policy.mode == "enforce"
    cfg = _cfg(tmp_path, """
policy: {mode: enforce}
clusters:
  - name: a
    mode: shadow
    nodes: [{name: n1, pool: canary}, {name: n2, pool: prod}]
    pools: [{name: prod, mode: enforce}]
  - name: b
    nodes: [{name: n3, pool: canary}]
    pools: [{name: canary, mode: shadow}]
""")
    a, b = cfg.cluster("a"), cfg.cluster("b")
    assert a.mode_of("canary", cfg.policy.mode) == "shadow"  # the cluster's
    assert a.mode_of("prod", cfg.policy.mode) == "enforce"  # the pool's own
    assert b.mode_of("canary", cfg.policy.mode) == "shadow"
    assert b.mode_of("other", cfg.policy.mode) == "enforce"  # policy.mode


async def test_load_policy_hands_the_cluster_mode_and_the_pool_modes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, """
clusters:
  - name: a
    mode: shadow
    nodes: [{name: n1, pool: canary}, {name: n2, pool: prod}]
    pools: [{name: prod, mode: enforce}, {name: quiet}]
""")
    snap = await PolicyActivities(cfg).load_policy("a")
    assert snap.policy.mode == "shadow"
    assert snap.pool_modes == {"prod": "enforce"}
    assert snap.mode_of("canary") == "shadow" and snap.mode_of("prod") == "enforce"
    assert snap.mode_of(None) == "shadow"
    assert (await PolicyActivities(cfg).load_policy("unknown")).mode_of("x") == "enforce"


@pytest.mark.parametrize(("text", "field", "value"), [
    ("policy: {mode: dry-run}", "policy.mode", "'dry-run'"),
    ("clusters: [{name: a, mode: Shadow}]", "clusters.0.mode", "'Shadow'"),
    ("clusters: [{name: a, pools: [{name: p, mode: off}]}]", "clusters.0.pools.0.mode",
     "False"),
])
def test_a_bad_mode_names_the_field_and_the_value(tmp_path: Path, text: str, field: str,
                                                  value: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, text)
    assert f"{field}: " in str(err.value) and f"(got {value})" in str(err.value), err.value


def test_a_pool_listed_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"clusters\[a\]\.pools\[1\]\.name: pool 'p'"):
        _cfg(tmp_path, "clusters: [{name: a, pools: [{name: p}, {name: p, mode: shadow}]}]")


def test_a_pool_mode_that_applies_to_no_node_is_refused(tmp_path: Path) -> None:
    """A pool's mode reaches only nodes whose ``nodes[].pool`` names it: a shadow pool no
    node is in would leave its intended nodes acting in enforce, silently (fail-open)."""
    with pytest.raises(ConfigError, match=r"clusters\[a\]\.pools\[0\]\.mode: 'shadow' "
                       r"applies to no node"):
        _cfg(tmp_path, "clusters: [{name: a, pools: [{name: canary, mode: shadow}]}]")
    ok = _cfg(tmp_path, "clusters: [{name: a, nodes: [{name: n1, pool: canary}],"
                        " pools: [{name: canary, mode: shadow}, {name: spare}]}]")
    assert ok.clusters[0].mode_of("canary", "enforce") == "shadow"


def test_shadowed_is_a_terminal_stage_and_its_own_state() -> None:
    assert Stage.shadowed in TERMINAL_STAGES
    assert repair_state(Stage.shadowed) == "shadowed"


def test_would_do_says_what_would_have_run() -> None:
    wfi = WaitForIdleConfig()
    text = would_do(Action.power_cycle, "gpu-03", "m-03", [], wfi)
    assert text == ("would cordon gpu-03, wait for idle (max 7200 s) and drain it, then "
                    "power-cycle m-03 through its BMC; nothing was done (shadow mode)")
    assert "reset GPU 0000:3b:00, 0000:86:00 of gpu-01 in place" in would_do(
        Action.reset_gpu, "gpu-01", None, ["0000:3b:00", "0000:86:00"], wfi)
    assert "(do not interrupt)" in would_do(
        Action.reboot, "n", None, [], WaitForIdleConfig(do_not_interrupt=True))
    for a in (Action.reprovision, Action.migrate, Action.remove):
        assert would_do(a, "n", "m", [], wfi).startswith("would cordon n")
    with pytest.raises(ValueError, match="action: 'none'"):
        would_do(Action.none, "n", None, [], wfi)


def _att(outcome: str, i: int) -> AttemptRecord:
    return AttemptRecord(repair_id=f"r{i}", cluster="c", node="n", machine_id="m",
                         action=Action.reboot, alert_kind="xid", code=79, outcome=outcome,
                         at=T0 - timedelta(hours=i + 1))


def test_shadowed_attempts_move_the_ladder_in_shadow_only() -> None:
    """Two shadowed reboots: in shadow the ladder moves to reprovision, as enforce would
    after two real reboots; enforce does not count them (nothing touched the machine)."""
    hist = [_att(SHADOWED, 0), _att(SHADOWED, 1)]
    alerts = [make_alert("c", "n", 1, action="reboot")]

    def decide(attempts: list[AttemptRecord]) -> Action:
        return choose_action(Action.reboot, alerts, attempts, [], "m", T0, LadderConfig(),
                             AutorepairConfig().policy.migrate_gate, node="n").action

    assert decide(rail_attempts(hist, shadow=True)) == Action.reprovision
    assert decide(rail_attempts(hist, shadow=False)) == Action.reboot
    real = [_att("succeeded", 0), _att("succeeded", 1)]
    assert rail_attempts([*real, *hist], shadow=False) == real
