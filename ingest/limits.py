"""Size limits on alerts at ingest: one oversized record never blocks the others.

An agent (or any OTLP client) may attach attributes of any size; ingest accepts request
bodies up to ``ingest.max_body_bytes``. Temporal refuses a payload over 2 MiB (server
``limit.blobSize.error``), and an update that large fails the node's workflow task on
every retry. So every alert is capped before it is handed off, by :func:`cap_alert`:

1. each evidence value longer than ``max_value_chars`` (a string's characters, or another
   value's JSON form) is cut to that length and marked;
2. while the alert's JSON form is over ``max_bytes``, the largest evidence value left is
   replaced by a note of its size; then the evidence text is cut;
3. the keys cut or dropped are listed in ``evidence["cut_by_ingest"]``.

The ``alert_id`` is unchanged (it was computed from the full observation), so a re-sent
record still de-duplicates.
"""

from __future__ import annotations

import json
from typing import Any

from workflows.models import Alert

CUT_KEY = "cut_by_ingest"
"""Evidence key listing what :func:`cap_alert` cut or dropped."""
_MARK = "…[cut by ingest]"


def alert_bytes(alert: Alert) -> int:
    """Size of the alert's JSON form, bytes (what the data converter sends)."""
    return len(alert.model_dump_json().encode())


def _json_len(v: Any) -> int:
    try:
        return len(json.dumps(v, default=str))
    except (TypeError, ValueError):
        return len(str(v))


def _cut_value(v: Any, limit: int) -> Any:
    if isinstance(v, str):
        return v if len(v) <= limit else v[:limit] + _MARK
    if isinstance(v, bool | int | float) or v is None:
        return v
    text = json.dumps(v, default=str)
    return v if len(text) <= limit else text[:limit] + _MARK


def cap_alert(alert: Alert, *, max_value_chars: int, max_bytes: int) -> tuple[Alert, list[str]]:
    """``(capped alert, names of what was cut)``; the alert itself when nothing was.

    ``max_value_chars``: per evidence value (config ``ingest.max_evidence_value_chars``);
    ``max_bytes``: the whole alert's JSON form (``ingest.max_alert_bytes``). Raises nothing.
    """
    evidence = dict(alert.evidence)
    cut: list[str] = []
    for k, v in list(evidence.items()):
        new = _cut_value(v, max_value_chars)
        if new is not v:
            evidence[k] = new
            cut.append(k)
    text = alert.evidence_text
    if len(text) > max_bytes:
        text = text[:max_bytes] + _MARK
        cut.append("evidence_text")
    if not cut and alert_bytes(alert) <= max_bytes:
        return alert, []
    out = alert.model_copy(update={"evidence": {**evidence, CUT_KEY: cut},
                                   "evidence_text": text})
    size = alert_bytes(out)
    while size > max_bytes:
        sizes = {k: _json_len(v) for k, v in evidence.items() if k != CUT_KEY}
        big = max(sizes, key=lambda k: sizes[k], default=None)
        if big is not None and sizes[big] > 64:
            evidence[big] = f"[dropped by ingest: {sizes[big]} bytes]"
            if big not in cut:
                cut.append(big)
        elif len(text) > len(_MARK):
            keep = max(0, len(text) - (size - max_bytes) - len(_MARK) - 64)
            text = text[:keep] + _MARK
            if "evidence_text" not in cut:
                cut.append("evidence_text")
        else:
            break  # nothing left to cut: the fixed fields alone are over the limit
        out = alert.model_copy(update={"evidence": {**evidence, CUT_KEY: cut},
                                       "evidence_text": text})
        size = alert_bytes(out)
    return out, cut
