"""``nvidia-smi -q`` reader: ECC counters, remapped rows, retired pages, throttle reasons,
GPU reset status and GPU recovery action.

Input is the ``Key : Value`` text of ``nvidia-smi -q`` (whole output or an excerpt, with or
without the ``GPU 00000000:10:1C.0`` header), indented as printed, indented with tabs, or
with the indentation stripped by a paste. Section titles are recognised as the known words
of :data:`SECTIONS` (so a flat paste still nests ``Volatile`` under ``ECC Errors``); when a
block keeps more than one indentation level, nesting follows the indentation as printed.
One :class:`FaultEvent` of kind ``nvsmi`` is produced per GPU block that shows an active
fault condition (see :func:`fault_flags`); a healthy block produces nothing.

Field names follow ``nvidia-smi -q`` of drivers R450–R580 (Ampere/Hopper: ``DRAM``/``SRAM
Correctable``/``Uncorrectable``; Volta and older: ``Single Bit``/``Double Bit`` → ``Total``;
Hopper ``SRAM Uncorrectable Parity``/``SEC-DED`` are summed into ``sram_uncorrectable``;
``Clocks Throttle Reasons`` was renamed ``Clocks Event Reasons`` in R535; ``GPU Reset
Status`` and ``GPU Recovery Action`` appear from R550/R570, the recovery action carrying
NVML's ``nvmlDeviceGetGpuRecoveryAction`` value; ``Channel Repair Pending`` and
``Unrepairable Memory`` under ``ECC Errors`` on the newest drivers).

``details`` keys of an ``nvsmi`` event (each only when printed with a readable value):

- counters (int): ``dram_correctable``, ``dram_uncorrectable``, ``sram_correctable``,
  ``sram_uncorrectable`` (volatile); ``aggregate_*`` of the same; ``sbe_volatile_total``,
  ``dbe_volatile_total``, ``sbe_aggregate_total``, ``dbe_aggregate_total`` (pre-Ampere);
  ``remap_correctable``, ``remap_uncorrectable`` (rows); ``retired_sbe``, ``retired_dbe``
  (pages); ``temperature_c``, ``shutdown_temp_c``, ``slowdown_temp_c`` (°C).
- booleans: ``remap_pending``, ``remap_failure``, ``retired_pending``,
  ``sram_threshold_exceeded``, ``hw_slowdown``, ``hw_thermal_slowdown``,
  ``hw_power_brake_slowdown``, ``sw_thermal_slowdown``, ``reset_required``,
  ``drain_and_reset_recommended``, ``channel_repair_pending``, ``unrepairable_memory``.
- ``gpu_recovery_action``: ``"none" | "reset" | "node_reboot" | "drain_p2p" |
  "drain_and_reset"`` (NVML ``NVML_GPU_RECOVERY_ACTION_*`` 0–4); a printed value that is none
  of these is kept verbatim as ``gpu_recovery_action_raw`` and raises no flag.
- ``product``, ``serial``: strings as printed.
- ``flags``: list of the active conditions, names from :func:`fault_flags`.

Placeholders that mean "no value" — ``N/A``, ``[N/A]``, ``Not Supported``, ``Unknown Error``,
``Insufficient Permissions`` and R570's ``Requested functionality has been deprecated``
(printed for the retired ``Reset Required`` fields) — are never a fault.
"""

from __future__ import annotations

import re
from typing import Any

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

_GPU_HEADER = re.compile(
    r"^GPU\s+(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$"
)
_KV = re.compile(r"^(?P<ind>[ \t]*)(?P<key>[A-Za-z][^:]{0,80}?)\s+:(?:\s(?P<val>.*)|$)")
_TITLE = re.compile(r"^(?P<ind>[ \t]*)(?P<name>[A-Za-z][A-Za-z0-9 /()+.,_-]{0,80}?)\s*$")
_SYSLOG_FACILITY = re.compile(
    r"^\s*(?:line\s+)?[a-z0-9]{2,8}\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:"
)
"""``dmesg -x`` prefix (``kern  :err   : ``): shaped like ``Key : Value`` but a kernel line."""
_TOP_KEYS = ("Timestamp", "Driver Version", "CUDA Version", "Attached GPUs")

