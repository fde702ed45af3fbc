"""``autorepair-agent capture`` (issue 31 item 3, node side) as the console script, with
fake ``nvidia-bug-report.sh`` / ``nvidia-smi`` / ``journalctl`` / ``dmesg`` on ``PATH``:
real files, a real tar.gz, a real sha256; the simulated NVML backend for the counters."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

from tests.conftest import venv_binary

ROOT = Path(__file__).resolve().parents[2]


def _tool(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)


def _path_with(bin_dir: Path, *keep: str) -> str:
    """``bin_dir`` plus a directory of links to only the system tools named in ``keep``
    (so a real nvidia-smi / journalctl on this host never leaks into the test)."""
    sysbin = bin_dir.parent / "sysbin"
    sysbin.mkdir(exist_ok=True)
    for name in ("sh", "gzip", "cat", "echo", *keep):
        for d in ("/usr/bin", "/bin"):
            if Path(d, name).exists() and not (sysbin / name).exists():
                (sysbin / name).symlink_to(Path(d, name))
    return f"{bin_dir}:{sysbin}"


def _run(tmp_path: Path, path: str, *args: str) -> tuple[int, dict[str, object], str]:
    argv = [venv_binary("autorepair-agent"), "capture", "--json", "--backend", "simulated",
            "--kmsg", str(tmp_path / "kmsg"), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=path)
    cp = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    lines = cp.stdout.strip().splitlines()
    assert len(lines) == 1, (cp.stdout, cp.stderr)
    return cp.returncode, json.loads(lines[0]), cp.stderr


def _members(path: str) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            out[m.name] = f.read()
        return out


def test_capture_runs_nvidia_bug_report_where_present(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # NVIDIA's script writes FILE.gz for --output-file FILE when gzip is there
    _tool(bin_dir, "nvidia-bug-report.sh",
          'test "$1" = --output-file || exit 9\n'
          'echo "nvidia-bug-report for $(hostname 2>/dev/null)" | gzip > "$2.gz"')
    _tool(bin_dir, "nvidia-smi", "echo should-not-run; exit 1")
    out_dir = tmp_path / "evidence"
    rc, res, err = _run(tmp_path, _path_with(bin_dir), "--dir", str(out_dir), "--repair", "r-1")
    assert rc == 0, err
    assert res["tool"] == "nvidia-bug-report" and res["notes"] == []
    path = Path(str(res["path"]))
    assert path.parent == out_dir and path.name.startswith("autorepair-evidence-r-1-")
    data = path.read_bytes()
    assert res["size_bytes"] == len(data) and res["sha256"] == hashlib.sha256(data).hexdigest()
    files = _members(str(path))
    assert set(files) == {"manifest.json", "nvidia-bug-report.log.gz"}
    manifest = json.loads(files["manifest.json"])
    assert manifest["repair_id"] == "r-1" and manifest["tool"] == "nvidia-bug-report"
    # nothing but the archive stays in the directory (no work files, no .part)
    assert [p.name for p in out_dir.iterdir()] == [path.name]


def test_capture_falls_back_to_nvidia_smi_kernel_log_and_nvml(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-smi", 'test "$1" = -q || exit 9\necho "==NVSMI LOG== Xid 79"')
    _tool(bin_dir, "journalctl", 'test "$*" = "-k -b --no-pager" || exit 9\n'
          'echo "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."')
    rc, res, err = _run(tmp_path, _path_with(bin_dir), "--dir", str(tmp_path / "ev"),
                        "--repair", "rep/2")
    assert rc == 0, err
    assert res["tool"] == "fallback"
    files = _members(str(res["path"]))
    assert set(files) == {"manifest.json", "nvidia-smi-q.txt", "kernel.log", "nvml.json"}
    assert b"NVSMI LOG" in files["nvidia-smi-q.txt"]
    assert b"fallen off the bus" in files["kernel.log"]
    counters = json.loads(files["nvml.json"])
    assert len(counters) == 8 and {"pci", "ecc_uncorrectable_volatile"} <= set(counters[0])
    assert Path(str(res["path"])).name.startswith("autorepair-evidence-rep_2-")


def test_capture_notes_what_is_missing_and_reads_kmsg_last(tmp_path: Path) -> None:
    """No NVIDIA tool, no journalctl, a dmesg that fails: the kernel log comes from the
    kmsg device, and each missing part is a note (the capture itself succeeds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "dmesg", "echo 'dmesg: read kernel buffer failed' >&2; exit 1")
    (tmp_path / "kmsg").write_text("6,1,0,-;NVRM: Xid (PCI:0000:18:00): 48, DBE\n")
    rc, res, err = _run(tmp_path, _path_with(bin_dir), "--dir", str(tmp_path / "ev"),
                        "--repair", "r-3")
    assert rc == 0, err
    notes = " | ".join(res["notes"])  # type: ignore[arg-type]
    assert "nvidia-smi not found" in notes and "journalctl not found" in notes
    assert "dmesg exit 1: dmesg: read kernel buffer failed" in notes
    files = _members(str(res["path"]))
    assert b"Xid (PCI:0000:18:00): 48" in files["kernel.log"]
    assert "nvidia-smi-q.txt" not in files


def test_capture_cannot_write_its_directory_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rc, res, _err = _run(tmp_path, _path_with(tmp_path), "--dir", str(blocker / "ev"),
                         "--repair", "r-4")
    assert rc == 2 and str(blocker / "ev") in str(res["error"])


def test_a_hanging_bug_report_is_killed_and_the_fallback_runs(tmp_path: Path) -> None:
    """``--tool-timeout`` bounds the tools together: a ``nvidia-bug-report.sh`` that never
    ends is killed with its children at the budget, and the fallback still collects."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-bug-report.sh", f"sleep 60 & echo $! > {tmp_path}/child; wait")
    _tool(bin_dir, "journalctl", 'echo "NVRM: Xid (PCI:0000:18:00): 79"')
    t0 = time.monotonic()
    rc, res, err = _run(tmp_path, _path_with(bin_dir, "sleep"), "--dir", str(tmp_path / "ev"),
                        "--repair", "r-5", "--tool-timeout", "2")
    assert rc == 0, err
    assert time.monotonic() - t0 < 30
    assert res["tool"] == "fallback"
    notes = " | ".join(res["notes"])  # type: ignore[arg-type]
    assert "nvidia-bug-report.sh did not finish within 2 s" in notes, notes
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)                                     # the kill reaches the child
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(
        f"/proc/{child}/stat").read_text().split()[2]
    assert b"Xid" in _members(str(res["path"]))["kernel.log"]
