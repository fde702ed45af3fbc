"""The catalogue's answer for one fault: :class:`CatalogueEntry`."""

from __future__ import annotations

from dataclasses import dataclass

from workflows.config import DEFAULT_COUNT_WINDOW_S
from workflows.models import Action, Severity


@dataclass(frozen=True)
class CatalogueEntry:
    """What the catalogue says about one fault.

    - ``severity``: info | warning | critical.
    - ``mnemonic``: NVIDIA mnemonic for Xids (else a short upper-case name).
    - ``actionable``: True when the fault maps to a node action (``action != none``)
      once ``count`` occurrences fall inside ``window_s`` seconds on one node.
    - ``action``: lightest action of the docs/design.md §5 vocabulary that fixes the fault.
    - ``count`` / ``window_s``: count-in-window threshold (1 / 600 s by default).
    - ``app_level``: an application-caused Xid; repeats on one GPU/GPC escalate to a
      diagnostic run, never to a repair. False when an operator override maps an action.
    - ``description``: plain-language text for people (ledger, UI, notifications).
    - ``source``: where the mapping comes from (an NVIDIA document and row, a DESIGN
      section, or the written reason of a departure); never empty.
    - ``mapped``: False for a kind or code the catalogue does not know (counted in
      ``autorepair_unmapped_alerts_total``, recorded, never dropped): observed, not decided.
    - ``bucket``: NVIDIA immediate resolution bucket for Xids, "" otherwise.
    """

    severity: Severity
    mnemonic: str
    actionable: bool
    action: Action
    count: int
    window_s: float
    app_level: bool
    description: str
    source: str
    mapped: bool = True
    bucket: str = ""


def make_entry(
    severity: Severity,
    mnemonic: str,
    action: Action,
    description: str,
    source: str,
    *,
    app_level: bool = False,
    bucket: str = "",
    mapped: bool = True,
) -> CatalogueEntry:
    """A default entry (count 1 in :data:`~workflows.config.DEFAULT_COUNT_WINDOW_S`).

    An unmapped entry (``mapped=False``) is never actionable. Raises ``ValueError`` for an
    empty ``source``.
    """
    if not source:
        raise ValueError(f"source: every catalogue entry cites one ({mnemonic})")
    return CatalogueEntry(
        severity=severity,
        mnemonic=mnemonic,
        actionable=mapped and action is not Action.none,
        action=action if mapped else Action.none,
        count=1,
        window_s=DEFAULT_COUNT_WINDOW_S,
        app_level=app_level,
        description=description,
        source=source,
        mapped=mapped,
        bucket=bucket,
    )
