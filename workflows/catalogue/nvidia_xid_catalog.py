"""NVIDIA's Xid Catalog, vendored: one row per Xid code (Ampere and newer GPUs).

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html — table "Xids" (and
its downloadable spreadsheet, sheet "Catalog"): columns *Code*, *Mnemonic*, *Description*,
*Resolution Bucket (Immediate Action)* and *Resolution Bucket (Investigatory Action)*,
copied verbatim (whitespace folded), revision of 2025-10-29 (codes 1–172). An empty
bucket is printed as ``""``: the page gives none for that code (162–172 at this revision).

Checked row by row against NVIDIA's page on :data:`CHECKED` (the stored copy of
:data:`SOURCE` in the search index; round 2 had taken the rows from a peer's generated
copy): all 172 codes, mnemonics and immediate / investigatory buckets agree. Differences
found, none of them a bucket: (1) for the unused codes the page prints the investigatory
bucket as ``N/A; Unused``, kept here as ``""`` (no bucket); (2) for 163–166, 168 and 170 the
page carries recovery guidance text where the bucket columns are, not a bucket name (e.g.
163 "No GPU reset required …", 168 "Should only be seen when ECC is disabled …"): they stay
without a bucket; (3) the page has gained columns not vendored (Applies to A100 / H100 /
B100 / GB200, Xid 154 linkage, trigger conditions); (4) 45's description prints an en dash
where this copy has ``--``. The NVLink5 Xid 144–150 decode table further down the page is
read by ``agent.readers.kernel.nvlink5``.

This is data only; what the product does with each row is decided in
:mod:`workflows.catalogue.xid`, and ``tests/unit/test_catalogue_nvidia.py`` checks, row by
row, that the product follows the immediate bucket or writes down why it departs.
Update by re-reading the page; never edit a row to fit the product.
"""

from __future__ import annotations

from typing import NamedTuple

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
"""Where every row comes from."""
REVISION = "2025-10-29"
"""Date the rows were read from :data:`SOURCE`."""
CHECKED = "2026-12-01"
"""Date every row was last checked against NVIDIA's page (see the module docstring for the
differences found)."""


class NvidiaXid(NamedTuple):
    """One row of NVIDIA's Xid Catalog (fields as the page names them)."""

    code: int
    mnemonic: str
    description: str
    immediate: str
    investigatory: str


