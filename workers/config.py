"""Loading ``autorepair.yaml`` with environment overrides.

Order of precedence (highest first):

1. environment variables ``AUTOREPAIR__SECTION__KEY=value`` (double underscore between
   path parts, case-insensitive), values parsed as YAML scalars/flow collections, e.g.
   ``AUTOREPAIR__THRESHOLD__K=2.5`` or ``AUTOREPAIR__POLICY__CONSENT__AUTOMATIC_XIDS=[79]``;
2. the YAML file (``--config FILE`` or ``AUTOREPAIR_CONFIG``);
3. the defaults of :class:`workflows.config.AutorepairConfig` (docs/design.md §5).

Errors: :class:`ConfigError` whose message names every bad field by its dotted path
and shows the bad value, e.g. ``threshold.k: Input should be greater than 0 (got -1)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workflows.config import AutorepairConfig

ENV_PREFIX = "AUTOREPAIR__"
ENV_CONFIG_FILE = "AUTOREPAIR_CONFIG"


class ConfigError(ValueError):
    """Invalid configuration; the message names the field path and the bad value."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(root)"
        value = e.get("input")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"  {path}: {e['msg']} (got {shown})")
    return "\n".join(lines)


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Nested dict of the ``AUTOREPAIR__A__B=value`` overrides in ``environ``.

    Raises :class:`ConfigError` naming the variable when its value is not valid YAML.
    """
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.upper().startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: not a valid value ({raw!r}): {exc}") from exc
        _set_path(out, path, value)
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> AutorepairConfig:
    """Load and validate the configuration.

    ``path`` None → ``$AUTOREPAIR_CONFIG`` if set, else defaults only.
    Raises :class:`ConfigError` (missing file, bad YAML, or validation failure with the
    field path and value).
    """
    env = os.environ if environ is None else environ
    source = "defaults"
    data: dict[str, Any] = {}
    if path is None and env.get(ENV_CONFIG_FILE):
        path = env[ENV_CONFIG_FILE]
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {p}") from exc
        except OSError as exc:
            raise ConfigError(f"config file {p}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                              f"at offset {exc.start})") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {p}: top level must be a mapping, got {type(loaded).__name__}"
            )
        data = loaded
    overrides = env_overrides(env)
    if overrides:
        data = _merge(data, overrides)
        source += " + environment"
    try:
        return AutorepairConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None
