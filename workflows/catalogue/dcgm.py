"""``dcgm_diag``: DCGM's own failure catalogue mapped onto the product's actions.

Every DCGM failure code (``DCGM_FR_*``) carries a documented severity — NVIDIA DCGM
``dcgmlib/src/dcgm_errors.c`` table ``dcgmErrorMeta`` (severity ``DCGM_ERROR_*`` and category
``DCGM_FR_EC_*``) and ``dcgmlib/dcgm_errors.h`` (severity meanings and the ``_NEXT``
recommended step per code); NVIDIA/DCGM at commit 72fa3fe (July 2026). :data:`DCGM_ERRORS`
transcribes the table: ``name → (severity, category, next step)``, the next step reduced to
its class (``field_diag`` = "Run a field diagnostic on the GPU.", ``system_triage`` = "Check
DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics.", ``config``,
``bug_report``, ``cooling``, ``reset``/``reboot``/``monitor`` where the step says so,
``operator`` for any other step an operator carries out, ``none`` where DCGM gives none).

The product's action for one code (:func:`dcgm_action`), first rule that applies:

1. :data:`DEPARTURES` — the product's own decision, reason written down.
2. ``DCGM_ERROR_RESET`` ("Drain and reset GPU") → ``reset_gpu``.
3. ``DCGM_ERROR_ISOLATE`` ("Cannot perform workload. GPU should be isolated"): a
   ``SOFTWARE_*`` category → none (the software, not the GPU, is at fault: an operator
   fixes it); next step ``reset`` or ``system_triage`` ("Reset GPU") → ``reset_gpu``;
   ``reboot`` → ``reboot``; ``monitor`` ("can still perform workload") → none; any other
   step (a field diagnostic, a bug report to NVIDIA, hands on the machine) → ``remove``,
   the human-only action that takes the GPU's node out of service for hardware service
   (as NVIDIA's CONTACT_SUPPORT Xid bucket).
4. ``DCGM_ERROR_MONITOR`` / ``DCGM_ERROR_CONFIG`` / ``DCGM_ERROR_TRIAGE`` → none (keep
   running / fix the configuration / a person triages); the event stays as evidence.
5. ``DCGM_ERROR_UNKNOWN`` → observed, unmapped.

A table or JSON result with several codes takes the heaviest action
(:data:`workflows.models.ACTION_WEIGHT`). A failed test whose message names no known code
keeps the round-2 answer: none, evidence for re-validation. A CUDA driver/runtime version
mismatch (the container's CUDA is newer than the host driver) is the workload's: none.
"""

from __future__ import annotations

import re
from typing import Any

from workflows.catalogue.entry import CatalogueEntry, make_entry
from workflows.catalogue.sxid import sxid_entry
from workflows.catalogue.xid import xid_entry
from workflows.models import ACTION_WEIGHT, Action, Severity

SOURCE = (
    "NVIDIA DCGM dcgm_errors.c dcgmErrorMeta / dcgm_errors.h (NVIDIA/DCGM 72fa3fe, 2026-07)"
)

