"""Default catalogue decisions and operator overrides (docs/design.md §5)."""

from __future__ import annotations

import pytest

from workflows.catalogue import APP_LEVEL_XIDS, entry_for
from workflows.config import CatalogueConfig, CatalogueOverride
from workflows.models import Action, Severity

DEFAULT = CatalogueConfig()


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (79, Action.power_cycle),  # RESTART_BM
        (48, Action.reset_gpu),
        (62, Action.reset_gpu),
        (64, Action.reset_gpu),  # NVIDIA: RESET_GPU, then CONTACT_SUPPORT
        (119, Action.reset_gpu),
        (120, Action.reset_gpu),
        (136, Action.reset_gpu),
        (140, Action.reset_gpu),
        (155, Action.reset_gpu),
        (156, Action.reset_gpu),
        (158, Action.reset_gpu),
        (151, Action.reboot),  # RESTART_VM
        (160, Action.reboot),  # departure, reason written
        (167, Action.reboot),
        (169, Action.reset_gpu),
        (172, Action.reset_gpu),
        (54, Action.remove),  # CHECK_MECHANICALS: human-only
        (57, Action.remove),  # CONTACT_SUPPORT
        (61, Action.remove),
        (122, Action.remove),
        (44, Action.none),  # IGNORE
        (121, Action.none),
        (38, Action.none),
        (13, Action.none),
        (31, Action.none),
        (43, Action.none),
        (45, Action.none),
        (94, Action.none),
        (109, Action.none),  # departure: Kubernetes device plugin's application error
    ],
)
def test_xid_actions(code: int, action: Action) -> None:
    e = entry_for("xid", code, {}, DEFAULT)
    assert e.action is action
    assert e.actionable is (action is not Action.none)
    assert e.mapped and e.mnemonic and e.source


@pytest.mark.parametrize("code", [13, 31, 43, 45, 94, 109])
def test_app_level_never_repair(code: int) -> None:
    e = entry_for("xid", code, {}, DEFAULT)
    assert code in APP_LEVEL_XIDS
    assert e.app_level and e.action is Action.none and not e.actionable


def test_nvlink5_severity() -> None:
    assert entry_for("xid", 149, {"severity": "fatal"}, DEFAULT).action is Action.reset_gpu
    nonfatal = entry_for("xid", 144, {"severity": "nonfatal"}, DEFAULT)
    assert nonfatal.action is Action.none and nonfatal.severity is Severity.warning


@pytest.mark.parametrize(
    ("details", "action"),
    [
        ({"recovery_action_code": 0}, Action.none),
        ({"recovery_action_code": 1}, Action.reset_gpu),
        ({"recovery_action_code": 2}, Action.reboot),
        ({"recovery_action_code": 3}, Action.reset_gpu),
        ({"recovery_action_code": 4}, Action.reset_gpu),
        # the code wins over a cut-off or contradicting label
        ({"recovery_action_code": 2, "recovery_action": "GPU Res"}, Action.reboot),
        ({"recovery_action": "0x2"}, Action.reboot),
        ({"recovery_action": "GPU Reset Required"}, Action.reset_gpu),
        ({"recovery_action": "Node Reboot Required"}, Action.reboot),
        ({"recovery_action": "Drain P2P"}, Action.reset_gpu),
        ({"recovery_action": "None"}, Action.none),
    ],
)
def test_xid_154_code_first_then_label(details: dict[str, object], action: Action) -> None:
    e = entry_for("xid", 154, details, DEFAULT)
    assert e.mapped and e.action is action, details


@pytest.mark.parametrize(
    "details", [{}, {"recovery_action": "garbled"}, {"recovery_action_code": 9}]
)
def test_xid_154_unreadable_is_observed_not_a_default_reset(details: dict[str, object]) -> None:
    e = entry_for("xid", 154, details, DEFAULT)
    assert not e.mapped and e.action is Action.none and not e.actionable


def test_sxid_headline_then_fabric_manager_lists() -> None:
    assert entry_for("sxid", 24007, {}, DEFAULT).action is Action.reboot  # fatal list
    assert entry_for("sxid", 20009, {}, DEFAULT).action is Action.none  # non-fatal
    assert entry_for("sxid", 22013, {}, DEFAULT).action is Action.none
    assert entry_for("sxid", 11012, {"severity": "fatal"}, DEFAULT).action is Action.reboot
    assert entry_for("sxid", 24007, {"severity": "nonfatal"}, DEFAULT).action is Action.none
    # listed non-fatal (the guide's recovery restarts; gpud says fatal): the list decides
    assert entry_for("sxid", 12028, {}, DEFAULT).action is Action.none
    unknown = entry_for("sxid", 29999, {}, DEFAULT)
    assert not unknown.mapped and unknown.action is Action.none  # never a default reboot


