"""Fault signals, round 3 (issue 25): each family over its formats — every kernel-log
prefix family, CRLF, wrapping, ANSI colours, interleaving — through the streaming reader,
``read_text`` and ``autorepair classify``."""

from __future__ import annotations

import json

import pytest

from agent.readers import FaultEvent, read_text
from agent.readers.events import KINDS
from agent.readers.kernel import read_kernel_lines
from agent.readers.nvsmi import strip_annotation
from workers.classify import classify_text

PREFIXES = [
    "",
    "[12345.678901] ",
    "[Fri Mar  3 04:28:38 2023] ",
    "Mar  3 04:28:38 gpu-node-07 kernel: ",
    "kernel: ",
    "kern  :err   : [  219.470994] ",
    "2024-03-29T15:38:59.123456+00:00 gpu-node-07 kernel: ",  # RFC 3339 syslog / short-iso
    "2026-10-07T02:58:49+0000 gpu-node-07 kernel: ",  # journalctl -o short-iso
    "<3>1 2026-10-07T02:58:49.123456+00:00 gpu-node-07 kernel - - - ",  # RFC 5424
    "192.0.2.10: kern: err: [2026-04-22T21:25:20.466440686Z]: ",  # Talos
]
"""Prefix families a kernel line arrives with (dmesg, dmesg -T, syslog, journald, dmesg -x,
ISO / short-iso, RFC 5424, Talos)."""

ANSI = "\x1b[31m{}\x1b[0m"


def _kernel(text: str) -> list[FaultEvent]:
    events: list[FaultEvent] = []
    read_kernel_lines(text.split("\n"), events.append)
    return events


def _both(text: str) -> list[FaultEvent]:
    """Streaming reader and ``read_text`` agree (the agent and classify); returns events."""
    direct = _kernel(text)
    via = read_text(text)
    assert [(e.kind, e.pci, e.details) for e in direct] == [
        (e.kind, e.pci, e.details) for e in via
    ], text
    for ev in via:
        json.dumps(ev.details)
        assert ev.kind in KINDS
    return via


def _classified(text: str) -> list[dict[str, object]]:
    return classify_text(text)


# --- family 3: nvidia-smi -q values with trailing text ----------------------------------


@pytest.mark.parametrize(
    "raw, want",
    [
        ("Yes   <===", "Yes"),
        ("Yes  # needs reset", "Yes"),
        ("Yes # needs reset", "Yes"),
        ("1   <== look", "1"),
        ("No  (ok)", "No"),
        ("Yes <-- here", "Yes"),
        ("Yes ← pending", "Yes"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),  # free text keeps its words
        ("Not Active  <==", "Not Active"),
        ("Yes, reset pending", "Yes"),
        ("Yes - see ticket 42", "Yes"),
        ("Yes!!", "Yes"),
        ("Yes => reset", "Yes"),
        ("Yes [needs reset]", "Yes"),
        ("[N/A]", "[N/A]"),
        ("-1", "-1"),
        ("0x2 (Node Reboot)", "0x2 (Node Reboot)"),
    ],
)
def test_nvsmi_value_annotation_is_cut(raw: str, want: str) -> None:
    assert strip_annotation(raw) == want


@pytest.mark.parametrize(
    "marker", ["   <===", "  # needs reset", "\t<-- pending!", "  (needs reset)", " ***"]
)
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_nvsmi_pending_flag_with_trailing_text(marker: str, ending: str) -> None:
    text = ending.join(
        [
            "    Remapped Rows",
            "        Uncorrectable Error               : 1",
            f"        Pending                           : Yes{marker}",
        ]
    )
    objs = [o for o in _classified(text) if o["kind"] == "nvsmi"]
    assert len(objs) == 1, objs
    assert objs[0]["remap_pending"] is True
    assert objs[0]["action"] == "reset_gpu"


def test_nvsmi_flat_paste_with_annotations_on_several_values() -> None:
    text = "\n".join(
        [
            "GPU 00000000:18:00.0",
            "    GPU Reset Status",
            "        Reset Required                    : Yes  # needs reset",
            "        Drain and Reset Recommended       : No",
            "    GPU Recovery Action                   : Reset   <=== here",
        ]
    )
    (ev,) = read_text(text)
    assert ev.kind == "nvsmi"
    assert ev.details["reset_required"] is True
    assert ev.details["gpu_recovery_action"] == "reset"
    assert ev.pci == "00000000:18:00.0"


# --- family 4: AER "Correctable" wording ------------------------------------------------