DCGM_ERRORS: dict[str, tuple[str, str, str]] = {
    "OK": ("UNKNOWN", "NONE", "none"),
    "UNKNOWN": ("UNKNOWN", "NONE", "none"),
    "UNRECOGNIZED": ("UNKNOWN", "NONE", "none"),
    "PCI_REPLAY_RATE": ("ISOLATE", "HARDWARE_PCIE", "field_diag"),
    "VOLATILE_DBE_DETECTED": ("ISOLATE", "HARDWARE_MEMORY", "reset"),
    "VOLATILE_SBE_DETECTED": ("MONITOR", "HARDWARE_MEMORY", "monitor"),
    "PENDING_PAGE_RETIREMENTS": ("RESET", "HARDWARE_MEMORY", "monitor"),
    "RETIRED_PAGES_LIMIT": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "RETIRED_PAGES_DBE_LIMIT": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "CORRUPT_INFOROM": ("TRIAGE", "HARDWARE_OTHER", "operator"),
    "CLOCKS_EVENT_THERMAL": ("MONITOR", "HARDWARE_THERMAL", "cooling"),
    "POWER_UNREADABLE": ("MONITOR", "HARDWARE_POWER", "system_triage"),
    "CLOCKS_EVENT_POWER": ("MONITOR", "HARDWARE_POWER", "monitor"),
    "NVLINK_ERROR_THRESHOLD": ("ISOLATE", "HARDWARE_NVLINK", "monitor"),
    "NVLINK_DOWN": ("TRIAGE", "HARDWARE_NVLINK", "system_triage"),
    "NVSWITCH_FATAL_ERROR": ("ISOLATE", "HARDWARE_NVSWITCH", "field_diag"),
    "NVSWITCH_NON_FATAL_ERROR": ("MONITOR", "HARDWARE_NVSWITCH", "monitor"),
    "NVSWITCH_DOWN": ("MONITOR", "HARDWARE_NVSWITCH", "system_triage"),
    "NO_ACCESS_TO_FILE": ("CONFIG", "SOFTWARE_OTHER", "operator"),
    "NVML_API": ("MONITOR", "SOFTWARE_LIBRARY", "operator"),
    "DEVICE_COUNT_MISMATCH": ("CONFIG", "SOFTWARE_OTHER", "operator"),
    "BAD_PARAMETER": ("UNKNOWN", "INTERNAL_OTHER", "bug_report"),
    "CANNOT_OPEN_LIB": ("TRIAGE", "SOFTWARE_LIBRARY", "operator"),
    "DENYLISTED_DRIVER": ("CONFIG", "SOFTWARE_CONFIG", "operator"),
    "NVML_LIB_BAD": ("ISOLATE", "SOFTWARE_LIBRARY", "operator"),
    "GRAPHICS_PROCESSES": ("RESET", "SOFTWARE_OTHER", "operator"),
    "HOSTENGINE_CONN": ("MONITOR", "INTERNAL_OTHER", "operator"),
    "FIELD_QUERY": ("MONITOR", "INTERNAL_OTHER", "system_triage"),
    "BAD_CUDA_ENV": ("CONFIG", "SOFTWARE_CUDA", "operator"),
    "PERSISTENCE_MODE": ("CONFIG", "SOFTWARE_OTHER", "operator"),
    "LOW_BANDWIDTH": ("TRIAGE", "HARDWARE_PCIE", "field_diag"),
    "HIGH_LATENCY": ("TRIAGE", "HARDWARE_PCIE", "field_diag"),
    "CANNOT_GET_FIELD_TAG": ("MONITOR", "INTERNAL_OTHER", "none"),
    "FIELD_VIOLATION": ("ISOLATE", "HARDWARE_OTHER", "system_triage"),
    "FIELD_THRESHOLD": ("MONITOR", "PERF_VIOLATION", "system_triage"),
    "FIELD_VIOLATION_DBL": ("ISOLATE", "PERF_VIOLATION", "system_triage"),
    "FIELD_THRESHOLD_DBL": ("ISOLATE", "PERF_VIOLATION", "system_triage"),
    "UNSUPPORTED_FIELD_TYPE": ("TRIAGE", "INTERNAL_OTHER", "system_triage"),
    "FIELD_THRESHOLD_TS": ("ISOLATE", "PERF_THRESHOLD", "system_triage"),
    "FIELD_THRESHOLD_TS_DBL": ("ISOLATE", "PERF_THRESHOLD", "system_triage"),
    "THERMAL_VIOLATIONS": ("MONITOR", "HARDWARE_THERMAL", "cooling"),
    "THERMAL_VIOLATIONS_TS": ("MONITOR", "HARDWARE_THERMAL", "cooling"),
    "TEMP_VIOLATION": ("MONITOR", "HARDWARE_THERMAL", "cooling"),
    "CLOCKS_EVENT_VIOLATION": ("MONITOR", "HARDWARE_OTHER", "system_triage"),
    "INTERNAL": ("TRIAGE", "INTERNAL_OTHER", "system_triage"),
    "PCIE_GENERATION": ("TRIAGE", "HARDWARE_PCIE", "config"),
    "PCIE_WIDTH": ("CONFIG", "HARDWARE_PCIE", "config"),
    "ABORTED": ("CONFIG", "SOFTWARE_OTHER", "none"),
    "TEST_DISABLED": ("CONFIG", "SOFTWARE_CONFIG", "config"),
    "CANNOT_GET_STAT": ("TRIAGE", "INTERNAL_OTHER", "operator"),
    "STRESS_LEVEL": ("TRIAGE", "PERF_THRESHOLD", "system_triage"),
    "CUDA_API": ("MONITOR", "SOFTWARE_CUDA", "system_triage"),
    "FAULTY_MEMORY": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "CANNOT_SET_WATCHES": ("MONITOR", "INTERNAL_OTHER", "system_triage"),
    "CUDA_UNBOUND": ("TRIAGE", "SOFTWARE_CUDA", "system_triage"),
    "ECC_DISABLED": ("CONFIG", "HARDWARE_MEMORY", "reset"),
    "MEMORY_ALLOC": ("TRIAGE", "SOFTWARE_OTHER", "system_triage"),
    "CUDA_DBE": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "MEMORY_MISMATCH": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "CUDA_DEVICE": ("TRIAGE", "SOFTWARE_CUDA", "operator"),
    "ECC_UNSUPPORTED": ("CONFIG", "HARDWARE_MEMORY", "config"),
    "ECC_PENDING": ("MONITOR", "HARDWARE_MEMORY", "operator"),
    "MEMORY_BANDWIDTH": ("TRIAGE", "PERF_THRESHOLD", "system_triage"),
    "TARGET_POWER": ("TRIAGE", "HARDWARE_POWER", "operator"),
    "API_FAIL": ("TRIAGE", "SOFTWARE_OTHER", "system_triage"),
    "API_FAIL_GPU": ("TRIAGE", "SOFTWARE_OTHER", "system_triage"),
    "CUDA_CONTEXT": ("TRIAGE", "SOFTWARE_CUDA", "operator"),
    "DCGM_API": ("TRIAGE", "INTERNAL_OTHER", "system_triage"),
    "CONCURRENT_GPUS": ("CONFIG", "SOFTWARE_CONFIG", "config"),
    "TOO_MANY_ERRORS": ("MONITOR", "SOFTWARE_OTHER", "none"),
    "NVLINK_CRC_ERROR_THRESHOLD": ("ISOLATE", "HARDWARE_NVLINK", "field_diag"),
    "NVLINK_ERROR_CRITICAL": ("ISOLATE", "HARDWARE_NVLINK", "field_diag"),
    "ENFORCED_POWER_LIMIT": ("CONFIG", "HARDWARE_POWER", "operator"),
    "MEMORY_ALLOC_HOST": ("TRIAGE", "SOFTWARE_OTHER", "operator"),
    "GPU_OP_MODE": ("MONITOR", "SOFTWARE_CONFIG", "operator"),
    "NO_MEMORY_CLOCKS": ("MONITOR", "HARDWARE_MEMORY", "none"),
    "NO_GRAPHICS_CLOCKS": ("MONITOR", "HARDWARE_OTHER", "none"),
    "HAD_TO_RESTORE_STATE": ("TRIAGE", "SOFTWARE_OTHER", "system_triage"),
    "L1TAG_UNSUPPORTED": ("CONFIG", "SOFTWARE_OTHER", "config"),
    "L1TAG_MISCOMPARE": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "ROW_REMAP_FAILURE": ("RESET", "HARDWARE_MEMORY", "reset"),
    "UNCONTAINED_ERROR": ("ISOLATE", "SOFTWARE_XID", "reset"),
    "EMPTY_GPU_LIST": ("CONFIG", "SOFTWARE_CONFIG", "config"),
    "DBE_PENDING_PAGE_RETIREMENTS": ("RESET", "HARDWARE_MEMORY", "reset"),
    "UNCORRECTABLE_ROW_REMAP": ("RESET", "HARDWARE_MEMORY", "none"),
    "PENDING_ROW_REMAP": ("RESET", "HARDWARE_MEMORY", "system_triage"),
    "BROKEN_P2P_MEMORY_DEVICE": ("ISOLATE", "HARDWARE_OTHER", "bug_report"),
    "BROKEN_P2P_WRITER_DEVICE": ("ISOLATE", "HARDWARE_OTHER", "bug_report"),
    "NVSWITCH_NVLINK_DOWN": ("ISOLATE", "HARDWARE_NVLINK", "field_diag"),
    "EUD_BINARY_PERMISSIONS": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_NON_ROOT_USER": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_SPAWN_FAILURE": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_TIMEOUT": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_ZOMBIE": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_NON_ZERO_EXIT_CODE": ("TRIAGE", "SOFTWARE_EUD", "none"),
    "EUD_TEST_FAILED": ("ISOLATE", "SOFTWARE_EUD", "none"),
    "FILE_CREATE_PERMISSIONS": ("CONFIG", "SOFTWARE_CONFIG", "operator"),
    "PAUSE_RESUME_FAILED": ("TRIAGE", "INTERNAL_OTHER", "none"),
    "PCIE_H_REPLAY_VIOLATION": ("ISOLATE", "HARDWARE_PCIE", "none"),
    "GPU_EXPECTED_NVLINKS_UP": ("TRIAGE", "HARDWARE_NVLINK", "operator"),
    "NVSWITCH_EXPECTED_NVLINKS_UP": ("TRIAGE", "HARDWARE_NVLINK", "operator"),
    "XID_ERROR": ("TRIAGE", "SOFTWARE_XID", "operator"),
    "SBE_VIOLATION": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "DBE_VIOLATION": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "PCIE_REPLAY_VIOLATION": ("ISOLATE", "HARDWARE_PCIE", "field_diag"),
    "SBE_THRESHOLD_VIOLATION": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "DBE_THRESHOLD_VIOLATION": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "PCIE_REPLAY_THRESHOLD_VIOLATION": ("ISOLATE", "HARDWARE_PCIE", "field_diag"),
    "CUDA_FM_NOT_INITIALIZED": ("MONITOR", "SOFTWARE_CUDA", "operator"),
    "SXID_ERROR": ("ISOLATE", "SOFTWARE_XID", "system_triage"),
    "GFLOPS_THRESHOLD_VIOLATION": ("TRIAGE", "PERF_VIOLATION", "field_diag"),
    "NAN_VALUE": ("ISOLATE", "HARDWARE_MEMORY", "field_diag"),
    "FABRIC_MANAGER_TRAINING_ERROR": ("CONFIG", "SOFTWARE_CUDA", "operator"),
    "BROKEN_P2P_PCIE_MEMORY_DEVICE": ("ISOLATE", "HARDWARE_PCIE", "bug_report"),
    "BROKEN_P2P_PCIE_WRITER_DEVICE": ("ISOLATE", "HARDWARE_PCIE", "bug_report"),
    "BROKEN_P2P_NVLINK_MEMORY_DEVICE": ("ISOLATE", "HARDWARE_NVLINK", "bug_report"),
    "BROKEN_P2P_NVLINK_WRITER_DEVICE": ("ISOLATE", "HARDWARE_NVLINK", "bug_report"),
    "TEST_SKIPPED": ("CONFIG", "SOFTWARE_CONFIG", "none"),
    "SRAM_THRESHOLD": ("ISOLATE", "HARDWARE_MEMORY", "operator"),
    "NVLINK_EFFECTIVE_BER_THRESHOLD": ("ISOLATE", "HARDWARE_NVLINK", "field_diag"),
    "FALLEN_OFF_BUS": ("ISOLATE", "HARDWARE_OTHER", "field_diag"),
    "NVLINK_SYMBOL_BER_THRESHOLD": ("ISOLATE", "HARDWARE_NVLINK", "field_diag"),
    "IMEX_UNHEALTHY": ("ISOLATE", "SOFTWARE_OTHER", "operator"),
    "FABRIC_PROBE_STATE": ("MONITOR", "HARDWARE_NVLINK", "operator"),
    "BINARY_PERMISSIONS": ("TRIAGE", "SOFTWARE_OTHER", "none"),
    "GPU_RECOVERY_RESET": ("RESET", "HARDWARE_OTHER", "reset"),
    "GPU_RECOVERY_REBOOT": ("ISOLATE", "HARDWARE_OTHER", "reboot"),
    "GPU_RECOVERY_DRAIN_P2P": ("RESET", "HARDWARE_OTHER", "operator"),
    "GPU_RECOVERY_DRAIN_RESET": ("RESET", "HARDWARE_OTHER", "reset"),
    "NCCL_ERROR": ("RESET", "HARDWARE_OTHER", "reset"),
    "RETEST_REQUESTED": ("TRIAGE", "SOFTWARE_OTHER", "none"),
    "CONTAINED_ERROR": ("MONITOR", "SOFTWARE_XID", "reset"),
    "UNCORRECTABLE_ROW_REMAP_LIMIT": ("TRIAGE", "HARDWARE_MEMORY", "field_diag"),
}
"""``DCGM_FR_<name>`` → (``DCGM_ERROR_*`` severity, ``DCGM_FR_EC_*`` category, next-step
class), row by row from ``dcgmErrorMeta``."""

