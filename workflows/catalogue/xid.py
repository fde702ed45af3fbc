"""Xid entries: NVIDIA's Xid Catalog mapped onto the product's action vocabulary.

Every Xid NVIDIA lists (:mod:`workflows.catalogue.nvidia_xid_catalog`) gets the action of
its *immediate* resolution bucket through :data:`BUCKET_ACTION` (docs/design.md §5), unless
:data:`DEPARTURES` gives the product's own action with the reason written down. The
*investigatory* bucket is not a first action: it is carried in the description, and the
escalation ladder (docs/design.md §5 "Ladder") moves repeated repairs up. Codes NVIDIA does not
list, and listed codes without a bucket and without a product decision, are *observed,
unmapped* (``mapped=False``, counted, never a silent ``none``).

Special codes: NVLink5 Xids 144–150 follow the severity the line prints; Xid 154 follows
the recovery action the driver reports (NVML ``nvmlDeviceGpuRecoveryAction_t``).
"""

from __future__ import annotations

from typing import Any

from workflows.catalogue.entry import CatalogueEntry, make_entry
from workflows.catalogue.nvidia_xid_catalog import BY_CODE, REVISION, SOURCE, NvidiaXid
from workflows.catalogue.vocabulary import APP_LEVEL_XIDS
from workflows.models import Action, Severity

_W, _C, _I = Severity.warning, Severity.critical, Severity.info

_FOLLOW_OTHER = "decided per occurrence (see workflows.catalogue.xid), not by the bucket name alone"

BUCKET_ACTION: dict[str, tuple[Action | None, str]] = {
    "RESTART_APP": (Action.none, "design.md §5: RESTART_APP → none (the application restarts)"),
    "IGNORE": (Action.none, "docs/design.md §5: IGNORE → none"),
    "RESET_GPU": (Action.reset_gpu, "docs/design.md §5: RESET_GPU → reset_gpu"),
    "RESTART_BM": (
        Action.power_cycle,
        "docs/design.md §5: RESTART_BM → power_cycle (the GPU must lose power)",
    ),
    "RESTART_VM": (
        Action.reboot,
        "RESTART_VM: restart the (virtual) machine's OS, the product's reboot",
    ),
    "CONTACT_SUPPORT": (
        Action.remove,
        "docs/design.md §5: CONTACT_SUPPORT → remove (human-only: recommended, never started)",
    ),
    "CHECK_MECHANICALS": (
        Action.remove,
        "CHECK_MECHANICALS: cabling and power need hands on the machine; remove is the "
        "human-only action that takes it out of service for that",
    ),
    "UPDATE_SWFW": (
        Action.none,
        "UPDATE_SWFW: a driver/firmware update is an operator task, not a node repair",
    ),
    "CHECK_UVM": (
        Action.none,
        "CHECK_UVM: the UVM driver state needs checking by a person; no node action",
    ),
    "WORKFLOW_XID_45": (
        Action.none,
        "WORKFLOW_XID_45: with another Xid, follow that Xid; alone, restart the application",
    ),
    "WORKFLOW_XID_48": (
        Action.reset_gpu,
        "WORKFLOW_XID_48: a double-bit ECC error is cleared by a GPU reset (row remap or "
        "page retirement takes effect at the reset)",
    ),
    "WORKFLOW_NVLINK_ERR": (
        Action.reset_gpu,
        "WORKFLOW_NVLINK_ERR: an NVLink error is reset with the GPU; repeats escalate",
    ),
    "WORKFLOW_NVLINK5_ERR": (None, "WORKFLOW_NVLINK5_ERR: " + _FOLLOW_OTHER),
    "XID_154": (None, "XID_154: " + _FOLLOW_OTHER),
}
"""NVIDIA immediate bucket → (product action, why). ``None``: decided per occurrence
(NVLink5 severity, Xid 154 recovery action)."""

