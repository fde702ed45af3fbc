"""Readers: every corpus record, own variants per prefix/format family, records, fuzz."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.readers import KINDS, FaultEvent, KernelLogReader, parse_state, read_text
from agent.readers.kernel.fold import WINDOW_LINES
from tests import corpus
from workers.classify import classify_text

ROOT = Path(__file__).resolve().parents[2]
CORPUS = corpus.CORPUS
DATA = ROOT / "tests" / "data" / "signals"

REPAIR_CLASS = {
    "none": {"none"},
    "reset_gpu": {"reset_gpu", "reboot", "power_cycle"},
    "reboot": {"reboot", "power_cycle"},
    "hardware": {"remove", "migrate"},
}
"""``repair_class`` semantics of the corpus README."""

ACTION_ORDER = ["none", "reset_gpu", "reboot", "power_cycle", "reprovision", "migrate", "remove"]
"""Lightest first (docs/design.md §5), for the corpus README's "heaviest action" of a multi record."""

PREFIXES = [
    "",
    "[74889.644138] ",
    "[    5.000001] ",
    "[Fri Mar  3 04:28:38 2023] ",
    "Mar 29 15:38:59 gpu-node-07 kernel: ",
    "Mar 29 15:38:59 kernel: ",
    "kernel: ",
    "Dec  2 11:38:47 node-a kernel: [  219.470994] ",
    "kern  :err   : [  219.470994] ",
    "kern  :warn  : [Fri Mar  3 04:28:38 2023] ",
    "line kern  :err   : 2025-01-25T10:34:54,859532+00:00 ",
    "2024-03-29T15:38:59.123456+00:00 gpu-node-07 kernel: ",
    "Mar 29 15:38:59.123456 gpu-node-07 kernel: ",
]
"""Timestamp prefix families: dmesg, dmesg -T, syslog, journald, dmesg -x, ISO."""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check(objs: list[dict], expect: dict, label: str) -> None:
    kind = expect["kind"]
    if kind == "none":
        assert objs == [], f"{label}: expected no event, got {objs}"
        return
    if expect.get("multi"):
        # corpus README: the named event is among them; the heaviest action is in class
        named = [
            o for o in objs
            if o["kind"] == kind
            and all(o[k] == expect[k] for k in ("xid", "pci", "pid", "process") if k in expect)
        ]
        assert named, f"{label}: no {kind} event with the expected fields in {objs}"
        if "repair_class" in expect:
            worst = max((o["action"] for o in objs), key=ACTION_ORDER.index)
            allowed = REPAIR_CLASS[expect["repair_class"]]
            assert worst in allowed, f"{label}: heaviest action {worst} not in {allowed}"
        return
    assert len(objs) == 1, f"{label}: expected one event, got {objs}"
    got = objs[0]
    assert got["kind"] == kind, label
    for key in ("xid", "pci", "pid", "process", "state", "reason", "reason_user"):
        if key in expect:
            assert got[key] == expect[key], f"{label}: {key} {got[key]!r} != {expect[key]!r}"
    for key in ("remap_pending", "remap_failure", "dram_uncorrectable"):
        if key in expect:
            assert got[key] == expect[key], f"{label}: {key}"
    for key in (
        "gpc",
        "tpc",
        "sm",
        "link",
        "subunit",
        "severity_detail",
        "recovery_action",
        "caused_by_xid",
        "channel",
        "gpu_instance",
        "compute_instance",
        "gpu_index",
    ):
        if key in expect:
            assert got.get(key) == expect[key], f"{label}: {key} {got.get(key)!r}"
    if "severity" in expect and kind in ("xid", "sxid"):
        assert got.get("error_severity") == expect["severity"], label
        assert got["severity"] in ("info", "warning", "critical")
    if "repair_class" in expect:
        allowed = REPAIR_CLASS[expect["repair_class"]]
        assert got["action"] in allowed, f"{label}: action {got['action']} not in {allowed}"
    for key in (
        "kind",
        "xid",
        "pci",
        "pid",
        "process",
        "mnemonic",
        "severity",
        "action",
        "summary",
    ):
        assert key in got, f"{label}: missing {key}"


@pytest.mark.parametrize("rec", _records(CORPUS), ids=lambda r: r["id"])
def test_corpus_record(rec: dict) -> None:
    _check(classify_text(rec["text"]), rec["expect"], rec["id"])


@pytest.mark.parametrize("rec", _records(CORPUS), ids=lambda r: r["id"])
def test_corpus_record_any_prefix(rec: dict) -> None:
    if "\n" in rec["text"] or rec["category"] in ("slurm", "nvidia-smi"):
        pytest.skip("multi-line tool output has no per-line kernel prefix")
    payload = rec["text"]
    for prefix in PREFIXES:
        _check(classify_text(prefix + payload), rec["expect"], f"{rec['id']} {prefix!r}")


