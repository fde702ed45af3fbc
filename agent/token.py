"""The agent's bearer token, read from a file and re-read when the file changes.

On Kubernetes the token is a projected ServiceAccount token (audience
``autorepair-ingest``) that the kubelet rotates well before it expires (at 80 % of its
lifetime, by swapping the volume's ``..data`` symlink). :class:`TokenFile` stats the file
on every use and reads it again when its inode, size or modification time changed, so
the next push carries the new token without a restart. The token is never logged.
"""

from __future__ import annotations

import os
from pathlib import Path


class TokenFileError(RuntimeError):
    """The token file cannot be read (the message names it, never its content)."""


class TokenFile:
    """``TokenFile(path)()`` → the file's token (whitespace stripped; ``None`` if empty).

    Raises :class:`TokenFileError` naming ``field`` and the path when the file cannot be
    read the first time; later, a failed re-read keeps the last token (a rotation in
    progress) and the next call tries again."""

    def __init__(self, path: str | Path, field: str = "push.token_file") -> None:
        self.path = Path(path)
        self.field = field
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None
        self.reads = 0
        self()

    def __call__(self) -> str | None:
        try:
            st = os.stat(self.path)  # follows the projected volume's symlinks
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp != self._stamp:
                self._token = self.path.read_text().strip() or None
                self._stamp = stamp
                self.reads += 1
        except OSError as exc:
            if self._stamp is None:
                raise TokenFileError(
                    f"{self.field}: cannot read {str(self.path)!r}: {exc.strerror}") from None
        return self._token
