"""Kernel-log reads as the agent's follower makes them, for the reader's tests."""

from __future__ import annotations

from agent.readers import FaultEvent, KernelLogReader


def run_reads(parts: list[list[str]], step_s: float = 2.0) -> list[FaultEvent]:
    """Feed each part as one read of a followed log (``end_read`` after it), ``step_s``
    seconds of the reader's clock apart, then end the input; every event, in order."""
    now = [1000.0]
    r = KernelLogReader(clock=lambda: now[0])
    got: list[FaultEvent] = []
    for part in parts:
        for ln in part:
            got += r.feed(ln)
        got += r.end_read()
        now[0] += step_s
    return got + r.end_read() + r.flush()
