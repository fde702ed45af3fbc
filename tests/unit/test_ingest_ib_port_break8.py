"""One InfiniBand port is one fault, whichever of the agent's two sources reports it.

The agent reports a port's state from the kernel log (``mlx5_core 0000:53:00.0 mlx5_3:
Port: 1 Link DOWN``: the reader names the HCA's PCI function *and* ``device``/``port``)
and from sysfs (``/sys/class/infiniband/mlx5_3/ports/1``: ``device``/``port`` only).
ingest keys an ``ib_link_*`` fault by its port (ingest.levels: "one port's clear ends
that port's fault and no other"), so the sysfs clear must end the raise the kernel line
sent, and the two raises of one outage must be one fault, not two.
"""

from __future__ import annotations

from agent.host import IbPort
from agent.otlp import log_record, logs_request
from agent.readers import read_text
from agent.runner import Fault
from ingest.pipeline import Ingestor
from tests.fixtures.sinks import ListSink
from workflows.config import AutorepairConfig
from workflows.protocol import fault_key

NOW = 1_800_000_000.0
RESOURCE = {"host.name": "gpu-01", "autorepair.cluster.id": "c"}


def _sysfs_fault(state: str) -> Fault:
    """The record Agent._poll_faults sends for a port read from sysfs."""
    port = IbPort("mlx5_3", 1, state, "LinkUp" if state == "ACTIVE" else "Disabled", 1)
    kind = "ib_link_down" if state != "ACTIVE" else "ib_link_up"
    return Fault(kind, f"{port.device} port {port.port}: state {state}",
                 active=kind == "ib_link_down", details={
                     "device": port.device, "port": port.port, "state": port.state,
                     "phys_state": port.phys_state, "link_downed": port.link_downed,
                     "flaps": 0, "node": "gpu-01", "source": "sysfs", "level": True})


async def _push(ing: Ingestor, fault: Fault) -> None:
    req = logs_request(RESOURCE, [log_record(fault.text, fault.attributes(), int(NOW * 1e9))])
    resp, _ = await ing.handle_logs(req, "test")
    assert resp.partial_success.rejected_log_records == 0, resp.partial_success.error_message


async def test_the_kernel_raise_and_the_sysfs_clear_of_one_port_are_one_fault() -> None:
    cfg = AutorepairConfig.model_validate({
        "clusters": [{"name": "c", "gpu_nodes": 1, "nodes": [{"name": "gpu-01"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink, clock=lambda: NOW)
    (down,) = read_text("[ 4443.974372] mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN")
    await _push(ing, Fault.from_reader(down))  # the kernel log's raise
    await _push(ing, _sysfs_fault("DOWN"))  # the same outage read from sysfs
    await _push(ing, _sysfs_fault("ACTIVE"))  # back: the sysfs clear (or a restart's)
    alerts = [a for a in sink.alerts if a.kind == "ib_link_down"]
    assert [a.active for a in alerts] == [True, True, False]
    keys = {fault_key(a) for a in alerts}
    assert len(keys) == 1, f"one port, several fault identities: {keys}"
    # the port is the device of the fault; the HCA's PCI function stays in the evidence
    assert alerts[0].gpu == "mlx5_3/1"
    assert alerts[0].evidence.get("pci") == "0000:53:00.0"
