"""Fidelity of the shells (issue 26 item 5): what ``step`` commanded, checked against
what the workflow then did.

Each machine module maps its commands to the outbound Temporal calls they stand for
(``calls(cmd) -> tuple[Call, ...]``: an activity, a signal to another workflow, a child
start, a continue-as-new). A shell that interprets a machine keeps one :class:`Trace` as
its ``lifecycle_trace`` attribute and, after every ``step``, hands it the calls of the
commands ``step`` returned (:meth:`Trace.commanded`) before executing them. The test
harness's recording interceptor (``tests/workflows/fidelity.py``) sees every outbound call
the workflow makes and checks it against the head of :attr:`Trace.pending`
(:meth:`Trace.executed`): a call no command asked for, a call out of order, a different
argument, or a commanded call never made (:meth:`Trace.leftover` when the run ends) is a
violation, and the workflow fails in the test. So the model-checked machine is the code
that runs.

Pure: no Temporal imports (the interceptor is the only place that touches Temporal).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

#: The attribute of a batched call's argument that lists its elements, one per commanded
#: call (:meth:`Trace.executed`).
BATCH_FIELD = "commands"
#: Kinds of outbound call a command can stand for ("local_activity": run in the
#: workflow's own worker, ``workflows.local``, not the same call as through the server).
CallKind = Literal["activity", "local_activity", "signal", "child", "continue_as_new"]


class Call(NamedTuple):
    """One outbound call: ``kind``; ``name`` the activity type, signal name or child
    workflow type ("" for continue-as-new); ``fields``: ``(attribute, value)`` pairs the
    call's first argument must carry (an idempotency key, a resume phase, a reply)."""

    kind: CallKind
    name: str
    fields: tuple[tuple[str, Any], ...] = ()


class Trace:
    """Calls commanded and not yet made, for one workflow run.

    ``governed``: the ``(kind, name)`` pairs this shell makes only on a command (a shell
    that interprets only part of its workflow governs only that part's calls; ``None``:
    every call). Ungoverned calls pass unchecked."""

    def __init__(self, governed: Iterable[tuple[CallKind, str]] | None = None) -> None:
        self.governed: frozenset[tuple[CallKind, str]] | None = (
            None if governed is None else frozenset(governed)
        )
        self.pending: deque[Call] = deque()
        #: calls checked so far (the fidelity test asserts the check ran)
        self.checked = 0

    def commanded(self, calls: Iterable[Call]) -> None:
        """The calls of the commands ``step`` just returned, in order."""
        self.pending.extend(calls)

    def executed(self, kind: CallKind, name: str, arg: Any = None) -> str | None:
        """The workflow made a call; returns a violation (text) or None.

        A call whose argument has a list ``commands`` (:data:`BATCH_FIELD`) is a batch:
        it stands for one commanded call of its kind and name per element, in order,
        each element carrying that call's fields (the guard's ``guard_send_leases``
        carries the replies of its steps). An empty batch is a call no command asked
        for."""
        if self.governed is not None and (kind, name) not in self.governed:
            return None
        items = getattr(arg, BATCH_FIELD, None)
        if not isinstance(items, list):
            return self._one(kind, name, arg)
        if not items:
            self.checked += 1
            return f"{kind} {name!r} made with no {BATCH_FIELD}: no command asked for it"
        for i, item in enumerate(items):
            err = self._one(kind, name, item)
            if err is not None:
                return f"{err} ({BATCH_FIELD}[{i}] of {len(items)})"
        return None

    def _one(self, kind: CallKind, name: str, arg: Any) -> str | None:
        self.checked += 1
        if not self.pending:
            return f"{kind} {name!r} made but no command asked for it"
        want = self.pending[0]
        if (want.kind, want.name) != (kind, name):
            return f"{kind} {name!r} made where the machine commanded {want.kind} {want.name!r}"
        for attr, value in want.fields:
            got = getattr(arg, attr, None)
            if got != value:
                return (
                    f"{kind} {name!r}: {attr}={got!r} where the machine commanded {value!r}"
                )
        self.pending.popleft()
        return None

    def leftover(self) -> str | None:
        """At the end of a run: a commanded call that was never made, or None."""
        if not self.pending:
            return None
        want = self.pending[0]
        return f"{want.kind} {want.name!r} commanded but never made ({len(self.pending)} left)"