NVIDIA_XID_CATALOG: tuple[NvidiaXid, ...] = (
    NvidiaXid(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "GPU stopped processing",
        "RESTART_APP",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "Invalid or corrupted push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
        "Graphics Engine Exception",
        "RESTART_APP",
        "WORKFLOW_XID_13",
    ),
    NvidiaXid(14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE", "CONTACT_SUPPORT"),
    NvidiaXid(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "CONTACT_SUPPORT"
    ),
    NvidiaXid(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        25,
        "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY",
        "Invalid or illegal push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault",
        "RESTART_APP",
        "WORKFLOW_XID_31",
    ),
    NvidiaXid(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "Invalid or corrupted push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        37,
        "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
        "Driver firmware error",
        "IGNORE",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(
        38,
        "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "Driver firmware error",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        44,
        "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        "Graphics Engine fault during context switch",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications and hitting a DBE",
        "WORKFLOW_XID_45",
        "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)",
    ),
    NvidiaXid(
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "GPU stopped processing",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "Double Bit ECC Error",
        "WORKFLOW_XID_48",
        "WORKFLOW_XID_48",
    ),
    NvidiaXid(49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", ""
    ),
    NvidiaXid(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "Auxiliary power is not connected to the GPU board",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        60,
        "ROBUST_CHANNEL_SEC2_ERROR",
        "Video processor exception",
        "RESTART_APP",
        "INVESTIGATE_SW",
    ),
    NvidiaXid(61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        62,
        "PMU_HALT_ERROR",
        "Internal micro-controller halt (newer drivers)",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "IGNORE"
    ),
    NvidiaXid(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "GPU memory remapping failure",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        66,
        "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION",
        "Illegal access by driver",
        "IGNORE",
        "INVESTIGATE_SW",
    ),
    NvidiaXid(
        67,
        "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION",
        "Illegal access by driver",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "Graphics Engine class error",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(
        70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    NvidiaXid(
        75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "UPDATE_SWFW"),
    NvidiaXid(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        "RESTART_BM",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        80,
        "PBDMA_PUSHBUFFER_CRC_MISMATCH",
        "Corrupted data sent to GPU",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    NvidiaXid(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(
        85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "High single-bit ECC error rate",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        93,
        "INFOROM_ERASE_LIMIT_EXCEEDED",
        "Non-fatal violation of provisioned InfoROM wear limit",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "Contained memory error",
        "RESTART_APP",
        "IGNORE (sympathetic)",
    ),
    NvidiaXid(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "Uncontained memory error",
        "RESET_GPU",
        "IGNORE (sympathetic)",
    ),
    NvidiaXid(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "IGNORE"),
    NvidiaXid(107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "IGNORE"),
    NvidiaXid(108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", "XID_137_FLOW"),
    NvidiaXid(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "Context Switch Timeout Error",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "INVESTIGATE_SW"),
    NvidiaXid(111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    NvidiaXid(120, "GSP_ERROR", "GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    NvidiaXid(121, "C2C_ERROR", "C2C Error", "IGNORE", "CONTACT_SUPPORT"),
    NvidiaXid(122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(
        126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(
        135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"
    ),
    NvidiaXid(136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", "INVESTIGATE_LINK_SI"),
    NvidiaXid(137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", "XID_137_FLOW"),
    NvidiaXid(138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", ""),
    NvidiaXid(139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    NvidiaXid(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "ECC Unrecovered Error",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(
        141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "CONTACT_SUPPORT"
    ),
    NvidiaXid(142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", ""),
    NvidiaXid(143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT"),
    NvidiaXid(
        144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"
    ),
    NvidiaXid(
        145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"
    ),
    NvidiaXid(
        146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"
    ),
    NvidiaXid(
        147,
        "NVLINK_TREX_ERROR",
        "NVLINK: TREX Error",
        "WORKFLOW_NVLINK5_ERR",
        "WORKFLOW_NVLINK5_ERR",
    ),
    NvidiaXid(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLINK: NVLPW_CTRL Error",
        "WORKFLOW_NVLINK5_ERR",
        "WORKFLOW_NVLINK5_ERR",
    ),
    NvidiaXid(
        149,
        "NVLINK_NETIR_ERROR",
        "NVLINK: NETIR Error",
        "WORKFLOW_NVLINK5_ERR",
        "WORKFLOW_NVLINK5_ERR",
    ),
    NvidiaXid(
        150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"
    ),
    NvidiaXid(
        151,
        "ROBUST_CHANNEL_KEY_ROTATION_ERROR",
        "Key rotation Error",
        "RESTART_VM",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "CONTACT_SUPPORT"),
    NvidiaXid(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "CONTACT_SUPPORT"),
    NvidiaXid(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU Recovery Action Changed",
        "XID_154",
        "N/A Informational only regarding another Xid",
    ),
    NvidiaXid(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "NVLINK: SW Defined Error",
        "RESET_GPU",
        "INVESTIGATE_SW_USER",
    ),
    NvidiaXid(156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "IGNORE"),
    NvidiaXid(
        157,
        "RESOURCE_RETIREMENT_FAILURE",
        "Resource Retirement Failure",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    NvidiaXid(158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT"),
    NvidiaXid(
        159,
        "ROBUST_CHANNEL_CHI_NON_DATA_ERROR",
        "CHI Non-Data Error",
        "CHECK_UVM",
        "SYMPATHETIC_REPORT_SOLO",
    ),
    NvidiaXid(
        160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", "INVESTIGATE_SW"
    ),
    NvidiaXid(
        161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "INVESTIGATE_SW"
    ),
    NvidiaXid(162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", ""),
    NvidiaXid(163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", ""),
    NvidiaXid(
        164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", ""
    ),
    NvidiaXid(165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", ""),
    NvidiaXid(
        166,
        "NVLINK_SECURE_CRYPTO_ERR",
        "CC traffic seen prior to link properly being configured for encrypted traffic",
        "",
        "",
    ),
    NvidiaXid(167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "", ""),
    NvidiaXid(
        168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", ""
    ),
    NvidiaXid(169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", ""),
    NvidiaXid(170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", ""),
    NvidiaXid(
        171,
        "UNCORRECTABLE_DRAM_ERROR",
        "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM",
        "",
        "",
    ),
    NvidiaXid(
        172,
        "UNCORRECTABLE_SRAM_ERROR",
        "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM",
        "",
        "",
    ),
)
"""Every row of the catalogue, by ascending code."""

BY_CODE: dict[int, NvidiaXid] = {row.code: row for row in NVIDIA_XID_CATALOG}
"""``code → row``."""