DEPARTURES: dict[str, tuple[Action, str]] = {
    "GRAPHICS_PROCESSES": (
        Action.none,
        "DCGM severity RESET, but the fault is a graphics process left open on the GPU "
        "(category SOFTWARE_OTHER; next step: stop the graphics processes): no repair",
    ),
    "ROW_REMAP_FAILURE": (
        Action.remove,
        "DCGM severity RESET, but its next step says 'unrecoverable memory hardware damage'; "
        "NVIDIA A100/H100 memory error management: a row-remapping failure is an RMA "
        "condition (the nvsmi remap_failure row)",
    ),
    "UNCORRECTABLE_ROW_REMAP_LIMIT": (
        Action.remove,
        "DCGM severity TRIAGE with next step 'Run a field diagnostic on the GPU.': the "
        "row-remap budget is spent (hardware memory), the same RMA condition as a "
        "row-remapping failure",
    ),
    "FALLEN_OFF_BUS": (
        Action.power_cycle,
        "DCGM severity ISOLATE: the GPU fell off the bus; NVIDIA Xid Catalog row 79 "
        "(RESTART_BM): it must lose power to come back (the gpu_lost row)",
    ),
    "CUDA_CONTEXT": (
        Action.reset_gpu,
        "DCGM severity TRIAGE, but a GPU that cannot create a CUDA context cannot run any "
        "work and no other signal reports it; the lightest repair is a GPU reset (DCGM's "
        "system-triage step: 'Reset GPU. … Rerun diagnostics.'); a CUDA driver/runtime "
        "version mismatch is excluded (the workload's)",
    ),
    "EUD_TEST_FAILED": (
        Action.remove,
        "DCGM severity ISOLATE: the end-user field diagnostic (EUD) itself failed, a "
        "hardware finding although its category is SOFTWARE_EUD: hardware service",
    ),
    "UNCONTAINED_ERROR": (
        Action.reset_gpu,
        "DCGM severity ISOLATE, category SOFTWARE_XID (it is Xid 95), next step 'Drain the "
        "GPU and reset it or reboot the node.': NVIDIA Xid Catalog row 95 RESET_GPU",
    ),
    "XID_ERROR": (
        Action.none,
        "the Xid DCGM saw decides through its own Xid Catalog row when the message names it "
        "('Detected XID N'); without a code, none (the xid event itself decides)",
    ),
    "SXID_ERROR": (
        Action.none,
        "the SXid DCGM saw decides through its own SXid row when the message names it "
        "('Detected fatal NvSwitch SXID N'); without a code, none",
    ),
}
"""Codes whose product action differs from the rule, each with its reason."""

