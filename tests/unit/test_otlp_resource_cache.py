"""The decoded-resource cache of the OTLP decoder (issue 30: HTTP ingest at ≥ 0.5 of bare
uvicorn): an agent's resource block, the same bytes every push, is bounded, checked and
named once; the answer is the one an uncached decode gives, limits included."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ingest import otlp
from ingest.otlp import DEFAULT_LIMITS, Resource, decode_metrics, make_metrics_request


def _decode(req, limits=DEFAULT_LIMITS):  # type: ignore[no-untyped-def]
    return decode_metrics(req, time.time(), max_future_s=300, ttl_s=60, limits=limits)


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    otlp._resources.clear()


def test_the_same_resource_block_is_decoded_once_and_shared() -> None:
    a = _decode(make_metrics_request("c1", "gpu-01", 0.9, machine_id="m1"))
    b = _decode(make_metrics_request("c1", "gpu-01", 0.8, machine_id="m1"))
    assert a.scores[0].resource is b.scores[0].resource
    assert (b.scores[0].resource.node, b.scores[0].resource.machine_id) == ("gpu-01", "m1")
    assert len(otlp._resources) == 1


def test_a_different_block_is_its_own_entry() -> None:
    a = _decode(make_metrics_request("c1", "gpu-01", 0.9, boot_id="b1"))
    b = _decode(make_metrics_request("c1", "gpu-01", 0.9, boot_id="b2"))  # rebooted
    assert a.scores[0].resource.boot_id == "b1"
    assert b.scores[0].resource.boot_id == "b2"


def test_the_limits_are_part_of_the_key() -> None:
    """A block accepted under the default limits is refused under tighter ones (and
    the other way round), whatever was decoded first."""
    req = make_metrics_request("c1", "gpu-01", 0.9, extra_resource={"rack": "r" * 40})
    tight = dataclasses.replace(DEFAULT_LIMITS, value_len=16)
    assert len(_decode(req).scores) == 1
    refused = _decode(req, tight)
    assert refused.scores == [] and refused.rejected == 1, refused
    assert len(_decode(req).scores) == 1


def test_a_refused_block_is_refused_again() -> None:
    req = make_metrics_request("c1", "*", 0.9)  # a reserved name
    first, again = _decode(req), _decode(req)
    assert first.scores == again.scores == []
    assert first.rejected == again.rejected == 1
    assert first.reasons == again.reasons and first.codes == again.codes == {"resource": 1}


def test_the_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "RESOURCE_CACHE_MAX", 8)
    for i in range(50):
        assert _decode(make_metrics_request("c1", f"gpu-{i:02d}", 0.9)).scores
        assert len(otlp._resources) <= 8


def test_a_shared_resource_cannot_be_changed() -> None:
    res = _decode(make_metrics_request("c1", "gpu-01", 0.9)).scores[0].resource
    assert isinstance(res, Resource)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.node = "gpu-02"  # type: ignore[misc]