AER_CORRECTABLE = [
    "pcieport 0000:00:03.1: AER: Correctable error message received from 0000:41:00.0",
    "pcieport 0000:00:03.1: AER: Multiple Correctable error message received from "
    "0000:41:00.0",
    "nvidia 0000:41:00.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, "
    "(Receiver ID)",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("line", AER_CORRECTABLE)
def test_aer_correctable_wording_counts_as_corrected(prefix: str, line: str) -> None:
    events = _both(prefix + line)
    assert [e.kind for e in events] == ["pcie_aer_corrected"], events
    assert events[0].pci == "0000:41:00.0"
    assert "uncorrected_nonfatal" not in events[0].details


def test_aer_correctable_report_is_one_event_with_its_status_lines() -> None:
    text = "\n".join(
        [
            "[  5.1] pcieport 0000:00:03.1: AER: Correctable error message received from "
            "0000:41:00.0",
            "[  5.1] nvidia 0000:41:00.0: PCIe Bus Error: severity=Correctable, "
            "type=Data Link Layer, (Transmitter ID)",
            "[  5.1] nvidia 0000:41:00.0:   device [10de:2330] error status/mask=00001000/0000e000",
            "[  5.1] nvidia 0000:41:00.0:    [12] Timeout",
        ]
    )
    (ev,) = _both(text)
    assert ev.kind == "pcie_aer_corrected"
    assert ev.details["type"] == "Data Link Layer"
    assert ev.text.count("\n") == 3


@pytest.mark.parametrize("prefix", ["[  5.1] ", "Mar  3 04:28:38 gpu-node-07 kernel: ", ""])
def test_aer_correctable_wrapped_at_the_source_address(prefix: str) -> None:
    text = (prefix + "pcieport 0000:00:03.1: AER: Correctable error message received\n"
            + prefix + "    from 0000:41:00.0")
    (ev,) = _both(text)
    assert ev.kind == "pcie_aer_corrected" and ev.pci == "0000:41:00.0"


def test_aer_uncorrectable_is_not_read_as_correctable() -> None:
    (ev,) = _both("nvidia 0000:41:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), "
                  "type=Transaction Layer, (Requester ID)")
    assert ev.kind == "pcie_aer_fatal"


# --- family 7: nic_fatal ----------------------------------------------------------------

NIC_LINES = [
    ("mlx5_core 0000:3b:00.0: poll_health:835:(pid 0): device's health compromised - "
     "reached miss count", "0000:3b:00.0", "health_compromised", "reboot"),
    ("mlx5_core 0000:3b:00.0: print_health_info:431:(pid 0): Health issue observed, "
     "firmware internal error, severity(3) ERROR:", "0000:3b:00.0", "fw_internal_error",
     "reboot"),
    ("mlx5_core 0000:af:00.1: print_health_info:383:(pid 0): synd 0x1: firmware internal "
     "error", "0000:af:00.1", "fw_internal_error", "reboot"),
    ("mlx5_core 0000:af:00.1: mlx5_health_try_recover:330:(pid 77): Fatal error 1 detected",
     "0000:af:00.1", "fw_fatal", "reboot"),
    ("mlx5_core 0000:3b:00.0: ENABLE_HCA(0x104) timeout. Will cause a leak of a command "
     "resource", "0000:3b:00.0", "cmd_timeout", "reboot"),
    ("mlx5_core 0000:3b:00.0: mlx5_fw_fatal_reporter_err_work:648:(pid 77): Driver is in error "
     "state. Unloading", "0000:3b:00.0", "fw_fatal", "reboot"),
    ("mlx5_core 0000:88:00.0: Port module event[error]: module 0, Cable error, High "
     "Temperature", "0000:88:00.0", "module_error", "none"),
    ("mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power "
     "on the PCIe slot (27W).", "0000:5c:00.0", "pcie_insufficient_power", "none"),
    ("mlx5_core 0000:5c:00.0: 63.008 Gb/s available PCIe bandwidth, limited by 8.0 GT/s PCIe "
     "x8 link at 0000:00:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
     "0000:5c:00.0", "pcie_link_degraded", "none"),
    ("mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 1035): handling bad device here",
     "0000:3b:00.0", "fw_fatal", "reboot"),
    ("efa 0000:00:06.0: Device isn't ready, abort com init 0x0", "0000:00:06.0",
     "efa_device_not_ready", "reboot"),
    ("infiniband rdmap16s27: Admin queue is closed", None, "efa_admin_queue_closed", "reboot"),
    ("infiniband rdmap16s27: Failed to process command CREATE_QP (opcode 1) comp_status 0 err "
     "-110: Wait for completion (polling) timeout", None, "efa_admin_timeout", "reboot"),
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("line, pci, event, action", NIC_LINES)
def test_nic_fatal_family(
    prefix: str, line: str, pci: str | None, event: str, action: str
) -> None:
    events = _both(prefix + line)
    assert [e.kind for e in events] == ["nic_fatal"], events
    ev = events[0]
    assert ev.pci == pci
    assert ev.details["nic_event"] == event
    (obj,) = _classified(prefix + line)
    assert obj["action"] == action
    assert obj["kind"] == "nic_fatal" and "unmapped" not in obj


@pytest.mark.parametrize(
    "line",
    [
        "ena 0000:00:05.0: Device isn't ready, abort com init",  # ENA, not EFA
        "ena 0000:00:05.0 eth0: Device isn't ready, can't reset device",
        "mlx5_core 0000:12:00.0: Port module event: module 0, Cable plugged",
        "mlx5_core 0000:12:00.0: PCIe slot advertised sufficient power (75W).",
        "mlx5_core 0002:01:00.0: 126.028 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x4 link)",
        "mlx5_core 0000:3b:00.0: mlx5_fw_tracer_start:794:(pid 9): FWTracer: Ownership granted",
    ],
)
def test_nic_lookalikes_are_not_faults(line: str) -> None:
    assert [e for e in _both("[ 1.0] " + line) if e.kind == "nic_fatal"] == []


def test_mlx5_health_dump_is_one_event_across_interleaved_lines() -> None:
    text = "\r\n".join(
        [
            "[ 1234.5678] mlx5_core 0000:3b:00.0: poll_health:835:(pid 0): device's health "
            "compromised - reached miss count",
            "[ 1234.5679] mlx5_core 0000:3b:00.0: print_health_info:431:(pid 0): assert_var[0] "
            "0x00000000",
            "[ 1234.5679] systemd[1]: Started Session 4 of user root.",
            "[ 1234.5680] mlx5_core 0000:3b:00.0: print_health_info:442:(pid 0): synd 0x1: "
            "firmware internal error",
            "[ 1234.5681] mlx5_core 0000:3b:00.0: print_health_info:443:(pid 0): ext_synd 0x8b5f",
            "[ 1234.5682] mlx5_core 0000:3b:00.0: print_health_info:444:(pid 0): raw fw_ver "
            "0x1c1f1000",
            "[ 1234.5690] mlx5_core 0000:3b:00.1: poll_health:835:(pid 0): device's health "
            "compromised - reached miss count",
        ]
    )
    events = [e for e in _both(text) if e.kind == "nic_fatal"]
    assert [e.pci for e in events] == ["0000:3b:00.0", "0000:3b:00.1"]
    first = events[0]
    assert first.details["nic_event"] == "health_compromised"
    assert first.details["syndrome"] == "0x1"
    assert first.details["ext_syndrome"] == "0x8b5f"
    assert first.details["fw_version"] == "0x1c1f1000"
    assert "Started Session" not in first.text


@pytest.mark.parametrize("prefix", ["[ 1.0] ", "Mar  3 04:28:38 gpu-node-07 kernel: "])
def test_nic_fatal_wrapped_and_coloured(prefix: str) -> None:
    wrapped = (
        prefix + "mlx5_core 0000:3b:00.0: poll_health:835:(pid 0): device's health\n"
        + prefix + "    compromised - reached miss count"
    )
    events = _both(wrapped)
    assert [e.kind for e in events] == ["nic_fatal"]
    coloured = ANSI.format(prefix + NIC_LINES[0][0])
    assert [e.kind for e in read_text(coloured)] == ["nic_fatal"]


def test_nic_fatal_is_not_also_a_link_event() -> None:
    text = "[ 9.0] mlx5_core 0000:3b:00.0 mlx5_3: Port: 1 Link DOWN"
    assert [e.kind for e in _both(text)] == ["ib_link_down"]


# --- unmapped is never a silent none ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, what",
     "[ 5.0] NVRM: Xid (PCI:0000:3b:00): 4242, pid=1, name=x, what"],
)
def test_classify_marks_an_uncatalogued_code_unmapped(text: str) -> None:
    (obj,) = _classified(text)
    assert obj["action"] == "none"
    assert obj["unmapped"] is True


