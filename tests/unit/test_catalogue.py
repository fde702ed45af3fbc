"""Default catalogue buckets and operator overrides (scenario 9)."""

from __future__ import annotations

import pytest

from workflows.catalogue import APP_LEVEL_XIDS, lookup
from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Severity

DEFAULT = CatalogueConfig()


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (79, Action.power_cycle),  # RESTART_BM
        (48, Action.reset_gpu),
        (62, Action.reset_gpu),
        (119, Action.reset_gpu),
        (120, Action.reset_gpu),
        (140, Action.reset_gpu),
        (64, Action.remove),  # CONTACT_SUPPORT
        (13, Action.none),
        (31, Action.none),
        (43, Action.none),
        (45, Action.none),
        (94, Action.none),
        (109, Action.none),
    ],
)
def test_xid_buckets(code: int, action: Action) -> None:
    e = lookup("xid", code, {}, DEFAULT)
    assert e.action is action
    assert e.actionable is (action is not Action.none)
    assert e.mapped and e.mnemonic


@pytest.mark.parametrize("code", [13, 31, 43, 45, 94])
def test_app_level_never_repair(code: int) -> None:
    e = lookup("xid", code, {}, DEFAULT)
    assert code in APP_LEVEL_XIDS
    assert e.app_level and e.action is Action.none and not e.actionable


def test_nvlink5_severity_and_154_recovery_action() -> None:
    assert lookup("xid", 149, {"severity": "fatal"}, DEFAULT).action is Action.reset_gpu
    nonfatal = lookup("xid", 144, {"severity": "nonfatal"}, DEFAULT)
    assert nonfatal.action is Action.none and nonfatal.severity is Severity.warning
    for text, action in [
        ("GPU Reset Required", Action.reset_gpu),
        ("Node Reboot Required", Action.reboot),
        ("Drain P2P", Action.reset_gpu),
        ("None", Action.none),
    ]:
        assert lookup("xid", 154, {"recovery_action": text}, DEFAULT).action is action, text
    assert lookup("xid", 154, {"recovery_action_code": 2}, DEFAULT).action is Action.reboot


def test_sxid_fatal_vs_nonfatal() -> None:
    assert lookup("sxid", 12028, {}, DEFAULT).action is Action.reboot
    assert lookup("sxid", 12028, {"severity": "nonfatal"}, DEFAULT).action is Action.none
    assert lookup("sxid", 22013, {}, DEFAULT).action is Action.none
    assert lookup("sxid", 11012, {"severity": "fatal"}, DEFAULT).action is Action.reboot


def test_unmapped_kinds_and_codes_are_flagged_not_dropped() -> None:
    e = lookup("xid", 9999, {}, DEFAULT)
    assert not e.mapped and e.action is Action.none and e.mnemonic == "XID_9999"
    k = lookup("some_new_detector", None, {}, DEFAULT)
    assert not k.mapped and not k.actionable


def test_scenario_9_operator_override_xid_43_count_in_window() -> None:
    cfg = CatalogueConfig(
        xid={43: CatalogueOverride(action=Action.reset_gpu, count=5, window_s=600)}
    )
    e = lookup("xid", 43, {}, cfg)
    assert (e.action, e.count, e.window_s, e.actionable) == (Action.reset_gpu, 5, 600, True)
    assert e.app_level is False  # the operator decided
    assert lookup("xid", 43, {}, DEFAULT).action is Action.none  # others untouched


def test_override_severity_kind_and_actionable() -> None:
    cfg = CatalogueConfig(
        xid={79: CatalogueOverride(severity=Severity.warning, actionable=False)},
        kinds={"ib_link_down": CatalogueOverride(action=Action.reboot, count=3, window_s=60)},
        sxid={22013: CatalogueOverride(action=Action.reboot)},
    )
    e79 = lookup("xid", 79, {}, cfg)
    assert e79.severity is Severity.warning and not e79.actionable
    assert e79.action is Action.power_cycle
    ib = lookup("ib_link_down", None, {}, cfg)
    assert ib.action is Action.reboot and ib.count == 3 and ib.window_s == 60
    assert lookup("sxid", 22013, {}, cfg).action is Action.reboot


def test_bad_input_names_field() -> None:
    with pytest.raises(ValueError, match="kind"):
        lookup("", None, {}, DEFAULT)
    with pytest.raises(ValueError, match="code"):
        lookup("xid", -1, {}, DEFAULT)


def test_override_config_is_validated() -> None:
    with pytest.raises(Exception, match="count"):
        CatalogueConfig.model_validate({"xid": {43: {"count": 0}}})
