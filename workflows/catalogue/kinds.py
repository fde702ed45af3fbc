"""Entries for the kinds without an Xid/SXid code: kernel, tool and control-plane kinds.

Each entry names its source: the message's own words, a vendor document, or the DESIGN
section that sets the rule. Kinds whose entry depends on what the reader found
(``nvsmi`` flags, ``npd_condition`` condition, ``dcgm_diag`` failed tests,
``node_not_ready`` BMC evidence) are decided per occurrence here.
"""

from __future__ import annotations

from typing import Any

from workflows.catalogue.dcgm import dcgm_entry
from workflows.catalogue.entry import CatalogueEntry, make_entry
from workflows.models import Action, Severity

__all__ = [
    "KIND_ENTRIES",
    "dcgm_entry",
    "nic_entry",
    "node_not_ready_entry",
    "node_unreachable_entry",
    "npd_entry",
    "nvsmi_entry",
    "slurm_node_entry",
]

_W, _C, _I = Severity.warning, Severity.critical, Severity.info

KIND_ENTRIES: dict[str, CatalogueEntry] = {
    "gpu_lost": make_entry(
        _C,
        "GPU_LOST",
        Action.power_cycle,
        "The GPU has fallen off the PCIe bus (or no longer answers NVML). It must "
        "lose power to come back: power-cycle the host.",
        "NVIDIA Xid Catalog row 79 (same failure): RESTART_BM; docs/design.md §5 → power_cycle",
    ),
    "pcie_aer_fatal": make_entry(
        _C,
        "PCIE_AER_FATAL",
        Action.reboot,
        "Uncorrected fatal PCIe error: the link or device is unusable until the host is rebooted.",
        "PCI Express Base Specification: uncorrectable fatal errors leave the link "
        "unreliable until reset (Linux Documentation/PCI/pcieaer-howto)",
    ),
    "pcie_aer_corrected": make_entry(
        _I,
        "PCIE_AER_CORRECTED",
        Action.none,
        "Corrected (or uncorrected non-fatal) PCIe error; the hardware recovered. Watch the rate.",
        "PCI Express Base Specification: correctable errors are recovered by hardware",
    ),
    "xfs_shutdown": make_entry(
        _C,
        "XFS_SHUTDOWN",
        Action.reboot,
        "An XFS filesystem shut itself down after corruption or an I/O error; "
        "reboot (and let the boot-time repair run).",
        "the kernel's message: XFS refuses further I/O until unmounted (xfs_repair)",
    ),
    "ext4_readonly": make_entry(
        _C,
        "EXT4_READONLY",
        Action.reboot,
        "A filesystem hit an error and was remounted read-only; reboot to run the "
        "filesystem check.",
        "the kernel's message (EXT4/BTRFS/XFS 'remounting filesystem read-only'): "
        "writes fail until a filesystem check and remount",
    ),
    "hung_task": make_entry(
        _W,
        "HUNG_TASK",
        Action.reboot,
        "A task has been blocked in the kernel for minutes (often a wedged driver "
        "or storage); reboot the node if it persists.",
        "the kernel's hung-task detector; persistence rails (docs/design.md §5) gate the reboot",
    ),
    "ib_link_down": make_entry(
        _W,
        "IB_LINK_DOWN",
        Action.none,
        "An InfiniBand/RoCE port went down. Links flap; only a persistent "
        "outage is a node problem (persistence rails decide).",
        "docs/design.md §5 rails: persistence per signal; a flap is not a node fault",
    ),
    "ib_link_up": make_entry(
        _I,
        "IB_LINK_UP",
        Action.none,
        "An InfiniBand/RoCE port came back up.",
        "clear edge of ib_link_down (agent.readers.events.CLEARS)",
    ),
    "straggler_panic": make_entry(
        _C,
        "STRAGGLER_PANIC",
        Action.none,
        "More than half of a cohort's active nodes fell below the straggler threshold at "
        "once: a fleet-wide cause (storage, network, a bad job), not many bad nodes. The "
        "threshold is frozen and no node alerts are raised until it clears.",
        "docs/design.md §5 'Panic mode'",
    ),
    "straggler": make_entry(
        _W,
        "STRAGGLER",
        Action.none,
        "The node's health score stayed below the cluster's straggler threshold "
        "(median - k*MAD*1.4826) for several pushes: it is slow, not failed. A "
        "diagnostic validation run is recommended; it never drives a reboot.",
        "docs/design.md §1 step 2 and rule zero: slow is not failed",
    ),
    "nccl_slow_rank": make_entry(
        _W,
        "NCCL_SLOW_RANK",
        Action.none,
        "A rank hosted on this node arrived last at most of its NCCL communicator's recent "
        "collectives, well beyond its peers' jitter: the whole job waits for it. Slow is "
        "not failed: a diagnostic validation run is recommended; timing alone never "
        "drives a reboot.",
        "docs/design.md §1 step 2 and rule zero: slow is not failed; lag behind the peers' median "
        "per collective, docs/design.md §4.5 (ingest.nccl)",
    ),
    "oom_kill": make_entry(
        _I,
        "OOM_KILL",
        Action.none,
        "The kernel killed a process that ran out of memory; an application "
        "problem, not a node fault.",
        "the kernel's OOM killer acts on one process; the node keeps running",
    ),
    "mce_ue": make_entry(
        _C,
        "MCE_UE",
        Action.migrate,
        "Uncorrectable host memory/CPU error: the machine needs hardware service; "
        "move the node to other hardware and re-validate this machine.",
        "Linux EDAC/MCE: uncorrected errors mean failing host hardware; docs/design.md §5 migrate",
    ),
    "gsp_heartbeat": make_entry(
        _C,
        "GSP_HEARTBEAT_TIMEOUT",
        Action.reset_gpu,
        "The GPU System Processor stopped sending heartbeats; reset the GPU.",
        "NVIDIA Xid Catalog rows 119/120 (GSP timeout/error): RESET_GPU",
    ),
    "reset_required": make_entry(
        _C,
        "GPU_RESET_REQUIRED",
        Action.reset_gpu,
        "The driver reports that the GPU requires a reset.",
        "the driver's message itself ('GPU reset required')",
    ),
    "gpu_init_failed": make_entry(
        _C,
        "GPU_INIT_FAILED",
        Action.reboot,
        "The driver failed to initialise the GPU (RmInitAdapter); reboot the node.",
        "the driver's RmInitAdapter failure: the GPU is unusable until the driver "
        "reloads (a reboot reloads it)",
    ),
    "uvm_fatal": make_entry(
        _C,
        "UVM_GLOBAL_FATAL",
        Action.reboot,
        "NVIDIA's unified-memory driver hit a global fatal error and says the OS must be "
        "rebooted to recover; reboot the node.",
        "the driver's message itself: 'uvm encountered global fatal error …, requiring "
        "os reboot to recover' (nvGpuOpsReportFatalError)",
    ),
    "slurm_node": make_entry(
        _W,
        "SLURM_NODE_STATE",
        Action.none,
        "Slurm marks the node unavailable. The scheduler state alone never "
        "repairs a node; the reason is evidence for the operator.",
        "docs/design.md §1 rule zero: no node repair without a failed health check",
    ),
    "k8s_frequent_kubelet_restart": make_entry(
        _W,
        "K8S_FREQUENT_KUBELET_RESTART",
        Action.none,
        "node-problem-detector reports frequent kubelet restarts; an observation for the operator.",
        "node-problem-detector systemd monitor condition; docs/design.md §1 rule zero",
    ),
    "k8s_frequent_containerd_restart": make_entry(
        _W,
        "K8S_FREQUENT_CONTAINERD_RESTART",
        Action.none,
        "node-problem-detector reports frequent containerd restarts; an observation for "
        "the operator.",
        "node-problem-detector systemd monitor condition; docs/design.md §1 rule zero",
    ),
    "circuit_breaker": make_entry(
        _C,
        "CIRCUIT_BREAKER",
        Action.none,
        "The cluster's circuit breaker tripped: automatic repairs are paused until an "
        "operator resets it.",
        "docs/design.md §5 rails: circuit breaker on a burst of correlated automatic repairs",
    ),
    "failure_domain": make_entry(
        _C,
        "FAILURE_DOMAIN_HOLD",
        Action.none,
        "Several nodes of one failure domain asked for automatic repairs at once: the "
        "cluster guard holds the domain's automatic repairs until an operator releases it.",
        "issue 29 item 2 (a rack reboot's false NVLink-down, 18 nodes at a time: "
        "NVSentinel PR #1715); docs/design.md §5 rails",
    ),
}
"""Entries of the kinds that need no per-occurrence decision."""

