"""The product's Xid catalogue against NVIDIA's Xid Catalog, row by row.

Every row NVIDIA lists either gets the action of its immediate resolution bucket or is a
written departure; codes NVIDIA does not list (or lists without a bucket the product
decides) are observed, unmapped — never a silent ``none``.
"""

from __future__ import annotations

import pytest

from workflows.catalogue import entry_for
from workflows.catalogue.nvidia_xid_catalog import BY_CODE, NVIDIA_XID_CATALOG, SOURCE
from workflows.catalogue.xid import BUCKET_ACTION, DEPARTURES, PEER_NOTES, product_action
from workflows.config import CatalogueConfig
from workflows.models import Action

DEFAULT = CatalogueConfig()
_PER_OCCURRENCE_DETAILS = {154: {"recovery_action_code": 1}}


def test_table_is_complete_and_ordered() -> None:
    codes = [row.code for row in NVIDIA_XID_CATALOG]
    assert codes == sorted(codes) and len(codes) == len(set(codes))
    assert codes == list(range(1, len(codes) + 1)), "NVIDIA numbers its Xids without gaps"
    assert SOURCE.startswith("https://docs.nvidia.com/deploy/xid-errors/")


def test_every_bucket_string_is_mapped() -> None:
    unknown = {row.immediate for row in NVIDIA_XID_CATALOG} - set(BUCKET_ACTION) - {""}
    assert not unknown, f"NVIDIA buckets without a product mapping: {sorted(unknown)}"


@pytest.mark.parametrize("row", NVIDIA_XID_CATALOG, ids=lambda r: f"xid{r.code}")
def test_row_follows_immediate_bucket_or_gives_its_reason(row: object) -> None:
    code = row.code  # type: ignore[attr-defined]
    immediate = row.immediate  # type: ignore[attr-defined]
    entry = entry_for("xid", code, _PER_OCCURRENCE_DETAILS.get(code, {}), DEFAULT)
    assert entry.source and SOURCE in entry.source, entry.source
    bucket_action = BUCKET_ACTION[immediate][0] if immediate in BUCKET_ACTION else None
    if code in DEPARTURES:
        action, reason = DEPARTURES[code]
        assert len(reason) > 40, f"Xid {code}: the departure needs a written reason"
        assert action != bucket_action, f"Xid {code}: a departure that does not depart"
        assert entry.mapped and entry.action is action
        return
    if immediate == "":
        assert not entry.mapped and entry.action is Action.none and not entry.actionable
        assert "no resolution bucket" in entry.description
        return
    assert entry.mapped
    if bucket_action is not None:  # otherwise decided per occurrence (144–150, 154)
        assert entry.action is bucket_action, (code, immediate, entry.action)


def test_departures_and_peer_notes_name_listed_codes() -> None:
    assert set(DEPARTURES) <= set(BY_CODE)
    assert {63, 109, 160} <= set(DEPARTURES)  # the codes peers disagree on
    assert {64, 94, 149} <= set(PEER_NOTES)


@pytest.mark.parametrize("code", [0, 173, 200, 9999])
def test_codes_newer_than_the_table_are_observed_unmapped(code: int) -> None:
    assert product_action(code) is None
    e = entry_for("xid", code, {}, DEFAULT)
    assert not e.mapped and not e.actionable and e.mnemonic == f"XID_{code}"
    assert "does not list" in e.source
