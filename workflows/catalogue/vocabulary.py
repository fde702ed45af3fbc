"""One vocabulary for the control plane: fault kinds, application-level Xids, count windows
and the operator-override lookup.

Every other module (the catalogue, the ``NodeWorkflow``, ingest's metrics, the docs test)
takes these names from here; nothing else keeps its own copy.

- Kinds a node can report come from the agent: :data:`agent.readers.events.KINDS` is the
  agent-side list (the agent is deployed alone and imports nothing of the control plane,
  docs/design.md §2), re-exported here as :data:`SIGNAL_KINDS`. :data:`CONTROL_PLANE_KINDS` adds
  the kinds that control-plane components raise themselves.
- :data:`APP_LEVEL_XIDS` / :data:`DIAGNOSTIC_XIDS`: Xids that never drive a node repair by
  themselves, and those whose repeats on one GPU/GPC recommend a diagnostic run.
- :data:`DEFAULT_COUNT_WINDOW_S` and :func:`override_for` / :func:`count_window_s`: the
  operator's per-code overrides (``policy.catalogue``), looked up in one place.

Pure and sandbox-safe: no I/O.
"""

from __future__ import annotations

from agent.readers.events import CLEARS as AGENT_CLEARS
from agent.readers.events import KINDS as AGENT_KINDS
from agent.readers.events import LEVEL_KINDS as AGENT_LEVEL_KINDS
from workflows.catalogue.nvidia_xid_catalog import NVIDIA_XID_CATALOG
from workflows.config import DEFAULT_COUNT_WINDOW_S, CatalogueConfig, CatalogueOverride

__all__ = [
    "APP_LEVEL_XIDS",
    "CLEARS",
    "CONTROL_PLANE_KINDS",
    "DEFAULT_COUNT_WINDOW_S",
    "DIAGNOSTIC_XIDS",
    "KNOWN_KINDS",
    "LEVEL_KINDS",
    "SENDER_RESERVED_KINDS",
    "SIGNAL_KINDS",
    "count_window_s",
    "override_for",
]

SIGNAL_KINDS: frozenset[str] = AGENT_KINDS
"""Kinds the agent and the readers emit (``autorepair classify`` kinds, docs/design.md §4.1): the
agent's own list, :data:`agent.readers.events.KINDS`."""

LEVEL_KINDS: frozenset[str] = AGENT_LEVEL_KINDS
"""Kinds read as a state with raise/clear edges when a record does not say itself
(:data:`agent.readers.events.LEVEL_KINDS`); every other kind read from a log is an event."""

CLEARS: dict[str, str] = dict(AGENT_CLEARS)
"""``kind → level kind it clears`` (:data:`agent.readers.events.CLEARS`): ``ib_link_up``
ends ``ib_link_down`` on the same port."""

CONTROL_PLANE_KINDS: frozenset[str] = frozenset(
    {
        # ingest: health score below the cohort's straggler threshold, and panic mode
        # (docs/design.md §1 step 2, §5 "Panic mode").
        "straggler",
        "straggler_panic",
        # ingest: a node hosting a rank that persistently arrives last at its NCCL
        # communicator's collectives (docs/design.md §4.5 NCCL timings; ingest.nccl).
        "nccl_slow_rank",
        # workers.watchers.kube: NotReady (docs/design.md §1 rule zero: observed only, unless the
        # BMC confirms a dead host) and node-problem-detector restart conditions.
        "node_not_ready",
        # ingest: an agent that stopped pushing for ingest.unreachable_after_s (docs/design.md §1
        # rule zero: observed only, unless the BMC confirms a dead host).
        "node_unreachable",
        "k8s_frequent_kubelet_restart",
        "k8s_frequent_containerd_restart",
        # workflows.guard: the circuit breaker's cluster-level alert (docs/design.md §5 rails).
        "circuit_breaker",
        # workflows.guard: a failure-domain hold's cluster-level alert (issue 29 item 2).
        "failure_domain",
    }
)
"""Kinds raised by control-plane components rather than read from a node."""

SENDER_RESERVED_KINDS: frozenset[str] = (CONTROL_PLANE_KINDS - {"straggler"}) | {
    # workers.repairs.intake: the evidence record of an external repair request.
    "repair_request",
}
"""Kinds only the control plane raises, **refused from senders** (OTLP fault records;
docs/design.md §5: "Control-plane kinds … are never accepted from senders"): a node's own token
reporting ``circuit_breaker`` would otherwise open or hide its cluster's breaker, and a
``node_unreachable`` / ``nccl_slow_rank`` / ``repair_request`` would forge what ingest,
the guard or the intake decide. ``straggler`` stays a sender kind (the agent classifies
itself against the threshold it is sent back)."""

KNOWN_KINDS: frozenset[str] = SIGNAL_KINDS | CONTROL_PLANE_KINDS
"""Every kind the catalogue maps; an alert of any other kind is recorded as unmapped and
counted in ``autorepair_unmapped_alerts_total`` (docs/design.md §4.5)."""

APP_LEVEL_XIDS: frozenset[int] = frozenset(
    {row.code for row in NVIDIA_XID_CATALOG if row.immediate == "RESTART_APP"}
    # docs/design.md §5 names 43 (bucket IGNORE: the GPU stopped processing the application's
    # channel) and 45 (bucket WORKFLOW_XID_45: preemptive cleanup after another error).
    | {43, 45}
    # 109 (bucket RESET_GPU): the Kubernetes device plugin lists it among the application
    # errors that leave the GPU healthy (NVIDIA/k8s-device-plugin, ignoredXids
    # 13, 31, 43, 45, 68, 109), and the product follows it (see workflows.catalogue.xid).
    | {109}
)
"""Xids caused by what an application did: they never drive a node repair by themselves.
Every code whose NVIDIA immediate bucket is RESTART_APP, plus 43, 45 and 109."""

DIAGNOSTIC_XIDS: frozenset[int] = frozenset({13, 31, 43, 94})
"""Application-level Xids whose repeats on one GPU/GPC within
``policy.catalogue.app_xid_repeat_window_s`` recommend a diagnostic validation run
(docs/design.md §5: 13/31/43/45/94 "repeats on the same GPU/GPC within a window escalate to
diagnostics"). Xid 45 is left out: it is a secondary symptom that healthy nodes log many
times after one job crash, so its repetition alone says nothing about the GPU."""


def override_for(
    kind: str, code: int | None, config: CatalogueConfig
) -> tuple[str, CatalogueOverride] | None:
    """The operator override that applies to a fault, with the rule name it is known by.

    Precedence: ``config.xid[code]`` (kind ``xid``) or ``config.sxid[code]`` (kind
    ``sxid``), then ``config.kinds[kind]``. Returns ``(rule, override)`` with ``rule`` e.g.
    ``"xid:43:override"`` / ``"kind:ib_link_down:override"``, or None. Raises nothing.
    """
    if code is not None:
        if kind == "xid" and code in config.xid:
            return f"xid:{code}:override", config.xid[code]
        if kind == "sxid" and code in config.sxid:
            return f"sxid:{code}:override", config.sxid[code]
    if kind in config.kinds:
        return f"kind:{kind}:override", config.kinds[kind]
    return None


def count_window_s(kind: str, code: int | None, config: CatalogueConfig) -> float:
    """Count-in-window length (seconds) for a fault: its override's ``window_s``, else
    :data:`DEFAULT_COUNT_WINDOW_S`."""
    found = override_for(kind, code, config)
    return found[1].window_s if found is not None else DEFAULT_COUNT_WINDOW_S
