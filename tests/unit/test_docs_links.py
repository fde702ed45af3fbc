"""Every relative link of the README and docs/ points at a file of the repository (the
README linked ../shared/DESIGN.md, which is not in it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_resolve_inside_the_repository() -> None:
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() or ROOT not in path.parents:
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_design_document_keeps_the_cited_section_numbers() -> None:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    for head in ("## 1. ", "## 2. ", "## 3. ", "## 4. ", "### 4.1 ", "### 4.2 ", "### 4.3 ",
                 "### 4.4 ", "### 4.5 ", "## 5. ", "## 6. "):
        assert f"\n{head}" in text, head
    assert "docs/design.md" in (ROOT / "README.md").read_text(encoding="utf-8")