SECTIONS: dict[str, frozenset[str]] = {
    # GPU-level sections (parent: the GPU block itself), as printed by nvidia-smi -q R450-R580.
    **{
        name: frozenset()
        for name in (
            "accounting mode buffer size",
            "applications clocks",
            "bar1 memory usage",
            "capabilities",
            "clock policy",
            "clocks",
            "clocks event reasons",
            "clocks event reasons counters",
            "clocks throttle reasons",
            "clocks_throttle_reasons",
            "compute instance",
            "conf compute protected memory usage",
            "default applications clocks",
            "deferred clocks",
            "dram encryption mode",
            "driver model",
            "ecc errors",
            "ecc mode",
            "encoder stats",
            "fabric",
            "fb memory usage",
            "fbc stats",
            "gpu c2c mode",
            "gpu memory power readings",
            "gpu operation mode",
            "gpu power readings",
            "gpu reset status",
            "gpu virtualization mode",
            "ibmnpu",
            "inforom version",
            "max clocks",
            "max customer boost clocks",
            "mig devices",
            "mig mode",
            "module power readings",
            "pci",
            "platform info",
            "power readings",
            "power smoothing",
            "processes",
            "remapped rows",
            "retired pages",
            "supported clocks",
            "temperature",
            "utilization",
            "voltage",
            "workload power profiles",
        )
    },
    # Nested sections and the section(s) they sit in.
    "volatile": frozenset({"ecc errors"}),
    "aggregate": frozenset({"ecc errors"}),
    "aggregate uncorrectable sram sources": frozenset({"ecc errors"}),
    "single bit": frozenset({"volatile", "aggregate"}),
    "double bit": frozenset({"volatile", "aggregate"}),
    "histogram": frozenset({"remapped rows"}),
    "gpu link info": frozenset({"pci"}),
    "bridge chip": frozenset({"pci"}),
    "pcie generation": frozenset({"gpu link info"}),
    "link width": frozenset({"gpu link info"}),
    "health": frozenset({"fabric"}),
}
"""Section titles of ``nvidia-smi -q`` (lower case) → the titles they nest in (empty: directly
under the GPU). Source: ``nvidia-smi -q`` output of drivers R450–R580 as documented in the
``nvidia-smi(1)`` manual page shipped with the driver, and the samples in the tests."""

_COUNTERS: dict[tuple[str, str], str] = {
    ("volatile", "dram correctable"): "dram_correctable",
    ("volatile", "dram uncorrectable"): "dram_uncorrectable",
    ("volatile", "sram correctable"): "sram_correctable",
    ("volatile", "sram uncorrectable"): "sram_uncorrectable",
    ("volatile", "sram uncorrectable parity"): "sram_uncorrectable",
    ("volatile", "sram uncorrectable sec-ded"): "sram_uncorrectable",
    ("aggregate", "dram correctable"): "aggregate_dram_correctable",
    ("aggregate", "dram uncorrectable"): "aggregate_dram_uncorrectable",
    ("aggregate", "sram correctable"): "aggregate_sram_correctable",
    ("aggregate", "sram uncorrectable"): "aggregate_sram_uncorrectable",
    ("aggregate", "sram uncorrectable parity"): "aggregate_sram_uncorrectable",
    ("aggregate", "sram uncorrectable sec-ded"): "aggregate_sram_uncorrectable",
    ("aggregate", "sram threshold exceeded"): "sram_threshold_exceeded",
    ("single bit", "total"): "sbe_{scope}_total",
    ("double bit", "total"): "dbe_{scope}_total",
    ("remapped rows", "correctable error"): "remap_correctable",
    ("remapped rows", "uncorrectable error"): "remap_uncorrectable",
    ("remapped rows", "pending"): "remap_pending",
    ("remapped rows", "remapping failure occurred"): "remap_failure",
    ("retired pages", "pending page blacklist"): "retired_pending",
    ("retired pages", "pending page retirement"): "retired_pending",
    ("retired pages", "single bit ecc"): "retired_sbe",
    ("retired pages", "double bit ecc"): "retired_dbe",
    ("temperature", "gpu current temp"): "temperature_c",
    ("temperature", "gpu shutdown temp"): "shutdown_temp_c",
    ("temperature", "gpu slowdown temp"): "slowdown_temp_c",
}
_UNIQUE_KEYS: dict[str, str] = {
    "reset required": "reset_required",
    "drain and reset recommended": "drain_and_reset_recommended",
    "channel repair pending": "channel_repair_pending",
    "unrepairable memory": "unrepairable_memory",
    "remapping failure occurred": "remap_failure",
    "pending page blacklist": "retired_pending",
    "pending page retirement": "retired_pending",
}
"""Keys printed in one place only, read wherever they stand (a flat paste may leave them
under the wrong section)."""
_THROTTLE_FLAGS = {
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sw thermal slowdown": "sw_thermal_slowdown",
}
_THROTTLE_SECTIONS = ("clocks throttle reasons", "clocks event reasons", "clocks_throttle_reasons")
_KNOWN_KEYS = frozenset(
    {k for _, k in _COUNTERS}
    | set(_UNIQUE_KEYS)
    | set(_THROTTLE_FLAGS)
    | {"gpu recovery action", "product name", "serial number"}
)

RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
}
"""NVML ``nvmlDeviceGpuRecoveryAction_t`` (``NVML_GPU_RECOVERY_ACTION_NONE`` = 0,
``_GPU_RESET`` = 1, ``_NODE_REBOOT`` = 2, ``_DRAIN_P2P`` = 3, ``_DRAIN_AND_RESET`` = 4;
NVML API reference, R570) → the normalised ``gpu_recovery_action`` value."""

_PLACEHOLDERS = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "unknown",
        "unknown error",
        "[unknown error]",
        "not supported",
        "[not supported]",
        "insufficient permissions",
        "[insufficient permissions]",
        "requested functionality has been deprecated",
    }
)


def _lower_title(line: str) -> str:
    return " ".join(line.split()).lower()


def is_nvsmi_line(line: str) -> bool:
    """True for a line that is ``nvidia-smi -q`` output on its own: the ``NVSMI LOG``
    banner, a ``GPU 0000…`` header, an indented ``Key : Value``, a top-level key (``Driver
    Version`` …) or a ``Key : Value`` whose key only nvidia-smi prints (``Pending``, ``GPU
    Recovery Action`` …). Section titles are decided with their neighbours (see
    :func:`is_known_section`, :func:`is_section_line`)."""
    s = line.strip()
    if not s:
        return False
    if "NVSMI LOG" in s or _GPU_HEADER.match(s):
        return True
    m = _KV.match(line.rstrip())
    if m is None:
        return False
    if _SYSLOG_FACILITY.match(s):
        return False
    key = m.group("key").strip()
    return bool(m.group("ind")) or key in _TOP_KEYS or _lower_title(key) in _KNOWN_KEYS


def is_kv_line(line: str) -> bool:
    """True for any ``Key : Value`` line (indented or not) that is not a ``dmesg -x`` line;
    used to continue a block already recognised as nvidia-smi output."""
    return bool(_KV.match(line)) and not _SYSLOG_FACILITY.match(line)


def is_known_section(line: str) -> bool:
    """True for a section title of :data:`SECTIONS`, at any indentation."""
    if ":" in line or "[" in line:  # cheap reject: every kernel-log prefix has one
        return False
    s = line.strip()
    return 0 < len(s) <= 60 and _lower_title(s) in SECTIONS


def is_section_line(line: str) -> bool:
    """True for a line shaped like a section title (words alone on the line), indented or
    not; whether it belongs to nvidia-smi output is decided by its neighbours."""
    return bool(_TITLE.match(line.rstrip()))


