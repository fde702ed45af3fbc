"""DCGM failure codes (``DCGM_FR_*``) and the message text ``dcgmi diag`` prints for each.

Facts from NVIDIA DCGM ``dcgmlib/dcgm_errors.h`` (enum ``dcgmError_t`` and the
``DCGM_FR_*_MSG`` format strings; NVIDIA/DCGM at commit 72fa3fe, July 2026): ``dcgmi diag``
prints a failure as its ``_MSG`` text (prefixed ``GPU N``) followed by its ``_NEXT`` step,
and ``dcgmi diag -j`` carries the code itself as ``error_id``. :func:`identify` names the code
of one printed message; the control plane's catalogue (``workflows.catalogue.dcgm``) maps
codes to actions. Stdlib only (the agent ships alone).

Patterns are matched with all whitespace removed from both sides, so a message that
``dcgmi`` wrapped mid-word onto several table rows is still recognised; older DCGM wording
(``GPU 3 has uncorrectable memory errors and row remappings are pending``) is accepted where
it differs from the current format string.
"""

from __future__ import annotations

import re

CODES: dict[str, int] = {
    "OK": 0, "UNKNOWN": 1, "UNRECOGNIZED": 2, "PCI_REPLAY_RATE": 3,
    "VOLATILE_DBE_DETECTED": 4, "VOLATILE_SBE_DETECTED": 5, "PENDING_PAGE_RETIREMENTS": 6,
    "RETIRED_PAGES_LIMIT": 7, "RETIRED_PAGES_DBE_LIMIT": 8, "CORRUPT_INFOROM": 9,
    "CLOCKS_EVENT_THERMAL": 10, "POWER_UNREADABLE": 11, "CLOCKS_EVENT_POWER": 12,
    "NVLINK_ERROR_THRESHOLD": 13, "NVLINK_DOWN": 14, "NVSWITCH_FATAL_ERROR": 15,
    "NVSWITCH_NON_FATAL_ERROR": 16, "NVSWITCH_DOWN": 17, "NO_ACCESS_TO_FILE": 18,
    "NVML_API": 19, "DEVICE_COUNT_MISMATCH": 20, "BAD_PARAMETER": 21, "CANNOT_OPEN_LIB": 22,
    "DENYLISTED_DRIVER": 23, "NVML_LIB_BAD": 24, "GRAPHICS_PROCESSES": 25,
    "HOSTENGINE_CONN": 26, "FIELD_QUERY": 27, "BAD_CUDA_ENV": 28, "PERSISTENCE_MODE": 29,
    "LOW_BANDWIDTH": 30, "HIGH_LATENCY": 31, "CANNOT_GET_FIELD_TAG": 32,
    "FIELD_VIOLATION": 33, "FIELD_THRESHOLD": 34, "FIELD_VIOLATION_DBL": 35,
    "FIELD_THRESHOLD_DBL": 36, "UNSUPPORTED_FIELD_TYPE": 37, "FIELD_THRESHOLD_TS": 38,
    "FIELD_THRESHOLD_TS_DBL": 39, "THERMAL_VIOLATIONS": 40, "THERMAL_VIOLATIONS_TS": 41,
    "TEMP_VIOLATION": 42, "CLOCKS_EVENT_VIOLATION": 43, "INTERNAL": 44,
    "PCIE_GENERATION": 45, "PCIE_WIDTH": 46, "ABORTED": 47, "TEST_DISABLED": 48,
    "CANNOT_GET_STAT": 49, "STRESS_LEVEL": 50, "CUDA_API": 51, "FAULTY_MEMORY": 52,
    "CANNOT_SET_WATCHES": 53, "CUDA_UNBOUND": 54, "ECC_DISABLED": 55, "MEMORY_ALLOC": 56,
    "CUDA_DBE": 57, "MEMORY_MISMATCH": 58, "CUDA_DEVICE": 59, "ECC_UNSUPPORTED": 60,
    "ECC_PENDING": 61, "MEMORY_BANDWIDTH": 62, "TARGET_POWER": 63, "API_FAIL": 64,
    "API_FAIL_GPU": 65, "CUDA_CONTEXT": 66, "DCGM_API": 67, "CONCURRENT_GPUS": 68,
    "TOO_MANY_ERRORS": 69, "NVLINK_CRC_ERROR_THRESHOLD": 70, "NVLINK_ERROR_CRITICAL": 71,
    "ENFORCED_POWER_LIMIT": 72, "MEMORY_ALLOC_HOST": 73, "GPU_OP_MODE": 74,
    "NO_MEMORY_CLOCKS": 75, "NO_GRAPHICS_CLOCKS": 76, "HAD_TO_RESTORE_STATE": 77,
    "L1TAG_UNSUPPORTED": 78, "L1TAG_MISCOMPARE": 79, "ROW_REMAP_FAILURE": 80,
    "UNCONTAINED_ERROR": 81, "EMPTY_GPU_LIST": 82, "DBE_PENDING_PAGE_RETIREMENTS": 83,
    "UNCORRECTABLE_ROW_REMAP": 84, "PENDING_ROW_REMAP": 85, "BROKEN_P2P_MEMORY_DEVICE": 86,
    "BROKEN_P2P_WRITER_DEVICE": 87, "NVSWITCH_NVLINK_DOWN": 88, "EUD_BINARY_PERMISSIONS": 89,
    "EUD_NON_ROOT_USER": 90, "EUD_SPAWN_FAILURE": 91, "EUD_TIMEOUT": 92, "EUD_ZOMBIE": 93,
    "EUD_NON_ZERO_EXIT_CODE": 94, "EUD_TEST_FAILED": 95, "FILE_CREATE_PERMISSIONS": 96,
    "PAUSE_RESUME_FAILED": 97, "PCIE_H_REPLAY_VIOLATION": 98, "GPU_EXPECTED_NVLINKS_UP": 99,
    "NVSWITCH_EXPECTED_NVLINKS_UP": 100, "XID_ERROR": 101, "SBE_VIOLATION": 102,
    "DBE_VIOLATION": 103, "PCIE_REPLAY_VIOLATION": 104, "SBE_THRESHOLD_VIOLATION": 105,
    "DBE_THRESHOLD_VIOLATION": 106, "PCIE_REPLAY_THRESHOLD_VIOLATION": 107,
    "CUDA_FM_NOT_INITIALIZED": 108, "SXID_ERROR": 109, "GFLOPS_THRESHOLD_VIOLATION": 110,
    "NAN_VALUE": 111, "FABRIC_MANAGER_TRAINING_ERROR": 112,
    "BROKEN_P2P_PCIE_MEMORY_DEVICE": 113, "BROKEN_P2P_PCIE_WRITER_DEVICE": 114,
    "BROKEN_P2P_NVLINK_MEMORY_DEVICE": 115, "BROKEN_P2P_NVLINK_WRITER_DEVICE": 116,
    "TEST_SKIPPED": 117, "SRAM_THRESHOLD": 118, "NVLINK_EFFECTIVE_BER_THRESHOLD": 119,
    "FALLEN_OFF_BUS": 120, "NVLINK_SYMBOL_BER_THRESHOLD": 121, "IMEX_UNHEALTHY": 122,
    "FABRIC_PROBE_STATE": 123, "BINARY_PERMISSIONS": 124, "GPU_RECOVERY_RESET": 125,
    "GPU_RECOVERY_REBOOT": 126, "GPU_RECOVERY_DRAIN_P2P": 127, "GPU_RECOVERY_DRAIN_RESET": 128,
    "NCCL_ERROR": 129, "RETEST_REQUESTED": 130, "CONTAINED_ERROR": 131,
    "UNCORRECTABLE_ROW_REMAP_LIMIT": 132,
}
"""``DCGM_FR_<name>`` (without the prefix) → code, enum ``dcgmError_t`` of
``dcgm_errors.h``."""

