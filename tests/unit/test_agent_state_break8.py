"""The agent's saved baseline (``{state_dir}/agent-state.json``) never stops it starting.

``Agent.load_state`` promises ``False`` when no saved baseline is usable; a file another
agent version wrote, or one damaged on disk, must leave the agent calibrating from
scratch, not crash ``open()`` (``autorepair-agent run`` would exit, and exit again on
every restart, until a person deletes the file).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.nvml import SimulatedBackend
from agent.runner import Agent

NOW = time.time()

UNUSABLE = {
    "a JSON list": "[]",
    "JSON null": "null",
    "a JSON string": '"baseline"',
    "saved_at not a number": json.dumps({"node": "gpu-01", "saved_at": "yesterday"}),
    "saved_at null": json.dumps({"node": "gpu-01", "saved_at": None}),
    "scorer not an object": json.dumps({"node": "gpu-01", "saved_at": NOW, "scorer": 5}),
    "scorer.slow not an object": json.dumps({
        "node": "gpu-01", "saved_at": NOW,
        "scorer": {"version": 1, "baseline": [0.9, 50], "score_ema": [0.9, 50],
                   "slow": [1, 2]}}),
}


def _agent(tmp_path: Path) -> Agent:
    cfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="it", node="gpu-01",
                      backend="simulated", state_dir=str(tmp_path), kernel_log="none")
    return Agent(cfg, SimulatedBackend(gpu_count=2, seed=1), cpu=lambda: 1.0,
                 memory=lambda: 1.0)


@pytest.mark.parametrize("content", list(UNUSABLE.values()), ids=list(UNUSABLE))
async def test_an_unusable_state_file_is_ignored_and_the_agent_opens(
        tmp_path: Path, content: str) -> None:
    agent = _agent(tmp_path)
    agent.cfg.state_path.write_text(content)
    assert agent.load_state() is False
    agent.open()  # does not raise
    assert agent.scorer.state == "calibrating"
    assert agent.scorer.baseline.n == 0
    await agent.close()
    # close() saved a good baseline over the bad file: the next start restores it
    again = _agent(tmp_path)
    assert again.load_state() is True