def test_classify_mapped_events_carry_no_unmapped_mark() -> None:
    (obj,) = _classified("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off "
                         "the bus.")
    assert "unmapped" not in obj


# --- families 1 and 2: dcgmi diag verdicts through DCGM's failure catalogue --------------

DCGM_FAULTY = [
    "| Diagnostic                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |",
    "|                           | Fail - GPU: 0                                  |",
    "| Warning                   | GPU 0 Found 56954234 faulty memory elements o  |",
    "|                           | n GPU 0 Run a field diagnostic on the GPU.     |",
]
DCGM_ERROR_ROW = [
    "|-----  Deployment  --------+------------------------------------------------|",
    "| Error                     | GPU 3 has uncorrectable memory errors and row  |",
    "|                           |  remappings are pending                        |",
]


def _dcgm(text: str) -> dict[str, object]:
    objs = [o for o in _classified(text) if o["kind"] == "dcgm_diag"]
    assert len(objs) == 1, objs
    return objs[0]


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
@pytest.mark.parametrize("indent", ["", "    ", "\t"])
def test_dcgm_faulty_memory_is_hardware_class(ending: str, indent: str) -> None:
    obj = _dcgm(ending.join(indent + r for r in DCGM_FAULTY))
    assert obj["action"] == "remove"
    assert obj["mnemonic"] == "DCGM_FR_FAULTY_MEMORY"
    assert obj["dcgm_error_ids"] == [52]
    assert obj["failed_gpus"] == [0]


def test_dcgm_faulty_memory_inside_a_full_table_and_kernel_log() -> None:
    text = "\n".join(
        [
            "[ 1.0] systemd[1]: Started dcgm.",
            "+---------------------------+------------------------------------------------+",
            "| Diagnostic                | Result                                         |",
            "+===========================+================================================+",
            "+-----  Hardware  ----------+------------------------------------------------+",
            *DCGM_FAULTY,
            "+---------------------------+------------------------------------------------+",
            "[ 2.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit",
        ]
    )
    kinds = [o["kind"] for o in _classified(text)]
    assert kinds == ["dcgm_diag", "xid"]
    assert _dcgm(text)["action"] == "remove"