@pytest.mark.parametrize(
    "rec", _records(DATA / "kernel_variants.jsonl"), ids=lambda r: r["text"][:48]
)
def test_variant_every_prefix(rec: dict) -> None:
    for prefix in PREFIXES:
        _check(classify_text(prefix + rec["text"]), rec["expect"], f"{prefix!r}{rec['text']}")


def test_negative_controls_print_nothing() -> None:
    text = (DATA / "negative.txt").read_text()
    for prefix in PREFIXES:
        body = "\n".join(prefix + line for line in text.splitlines())
        assert read_text(body) == [], prefix


def test_multiline_records_count_once() -> None:
    events = read_text((DATA / "multiline.log").read_text())
    assert [e.kind for e in events] == [
        "gpu_lost",
        "sxid",
        "pcie_aer_fatal",
        "xfs_shutdown",
        "gpu_init_failed",
    ]
    lost, sxid, aer, xfs, init = events
    assert lost.pci == "0000:3b:00.0" and lost.text.count("\n") == 2
    assert "fallen off the bus" in lost.text
    assert sxid.xid == 12028 and sxid.details["severity"] == "nonfatal"
    assert sxid.details["link"] == 32 and sxid.text.count("\n") == 2
    assert aer.pci == "0000:41:00.0" and aer.details["devices"] == ["0000:00:03.1", "0000:41:00.0"]
    assert xfs.details["device"] == "md127"
    assert init.details == {"error": "0x24:0x72:1568", "minor": 3}


def test_streaming_reader_emits_record_once_on_next_line_or_flush() -> None:
    r = KernelLogReader()
    assert r.feed("[1.0] NVRM: The NVIDIA GPU 0000:3b:00.0\n") == []
    assert r.feed("[1.0] NVRM: (PCI ID: 10de:20b2) installed in this system has\n") == []
    assert r.feed("[1.0] NVRM: fallen off the bus and is not responding to commands.\n") == []
    # the block and its own Xid 79 are one fault: the Xid 79 event carries the block
    assert r.feed("[2.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") == []
    (ev,) = r.flush()
    assert (ev.kind, ev.xid, ev.pci) == ("xid", 79, "0000:3b:00")
    assert ev.details["related_evidence"][0].count("\n") == 2
    assert "fallen off the bus and is not" in ev.details["related_evidence"][0]
    assert r.flush() == []
    r.feed("[1.0] NVRM: The NVIDIA GPU 0000:5e:00.0")
    r.feed("[1.0] NVRM: (PCI ID: 10de:20b2) installed in this system has")
    r.feed("[1.0] NVRM: fallen off the bus and is not responding to commands.")
    flushed = r.flush()
    assert len(flushed) == 1 and flushed[0].pci == "0000:5e:00.0"
    assert r.flush() == []
    # a one-line record is complete once the next line shows it is not wrapped; an Xid
    # then waits WINDOW_LINES lines for the device plugin's report of it (issue 25)
    assert r.feed("[3.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=p, x") == []
    got = [e.xid for i in range(WINDOW_LINES + 1) for e in r.feed(f"[3.{i}] systemd[1]: S.")]
    assert got == [13]
    assert r.feed("[4.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=p, x") == []
    assert [e.xid for e in r.feed("[4.1] systemd[1]: S.")] == []
    assert [e.xid for e in r.flush()] == [13]


def test_unsupported_gpu_block_is_not_gpu_lost() -> None:
    text = (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1c82)\n"
        "NVRM: installed in this system is not supported by the\n"
        "NVRM: NVIDIA 535.129.03 driver release.\n"
    )
    assert read_text(text) == []


def test_xid_burst_every_line_is_an_event_with_its_own_gpc() -> None:
    lines = [
        f"[10.{i}] NVRM: Xid (PCI:0000:cb:00): 13, pid=1, name=p, Graphics SM Warp Exception "
        f"on (GPC {i}, TPC 0, SM 0): Illegal Instruction Parameter"
        for i in range(3)
    ]
    events = read_text("\n".join(lines))
    assert [e.details["gpc"] for e in events] == [0, 1, 2]
    assert events[0].summary == events[0].summary.strip()
    assert "pid" not in events[0].summary


def test_aer_corrected_burst_groups_per_report() -> None:
    one = (
        "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5\n"
        "pcieport 0000:00:1c.5: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "(Receiver ID)\n"
        "pcieport 0000:00:1c.5:   device [8086:a33d] error status/mask=00000001/00002000\n"
        "pcieport 0000:00:1c.5:    [ 0] RxErr\n"
    )
    events = read_text(one * 3)
    assert [e.kind for e in events] == ["pcie_aer_corrected"] * 3
    nonfatal = "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0"
    ev = read_text(nonfatal)
    assert ev[0].kind == "pcie_aer_corrected" and ev[0].details["uncorrected_nonfatal"]


