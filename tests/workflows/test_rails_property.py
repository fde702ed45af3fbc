"""Stateful property test of the repair rails (DESIGN §5) on the time-skipping server.

Hypothesis draws programs — random interleavings of alerts (level and event), clears,
repairs requested through the API, approvals, rejections, cancel signals, terminations,
activity failures (non-retryable:
Kubernetes 403/404, a missing ``slurm`` binary; retryable: BMC connection refused; a
definitive action failure), busy nodes and time passing — over three nodes in two pools,
runs each against the real workflows and ledger (``rails_driver.World``), settles the
world and checks every rail listed in ``rails_driver``.

CI runs a fixed-seed slice (``RAILS_PROPERTY_EXAMPLES``, default 16; about 40 s). ``make property``
runs a longer random one and prints ``examples=… failures=… seconds=…`` last.

Workflow cancellation from the Temporal UI (``handle.cancel()``) is not in the mix: on the
time-skipping server it left time unable to skip in some programs, even when it landed
only on a repair parked in a wait (the server's quirk, see ``World._parked``); its
cleanup has named tests in ``test_repair_rails.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.workflows.rails_driver import FAULTS, NODES, Step, check, world

EXAMPLES = int(os.environ.get("RAILS_PROPERTY_EXAMPLES", "16"))
#: ``make property`` sets this: random (not derandomized) programs, figures written here.
REPORT = os.environ.get("RAILS_PROPERTY_REPORT")
_stats: dict[str, Any] = {"examples": 0, "failures": 0, "started": None}


def steps() -> st.SearchStrategy[Step]:
    node = st.sampled_from(NODES)
    kind = st.sampled_from(["level", "event"])
    alert = st.builds(Step, st.just("alert"), node, kind)
    api = st.builds(Step, st.just("api"), node, kind)
    advance = st.builds(Step, st.just("advance"), n=st.sampled_from([10, 60, 300, 1800]))
    # repeated entries weigh the draw: most steps create or move repairs
    return st.one_of(
        alert, alert, api, advance, advance,
        st.builds(Step, st.just("clear"), node),
        st.builds(Step, st.just("approve"), node),
        st.builds(Step, st.just("reject"), node),
        st.builds(Step, st.just("cancel"), node),
        st.builds(Step, st.just("cancel"), node),
        st.builds(Step, st.just("terminate"), node),
        st.builds(Step, st.just("fault"), n=st.integers(0, len(FAULTS) - 1)),
        st.just(Step("heal")),
        st.builds(Step, st.just("busy"), node, n=st.integers(1, 20)),
    )


def programs() -> st.SearchStrategy[list[Step]]:
    """A few repairs on their way first (alerts / API requests on every node), then the
    random interleaving."""
    opening = st.lists(
        st.builds(Step, st.sampled_from(["alert", "api"]), st.sampled_from(NODES),
                  st.sampled_from(["level", "event"])),
        min_size=2, max_size=4,
    )
    # a busy node parks its repair in waiting_for_idle, cordoned: endings there must clean up
    busy = st.lists(st.builds(Step, st.just("busy"), st.sampled_from(NODES),
                              n=st.integers(10, 60)), min_size=1, max_size=2)
    return st.tuples(busy, opening, st.lists(steps(), min_size=4, max_size=18)).map(
        lambda p: [*p[0], *p[1], *p[2]])


def _record(failed: bool) -> None:
    if _stats["started"] is None:
        _stats["started"] = time.monotonic()
    _stats["examples"] += 1
    _stats["failures"] += int(failed)
    if REPORT:
        Path(REPORT).write_text(json.dumps({
            "examples": _stats["examples"], "failures": _stats["failures"],
            "seconds": round(time.monotonic() - _stats["started"], 1),
        }))


@settings(
    max_examples=EXAMPLES,
    derandomize=REPORT is None,
    deadline=None,
    database=None,
    # no shrinking: an example takes seconds and its interleaving is not replayable
    # (workers run in real time); a failure prints the whole program and call log
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(approve=st.booleans(), program=programs())
async def test_rails_hold_on_random_programs(
    ledger_pool: Any, approve: bool, program: list[Step]
) -> None:
    async with world(ledger_pool, approve) as w:
        for step in program:
            await w.run(step)
        still_open = await w.settle()
        bad = await check(w, still_open)
        _record(bool(bad))
        consent = "approve" if approve else "automatic"
        assert not bad, "\n".join(
            [*bad, f"consent={consent} program: {' '.join(w.trace)}",
             *(f"  {c}" for c in w.fake.log)]
        )
