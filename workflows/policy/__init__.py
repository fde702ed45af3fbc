"""Pure repair policy: node-action decision, consent, reset preconditions, ladder,
migrate gate, rails.

Every function here is deterministic and free of I/O, so the workflows call them
directly and unit tests exercise them without Temporal. Numbers come from
:class:`workflows.config.PolicyConfig` (docs/design.md §5 defaults), read by the workflows
through the ``load_policy`` activity.
"""

from workflows.policy.consent import ConsentDecision, consent_decision
from workflows.policy.ladder import (
    GateDecision,
    LadderDecision,
    RepeatOffender,
    choose_action,
    ladder_decision,
    migrate_gate,
    next_rung,
    node_actions_in_window,
    repeat_offender,
)
from workflows.policy.node_action import (
    NodeActionDecision,
    count_in_window,
    decide_node_action,
    repeat_key,
)
from workflows.policy.rails import (
    breaker_threshold,
    breaker_trips,
    concurrency_budget,
    cooldown_until,
    evidence_current,
    in_cooldown,
    persistence_for,
    received_time,
    recent_events,
)
from workflows.policy.reset import (
    ResetDecision,
    gpu_pci,
    platform_blocker,
    reset_decision,
    reset_targets,
)
from workflows.policy.shadow import SHADOWED, is_shadow, rail_attempts, would_do

__all__ = [
    "SHADOWED",
    "ConsentDecision",
    "GateDecision",
    "LadderDecision",
    "NodeActionDecision",
    "RepeatOffender",
    "ResetDecision",
    "breaker_threshold",
    "breaker_trips",
    "choose_action",
    "concurrency_budget",
    "consent_decision",
    "cooldown_until",
    "count_in_window",
    "decide_node_action",
    "evidence_current",
    "gpu_pci",
    "in_cooldown",
    "is_shadow",
    "ladder_decision",
    "migrate_gate",
    "next_rung",
    "node_actions_in_window",
    "persistence_for",
    "platform_blocker",
    "rail_attempts",
    "received_time",
    "recent_events",
    "repeat_key",
    "repeat_offender",
    "reset_decision",
    "reset_targets",
    "would_do",
]