NVSMI_FLAG_ACTIONS: list[tuple[frozenset[str], str, Action, Severity, str, str]] = [
    (
        frozenset({"remap_failure", "sram_threshold_exceeded", "unrepairable_memory"}),
        "NVSMI_MEMORY_FAILURE",
        Action.remove,
        _C,
        "nvidia-smi reports a row-remapping failure, an SRAM error threshold exceeded or "
        "unrepairable memory: the GPU needs hardware service.",
        "NVIDIA A100/H100 GPU memory error management: row-remapping failure is an RMA "
        "condition (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)",
    ),
    (
        frozenset({"recovery_node_reboot"}),
        "NVSMI_RECOVERY_NODE_REBOOT",
        Action.reboot,
        _C,
        "nvidia-smi's GPU Recovery Action asks for a node reboot.",
        "NVML nvmlDeviceGpuRecoveryAction_t NODE_REBOOT (nvidia-smi -q 'GPU Recovery Action')",
    ),
    (
        frozenset(
            {
                "reset_required",
                "drain_and_reset_recommended",
                "recovery_reset",
                "recovery_drain_and_reset",
                "recovery_drain_p2p",
            }
        ),
        "NVSMI_RESET_REQUIRED",
        Action.reset_gpu,
        _C,
        "nvidia-smi reports that the GPU needs a reset (GPU Reset Status / GPU Recovery Action).",
        "nvidia-smi -q 'GPU Reset Status' (Reset Required, Drain and Reset Recommended) and "
        "NVML recovery actions GPU_RESET / DRAIN_AND_RESET / DRAIN_P2P",
    ),
    (
        frozenset({"dram_uncorrectable", "sram_uncorrectable", "dbe_volatile_total"}),
        "NVSMI_UNCORRECTABLE_ECC",
        Action.reset_gpu,
        _C,
        "nvidia-smi counts uncorrectable ECC errors since the last reset; reset the GPU so "
        "the memory is remapped.",
        "NVIDIA GPU memory error management: uncorrectable errors are remapped at the next "
        "GPU reset",
    ),
    (
        frozenset({"remap_pending", "retired_pending", "channel_repair_pending"}),
        "NVSMI_REPAIR_PENDING",
        Action.reset_gpu,
        _W,
        "A memory row remap, page retirement or channel repair is pending; it takes effect "
        "at the next GPU reset.",
        "NVIDIA 'Error Recovery and Response Flags': the row-remapping pending flag means "
        "remapping happens at the next GPU reset",
    ),
]
"""nvidia-smi flags → entry, heaviest first (the first group with a raised flag wins)."""