DEPARTURES: dict[int, tuple[Action | None, str]] = {
    63: (
        Action.reset_gpu,
        "NVIDIA buckets Xid 63 IGNORE, but its own text says 'reset gpu to activate': the "
        "row remap (or page retirement) stays pending until a GPU reset, so the product "
        "resets the GPU (the corpus expects reset_gpu; gpud follows IGNORE).",
    ),
    109: (
        Action.none,
        "NVIDIA buckets Xid 109 RESET_GPU, but the Kubernetes device plugin treats it as an "
        "application error that leaves the GPU healthy (NVIDIA/k8s-device-plugin ignoredXids "
        "13, 31, 43, 45, 68, 109); the product follows the plugin, so a context-switch "
        "timeout of one job does not take the node's GPUs away from the others.",
    ),
    160: (
        Action.reboot,
        "Revisions of NVIDIA's catalogue disagree on Xid 160: an earlier one bucketed it "
        "RESTART_BM (NVSentinel's mapping keeps it), the 2025-10-29 one IGNORE with "
        "INVESTIGATE_SW (gpud follows it). A channel retired by the driver stays retired "
        "until the driver is reloaded, so the product restarts the node (reboot, lighter "
        "than RESTART_BM's power cycle).",
    ),
    167: (
        Action.reboot,
        "NVIDIA gives Xid 167 (PCIE_FATAL_TIMEOUT) no bucket yet. A fatal PCIe timeout "
        "leaves the link unusable like an uncorrected fatal PCIe error, which the product "
        "answers with a reboot (kind pcie_aer_fatal).",
    ),
    169: (
        Action.reset_gpu,
        "NVIDIA gives Xid 169 (SEC2_HALT_ERROR, internal micro-controller halt) no bucket "
        "yet; it is the same failure as Xid 62 PMU_HALT_ERROR (RESET_GPU) on another "
        "micro-controller, so the product resets the GPU.",
    ),
    171: (
        Action.reset_gpu,
        "NVIDIA gives Xid 171 (UNCORRECTABLE_DRAM_ERROR) no bucket yet and describes it as "
        "additional detail to Xid 48; the product handles it like Xid 48 (reset_gpu).",
    ),
    172: (
        Action.reset_gpu,
        "NVIDIA gives Xid 172 (UNCORRECTABLE_SRAM_ERROR) no bucket yet and describes it as "
        "additional detail to Xid 48; the product handles it like Xid 48 (reset_gpu).",
    ),
}
"""Codes where the product departs from (or fills in) NVIDIA's immediate bucket, with the
reason. Every other listed code follows :data:`BUCKET_ACTION`."""

PEER_NOTES: dict[int, str] = {
    94: "Contained ECC error: NVIDIA RESTART_APP (only the application that touched the "
    "memory is affected); the product follows NVIDIA (none, app-level; repeats on one GPU "
    "recommend diagnostics) where some peers reset the GPU.",
    64: "Row-remap/page-retirement failure: NVIDIA RESET_GPU then CONTACT_SUPPORT; the "
    "product resets first and lets the ladder and the investigatory bucket bring a person "
    "in, where peers that read only the investigatory bucket ask for RMA at once.",
    149: "NETIR errors: the printed severity decides (Fatal/Link Fatal → reset_gpu, as "
    "NVIDIA's 144–150 decode sheet gives for NETIR link-down and MFDE events; Nonfatal → "
    "none, as it gives for BER events); peers that map the code alone disagree both ways.",
}
"""Why the product's action differs from a peer's on codes the peers disagree about
(63, 109 and 160 are in :data:`DEPARTURES`)."""

