"""Consent: who decides *whether* a repair runs (docs/design.md §5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workflows.config import ConsentConfig
from workflows.models import Action, Alert, Requester, RequesterKind


@dataclass(frozen=True)
class ConsentDecision:
    """``automatic``: run without an ``approve`` signal; ``rule``: which rule decided."""

    automatic: bool
    rule: str


def consent_decision(
    action: Action,
    alerts: Sequence[Alert],
    requester: Requester,
    consent: ConsentConfig,
    requested: Action | None = None,
) -> ConsentDecision:
    """Whether ``action`` may run without a human approval.

    Rules, first match wins: ``remove`` always needs a human (``remove_is_human``);
    a repair a person created (requester kind ``user``) is approved by its creator
    for the action they asked for (``requested``; None: any; ``Action.none``: nothing,
    e.g. a later rung) — an approval covers one action at one rung, so another action
    the ladder or the gate moved it to, or another attempt after one ran, goes through
    the rules below (``requested_by_user``); ``consent.mode == "automatic"`` (``mode_automatic``);
    the action is in ``automatic_actions`` (``automatic_action:<action>``); every Xid
    alert behind it has a code in ``automatic_xids`` and there is at least one
    (``automatic_xid:<codes>``); otherwise ``approve_before_repair``.
    """
    if action == Action.remove:
        return ConsentDecision(False, "remove_is_human")
    if requester.kind == RequesterKind.user and requested in (None, action):
        return ConsentDecision(True, "requested_by_user")
    if consent.mode == "automatic":
        return ConsentDecision(True, "mode_automatic")
    if action in consent.automatic_actions:
        return ConsentDecision(True, f"automatic_action:{action.value}")
    xids = [a.code for a in alerts if a.kind == "xid" and a.code is not None]
    if xids and len(xids) == len(alerts) and all(c in consent.automatic_xids for c in xids):
        codes = ",".join(str(c) for c in sorted(set(xids)))
        return ConsentDecision(True, f"automatic_xid:{codes}")
    return ConsentDecision(False, "approve_before_repair")
