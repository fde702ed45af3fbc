"""Tool-output readers: ``nvidia-smi -q`` recovery fields and flat pastes, ``dcgmi diag``
tables, slurmctld node-state lines, ``scontrol show node`` without indentation.

Sample shapes: ``nvidia-smi -q`` of R570 (H100/H200; the ``GPU Reset Status`` block is the
real H200 570.86.15 output quoted in scitix/sichek's recovery-action test); ``dcgmi diag``
3.x tables as posted in NVIDIA/go-dcgm issue 52 and NVIDIA/DCGM issue 55, the 4.x per-GPU
layout of NVIDIA/DCGM issue 253; slurmctld wording from Slurm's ``src/slurmctld/node_mgr.c``
and ``ping_nodes.c``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.readers import (
    KINDS,
    SlurmctldReader,
    parse_dcgm_diag,
    parse_nvsmi,
    parse_slurmctld,
    read_text,
)
from agent.readers.nvsmi import recovery_action
from agent.readers.slurm import expand_hostlist
from tests import corpus
from workers.classify import classify_text

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "signals"
NVSMI_TWO = (DATA / "nvsmi_q_two_gpus.txt").read_text()
DCGM_3X = (DATA / "dcgm_diag_3x.txt").read_text()
DCGM_4X = (DATA / "dcgm_diag_4x.txt").read_text()
SLURMCTLD = (DATA / "slurmctld.log").read_text()

RESET_STATUS = (
    "    GPU Reset Status\n"
    "        Reset Required                    : {reset}\n"
    "        Drain and Reset Recommended       : {drain}\n"
    "    GPU Recovery Action                   : {action}\n"
)
DEPRECATED = "Requested functionality has been deprecated"


def _corpus(rec_id: str) -> dict:
    for line in corpus.CORPUS.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec["id"] == rec_id:
                return rec
    raise AssertionError(f"corpus record {rec_id} missing")


def _strip(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines())


def _tabs(text: str) -> str:
    out = []
    for line in text.splitlines():
        body = line.lstrip(" ")
        out.append("\t" * ((len(line) - len(body)) // 4) + body)
    return "\n".join(out)


def _one_space(text: str) -> str:
    return "\n".join((" " + ln.strip()) if ln.strip() else "" for ln in text.splitlines())


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


VARIANTS = {
    "as printed": lambda t: t,
    "stripped": _strip,
    "tabs": _tabs,
    "one space": _one_space,
    "crlf": _crlf,
    "stripped crlf": lambda t: _crlf(_strip(t)),
}
"""How pastes reach the reader: as printed, indentation stripped, tabs, one leading space
(web pages collapse runs of spaces), Windows line ends."""


# --- nvidia-smi -q: recovery fields --------------------------------------------------------


@pytest.mark.parametrize(
    ("printed", "norm"),
    [
        ("None", "none"),
        ("Reset", "reset"),
        ("GPU Reset", "reset"),
        ("Node Reboot", "node_reboot"),
        ("Reboot", "node_reboot"),
        ("Node Reboot Required", "node_reboot"),
        ("Drain P2P", "drain_p2p"),
        ("Drain and Reset", "drain_and_reset"),
        ("2", "node_reboot"),
        ("0x4", "drain_and_reset"),
        ("N/A", None),
        ("[N/A]", None),
        ("Not Supported", None),
        (DEPRECATED, None),
        ("Drain", None),
        ("7", None),
        ("something new", None),
    ],
)
def test_recovery_action_values(printed: str, norm: str | None) -> None:
    assert recovery_action(printed) == norm


@pytest.mark.parametrize(
    ("action", "flag", "norm"),
    [
        ("Reset", "recovery_reset", "reset"),
        ("Node Reboot", "recovery_node_reboot", "node_reboot"),
        ("Drain P2P", "recovery_drain_p2p", "drain_p2p"),
        ("Drain and Reset", "recovery_drain_and_reset", "drain_and_reset"),
    ],
)
def test_recovery_action_is_a_flag(action: str, flag: str, norm: str) -> None:
    text = RESET_STATUS.format(reset=DEPRECATED, drain=DEPRECATED, action=action)
    for name, variant in VARIANTS.items():
        (ev,) = read_text(variant(text))
        assert ev.kind == "nvsmi" and ev.level and ev.active, name
        assert ev.details["flags"] == [flag], name
        assert ev.details["gpu_recovery_action"] == norm, name
        assert "reset_required" not in ev.details, name  # the deprecated text is no value


@pytest.mark.parametrize("placeholder", [DEPRECATED, "N/A", "[N/A]", "Not Supported", "No"])
def test_deprecated_and_placeholder_fields_are_not_faults(placeholder: str) -> None:
    text = RESET_STATUS.format(reset=placeholder, drain=placeholder, action="None")
    text += (
        "    ECC Errors\n"
        f"        Channel Repair Pending            : {placeholder}\n"
        f"        Unrepairable Memory               : {placeholder}\n"
    )
    for name, variant in VARIANTS.items():
        assert read_text(variant(text)) == [], name


def test_reset_status_yes_flags() -> None:
    text = RESET_STATUS.format(reset="Yes", drain="Yes", action="None")
    (ev,) = read_text(text)
    assert ev.details["flags"] == ["reset_required", "drain_and_reset_recommended"]
    assert ev.details["gpu_recovery_action"] == "none"


def test_channel_repair_and_unrepairable_memory_flags() -> None:
    text = (
        "ECC Errors\n"
        "    Volatile\n"
        "        DRAM Uncorrectable   : 0\n"
        "    Channel Repair Pending   : Yes\n"
        "    Unrepairable Memory      : Yes\n"
    )
    for name, variant in VARIANTS.items():
        (ev,) = read_text(variant(text))
        assert ev.details["flags"] == ["unrepairable_memory", "channel_repair_pending"], name


def test_unknown_recovery_action_is_kept_but_raises_no_flag() -> None:
    text = "    GPU Recovery Action                   : Quarantine\n"
    assert read_text(text) == []
    (ev,) = parse_nvsmi(
        ["    GPU Recovery Action : Quarantine", "    Remapped Rows", "        Pending : Yes"]
    )
    assert ev.details["gpu_recovery_action_raw"] == "Quarantine"
    assert ev.details["flags"] == ["remap_pending"]


def test_corpus_recovery_action_excerpt_is_a_reset_flag() -> None:
    (ev,) = read_text(_corpus("r2-h06")["text"])
    assert ev.kind == "nvsmi" and ev.pci is None
    assert ev.details["flags"] == ["recovery_reset"]


@pytest.mark.parametrize(
    ("rec_id", "flag"), [("r2-h10", "remap_pending"), ("r2-h19", "dram_uncorrectable")]
)
def test_corpus_memory_excerpts_every_paste_variant(rec_id: str, flag: str) -> None:
    text = _corpus(rec_id)["text"]
    for name, variant in VARIANTS.items():
        (ev,) = read_text(variant(text))
        assert ev.kind == "nvsmi" and ev.details["flags"] == [flag], name


# --- nvidia-smi -q: sections by known words ------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_gpu_output_every_paste_variant(variant: str) -> None:
    events = read_text(VARIANTS[variant](NVSMI_TWO))
    assert [e.pci for e in events] == ["00000000:2A:00.0"]  # the first GPU is healthy
    d = events[0].details
    assert d["flags"] == [
        "remap_pending",
        "channel_repair_pending",
        "reset_required",
        "recovery_drain_and_reset",
        "dram_uncorrectable",
    ]
    assert d["dram_uncorrectable"] == 1 and d["aggregate_dram_uncorrectable"] == 5
    assert d["dram_correctable"] == 3 and d["remap_uncorrectable"] == 1
    assert d["serial"] == "1650000000001" and d["temperature_c"] == 35


def test_flat_paste_nests_by_known_words() -> None:
    # Aggregate counts are history, not a fault: read as volatile they would raise one.
    text = "ECC Errors\nVolatile\nDRAM Uncorrectable : 0\nAggregate\nDRAM Uncorrectable : 7\n"
    assert read_text(text) == []
    (ev,) = read_text(text.replace(": 0", ": 2"))
    assert ev.details["dram_uncorrectable"] == 2
    assert ev.details["aggregate_dram_uncorrectable"] == 7


def test_flat_paste_pending_belongs_to_its_section() -> None:
    assert read_text("ECC Mode\nCurrent : Enabled\nPending : Enabled\n") == []
    assert read_text("ECC Mode\nPending : Yes\n") == []
    (ev,) = read_text("Remapped Rows\nUncorrectable Error : 2\nPending : Yes\n")
    assert ev.details["remap_pending"] is True


def test_flat_old_format_double_bit_total_is_volatile_under_volatile_only() -> None:
    text = (
        "ECC Errors\nVolatile\nSingle Bit\nTotal : 0\nDouble Bit\nTotal : 0\n"
        "Aggregate\nSingle Bit\nTotal : 9\nDouble Bit\nTotal : 4\n"
    )
    assert read_text(text) == []
    (ev,) = read_text(text.replace("Double Bit\nTotal : 0", "Double Bit\nTotal : 1"))
    assert ev.details["dbe_volatile_total"] == 1 and ev.details["dbe_aggregate_total"] == 4


def test_nvsmi_mixed_with_kernel_and_scontrol_in_one_paste() -> None:
    text = (
        "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        + _strip(NVSMI_TWO)
        + "\nkern  :err   : [  219.470994] NVRM: Xid (PCI:0000:3c:00): 48, pid=1, name=x, "
        "An uncorrectable double bit error (DBE) has been detected on GPU (0x00 0x00).\n"
        "NodeName=gpu-02 Arch=x86_64 CoresPerSocket=32\n"
        "State=DOWN*+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A\n"
        "Reason=Xid 79 [root@2024-05-01T10:00:00]\n"
    )
    for name, variant in (("lf", lambda t: t), ("crlf", _crlf)):
        events = read_text(variant(text))
        assert [(e.kind, e.pci) for e in events] == [
            ("xid", "0000:3b:00"),
            ("nvsmi", "00000000:2A:00.0"),
            ("xid", "0000:3c:00"),
            ("slurm_node", None),
        ], name
        assert events[3].details["state"] == ["DOWN", "DRAIN", "NOT_RESPONDING"]
        assert events[3].details["reason"] == "Xid 79"


def test_lone_section_word_in_a_kernel_log_is_not_a_block() -> None:
    text = (
        "Temperature\n"
        "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        "Remapped Rows\n"
        "\n"
        "kern  :err   : [2.0] NVRM: Xid (PCI:0000:3c:00): 79, GPU has fallen off the bus.\n"
    )
    assert [(e.kind, e.pci) for e in read_text(text)] == [
        ("xid", "0000:3b:00"),
        ("xid", "0000:3c:00"),
    ]


# --- scontrol show node without indentation ------------------------------------------------

SCONTROL = (
    "NodeName=gpu-02 Arch=x86_64 CoresPerSocket=32\n"
    "   OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023\n"
    "   State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A\n"
    "   Gres=gpu:h100:8\n"
    "   Reason=gres/gpu count reported lower than configured (7 < 8) [slurm@2024-05-01T10:00:00]\n"
    "\n"
    "NodeName=gpu-03 Arch=x86_64 CoresPerSocket=32\n"
    "   State=IDLE ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A\n"
)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_scontrol_every_paste_variant(variant: str) -> None:
    (ev,) = read_text(VARIANTS[variant](SCONTROL))
    assert ev.kind == "slurm_node" and ev.details["node"] == "gpu-02"
    assert ev.details["state"] == ["IDLE", "DRAIN"]
    assert ev.details["reason"] == "gres/gpu count reported lower than configured (7 < 8)"
    assert ev.details["reason_user"] == "slurm" and ev.details["gres"] == "gpu:h100:8"


def test_stripped_scontrol_record_ends_at_a_kernel_line() -> None:
    text = _strip(SCONTROL.split("\n\n")[0]) + "\n[5.0] NVRM: Xid (PCI:0000:3b:00): 79, x\n"
    assert [e.kind for e in read_text(text)] == ["slurm_node", "xid"]


# --- slurmctld log lines -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "node", "state", "reason", "active"),
    [
        (
            "[2024-05-01T10:00:00.102] error: Setting node gpu-03 state to INVAL with "
            "reason:gres/gpu count reported lower than configured (7 < 8)",
            "gpu-03",
            ["INVALID_REG"],
            "gres/gpu count reported lower than configured (7 < 8)",
            True,
        ),
        ("drain_nodes: node gpu-03 state set to DRAIN", "gpu-03", ["DRAIN"], None, True),
        ("update_node: node gpu-03 state set to DRAINING", "gpu-03", ["DRAINING"], None, True),
        ("update_node: node gpu-03 state set to DOWN", "gpu-03", ["DOWN"], None, True),
        ("update_node: node gpu-03 state set to IDLE", "gpu-03", ["IDLE"], None, False),
        ("update_node: node gpu-03 reason set to: Xid 79", "gpu-03", [], "Xid 79", True),
        (
            "slurmctld: error: Nodes gpu-03 not responding, setting DOWN",
            "gpu-03",
            ["DOWN", "NOT_RESPONDING"],
            None,
            True,
        ),
        (
            "node gpu-03 not responding, setting DOWN",
            "gpu-03",
            ["DOWN", "NOT_RESPONDING"],
            None,
            True,
        ),
        ("error: Nodes gpu-03 not responding", "gpu-03", ["NOT_RESPONDING"], None, True),
        ("Node gpu-03 now responding", "gpu-03", [], None, False),
        ("node_did_resp: node gpu-03 returned to service", "gpu-03", ["IDLE"], None, False),
        (
            "_validate_node_reg: Node gpu-03 unexpectedly rebooted boot_time=1 last response=0",
            "gpu-03",
            ["DOWN"],
            "Node unexpectedly rebooted",
            True,
        ),
        (
            "error: validate_node_specs: Prolog or job env setup failure on node gpu-03, "
            "draining the node",
            "gpu-03",
            ["DRAIN"],
            "Prolog or job env setup failure",
            True,
        ),
        (
            "node gpu-03 not resumed by ResumeTimeout(300), setting DOWN and POWERED_DOWN",
            "gpu-03",
            ["DOWN", "POWERED_DOWN"],
            None,
            True,
        ),
    ],
)
def test_slurmctld_line(
    line: str, node: str, state: list[str], reason: str | None, active: bool
) -> None:
    prefixes = ["", "[2024-05-01T10:00:00.102] ", "Mar  3 10:00:00 head slurmctld[1533]: "]
    for prefix in prefixes:
        ev = parse_slurmctld(prefix + line)
        assert ev is not None, prefix
        assert ev.kind == "slurm_node" and ev.level and ev.active is active
        d = ev.details
        assert (d["node"], d["state"], d["reason"], d["source"]) == (
            node,
            state,
            reason,
            "slurmctld",
        )
        (via_text,) = read_text(prefix + line)
        assert via_text.details == d


@pytest.mark.parametrize(
    "line",
    [
        "[2024-05-01T10:00:00.101] debug:  Node gpu-03 has low real_memory size (1 / 2)",
        "_slurm_rpc_update_node complete for gpu-04 usec=48",
        "Killing JobId=4242 on failed node gpu-05",
        "nvme nvme0: I/O 12 QID 0 timeout, controller is not responding",
        "update_node: node gpu-03 does not exist",
        "Invalid node state transition requested for node gpu-03 from=DOWN to=RESUME",
    ],
)
def test_slurmctld_other_lines_are_not_events(line: str) -> None:
    assert parse_slurmctld(line) is None
    assert read_text(line) == []


def test_slurmctld_log_pairs_the_two_lines_of_one_change() -> None:
    events = read_text(SLURMCTLD)
    got = [(e.details["node"], e.details["state"], e.details["reason"], e.active) for e in events]
    assert got == [
        (
            "gpu-03",
            ["INVALID_REG", "DRAIN"],
            "gres/gpu count reported lower than configured (7 < 8)",
            True,
        ),
        ("gpu-04", ["DRAINING"], "Xid 79 GPU fallen off the bus", True),
        ("gpu-[05-06]", ["DOWN", "NOT_RESPONDING"], None, True),
        ("gpu-05", [], None, False),
        ("gpu-05", ["IDLE"], None, False),
        ("gpu-07", ["DOWN"], "Node unexpectedly rebooted", True),
        ("gpu-04", ["IDLE"], None, False),
    ]
    assert events[0].text.count("\n") == 1 and events[1].text.count("\n") == 1
    assert events[1].details["reason_time"] == "2024-05-01T10:01:00.000"
    assert events[2].details["nodes"] == ["gpu-05", "gpu-06"]
    assert events[3].summary == "Slurm node gpu-05 now responding"
    assert [e.kind for e in read_text(_crlf(SLURMCTLD))] == ["slurm_node"] * 7


def test_slurmctld_pairs_only_the_same_node_and_flushes_before_other_lines() -> None:
    r = SlurmctldReader()
    assert r.feed("update_node: node gpu-01 reason set to: maint") == []
    (alone,) = r.feed("update_node: node gpu-02 state set to DRAIN") or []
    assert alone.details["node"] == "gpu-01" and alone.details["state"] == []
    assert r.feed("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, x") is None
    (last,) = r.flush()
    assert last.details["node"] == "gpu-02" and last.details["reason"] is None
    assert r.flush() == []
    text = (
        "update_node: node gpu-01 reason set to: maint\n"
        "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        "update_node: node gpu-01 state set to DRAIN\n"
    )
    assert [(e.kind, e.details.get("state")) for e in read_text(text)] == [
        ("slurm_node", []),
        ("xid", None),
        ("slurm_node", ["DRAIN"]),
    ]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu-03", ["gpu-03"]),
        ("gpu-[01-03,05]", ["gpu-01", "gpu-02", "gpu-03", "gpu-05"]),
        ("a,b[1-2]", ["a", "b1", "b2"]),
        ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
        ("gpu-[3-1]", ["gpu-[3-1]"]),
        ("gpu-[01", ["gpu-[01"]),
        ("gpu-[a-b]", ["gpu-[a-b]"]),
        ("n[0-99999]", ["n[0-99999]"]),
    ],
)
def test_expand_hostlist(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


# --- dcgmi diag ----------------------------------------------------------------------------


def test_dcgm_3x_table() -> None:
    (ev,) = read_text(DCGM_3X)
    assert ev.kind == "dcgm_diag" and ev.level is False and ev.pci is None
    d = ev.details
    assert d["failed"] == ["GPU Memory", "Diagnostic"]
    assert d["warned"] == ["Targeted Stress"]
    assert d["skipped"] == ["PCIe", "Targeted Power"]
    assert d["passed"][:2] == ["Denylist", "NVML Library"] and "Memory Bandwidth" in d["passed"]
    assert d["failed_gpus"] == [0]
    assert (d["dcgm_version"], d["driver_version"]) == ("3.3.1", "535.129.03")
    assert d["warnings"][0].startswith("GPU 0 Error using CUDA API cuCtxCreate Check DCGM")
    assert "Reset GPU. Restart DCGM. Rerun diagnostics." in d["warnings"][0]
    assert "Rerun diagnostics." in d["warnings"][1] and len(d["warnings"]) == 2
    assert ev.summary == ("dcgmi diag: failed GPU Memory, Diagnostic; warned Targeted Stress")
    assert ev.text.startswith("+---") and ev.text.count("\n") == 37


def test_dcgm_4x_table() -> None:
    (ev,) = read_text(DCGM_4X)
    d = ev.details
    assert d["failed"] == ["memory"] and d["warned"] == ["pcie"]
    assert d["passed"] == ["software", "diagnostic"] and d["skipped"] == ["targeted_stress"]
    assert d["failed_gpus"] == [2] and d["dcgm_version"] == "4.2.3"
    assert d["warnings"] == [
        "GPU2: Error using CUDA API cuMemAlloc Check DCGM and system logs for errors. Reset GPU."
    ]


def test_dcgm_entity_fail_under_an_overall_pass_row_still_fails() -> None:
    rows = [
        "| Diagnostic                | Result                                         |",
        "| memory                    | Pass                                           |",
        "|                           | GPU0: Pass                                     |",
        "|                           | GPU1: Fail                                     |",
    ]
    (ev,) = parse_dcgm_diag(rows)
    assert ev.details["failed"] == ["memory"] and ev.details["failed_gpus"] == [1]


@pytest.mark.parametrize("table", ["3x", "4x"])
def test_dcgm_passing_or_skipped_table_prints_nothing(table: str) -> None:
    text = DCGM_3X if table == "3x" else DCGM_4X
    clean = text.replace("Fail", "Pass").replace("Warn", "Pass")
    assert read_text(clean) == []
    assert read_text(clean.replace("Pass", "Skip")) == []


def test_dcgm_variants_and_mixed_paste() -> None:
    text = (
        "[10.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        "$ dcgmi diag -r 3\n"
        + DCGM_3X
        + "[11.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit "
        "error (DBE) has been detected on GPU (0x00 0x00).\n" + DCGM_4X
    )
    for name, variant in (("lf", lambda t: t), ("crlf", _crlf), ("stripped", _strip)):
        events = read_text(variant(text))
        assert [e.kind for e in events] == ["xid", "dcgm_diag", "xid", "dcgm_diag"], name
        assert events[1].details["failed"] == ["GPU Memory", "Diagnostic"], name
        assert events[3].details["failed"] == ["memory"], name
    indented = "\n".join("    " + ln for ln in DCGM_3X.splitlines())
    (ev,) = read_text(indented)
    assert ev.details["failed"] == ["GPU Memory", "Diagnostic"]


def test_two_tables_back_to_back_are_two_events() -> None:
    body = DCGM_3X.split("\n", 1)[1]  # without "Successfully ran diagnostic for group."
    events = read_text(body + body.replace("Fail", "Warn"))
    assert [e.details.get("failed") for e in events] == [["GPU Memory", "Diagnostic"], None]
    assert events[1].details["warned"] == ["GPU Memory", "Diagnostic", "Targeted Stress"]


def test_headerless_dcgm_excerpt_by_known_test_name() -> None:
    (ev,) = read_text("| GPU Memory                | Fail - All                    |\n")
    assert ev.details["failed"] == ["GPU Memory"]


def test_other_boxed_tables_are_not_dcgm_and_still_reach_the_kernel_reader() -> None:
    text = (
        "| Page        | Result                         |\n"
        "|-------------|--------------------------------|\n"
        "| login.html  | Fail - allauth container small |\n"
        "| dmesg       | NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus. |\n"
    )
    assert [e.kind for e in read_text(text)] == ["xid"]


def test_new_kinds_are_known() -> None:
    kinds = {e.kind for e in read_text(DCGM_3X + SLURMCTLD + NVSMI_TWO)}
    assert kinds == {"dcgm_diag", "slurm_node", "nvsmi"} and kinds <= KINDS
    for obj in classify_text(DCGM_3X + SLURMCTLD + NVSMI_TWO):
        json.dumps(obj)