_MISMATCH = re.compile(
    r"driver version is insufficient|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|driver/library "
    r"version mismatch|unsupported display driver\s*/\s*cuda driver combination|"
    r"forward compatibility|CUDA_ERROR_COMPAT_NOT_SUPPORTED|version mismatch",
    re.IGNORECASE,
)
"""A CUDA driver/runtime mismatch: the container's CUDA does not fit the host driver."""

_XID_IN_MSG = re.compile(r"Detected\s*XID\s*(\d{1,6})", re.IGNORECASE)
_SXID_IN_MSG = re.compile(r"NvSwitch\s*SXID\s*(\d{1,6})", re.IGNORECASE)

_SEVERITY_TEXT = {
    "ISOLATE": "Cannot perform workload. GPU should be isolated.",
    "RESET": "Drain and reset GPU.",
    "MONITOR": "Can perform workload, but needs to be monitored.",
    "TRIAGE": "This error should be triaged.",
    "CONFIG": "This error can be configured.",
    "UNKNOWN": "This error code is not recognized.",
}
"""``dcgmErrorSeverity_t`` meanings, as ``dcgm_errors.h`` documents them."""


def _named_code(name: str, texts: list[str]) -> tuple[Action, str] | None:
    """The Xid/SXid row's action for ``XID_ERROR``/``SXID_ERROR`` whose message names the
    code (heaviest of the codes named), else None."""
    pattern = _XID_IN_MSG if name == "XID_ERROR" else _SXID_IN_MSG if name == "SXID_ERROR" else None
    if pattern is None:
        return None
    found: list[tuple[Action, str]] = []
    for text in texts:
        for m in pattern.finditer(text):
            code = int(m.group(1))
            e = xid_entry(code, {}) if name == "XID_ERROR" else sxid_entry(code, {})
            kind = "Xid" if name == "XID_ERROR" else "SXid"
            found.append((e.action, f"{kind} {code}: {e.source}"))
    return max(found, key=lambda f: ACTION_WEIGHT[f[0]]) if found else None