_NVSMI_FLAG_NAMES = frozenset().union(*(g[0] for g in NVSMI_FLAG_ACTIONS))

NPD_CONDITION_KINDS: dict[str, str] = {
    "kerneldeadlock": "hung_task",
    "taskhung": "hung_task",
    "readonlyfilesystem": "ext4_readonly",
    "filesystemisreadonly": "ext4_readonly",
    "xfsshutdown": "xfs_shutdown",
    "xfsfilesystemshutdown": "xfs_shutdown",
    "oomkilling": "oom_kill",
}
"""node-problem-detector condition types and event reasons (lower case, kubernetes/
node-problem-detector config/kernel-monitor.json) → the kernel kind whose entry applies."""


def nvsmi_flags(details: dict[str, Any]) -> set[str]:
    """The raised nvidia-smi flags: ``details["flags"]`` plus any flag-named detail that is
    ``True`` or a positive count (the agent's NVML path sends the counters alone)."""
    flags = details.get("flags")
    raised = {str(f) for f in flags} if isinstance(flags, list) else set()
    for key in _NVSMI_FLAG_NAMES:
        v = details.get(key)
        if v is True or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raised.add(key)
    return raised


def nvsmi_entry(details: dict[str, Any]) -> CatalogueEntry:
    """Entry of an ``nvsmi`` event from its flags (see :data:`NVSMI_FLAG_ACTIONS`)."""
    raised = nvsmi_flags(details)
    for group, mnemonic, action, severity, text, source in NVSMI_FLAG_ACTIONS:
        if group & raised:
            return make_entry(severity, mnemonic, action, text, source)
    if raised:
        return make_entry(
            _W,
            "NVSMI_THROTTLE",
            Action.none,
            "nvidia-smi reports hardware or thermal clock slowdown (or another observed "
            "flag); check cooling and power. Not a node repair.",
            "nvidia-smi -q 'Clocks Event Reasons': slowdown protects the GPU; no repair",
        )
    return make_entry(
        _W,
        "NVSMI_HEALTH",
        Action.none,
        "nvidia-smi reports a GPU health condition the catalogue has no action for.",
        "no flag with an action was raised",
    )


