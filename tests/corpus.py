"""Where the corpus of real inputs is.

The source of truth is ``shared/corpus/real-inputs.jsonl`` beside the checkout (DESIGN's
``../shared``; CI lays it there). A copy taken from it lives in
``tests/data/signals/real-inputs.jsonl`` so a clone without ``../shared`` still tests
its readers on the same real lines.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_CORPUS = ROOT.parent / "shared" / "corpus" / "real-inputs.jsonl"
VENDORED_CORPUS = ROOT / "tests" / "data" / "signals" / "real-inputs.jsonl"
CORPUS = SHARED_CORPUS if SHARED_CORPUS.exists() else VENDORED_CORPUS
