"""Configuration loading: defaults from docs/design.md §5, YAML, env overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.config import ConfigError, load_config
from workflows.models import Action


def test_defaults_follow_design() -> None:
    cfg = load_config(None, environ={})
    t = cfg.threshold
    assert (t.k, t.ema_alpha, t.statistical_min, t.coverage) == (2.0, 0.2, 5, 0.80)
    assert (t.push_interval_s, t.ttl_multiplier) == (10.0, 5.0)
    p = cfg.policy
    assert p.consent.mode == "approve"
    assert p.wait_for_idle.max_wait_s == 7200.0
    assert (p.ladder.attempts, p.ladder.window_s) == (2, 7 * 86400.0)
    assert p.migrate_gate.window_s == 10 * 86400.0
    assert p.rails.cooldown_s == 1800.0
    assert cfg.temporal.task_queue == "autorepair"


def test_yaml_and_env_override(tmp_path: Path) -> None:
    f = tmp_path / "autorepair.yaml"
    f.write_text(
        "threshold:\n  k: 3.0\npolicy:\n  catalogue:\n    xid:\n      43: {count: 5, window_s: 600}\n"
        "clusters:\n  - name: demo\n    scheduler: slurm\n    nodes: [{name: gpu-01}]\n"
    )
    cfg = load_config(f, environ={"AUTOREPAIR__THRESHOLD__K": "2.5",
                                  "AUTOREPAIR__POLICY__CONSENT__AUTOMATIC_XIDS": "[79]"})
    assert cfg.threshold.k == 2.5
    assert cfg.policy.catalogue.xid[43].count == 5
    assert cfg.policy.consent.automatic_xids == [79]
    assert cfg.cluster("demo").gpu_node_count == 1
    with pytest.raises(KeyError, match="nope"):
        cfg.cluster("nope")


def test_bad_value_names_field_and_value(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("threshold:\n  k: -1\ningest:\n  otlp_http_port: 99999\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, environ={})
    msg = str(e.value)
    assert "threshold.k" in msg and "-1" in msg
    assert "ingest.otlp_http_port" in msg and "99999" in msg


def test_unknown_key_and_remove_never_automatic(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("threshold:\n  kk: 1\n")
    with pytest.raises(ConfigError, match=r"threshold\.kk"):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match="remove"):
        load_config(None, environ={"AUTOREPAIR__POLICY__CONSENT__AUTOMATIC_ACTIONS": "[remove]"})
    ok = load_config(None, environ={"AUTOREPAIR__POLICY__CONSENT__AUTOMATIC_ACTIONS": "[reboot]"})
    assert ok.policy.consent.automatic_actions == [Action.reboot]


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.yaml", environ={})
    f = tmp_path / "x.yaml"
    f.write_text("threshold: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={})
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(f, environ={})
    f.write_bytes(b"threshold:\n  k: 2\n# \xff\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: not UTF-8 text \(byte 0xff at offset 20\)"):
        load_config(f, environ={})


@pytest.mark.parametrize(("text", "where"), [
    ("policy:\n  rails:\n    cooldown_s: .inf\n", r"policy\.rails\.cooldown_s.*finite"),
    ("threshold:\n  k: .nan\n", r"threshold\.k.*finite"),
    ("policy:\n  consent:\n    approval_timeout_s: -.inf\n", r"approval_timeout_s.*finite"),
    ("policy:\n  rails:\n    cooldown_s: 1.0e+30\n",
     r"policy\.rails.*cooldown_s: 1e\+30 s is longer than 315360000 s"),
])
def test_infinite_and_absurd_durations_are_refused_naming_the_key(
    tmp_path: Path, text: str, where: str,
) -> None:
    """``.inf`` / ``.nan`` cannot reach the workflows (their JSON payloads turn them into
    ``null``, which no longer validates) and a duration past ten years overflows
    ``timedelta``: each stops the process at start, naming the key and the value."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=where):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match=r"cooldown_s.*finite"):
        load_config(None, environ={"AUTOREPAIR__POLICY__RAILS__COOLDOWN_S": ".inf"})


def test_repair_rail_keys_and_poll_bounds() -> None:
    p = load_config(None, environ={}).policy
    assert p.rails.action_retry_max_s == 900.0
    assert (p.rails.max_actions_per_node, p.rails.max_actions_window_s) == (6, 7 * 86400.0)
    assert (p.wait_for_idle.poll_s, p.wait_for_idle.poll_max_s) == (30.0, 600.0)
    with pytest.raises(ConfigError, match=r"poll_max_s: 10 is below poll_s 30"):
        load_config(None, environ={"AUTOREPAIR__POLICY__WAIT_FOR_IDLE__POLL_MAX_S": "10"})