def test_unmapped_kinds_and_codes_are_flagged_not_dropped() -> None:
    e = entry_for("xid", 9999, {}, DEFAULT)
    assert not e.mapped and e.action is Action.none and e.mnemonic == "XID_9999"
    assert not entry_for("xid", 166, {}, DEFAULT).mapped  # listed without a bucket
    k = entry_for("some_new_detector", None, {}, DEFAULT)
    assert not k.mapped and not k.actionable
    assert not entry_for("thermal", None, {}, DEFAULT).mapped  # no reader emits it


@pytest.mark.parametrize(
    ("kind", "details", "action", "mapped"),
    [
        ("uvm_fatal", {}, Action.reboot, True),
        ("npd_condition", {"condition": "KernelDeadlock"}, Action.reboot, True),
        ("npd_condition", {"condition": "ReadonlyFilesystem"}, Action.reboot, True),
        ("npd_condition", {"condition": "XfsShutdown"}, Action.reboot, True),
        ("npd_condition", {"condition": "FrequentDockerRestart"}, Action.none, False),
        ("dcgm_diag", {"failed": ["Memory", "PCIe"]}, Action.none, True),
        ("nvsmi", {"flags": ["reset_required"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["drain_and_reset_recommended"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["recovery_reset"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["recovery_node_reboot"]}, Action.reboot, True),
        ("nvsmi", {"flags": ["recovery_drain_p2p"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["recovery_drain_and_reset"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["channel_repair_pending"]}, Action.reset_gpu, True),
        ("nvsmi", {"flags": ["unrepairable_memory"]}, Action.remove, True),
        ("nvsmi", {"flags": ["remap_pending", "remap_failure"]}, Action.remove, True),
        ("nvsmi", {"flags": ["hw_slowdown"]}, Action.none, True),
        # the agent's NVML path sends counters without a flags list
        ("nvsmi", {"dram_uncorrectable": 2, "remap_pending": False}, Action.reset_gpu, True),
        ("node_not_ready", {}, Action.none, True),
        ("node_not_ready", {"bmc": {"power_state": "Off"}}, Action.power_cycle, True),
    ],
)
def test_kinds_decided_per_occurrence(
    kind: str, details: dict[str, object], action: Action, mapped: bool
) -> None:
    e = entry_for(kind, None, details, DEFAULT)
    assert (e.action, e.mapped) == (action, mapped)
    assert e.source


def test_dcgm_diag_is_evidence_not_a_repair() -> None:
    e = entry_for("dcgm_diag", None, {"failed": ["Memory"]}, DEFAULT)
    assert "re-validat" in e.description and "Memory" in e.description and not e.actionable


def test_operator_override_xid_43_count_in_window() -> None:
    cfg = CatalogueConfig(
        xid={43: CatalogueOverride(action=Action.reset_gpu, count=5, window_s=600)}
    )
    e = entry_for("xid", 43, {}, cfg)
    assert (e.action, e.count, e.window_s, e.actionable) == (Action.reset_gpu, 5, 600, True)
    assert e.app_level is False  # the operator decided
    assert "override xid:43:override" in e.source
    assert entry_for("xid", 43, {}, DEFAULT).action is Action.none  # others untouched


def test_override_severity_kind_and_actionable() -> None:
    cfg = CatalogueConfig(
        xid={79: CatalogueOverride(severity=Severity.warning, actionable=False)},
        kinds={"ib_link_down": CatalogueOverride(action=Action.reboot, count=3, window_s=60)},
        sxid={22013: CatalogueOverride(action=Action.reboot)},
    )
    e79 = entry_for("xid", 79, {}, cfg)
    assert e79.severity is Severity.warning and not e79.actionable
    assert e79.action is Action.power_cycle
    ib = entry_for("ib_link_down", None, {}, cfg)
    assert ib.action is Action.reboot and ib.count == 3 and ib.window_s == 60
    assert entry_for("sxid", 22013, {}, cfg).action is Action.reboot
    assert entry_for(
        "xid", 9999, {}, CatalogueConfig(xid={9999: CatalogueOverride(action=Action.reset_gpu)})
    ).mapped  # the operator mapped a new code


def test_bad_input_names_field() -> None:
    with pytest.raises(ValueError, match="kind"):
        entry_for("", None, {}, DEFAULT)
    with pytest.raises(ValueError, match="code"):
        entry_for("xid", -1, {}, DEFAULT)


def test_override_config_is_validated() -> None:
    with pytest.raises(Exception, match="count"):
        CatalogueConfig.model_validate({"xid": {43: {"count": 0}}})
