"""One vocabulary: every kind a reader or the agent emits is known to the catalogue,
ingest and the docs; every catalogue entry cites its source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ingest.pipeline
from agent.readers import KINDS as AGENT_KINDS
from agent.readers import read_text
from tests import corpus
from workflows.catalogue import default_entry
from workflows.catalogue.kinds import KIND_ENTRIES
from workflows.catalogue.vocabulary import CONTROL_PLANE_KINDS, KNOWN_KINDS, SIGNAL_KINDS

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = ROOT / "tests" / "data" / "signals"
_EXAMPLE = {
    "xid": (79, {}),
    "sxid": (24007, {}),
    "npd_condition": (None, {"condition": "KernelDeadlock"}),
    "dcgm_diag": (None, {"failed": ["Memory"]}),
    "nic_fatal": (None, {"nic_event": "health_compromised", "nic_severity": "fatal"}),
    "nvsmi": (None, {"flags": ["remap_pending"]}),
}


def test_control_plane_reexports_the_agent_list() -> None:
    assert SIGNAL_KINDS is AGENT_KINDS
    assert KNOWN_KINDS == AGENT_KINDS | CONTROL_PLANE_KINDS
    assert ingest.pipeline.KNOWN_KINDS is KNOWN_KINDS
    assert "thermal" not in KNOWN_KINDS


@pytest.mark.parametrize("kind", sorted(KNOWN_KINDS))
def test_every_known_kind_has_a_mapped_entry_with_a_source(kind: str) -> None:
    code, details = _EXAMPLE.get(kind, (None, {}))
    e = default_entry(kind, code, details)
    assert e.mapped, kind
    assert e.source and e.description, kind


def test_every_kind_entry_cites_its_source() -> None:
    assert set(KIND_ENTRIES) <= KNOWN_KINDS
    for kind, e in KIND_ENTRIES.items():
        assert len(e.source) > 10, kind


def _texts() -> list[str]:
    out = [json.loads(x)["text"] for x in corpus.CORPUS.read_text().splitlines() if x.strip()]
    for name in ("kernel_variants.jsonl", "peers.jsonl"):
        path = SIGNALS / name
        if path.exists():
            out += [json.loads(x)["text"] for x in path.read_text().splitlines() if x.strip()]
    out.append((SIGNALS / "multiline.log").read_text())
    out.append((SIGNALS / "round3.log").read_text())
    return out


def test_every_kind_the_readers_emit_is_known() -> None:
    seen = {ev.kind for text in _texts() for ev in read_text(text)}
    assert seen and seen <= SIGNAL_KINDS, seen - SIGNAL_KINDS
    assert {"nic_fatal", "dcgm_diag", "slurm_node", "pcie_aer_corrected"} <= seen


def test_every_round3_event_the_readers_emit_has_a_mapped_entry() -> None:
    # nic_fatal, dcgm_diag (DCGM failure codes) and sinfo's slurm_node decide through the
    # catalogue (xid/sxid rows have their own row-by-row tests, unreadable 154s included)
    seen = 0
    for text in _texts():
        for ev in read_text(text):
            if ev.kind in ("nic_fatal", "dcgm_diag", "slurm_node", "pcie_aer_corrected"):
                e = default_entry(ev.kind, ev.xid, ev.details)
                assert e.mapped and e.source, (ev.kind, ev.details)
                seen += 1
    assert seen >= 6


def test_every_dcgm_code_the_reader_names_is_in_the_catalogue() -> None:
    from agent.readers.dcgm_codes import _MESSAGES, CODES
    from workflows.catalogue.dcgm import DCGM_ERRORS

    assert set(CODES) == set(DCGM_ERRORS)
    assert {name for name, _ in _MESSAGES} <= set(CODES)
    dcgm = [ev for ev in read_text((SIGNALS / "round3.log").read_text())
            if ev.kind == "dcgm_diag"]
    (ev,) = dcgm
    e = default_entry(ev.kind, None, ev.details)
    assert e.mnemonic == "DCGM_FR_PENDING_ROW_REMAP" and e.action.value == "reset_gpu"


def test_nic_fatal_travels_agent_otlp_and_ingest() -> None:
    from datetime import UTC, datetime

    from agent.runner import Fault
    from workflows.alerts import alert_from_fault
    from workflows.config import CatalogueConfig

    (ev,) = [e for e in read_text((SIGNALS / "round3.log").read_text())
             if e.kind == "nic_fatal" and e.pci == "0000:3b:00.0"]
    attrs = Fault.from_reader(ev).attributes()
    assert attrs["autorepair.fault.kind"] == "nic_fatal"
    assert attrs["autorepair.gpu.pci"] == "0000:3b:00.0"
    assert attrs["autorepair.fault.nic_event"] == "health_compromised"
    assert "nic_fatal" in ingest.pipeline.KNOWN_KINDS
    evidence = {k.removeprefix("autorepair.fault."): v for k, v in attrs.items()
                if k.startswith("autorepair.fault.") and v is not None}
    alert = alert_from_fault(
        cluster="c", node="n", kind="nic_fatal", code=None, gpu=ev.pci,
        evidence_text=ev.text, evidence=evidence, observed_at=datetime(2026, 12, 1, tzinfo=UTC),
        catalogue=CatalogueConfig(),
    )
    assert alert.action.value == "reboot" and "unmapped" not in alert.evidence


def test_every_kind_literal_in_the_agent_is_known() -> None:
    # kind names written in the agent's code: kind="…", Fault("…", …), _single("…", …)
    pat = re.compile(r'(?:\bkind\s*=\s*|\bFault\(\s*|_single\(\s*)"([a-z][a-z0-9_]*)"')
    found = {
        m.group(1)
        for path in (ROOT / "agent").rglob("*.py")
        for m in pat.finditer(path.read_text())
    }
    assert found, "the pattern found no kind literal: the agent's code changed shape"
    assert found <= SIGNAL_KINDS, found - SIGNAL_KINDS


@pytest.mark.parametrize("doc", ["docs/wire-contract.md", "docs/runbook.md"])
def test_docs_list_every_kind(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = sorted(k for k in KNOWN_KINDS if f"`{k}`" not in text)
    assert not missing, f"{doc} does not list {missing}"