def dcgm_action(
    name: str, mismatch: bool = False, texts: list[str] | None = None
) -> tuple[Action, str] | None:
    """``(action, why)`` for one ``DCGM_FR_<name>``; None for a code DCGM itself marks
    UNKNOWN or a name not in :data:`DCGM_ERRORS`. ``mismatch``: the message reports a CUDA
    driver/runtime mismatch (→ none for the CUDA codes); ``texts``: the printed messages,
    where ``XID_ERROR``/``SXID_ERROR`` find the Xid/SXid code they name."""
    row = DCGM_ERRORS.get(name)
    if row is None:
        return None
    sev, cat, step = row
    head = f"DCGM_FR_{name}: severity {sev} ({_SEVERITY_TEXT[sev]}), category {cat}, next {step}"
    if mismatch and cat == "SOFTWARE_CUDA":
        return Action.none, head + "; a CUDA driver/runtime mismatch is the workload's"
    named = _named_code(name, texts or [])
    if named is not None:
        return named[0], f"{head}; the code it names decides: {named[1]}"
    if name in DEPARTURES:
        action, why = DEPARTURES[name]
        return action, f"{head}; departure: {why}"
    if sev == "RESET":
        return Action.reset_gpu, head + " → reset_gpu"
    if sev == "ISOLATE":
        if cat.startswith("SOFTWARE"):
            return Action.none, head + " → none (software at fault, not the GPU)"
        if step in ("reset", "system_triage"):
            return Action.reset_gpu, head + " → reset_gpu (the step resets the GPU)"
        if step == "reboot":
            return Action.reboot, head + " → reboot"
        if step == "monitor":
            return Action.none, head + " → none (DCGM: it can still perform workload)"
        return Action.remove, head + " → remove (hardware service, human-only)"
    if sev in ("MONITOR", "CONFIG", "TRIAGE"):
        return Action.none, head + " → none"
    return None


