"""The dev emulator's power-change floor (``workers.sushy_launch``) on sushy-tools' own
fake driver: a restart keeps the system ``Off`` for at least the floor, then ``On``."""

from __future__ import annotations

import logging
import time

from sushy_tools.emulator.resources.systems import fakedriver

from workers.sushy_launch import MIN_POWER_CHANGE_S, install_power_floor


class _Driver(fakedriver.FakeDriver):
    """The fake driver, patched on a subclass so other tests keep the original."""


def _driver() -> _Driver:
    install_power_floor(_Driver, floor_s=0.5)
    install_power_floor(_Driver, floor_s=0.5)  # idempotent: wrapped once
    system = {"uuid": "u-1", "name": "gpu-01", "power_state": "On",
              "external_notifier": False}
    _Driver.initialize({"SUSHY_EMULATOR_FAKE_SYSTEMS": [system]}, logging.getLogger("sushy"))
    return _Driver()


def test_restart_stays_off_for_the_floor_then_comes_on() -> None:
    d = _driver()
    asked = time.time()
    d.set_power_state("u-1", "ForceRestart")
    pending = d._get("u-1")["pending_power"]
    assert pending["apply_time"] >= asked + 0.5
    assert d.get_power_state("u-1") == "Off"
    time.sleep(max(0.0, pending["apply_time"] - time.time()) + 0.05)
    assert d.get_power_state("u-1") == "On"


def test_floor_default_is_ten_bridge_polls() -> None:
    from workers.devpeers import BRIDGE_POLL_S

    assert MIN_POWER_CHANGE_S >= 10 * BRIDGE_POLL_S