@pytest.mark.parametrize("closing", ["|", "", "   "])
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_dcgm_error_row_without_fail_cell_or_closing_border(closing: str, ending: str) -> None:
    rows = [*DCGM_ERROR_ROW[:-1], DCGM_ERROR_ROW[-1].rstrip("|").rstrip() + closing]
    obj = _dcgm(ending.join(rows))
    assert obj["action"] == "reset_gpu"
    assert obj["mnemonic"] == "DCGM_FR_PENDING_ROW_REMAP"
    assert obj["failed"] == ["Deployment"]
    assert obj["errors"] == ["GPU 3 has uncorrectable memory errors and row remappings are pending"]


def test_dcgm_last_row_cut_inside_a_message_is_still_read() -> None:
    rows = [*DCGM_FAULTY[:3], "|                           | n GPU 0 Run a field diag"]
    assert _dcgm("\n".join(rows))["action"] == "remove"


@pytest.mark.parametrize(
    "message, action, code",
    [
        ("GPU 0 failed to create a CUDA context: CUDA driver version is insufficient for CUDA "
         "runtime version", "none", "CUDA_CONTEXT"),
        ("GPU 0 failed to create a CUDA context: unknown error", "reset_gpu", "CUDA_CONTEXT"),
        ("GPU 2 had memory errors and row remappings are pending", "reset_gpu",
         "PENDING_ROW_REMAP"),
        ("GPU 2 had uncorrectable memory errors and row remapping failed.", "remove",
         "ROW_REMAP_FAILURE"),
        ("GPU 1 fault may have left the OS in an inconsistent state. Recovery action: 2 "
         "(NODE_REBOOT).", "reboot", "GPU_RECOVERY_REBOOT"),
        ("GPU 1 requires a reset to recover from a fault. Recovery action: 1 (GPU_RESET).",
         "reset_gpu", "GPU_RECOVERY_RESET"),
        ("GPU 5 has fallen off the bus", "power_cycle", "FALLEN_OFF_BUS"),
        ("Detected 2 volatile double-bit ECC error(s) in GPU 4.", "reset_gpu",
         "VOLATILE_DBE_DETECTED"),
        ("There were thermal violations totaling 12.0 seconds for GPU 0", "none",
         "THERMAL_VIOLATIONS"),
        ("Persistence mode for GPU 0 is disabled.", "none", "PERSISTENCE_MODE"),
        ("NVVS has detected processes with graphics contexts open running on at least one GPU.",
         "none", "GRAPHICS_PROCESSES"),
        ("Detected XID 79 for GPU 3", "power_cycle", "XID_ERROR"),
        ("Detected XID 13 for GPU 3", "none", "XID_ERROR"),
        ("Detected fatal NvSwitch SXID 24007", "reboot", "SXID_ERROR"),
        ("GPU had an uncontained error (XID 95)", "reset_gpu", "UNCONTAINED_ERROR"),
    ],
)
def test_dcgm_message_maps_through_dcgm_catalogue(message: str, action: str, code: str) -> None:
    rows = [
        "+-----  Hardware  ----------+------------------------------------------------+",
        "| Memory                    | Fail - GPU: 0                                  |",
        f"| Warning                   | {message} |",
    ]
    obj = _dcgm("\n".join(rows))
    assert (obj["action"], obj["dcgm_errors"]) == (action, [code]), obj
    assert str(obj["mnemonic"]).endswith(code)


def test_dcgm_several_codes_take_the_heaviest_action() -> None:
    rows = [
        "+-----  Hardware  ----------+------------------------------------------------+",
        "| Memory                    | Fail - GPU: 0                                  |",
        "| Warning                   | GPU 0 had memory errors and row remappings are pending |",
        "| Diagnostic                | Fail - GPU: 1                                  |",
        "| Warning                   | GPU 1 Found 12 faulty memory elements on GPU 1 |",
    ]
    obj = _dcgm("\n".join(rows))
    assert obj["action"] == "remove"
    assert obj["dcgm_errors"] == ["PENDING_ROW_REMAP", "FAULTY_MEMORY"]
    assert obj["dcgm_error_tests"] == ["Memory", "Diagnostic"]


def test_dcgm_round2_sample_keeps_its_tests_and_maps_its_codes() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "data" / "signals" / "dcgm_diag_3x.txt").read_text()
    obj = _dcgm(text)
    assert obj["dcgm_errors"] == ["CUDA_API", "API_FAIL"]
    assert obj["action"] == "none"  # DCGM: CUDA_API MONITOR, API_FAIL TRIAGE


DCGM_JSON_4X = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "memory",
                        "results": [
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
                             "status": "Fail",
                             "warnings": [{"warning": "GPU 0 had memory errors and row "
                                           "remappings are pending", "error_id": 85,
                                           "error_category": 10, "error_severity": 6}]},
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1,
                             "status": "Pass"},
                        ],
                        "test_summary": {"status": "Fail"},
                    }
                ],
            }
        ]
    },
    "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"},
}
DCGM_JSON_3X = {
    "DCGM GPU Diagnostic": {
        "version": "3.3.5",
        "Driver Version Detected": "535.161.08",
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "Diagnostic",
                        "results": [
                            {"gpu_ids": "0", "status": "FAIL",
                             "warnings": [{"warning": "Found 3 faulty memory elements on GPU 0",
                                           "error_id": 52}]},
                            {"gpu_ids": "1,2", "status": "PASS"},
                        ],
                    }
                ],
            }
        ]
    }
}