DESCRIPTIONS: dict[int, str] = {
    8: "The GPU stopped processing work of an application; restart the application.",
    13: "Graphics engine exception, usually an application fault (illegal instruction or "
    "out-of-range address). Restart the application; repeats on the same GPU and GPC "
    "warrant a diagnostic run.",
    31: "GPU memory page fault, usually an illegal memory access by the application.",
    32: "Invalid or corrupted push buffer stream; the application's channel was torn down.",
    43: "The GPU stopped processing an application's channel (application fault); the GPU "
    "itself stays healthy.",
    45: "Preemptive cleanup of an application's channels after an earlier error; a "
    "consequence, not a fault of its own.",
    46: "The GPU stopped processing and did not recover; reset the GPU.",
    48: "Uncorrectable double-bit ECC error in GPU memory; reset the GPU so the bad row is "
    "remapped or the page retired.",
    54: "Auxiliary power is not connected to the GPU board: the power cabling needs "
    "checking by hand.",
    62: "Internal micro-controller halted; reset the GPU.",
    63: "A memory row was marked for remapping (or a page for retirement); it takes effect "
    "at the next GPU reset.",
    64: "Row remapping or page retirement failed: reset the GPU, and if it repeats the GPU "
    "memory is failing and needs hardware service.",
    74: "NVLink error on the GPU; reset the GPU (and check the link if it repeats).",
    79: "The GPU has fallen off the PCIe bus and no longer responds. It must lose power "
    "to come back: power-cycle the host.",
    92: "High single-bit ECC error rate (corrected); watch the GPU.",
    94: "Contained ECC error: only the application that touched the memory was affected.",
    95: "Uncontained ECC error: every application on the GPU is affected; reset the GPU.",
    109: "Context switch timeout, usually an application fault.",
    119: "The GPU System Processor did not answer a driver call in time; reset the GPU.",
    120: "The GPU System Processor hit an internal error; reset the GPU.",
    140: "Uncorrectable ECC error the firmware could not handle; reset the GPU.",
    154: "The driver changed the recovery action the GPU needs.",
}
"""Plain-language descriptions where NVIDIA's one-line description says too little."""

NVLINK5_XIDS = frozenset(range(144, 151))
"""NVLink5 Xids whose printed severity (Fatal/Nonfatal) selects the action."""

RECOVERY_ACTIONS: dict[int, tuple[str, Action, Severity]] = {
    0: ("None", Action.none, _I),
    1: ("GPU Reset Required", Action.reset_gpu, _C),
    2: ("Node Reboot Required", Action.reboot, _C),
    3: ("Drain P2P", Action.reset_gpu, _W),
    4: ("Drain and Reset", Action.reset_gpu, _C),
}
"""NVML ``nvmlDeviceGpuRecoveryAction_t`` (NVML API reference; NVIDIA "Error Recovery and
Response Flags", docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt): 0 NONE, 1 GPU_RESET,
2 NODE_REBOOT, 3 DRAIN_P2P (quiesce peer-to-peer traffic, then the action changes again;
the product prepares the reset), 4 DRAIN_AND_RESET. Value: (label, action, severity)."""

_RECOVERY_LABELS: list[tuple[str, int]] = [
    ("reboot", 2),
    ("drain and reset", 4),
    ("drain p2p", 3),
    ("reset", 1),
    ("none", 0),
]
_NVIDIA_CITE = f"NVIDIA Xid Catalog ({SOURCE}, {REVISION})"


def _mnemonic(row: NvidiaXid) -> str:
    return row.mnemonic.split(" / ")[0].strip() or f"XID_{row.code}"


def _severity(action: Action, bucket: str, app_level: bool) -> Severity:
    if action is not Action.none:
        return _C
    return _W if app_level or bucket in ("RESTART_APP", "UPDATE_SWFW", "CHECK_UVM") else _I


def unmapped_xid(code: int, why: str) -> CatalogueEntry:
    """Observed, unmapped entry for an Xid the catalogue cannot decide (``mapped=False``)."""
    return make_entry(
        _W,
        f"XID_{code}",
        Action.none,
        f"Xid {code}: {why} Recorded for an operator to review; no action decided.",
        f"{_NVIDIA_CITE}: {why} Observed, unmapped.",
        mapped=False,
    )