def test_nvsmi_old_format_and_throttle() -> None:
    text = (
        "GPU 00000000:3B:00.0\n"
        "    ECC Errors\n"
        "        Volatile\n"
        "            Single Bit\n"
        "                Device Memory               : 2\n"
        "                Total                       : 2\n"
        "            Double Bit\n"
        "                Device Memory               : 1\n"
        "                Total                       : 1\n"
        "        Aggregate\n"
        "            Double Bit\n"
        "                Total                       : 4\n"
        "    Retired Pages\n"
        "        Single Bit ECC              : 0\n"
        "        Double Bit ECC              : 2\n"
        "        Pending Page Blacklist      : Yes\n"
        "GPU 00000000:5E:00.0\n"
        "    Clocks Event Reasons\n"
        "        Idle                              : Not Active\n"
        "        HW Slowdown                       : Active\n"
        "            HW Thermal Slowdown           : Active\n"
        "    Temperature\n"
        "        GPU Current Temp                  : 91 C\n"
        "GPU 00000000:86:00.0\n"
        "    Remapped Rows\n"
        "        Pending                           : No\n"
        "        Remapping Failure Occurred        : No\n"
    )
    objs = classify_text(text)
    assert [o["pci"] for o in objs] == ["00000000:3B:00.0", "00000000:5E:00.0"]
    first, second = objs
    assert first["dbe_volatile_total"] == 1 and first["dbe_aggregate_total"] == 4
    assert first["retired_pending"] is True and first["action"] == "reset_gpu"
    assert second["hw_thermal_slowdown"] is True and second["temperature_c"] == 91
    assert second["action"] == "none"


def test_nvsmi_remap_failure_is_hardware() -> None:
    text = (
        "    Remapped Rows\n"
        "        Correctable Error                 : 0\n"
        "        Uncorrectable Error               : 3\n"
        "        Pending                           : No\n"
        "        Remapping Failure Occurred        : Yes\n"
    )
    (obj,) = classify_text(text)
    assert obj["kind"] == "nvsmi" and obj["pci"] is None
    assert obj["remap_failure"] is True and obj["action"] in REPAIR_CLASS["hardware"]


@pytest.mark.parametrize(
    ("raw", "flags"),
    [
        ("IDLE+DRAIN", ["IDLE", "DRAIN"]),
        ("DOWN*+DRAIN", ["DOWN", "DRAIN", "NOT_RESPONDING"]),
        ("IDLE~", ["IDLE"]),
        ("mixed#+drain", ["MIXED", "DRAIN"]),
        ("ALLOCATED+DRAIN+NOT_RESPONDING", ["ALLOCATED", "DRAIN", "NOT_RESPONDING"]),
        ("DOWN$", ["DOWN"]),
    ],
)
def test_slurm_state_flags(raw: str, flags: list[str]) -> None:
    assert parse_state(raw) == flags


def test_slurm_records_mixed_with_kernel_and_healthy_record() -> None:
    text = (
        "NodeName=gpu-01 Arch=x86_64 CoresPerSocket=32\n"
        "   State=IDLE ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
        "\n"
        "[12.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        "NodeName=gpu-02 Arch=x86_64 CoresPerSocket=32\n"
        "   OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023\n"
        "   State=DOWN*+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A\n"
        "   Reason=Xid 79 = GPU lost, power cycle [root@2024-05-01T10:00:00]\n"
    )
    objs = classify_text(text)
    assert [o["kind"] for o in objs] == ["xid", "slurm_node"]
    s = objs[1]
    assert s["state"] == ["DOWN", "DRAIN", "NOT_RESPONDING"]
    assert s["reason"] == "Xid 79 = GPU lost, power cycle"
    assert s["reason_user"] == "root" and s["reason_time"] == "2024-05-01T10:00:00"
    assert s["node"] == "gpu-02" and s["action"] == "none"


def test_event_fields_types() -> None:
    (ev,) = read_text("NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], x")
    assert isinstance(ev, FaultEvent)
    assert (ev.kind, ev.xid, ev.pci, ev.pid, ev.process) == (
        "xid",
        79,
        "0000:c6:00",
        1101234,
        "nvc:[driver]",
    )
    assert ev.level is False and ev.active is True
    json.dumps(ev.details)