@pytest.mark.parametrize("indent", [None, 4])
@pytest.mark.parametrize(
    "obj, action, gpus",
    [(DCGM_JSON_4X, "reset_gpu", [0]), (DCGM_JSON_3X, "remove", [0])],
)
def test_dcgmi_diag_json(obj: dict[str, object], action: str, gpus: list[int],
                         indent: int | None) -> None:
    text = "$ dcgmi diag -r 3 -j\n" + json.dumps(obj, indent=indent) + "\n[ 1.0] kernel: hello"
    got = _dcgm(text)
    assert got["action"] == action
    assert got["failed_gpus"] == gpus
    assert got["dcgm_version"] in ("4.2.3", "3.3.5")
    assert got["failed"] in (["memory"], ["Diagnostic"])


def test_dcgmi_diag_json_code_without_text_and_clean_pass() -> None:
    obj = json.loads(json.dumps(DCGM_JSON_4X))
    obj["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["warnings"] = [
        {"warning": "", "error_id": 126, "error_category": 15, "error_severity": 2}
    ]
    assert _dcgm(json.dumps(obj))["action"] == "reboot"
    clean = json.loads(json.dumps(DCGM_JSON_4X))
    test = clean["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"] = [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]
    test["test_summary"] = {"status": "Pass"}
    assert [o for o in _classified(json.dumps(clean)) if o["kind"] == "dcgm_diag"] == []


def test_dcgm_catalogue_transcribes_every_code() -> None:
    from agent.readers.dcgm_codes import _MESSAGES, CODES, NAMES
    from workflows.catalogue.dcgm import DCGM_ERRORS, DEPARTURES, dcgm_action

    assert set(DCGM_ERRORS) == set(CODES)
    assert sorted(NAMES) == list(range(133))
    assert {name for name, _ in _MESSAGES} <= set(CODES)
    assert set(DEPARTURES) <= set(CODES)
    for name in CODES:
        got = dcgm_action(name)
        if DCGM_ERRORS[name][0] == "UNKNOWN":
            assert got is None, name
        else:
            assert got is not None and got[1].startswith(f"DCGM_FR_{name}"), name


def test_dcgm_unknown_code_only_is_unmapped() -> None:
    obj = json.loads(json.dumps(DCGM_JSON_4X))
    obj["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["warnings"] = [
        {"warning": "Unknown error.", "error_id": 1}
    ]
    got = _dcgm(json.dumps(obj))
    assert got["action"] == "none" and got["unmapped"] is True


# --- family 6: sinfo tables -> slurm_node, one per node --------------------------------

SINFO_R = """REASON               USER      TIMESTAMP           NODELIST
Epilog error         slurm     2026-10-07T02:58:49 sched-worker1
Not responding       root      2026-10-07T03:01:00 gpu-[01-04,07]
Kill task failed     root(0)   Unknown             gpu-09"""

SINFO_LNE = """Tue Oct 07 03:00:00 2026
NODELIST   NODES PARTITION       STATE CPUS    S:C:T MEMORY TMP_DISK WEIGHT AVAIL_FE REASON
gpu-01         1      gpu*      down* 128   2:32:2 1024000        0      1   (null) Not responding
gpu-01         1     debug      down* 128   2:32:2 1024000        0      1   (null) Not responding
gpu-02         1      gpu*    drained 128   2:32:2 1024000        0      1   (null) Xid 79 GPU lost
gpu-03         1      gpu*       drng 128   2:32:2 1024000        0      1   (null) rma ticket 7
gpu-04         1      gpu*      idle~ 128   2:32:2 1024000        0      1   (null) none
gpu-05         1      gpu*       idle 128   2:32:2 1024000        0      1   (null) none"""


def _slurm(text: str) -> list[dict[str, object]]:
    return [o for o in _classified(text) if o["kind"] == "slurm_node"]


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_sinfo_r_rows_one_event_per_node(ending: str) -> None:
    objs = _slurm(ending.join(SINFO_R.split("\n")))
    nodes = [o["node"] for o in objs]
    assert nodes == ["sched-worker1", "gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07",
                     "gpu-09"]
    first = objs[0]
    assert (first["reason"], first["reason_user"], first["reason_time"]) == (
        "Epilog error", "slurm", "2026-10-07T02:58:49")
    assert first["active"] is True and first["action"] == "none"
    assert objs[-1]["reason_time"] is None and objs[-1]["reason"] == "Kill task failed"


def test_sinfo_issue_example() -> None:
    text = ("REASON               USER      TIMESTAMP           NODELIST\n"
            "Epilog error         slurm     2026-10-07T02:58:49 sched-worker1")
    (obj,) = _slurm(text)
    assert obj["node"] == "sched-worker1" and obj["reason"] == "Epilog error"
    assert obj["reason_user"] == "slurm" and obj["reason_time"] == "2026-10-07T02:58:49"