NAMES: dict[int, str] = {code: name for name, code in CODES.items()}
"""Code → name (the inverse of :data:`CODES`)."""

_MESSAGES: tuple[tuple[str, str], ...] = (
    # Memory (the _MSG strings; older wording where it differs).
    ("FAULTY_MEMORY", r"faulty memory elements"),
    ("NAN_VALUE", r"NaN-value memory elements"),
    ("UNCORRECTABLE_ROW_REMAP_LIMIT", r"exceeded uncorrectable row remap limit"),
    ("ROW_REMAP_FAILURE", r"row remapping failed|row remap(?:ping)? failure"),
    ("UNCORRECTABLE_ROW_REMAP", r"uncorrectable memory errors and \d+ rows were remapped"),
    ("PENDING_ROW_REMAP", r"row remappings? (?:are|is) pending|pending row remap"),
    ("DBE_PENDING_PAGE_RETIREMENTS", r"Pending page retirements together with a DBE"),
    ("PENDING_PAGE_RETIREMENTS", r"pending retired page|page retirements? (?:are|is) pending"),
    ("RETIRED_PAGES_DBE_LIMIT", r"retired pages due to DBEs"),
    ("RETIRED_PAGES_LIMIT", r"or more retired pages have been detected"),
    ("VOLATILE_DBE_DETECTED", r"volatile double-bit ECC error"),
    ("VOLATILE_SBE_DETECTED", r"single-bit ECC error\(s\) detected"),
    ("CUDA_DBE", r"CUDA APIs have indicated that a double-bit ECC error"),
    ("MEMORY_MISMATCH", r"memory mismatch was detected"),
    ("L1TAG_MISCOMPARE", r"miscompare failure in the L1 cache"),
    ("SRAM_THRESHOLD", r"SRAM Threshold Count exceeded"),
    ("ECC_DISABLED", r"because ECC is not enabled|ECC memory on GPU \d+ is not currently active"),
    ("ECC_PENDING", r"ECC memory for GPU \d+ is in a pending state"),
    ("MEMORY_ALLOC", r"Couldn't allocate at least"),
    ("MEMORY_BANDWIDTH", r"only achieved a memory bandwidth"),
    # Recovery actions (NVML) and bus.
    ("FALLEN_OFF_BUS", r"has fallen off the bus"),
    ("NCCL_ERROR", r"Detected NCCL error"),
    ("GPU_RECOVERY_REBOOT", r"\(NODE_REBOOT\)|left the OS in an inconsistent state"),
    ("GPU_RECOVERY_DRAIN_P2P", r"\(DRAIN_P2P\)|peer-to-peer traffic to be quiesced"),
    ("GPU_RECOVERY_DRAIN_RESET", r"\(DRAIN_AND_RESET\)|operating at reduced capacity due to a"),
    ("GPU_RECOVERY_RESET", r"\(GPU_RESET\)|requires a reset to recover from a fault"),
    ("UNCONTAINED_ERROR", r"uncontained error"),
    ("CONTAINED_ERROR", r"had a contained error"),
    ("XID_ERROR", r"Detected XID \d+"),
    ("SXID_ERROR", r"fatal NvSwitch SXID"),
    # CUDA and APIs (CUDA_API before CUDA_CONTEXT: "Error using CUDA API cuCtxCreate …
    # Unable to create CUDA context" is DCGM_FR_CUDA_API).
    ("CUDA_API", r"Error using CUDA API"),
    ("CUDA_CONTEXT", r"failed to create a CUDA context"),
    ("CUDA_UNBOUND", r"no longer bound to a CUDA context"),
    ("CUDA_DEVICE", r"Unable to find a corresponding CUDA device"),
    ("API_FAIL_GPU", r"API call \S+ failed for GPU"),
    ("API_FAIL", r"API call \S+ failed"),
    ("DCGM_API", r"Error using DCGM API"),
    ("NVML_API", r"Error calling NVML API"),
    ("CANNOT_OPEN_LIB", r"Cannot open library"),
    ("INTERNAL", r"internal error during the test"),
    # NVLink / NVSwitch.
    ("NVLINK_ERROR_CRITICAL", r"NvLink errors on GPU \d+'s NVLink \(should be 0\)"),
    ("NVLINK_CRC_ERROR_THRESHOLD", r"exceeding the limit of 100 per second"),
    ("NVLINK_ERROR_THRESHOLD", r"NvLink errors on GPU \d+'s NVLink which exceeds"),
    ("NVLINK_EFFECTIVE_BER_THRESHOLD", r"Detected effective BER"),
    ("NVLINK_SYMBOL_BER_THRESHOLD", r"Detected symbol BER"),
    ("NVLINK_DOWN", r"NvLink link \d+ is currently down"),
    ("NVSWITCH_EXPECTED_NVLINKS_UP", r"NvSwitch \d+ - Only \d+ NvLinks are up"),
    ("GPU_EXPECTED_NVLINKS_UP", r"Only \d+ NvLinks are up out of the expected"),
    ("NVSWITCH_FATAL_ERROR", r"Detected fatal errors on NvSwitch"),
    ("NVSWITCH_NON_FATAL_ERROR", r"Detected nonfatal errors on NvSwitch"),
    ("NVSWITCH_NVLINK_DOWN", r"NVSwitch \d+'s NvLink \d+ is down"),
    ("FABRIC_MANAGER_TRAINING_ERROR", r"Fabric Manager \(Cluster UUID"),
    ("CUDA_FM_NOT_INITIALIZED", r"fabric manager is not initiali[sz]ed"),
    ("FABRIC_PROBE_STATE", r"Fabric State is"),
    ("IMEX_UNHEALTHY", r"IMEX \S+ status is"),
    # P2P (the PCIe / NVLink forms before the plain ones).
    ("BROKEN_P2P_PCIE_MEMORY_DEVICE", r"unsuccessfully written to by GPU \d+ over PCIe"),
    ("BROKEN_P2P_NVLINK_MEMORY_DEVICE", r"unsuccessfully written to by GPU \d+ over NVLink"),
    ("BROKEN_P2P_MEMORY_DEVICE", r"unsuccessfully written to by GPU \d+"),
    ("BROKEN_P2P_PCIE_WRITER_DEVICE", r"unsuccessfully wrote data to GPU \d+ over PCIe"),
    ("BROKEN_P2P_NVLINK_WRITER_DEVICE", r"unsuccessfully wrote data to GPU \d+ over NVLink"),
    ("BROKEN_P2P_WRITER_DEVICE", r"unsuccessfully wrote data to GPU \d+"),
    # PCIe.
    ("PCI_REPLAY_RATE", r"PCIe replays per minute"),
    ("PCIE_H_REPLAY_VIOLATION", r"host-side PCIe replay violation"),
    ("PCIE_GENERATION", r"running at PCI link generation"),
    ("PCIE_WIDTH", r"running at PCI link width"),
    ("LOW_BANDWIDTH", r"did not exceed minimum required bandwidth"),
    ("HIGH_LATENCY", r"exceeded maximum allowed latency"),
    # Thermal, power, performance.
    ("CORRUPT_INFOROM", r"corrupt InfoROM"),
    ("CLOCKS_EVENT_THERMAL", r"clocks event due to thermal violation"),
    ("CLOCKS_EVENT_POWER", r"clocks event due to power violation"),
    ("THERMAL_VIOLATIONS_TS", r"Thermal violations totaling [\d.]+ seconds started at"),
    ("THERMAL_VIOLATIONS", r"thermal violations totaling"),
    ("TEMP_VIOLATION", r"exceeded user-specified maximum allowed temperature"),
    ("POWER_UNREADABLE", r"Cannot reliably read the power usage"),
    ("STRESS_LEVEL", r"did not reach desired stress level"),
    ("TARGET_POWER", r"did not reach desired power minimum"),
    ("ENFORCED_POWER_LIMIT", r"Enforced power limit on GPU"),
    ("GFLOPS_THRESHOLD_VIOLATION", r"which is below the threshold"),
    # Deployment / configuration.
    ("PERSISTENCE_MODE", r"Persistence mode for GPU \d+ is disabled"),
    ("GRAPHICS_PROCESSES", r"processes with graphics contexts open"),
    ("DENYLISTED_DRIVER", r"driver on the denylist"),
    ("BAD_CUDA_ENV", r"CUDA performance-limiting environment variable"),
    ("DEVICE_COUNT_MISMATCH", r"number of devices NVML returns is different"),
    ("NO_ACCESS_TO_FILE", r"could not be accessed directly"),
    ("FILE_CREATE_PERMISSIONS", r"does not have permissions to create a file"),
    ("ABORTED", r"Test was aborted early due to user signal"),
)
"""``(name, pattern)``: the first pattern found in a message names its code."""

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern.replace(" ", ""), re.IGNORECASE)) for name, pattern in _MESSAGES
)

MAX_MESSAGE_CHARS = 4000
"""Longest message text looked at (a dcgmi message is a few hundred characters)."""


def identify(message: str) -> str | None:
    """The ``DCGM_FR_*`` name (without the prefix) of one printed ``dcgmi diag`` message,
    e.g. ``"GPU 0 Found 56954234 faulty memory elements on GPU 0"`` → ``"FAULTY_MEMORY"``;
    None when no known message is in it. Never raises."""
    if not isinstance(message, str):
        return None
    squeezed = re.sub(r"\s+", "", message[:MAX_MESSAGE_CHARS])
    for name, pattern in _COMPILED:
        if pattern.search(squeezed):
            return name
    return None
