"""BMC credentials from a secret file or the environment — never from workflow inputs.

Credentials are read in the worker when an activity runs, held as ``pydantic.SecretStr``
(``repr``/``str`` print ``**********``) and never returned, logged or put into error text
(docs/design.md §4.4: workflow histories never contain credentials).

Secret file (``secrets.bmc_credentials_file``), YAML or JSON, mode 0600 recommended::

    default: {username: admin, password: s3cret}
    bmcs:
      "https://10.0.0.11": {username: root, password: other}

A BMC address found under ``bmcs`` uses its own pair, any other uses ``default``. Without
a file (or without a ``default`` there) the env vars ``secrets.bmc_username_env`` /
``secrets.bmc_password_env`` (``AUTOREPAIR_BMC_USERNAME`` / ``AUTOREPAIR_BMC_PASSWORD``)
are used.

Errors: ``CredentialsError`` (a ``ValueError``) naming the file/field or env var, never
the secret value.

Webhook URLs are secrets too (their path or query is the credential): they may be given
inline or, like the other secrets, by environment variable or file (:func:`secret_url`:
``clusters[].provision_webhook_env`` / ``_file``, ``clusters[].validation.
ticket_webhook_env`` / ``_file``); :func:`redact_url` gives what may be shown of one,
:func:`scrub_url` cleans quoted text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from workflows.config import SecretsConfig


class CredentialsError(ValueError):
    """BMC credentials missing or malformed (names where, never the value)."""


class BmcCredentials(BaseModel):
    """A BMC username and password (the password never prints)."""

    username: str
    password: SecretStr


def _from_mapping(d: Any, where: str) -> BmcCredentials:
    try:
        return BmcCredentials.model_validate(d)
    except ValidationError as e:
        fields = ", ".join(".".join(str(p) for p in err["loc"]) for err in e.errors())
        raise CredentialsError(f"{where}: missing or invalid field(s) {fields}") from None


def load_bmc_credentials(secrets: SecretsConfig, bmc_address: str) -> BmcCredentials:
    """The credentials for the BMC at ``bmc_address`` (file first, then env).

    Raises ``CredentialsError`` when neither source has them.
    """
    if secrets.bmc_credentials_file:
        path = Path(secrets.bmc_credentials_file)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise CredentialsError(
                f"secrets.bmc_credentials_file: cannot read {str(path)!r} ({e.strerror})"
            ) from None
        except yaml.YAMLError:
            raise CredentialsError(
                f"secrets.bmc_credentials_file: {str(path)!r} is not valid YAML/JSON"
            ) from None
        if not isinstance(doc, dict):
            raise CredentialsError(
                f"secrets.bmc_credentials_file: {str(path)!r} must hold a mapping"
            )
        per_bmc = doc.get("bmcs") or {}
        if bmc_address in per_bmc:
            return _from_mapping(per_bmc[bmc_address], f"{path}: bmcs[{bmc_address!r}]")
        if "default" in doc:
            return _from_mapping(doc["default"], f"{path}: default")
    user = os.environ.get(secrets.bmc_username_env)
    password = os.environ.get(secrets.bmc_password_env)
    if not user or password is None:
        raise CredentialsError(
            f"no BMC credentials for {bmc_address}: set secrets.bmc_credentials_file or the env "
            f"vars {secrets.bmc_username_env}/{secrets.bmc_password_env}"
        )
    return BmcCredentials(username=user, password=SecretStr(password))


def redact_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what errors, logs and workflow histories may
    show of a webhook URL. Chat and paging webhooks carry their credential in the path or
    query (Slack ``/services/T…/B…/<secret>``, ``?token=…``) or the userinfo, so all three
    are dropped. Never raises: text that does not parse as a URL gives ``<url>``."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "<url>"
    if not parts.scheme or not host:
        return "<url>"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}"


def scrub_url(text: str, url: str) -> str:
    """``text`` with ``url`` and its path/query/userinfo parts replaced by
    :func:`redact_url` / ``…``: for messages that quote what a webhook answered, which
    may echo the request URL back."""
    shown = redact_url(url)
    text = text.replace(url, shown)
    try:
        parts = urlsplit(url)
    except ValueError:
        return text
    for secret in (parts.path, parts.query, parts.username or "", parts.password or ""):
        if len(secret) > 1:
            text = text.replace(secret, "…")
    return text


def secret_url(value: str | None, env: str | None, file: str | None, field: str,
               environ: Mapping[str, str] | None = None) -> str | None:
    """A webhook URL given inline (``value``), by environment variable (``env``) or by
    file (``file``, first line), read now in the worker; ``None`` when none is given.

    ``field``: the configuration key, for messages (``clusters[c].provision_webhook``).
    Raises :class:`CredentialsError` naming ``{field}_env`` / ``{field}_file`` and the
    variable or path (never the URL) when it is unset, empty or unreadable, or the value
    is not an http(s) URL."""
    environ = os.environ if environ is None else environ
    url = value
    if not url and env:
        url = environ.get(env, "").strip()
        if not url:
            raise CredentialsError(f"{field}_env: environment variable {env} is empty or unset")
    elif not url and file:
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CredentialsError(f"{field}_file: cannot read {file}: "
                                   f"{getattr(e, 'strerror', None) or type(e).__name__}"
                                   ) from None
        url = lines[0].strip() if lines else ""
        if not url:
            raise CredentialsError(f"{field}_file: {file} is empty")
    if url and not url.startswith(("http://", "https://")):
        raise CredentialsError(f"{field}: not an http(s) URL ({redact_url(url)})")
    return url or None