def test_sinfo_lne_states_and_partitions() -> None:
    objs = {o["node"]: o for o in _slurm(SINFO_LNE)}
    assert list(objs) == ["gpu-01", "gpu-02", "gpu-03"]  # idle~ / idle with no reason: none
    assert objs["gpu-01"]["state"] == ["DOWN", "NOT_RESPONDING"]
    assert objs["gpu-01"]["partitions"] == ["gpu", "debug"]
    assert objs["gpu-02"]["state"] == ["IDLE", "DRAIN"]
    assert objs["gpu-02"]["reason"] == "Xid 79 GPU lost"
    assert objs["gpu-03"]["state"] == ["DRAINING", "DRAIN"]


def test_sinfo_custom_format_and_rl_and_default() -> None:
    custom = ("NODELIST STATE REASON USER TIMESTAMP\n"
              "gpu-[10-11] drained* GPU ECC errors admin 2026-10-07T04:00:00\n"
              "gpu-12 idle none Unknown Unknown")
    objs = _slurm(custom)
    assert [o["node"] for o in objs] == ["gpu-10", "gpu-11"]
    assert objs[0]["state"] == ["IDLE", "DRAIN", "NOT_RESPONDING"]
    assert objs[0]["reason"] == "GPU ECC errors" and objs[0]["reason_user"] == "admin"
    rl = ("REASON               USER         TIMESTAMP           STATE  NODELIST\n"
          "NHC: nvidia-smi fail root         2026-10-07T05:00:00 drain  gpu-20")
    (o,) = _slurm(rl)
    assert o["state"] == ["IDLE", "DRAIN"] and o["reason"] == "NHC: nvidia-smi fail"
    default = ("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n"
               "gpu*         up   infinite      2  down* gpu-[30-31]\n"
               "gpu*         up   infinite      6   idle gpu-[32-37]")
    assert [(o["node"], o["state"]) for o in _slurm(default)] == [
        ("gpu-30", ["DOWN", "NOT_RESPONDING"]), ("gpu-31", ["DOWN", "NOT_RESPONDING"])]


@pytest.mark.parametrize(
    "word, flags",
    [
        ("down*", ["DOWN", "NOT_RESPONDING"]),
        ("drained", ["IDLE", "DRAIN"]),
        ("drng", ["DRAINING", "DRAIN"]),
        ("idle~", ["IDLE", "POWERED_DOWN"]),
        ("alloc", ["ALLOCATED"]),
        ("mix#", ["MIXED", "POWERING_UP"]),
        ("comp", ["COMPLETING"]),
        ("failg", ["FAILING"]),
        ("inval", ["INVALID_REG"]),
        ("unk*", ["UNKNOWN", "NOT_RESPONDING"]),
        ("IDLE+DRAIN", ["IDLE", "DRAIN"]),
        ("down~", ["DOWN", "POWERED_DOWN"]),
    ],
)
def test_sinfo_state_words(word: str, flags: list[str]) -> None:
    from agent.readers.sinfo import sinfo_state

    assert sinfo_state(word) == flags


def test_sinfo_table_between_kernel_lines_and_uppercase_lookalikes() -> None:
    text = "\n".join(
        ["[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
         SINFO_R, "", "REASON WHY NOT NODELIST", "this is prose, not a row"]
    )
    kinds = [o["kind"] for o in _classified(text)]
    assert kinds == ["xid"] + ["slurm_node"] * 7


# --- family 5: multi-line records broken by unrelated lines -----------------------------

BLOCK = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]
INTRUDERS = [
    "",
    "Mar  3 04:28:38 gpu-node-07 systemd[1]: Started Session 12 of user root.",
    "[ 1843.308150] pcieport 0000:b2:00.0: pciehp: Slot(0): Link Down",
    "[ 1843.308151] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
]


def _gpu_lost(events: list[FaultEvent]) -> list[FaultEvent]:
    return [e for e in events if e.kind == "gpu_lost"]


