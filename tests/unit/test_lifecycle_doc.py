"""docs/lifecycle.md is generated from the lifecycle machines and must stay current."""

from __future__ import annotations

from pathlib import Path

from workflows.lifecycle.docgen import observed_edges, render
from workflows.lifecycle.machine_action import TERMINAL, Status

DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"


def test_lifecycle_doc_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/lifecycle.md is stale: python -m workflows.lifecycle.docgen > docs/lifecycle.md"
    )


def test_diagram_reaches_every_status() -> None:
    reached = {b for _, _, b in observed_edges()} | {Status.idle.value}
    assert reached == {s.value for s in Status}
    assert not any(a in {t.value for t in TERMINAL} for a, _, _ in observed_edges())
