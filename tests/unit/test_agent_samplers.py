"""Samplers against real files: PSI/proc fallback, IB sysfs, kernel-log follow & rotation,
NVML unavailable, OTLP message shape, simulator input parsing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from agent.host import CpuSampler, HostReadError, IbWatcher, memory_available_fraction
from agent.kmsg import KernelLogFollower, kmsg_to_line
from agent.nvml import BackendUnavailable, NvmlBackend, make_backend, normalise_pci
from agent.otlp import gauge, metrics_request
from agent.readers import KernelLogReader
from agent.readers.kernel.fold import WINDOW_LINES
from agent.runner import Fault
from agent.simulator import ScheduledFault, SimulatorError, load_kernel_lines

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."


def test_cpu_psi_then_proc_stat_fallback(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    s = CpuSampler(str(tmp_path), ncpu=4)
    assert s.read() == pytest.approx(0.875)
    (tmp_path / "pressure" / "cpu").unlink()
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nprocs_running 8\nprocs_blocked 0\n")
    assert s.read() == pytest.approx(0.5)  # 4 CPUs / 8 runnable
    assert s.source == "stat"
    (tmp_path / "stat").unlink()
    with pytest.raises(HostReadError, match="stat"):
        s.read()


def test_meminfo(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 250 kB\n")
    assert memory_available_fraction(str(tmp_path)) == pytest.approx(0.25)


def _ib_port(root: Path, dev: str, port: int, state: str, downed: int) -> None:
    p = root / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text("5: LinkUp\n")
    (p / "counters" / "link_downed").write_text(f"{downed}\n")


def test_ib_link_down_flap_and_up(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", 0)
    w = IbWatcher(str(tmp_path))
    assert w.poll() == []
    _ib_port(tmp_path, "mlx5_0", 1, "1: DOWN", 1)
    (kind, port, flaps), = w.poll()
    assert (kind, port.state, flaps) == ("ib_link_down", "DOWN", 1)
    _ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", 1)
    assert [e[0] for e in w.poll()] == ["ib_link_up"]
    _ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", 3)  # flapped twice between polls
    (kind, _, flaps), = w.poll()
    assert (kind, flaps) == ("ib_link_down", 2)
    assert IbWatcher(str(tmp_path / "absent")).poll() == []


def test_kmsg_record_format() -> None:
    rec = "3,1234,74889644138,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"
    rec += " SUBSYSTEM=pci\n DEVICE=+pci:0000:02:00.0\n"
    assert kmsg_to_line(rec) == XID79
    assert kmsg_to_line("garbage") is None


def test_follow_file_from_current_position_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID79 + "\n")  # history before the agent started: not replayed
    f = KernelLogFollower(str(log), KernelLogReader)
    assert f.poll() == []
    with log.open("a") as fh:
        fh.write(XID79.replace("79,", "48,") + "\n")
    events = f.poll()
    assert [(e.kind, e.xid) for e in events] == [("xid", 48)]
    # rotation: rename + new file; the new file is read from its start
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text(XID79 + "\n")
    events = f.poll()
    assert [(e.kind, e.xid) for e in events] == [("xid", 79)]
    assert f.rotations == 1
    # truncation (copytruncate) also counts as rotation
    log.write_text("")
    f.poll()
    log.write_text(XID79.replace("79,", "13,") + "\n")
    assert [e.xid for e in f.poll()] == [13]


def test_follow_burst_is_bounded_per_poll(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    f = KernelLogFollower(str(log), KernelLogReader, max_lines=100)
    f.poll()
    log.write_text((XID79 + "\n") * 250)
    counts = [len(f.poll()) for _ in range(4)]
    # a poll emits at most what it read; the reader may hold the last few lines (a
    # record that may be wrapped, an Xid 79 waiting for its fallen-off-the-bus line)
    # until a later poll; the poll that reads to the end flushes them
    assert sum(counts) == 250 and all(c <= 100 for c in counts)
    assert counts[0] >= 100 - WINDOW_LINES - 1 and counts[3] == 0


def test_follow_permission_error_is_reported_not_raised(tmp_path: Path) -> None:
    f = KernelLogFollower(str(tmp_path / "missing.log"), KernelLogReader, retry_s=0)
    assert f.poll() == []
    assert f.error is not None and "missing.log" in f.error
    (tmp_path / "missing.log").write_text("")
    f.poll()
    assert f.error is None


def test_nvml_unavailable_is_a_clear_error() -> None:
    b = NvmlBackend()
    try:
        b.open()
    except BackendUnavailable as exc:
        assert "NVML not available" in str(exc) and "simulated" in str(exc)
    else:  # pragma: no cover - only on a GPU machine
        assert isinstance(b.sample(), list)
        b.close()
    with pytest.raises(ValueError, match=r"backend.*'auto'"):
        make_backend("auto")


def test_normalise_pci() -> None:
    assert normalise_pci(b"00000000:C6:00.0") == "0000:c6:00"
    with pytest.raises(ValueError, match="pci bus id"):
        normalise_pci("nope")


def test_fault_from_reader_event_attributes() -> None:
    reader = KernelLogReader()
    (ev,) = reader.feed(XID79) + reader.flush()
    attrs = Fault.from_reader(ev).attributes()
    assert attrs["event.name"] == "autorepair.fault"
    assert attrs["autorepair.fault.kind"] == "xid"
    assert attrs["autorepair.fault.code"] == 79
    assert attrs["autorepair.gpu.pci"] == "0000:02:00"
    assert attrs["autorepair.fault.active"] is True
    assert attrs["autorepair.fault.source"] == "kernel_log"


def test_metrics_request_shape() -> None:
    req = metrics_request(
        {"host.name": "gpu-01", "k8s.node.name": None},
        [gauge("autorepair.node.health_score", 0.9, 1, {"autorepair.node.state": "active"})],
    )
    back = ExportMetricsServiceRequest.FromString(req.SerializeToString())
    rm = back.resource_metrics[0]
    assert [(a.key, a.value.string_value) for a in rm.resource.attributes] == [
        ("host.name", "gpu-01")
    ]
    m = rm.scope_metrics[0].metrics[0]
    dp: Any = m.gauge.data_points[0]
    assert m.name == "autorepair.node.health_score" and dp.as_double == 0.9
    assert dp.attributes[0].key == "autorepair.node.state"


def test_simulator_schedule_and_lines(tmp_path: Path) -> None:
    assert ScheduledFault.parse("gpu-02:xid79@30") == ScheduledFault("gpu-02", "xid79", 30.0)
    with pytest.raises(SimulatorError, match="'melt'"):
        ScheduledFault.parse("gpu-02:melt@3")
    with pytest.raises(SimulatorError, match="NODE:KIND@SECONDS"):
        ScheduledFault.parse("gpu-02-slow")
    p = tmp_path / "lines.jsonl"
    p.write_text('{"text": "a"}\n# comment\nplain line\n')
    assert load_kernel_lines(p) == ["a", "plain line"]
    with pytest.raises(SimulatorError, match="missing"):
        load_kernel_lines(tmp_path / "missing")
