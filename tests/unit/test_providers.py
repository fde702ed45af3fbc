"""Provider rules: precedence (first match per fact), matchers, agent facts, stamping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from workflows.config import AutorepairConfig, ProvidersConfig
from workflows.downtime import compute_downtime
from workflows.models import Stage
from workflows.providers import ATTR_PROVIDER, NodeFacts, ProviderInfo, ProviderResolver, info_for

RULES = ProvidersConfig.model_validate({
    "currency": "EUR",
    "rules": [
        {"match": {"node": "gpu-a*", "cluster": "c1"}, "gpu_type": "H200", "hourly_rate": 3.5},
        {"match": {"cidr": "10.8.0.0/16"}, "provider": "coreweave", "region": "us-east-04"},
        {"match": {"labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
         "provider": "aws", "region": "us-west-2", "gpu_type": "H100", "hourly_rate": 12.29},
        {"match": {"cluster": "c1"}, "provider": "onprem", "gpus_per_node": 8,
         "hourly_rate": 2.0},
    ],
})


def test_first_matching_rule_wins_per_fact() -> None:
    r = ProviderResolver(RULES)
    got = r.resolve(NodeFacts("c1", "gpu-a07"))
    # gpu_type and rate from the node rule, provider from the cluster catch-all
    assert (got.provider, got.gpu_type, got.hourly_rate, got.gpus_per_node, got.currency) == (
        "onprem", "H200", 3.5, 8, "EUR")
    other = r.resolve(NodeFacts("c1", "gpu-b01"))
    assert (other.provider, other.gpu_type, other.hourly_rate) == ("onprem", None, 2.0)


def test_cidr_and_labels_match_and_precede_later_rules() -> None:
    r = ProviderResolver(RULES)
    by_ip = r.resolve(NodeFacts("c1", "gpu-b02", ips=("192.168.1.1", "10.8.3.4")))
    assert (by_ip.provider, by_ip.region, by_ip.hourly_rate) == ("coreweave", "us-east-04", 2.0)
    by_label = r.resolve(NodeFacts("c2", "ip-10-0-0-1", labels=(
        ("node.kubernetes.io/instance-type", "p5.48xlarge"),)))
    assert (by_label.provider, by_label.gpu_type, by_label.hourly_rate) == ("aws", "H100", 12.29)
    assert r.resolve(NodeFacts("c2", "x", ips=("not-an-ip",))).provider is None


def test_mapping_wins_over_agent_attributes_which_fill_gaps() -> None:
    r = ProviderResolver(RULES)
    facts = NodeFacts.from_resource("c1", "gpu-b03", {
        "cloud.provider": "gcp", "cloud.region": "europe-west4", "host.ip": ["10.9.0.1"],
        "k8s.node.label.pool": "a", "autorepair.provider.gpus_per_node": 4})
    got = r.resolve(facts)
    assert got.provider == "onprem"          # the configured rule, not the agent's gcp
    assert got.region == "europe-west4"      # no rule sets it: the agent's fact
    assert got.gpus_per_node == 8            # a rule sets it
    unknown = ProviderResolver(ProvidersConfig()).resolve(facts)
    assert (unknown.provider, unknown.gpus_per_node) == ("gcp", 4)


def test_stamped_facts_round_trip_and_win_for_a_repair() -> None:
    info = ProviderInfo(provider="aws", region="r", gpu_type="H100", gpus_per_node=8,
                        hourly_rate=12.5, currency="USD")
    attrs = info.attributes()
    assert attrs[ATTR_PROVIDER] == "aws"
    assert ProviderInfo.from_attributes(attrs) == info
    assert ProviderInfo.from_attributes({"xid": 79}) is None
    assert ProviderInfo.from_attributes({**attrs, "autorepair.provider.hourly_rate": "x"}) == (
        info.model_copy(update={"hourly_rate": None}))
    r = ProviderResolver(RULES)
    assert info_for(r, "c1", "gpu-b01", [{}, attrs]) == info
    assert info_for(r, "c1", "gpu-b01", [{}]).provider == "onprem"


@pytest.mark.parametrize("bad, field", [
    ({"rules": [{"match": {}, "provider": "x"}]}, "give node, cidr, labels or cluster"),
    ({"rules": [{"match": {"cidr": "10.0.0.0/33"}}]}, "'10.0.0.0/33' is not an IP"),
    ({"currency": "usd"}, "currency"),
    ({"rules": [{"match": {"node": "a"}, "hourly_rate": -1}]}, "hourly_rate"),
])
def test_bad_rules_name_the_field(bad: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        AutorepairConfig.model_validate({"providers": bad})


T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_downtime_of_a_finished_repair_from_its_stage_times() -> None:
    info = ProviderInfo(gpus_per_node=8, hourly_rate=2.5, currency="USD", provider="p")
    trans = [
        (Stage.recommended, _at(0)), (Stage.awaiting_approval, _at(1)),
        (Stage.cordoning, _at(31)), (Stage.waiting_for_idle, _at(32)),
        (Stage.waiting_for_idle, _at(60)),   # a note: same stage
        (Stage.draining, _at(92)), (Stage.repairing, _at(95)), (Stage.joining, _at(110)),
        (Stage.running, _at(121)), (Stage.succeeded, _at(121)),
    ]
    d = compute_downtime(trans, info)
    assert d is not None
    assert d.cordoned_at == _at(31) and d.rejoined_at == _at(121)
    assert d.duration_s == 90 * 60 and d.idle_wait_s == 60 * 60
    assert d.out_of_service_s == 30 * 60
    assert d.gpu_hours == pytest.approx(12.0)          # 8 GPUs × 1.5 h
    assert d.idle_wait_gpu_hours == pytest.approx(8.0)
    assert d.out_of_service_gpu_hours == pytest.approx(4.0)
    assert d.cost == pytest.approx(30.0)               # 12 GPU-h × 2.5
    assert (d.provider, d.currency) == ("p", "USD")


def test_downtime_without_rejoin_runs_to_the_end_and_none_while_open() -> None:
    info = ProviderInfo(gpus_per_node=4)
    trans = [(Stage.recommended, _at(0)), (Stage.cordoning, _at(10)),
             (Stage.draining, _at(12)), (Stage.repairing, _at(15))]
    assert compute_downtime(trans, info) is None
    d = compute_downtime([*trans, (Stage.timed_out, _at(70))], info)
    assert d is not None and d.duration_s == 60 * 60 and d.gpu_hours == pytest.approx(4.0)
    assert d.cost is None and d.idle_wait_s == 0
    never = compute_downtime([("recommended", _at(0)), ("awaiting_approval", _at(1)),
                              ("rejected", _at(5))], ProviderInfo(hourly_rate=1.0))
    assert never is not None and never.gpu_hours == 0 and never.cost == 0.0
    assert never.cordoned_at is None