JUNK = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace")),
    st.sampled_from(
        [
            "NVRM: Xid (PCI:0000:c6:00): 79, pid=",
            "NVRM: Xid (PCI:",
            "NVRM: Xid (",
            "SXid (PCI:0000:84:00.0): ",
            "NVRM: The NVIDIA GPU 0000:3b:00.0",
            "AER: Uncorrected (Fatal) error received: ",
            "NodeName=",
            "   State=",
            "   Reason=[",
            "GPU 00000000:10:1C.0",
            "        Pending                           : ",
            "INFO: task ",
            "EDAC MC0: ",
            "mlx5_core 0000:c1:00.0 mlx5_7: Port: ",
            # nvidia-smi -q, flat and tab-indented, recovery fields
            "ECC Errors",
            "Volatile",
            "\tAggregate",
            "GPU Reset Status",
            "Reset Required : ",
            "\t\tDrain and Reset Recommended : ",
            "GPU Recovery Action : ",
            "Channel Repair Pending : ",
            "DRAM Uncorrectable : ",
            "Remapped Rows",
            "Pending : ",
            # dcgmi diag tables
            "+---------------------------+-----------------------+",
            "| Diagnostic                | Result                |",
            "|-----  Metadata  ----------+-----------------------|",
            "+-----  Hardware  ----------+-----------------------+",
            "| GPU Memory                | Fail - GPU: ",
            "| memory                    | ",
            "|                           | GPU",
            "| Warning                   | ",
            "|",
            "+",
            # slurmctld
            "error: Setting node ",
            "drain_nodes: node gpu-1 state set to ",
            "update_node: node ",
            "update_node: node gpu-1 reason set to: ",
            "error: Nodes gpu-[",
            "Node gpu-1 now responding",
            "node_did_resp: node ",
            "State=",
            "Reason=",
        ]
    ).flatmap(lambda s: st.text(max_size=60).map(lambda t: s + t)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(JUNK, max_size=12))
def test_fuzz_readers_never_raise(lines: list[str]) -> None:
    text = "\n".join(lines)
    events = read_text(text)
    for ev in events:
        json.dumps(ev.details)
    r = KernelLogReader()
    for line in lines:
        r.feed(line)
    r.flush()
    classify_text(text)


TOOL_SAMPLES = [
    (DATA / "nvsmi_q_two_gpus.txt").read_text(),
    (DATA / "dcgm_diag_3x.txt").read_text(),
    (DATA / "dcgm_diag_4x.txt").read_text(),
    (DATA / "slurmctld.log").read_text(),
    "NodeName=gpu-02 Arch=x86_64\n   State=DOWN*+DRAIN Weight=1\n   Reason=Xid 79 [root@t]\n",
]
"""Whole tool outputs the structured fuzz cuts up and re-indents."""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(TOOL_SAMPLES) - 1),
            st.integers(min_value=0, max_value=120),
            st.integers(min_value=0, max_value=40),
            st.sampled_from(["", " ", "\t", "    ", "\t\t"]),
        ),
        max_size=6,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(JUNK, max_size=3),
)
def test_fuzz_tool_output_slices(
    slices: list[tuple[int, int, int, str]], newline: str, junk: list[str]
) -> None:
    """Slices of real tool outputs, re-indented (kept, stripped, tabs), interleaved with
    junk and joined by any line end: the readers never raise, events serialise, and every
    event's evidence is text of the paste."""
    parts: list[str] = []
    for k, (which, start, length, indent) in enumerate(slices):
        lines = TOOL_SAMPLES[which].splitlines()[start : start + length]
        if indent:
            lines = [indent + ln.strip() for ln in lines]
        parts.extend(lines)
        if k < len(junk):
            parts.append(junk[k])
    text = newline.join(parts)
    flat = text.replace("\r\n", "\n").replace("\r", "\n")
    for ev in read_text(text):
        json.dumps(ev.details)
        assert ev.kind in KINDS
        for piece in ev.text.split("\n"):
            assert piece.rstrip() in flat
    classify_text(text)


@settings(max_examples=20, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(min_value=1, max_value=3))
def test_fuzz_very_long_lines(chunk: bytes, copies: int) -> None:
    junk = chunk.decode("utf-8", errors="replace") * (200_000 // len(chunk) + 1)
    line = "NVRM: Xid (PCI:0000:c6:00): 79, pid=1, name=" + junk
    for text in (
        junk,
        line * copies,
        "NodeName=x " + junk,
        "    K : " + junk,
        "| GPU Memory | Fail - GPU: " + junk + " |",
        "update_node: node gpu-[" + junk,
        "ECC Errors\nVolatile\nDRAM Uncorrectable : " + junk,
    ):
        read_text(text)


def test_aer_head_line_names_the_device_that_erred() -> None:
    (ev,) = read_text(
        "[ 12.0] pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:01:00.0"
    )
    assert ev.kind == "pcie_aer_fatal" and ev.pci == "0000:01:00.0"
    assert ev.details["devices"] == ["0000:00:03.1"]  # the reporting port stays in evidence
    (by_id,) = read_text(
        "[1.0] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010"
    )
    assert by_id.pci == "0000:00:02.0"