def npd_entry(details: dict[str, Any]) -> CatalogueEntry:
    """Entry of an ``npd_condition`` event: the kernel kind its ``condition`` stands for;
    an unknown condition is observed, unmapped."""
    cond = str(details.get("condition") or "").strip()
    kind = NPD_CONDITION_KINDS.get(cond.lower())
    if kind is None:
        return make_entry(
            _W,
            "NPD_CONDITION",
            Action.none,
            f"node-problem-detector reports condition {cond or '(none)'!r}, which the "
            "catalogue does not map; recorded for an operator to review.",
            "node-problem-detector condition without a catalogue mapping: observed, unmapped",
            mapped=False,
        )
    base = KIND_ENTRIES[kind]
    return make_entry(
        base.severity,
        "NPD_" + base.mnemonic,
        base.action,
        f"node-problem-detector reports {cond}: {base.description}",
        f"node-problem-detector {cond} → kind {kind} ({base.source})",
    )


NIC_FATAL_SOURCE = (
    "Linux mlx5_core health.c: a function whose firmware misses its health polls or reports "
    "a fatal syndrome enters the error state and stays down until the device is "
    "re-initialised (driver reload or host reboot); AWS EFA efa_com.c: a device that is not "
    "ready or whose admin queue closed is unusable until re-probed. NVSentinel NIC health "
    "monitor (syslog detection, severity classification): these are 'Fatal' "
    "(REPLACE_VM); the product's lightest host-level re-initialisation is reboot, and the "
    "escalation ladder (docs/design.md §5) moves repeats on to heavier actions"
)
NIC_NONFATAL_SOURCE = (
    "NVSentinel NIC health monitor (syslog detection, severity classification): insufficient "
    "slot power, module High Temperature / cable errors and PCIe bandwidth warnings are "
    "'Non-Fatal', diagnostic context (NONE); the link itself is judged by ib_link_down"
)


def nic_entry(details: dict[str, Any]) -> CatalogueEntry:
    """Entry of a ``nic_fatal`` event: a ConnectX/EFA firmware or device failure
    (``details["nic_severity"] == "fatal"``, or no severity read) asks for a reboot, which
    re-initialises the adapter; the module / slot-power / PCIe-bandwidth warnings
    (``nonfatal``) are observed only."""
    event = str(details.get("nic_event") or "")
    if details.get("nic_severity") == "nonfatal":
        return make_entry(
            _W,
            "NIC_DEGRADED",
            Action.none,
            f"The NIC reports {event or 'a warning'} (module cable/temperature, slot power or "
            "PCIe bandwidth): a rail may be slow or about to fail. Check the cable, "
            "transceiver cooling and slot; the link state itself is watched separately.",
            NIC_NONFATAL_SOURCE,
        )
    return make_entry(
        _C,
        "NIC_FATAL",
        Action.reboot,
        f"The NIC/HCA firmware failed ({event or 'fatal error'}): the adapter is down and "
        "its fabric rail with it until it is re-initialised. Reboot the node; repeats "
        "escalate (hardware service).",
        NIC_FATAL_SOURCE,
    )


