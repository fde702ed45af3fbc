"""The PCIe AER reader's "error received: <id>" detail must not take the agent's
``source`` key: ``Fault.from_reader`` sets ``details["source"]`` to where the agent read
the fault (``kernel_log``; exported as ``autorepair.fault.source``) and the reader's
details were merged over it, so a fatal AER record said its source was ``0000:41:00.0``.
The reader's detail is ``aer_source`` (the requester id the root port named)."""

from __future__ import annotations

from agent.readers import read_text
from agent.runner import Fault


def test_aer_source_id_does_not_overwrite_the_agent_source() -> None:
    (ev,) = read_text(
        "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: 0000:41:00.0")
    assert ev.kind == "pcie_aer_fatal" and ev.pci == "0000:41:00.0"
    f = Fault.from_reader(ev)
    assert f.details["source"] == "kernel_log"
    assert f.details["aer_source"] == "0000:41:00.0"
    attrs = f.attributes()
    assert attrs["autorepair.fault.source"] == "kernel_log"
    assert attrs["autorepair.fault.aer_source"] == "0000:41:00.0"
    (by_id,) = read_text(
        "[1.0] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010")
    assert by_id.pci == "0000:00:02.0" and by_id.details["aer_source"] == "id=0010"
    assert Fault.from_reader(by_id).details["source"] == "kernel_log"
