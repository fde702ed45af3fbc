"""Replay saved histories of representative runs with the Replayer, so a change that
breaks determinism fails CI.

``histories/<package version>/`` holds the recordings of the current version, and every
one must keep replaying on the current code: a worker that restarts replays the
histories of the runs in flight on its own build. Every workflow is ``PINNED``
(docs/architecture.md "Upgrades"): a repair finishes on the build that started it and
the node and guard entities move to a new build only by continue-as-new, so an older
version's histories never replay on newer code and are not kept here. 0.4.0 was the
baseline (issue 26 item 6): the node and guard machines interpreted by their workflows,
every workflow pinned; 0.5.0 adds the domain holds, shadow mode, the maintenance grace
period, the evidence capture before an action and the breaker's count of ended repairs;
0.6.0 has the repair decide with the repair machine's functions
(workflows/lifecycle/decision.py), reading the attempt history once per decision point.

Record the current version (into :data:`RECORD_INTO`, the directory named after the
package version in pyproject.toml: bump the version first, never overwrite an old one)
with ``AUTOREPAIR_RECORD_HISTORIES=1 pytest tests/workflows/test_replay.py``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.conftest import OWN_WORKFLOWS, Harness, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    result_skipping,
    start_repair,
    wait_stage,
)
from workers.version import package_version
from workflows.models import (
    Action,
    ApproveSignal,
    RejectSignal,
    Requester,
    RequesterKind,
    Stage,
)
from workflows.protocol import workflow_id_guard, workflow_id_node

HISTORIES = Path(__file__).parent / "histories"
#: Where :func:`test_record_histories` writes: the current package version's directory.
RECORD_INTO = HISTORIES / package_version()
RECORD = os.environ.get("AUTOREPAIR_RECORD_HISTORIES") == "1"


@pytest.mark.skipif(not RECORD, reason="set AUTOREPAIR_RECORD_HISTORIES=1 to re-record")
async def test_record_histories(harness: Harness) -> None:
    h = harness
    RECORD_INTO.mkdir(parents=True, exist_ok=True)
    saved: dict[str, str] = {}
    # 1. node entity: event fault → automatic power cycle, a duplicate, a clear
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-01", 1))
    assert d.repair_id
    await h.deliver(make_alert(h.cluster.cluster, "gpu-01", 1))
    await result_skipping(h, "gpu-01", d.repair_id)
    saved["node_power_cycle"] = workflow_id_node(h.cluster.cluster, "gpu-01")
    saved["repair_power_cycle"] = f"repair/{h.cluster.cluster}/gpu-01/{d.repair_id}"
    # 2. approval with an override through the migrate gate
    h.policy.consent.mode = "approve"
    fresh = make_alert(h.cluster.cluster, "gpu-02", "rec-approve",
                       observed_at=await h.env.get_current_time())  # the gate lets it migrate
    a = await start_repair(h, "gpu-02", Action.reboot, "rec-approve", alerts=[fresh])
    await wait_stage(h, "gpu-02", "rec-approve", Stage.awaiting_approval)
    await a.signal("approve", ApproveSignal(by="alice", action=Action.migrate))
    await a.result()
    saved["repair_approve_override"] = a.id
    # 3. ladder to the top rung, then a human rejects
    h.policy.consent.mode = "automatic"
    for act in ("reboot", "reprovision", "migrate"):
        h.cluster.fail_actions[act] = 100
    b = await start_repair(h, "gpu-03", Action.reboot, "rec-ladder")
    await wait_stage(h, "gpu-03", "rec-ladder", Stage.awaiting_approval)
    await b.signal("reject", RejectSignal(by="oncall", reason="RMA"))
    await b.result()
    saved["repair_ladder_reject"] = b.id
    # 4. two repairs of one node: the second's lease is queued behind the first's, then
    #    granted, and the ladder decides again once it holds it
    h.cluster.fail_actions.clear()
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-05"] = 2
    # an operator's requests: the breaker (tripped by the ladder above) holds back
    # automatic ones only
    ops = Requester(kind=RequesterKind.user, name="ops")
    first = await start_repair(h, "gpu-05", Action.reboot, "rec-first", requester=ops)
    await wait_stage(h, "gpu-05", "rec-first", Stage.waiting_for_idle)
    second = await start_repair(h, "gpu-05", Action.reboot, "rec-queued", requester=ops)
    await eventually(
        lambda: _lease_queued(h, "gpu-05", "rec-queued"), "second repair's lease queued"
    )
    await result_skipping(h, "gpu-05", "rec-first")
    await result_skipping(h, "gpu-05", "rec-queued")
    saved["repair_lease_queued"] = second.id
    saved["repair_lease_holder"] = first.id
    # 5. a level fault raised, its clear, then the raise arriving late (stale): nothing
    #    is repaired past the persistence window
    t0 = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    lvl = make_alert(h.cluster.cluster, "gpu-06", "lvl", kind="xfs_shutdown", code=None,
                     level=True, action="reboot", observed_at=t0)
    clr = lvl.model_copy(update={"alert_id": "lvl-clear", "active": False,
                                 "observed_at": t0 + timedelta(minutes=5)})
    await h.deliver(clr)
    await h.deliver(lvl)
    await h.env.sleep(timedelta(minutes=10))
    await h.deliver(lvl.model_copy(update={"alert_id": "lvl-2",
                                           "observed_at": t0 + timedelta(minutes=6)}))
    await h.env.sleep(timedelta(minutes=10))
    saved["node_level_stale_raise"] = workflow_id_node(h.cluster.cluster, "gpu-06")
    await guard_status(h)
    saved["guard"] = workflow_id_guard(h.cluster.cluster)
    for name, wid in saved.items():
        hist = await h.client.get_workflow_handle(wid).fetch_history()
        (RECORD_INTO / f"{name}.json").write_text(hist.to_json())


async def _lease_queued(h: Harness, node: str, rid: str) -> bool:
    return "lease queued" in (await repair_status(h, node, rid)).detail


def test_the_current_version_has_recordings() -> None:
    """A version bump re-records (``AUTOREPAIR_RECORD_HISTORIES=1``), or nothing replays."""
    assert sorted(p.stem for p in RECORD_INTO.glob("*.json")), (
        f"no recorded histories in {RECORD_INTO}: record them for {package_version()}")


@pytest.mark.parametrize(
    "path",
    sorted(RECORD_INTO.glob("*.json")),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
async def test_replay_history(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    replayer = Replayer(
        workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
