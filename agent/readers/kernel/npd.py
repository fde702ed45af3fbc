"""node-problem-detector (kubernetes/node-problem-detector) reports.

- Its log line ``New status generated: &{Source:kernel-monitor Events:[{Severity:warn
  Timestamp:… Reason:TaskHung Message:task docker:7 blocked for more than 300 seconds.}]
  Conditions:[{Type:KernelDeadlock Status:True Transition:… Reason:DockerHung Message:…}
  …]}`` (``log_monitor.go``, ``custom_plugin_monitor.go``): one ``npd_condition`` per
  condition, and each event whose message is a kernel record comes out as that record's
  own kind (``hung_task``, ``oom_kill``, …) with ``details["reporter"] =
  "node-problem-detector"``.
- The same ``{Type:… Status:… Reason:… Message:…}`` condition text wherever it is quoted
  (NPD's ``Conditions:[…]`` in its own status logs or an operator's paste of one).

``npd_condition`` is a level kind: ``details`` has ``condition`` (``KernelDeadlock``,
``ReadonlyFilesystem``, ``XfsShutdown``, a custom plugin's type …), ``status``
(``True``/``False``/``Unknown`` as printed), ``reason``, ``message``; ``active`` is False
only for ``Status:False``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import single

REPORTER = "node-problem-detector"

_COND = re.compile(
    r"\{?Type:(?P<type>\w{1,64}) Status:(?P<status>\w{1,16})(?: Transition:[^{}]{0,120}?)?"
    r" Reason:(?P<reason>\S{0,128}) Message:(?P<msg>[^{}]{0,2000}?)\}(?=\s|\]|$)"
)
_EVENT = re.compile(
    r"\{Severity:(?P<sev>\w{1,16}) Timestamp:[^{}]{0,120}? Reason:(?P<reason>\S{0,128})"
    r" Message:(?P<msg>[^{}]{0,2000}?)\}(?=\s|\]|$)"
)
def _condition(line: str, ctype: str, status: str, reason: str, msg: str) -> FaultEvent:
    details: dict[str, object] = {
        "condition": ctype,
        "status": status,
        "reason": reason,
        "message": msg.strip()[:300],
        "reporter": REPORTER,
    }
    return single("npd_condition", line, f"node-problem-detector condition {ctype} {status}",
                  details=details, level=True, active=status != "False")


def make_matcher(
    inner: Callable[[str], FaultEvent | None],
) -> Callable[[str], list[FaultEvent] | None]:
    """The table matcher; ``inner`` reads an event message as a kernel line (one event or
    None) and is given by the reader to keep the dependency one-way."""

    def match(line: str) -> list[FaultEvent] | None:
        out: list[FaultEvent] = []
        if "Events:[" in line:
            for em in _EVENT.finditer(line):
                msg = em.group("msg")
                if msg.startswith("Node condition "):
                    continue  # the condition itself is reported below
                ev = inner(msg)
                if ev is not None:
                    ev.text = line
                    ev.details["reporter"] = REPORTER
                    ev.details["npd_reason"] = em.group("reason")
                    out.append(ev)
        for cm in _COND.finditer(line):
            out.append(_condition(line, cm.group("type"), cm.group("status"),
                                  cm.group("reason"), cm.group("msg")))
        return out or None

    return match
