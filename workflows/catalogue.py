"""The fault catalogue: severity, mnemonic and lightest action for every signal.

Pure and sandbox-safe (no I/O). :func:`lookup` answers for one fault
``(kind, code, details)`` under the operator's :class:`~workflows.config.CatalogueConfig`.

Sources of the defaults:

- Xid codes: NVIDIA "Xid Catalog" (docs.nvidia.com/deploy/xid-errors, Ampere and newer)
  mnemonics and *Resolution Bucket (Immediate Action)*, mapped onto the action vocabulary
  as DESIGN §5 prescribes: RESTART_APP / IGNORE → ``none``; RESET_GPU → ``reset_gpu``;
  RESTART_BM (the GPU must lose power; Xid 79) → ``power_cycle``; CONTACT_SUPPORT →
  ``remove`` (human-only).
- NVLink5 Xid 144–150: the severity printed in the line (``Fatal`` → RESET_GPU,
  ``Nonfatal`` → IGNORE).
- Xid 154: the recovery action the driver reports (GPU Reset Required → ``reset_gpu``,
  Node Reboot Required → ``reboot``, Drain P2P / Drain and Reset → ``reset_gpu``).
- NVSwitch SXid: NVIDIA Fabric Manager user guide — non-fatal SXids need no action, fatal
  SXids need the GPUs and NVSwitches of the baseboard reset, which on an HGX node means a
  node reboot. The line's own ``Non-fatal``/``Fatal`` wording wins over the code table.
- Other kinds: the corrective step operators take for the condition (see each entry).

App-level Xids (:data:`APP_LEVEL_XIDS`) never drive a node repair alone: their entry has
``action=none`` and ``app_level=True``; repeats on one GPU/GPC escalate to a diagnostic
validation run (the ``NodeWorkflow`` counts them with :mod:`workflows.policy`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Severity

RESTART_APP = "RESTART_APP"
IGNORE = "IGNORE"
RESET_GPU = "RESET_GPU"
RESTART_BM = "RESTART_BM"
CONTACT_SUPPORT = "CONTACT_SUPPORT"

BUCKET_ACTION: dict[str, Action] = {
    RESTART_APP: Action.none,
    IGNORE: Action.none,
    RESET_GPU: Action.reset_gpu,
    RESTART_BM: Action.power_cycle,
    CONTACT_SUPPORT: Action.remove,
}
"""NVIDIA resolution bucket → node action (DESIGN §5)."""

DEFAULT_WINDOW_S = 600.0
"""Count window of an entry without an override: the ``CatalogueOverride.window_s``
default (10 minutes, scenario 9)."""

APP_LEVEL_XIDS: frozenset[int] = frozenset({8, 13, 31, 32, 43, 45, 68, 69, 94, 109, 137})
"""Xids raised by what the application did (NVIDIA bucket RESTART_APP/IGNORE, "user app
error" in the Xid listing): 13/31/43/45/94 named by DESIGN §5, plus 8, 32, 68, 69, 109
(stopped processing, push-buffer, NVDEC, class and context-switch errors) and 137 (FLA
privilege error)."""


@dataclass(frozen=True)
class CatalogueEntry:
    """What the catalogue says about one fault.

    - ``severity``: info | warning | critical.
    - ``mnemonic``: NVIDIA mnemonic for Xids (else a short upper-case name).
    - ``actionable``: True when the fault maps to a node action (``action != none``)
      once ``count`` occurrences fall inside ``window_s`` seconds on one node.
    - ``action``: lightest action of the DESIGN §5 vocabulary that fixes the fault.
    - ``count`` / ``window_s``: count-in-window threshold (1 / 600 s by default).
    - ``app_level``: an application-caused Xid; repeats on one GPU/GPC escalate to a
      diagnostic run, never to a repair. False when an operator override maps an action.
    - ``description``: plain-language text for people (ledger, UI, notifications).
    - ``mapped``: False for a kind or code the catalogue does not know (counted in
      ``autorepair_unmapped_alerts_total``, recorded, never dropped).
    - ``bucket``: NVIDIA resolution bucket for Xids, "" otherwise.
    """

    severity: Severity
    mnemonic: str
    actionable: bool
    action: Action
    count: int
    window_s: float
    app_level: bool
    description: str
    mapped: bool = True
    bucket: str = ""


def _e(
    severity: Severity,
    mnemonic: str,
    action: Action,
    description: str,
    *,
    app_level: bool = False,
    bucket: str = "",
) -> CatalogueEntry:
    return CatalogueEntry(
        severity=severity,
        mnemonic=mnemonic,
        actionable=action is not Action.none,
        action=action,
        count=1,
        window_s=DEFAULT_WINDOW_S,
        app_level=app_level,
        description=description,
        bucket=bucket,
    )


_W, _C, _I = Severity.warning, Severity.critical, Severity.info

# code: (mnemonic, severity, bucket, plain-language description)
_XIDS: dict[int, tuple[str, Severity, str, str]] = {
    8: (
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        _W,
        RESTART_APP,
        "The GPU stopped processing work of an application; restart the application.",
    ),
    13: (
        "ROBUST_CHANNEL_GR_EXCEPTION",
        _W,
        RESTART_APP,
        "Graphics engine exception, usually an application fault (illegal instruction or "
        "out-of-range address). Restart the application; repeats on the same GPU and GPC "
        "warrant a diagnostic run.",
    ),
    31: (
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR",
        _W,
        RESTART_APP,
        "GPU memory page fault, usually an illegal memory access by the application.",
    ),
    32: (
        "ROBUST_CHANNEL_PBDMA_ERROR",
        _W,
        RESTART_APP,
        "Invalid or corrupted push buffer stream; the application's channel was torn down.",
    ),
    43: (
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        _W,
        RESTART_APP,
        "The GPU stopped processing an application's channel (application fault); the GPU "
        "itself stays healthy.",
    ),
    44: (
        "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        _C,
        RESET_GPU,
        "Graphics engine fault during a context switch; the GPU needs a reset.",
    ),
    45: (
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        _I,
        IGNORE,
        "Preemptive cleanup of an application's channels after an earlier error; a "
        "consequence, not a fault of its own.",
    ),
    46: (
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        _C,
        RESET_GPU,
        "The GPU stopped processing and did not recover; reset the GPU.",
    ),
    48: (
        "ROBUST_CHANNEL_ECC_DBE",
        _C,
        RESET_GPU,
        "Uncorrectable double-bit ECC error in GPU memory; reset the GPU so the bad row is "
        "remapped or the page retired.",
    ),
    54: (
        "AUX_POWER_NOT_CONNECTED",
        _C,
        CONTACT_SUPPORT,
        "Auxiliary power is not connected to the GPU board: a hardware problem.",
    ),
    61: (
        "PMU_BREAKPOINT",
        _C,
        RESET_GPU,
        "Internal micro-controller breakpoint or warning; reset the GPU.",
    ),
    62: ("PMU_HALT_ERROR", _C, RESET_GPU, "Internal micro-controller halted; reset the GPU."),
    63: (
        "INFOROM_DRAM_RETIREMENT_EVENT",
        _W,
        RESET_GPU,
        "A memory row was marked for remapping (or a page for retirement); it takes effect "
        "at the next GPU reset.",
    ),
    64: (
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        _C,
        CONTACT_SUPPORT,
        "Row remapping or page retirement failed: the GPU memory is failing and the GPU "
        "needs hardware service.",
    ),
    68: (
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        _W,
        RESTART_APP,
        "Video decoder exception in an application.",
    ),
    69: (
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        _W,
        RESTART_APP,
        "Graphics engine class error in an application.",
    ),
    74: (
        "NVLINK_ERROR",
        _C,
        RESET_GPU,
        "NVLink error on the GPU; reset the GPU (and check the link if it repeats).",
    ),
    79: (
        "GPU_HAS_FALLEN_OFF_THE_BUS",
        _C,
        RESTART_BM,
        "The GPU has fallen off the PCIe bus and no longer responds. It must lose power "
        "to come back: power-cycle the host.",
    ),
    92: (
        "EXCESSIVE_SBE_INTERRUPTS",
        _W,
        IGNORE,
        "High single-bit ECC error rate (corrected); watch the GPU.",
    ),
    93: (
        "INFOROM_ERASE_LIMIT_EXCEEDED",
        _W,
        IGNORE,
        "Non-fatal violation of the provisioned InfoROM wear limit.",
    ),
    94: (
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        _W,
        RESTART_APP,
        "Contained ECC error: only the application that touched the memory was affected.",
    ),
    95: (
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        _C,
        RESET_GPU,
        "Uncontained ECC error: every application on the GPU is affected; reset the GPU.",
    ),
    109: (
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        _W,
        RESTART_APP,
        "Context switch timeout, usually an application fault.",
    ),
    110: ("SEC_FAULT_ERROR", _C, RESET_GPU, "Security fault in the GPU; reset the GPU."),
    119: (
        "GSP_RPC_TIMEOUT",
        _C,
        RESET_GPU,
        "The GPU System Processor did not answer a driver call in time; reset the GPU.",
    ),
    120: (
        "GSP_ERROR",
        _C,
        RESET_GPU,
        "The GPU System Processor hit an internal error; reset the GPU.",
    ),
    121: ("C2C_ERROR", _C, RESET_GPU, "Chip-to-chip link error; reset the GPU."),
    122: ("SPI_PMU_RPC_READ_FAIL", _C, RESET_GPU, "SPI read failure; reset the GPU."),
    123: ("SPI_PMU_RPC_WRITE_FAIL", _C, RESET_GPU, "SPI write failure; reset the GPU."),
    124: ("SPI_PMU_RPC_ERASE_FAIL", _C, RESET_GPU, "SPI erase failure; reset the GPU."),
    137: (
        "NVLINK_FLA_PRIV_ERR",
        _W,
        RESTART_APP,
        "NVLink fabric address privilege error caused by an application.",
    ),
    140: (
        "UNRECOVERED_ECC_ERROR",
        _C,
        RESET_GPU,
        "Uncorrectable ECC error the firmware could not handle; reset the GPU.",
    ),
    143: ("GPU_INIT_ERROR", _C, RESET_GPU, "GPU initialisation failure; reset the GPU."),
    144: ("NVLINK_SAW_ERROR", _C, RESET_GPU, "NVLink SAW error."),
    145: ("NVLINK_RLW_ERROR", _C, RESET_GPU, "NVLink RLW error."),
    146: ("NVLINK_TLW_ERROR", _C, RESET_GPU, "NVLink TLW error."),
    147: ("NVLINK_TREX_ERROR", _C, RESET_GPU, "NVLink TREX error."),
    148: ("NVLINK_NVLPW_CTRL_ERROR", _C, RESET_GPU, "NVLink NVLPW control error."),
    149: ("NVLINK_NETIR_ERROR", _C, RESET_GPU, "NVLink NETIR error."),
    150: ("NVLINK_MSE_ERROR", _C, RESET_GPU, "NVLink MSE error."),
    154: (
        "GPU_RECOVERY_ACTION_CHANGED",
        _C,
        RESET_GPU,
        "The driver changed the recovery action the GPU needs.",
    ),
}

NVLINK5_XIDS = frozenset(range(144, 151))
"""NVLink5 Xids whose printed severity (Fatal/Nonfatal) selects the bucket."""

NONFATAL_SXIDS: frozenset[int] = frozenset(
    {
        11004,
        11012,
        11021,
        11022,
        11023,
        12021,
        12023,
        15008,
        15011,
        19049,
        19055,
        19057,
        19059,
        19062,
        19065,
        19068,
        19071,
        22013,
        24001,
        24002,
        24003,
    }
)
"""NVSwitch SXids the Fabric Manager user guide lists as non-fatal (single-bit ECC,
NVLink data-link recoveries, ACL, thermal warnings, minion DLREQ); every other SXid is
treated as fatal unless its line says ``Non-fatal``."""

_RECOVERY: list[tuple[str, Action, Severity]] = [
    ("reboot", Action.reboot, Severity.critical),
    ("drain and reset", Action.reset_gpu, Severity.critical),
    ("drain p2p", Action.reset_gpu, Severity.warning),
    ("reset", Action.reset_gpu, Severity.critical),
    ("none", Action.none, Severity.info),
]
_RECOVERY_CODES = {
    0: "None",
    1: "GPU Reset Required",
    2: "Node Reboot Required",
    3: "Drain P2P",
    4: "Drain and Reset",
}

_KINDS: dict[str, CatalogueEntry] = {
    "gpu_lost": _e(
        _C,
        "GPU_LOST",
        Action.power_cycle,
        "The GPU has fallen off the PCIe bus (or no longer answers NVML). It must "
        "lose power to come back: power-cycle the host.",
    ),
    "pcie_aer_fatal": _e(
        _C,
        "PCIE_AER_FATAL",
        Action.reboot,
        "Uncorrected fatal PCIe error: the link or device is unusable until the host is rebooted.",
    ),
    "pcie_aer_corrected": _e(
        _I,
        "PCIE_AER_CORRECTED",
        Action.none,
        "Corrected (or uncorrected non-fatal) PCIe error; the hardware recovered. Watch the rate.",
    ),
    "xfs_shutdown": _e(
        _C,
        "XFS_SHUTDOWN",
        Action.reboot,
        "An XFS filesystem shut itself down after corruption or an I/O error; "
        "reboot (and let the boot-time repair run).",
    ),
    "ext4_readonly": _e(
        _C,
        "EXT4_READONLY",
        Action.reboot,
        "An EXT4 filesystem hit an error and was remounted read-only; reboot "
        "to run the filesystem check.",
    ),
    "hung_task": _e(
        _W,
        "HUNG_TASK",
        Action.reboot,
        "A task has been blocked in the kernel for minutes (often a wedged driver "
        "or storage); reboot the node if it persists.",
    ),
    "ib_link_down": _e(
        _W,
        "IB_LINK_DOWN",
        Action.none,
        "An InfiniBand/RoCE port went down. Links flap; only a persistent "
        "outage is a node problem (persistence rails decide).",
    ),
    "ib_link_up": _e(_I, "IB_LINK_UP", Action.none, "An InfiniBand/RoCE port came back up."),
    "straggler_panic": _e(
        Severity.critical,
        "STRAGGLER_PANIC",
        Action.none,
        "More than half of a cohort's active nodes fell below the straggler threshold at "
        "once: a fleet-wide cause (storage, network, a bad job), not many bad nodes. The "
        "threshold is frozen and no node alerts are raised until it clears.",
    ),
    "straggler": _e(
        _W,
        "STRAGGLER",
        Action.none,
        "The node's health score stayed below the cluster's straggler threshold "
        "(median - k*MAD*1.4826) for several pushes: it is slow, not failed. A "
        "diagnostic validation run is recommended; it never drives a reboot.",
    ),
    "oom_kill": _e(
        _I,
        "OOM_KILL",
        Action.none,
        "The kernel killed a process that ran out of memory; an application "
        "problem, not a node fault.",
    ),
    "mce_ue": _e(
        _C,
        "MCE_UE",
        Action.migrate,
        "Uncorrectable host memory/CPU error: the machine needs hardware service; "
        "move the node to other hardware and re-validate this machine.",
    ),
    "gsp_heartbeat": _e(
        _C,
        "GSP_HEARTBEAT_TIMEOUT",
        Action.reset_gpu,
        "The GPU System Processor stopped sending heartbeats; reset the GPU.",
    ),
    "reset_required": _e(
        _C,
        "GPU_RESET_REQUIRED",
        Action.reset_gpu,
        "The driver reports that the GPU requires a reset.",
    ),
    "gpu_init_failed": _e(
        _C,
        "GPU_INIT_FAILED",
        Action.reboot,
        "The driver failed to initialise the GPU (RmInitAdapter); reboot the node.",
    ),
    "nvsmi": _e(
        _W, "NVSMI_HEALTH", Action.none, "nvidia-smi reports a GPU memory health condition."
    ),
    "slurm_node": _e(
        _W,
        "SLURM_NODE_STATE",
        Action.none,
        "Slurm marks the node unavailable. The scheduler state alone never "
        "repairs a node; the reason is evidence for the operator.",
    ),
    "thermal": _e(
        _W,
        "GPU_THERMAL",
        Action.none,
        "The GPU is throttling for temperature; check cooling. Not a node repair.",
    ),
}


def _xid_entry(code: int, details: dict[str, Any]) -> CatalogueEntry:
    row = _XIDS.get(code)
    if row is None:
        return replace(
            _e(
                _W,
                f"XID_{code}",
                Action.none,
                f"Xid {code} is not in the catalogue; recorded for an operator to review.",
            ),
            mapped=False,
        )
    mnemonic, severity, bucket, description = row
    if code in NVLINK5_XIDS:
        sev = str(details.get("severity", "")).lower()
        if sev.startswith("non"):
            severity, bucket = Severity.warning, IGNORE
            description += " Non-fatal: the link recovered; no action."
        elif sev == "fatal":
            description += " Fatal: reset the GPU."
    action = BUCKET_ACTION[bucket]
    if code == 154:
        raw = details.get("recovery_action")
        if raw is None and isinstance(details.get("recovery_action_code"), int):
            raw = _RECOVERY_CODES.get(details["recovery_action_code"])
        text = str(raw or "").lower()
        for needle, act, sev2 in _RECOVERY:
            if needle in text:
                action, severity = act, sev2
                break
        if raw:
            description = f"The driver reports recovery action '{raw}' for the GPU."
    return _e(
        severity, mnemonic, action, description, app_level=code in APP_LEVEL_XIDS, bucket=bucket
    )


def _sxid_entry(code: int, details: dict[str, Any]) -> CatalogueEntry:
    sev = str(details.get("severity", "")).lower()
    fatal = sev == "fatal" or (not sev.startswith("non") and code not in NONFATAL_SXIDS)
    if fatal:
        return _e(
            _C,
            "NVSWITCH_FATAL",
            Action.reboot,
            f"Fatal NVSwitch error (SXid {code}): the GPUs and NVSwitches of the "
            "baseboard need a reset; reboot the node.",
        )
    return _e(
        _W,
        "NVSWITCH_NON_FATAL",
        Action.none,
        f"Non-fatal NVSwitch error (SXid {code}); the switch recovered.",
    )


def _nvsmi_entry(details: dict[str, Any]) -> CatalogueEntry:
    flags = details.get("flags")
    fl = set(flags) if isinstance(flags, list) else set()
    if {"remap_failure", "sram_threshold_exceeded"} & fl:
        return _e(
            _C,
            "NVSMI_MEMORY_FAILURE",
            Action.remove,
            "nvidia-smi reports a row-remapping failure or SRAM error threshold "
            "exceeded: the GPU needs hardware service.",
        )
    if {"dram_uncorrectable", "sram_uncorrectable", "dbe_volatile_total"} & fl:
        return _e(
            _C,
            "NVSMI_UNCORRECTABLE_ECC",
            Action.reset_gpu,
            "nvidia-smi counts uncorrectable ECC errors since the last reset; reset "
            "the GPU so the memory is remapped.",
        )
    if {"remap_pending", "retired_pending"} & fl:
        return _e(
            _W,
            "NVSMI_REMAP_PENDING",
            Action.reset_gpu,
            "A memory row remap (or page retirement) is pending; it takes effect at "
            "the next GPU reset.",
        )
    if fl:
        return _e(
            _W,
            "NVSMI_THROTTLE",
            Action.none,
            "nvidia-smi reports hardware or thermal clock slowdown; check cooling and "
            "power. Not a node repair.",
        )
    return _KINDS["nvsmi"]


def default_entry(kind: str, code: int | None, details: dict[str, Any]) -> CatalogueEntry:
    """The built-in entry, before operator overrides (see :func:`lookup`)."""
    if kind == "xid" and code is not None:
        return _xid_entry(code, details)
    if kind == "sxid" and code is not None:
        return _sxid_entry(code, details)
    if kind == "nvsmi":
        return _nvsmi_entry(details)
    entry = _KINDS.get(kind)
    if entry is not None:
        return entry
    return replace(
        _e(
            _W,
            kind.upper()[:64] or "UNKNOWN",
            Action.none,
            f"Fault kind '{kind}' has no catalogue mapping; recorded for an operator to review.",
        ),
        mapped=False,
    )


def _override_for(kind: str, code: int | None, config: CatalogueConfig) -> CatalogueOverride | None:
    if kind == "xid" and code is not None and code in config.xid:
        return config.xid[code]
    if kind == "sxid" and code is not None and code in config.sxid:
        return config.sxid[code]
    return config.kinds.get(kind)


def lookup(
    kind: str, code: int | None, details: dict[str, Any], config: CatalogueConfig
) -> CatalogueEntry:
    """Catalogue entry for one fault, operator overrides applied.

    ``kind``: a classify kind (or any other detector kind: unknown kinds get an entry with
    ``mapped=False``); ``code``: the Xid/SXid code or None; ``details``: the reader's
    kind-specific evidence (NVLink severity, Xid 154 recovery action, nvidia-smi flags);
    ``config``: ``policy.catalogue``. Override precedence: ``config.xid[code]`` /
    ``config.sxid[code]``, then ``config.kinds[kind]``. An override's ``action``,
    ``severity``, ``actionable``, ``count`` and ``window_s`` replace the defaults; an
    override that maps an action also clears ``app_level`` (the operator decided, e.g.
    scenario 9) and makes the entry ``mapped``.

    Raises ``ValueError`` naming the field when ``kind`` is empty or ``code`` negative.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind: must be a non-empty string, got {kind!r}")
    if code is not None and (not isinstance(code, int) or code < 0):
        raise ValueError(f"code: must be a non-negative integer or None, got {code!r}")
    entry = default_entry(kind, code, details if isinstance(details, dict) else {})
    ov = _override_for(kind, code, config)
    if ov is None:
        return entry
    action = ov.action if ov.action is not None else entry.action
    actionable = ov.actionable if ov.actionable is not None else action is not Action.none
    return replace(
        entry,
        action=action,
        severity=ov.severity if ov.severity is not None else entry.severity,
        actionable=actionable,
        count=ov.count,
        window_s=ov.window_s,
        app_level=entry.app_level and ov.action is None,
        mapped=entry.mapped or ov.action is not None,
    )