_ANNOTATION = re.compile(
    r"\s*(?:#|<|//|;|,|\(|\[|\*|!|\u2190|=>|-{2,}|={2,}).*$|\s+-\s.*$|\s{2,}\S.*$"
)
"""Text an operator appends after a value (``Yes   <===``, ``Yes  # needs reset``,
``1  (bad)``, ``Yes, reset pending``, ``Yes - see ticket``): a comment, arrow or bracket
marker, a comma, a spaced dash, or anything after two or more blanks."""
_FLAG_OR_COUNT = re.compile(
    r"^(?:yes|no|true|false|active|not active|-?\d{1,18}(?:\s*(?:C|W|%|bank\(s\)|MiB))?)$",
    re.IGNORECASE,
)


def strip_annotation(v: str) -> str:
    """``v`` without an appended annotation when what is left is a flag or a count
    (``"Yes   <==="`` → ``"Yes"``); ``v`` unchanged otherwise (free text such as a product
    name keeps its words)."""
    head = _ANNOTATION.sub("", v)
    return head if head != v and _FLAG_OR_COUNT.match(head) else v


def _value(raw: str | None) -> Any:
    if raw is None:
        return None
    v = strip_annotation(raw.strip())
    low = v.lower()
    if low in ("yes", "true", "active"):
        return True
    if low in ("no", "false", "not active"):
        return False
    if low in _PLACEHOLDERS:
        return None
    num = re.match(r"^(-?\d{1,18})(?:\s*(?:C|W|%|bank\(s\)|MiB))?$", v)
    if num:
        return int(num.group(1))
    return v[:200]


def recovery_action(raw: str) -> str | None:
    """Normalised ``GPU Recovery Action`` value: ``"Node Reboot"`` → ``"node_reboot"``,
    ``"Drain and Reset"`` → ``"drain_and_reset"``, ``"Reboot"`` → ``"node_reboot"``, an NVML
    code (``"2"``, ``"0x2"``) → its name (:data:`RECOVERY_ACTIONS`); None for a placeholder
    or any other text."""
    low = _lower_title(_ANNOTATION.sub("", raw.strip()) or raw)
    if low in _PLACEHOLDERS:
        return None
    code = re.fullmatch(r"(0x[0-9a-f]{1,2}|\d{1,2})", low)
    if code:
        return RECOVERY_ACTIONS.get(int(code.group(1), 0))
    words = set(re.findall(r"[a-z0-9]+", low))
    if "drain" in words:
        if "reset" in words:
            return "drain_and_reset"
        if "p2p" in words:
            return "drain_p2p"
        return None
    if "reboot" in words:
        return "node_reboot"
    if "reset" in words:
        return "reset"
    if words == {"none"}:
        return "none"
    return None


def fault_flags(d: dict[str, Any]) -> list[str]:
    """Active fault conditions in parsed details ``d`` (names used in summaries), in order:

    ``remap_failure``, ``sram_threshold_exceeded``, ``unrepairable_memory``,
    ``remap_pending``, ``retired_pending``, ``channel_repair_pending``, ``reset_required``,
    ``drain_and_reset_recommended`` (each when True); ``recovery_reset``,
    ``recovery_node_reboot``, ``recovery_drain_p2p``, ``recovery_drain_and_reset`` (from
    ``gpu_recovery_action``); ``dram_uncorrectable``/``sram_uncorrectable``/
    ``dbe_volatile_total`` when > 0; then any active hardware/thermal slowdown.
    """
    flags: list[str] = []
    for key in (
        "remap_failure",
        "sram_threshold_exceeded",
        "unrepairable_memory",
        "remap_pending",
        "retired_pending",
        "channel_repair_pending",
        "reset_required",
        "drain_and_reset_recommended",
    ):
        if d.get(key) is True:
            flags.append(key)
    action = d.get("gpu_recovery_action")
    if isinstance(action, str) and action != "none":
        flags.append(f"recovery_{action}")
    for key in ("dram_uncorrectable", "sram_uncorrectable", "dbe_volatile_total"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            flags.append(key)
    for key in _THROTTLE_FLAGS.values():
        if d.get(key) is True:
            flags.append(key)
    return flags


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def _is_flat(lines: list[str]) -> bool:
    """True when every body line has the same indentation (stripped or uniformly shifted),
    so nesting must come from the known section words alone."""
    seen: set[int] = set()
    for line in lines:
        s = line.strip()
        if not s or "NVSMI LOG" in s or _GPU_HEADER.match(s) or set(s) <= {"="}:
            continue
        seen.add(_indent(line))
        if len(seen) > 1:
            return False
    return True


def _push_known(stack: list[tuple[int, str]], name: str) -> None:
    """Flat mode: nest ``name`` under the innermost open section it belongs in."""
    parents = SECTIONS.get(name)
    if parents:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][1] in parents:
                del stack[i + 1 :]
                stack.append((0, name))
                return
    stack.clear()
    stack.append((0, name))


