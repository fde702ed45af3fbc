"""OOM killer (Linux ``mm/oom_kill.c``).

- ``Out of memory: Killed process 1234 (mysqld) total-vm:…`` (and the cgroup form
  ``Memory cgroup out of memory: …``, the old ``Kill process N (x) score …``, and the bare
  ``Killed process N (x) total-vm:…``);
- the 5.x summary ``oom-kill:constraint=CONSTRAINT_NONE,…,task=postgres,pid=12345,uid=1000``.

The kernel prints the summary just before the ``Killed process`` line of the same kill;
the reader folds the two (same pid) into one ``oom_kill`` event
(:mod:`agent.readers.kernel.fold`). ``details``: ``cgroup`` (bool), and from the summary
``constraint``, ``uid``, ``task_memcg``, ``oom_memcg``, ``global_oom`` where printed.
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import single, to_int

_OOM = re.compile(
    r"(?P<head>(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: )?"
    r"Kill(?:ed)? process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)(?P<tail> total-vm:)?"
)
_SUMMARY = re.compile(r"oom-kill:(?P<fields>\S{1,2000})")


def match_killed(line: str) -> FaultEvent | None:
    """Needles ``Killed process`` / ``Kill process``."""
    om = _OOM.search(line)
    if not om or not (om.group("head") or om.group("tail")):
        return None
    name = om.group("name") or None
    pid = int(om.group("pid"))
    head = om.group("head") or ""
    details: dict[str, object] = {"cgroup": head.startswith("Memory cgroup")}
    return single("oom_kill", line, f"OOM killer killed {name or 'a process'}", pid=pid,
                  process=name, details=details)


def match_summary(line: str) -> FaultEvent | None:
    """Needle ``oom-kill:``: the one-line summary of a kill."""
    sm = _SUMMARY.search(line)
    if not sm:
        return None
    fields: dict[str, str] = {}
    flags: set[str] = set()
    for item in sm.group("fields").split(","):
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
        elif key:
            flags.add(key)
    pid = to_int(fields.get("pid"))
    if pid is None:
        return None
    name = fields.get("task") or None
    details: dict[str, object] = {}
    for key in ("constraint", "task_memcg", "oom_memcg"):
        if key in fields:
            details[key] = fields[key][:200]
    uid = to_int(fields.get("uid"))
    if uid is not None:
        details["uid"] = uid
    details["global_oom"] = "global_oom" in flags
    details["cgroup"] = "oom_memcg" in fields and "global_oom" not in flags
    return single("oom_kill", line, f"OOM killer killed {name or 'a process'}", pid=pid,
                  process=name, details=details)
