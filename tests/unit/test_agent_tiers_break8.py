"""The agent takes every threshold ingest publishes with quorum: the range is [0, 1].

docs/wire-contract.md: "Threshold = median − k·MAD·1.4826 … clamped to [0, 1], published
only with quorum". A cohort with a wide spread of scores clamps to 0 (no node is a
straggler), and ingest answers ``X-Autorepair-Threshold: 0.000000`` with
``X-Autorepair-Quorum-Met: true``. The agent counted that as invalid (open interval
(0, 1)), logged ``threshold_invalid`` on every push and fell back to its cached or local
threshold, under which it could flag itself a straggler the fleet says it is not.
"""

from __future__ import annotations

import numpy as np

from agent.config import TierConfig
from agent.tiers import FLEET, ThresholdTracker
from ingest.threshold import robust_threshold


def test_ingest_can_publish_zero_and_the_agent_takes_it() -> None:
    scores = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.95])
    _median, _mad, raw = robust_threshold(scores, 2.0, 0.01)
    assert raw == 0.0  # the clamp of docs/wire-contract.md
    t = ThresholdTracker(TierConfig(), push_interval_s=10)
    assert t.observe(f"{raw:.6f}", "true", now=0) == FLEET
    assert t.invalid_count == 0
    assert t.current(5, 0.9) == (FLEET, 0.0)


def test_one_with_quorum_is_taken_and_zero_without_is_the_cold_start_shape() -> None:
    t = ThresholdTracker(TierConfig(), push_interval_s=10)
    assert t.observe("1", "true", now=0) == FLEET and t.threshold == 1.0
    assert t.observe("0", "false", now=1) == "no_quorum"
    assert t.threshold == 1.0 and t.invalid_count == 0