def product_action(code: int) -> tuple[Action | None, str] | None:
    """The product's action for a listed code and why: a departure, else the bucket's.

    ``None`` when NVIDIA does not list the code or lists it without a bucket the product
    decides; an action of ``None`` means "decided per occurrence" (144–150, 154).
    """
    if code in DEPARTURES:
        return DEPARTURES[code]
    row = BY_CODE.get(code)
    if row is None or row.immediate not in BUCKET_ACTION:
        return None
    return BUCKET_ACTION[row.immediate]


def xid_entry(code: int, details: dict[str, Any]) -> CatalogueEntry:
    """Default entry for Xid ``code`` with the reader's ``details`` (NVLink ``severity``,
    Xid 154 ``recovery_action_code`` / ``recovery_action``). Raises nothing."""
    row = BY_CODE.get(code)
    if row is None:
        return unmapped_xid(code, f"NVIDIA's Xid Catalog ({REVISION}) does not list it.")
    decided = product_action(code)
    if decided is None:
        return unmapped_xid(
            code,
            f"NVIDIA's Xid Catalog ({REVISION}) gives {row.mnemonic} no resolution bucket.",
        )
    action, why = decided
    app_level = code in APP_LEVEL_XIDS
    mnemonic = _mnemonic(row)
    text = DESCRIPTIONS.get(code) or f"{row.description} (NVIDIA: {row.mnemonic})."
    if row.investigatory and action is not None:
        text += f" If it repeats, NVIDIA's next step is {row.investigatory}."
    source = f"{_NVIDIA_CITE} row {code}: immediate {row.immediate or '(none)'}; {why}"
    if code == 154:
        return _recovery_entry(details, mnemonic, source)
    if action is None:  # NVLink5: the printed severity decides
        sev = str(details.get("severity", "")).lower()
        if sev.startswith("non"):
            action, text = Action.none, text + " Non-fatal: the link recovered; no action."
            source += "; line says Nonfatal (NVIDIA 144–150 decode: IGNORE)"
            return make_entry(_W, mnemonic, action, text, source, bucket=row.immediate)
        action = Action.reset_gpu
        if sev == "fatal":
            text += " Fatal: reset the GPU."
            source += "; line says Fatal (NVIDIA 144–150 decode: RESET_GPU)"
        else:
            text += " Severity not printed: treated as fatal."
            source += "; no severity printed: treated as fatal (most decode rows: RESET_GPU)"
    severity = _severity(action, row.immediate, app_level)
    if code == 63:
        severity = _W
    return make_entry(
        severity, mnemonic, action, text, source, app_level=app_level, bucket=row.immediate
    )


def _recovery_code(details: dict[str, Any]) -> tuple[int | None, str]:
    raw = details.get("recovery_action_code")
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw, "recovery_action_code"
    label = str(details.get("recovery_action") or "").strip().lower()
    if not label:
        return None, ""
    if label.startswith("0x"):
        try:
            return int(label, 16), "recovery_action"
        except ValueError:
            return None, ""
    for needle, code in _RECOVERY_LABELS:
        if needle in label:
            return code, "recovery_action"
    return None, ""


def _recovery_entry(details: dict[str, Any], mnemonic: str, source: str) -> CatalogueEntry:
    """Xid 154: the NVML recovery-action code first, then the printed label."""
    code, field = _recovery_code(details)
    known = RECOVERY_ACTIONS.get(code) if code is not None else None
    if known is None:
        printed = details.get("recovery_action", details.get("recovery_action_code"))
        return make_entry(
            _W,
            mnemonic,
            Action.none,
            "The driver changed the GPU's recovery action but the new action could not be "
            f"read (printed: {printed!r}); recorded for an operator, no action decided.",
            source + "; recovery action unreadable: observed, unmapped",
            bucket="XID_154",
            mapped=False,
        )
    label, action, severity = known
    return make_entry(
        severity,
        mnemonic,
        action,
        f"The driver reports recovery action {code} ({label}) for the GPU.",
        source + f"; {field} {code} ({label}) per NVML nvmlDeviceGpuRecoveryAction_t",
        bucket="XID_154",
    )