_CRITICAL = {Action.reset_gpu, Action.reboot, Action.power_cycle, Action.remove}


def dcgm_entry(details: dict[str, Any]) -> CatalogueEntry:
    """Entry of a ``dcgm_diag`` result: the heaviest action over the DCGM codes the reader
    identified (``details["dcgm_errors"]``, names without ``DCGM_FR_``); without a code,
    evidence for re-validation (none). A result whose only codes DCGM marks UNKNOWN (or the
    reader could not name) is observed, unmapped."""
    codes = details.get("dcgm_errors")
    names = [str(c) for c in codes] if isinstance(codes, list) else []
    texts = [str(t) for key in ("warnings", "errors") for t in (details.get(key) or [])
             if isinstance(details.get(key), list)]
    mismatch = any(_MISMATCH.search(t) for t in texts)
    failed = details.get("failed")
    tests = ", ".join(str(f) for f in failed) if isinstance(failed, list) and failed else ""
    decided = [(n, got) for n in names if (got := dcgm_action(n, mismatch, texts)) is not None]
    if decided:
        name, (action, why) = max(decided, key=lambda d: ACTION_WEIGHT[d[1][0]])
        others = [n for n, _ in decided if n != name]
        also = f" (also: {', '.join('DCGM_FR_' + o for o in others)})" if others else ""
        what = f"failed: {tests}; " if tests else ""
        return make_entry(
            Severity.critical if action in _CRITICAL else Severity.warning,
            "DCGM_FR_" + name,
            action,
            f"dcgmi diag ({what}DCGM_FR_{name}{also}): {_SEVERITY_TEXT[DCGM_ERRORS[name][0]]}"
            f" Product action: {action.value}.",
            f"{SOURCE}: {why}",
        )
    if names:
        return make_entry(
            Severity.warning,
            "DCGM_DIAG",
            Action.none,
            f"dcgmi diag reported DCGM code(s) {', '.join(names)} that DCGM marks UNKNOWN; "
            "recorded for an operator to review.",
            f"{SOURCE}: severity DCGM_ERROR_UNKNOWN: observed, unmapped",
            mapped=False,
        )
    what = f"failed: {tests}" if tests else "no failed test named"
    return make_entry(
        Severity.warning if tests else Severity.info,
        "DCGM_DIAG",
        Action.none,
        f"dcgmi diag result ({what}) with no DCGM failure code in its messages: evidence "
        "for re-validating the machine, not a repair by itself.",
        "docs/design.md §1 step 5 (re-validation runs the same GPU checks) and rule zero; no "
        f"DCGM_FR code to look up in {SOURCE}",
    )
