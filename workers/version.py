"""The package version: the Worker Versioning build id and the replay recordings' name.

The version is the one pyproject.toml declares (``[project] version``), read from the
installed distribution's metadata (``importlib.metadata``), so a worker built from a tag
reports that tag. ``make install`` re-reads it after a bump.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: The distribution name in pyproject.toml (``[project] name``).
DISTRIBUTION = "gpu-autorepair"


def package_version() -> str:
    """The installed ``gpu-autorepair`` version, e.g. ``"0.4.0"``.

    Raises ``RuntimeError`` naming the distribution when it is not installed (a source
    tree used without ``pip install -e .``): a build id must never be guessed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError as exc:
        raise RuntimeError(
            f"distribution {DISTRIBUTION!r} is not installed; run `make install` "
            "(the build id is its version)"
        ) from exc
