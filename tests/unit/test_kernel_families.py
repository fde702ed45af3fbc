"""Kernel readers by fault family: the formats operators paste, each with every timestamp
prefix family (dmesg, dmesg -T, syslog, journald, dmesg -x, ISO, the forwarder prefix)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.readers import FaultEvent, KernelLogReader, read_text
from agent.readers.events import KINDS, LEVEL_KINDS
from agent.readers.kernel import nvlink5, read_kernel_lines
from agent.readers.kernel.fold import WINDOW_LINES
from agent.readers.kernel.reader import GATE, TABLE, has_needle, split_records

PREFIXES = [
    "",
    "[12345.678901] ",
    "[    5.000001] ",
    "[Fri Mar  3 04:28:38 2023] ",
    "Mar  3 04:28:38 gpu-node-07 kernel: ",
    "kernel: ",
    "Dec  2 11:38:47 node-a kernel: [  219.470994] ",
    "kern  :err   : [  219.470994] ",
    "kern  :warn  : [Fri Mar  3 04:28:38 2023] ",
    "2024-03-29T15:38:59.123456+00:00 gpu-node-07 kernel: ",
    "192.0.2.10: kern: err: [2026-04-22T21:25:20.466440686Z]: ",
]
"""Timestamp / host prefix families a kernel line arrives with."""


def _kernel(text: str) -> list[FaultEvent]:
    """Through the streaming reader alone (what the agent runs)."""
    events: list[FaultEvent] = []
    read_kernel_lines(text.split("\n"), events.append)
    return events


def _both(text: str) -> list[FaultEvent]:
    """Streaming reader and ``read_text`` agree; returns the events."""
    direct = _kernel(text)
    via_text = read_text(text)
    assert [(e.kind, e.xid, e.pci, e.details) for e in direct] == [
        (e.kind, e.xid, e.pci, e.details) for e in via_text
    ], text
    for ev in direct:
        json.dumps(ev.details)
        assert ev.kind in KINDS
    return direct


def _one(text: str) -> FaultEvent:
    events = _both(text)
    assert len(events) == 1, f"{text!r}: {events}"
    return events[0]


# --- Xid 154: decided by its code, label possibly missing, cut off, wrapped ----------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_xid154_hex_only_cut_and_wrapped_labels(prefix: str) -> None:
    head = f"{prefix}NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None)"
    hex_only = _one(head + " to 0x2")
    assert hex_only.xid == 154 and hex_only.pci == "0000:01:00"
    assert hex_only.details["recovery_action_code"] == 2
    assert "recovery_action" not in hex_only.details
    assert hex_only.details["previous_recovery_action_code"] == 0
    cut = _one(head + " to 0x2 (Node Reb")
    assert cut.details["recovery_action_code"] == 2
    assert cut.details["recovery_action"] == "Node Reb"
    for wrap in ("      Required)", f"{prefix}      Required)"):
        wrapped = _one(head + " to 0x4 (Drain and\n" + wrap)
        assert wrapped.details["recovery_action_code"] == 4
        assert wrapped.details["recovery_action"] == "Drain and Required"
        assert wrapped.text.count("\n") == 1 and wrapped.text.endswith("Required)")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_xid154_unreadable_is_an_event_without_recovery_code(prefix: str) -> None:
    for tail in ("154 (", "154, GPU recovery action changed from 0x", "154"):
        ev = _one(f"{prefix}NVRM: Xid (PCI:0000:01:00): {tail}")
        assert ev.xid == 154 and ev.text.endswith(tail)
        assert "recovery_action_code" not in ev.details
        assert "recovery_action" not in ev.details


# --- Wrapped records: continuation lines joined for every record kind ---------------


WRAPPED = [
    (
        "NVRM: Xid (PCI:0000:61:00): 119, pid=77, name=python, Timeout waiting for RPC from GSP!",
        "Expected function 76 (GSP_RM_CONTROL) (0x20800110 0x84).",
        "xid",
    ),
    ("INFO: task python:1234 blocked for more than 120 seconds.", "Tainted: P  OE", "hung_task"),
    (
        "EXT4-fs error (device sda2): ext4_find_entry:1455: inode #2: comm ls: reading lblock 0;",
        "Remounting filesystem read-only",
        "ext4_readonly",
    ),
    (
        "nvidia-nvswitch2: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 27 LTSSM",
        "Fault Up",
        "sxid",
    ),
    (
        "Memory cgroup out of memory: Killed process 31337 (python) total-vm:91234567kB,",
        "anon-rss:8123456kB, file-rss:0kB, shmem-rss:0kB, UID:1000",
        "oom_kill",
    ),
    (
        "NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60,",
        "requiring os reboot to recover.",
        "uvm_fatal",
    ),
]


@pytest.mark.parametrize(("first", "rest", "kind"), WRAPPED, ids=[w[2] for w in WRAPPED])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_wrapped_continuation_is_one_record_with_joined_evidence(
    first: str, rest: str, kind: str, prefix: str
) -> None:
    for cont in ("      " + rest, prefix + "      " + rest, prefix + "NVRM:      " + rest):
        text = f"{prefix}{first}\n{cont}\n{prefix}systemd[1]: Started Session 1."
        ev = _one(text)
        assert ev.kind == kind, text
        assert ev.text == f"{prefix}{first}\n{cont}", text
    if kind == "xid":
        assert ev.details["gsp_function"] == "GSP_RM_CONTROL"
    if kind == "sxid":
        assert ev.details["message"].endswith("LTSSM Fault Up")


def test_driver_follow_up_lines_join_the_xid_record() -> None:
    lines = [
        "[605633.376789] NVRM: GPU at PCI:0000:06:00: GPU-00000000-0000-0000-0000-000000000000",
        "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access",
        "[605633.376800] NVRM:     Reported by libos partition:2#4 kernel v3.1 [0] @ ts:1",
        "[605633.376803] NVRM:     RISC-V CSR State:",
        "[605633.376806] NVRM: GPU Board Serial Number: 0",
    ]
    (ev,) = _both("\n".join(lines))
    assert ev.xid == 120 and ev.text == "\n".join(lines[1:4])


# --- Redacted or missing PCI address -------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_redacted_or_missing_address_still_an_event(prefix: str) -> None:
    redacted = _one(f"{prefix}NVRM: Xid (PCI:...): 79, GPU has fallen off the bus.")
    assert (redacted.kind, redacted.xid, redacted.pci) == ("xid", 79, None)
    bare = _one(
        f"{prefix}NVRM: Xid 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)"
    )
    assert (bare.xid, bare.pci, bare.details["recovery_action_code"]) == (154, None, 1)
    assert bare.summary == "Xid 154: recovery action 0x1 (GPU Reset Required)"


# --- UVM fatal error ------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_uvm_fatal(prefix: str) -> None:
    ev = _one(
        f"{prefix}NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60, "
        "requiring os reboot to recover."
    )
    assert ev.kind == "uvm_fatal" and ev.details == {"error_code": 0x60} and ev.pci is None


# --- Other tools' reports: Kubernetes device plugin, node-problem-detector -----------


@pytest.mark.parametrize(
    "line",
    [
        "I0515 12:00:00.123456       1 health.go:150] XidCriticalError: Xid=79 on "
        "Device=GPU-00000000-0000-0000-0000-000000000000; marking device as unhealthy.",
        "2024/05/15 12:00:00 XidCriticalError: Xid=79 on "
        "Device=GPU-00000000-0000-0000-0000-000000000000, the device will go unhealthy.",
    ],
)
def test_device_plugin_report_is_an_xid(line: str) -> None:
    ev = _one(line)
    assert (ev.kind, ev.xid, ev.pci, ev.pid) == ("xid", 79, None, None)
    assert ev.details["device"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert ev.details["reporter"] == "k8s-device-plugin"
    every = _one("XidCriticalError: Xid=48, All devices will go unhealthy.")
    assert every.xid == 48 and every.details["all_devices"] is True


NPD_STATUS = (
    "I0312 08:04:37.123456    1 log_monitor.go:160] New status generated: "
    "&{Source:kernel-monitor Events:[{Severity:warn Timestamp:2023-03-12 08:04:37.1 +0000 UTC "
    "m=+1.0 Reason:TaskHung Message:task docker:7 blocked for more than 300 seconds.}] "
    "Conditions:[{Type:KernelDeadlock Status:True Transition:2023-03-12 08:04:37.1 +0000 UTC "
    "m=+1.0 Reason:DockerHung Message:task docker:7 blocked for more than 300 seconds.} "
    "{Type:ReadonlyFilesystem Status:False Transition:2023-03-12 08:00:00 +0000 UTC m=+0.1 "
    "Reason:FilesystemIsNotReadOnly Message:Filesystem is not read-only}]}"
)


@pytest.mark.parametrize("prefix", ["", "Jun 24 18:49:43 node-7 node-problem-detector[60]: "])
def test_npd_status_line(prefix: str) -> None:
    hung, deadlock, readonly = _both(prefix + NPD_STATUS)
    assert (hung.kind, hung.pid, hung.process) == ("hung_task", 7, "docker")
    assert hung.details["reporter"] == "node-problem-detector"
    assert deadlock.kind == "npd_condition" and deadlock.level and deadlock.active
    assert deadlock.details["condition"] == "KernelDeadlock"
    assert deadlock.details["status"] == "True" and deadlock.details["reason"] == "DockerHung"
    assert deadlock.details["message"] == "task docker:7 blocked for more than 300 seconds."
    assert readonly.details["condition"] == "ReadonlyFilesystem"
    assert readonly.active is False and "npd_condition" in LEVEL_KINDS


def test_npd_condition_message_alone() -> None:
    ev = _one("Type:KernelDeadlock Status:True Reason:DockerHung Message:task docker:7 blocked}")
    assert ev.kind == "npd_condition" and ev.details["condition"] == "KernelDeadlock"
    assert ev.summary == "node-problem-detector condition KernelDeadlock True"


# --- Several records on one physical line ---------------------------------------------


@pytest.mark.parametrize("sep", [" ", "  ", "\t"])
@pytest.mark.parametrize("prefix", [p for p in PREFIXES if p.strip()])
def test_several_records_on_one_line(prefix: str, sep: str) -> None:
    records = [
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, Graphics SM Warp Exception on "
        "(GPC 1, TPC 2, SM 0): Out Of Range Address",
        "NVRM: Xid (PCI:0000:02:00): 31, pid=2, name=b, Ch 00000010",
        "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 27 LTSSM Fault Up",
        "EXT4-fs (nvme1n1): Remounting filesystem read-only",
        "mlx5_core 0000:c1:00.0 mlx5_7: Port: 1 Link DOWN",
    ]
    line = sep.join(prefix + r for r in records)
    events = _both(line)
    assert [(e.kind, e.xid) for e in events] == [
        ("xid", 13),
        ("xid", 31),
        ("sxid", 20034),
        ("ext4_readonly", None),
        ("ib_link_down", None),
    ], line
    assert events[0].details["gpc"] == 1 and events[1].details["channel"] == 16


def test_several_driver_records_without_timestamps() -> None:
    line = (
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x NVRM: Xid (PCI:0000:01:00): 43, "
        "pid=1, name=a, Ch 00000008 NVRM: The NVIDIA GPU 0000:5e:00.0 NVRM: (PCI ID: "
        "10de:20b2) installed in this system has NVRM: fallen off the bus and is not "
        "responding to commands."
    )
    assert split_records(line)[0] == "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x"
    events = _both(line)
    assert [(e.kind, e.xid, e.pci) for e in events] == [
        ("xid", 13, "0000:01:00"),
        ("xid", 43, "0000:01:00"),
        ("gpu_lost", None, "0000:5e:00.0"),
    ]
    assert events[2].text.count("\n") == 2


# --- One multi-line SXid record, severity from its headline only ----------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_sxid_parts_with_unrelated_line_between_are_one_event(prefix: str) -> None:
    text = (
        f"{prefix}nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Severity 1 Engine "
        "instance 12 Sub-engine instance 00\n"
        f"{prefix}NVRM: GPU Board Serial Number: 0000000000000\n"
        f"{prefix}nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Data {{0x10000000, "
        "0x10008100}"
    )
    ev = _one(text)
    assert (ev.kind, ev.xid, ev.pci) == ("sxid", 24007, "0000:aa:00.0")
    assert "severity" not in ev.details and ev.details["severity_level"] == 1
    assert ev.text.count("\n") == 1 and "Board Serial" not in ev.text


@pytest.mark.parametrize("prefix", PREFIXES)
def test_sxid_severity_only_from_headline(prefix: str) -> None:
    data = f"{prefix}nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Data {{0x0, 0x0}}"
    lone = _one(data)
    assert lone.xid == 20009 and "severity" not in lone.details
    head = f"{prefix}nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 3 x"
    xid = f"{prefix}NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x"
    sxid, other = _both(f"{head}\n{xid}\n{data}")
    assert sxid.details["severity"] == "nonfatal" and sxid.text == f"{head}\n{data}"
    assert other.xid == 13
    fatal = _one(f"{prefix}nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 1 y")
    assert fatal.details["severity"] == "fatal"


def test_repeated_sxid_headlines_are_separate_errors() -> None:
    line = "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 32 egress"
    assert [e.xid for e in _both("\n".join([line] * 3))] == [12028] * 3


# --- Tolerant markers ------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_extra_blanks_inside_markers(prefix: str) -> None:
    ev = _one(f"{prefix}NVRM:  Xid  (PCI:0000:3b:00):  79,  pid=12, name=x, GPU has fallen")
    assert (ev.xid, ev.pci, ev.pid, ev.process) == (79, "0000:3b:00", 12, "x")
    sx = _one(f"{prefix}nvidia-nvswitch0: SXid  ( PCI:0000:06:00.0 ):  20034, Fatal, Link 2 z")
    assert (sx.xid, sx.pci) == (20034, "0000:06:00.0")


# --- GPU lost without a domain; the fallen-off-bus block and its Xid 79 fold -----------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_fallen_off_bus_without_domain(prefix: str) -> None:
    ev = _one(f"{prefix}NVRM: GPU 18:00.0: GPU has fallen off the bus.")
    assert (ev.kind, ev.pci) == ("gpu_lost", "18:00.0")


BLOCK = (
    "NVRM: The NVIDIA GPU 0000:3b:00.0\n"
    "NVRM: (PCI ID: 10de:20b2) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands."
)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_fallen_block_and_its_xid79_are_one_fault(prefix: str) -> None:
    block = "\n".join(prefix + b for b in BLOCK.split("\n"))
    xid = f"{prefix}NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    one_line = f"{prefix}NVRM: GPU 3b:00.0: GPU has fallen off the bus."
    noise = f"{prefix}NVRM: GPU Board Serial Number: 0"
    for text in (f"{block}\n{xid}", f"{xid}\n{noise}\n{one_line}", f"{block}\n{noise}\n{xid}"):
        ev = _one(text)
        assert (ev.kind, ev.xid, ev.pci) == ("xid", 79, "0000:3b:00"), text
        related = ev.details["related_evidence"]
        assert len(related) == 1 and "fallen off the bus" in related[0]
    # block, one-liner and Xid for the same GPU: one event with both texts
    ev = _one(f"{block}\n{one_line}\n{xid}")
    assert len(ev.details["related_evidence"]) == 2


def test_fold_needs_the_same_gpu_and_a_short_window() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    other = "NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus."
    assert [e.kind for e in _both(f"{xid}\n{other}")] == ["xid", "gpu_lost"]
    # past the line window, the same GPU: its next probe's report of the same fall
    far = "\n".join([xid, *["systemd[1]: tick"] * (WINDOW_LINES + 1), other.replace("5e", "3b")])
    assert [e.kind for e in _both(far)] == ["xid"]
    # printed past XID79_FOLLOW_S after the Xid: a fall of its own
    late = f"[  400.000000] {other.replace('5e', '3b')}"
    assert [e.kind for e in _both(f"[   10.000000] {xid}\n{late}")] == ["xid", "gpu_lost"]
    redacted = "NVRM: Xid (PCI:...): 79, GPU has fallen off the bus."
    assert [e.kind for e in _both(f"{BLOCK}\n{redacted}")] == ["gpu_lost", "xid"]
    plugin = "XidCriticalError: Xid=79 on Device=0000:3b:00.0; marking device as unhealthy."
    assert [e.kind for e in _both(f"{BLOCK}\n{plugin}")] == ["gpu_lost", "xid"]


def test_streaming_order_and_window() -> None:
    r = KernelLogReader()
    assert r.feed("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.") == []
    assert r.feed("NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x") == []
    out: list[FaultEvent] = []
    for _ in range(WINDOW_LINES):
        out += r.feed("systemd[1]: tick")
    assert [e.kind for e in out] == ["gpu_lost", "xid"] and r.flush() == []


# --- Common formats of the non-GPU kinds ----------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_oom_formats(prefix: str) -> None:
    bare = _one(f"{prefix}Killed process 1234 (mysqld) total-vm:1000kB, anon-rss:10kB")
    assert (bare.kind, bare.pid, bare.process) == ("oom_kill", 1234, "mysqld")
    summary = (
        f"{prefix}oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
        "global_oom,task_memcg=/user.slice,task=postgres,pid=12345,uid=1000"
    )
    alone = _one(summary)
    assert (alone.pid, alone.process) == (12345, "postgres")
    assert alone.details["constraint"] == "CONSTRAINT_NONE" and alone.details["uid"] == 1000
    assert alone.details["global_oom"] is True
    kill = f"{prefix}Out of memory: Killed process 12345 (postgres) total-vm:9kB, UID:1000"
    folded = _one(f"{summary}\n{kill}")
    assert (folded.pid, folded.process, folded.text) == (12345, "postgres", kill)
    assert folded.details["constraint"] == "CONSTRAINT_NONE"
    assert folded.details["related_evidence"] == [summary]
    other = f"{prefix}Out of memory: Killed process 999 (java) total-vm:9kB"
    assert [e.pid for e in _both(f"{summary}\n{other}")] == [12345, 999]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_hung_task_without_info_prefix(prefix: str) -> None:
    ev = _one(f"{prefix}task kworker/u256:3:41077 blocked for more than 122 seconds.")
    assert (ev.kind, ev.pid, ev.process) == ("hung_task", 41077, "kworker/u256:3")


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(
    ("line", "kind", "fs", "dev"),
    [
        ("BTRFS: Remounting filesystem read-only", "ext4_readonly", "btrfs", None),
        ("BTRFS info (device dm-0): forced readonly", "ext4_readonly", "btrfs", "dm-0"),
        ("EXT3-fs (sdb1): Remounting filesystem read-only", "ext4_readonly", "ext3", "sdb1"),
        ("FAT-fs (sdc1): Filesystem has been set read-only", "ext4_readonly", "fat", "sdc1"),
        ("XFS (sdd1): Remounting filesystem read-only", "xfs_shutdown", None, "sdd1"),
    ],
)
def test_readonly_any_filesystem(prefix: str, line: str, kind: str, fs: str | None,
                                 dev: str | None) -> None:
    ev = _one(prefix + line)
    assert ev.kind == kind
    assert ev.details.get("device") == dev
    if kind == "ext4_readonly":
        assert ev.details["filesystem"] == fs


def test_negative_lines_stay_quiet() -> None:
    for line in (
        "EXT4-fs (sda1): INFO: recovery required on readonly filesystem",
        "systemd[1]: session-1.scope: Killing process 1234 (bash) with signal SIGTERM.",
        "oom_reaper: reaped process 25315 (python3), now anon-rss:0kB",
        "ib0: link becomes ready",
        "XidCriticalError: none",
        "Type:KernelDeadlock",
    ):
        assert _both(line) == [], line


# --- NVLink5 Xids 144-150: the catalogue's decode ---------------------------------------


@pytest.mark.parametrize(
    ("line", "unit", "action", "status"),
    [
        ("145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x0 0x0 0x0 0x0)",
         "RLW_REMAP", "RESET_GPU", 0x40),
        ("145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x0 0x0)",
         "RLW_REMAP", "XID_154_EVAL", 0x1),
        ("145, RLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000003 0x80000000 0x0 0x0)",
         "RLW_CTRL", "IGNORE", 0x80000000),
        ("144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x0 0x0)",
         "SAW_MVB", "RESET_GPU", 0x2),
        ("146, TLW_TX Nonfatal XC0 i0 Link 4 (0x0000000c 0x00000002 0x0 0x0)",
         "TLW_TX/TLW_TX_PIPE0", "IGNORE", 0x2),
        ("149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x0 0x0 0x0 0x0)",
         "NETIR/NETIR_INT", "RESET_GPU", 0x0),
        ("145, RLW_RXPIPE Nonfatal XC0 i0 Link 2 (0x000004c2 0x00000001 0x0 0x0)",
         "RLW_RXPIPE", "RESET_GPU", 0x1),
        ("145, RLW_RXPIPE Nonfatal XC0 i0 Link 2 (0x000000c2 0x00000001 0x0 0x0)",
         "RLW_RXPIPE", "IGNORE", 0x1),
    ],
)
def test_nvlink5_decode(line: str, unit: str, action: str, status: int) -> None:
    ev = _one("NVRM: Xid (PCI:0019:01:00): " + line)
    d = ev.details
    assert (d["nvlink5_unit"], d["nvlink5_action"], d["error_status"]) == (unit, action, status)
    assert {"subunit", "severity", "xc", "instance", "link", "intr_info"} <= set(d)


def test_nvlink5_link_down_reason_and_unknown_rows() -> None:
    assert nvlink5.decode(149, "NETIR_LINK_EVT", [0x02A001C6, 0])["nvlink5_action"] == "RESET_GPU"
    assert nvlink5.decode(149, "NETIR_LINK_EVT", [0x028001C6, 0]) == {
        "intr_info": 0x028001C6,
        "error_status": 0,
        "link_down_reason": 0b101000,
        "nvlink5_unit": "NETIR_LINK_EVT/NETIR_LINK_DOWN",
        "nvlink5_action": "IGNORE",
        "nvlink5_investigatory": "INVESTIGATE_HOST",
        "nvlink5_severity": "Fatal",
    }
    ev = _one("NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Fatal XC0 i0 Link 17 (0x4 0x0)")
    assert "nvlink5_action" not in ev.details and ev.details["severity"] == "fatal"
    assert nvlink5.decode(145, "NOPE", []) == {}


# --- Table, fuzz ------------------------------------------------------------------------


def test_table_needles_pass_the_gate() -> None:
    for (gate, needle), matcher in TABLE:
        assert gate in GATE and has_needle(f"x {gate} {needle} y") and callable(matcher)
        assert matcher(f"{gate} {needle}") in (None, []), needle  # a needle alone is no record



def _table_says(line: str) -> bool:
    return any(gate in line and needle in line for (gate, needle), _m in TABLE)


_FRAGMENTS = [
    *sorted({t for (gate, needle), _m in TABLE for t in (gate, needle) if t}),
    "[ 12.345678] ", "NVRM: GPU at PCI:0000:3b:00: ", "kernel: ", "x", " ", "ort", "Xi", "d",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=6), st.text(max_size=40))
def test_has_needle_is_exactly_the_table(parts: list[str], noise: str) -> None:
    """The compiled gate (key character first, then gate, then needle) says True exactly
    when some TABLE entry's gate and needle are both in the line: the key-character pre-test
    drops no record."""
    line = noise.join(parts) + noise
    assert has_needle(line) == _table_says(line)
    for (gate, needle), _m in TABLE:
        for probe in (f"x {gate} {needle} y", gate, needle, gate[1:], gate[:-1]):
            assert has_needle(probe) == _table_says(probe), probe


RECORDS = [
    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={n}, name=p, Graphics SM Warp Exception on "
    "(GPC 1, TPC 2, SM 0): Out Of Range Address",
    "nvidia-nvswitch1: SXid (PCI:0000:{b:02x}:00.0): 12028, Non-fatal, Link 32 egress error",
    "pcieport 0000:00:{b:02x}.0: AER: Corrected error received: 0000:00:1c.5",
    "mlx5_core 0000:{b:02x}:00.0 mlx5_3: Port: 1 Link DOWN",
    "EXT4-fs (sd{b}): Remounting filesystem read-only",
    "INFO: task python:{n} blocked for more than 120 seconds.",
    "EDAC MC{b}: 1 UE memory read error on DIMM",
    "NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x{b:x}, reboot",
]
TIMESTAMPED = [p for p in PREFIXES if p.strip() and p != "kernel: "]

record_lists = st.lists(
    st.tuples(
        st.integers(0, len(RECORDS) - 1),
        st.sampled_from(TIMESTAMPED),
        st.integers(1, 250),
        st.integers(1, 99999),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_lists, st.sampled_from(["\n", " ", "\n\n"]))
def test_fuzz_each_record_once(recs: list[tuple[int, str, int, int]], sep: str) -> None:
    lines = [prefix + RECORDS[i].format(b=b, n=n) for i, prefix, b, n in recs]
    events = _kernel(sep.join(lines))
    assert len(events) == len(lines), (lines, events)
    for line, ev in zip(lines, events, strict=True):
        assert ev.text.split("\n")[0] == line.rstrip()


NEW_FORMATS = st.sampled_from(
    [
        "XidCriticalError: Xid=",
        "New status generated: &{Source:kernel-monitor Events:[{Severity:warn Timestamp:",
        "Conditions:[{Type:KernelDeadlock Status:True Reason:",
        "NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error ",
        "oom-kill:constraint=CONSTRAINT_NONE,task=",
        "NVRM: Xid (PCI:...): ",
        "NVRM:  Xid  154, GPU recovery action changed from 0x0 (",
        "192.0.2.10: kern: err: [2026-04-22T21:25:20Z]: ",
        "      ",
        "NVRM:     ",
        "BTRFS info (device ",
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x",
        "NVRM: GPU 18:00.0: GPU has ",
        "Killed process ",
        "[1.0] NVRM: Xid (PCI:0000:01:00): 13, x [1.1] NVRM: ",
    ]
).flatmap(lambda s: st.text(max_size=60).map(lambda t: s + t))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(NEW_FORMATS, st.text(max_size=80)), max_size=12))
def test_fuzz_new_formats_never_raise(lines: list[str]) -> None:
    text = "\n".join(lines)
    for ev in read_text(text) + _kernel(text) + _kernel(" ".join(lines)):
        json.dumps(ev.details)
        assert ev.kind in KINDS
