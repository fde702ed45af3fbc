"""docs/configuration.md is generated from the config models and must stay current."""

from __future__ import annotations

from pathlib import Path

from workers.configdoc import render_reference
from workflows.config import AutorepairConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render_reference(), (
        "docs/configuration.md is stale: run `python -m workers.configdoc > docs/configuration.md`"
    )


def test_every_key_is_documented_with_a_meaning() -> None:
    text = render_reference()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    undocumented = [r.split("|")[1].strip() for r in rows if r.rstrip().endswith("|  |")]
    assert undocumented == [], f"config keys without a #: comment: {undocumented}"
    for name in AutorepairConfig.model_fields:
        assert f"| `{name}` |" in text
