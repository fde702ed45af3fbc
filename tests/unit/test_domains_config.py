"""``policy.domains`` and ``nodes[].failure_domain`` (issue 29 item 2): defaults, the
errors naming field and value, and membership parsing from Slurm features."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from activities.scheduler.slurm import feature_domains, parse_node_features
from workflows.config import AutorepairConfig
from workflows.lifecycle.guard import DOMAIN_THRESHOLD, DOMAIN_WINDOW_S


def test_defaults_are_the_issue_s() -> None:
    d = AutorepairConfig().policy.domains
    assert (d.threshold, d.window_s) == (3, 600.0) == (DOMAIN_THRESHOLD, DOMAIN_WINDOW_S)
    assert d.label_keys == ["topology.kubernetes.io/zone", "nvidia.com/gpu.clique"]
    assert d.slurm_feature_prefix == "domain="


@pytest.mark.parametrize(("policy", "field", "value"), [
    ({"domains": {"threshold": 1}}, "policy.domains.threshold", "1"),
    ({"domains": {"window_s": 0}}, "policy.domains.window_s", "0"),
    ({"domains": {"label_keys": ["bad key"]}}, "policy.domains.label_keys", "'bad key'"),
    ({"domains": {"slurm_feature_prefix": "a,b"}}, "policy.domains.slurm_feature_prefix",
     "'a,b'"),
    ({"domains": {"thresold": 3}}, "policy.domains.thresold", "3"),
])
def test_bad_keys_name_field_and_value(policy: dict[str, Any], field: str, value: str) -> None:
    with pytest.raises(ValidationError) as e:
        AutorepairConfig.model_validate({"policy": policy})
    text = str(e.value)
    assert field.rsplit(".", 1)[-1] in text and value in text, text
    assert "domains" in text


def test_a_node_s_failure_domain_follows_the_name_rule() -> None:
    ok = AutorepairConfig.model_validate({"clusters": [{"name": "c", "nodes": [
        {"name": "gpu-01", "failure_domain": "rack-07"}]}]})
    assert ok.clusters[0].nodes[0].failure_domain == "rack-07"
    with pytest.raises(ValidationError) as e:
        AutorepairConfig.model_validate({"clusters": [{"name": "c", "nodes": [
            {"name": "gpu-01", "failure_domain": "rack 07/a"}]}]})
    assert "failure_domain" in str(e.value) and "rack 07/a" in str(e.value)


def test_slurm_features_name_domains_after_the_prefix() -> None:
    text = ("NodeName=gpu-01 Arch=x86_64 CoresPerSocket=1 AvailableFeatures=a100,domain=rack7"
            " ActiveFeatures=a100,domain=rack7 State=IDLE\n"
            "NodeName=gpu-02 AvailableFeatures=(null) ActiveFeatures=(null) State=IDLE\n"
            "NodeName=gpu-03 Features=domain=rack8,domain=pdu2 State=IDLE\n")
    feats = parse_node_features(text)
    assert feats == {"gpu-01": ["a100", "domain=rack7"], "gpu-02": [],
                     "gpu-03": ["domain=rack8", "domain=pdu2"]}
    assert feature_domains(feats["gpu-01"], "domain=") == ["rack7"]
    assert feature_domains(feats["gpu-03"], "domain=") == ["pdu2", "rack8"]
    assert feature_domains(["domain="], "domain=") == []
