"""Who may call the repair API: bearer tokens, principals, roles and what each role may do.

Tokens come from ``api.tokens_file`` (falling back to ``secrets.api_tokens_file``): one
``TOKEN ROLE USER`` a line, in the token-file format of :func:`ingest.auth.read_token_lines`
(blank lines and ``#`` comments, whole-line or trailing, ignored). Lookup compares the
presented token against *every* configured token in constant time
(:func:`ingest.auth.find_token`). Tokens never reach logs or error messages.

Roles (docs/design.md §4.1, §5): ``viewer`` reads; ``detector`` reads and creates (never
``remove``: human-only); ``operator`` also decides (approve, reject, cancel), may
request ``remove`` and returns machines held for RMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ingest.auth import find_token, read_token_lines

ROLES: frozenset[str] = frozenset({"operator", "detector", "viewer"})
"""Token roles (``workflows.config.ApiConfig.tokens_file``)."""
PERMISSIONS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "detector": frozenset({"read", "create"}),
    "operator": frozenset({"read", "create", "remove", "decide", "return"}),
}
"""What each role may do: ``read``, ``create``, ``remove`` (request a remove), ``decide``,
``return`` (return a machine held for RMA to service)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: ``user`` and ``role`` (operator | detector | viewer)."""

    user: str
    role: str

    def may(self, permission: str) -> bool:
        """True when the role grants ``permission`` (see :data:`PERMISSIONS`)."""
        return permission in PERMISSIONS[self.role]


class ApiTokens:
    """Bearer tokens of the repair API (see module docstring)."""

    def __init__(self, entries: list[tuple[bytes, Principal]]) -> None:
        self._tokens = tuple(t for t, _ in entries)
        self._principals = tuple(p for _, p in entries)

    @property
    def enabled(self) -> bool:
        """True when at least one token is configured."""
        return bool(self._tokens)

    @classmethod
    def load(cls, path: str | Path | None) -> ApiTokens:
        """Read ``path`` (``None`` → no tokens: every request is refused with 401).

        Raises ``ValueError`` naming the file and line for an unreadable file, a line
        without three fields, or an unknown role.
        """
        if not path:
            return cls([])
        entries: list[tuple[bytes, Principal]] = []
        for n, parts in read_token_lines(path, "api.tokens_file"):
            if len(parts) != 3:
                raise ValueError(
                    f"api.tokens_file {str(path)!r} line {n}: expected 'TOKEN ROLE USER', "
                    f"got {len(parts)} fields"
                )
            token, role, user = parts
            if role not in ROLES:
                raise ValueError(
                    f"api.tokens_file {str(path)!r} line {n}: role {role!r} is not one of "
                    f"{sorted(ROLES)}"
                )
            entries.append((token.encode(), Principal(user=user, role=role)))
        return cls(entries)

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of ``token``, or ``None`` (constant time over all tokens)."""
        if not token:
            return None
        i = find_token(token.encode(), self._tokens)
        return None if i is None else self._principals[i]
