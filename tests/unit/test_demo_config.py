"""The demo's config and auto-approval, without starting the demo (issue 28 items 1, 4, 7, 16)."""

from __future__ import annotations

import os
from pathlib import Path

from workers.config import load_config
from workers.demo import (
    CLUSTER,
    DEMO_HOURLY_RATE,
    NODES,
    SPARE,
    XID79_NODE,
    DemoTimings,
    agent_binary,
    demo_config,
    is_storyline_repair,
)


def _cfg(tmp_path: Path, **kw: object) -> dict:
    return demo_config(tmp_path / "slurm" / "slurm.conf", "http://127.0.0.1:8000",
                       {n: f"sys-{n}" for n in NODES}, tmp_path / "bmc.yaml", DemoTimings(),
                       **kw)  # type: ignore[arg-type]


def test_demo_jobs_run_the_venv_agent_on_its_simulated_gpus(tmp_path: Path) -> None:
    """The check and reset jobs run by Slurm get the absolute path of the venv's agent
    (Slurm jobs inherit the caller's PATH, which `make run` does not give .venv/bin) and
    --backend simulated (the loopback nodes have no GPU): `validate` used to abort with
    'autorepair-agent: not found' and then with no NVML."""
    c = _cfg(tmp_path)["clusters"][0]
    agent = agent_binary()
    assert os.path.isabs(agent) and os.access(agent, os.X_OK)
    assert c["validation"]["command"] == [agent, "validate", "--json", "--backend", "simulated"]
    assert c["reset_gpu"]["command"][0] == agent
    assert c["reset_gpu"]["command"][-2:] == ["--backend", "simulated"]


def test_demo_supports_every_action_of_the_runbook(tmp_path: Path) -> None:
    """A clean image for reprovision, a spare machine for migrate, an hourly rate for the
    cost figures; the dict is a valid autorepair.yaml."""
    doc = _cfg(tmp_path, image_url="http://127.0.0.1:9/clean-node.iso")
    c = doc["clusters"][0]
    assert c["provision_image"] == "http://127.0.0.1:9/clean-node.iso"
    assert c["spares"] == [SPARE]
    path = tmp_path / "autorepair.yaml"
    import yaml

    path.write_text(yaml.safe_dump(doc))
    cfg = load_config(path, environ={})
    cluster = cfg.cluster(CLUSTER)
    assert cluster.spares == [SPARE] and cluster.provision_image
    (rule,) = cfg.providers.rules
    assert rule.hourly_rate == DEMO_HOURLY_RATE and rule.match.cluster == CLUSTER


def test_demo_auto_approves_only_the_storyline_repair() -> None:
    storyline = {"NodeId": XID79_NODE, "RepairAction": "power_cycle", "AlertKind": "xid"}
    assert is_storyline_repair(storyline, set())
    # once approved, a second Xid 79 injected by hand on the same node waits for a person
    assert not is_storyline_repair(storyline, {XID79_NODE})
    # a fault injected by hand elsewhere, an operator's request, a ladder escalation
    assert not is_storyline_repair({**storyline, "NodeId": "gpu-01"}, set())
    assert not is_storyline_repair({**storyline, "AlertKind": "repair_request"}, set())
    assert not is_storyline_repair({**storyline, "RepairAction": "migrate"}, set())
