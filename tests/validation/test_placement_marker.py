"""The Slurm validation's placement marker survives a write that dies half way.

The marker (``<output_dir>/<run>.json``) is how a retried ``place`` finds the job it
already submitted and the node's prior state. A worker killed (or a disk filled) while
writing it used to leave a truncated file that every retry failed to parse; it is now
replaced at once, so a reader sees the old marker or the new one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.validation import slurm as vslurm


def test_marker_write_that_dies_half_way_keeps_the_old_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "run-1.json"
    old = {"prior_state": {"drain": False}, "job_id": None}
    vslurm._write_marker(marker, old)
    assert json.loads(marker.read_text()) == old

    real_write = Path.write_text

    def dies_half_way(self: Path, data: str, *a: Any, **kw: Any) -> int:
        real_write(self, data[: len(data) // 2], *a, **kw)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", dies_half_way)
    with pytest.raises(OSError, match="No space left"):
        vslurm._write_marker(marker, {"prior_state": {"drain": False}, "job_id": "4242"})
    monkeypatch.undo()
    assert json.loads(marker.read_text()) == old  # never truncated

    new = {"prior_state": {"drain": False}, "job_id": "4243"}
    vslurm._write_marker(marker, new)
    assert json.loads(marker.read_text()) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1.json"]  # no temp left
