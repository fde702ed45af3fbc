"""Filesystems: XFS shutdowns (``fs/xfs``) and read-only remounts of any filesystem.

Kinds (docs/design.md §4.1 has two filesystem kinds; no new ones):

- ``xfs_shutdown``: ``XFS (<dev>): … Shutting down filesystem`` and the lines printed with
  it; also any XFS line saying the filesystem went read-only (XFS does not remount
  read-only on error, it shuts down).
- ``ext4_readonly``: a read-only remount of any other filesystem: ``EXT2/3/4-fs``
  ``Remounting filesystem read-only`` (``fs/ext4/super.c``), ``BTRFS … forced readonly`` /
  ``Remounting filesystem read-only`` (``fs/btrfs``), ``FAT-fs … set read-only`` and the
  bare phrase. ``details``: ``filesystem`` (``ext4``, ``btrfs``, … or None when not
  printed) and ``device`` when printed. The kind keeps its DESIGN name for every
  filesystem: the action (reboot to fsck and remount) does not depend on which one.
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import MULTI_LINE_GAP, Record, single

_XFS = re.compile(r"XFS \((?P<dev>[^)\s]{1,64})\):")
_XFS_SHUT = re.compile(
    r"Shutting down filesystem|xfs_do_force_shutdown|[Ff]ilesystem has been shut down|"
    r"Log I/O [Ee]rror.{0,40}[Ss]hutting down|[Rr]emounting (?:filesystem )?read-only"
)
_RO = re.compile(
    r"(?:(?P<fs>EXT[234]-fs|BTRFS|F2FS-fs|FAT-fs|exFAT-fs|NILFS(?:-fs)?|JFS|[Rr]eiser[Ff][Ss]|"
    r"REISERFS|ocfs2|OCFS2|gfs2|GFS2|ntfs3|NTFS)"
    r"(?: (?:error|warning|info|critical|crit|emerg|notice|warn))?"
    r"\s{0,4}(?:\((?:device )?(?P<dev>[^)\s]{1,64})\))?:?.{0,200}?)?"
    r"(?P<what>[Rr]emounting filesystem read-only|forced readonly|"
    r"[Ff]ilesystem has been set read-only|[Rr]emounting read-only)"
)


class XfsRecord(Record):
    """XFS shutdown: the lines ``XFS (<dev>): …`` printed together for one shutdown."""

    max_lines = 8
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, dev: str) -> None:
        super().__init__(line)
        self.dev = dev

    def accepts(self, line: str) -> bool:
        if "XFS" not in line:
            return False
        m = _XFS.search(line)
        return bool(m and m.group("dev") == self.dev)

    def finish(self) -> list[FaultEvent]:
        return [
            single("xfs_shutdown", self.text, f"XFS filesystem on {self.dev} shut down",
                   details={"device": self.dev})
        ]


def match_xfs(line: str) -> XfsRecord | None:
    """Needle ``XFS``: a shutdown opens a record."""
    xm = _XFS.search(line)
    if xm and _XFS_SHUT.search(line):
        return XfsRecord(line, xm.group("dev"))
    return None


def match_readonly(line: str) -> FaultEvent | None:
    """Needles ``read-only`` / ``readonly``: a non-XFS filesystem remounted read-only."""
    m = _RO.search(line)
    if not m:
        return None
    fs_raw = m.group("fs")
    fs = fs_raw.split("-")[0].lower() if fs_raw else None
    dev = m.group("dev")
    details: dict[str, object] = {"filesystem": fs}
    if dev:
        details["device"] = dev
    label = fs_raw.split("-")[0].upper() if fs_raw else "Filesystem"
    where = f" on {dev}" if dev else ""
    return single("ext4_readonly", line, f"{label} filesystem{where} remounted read-only",
                  details=details)