def _bmc_confirmed(details: dict[str, Any]) -> bool:
    """The watcher attached the BMC's evidence of a dead host (``details["bmc"]``)."""
    return isinstance(details.get("bmc"), dict)


def node_not_ready_entry(details: dict[str, Any]) -> CatalogueEntry:
    """``node_not_ready``: observed only, unless the kube watcher attached the BMC's
    evidence of a dead host (``details["bmc"]``), which asks for a power cycle."""
    if _bmc_confirmed(details):
        return make_entry(
            _C,
            "NODE_NOT_READY_BMC",
            Action.power_cycle,
            "The node is NotReady and its BMC reports it powered off or dead: power-cycle "
            "the host through the BMC.",
            "docs/design.md §1 rule zero (a failed health check: the BMC's) and §5 power_cycle",
        )
    return make_entry(
        _W,
        "NODE_NOT_READY",
        Action.none,
        "Kubernetes reports the node NotReady. NotReady alone never repairs a node.",
        "docs/design.md §1 rule zero: 'Node unreachable / NotReady alone never repairs a node'",
    )


#: Slurm state flags that say the node's slurmd does not answer (slurm.conf(5):
#: NOT_RESPONDING after SlurmdTimeout; DOWN when slurmctld gives up on it).
SLURM_UNRESPONSIVE_FLAGS = frozenset({"NOT_RESPONDING", "DOWN"})

#: Node-level fault kinds: one state per node, whatever device a sender names, so a
#: restarted sender's clear (which may not know the device its predecessor named) clears
#: the raise (issue 26 I20). ``gpu_lost``: NVML sees fewer GPUs than expected.
NODE_LEVEL_KINDS: frozenset[str] = frozenset({"gpu_lost"})


def slurm_node_entry(details: dict[str, Any]) -> CatalogueEntry:
    """``slurm_node``: observed only (the scheduler's state alone never repairs a node),
    unless the node is ``NOT_RESPONDING``/``DOWN`` and the Slurm watcher attached the
    BMC's evidence of a dead host — the same rule as Kubernetes NotReady."""
    state = details.get("state")
    flags = {str(f).upper() for f in state} if isinstance(state, list) else set()
    if _bmc_confirmed(details) and flags & SLURM_UNRESPONSIVE_FLAGS:
        return make_entry(
            _C,
            "SLURM_NODE_DEAD_BMC",
            Action.power_cycle,
            "Slurm reports the node not responding (or DOWN) and its BMC reports it "
            "powered off or dead: power-cycle the host through the BMC.",
            "docs/design.md §1 rule zero (a failed health check: the BMC's) and §5 power_cycle; "
            "the same rule as Kubernetes NotReady",
        )
    return KIND_ENTRIES["slurm_node"]


def node_unreachable_entry(details: dict[str, Any]) -> CatalogueEntry:
    """``node_unreachable`` (ingest: the agent stopped pushing): observed only, unless the
    BMC's evidence of a dead host is attached, which asks for a power cycle."""
    if _bmc_confirmed(details):
        return make_entry(
            _C,
            "NODE_UNREACHABLE_BMC",
            Action.power_cycle,
            "The node's agent stopped pushing and its BMC reports the host powered off or "
            "dead: power-cycle the host through the BMC.",
            "docs/design.md §1 rule zero (a failed health check: the BMC's) and §5 power_cycle",
        )
    return make_entry(
        _W,
        "NODE_UNREACHABLE",
        Action.none,
        "The node's agent has not pushed for longer than ingest.unreachable_after_s. "
        "Unreachable alone never repairs a node.",
        "docs/design.md §1 rule zero: 'Node unreachable / NotReady alone never repairs a node'",
    )