def _store(d: dict[str, Any], target: str, value: Any) -> None:
    if target in d and isinstance(value, int) and not isinstance(value, bool):
        prev = d[target]
        d[target] = (prev if isinstance(prev, int) and not isinstance(prev, bool) else 0) + value
    else:
        d[target] = value


def _read_kv(d: dict[str, Any], names: list[str], key: str, raw: str | None) -> None:
    if key == "gpu recovery action":
        if raw is not None and _value(raw) is not None:
            norm = recovery_action(raw)
            if norm is not None:
                d["gpu_recovery_action"] = norm
            else:
                d["gpu_recovery_action_raw"] = raw.strip()[:200]
        return
    value = _value(raw)
    scope = "volatile" if "volatile" in names else "aggregate" if "aggregate" in names else ""
    parent = names[-1] if names else ""
    target = _COUNTERS.get((parent, key)) or _COUNTERS.get((scope, key))
    if target is None and key in _UNIQUE_KEYS:
        target = _UNIQUE_KEYS[key]
    if target is not None:
        if value is not None:
            _store(d, target.format(scope=scope or "volatile"), value)
        return
    if key in _THROTTLE_FLAGS and any(t in names for t in _THROTTLE_SECTIONS):
        if value is not None:
            d[_THROTTLE_FLAGS[key]] = value
        return
    if key in ("product name", "serial number") and value is not None and raw is not None:
        d["product" if key == "product name" else "serial"] = raw.strip()[:200]


def _parse_gpu(glines: list[str]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    flat = _is_flat(glines)
    stack: list[tuple[int, str]] = []
    for line in glines:
        if not line.strip():
            continue
        kv = _KV.match(line)
        if kv is None:
            if not _TITLE.match(line):
                continue
            name = _lower_title(line)
            if flat:
                if name in SECTIONS:
                    _push_known(stack, name)
                else:
                    stack.clear()
                    stack.append((0, name))
                continue
            indent = _indent(line)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, name))
            continue
        if not flat:
            indent = _indent(line)
            while stack and stack[-1][0] >= indent:
                stack.pop()
        _read_kv(d, [n for _, n in stack], _lower_title(kv.group("key")), kv.group("val"))
    return d


def parse_nvsmi(lines: list[str]) -> list[FaultEvent]:
    """Parse one ``nvidia-smi -q`` block (list of lines) into ``nvsmi`` events.

    One event per GPU with an active condition; ``pci`` is the GPU header address as
    printed (None for an excerpt without one); ``details`` holds every counter/flag read
    (keys in the module docstring). Never raises.
    """
    gpus: list[tuple[str | None, list[str]]] = []
    pci: str | None = None
    body: list[str] = []
    for raw in lines:
        line = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        hm = _GPU_HEADER.match(line.strip())
        if hm:
            if body or pci is not None:
                gpus.append((pci, body))
            pci, body = hm.group("pci"), [line]
            continue
        body.append(line)
    if body or pci is not None:
        gpus.append((pci, body))
    events: list[FaultEvent] = []
    for gpu_pci, glines in gpus:
        d = _parse_gpu(glines[1:] if gpu_pci is not None else glines)
        flags = fault_flags(d)
        if not flags:
            continue
        where = f"GPU {gpu_pci}" if gpu_pci else "GPU"
        events.append(
            FaultEvent(
                kind="nvsmi",
                xid=None,
                pci=gpu_pci,
                pid=None,
                process=None,
                summary=f"nvidia-smi on {where}: {', '.join(flags)}",
                text="\n".join(glines).strip("\n"),
                details={**d, "flags": flags},
                level=True,
            )
        )
    return events
