"""Run sushy-tools' Redfish emulator (fake driver) with power changes that take at least
``MIN_POWER_CHANGE_S`` — the dev stack's BMC (``workers.devpeers.start_redfish_emulator``).

The fake driver applies a power change at ``int(time.time()) + randint(1, 11)`` seconds
(sushy-tools ``fakedriver.FakeDriver.set_power_state``): truncating the current time makes
the ``Off`` of a restart last anywhere from a few milliseconds to 11 s. A real BMC's
restart keeps the host off for seconds, and the dev stack's ``MachineBridge`` samples the
power state every ``BRIDGE_POLL_S`` (0.2 s) to turn a restart into the node's reboot: a
restart shorter than a sample is missed. The floor keeps every change at least 2 s (ten
samples) away; the upper bound of 11 s is the driver's own.

Usage: ``python -P -m workers.sushy_launch --config FILE`` (the emulator's own arguments).
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: Shortest time (s) before a requested power change shows: ten bridge samples.
MIN_POWER_CHANGE_S = 2.0


def install_power_floor(driver_cls: Any, floor_s: float = MIN_POWER_CHANGE_S) -> None:
    """Wrap ``driver_cls.set_power_state`` so a pending change applies no sooner than
    ``floor_s`` seconds after the request (idempotent)."""
    if getattr(driver_cls.set_power_state, "_autorepair_floor", None) is not None:
        return
    original = driver_cls.set_power_state

    def set_power_state(self: Any, identity: str, state: str) -> None:
        asked = time.time()
        original(self, identity, state)
        system = self._get(identity)
        pending = system.get("pending_power")
        if pending and pending["apply_time"] < asked + floor_s:
            self._update(system, pending_power={**pending, "apply_time": asked + floor_s})

    set_power_state._autorepair_floor = floor_s  # type: ignore[attr-defined]
    driver_cls.set_power_state = set_power_state


def main() -> int:
    from sushy_tools.emulator import main as emulator
    from sushy_tools.emulator.resources.systems import fakedriver

    install_power_floor(fakedriver.FakeDriver)
    return int(emulator.main() or 0)


if __name__ == "__main__":
    sys.exit(main())
