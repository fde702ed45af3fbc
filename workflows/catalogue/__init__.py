"""The fault catalogue: severity, mnemonic, lightest action and source for every signal.

Pure and sandbox-safe (no I/O). :func:`entry_for` answers for one fault
``(kind, code, details)`` under the operator's :class:`~workflows.config.CatalogueConfig`;
:func:`default_entry` gives the built-in answer before overrides.

Where each part comes from:

- :mod:`~workflows.catalogue.nvidia_xid_catalog` — NVIDIA's Xid Catalog, vendored row by row;
- :mod:`~workflows.catalogue.xid` — what the product does with each Xid (NVIDIA's immediate
  bucket, or a written departure);
- :mod:`~workflows.catalogue.sxid` — NVSwitch SXids per NVIDIA's Fabric Manager guide;
- :mod:`~workflows.catalogue.kinds` — kernel, tool and control-plane kinds;
- :mod:`~workflows.catalogue.vocabulary` — the kinds, app-level and diagnostic Xids, count
  windows and override lookup, once for the whole control plane.

Ingest calls :func:`entry_for` only to annotate an alert (severity, mnemonic, description);
the ``NodeWorkflow`` decides with it under the worker's policy
(:func:`workflows.policy.decide_node_action`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workflows.catalogue.entry import CatalogueEntry, make_entry
from workflows.catalogue.kinds import (
    KIND_ENTRIES,
    dcgm_entry,
    nic_entry,
    node_not_ready_entry,
    node_unreachable_entry,
    npd_entry,
    nvsmi_entry,
    slurm_node_entry,
)
from workflows.catalogue.sxid import sxid_entry
from workflows.catalogue.vocabulary import (
    APP_LEVEL_XIDS,
    DIAGNOSTIC_XIDS,
    KNOWN_KINDS,
    override_for,
)
from workflows.catalogue.xid import xid_entry
from workflows.config import CatalogueConfig
from workflows.models import Action, Severity

__all__ = [
    "APP_LEVEL_XIDS",
    "DIAGNOSTIC_XIDS",
    "KNOWN_KINDS",
    "CatalogueEntry",
    "default_entry",
    "entry_for",
]

_PER_OCCURRENCE = {
    "nvsmi": nvsmi_entry,
    "npd_condition": npd_entry,
    "dcgm_diag": dcgm_entry,
    "nic_fatal": nic_entry,
    "node_not_ready": node_not_ready_entry,
    "node_unreachable": node_unreachable_entry,
    "slurm_node": slurm_node_entry,
}


def default_entry(kind: str, code: int | None, details: dict[str, Any]) -> CatalogueEntry:
    """The built-in entry, before operator overrides (see :func:`entry_for`).

    An ``xid``/``sxid`` without a code, and a kind outside
    :data:`~workflows.catalogue.vocabulary.KNOWN_KINDS`, get an observed, unmapped entry.
    """
    if kind == "xid" and code is not None:
        return xid_entry(code, details)
    if kind == "sxid" and code is not None:
        return sxid_entry(code, details)
    per = _PER_OCCURRENCE.get(kind)
    if per is not None:
        return per(details)
    entry = KIND_ENTRIES.get(kind)
    if entry is not None:
        return entry
    why = (
        f"a {kind} event without its code"
        if kind in ("xid", "sxid")
        else f"fault kind '{kind}' has no catalogue mapping"
    )
    return make_entry(
        Severity.warning,
        kind.upper()[:64] or "UNKNOWN",
        Action.none,
        f"The catalogue cannot decide {why}; recorded for an operator to review.",
        f"{why}: observed, unmapped",
        mapped=False,
    )


def entry_for(
    kind: str, code: int | None, details: dict[str, Any], config: CatalogueConfig
) -> CatalogueEntry:
    """What the catalogue says about one fault, operator overrides applied.

    ``kind``: a classify kind or a control-plane kind (any other kind gets an entry with
    ``mapped=False``); ``code``: the Xid/SXid code or None; ``details``: the reader's
    kind-specific evidence (NVLink/SXid ``severity``, Xid 154 ``recovery_action_code``,
    nvidia-smi flags, ``condition``, ``failed``); ``config``: ``policy.catalogue``.
    Override precedence: ``config.xid[code]`` / ``config.sxid[code]``, then
    ``config.kinds[kind]`` (:func:`~workflows.catalogue.vocabulary.override_for`). An
    override's ``action``, ``severity``, ``actionable``, ``count`` and ``window_s`` replace
    the defaults; an override that maps an action also clears ``app_level`` (the operator
    decided) and makes the entry ``mapped``.

    Raises ``ValueError`` naming the field when ``kind`` is empty or ``code`` negative.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind: must be a non-empty string, got {kind!r}")
    if code is not None and (not isinstance(code, int) or code < 0):
        raise ValueError(f"code: must be a non-negative integer or None, got {code!r}")
    entry = default_entry(kind, code, details if isinstance(details, dict) else {})
    found = override_for(kind, code, config)
    if found is None:
        return entry
    rule, ov = found
    action = ov.action if ov.action is not None else entry.action
    actionable = ov.actionable if ov.actionable is not None else action is not Action.none
    return replace(
        entry,
        action=action,
        severity=ov.severity if ov.severity is not None else entry.severity,
        actionable=actionable,
        count=ov.count,
        window_s=ov.window_s,
        app_level=entry.app_level and ov.action is None,
        mapped=entry.mapped or ov.action is not None,
        source=f"{entry.source}; operator override {rule} (policy.catalogue)",
    )
