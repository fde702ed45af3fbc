"""Issue 26 I20 (review follow-up): ``gpu_lost`` is a node-level fault. A restarted
agent's first state of it (a clear, every GPU back) must clear the raise an earlier agent
process sent naming a missing GPU; so the fault's identity carries no device, on the
agent's wire and in the control plane's fault key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.nvml import GpuSample, SimulatedBackend
from agent.runner import Agent
from tests.workflows.conftest import make_alert
from workflows.protocol import fault_key


def _gpu(i: int) -> GpuSample:
    return GpuSample(index=i, pci=f"0000:{0x18 + i:02x}:00", uuid=f"GPU-{i}",
                     utilization_pct=90.0, sm_clock_mhz=1400, sm_clock_max_mhz=1410,
                     memory_used_bytes=1, memory_total_bytes=2, power_w=300.0,
                     temperature_c=60.0)


def _agent(tmp: Path) -> tuple[Agent, list[Any]]:
    cfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="c", node="gpu-01",
                      backend="simulated", expected_gpus=4, state_dir=str(tmp),
                      kernel_log="none")
    agent = Agent(cfg, SimulatedBackend(gpu_count=4, seed=1), cpu=lambda: 0.9,
                  memory=lambda: 0.5, boot_id="b", host_id="m", seed=1)
    sent: list[Any] = []
    agent.emit_fault = sent.append  # type: ignore[method-assign]
    return agent, sent


def test_a_restarted_agents_clear_has_the_identity_of_the_earlier_raise(tmp_path: Path) -> None:
    first, sent1 = _agent(tmp_path / "a")
    first._check_levels([_gpu(i) for i in range(4)])
    first._check_levels([_gpu(i) for i in range(3)])  # GPU 3 fell off the bus
    raise_ = [f for f in sent1 if f.kind == "gpu_lost" and f.active][-1]
    assert raise_.pci is None and raise_.details["missing"] == ["0000:1b:00"]
    # the power cycle fixed it; a new agent process starts with every GPU present
    second, sent2 = _agent(tmp_path / "b")
    second._check_levels([_gpu(i) for i in range(4)])
    clear = [f for f in sent2 if f.kind == "gpu_lost"][-1]
    assert clear.active is False and clear.pci == raise_.pci


def test_the_fault_key_of_gpu_lost_ignores_the_device_a_sender_names() -> None:
    up = make_alert("c", "gpu-01", "r", kind="gpu_lost", code=None, gpu="0000:1b:00")
    down = make_alert("c", "gpu-01", "c", kind="gpu_lost", code=None, gpu=None, active=False)
    assert fault_key(up) == fault_key(down) == "gpu_lost::"
    # per-device faults keep the device
    x1 = make_alert("c", "gpu-01", 1, gpu="0000:18:00")
    x2 = make_alert("c", "gpu-01", 2, gpu="0000:19:00")
    assert fault_key(x1) != fault_key(x2)


def test_the_node_machine_keys_gpu_lost_as_the_control_plane_does() -> None:
    from workflows.lifecycle.node import fault_key as node_key

    up = make_alert("c", "gpu-01", "r", kind="gpu_lost", code=None, gpu="0000:1b:00")
    down = make_alert("c", "gpu-01", "c", kind="gpu_lost", code=None, gpu=None, active=False)
    x = make_alert("c", "gpu-01", 1, gpu="0000:18:00")
    for a in (up, down, x):
        assert node_key(a) == fault_key(a)
