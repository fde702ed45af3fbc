"""Kernel-log readers, one module per fault family (NVSentinel's syslog monitor keeps one
handler per family the same way):

- :mod:`.xid` (NVIDIA Xid, with :mod:`.nvlink5` for the Xid 144–150 decode),
  :mod:`.sxid` (NVSwitch), :mod:`.gpu_lost` (fallen off the bus, no device handle,
  ``NV_ERR_GPU_IS_LOST``), :mod:`.gsp` (GSP heartbeat, reset required, RmInitAdapter),
  :mod:`.uvm` (UVM global fatal error), :mod:`.device_plugin` (Kubernetes device plugin
  ``XidCriticalError``), :mod:`.npd` (node-problem-detector);
- :mod:`.aer` (PCIe AER), :mod:`.fs` (XFS shutdown, read-only remounts), :mod:`.hung`
  (hung tasks), :mod:`.ib` (InfiniBand links), :mod:`.oom` (OOM killer), :mod:`.mce`
  (EDAC / machine check);
- :mod:`.reader` — :class:`KernelLogReader`, the (needle, matcher) table, record splitting
  and assembly; :mod:`.fold` — one event for the records of one fault.

Public interface: :class:`KernelLogReader`, :func:`read_kernel_lines`, :func:`parse_xid`,
:data:`PCI_FULL`.
"""

from agent.readers.kernel.common import PCI_FULL
from agent.readers.kernel.reader import KernelLogReader, read_kernel_lines
from agent.readers.kernel.xid import parse_xid

__all__ = ["PCI_FULL", "KernelLogReader", "parse_xid", "read_kernel_lines"]
