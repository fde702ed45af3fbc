"""Issue 27 item 15: the tokens-file examples of ``docs/security.md`` load (trailing ``#``
comments made ingest refuse to start), and the parser keeps ``#`` inside a token."""

from __future__ import annotations

import re
from pathlib import Path

from ingest.auth import ROLE_COLLECTOR, ROLE_NODE, load_identities, read_token_lines
from workers.repairs.auth import ApiTokens

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _examples(header: str) -> list[str]:
    """Fenced blocks of docs/security.md whose first line is ``# TOKEN … {header}``."""
    out = []
    for block in FENCE.findall(DOC.read_text(encoding="utf-8")):
        first = block.lstrip().splitlines()[0] if block.strip() else ""
        if first.startswith("# TOKEN") and first.split()[-1] == header:
            out.append(block)
    return out


def test_every_receiver_tokens_example_loads(tmp_path: Path) -> None:
    blocks = _examples("SUBJECT")
    assert blocks, "docs/security.md shows no receiver tokens file"
    for i, block in enumerate(blocks):
        f = tmp_path / f"ingest-{i}.tokens"
        f.write_text(block)
        entries = load_identities(str(f))
        assert entries
    idents = [ident for _, _, ident in load_identities(str(tmp_path / "ingest-0.tokens"))]
    assert [(i.role, i.cluster, i.node) for i in idents[:2]] == [
        (ROLE_NODE, "prod", "gpu-017"), (ROLE_NODE, "prod", "gpu-018")]
    assert [i.role for i in idents[2:]] == [ROLE_COLLECTOR] * 3
    assert idents[2].clusters == frozenset({"prod", "staging"})
    assert idents[3].clusters is None and idents[4].label == "shared token"


def test_every_api_tokens_example_loads(tmp_path: Path) -> None:
    blocks = _examples("USER")
    assert blocks, "docs/security.md shows no repair API tokens file"
    for i, block in enumerate(blocks):
        f = tmp_path / f"api-{i}.tokens"
        f.write_text(block)
        tokens = ApiTokens.load(f)
        assert tokens.enabled
    p = ApiTokens.load(tmp_path / "api-0.tokens").authenticate("6a2b9c8d7e6f")
    assert p is not None and (p.user, p.role) == ("dcgm-scanner", "detector")


def test_trailing_comment_ends_the_fields_but_hash_inside_a_token_stays(
    tmp_path: Path
) -> None:
    f = tmp_path / "t"
    f.write_text("  # header\nab#cd node c/n   # who\n\ntok2 #\n")
    assert read_token_lines(f) == [(2, ["ab#cd", "node", "c/n"]), (4, ["tok2"])]
