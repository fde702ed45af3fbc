"""``nvidia-smi -q`` reader: ECC counters, remapped rows, retired pages, throttle reasons.

Input is the indented ``Key : Value`` text of ``nvidia-smi -q`` (whole output or an
excerpt, with or without the ``GPU 00000000:10:1C.0`` header). Sections are tracked by
indentation; one :class:`FaultEvent` of kind ``nvsmi`` is produced per GPU block that shows
an active fault condition (see :func:`fault_flags`); a healthy block produces nothing.

Field names follow ``nvidia-smi -q`` of drivers R450–R570 (Ampere/Hopper: ``DRAM``/``SRAM
Correctable``/``Uncorrectable``; Volta and older: ``Single Bit``/``Double Bit`` → ``Total``;
Hopper ``SRAM Uncorrectable Parity``/``SEC-DED`` are summed into ``sram_uncorrectable``;
``Clocks Throttle Reasons`` was renamed ``Clocks Event Reasons`` in R535).
"""

from __future__ import annotations

import re
from typing import Any

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

_GPU_HEADER = re.compile(
    r"^GPU\s+(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$"
)
_KV = re.compile(r"^(?P<ind>[ \t]*)(?P<key>[A-Za-z][^:]{0,80}?)\s+:(?:\s(?P<val>.*)|$)")
_SECTION = re.compile(r"^(?P<ind>[ \t]+)(?P<name>[A-Za-z][A-Za-z0-9 /()+.,_-]{0,80}?)\s*$")
_TOP_KEYS = ("Timestamp", "Driver Version", "CUDA Version", "Attached GPUs")

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
_THROTTLE_FLAGS = {
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sw thermal slowdown": "sw_thermal_slowdown",
}
_THROTTLE_SECTIONS = ("clocks throttle reasons", "clocks event reasons", "clocks_throttle_reasons")


def is_nvsmi_line(line: str) -> bool:
    """True for a line that belongs to ``nvidia-smi -q`` output (header, GPU line, ``K : V``)."""
    s = line.rstrip()
    if not s:
        return False
    if "NVSMI LOG" in s or _GPU_HEADER.match(s):
        return True
    m = _KV.match(s)
    if not m:
        return False
    return bool(m.group("ind")) or m.group("key").strip() in _TOP_KEYS


def is_section_line(line: str) -> bool:
    """True for an indented section title such as ``    ECC Errors``."""
    return bool(_SECTION.match(line.rstrip()))


def _value(raw: str | None) -> Any:
    if raw is None:
        return None
    v = raw.strip()
    low = v.lower()
    if low in ("yes", "true", "active"):
        return True
    if low in ("no", "false", "not active"):
        return False
    if low in ("n/a", "[n/a]", "", "unknown", "[unknown error]"):
        return None
    num = re.match(r"^(-?\d{1,18})(?:\s*(?:C|W|%|bank\(s\)|MiB))?$", v)
    if num:
        return int(num.group(1))
    return v[:200]


def fault_flags(d: dict[str, Any]) -> list[str]:
    """Active fault conditions in parsed counters ``d`` (names used in summaries).

    ``remap_failure``, ``sram_threshold_exceeded``, ``remap_pending``, ``retired_pending``,
    ``dram_uncorrectable``/``sram_uncorrectable``/``dbe_volatile_total`` > 0 and any active
    hardware/thermal slowdown.
    """
    flags: list[str] = []
    for key in ("remap_failure", "sram_threshold_exceeded", "remap_pending", "retired_pending"):
        if d.get(key) is True:
            flags.append(key)
    for key in ("dram_uncorrectable", "sram_uncorrectable", "dbe_volatile_total"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            flags.append(key)
    for key in _THROTTLE_FLAGS.values():
        if d.get(key) is True:
            flags.append(key)
    return flags


def parse_nvsmi(lines: list[str]) -> list[FaultEvent]:
    """Parse one ``nvidia-smi -q`` block (list of lines) into ``nvsmi`` events.

    One event per GPU with an active condition; ``pci`` is the GPU header address as
    printed (None for an excerpt without one); ``details`` holds every counter/flag read.
    """
    gpus: list[tuple[str | None, list[str], dict[str, Any]]] = []
    current: tuple[str | None, list[str], dict[str, Any]] = (None, [], {})
    stack: list[tuple[int, str]] = []
    for raw in lines:
        line = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        hm = _GPU_HEADER.match(line.strip()) if not line[:1].isspace() else None
        if hm:
            if current[1] and (current[0] is not None or current[2]):
                gpus.append(current)
            current = (hm.group("pci"), [line], {})
            stack = []
            continue
        current[1].append(line)
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        kv = _KV.match(line)
        if kv is None:
            sec = _SECTION.match(line)
            if sec:
                stack.append((indent, sec.group("name").strip().lower()))
            continue
        key = kv.group("key").strip().lower()
        value = _value(kv.group("val"))
        names = [n for _, n in stack]
        scope = "volatile" if "volatile" in names else "aggregate" if "aggregate" in names else ""
        d = current[2]
        parent = names[-1] if names else ""
        target = _COUNTERS.get((parent, key)) or _COUNTERS.get((scope, key))
        if target is None and parent in ("single bit", "double bit") and key == "total":
            target = _COUNTERS[(parent, key)]
        if target is not None and value is not None:
            target = target.format(scope=scope or "volatile")
            if target in d and isinstance(value, int) and not isinstance(value, bool):
                prev = d[target]
                d[target] = (prev if isinstance(prev, int) else 0) + value
            else:
                d[target] = value
            continue
        if any(t in names for t in _THROTTLE_SECTIONS) and key in _THROTTLE_FLAGS:
            if value is not None:
                d[_THROTTLE_FLAGS[key]] = value
            continue
        if key == "product name" and isinstance(value, str):
            d["product"] = value
        elif key == "serial number" and isinstance(value, str):
            d["serial"] = value
    if current[1]:
        gpus.append(current)
    events: list[FaultEvent] = []
    for pci, glines, d in gpus:
        flags = fault_flags(d)
        if not flags:
            continue
        where = f"GPU {pci}" if pci else "GPU"
        events.append(
            FaultEvent(
                kind="nvsmi",
                xid=None,
                pci=pci,
                pid=None,
                process=None,
                summary=f"nvidia-smi on {where}: {', '.join(flags)}",
                text="\n".join(glines).strip("\n"),
                details={**d, "flags": flags},
                level=True,
            )
        )
    return events
