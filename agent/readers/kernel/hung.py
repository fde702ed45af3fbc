"""Hung tasks (Linux ``kernel/hung_task.c``): ``INFO: task <comm>:<pid> blocked for more
than <s> seconds.``, with or without the ``INFO:`` prefix (node-problem-detector's
kernel monitor repeats the message without it)."""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import single

_HUNG = re.compile(
    r"\btask (?P<name>\S.{0,63}?):(?P<pid>\d{1,10}) blocked for more than "
    r"(?P<s>\d{1,10}) seconds"
)


def match(line: str) -> FaultEvent | None:
    """Needle ``blocked for more than``."""
    hm = _HUNG.search(line)
    if not hm:
        return None
    name, pid = hm.group("name"), int(hm.group("pid"))
    return single(
        "hung_task",
        line,
        f"Task {name} blocked for more than {hm.group('s')} s",
        pid=pid,
        process=name,
        details={"blocked_s": int(hm.group("s"))},
    )
