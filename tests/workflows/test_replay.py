"""Replay saved histories of representative runs with the Replayer, so a change that
breaks determinism fails CI.

Regenerate the histories (after an intentional, versioned change) with
``AUTOREPAIR_RECORD_HISTORIES=1 pytest tests/workflows/test_replay.py``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.conftest import OWN_WORKFLOWS, Harness, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import guard_status, result_skipping, start_repair, wait_stage
from workflows.models import Action, ApproveSignal, RejectSignal, Stage
from workflows.protocol import workflow_id_guard, workflow_id_node

HISTORIES = Path(__file__).parent / "histories"
RECORD = os.environ.get("AUTOREPAIR_RECORD_HISTORIES") == "1"


@pytest.mark.skipif(not RECORD, reason="set AUTOREPAIR_RECORD_HISTORIES=1 to re-record")
async def test_record_histories(harness: Harness) -> None:
    h = harness
    HISTORIES.mkdir(exist_ok=True)
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
    a = await start_repair(h, "gpu-02", Action.reboot, "rec-approve")
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
    await guard_status(h)
    saved["guard"] = workflow_id_guard(h.cluster.cluster)
    for name, wid in saved.items():
        hist = await h.client.get_workflow_handle(wid).fetch_history()
        (HISTORIES / f"{name}.json").write_text(hist.to_json())


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_replay_history(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    replayer = Replayer(
        workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
