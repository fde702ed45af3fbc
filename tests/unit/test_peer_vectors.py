"""Peer projects' own parser test vectors, read by our readers.

``tests/data/signals/peers.jsonl`` holds the inputs and expected codes (facts) of the Xid/
SXid parser tests of NVIDIA/NVSentinel (syslog-health-monitor) and leptonai/gpud
(nvidia xid/sxid components): ``text``, ``expected_code`` (null: the peer finds no Xid/SXid
in it; absent: the peer asserts only the device), ``expected_pci`` when the peer asserts
one, ``equivalent_kind`` where the peer reports as a code what the product reports as a
kind (gpud: a "fallen off the bus" line is Xid 79, ours is ``gpu_lost``), ``peer`` and
``source`` (repository:path). ``needs`` names a format the readers do not read yet; only
those records are expected to fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.readers import read_text

PEERS = Path(__file__).resolve().parents[1] / "data" / "signals" / "peers.jsonl"
RECORDS = [json.loads(x) for x in PEERS.read_text().splitlines() if x.strip()]


def _pci_key(pci: str | None) -> str | None:
    """Bus address without ``PCI:``, function or case; a missing domain reads as 0000."""
    if not pci:
        return None
    p = pci.strip().lower().removeprefix("pci:")
    p = re.sub(r"\.[0-7]$", "", p)
    return p if p.count(":") >= 2 else "0000:" + p


def _check(rec: dict[str, Any]) -> None:
    events = read_text(rec["text"])
    coded = [e for e in events if e.kind in ("xid", "sxid")]
    want_kind = rec.get("equivalent_kind")
    if "expected_code" in rec and rec["expected_code"] is None:
        assert not coded, f"{rec['peer']} finds no Xid/SXid, we read {coded}"
        return
    if want_kind is not None:
        hits = [e for e in events if e.kind == want_kind]
    elif "expected_code" in rec:
        hits = [e for e in coded if e.xid == rec["expected_code"]]
    else:
        hits = coded
    assert hits, f"{rec['peer']} expects {rec.get('expected_code')}, we read {events}"
    if "expected_pci" in rec:
        want = _pci_key(rec["expected_pci"])
        assert want in {_pci_key(e.pci) for e in hits}, (want, [e.pci for e in hits])


def _param(rec: dict[str, Any]) -> Any:
    marks = []
    if "needs" in rec:
        marks.append(pytest.mark.xfail(reason=f"needs {rec['needs']}", strict=True))
    return pytest.param(rec, marks=marks, id=f"{rec['peer']}:{rec['text'][:50]}")


def test_vectors_are_facts_with_sources() -> None:
    assert len(RECORDS) >= 50
    assert {r["peer"] for r in RECORDS} == {"NVSentinel", "gpud"}
    for r in RECORDS:
        assert r["source"].split(":")[0] in ("NVIDIA/NVSentinel", "leptonai/gpud")
        assert "expected_code" in r or "expected_pci" in r


@pytest.mark.parametrize("rec", [_param(r) for r in RECORDS])
def test_peer_vector(rec: dict[str, Any]) -> None:
    _check(rec)


def test_code_and_pci_agreement_figure() -> None:
    """Agreement over every vector without a ``needs`` mark is total."""
    ready = [r for r in RECORDS if "needs" not in r]
    failed = []
    for r in ready:
        try:
            _check(r)
        except AssertionError as e:
            failed.append((r["text"], str(e)))
    assert not failed, failed
