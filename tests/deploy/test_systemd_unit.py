"""deploy/systemd/autorepair-agent.service: systemd accepts it, it is locked down, and its
command line is the agent contract (docs/design.md §4.1 ``autorepair-agent run --endpoint URL
--cluster C --node N``).

``systemd-analyze verify`` (Debian ``systemd``) loads the unit with systemd's own parser and
fails on unknown keys, bad values and a missing executable; the copy under test points
``ExecStart`` at this environment's ``autorepair-agent`` and ``EnvironmentFile`` at a copy
of the shipped example, everything else unchanged.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "autorepair-agent.service"
ENV_EXAMPLE = ROOT / "deploy" / "systemd" / "autorepair-agent.env"
INSTALLED_AGENT = "/opt/autorepair-agent/bin/autorepair-agent"


def _parse(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections → key → values (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    agent = Path(sys.executable).parent / "autorepair-agent"
    assert agent.exists(), "autorepair-agent console script missing: run `make install`"
    env_file = tmp_path / "agent.env"
    env_file.write_text(ENV_EXAMPLE.read_text())
    text = unit_text.replace(INSTALLED_AGENT, str(agent)).replace(
        "EnvironmentFile=/etc/autorepair/agent.env", f"EnvironmentFile={env_file}")
    path = tmp_path / "autorepair-agent.service"
    path.write_text(text)
    return subprocess.run([analyze, "verify", "--man=no", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    res = _verify(UNIT.read_text(), tmp_path)
    assert res.returncode == 0, res.stderr
    mine = [ln for ln in res.stderr.splitlines() if "autorepair-agent" in ln]
    assert mine == [], mine


def test_verify_really_rejects_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("Restart=always", "Restart=sometimes")
    res = _verify(broken, tmp_path)
    # A bad value is "ignored" with a warning naming the unit file and line, which the
    # test above treats as a failure.
    assert "autorepair-agent.service:" in res.stderr and "sometimes" in res.stderr


def test_exec_start_is_the_agent_contract() -> None:
    svc = _parse(UNIT.read_text())["Service"]
    (exec_start,) = svc["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == INSTALLED_AGENT and argv[1] == "run"
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags == {"--endpoint": "${AUTOREPAIR_ENDPOINT}",
                     "--cluster": "${AUTOREPAIR_CLUSTER}",
                     "--node": "${AUTOREPAIR_NODE}"}
    assert svc["Environment"] == ["AUTOREPAIR_NODE=%l"]
    assert svc["EnvironmentFile"] == ["/etc/autorepair/agent.env"]
    env = configparser.ConfigParser()
    env.optionxform = str  # type: ignore[assignment,method-assign]
    env.read_string("[env]\n" + ENV_EXAMPLE.read_text())
    assert env["env"]["AUTOREPAIR_ENDPOINT"].startswith(("http://", "https://"))
    assert env["env"]["AUTOREPAIR_CLUSTER"]


def test_least_privilege_settings() -> None:
    svc = _parse(UNIT.read_text())["Service"]
    assert svc["DynamicUser"] == ["yes"] and svc["NoNewPrivileges"] == ["yes"]
    assert svc["CapabilityBoundingSet"] == ["CAP_SYSLOG"]
    assert svc["AmbientCapabilities"] == ["CAP_SYSLOG"]
    assert svc["DevicePolicy"] == ["closed"]
    assert "/dev/kmsg r" in svc["DeviceAllow"]
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["StateDirectory"] == ["autorepair-agent"]  # = the agent's default state_dir
    # ProtectKernelLogs=yes would hide /dev/kmsg, the agent's input.
    assert "ProtectKernelLogs" not in svc
    unit = _parse(UNIT.read_text())["Unit"]
    assert not any("slurmd" in v for key in ("Requires", "BindsTo", "PartOf")
                   for v in unit.get(key, []))


def test_agent_cli_accepts_the_unit_flags() -> None:
    """Once the agent CLI exists, its ``run`` command takes the three contract flags."""
    pytest.importorskip("agent.cli", reason="agent/cli.py (autorepair-agent CLI) not landed yet")
    agent = Path(sys.executable).parent / "autorepair-agent"
    res = subprocess.run([str(agent), "run", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    for flag in ("--endpoint", "--cluster", "--node"):
        assert flag in res.stdout
