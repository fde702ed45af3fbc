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


def test_every_description_is_a_full_sentence() -> None:
    """Section descriptions used to stop where the docstring's first line ended
    ("Where notifications go: repair lifecycle, breaker trips, failed validations,")."""
    import re

    text = render_reference()
    sections = re.findall(r"\n## `([^`]+)`\n\n(.*)\n", text)
    assert len(sections) > 30
    cut = [(name, d) for name, d in sections if not d.rstrip().endswith(".")]
    assert cut == [], cut
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    meanings = [r.rstrip().rstrip("|").rsplit("|", 1)[-1].strip() for r in rows]
    assert [m for m in meanings if not m.endswith((".", ")"))] == []


def test_the_example_is_the_demos_config() -> None:
    """The example was a hand-written config that was not the demo's."""
    import yaml

    from workers.configdoc import demo_example

    text = render_reference()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == demo_example()
    doc = yaml.safe_load(block)
    (cluster,) = doc["clusters"]
    assert cluster["name"] == "demo" and cluster["spares"] == ["spare-01"]
    assert [n["name"] for n in cluster["nodes"]] == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert cluster["validation"]["command"][-2:] == ["--backend", "simulated"]
    AutorepairConfig.model_validate(doc)  # a valid config as printed
