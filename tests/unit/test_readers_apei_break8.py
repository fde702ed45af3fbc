"""A firmware-first (APEI GHES) fatal PCIe error is a PCIe fault of its device, not an
uncorrectable memory / CPU error.

The kernel prints a GHES record as several ``[Hardware Error]:`` lines (drivers/acpi/apei/
ghes.c, drivers/firmware/efi/cper.c ``cper_print_pcie``); ``section_type`` says what
failed and a PCIe section names the device. The reader took the ``event severity: fatal``
line alone as ``mce_ue`` (action ``migrate``: rebuild on other hardware) for any section,
so a GPU's fatal PCIe error (the OS-native AER form is ``pcie_aer_fatal``, ``reboot``) sent
the machine to re-validation and named no device.
"""

from __future__ import annotations

from workers.classify import classify_text

GHES_PCIE = """\
[ 102.000000] {1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0
[ 102.000001] {1}[Hardware Error]: event severity: fatal
[ 102.000002] {1}[Hardware Error]:  Error 0, type: fatal
[ 102.000003] {1}[Hardware Error]:   section_type: PCIe error
[ 102.000004] {1}[Hardware Error]:   port_type: 0, PCIe end point
[ 102.000005] {1}[Hardware Error]:   version: 3.0
[ 102.000006] {1}[Hardware Error]:   command: 0x0547, status: 0x4010
[ 102.000007] {1}[Hardware Error]:   device_id: 0000:41:00.0
[ 102.000008] {1}[Hardware Error]:   slot: 0
[ 102.000009] {1}[Hardware Error]:   secondary_bus: 0x00
[ 102.000010] {1}[Hardware Error]:   vendor_id: 0x10de, device_id: 0x2330
[ 102.000011] {1}[Hardware Error]:   class_code: 030200
"""

GHES_MEMORY = """\
[ 202.000000] {2}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1
[ 202.000001] {2}[Hardware Error]: event severity: fatal
[ 202.000002] {2}[Hardware Error]:  Error 0, type: fatal
[ 202.000003] {2}[Hardware Error]:   section_type: memory error
[ 202.000004] {2}[Hardware Error]:   physical_address: 0x0000003f5a1c2000
[ 202.000005] {2}[Hardware Error]:   node: 1 card: 3 module: 0 rank: 1
"""


def test_a_fatal_ghes_pcie_error_is_a_pcie_fault_of_its_device() -> None:
    out = classify_text(GHES_PCIE)
    assert [(o["kind"], o["pci"], o["action"]) for o in out] == [
        ("pcie_aer_fatal", "0000:41:00.0", "reboot")], out
    assert out[0]["firmware_first"] is True


def test_a_fatal_ghes_memory_error_stays_mce_ue_once() -> None:
    out = classify_text(GHES_MEMORY)
    assert [(o["kind"], o["action"]) for o in out] == [("mce_ue", "migrate")], out


def test_two_records_back_to_back_are_two_events() -> None:
    out = classify_text(GHES_PCIE + GHES_MEMORY)
    assert [o["kind"] for o in out] == ["pcie_aer_fatal", "mce_ue"], out