def test_fallen_off_bus_issue_example() -> None:
    text = "\n".join(
        [
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
            "",
            "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "               NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    (ev,) = _gpu_lost(_both(text))
    assert ev.pci == "0000:b3:00.0"
    assert ev.text.count("NVRM:") == 3
    (obj,) = _classified(text)
    assert obj["action"] == "power_cycle"


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("intruder", INTRUDERS)
@pytest.mark.parametrize("where", [1, 2])
def test_fallen_off_bus_joins_across_an_unrelated_line(
    prefix: str, intruder: str, where: int
) -> None:
    lines = [prefix + b for b in BLOCK]
    lines.insert(where, intruder)
    events = _both("\n".join(lines))
    (ev,) = _gpu_lost(events)
    assert ev.pci == "0000:b3:00.0"
    assert "fallen off the bus" in ev.text and "Started Session" not in ev.text
    assert len(events) == len([e for e in events if e.kind != "gpu_lost"]) + 1


@pytest.mark.parametrize("prefix", PREFIXES)
def test_fallen_off_bus_first_line_alone_is_gpu_lost(prefix: str) -> None:
    text = "\n".join([prefix + BLOCK[0], "[ 1.0] systemd[1]: something else", "", "", ""])
    (ev,) = _gpu_lost(_both(text))
    assert ev.pci == "0000:b3:00.0"
    assert ev.details["record"] == "multi_line"


def test_other_nv_c_block_is_not_gpu_lost() -> None:
    text = "\n".join(
        [
            "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1eb8)",
            "NVRM: installed in this system is not supported by the",
            "NVRM: NVIDIA 535.129.03 driver release.",
        ]
    )
    assert _gpu_lost(_both(text)) == []


def test_fallen_off_bus_with_xid79_across_blank_lines_is_one_event() -> None:
    text = "\n".join(
        [
            "[ 5.0] NVRM: Xid (PCI:0000:b3:00): 79, pid=1234, name=python, GPU has fallen off "
            "the bus.",
            "",
            "[ 5.0] NVRM: The NVIDIA GPU 0000:b3:00.0",
            "",
            "[ 5.0] NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "[ 5.0] NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    (ev,) = _both(text)
    assert (ev.kind, ev.xid) == ("xid", 79)
    assert len(ev.details["related_evidence"]) == 1


def test_two_hosts_blocks_do_not_mix() -> None:
    a = "Mar  3 04:28:38 node-a kernel: "
    b = "Mar  3 04:28:38 node-b kernel: "
    text = "\n".join(
        [a + BLOCK[0], b + "NVRM: fallen off the bus and is not responding to commands.",
         a + BLOCK[1], a + BLOCK[2]]
    )
    lost = _gpu_lost(_both(text))
    assert lost[0].pci == "0000:b3:00.0"
    assert "node-b" not in lost[0].text


@pytest.mark.parametrize("intruder", INTRUDERS)
def test_every_multi_line_kind_joins_across_an_unrelated_line(intruder: str) -> None:
    records = {
        "pcie_aer_fatal": [
            "[ 7.1] pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: "
            "0000:41:00.0",
            "[ 7.1] nvidia 0000:41:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Requester ID)",
            "[ 7.1] nvidia 0000:41:00.0:   device [10de:2330] error status/mask=00004000/00000000",
        ],
        "sxid": [
            "[ 7.2] nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 16 sourcetrack "
            "timeout error (First)",
            "[ 7.2] nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 24007, Severity 1 Engine instance "
            "16 Sub-engine instance 00",
            "[ 7.2] nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 24007, Data {0x00000001, "
            "0x00000000}",
        ],
        "gpu_init_failed": [
            "[ 7.3] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
            "[ 7.3] NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 2",
        ],
        "nic_fatal": [
            "[ 7.4] mlx5_core 0000:3b:00.0: poll_health:835:(pid 0): device's health "
            "compromised - reached miss count",
            "[ 7.4] mlx5_core 0000:3b:00.0: print_health_info:442:(pid 0): synd 0x1: firmware "
            "internal error",
        ],
    }
    for kind, lines in records.items():
        broken = [lines[0], intruder, *lines[1:]]
        got = [e for e in _both("\n".join(broken)) if e.kind == kind]
        assert len(got) == 1, (kind, got)
        assert got[0].text.count("\n") == len(lines) - 1, (kind, got[0].text)


# --- device plugin + kernel Xid of one fault fold into one event ------------------------

KERNEL_XID = ("Oct  7 02:58:48 gpu-07 kernel: NVRM: Xid (PCI:0000:b3:00): 79, pid=4121, "
              "name=python3, GPU has fallen off the bus.")
PLUGIN_XID = ("I1007 02:58:49.532111       1 health.go:152] XidCriticalError: Xid=79 on "
              "Device=GPU-5c7b3b1e-2a9e-1d3a-8b42-2f1c1e9a0b77; marking device as unhealthy.")


@pytest.mark.parametrize("order", ["kernel_first", "plugin_first"])
@pytest.mark.parametrize("between", [[], ["Oct  7 02:58:49 gpu-07 systemd[1]: x"], [""]])
def test_device_plugin_and_kernel_xid_fold(order: str, between: list[str]) -> None:
    lines = [KERNEL_XID, *between, PLUGIN_XID]
    if order == "plugin_first":
        lines = [PLUGIN_XID, *between, KERNEL_XID]
    events = [e for e in _both("\n".join(lines)) if e.kind == "xid"]
    assert len(events) == 1, events
    ev = events[0]
    assert (ev.xid, ev.pci, ev.pid) == (79, "0000:b3:00", 4121)
    assert ev.details["also_reported_by"] == "k8s-device-plugin"
    assert ev.details["device"].startswith("GPU-5c7b3b1e")
    assert any("XidCriticalError" in t for t in ev.details["related_evidence"])
    (obj,) = [o for o in _classified("\n".join(lines)) if o["kind"] == "xid"]
    assert obj["action"] == "power_cycle"


def test_device_plugin_fold_with_the_gpu_lost_block_is_still_one_event() -> None:
    text = "\n".join([KERNEL_XID, PLUGIN_XID, *(("Oct  7 02:58:49 gpu-07 kernel: " + b)
                                               for b in BLOCK)])
    events = _both(text)
    assert [(e.kind, e.xid) for e in events] == [("xid", 79)]
    assert len(events[0].details["related_evidence"]) == 2


@pytest.mark.parametrize(
    "plugin",
    [
        PLUGIN_XID.replace("Xid=79", "Xid=48"),  # another code
        PLUGIN_XID.replace("02:58:49", "03:04:49"),  # six minutes later
        PLUGIN_XID.replace("GPU-5c7b3b1e-2a9e-1d3a-8b42-2f1c1e9a0b77", "0000:3b:00.0"),  # other GPU
    ],
)
def test_device_plugin_and_kernel_xid_that_are_not_one_fault(plugin: str) -> None:
    events = [e for e in _both("\n".join([KERNEL_XID, plugin])) if e.kind == "xid"]
    assert len(events) == 2
    assert "also_reported_by" not in events[0].details


def test_two_plugin_lines_fold_once() -> None:
    events = [e for e in _both("\n".join([KERNEL_XID, PLUGIN_XID, PLUGIN_XID]))
              if e.kind == "xid"]
    assert len(events) == 2


# --- the vendored Xid rows, checked against NVIDIA's page on 2026-12-01 ------------------


@pytest.mark.parametrize(
    "code, mnemonic, immediate, investigatory",
    [
        (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", "CONTACT_SUPPORT"),
        (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
        (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
        (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT"),
        (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "IGNORE (sympathetic)"),
        (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", "CONTACT_SUPPORT"),
        (142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT", ""),
        (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", "CONTACT_SUPPORT"),
        (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
        (161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", "INVESTIGATE_SW"),
        (163, "PSHC_DISENGAGED", "", ""),
        (172, "UNCORRECTABLE_SRAM_ERROR", "", ""),
    ],
)
def test_vendored_xid_rows_as_on_nvidia_page(
    code: int, mnemonic: str, immediate: str, investigatory: str
) -> None:
    from workflows.catalogue.nvidia_xid_catalog import BY_CODE, CHECKED, NVIDIA_XID_CATALOG

    assert CHECKED == "2026-12-01"
    assert [r.code for r in NVIDIA_XID_CATALOG] == list(range(1, 173))
    row = BY_CODE[code]
    assert (row.mnemonic, row.immediate, row.investigatory) == (
        mnemonic, immediate, investigatory)


@pytest.mark.parametrize("indent", ["    ", "\t"])
def test_sinfo_and_nvsmi_pasted_indented(indent: str) -> None:
    sinfo = "\n".join(indent + line for line in SINFO_R.split("\n"))
    assert len(_slurm(sinfo)) == 7
    nvsmi = "\n".join(
        [indent + "Remapped Rows",
         indent * 2 + "Uncorrectable Error               : 1",
         indent * 2 + "Pending                           : Yes   <=== look"]
    )
    (obj,) = [o for o in _classified(nvsmi) if o["kind"] == "nvsmi"]
    assert obj["remap_pending"] is True


def test_sinfo_older_long_format_features_column() -> None:
    text = ("NODELIST   NODES PARTITION STATE CPUS S:C:T MEMORY TMP_DISK WEIGHT FEATURES REASON\n"
            "gpu-41        1      gpu*  down*   96 2:24:2 768000        0      1   (null) "
            "Node unexpectedly rebooted")
    (obj,) = _slurm(text)
    assert obj["state"] == ["DOWN", "NOT_RESPONDING"]
    assert obj["reason"] == "Node unexpectedly rebooted"


@pytest.mark.parametrize(
    "text",
    [
        '{"DCGM Diagnostic": ' + "[" * 100_000 + "test_categories",
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": 5, "results": 7}]}]}}',
        '{"DCGM Diagnostic": {"test_categories": "x"}}',
        "REASON USER TIMESTAMP NODELIST\n" + "x " * 5000,
        "NODELIST STATE REASON\ngpu-[01-99999999] down* why",
        "| Error | " + "row remappings are pending " * 500,
    ],
)
def test_round3_readers_never_raise_on_hostile_input(text: str) -> None:
    read_text(text)
    _classified(text)


def test_dcgmi_diag_json_iterations_and_summary_errors() -> None:
    one = json.loads(json.dumps(DCGM_JSON_4X))
    test = one["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"] = [{"entity_group": "GPU", "entity_id": 0, "status": "Fail"}]
    test["test_summary"] = {"status": "Fail", "warnings": [
        {"warning": "GPU 0 fault may have left the OS in an inconsistent state. Recovery "
         "action: 2 (NODE_REBOOT).", "error_id": 126, "error_category": 15,
         "error_severity": 2}]}
    got = _dcgm(json.dumps(one))
    assert got["action"] == "reboot" and got["dcgm_error_ids"] == [126]
    runs = {"iterations": [DCGM_JSON_4X, one], "Overall Result": "Fail"}
    objs = [o for o in _classified(json.dumps(runs, indent=2)) if o["kind"] == "dcgm_diag"]
    assert [o["action"] for o in objs] == ["reset_gpu", "reboot"]
