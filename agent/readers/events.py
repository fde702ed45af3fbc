"""The fault event every reader produces (stdlib only: the agent ships alone).

A :class:`FaultEvent` is one detected fault as read from text: a kernel-log record, an
``nvidia-smi -q`` GPU block, a ``scontrol show node`` record or slurmctld node-state line,
or a ``dcgmi diag`` result table. It carries what was read,
never a decision: severity and action come from :mod:`workflows.catalogue` on the control
plane (or in ``autorepair classify``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS: frozenset[str] = frozenset(
    {
        "xid",
        "sxid",
        "gpu_lost",
        "pcie_aer_fatal",
        "pcie_aer_corrected",
        "xfs_shutdown",
        "ext4_readonly",
        "hung_task",
        "ib_link_down",
        "ib_link_up",
        "oom_kill",
        "mce_ue",
        "gsp_heartbeat",
        "reset_required",
        "gpu_init_failed",
        "nvsmi",
        "slurm_node",
        "uvm_fatal",
        "npd_condition",
        "dcgm_diag",
        "nic_fatal",
    }
)
"""The ``autorepair classify`` kinds (docs/design.md §4.1): every kind the readers and the agent
emit. The control plane's vocabulary (``workflows.catalogue.vocabulary``) re-exports this
list, so a new kind added here must also get a catalogue entry (a test checks)."""

LEVEL_KINDS: frozenset[str] = frozenset(
    {"ib_link_down", "ib_link_up", "nvsmi", "slurm_node", "npd_condition"}
)
"""Kinds that describe a state with raise/clear edges; every other kind is an event."""

CLEARS: dict[str, str] = {"ib_link_up": "ib_link_down"}
"""``kind → level kind it clears``: an ``ib_link_up`` event has ``active=False`` and ends
the ``ib_link_down`` fault on the same device and port."""

MAX_LINE_CHARS = 16_384
"""Longest line the readers look at; the rest is cut. printk records are at most 1024
bytes (kernel ``LOG_LINE_MAX``) and nvidia-smi / scontrol lines far shorter, so only junk
is ever cut; the bound keeps every pattern linear and memory flat."""


@dataclass
class FaultEvent:
    """One fault read from text.

    - ``kind``: one of :data:`KINDS`.
    - ``xid``: the Xid or SXid code, else None.
    - ``pci``: the device address exactly as printed (``0000:c6:00``, ``0000:84:00.0``,
      the oldest ``0003:00``), else None. The agent sends a GPU's in one form
      (``agent.runner.GPU_KINDS``, ``agent.nvml.canonical_pci``: ``0000:84:00``).
    - ``pid`` / ``process``: from the line; None where it has none or prints ``<unknown>``.
    - ``summary``: stable one-line text (no timestamps, pids or counters that change
      between re-reports of the same fault).
    - ``text``: the raw evidence, lines of a multi-line record joined with ``\\n``.
    - ``details``: kind-specific evidence, JSON-serialisable. Kernel-log keys by kind:

      - ``xid``: ``channel``; ``gpc``/``tpc``/``sm`` (Xid 13); ``gpu_instance``/
        ``compute_instance`` (MIG); ``caused_by_xid``; ``gsp_function`` (Xid 119);
        ``reset_required`` (``RST: Yes``); ``message``; ``link`` (Xid 74, NVLink5).
        Xid 154: ``recovery_action_code`` (int, the "to" code, NVML
        ``nvmlDeviceGpuRecoveryAction_t``: 0 none, 1 GPU reset, 2 node reboot, 3 drain
        P2P, 4 drain and reset) only when printed; ``recovery_action`` (the label text,
        possibly cut off) only when a label is printed; neither when unreadable;
        ``previous_recovery_action_code``/``previous_recovery_action`` likewise.
        NVLink5 Xid 144–150: ``subunit``, ``severity`` (``fatal``/``nonfatal`` as
        printed), ``xc``, ``instance``, ``link``, ``intr_info``, ``error_status`` and, where
        NVIDIA's catalogue decodes them, ``nvlink5_unit``, ``nvlink5_action`` (immediate
        bucket: ``IGNORE``/``RESET_GPU``/``XID_154_EVAL``), ``nvlink5_investigatory``,
        ``nvlink5_severity``, ``link_down_reason`` (Xid 149 link events). Reported by the
        Kubernetes device plugin: ``reporter`` = ``"k8s-device-plugin"``, ``device`` (GPU
        UUID/name), ``all_devices``. Xid 79 folded with its fallen-off-the-bus record(s):
        ``related_evidence`` (list of their raw texts; the ``gpu_lost`` event is not emitted;
        nor is one of the same GPU that comes after the Xid 79 was emitted, within
        ``XID79_FOLLOW_S`` (300 s: a later read, the driver's next probe), whose text then
        goes nowhere: :mod:`agent.readers.kernel.fold`).
      - ``sxid``: ``severity`` (``fatal``/``nonfatal``) ONLY when the headline prints
        Fatal/Non-fatal, absent otherwise; ``severity_level`` (the ``Severity N`` number as
        printed, no decision); ``link``; ``nvswitch``; ``message``.
      - ``gpu_lost``: ``record`` (``multi_line`` for the ``nv.c`` block), ``nvml_error``,
        ``assertion``, ``gpu_index``; ``related_evidence`` when two records of one GPU fold.
      - ``uvm_fatal``: ``error_code`` (int, e.g. ``0x60`` → 96).
      - ``npd_condition``: ``condition`` (e.g. ``KernelDeadlock``), ``status``
        (``True``/``False``/``Unknown`` as printed), ``reason``, ``message``, ``reporter``.
        Kernel kinds read from node-problem-detector events carry ``reporter`` =
        ``"node-problem-detector"`` and ``npd_reason``.
      - ``ext4_readonly`` (any filesystem remounted read-only): ``filesystem`` (``ext4``,
        ``btrfs``, … or None), ``device``. ``xfs_shutdown``: ``device``.
      - ``oom_kill``: ``cgroup``; from the ``oom-kill:`` summary ``constraint``, ``uid``,
        ``task_memcg``, ``oom_memcg``, ``global_oom``; ``related_evidence`` when the
        summary and the ``Killed process`` line fold.
      - ``hung_task``: ``blocked_s``; ``pcie_aer_*``: ``aer_severity``, ``type``,
        ``source``, ``devices``, ``uncorrected_nonfatal``; ``gsp_heartbeat``:
        ``gpu_index``, ``diff_ms``, ``timeout_ms``; ``gpu_init_failed``: ``error``,
        ``minor``; ``mce_ue``: ``controller``, ``count``, ``location``; ``ib_link_*``:
        ``driver``, ``device``, ``port``.
      - ``nic_fatal``: ``driver``, ``device``, ``nic_event``, ``nic_severity``
        (``fatal``/``nonfatal``), ``syndrome``, ``ext_syndrome``, ``fw_version``,
        ``module``, ``module_error``, ``slot_power_w`` (see
        :mod:`agent.readers.kernel.nic`).
      - ``slurm_node`` / ``nvsmi`` / ``dcgm_diag``: Slurm ``state``/``reason``/…,
        nvidia-smi counters and flags, ``dcgmi diag`` ``failed``/``warned`` tests.
    - ``level``: True for a state (raise/clear edges), False for a single observation.
    - ``active``: False marks the clear edge of a level fault.
    """

    kind: str
    xid: int | None
    pci: str | None
    pid: int | None
    process: str | None
    summary: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)
    level: bool = False
    active: bool = True
