"""The one rule for node and cluster names, wherever a name enters (OTLP decode, the
repair API, configuration checks).

A node or cluster name becomes a Temporal workflow id (``node/{cluster}/{node}``), a
ledger key, a Prometheus label, a per-node token's subject (``CLUSTER/NODE``) and a log
field, so a sender-chosen name must not be able to contain an id separator, a wildcard,
whitespace or a control character (a forged ``key=value`` or a second log line), and is
bounded in length. :data:`NAME_PATTERN` is the repair API's node-name rule without ``/``
(the separator of workflow ids and of ``CLUSTER/NODE``): Kubernetes node names (RFC 1123
subdomains), Slurm host names and cloud instance names all fit it. Reserved names
(:data:`RESERVED_NAMES`) are refused even where a future pattern would let them through:
``*`` is the node of cluster-level alerts (the guard's breaker, ingest's panic mode).
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
"""Node and cluster names: an ASCII letter or digit, then letters, digits and ``._:@-``."""
MAX_NAME_LEN = 253
"""Longest name: a DNS name / Kubernetes node name (RFC 1123: 253 characters)."""
RESERVED_NAMES: frozenset[str] = frozenset({"*"})
"""Names no sender may use: ``*`` names the cluster itself in cluster-level alerts."""

_NAME = re.compile(NAME_PATTERN)


def name_problem(value: object, field: str) -> str | None:
    """Why ``value`` is not a valid node/cluster name for ``field`` (a message naming the
    field and the value, truncated to 64 characters), or ``None`` when it is valid."""
    if not isinstance(value, str):
        return f"{field}: must be a string, got {type(value).__name__}"
    shown = repr(value[:64]) + ("…" if len(value) > 64 else "")
    if value in RESERVED_NAMES:
        return f"{field}: {shown} is a reserved name"
    if not value:
        return f"{field}: must not be empty"
    if len(value) > MAX_NAME_LEN:
        return f"{field}: {shown} is longer than {MAX_NAME_LEN} characters"
    if not _NAME.fullmatch(value):
        return (f"{field}: {shown} is not a valid name (letters, digits and ._:@- only, "
                "starting with a letter or digit)")
    return None


def check_name(value: str, field: str) -> str:
    """``value`` when it is a valid name; raises ``ValueError`` with
    :func:`name_problem`'s message otherwise (pydantic ``AfterValidator``)."""
    why = name_problem(value, field)
    if why is not None:
        raise ValueError(why)
    return value
