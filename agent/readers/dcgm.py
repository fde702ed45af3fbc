"""``dcgmi diag -r N`` reader: the boxed result table → one ``dcgm_diag`` event per table.

The table is what ``dcgmi diag`` prints on a terminal (DCGM 1.x–4.x), rows ``| name |
result |`` inside ``+----+----+`` borders, grouped by category rows such as
``|-----  Deployment  --------+----|`` or ``+-----  Hardware  ----+----+``:

- DCGM ≤ 3.x: one row per test with ``Pass``/``Fail``/``Warn``/``Skip`` and an optional
  ``- All`` or ``- GPU: 0`` suffix; a test whose GPUs differ continues on rows with an empty
  name (``|  | Fail - GPU: 0 |``); ``Warning``/``Info`` rows carry the message, wrapped onto
  further empty-name rows.
- DCGM 4.x: lower-case plugin names (``software``, ``memory``, ``targeted_stress``); the
  overall result on the test row and one ``GPU0: Fail`` row per entity below it.

A table with at least one failed or warned test (or an ``Error`` row: a deployment-stage
error prints one and no Fail cell, so the test or category it stopped in counts as failed)
gives one event; a clean pass gives none. A last row that lost its closing ``|`` is read.
The reader names the DCGM failure code of each message (:mod:`agent.readers.dcgm_codes`);
the catalogue decides the action. JSON output (``dcgmi diag -j``) is read by
:mod:`agent.readers.dcgm_json`.

``details`` of a ``dcgm_diag`` event (lists only when non-empty):

- ``failed``, ``warned``, ``passed``, ``skipped`` (list[str]): test names as printed, in
  table order, each test in the list of its worst result (Fail > Warn > Pass > Skip;
  ``Not Run`` counts as skipped).
- ``failed_gpus`` (list[int]): GPU indices named on failing rows (``Fail - GPU: 0``,
  ``GPU0: Fail``); absent when the rows say ``All`` or name none.
- ``warnings`` / ``errors`` (list[str]): ``Warning`` / ``Error`` row messages, wrapped rows
  re-joined (at most :data:`MAX_MESSAGES` together, each cut to 1000 characters).
- ``dcgm_errors`` (list[str], ``DCGM_FR_*`` names without the prefix), ``dcgm_error_ids``
  (list[int]), ``dcgm_error_tests`` (list[str], the test each message was printed under):
  parallel, one entry per (test, code), only when a message names a known code.
- ``dcgm_version``, ``driver_version`` (str): from the ``Metadata`` rows when printed.

Sources: DCGM ``dcgmi/Diag.cpp`` table output; samples in NVIDIA/DCGM issues 55, 139, 253 and
NVIDIA/go-dcgm issue 52 (3.x per-GPU rows), DCGM 4.x ``HelperDisplayEntityResults`` tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from agent.readers.dcgm_codes import CODES, identify
from agent.readers.events import MAX_LINE_CHARS, FaultEvent

MAX_MESSAGES = 16
"""Most ``Warning`` messages kept in ``details["warnings"]`` (a failing 8-GPU run prints one
per GPU per test; the raw table stays in ``text``)."""

_CATEGORY = re.compile(r"^[+|]-+\s+(?P<name>[A-Za-z][A-Za-z /]{0,40}?)\s+-*\+[-+]*[+|]$")
_STATUS = re.compile(
    r"^(?P<st>pass|fail|warn|skip|not run)\b(?:\s*-\s*(?P<who>.{0,200}))?$", re.IGNORECASE
)
_ENTITY = re.compile(
    r"^(?P<ent>GPU|CPU)\s*(?P<id>\d{1,4})\s*:\s*(?P<st>pass|fail|warn|skip|not run)\b",
    re.IGNORECASE,
)
_RANK = {"not run": 0, "skip": 1, "pass": 2, "warn": 3, "fail": 4}
_LIST = {0: "skipped", 1: "skipped", 2: "passed", 3: "warned", 4: "failed"}
_CATEGORIES = frozenset({"metadata", "deployment", "integration", "hardware", "stress", "custom"})

KNOWN_TESTS = frozenset(
    {
        "blacklist",
        "context create",
        "cpu eud",
        "cuda main library",
        "cuda toolkit libraries",
        "cuda toolkit library",
        "denylist",
        "diagnostic",
        "environment variables",
        "eud",
        "eud test",
        "fabric manager",
        "gpu memory",
        "graphics processes",
        "inforom",
        "input edpp",
        "memory",
        "memory bandwidth",
        "memtest",
        "nccl tests",
        "nvbandwidth",
        "nvlink",
        "nvml library",
        "page retirement/row remap",
        "pcie",
        "permissions and os blocks",
        "persistence mode",
        "pulse test",
        "sm stress",
        "software",
        "targeted power",
        "targeted stress",
    }
)
"""Test names ``dcgmi diag`` prints (lower case, ``_`` as space): DCGM 3.x display names and
DCGM 4.x plugin names (DCGM user guide, "Run Levels and Tests"). A boxed table without the
``Diagnostic | Result`` header counts as DCGM output when it names one of these."""


def is_table_line(line: str) -> bool:
    """True for a line of a boxed table: starts with ``|`` or ``+`` and ends with one, or a
    row that lost its closing ``|`` (``| Error | GPU 3 has …``, the last row of a cut
    paste: it starts with ``|`` and has a second ``|`` between its cells)."""
    if line[:1] not in ("|", "+", " ", "\t"):
        return False
    s = line.strip()
    if len(s) >= 2 and s[0] in "|+" and s[-1] in "|+":
        return True
    return len(s) >= 3 and s[0] == "|" and "|" in s[1:]


def _cells(line: str) -> tuple[str, str] | None:
    s = line.strip()
    if len(s) >= 3 and s[0] == "|" and s[-1] != "|" and "|" in s[1:]:
        s += "|"  # a row without its closing border
    if len(s) < 3 or s[0] != "|" or s[-1] != "|" or "|" not in s[1:-1]:
        return None
    a, b = s[1:-1].split("|", 1)
    return a, b


def _status(cell: str) -> tuple[int, list[int], bool] | None:
    """``(rank, gpu ids, is_entity_row)`` of a result cell, None when it is no result."""
    m = _ENTITY.match(cell)
    if m:
        ids = [int(m.group("id"))] if m.group("ent").upper() == "GPU" else []
        return _RANK[m.group("st").lower()], ids, True
    m = _STATUS.match(cell)
    if m:
        who = m.group("who") or ""
        gm = re.match(r"GPUs?\s*:?\s*(?P<ids>[\d,\s]{1,200})", who, re.IGNORECASE)
        named = [int(x) for x in re.findall(r"\d{1,4}", gm.group("ids"))] if gm else []
        return _RANK[m.group("st").lower()], named, False
    return None


def _test_key(name: str) -> str:
    return " ".join(name.replace("_", " ").split()).lower()


class _Table:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.tests: dict[str, int] = {}
        self.failed_gpus: set[int] = set()
        self.warnings: list[str] = []
        self.errors: list[str] = []
        self.messages: list[tuple[str, str]] = []  # (test the message belongs to, text)
        self.meta: dict[str, str] = {}
        self.dcgm = False
        self.category = ""
        self.category_name = ""  # as printed
        self.last_test: str | None = None
        self.message: list[str] | None = None
        self.message_kind = ""  # "Warning" or "Error"
        self.message_owner = ""

    def _close_message(self) -> None:
        if self.message is not None and len(self.messages) < MAX_MESSAGES:
            # dcgmi cuts a message at the column width, mid-word: a chunk as long as the
            # longest one filled the column and continues on the next row as is; a shorter
            # one ended at a space.
            bodies = [(c[1:] if c.startswith(" ") else c).rstrip() for c in self.message]
            width = max(len(b) for b in bodies)
            text = ""
            for k, body in enumerate(bodies):
                if k and len(bodies[k - 1]) < width:
                    text += " "
                text += body
            msg = " ".join(text.split())[:1000]
            (self.errors if self.message_kind == "Error" else self.warnings).append(msg)
            self.messages.append((self.message_owner, msg))
        self.message = None

    def row(self, line: str) -> None:
        self.lines.append(line)
        s = line.strip()
        cat = _CATEGORY.match(s)
        if cat:
            self._close_message()
            self.category_name = cat.group("name").strip()
            self.category = self.category_name.lower()
            self.last_test = None
            if self.category in _CATEGORIES:
                self.dcgm = True
            return
        cells = _cells(s)
        if cells is None:
            return
        a, b = cells[0].strip(), cells[1].strip()
        if a == "Diagnostic" and b == "Result":
            self.dcgm = True
            return
        if self.category == "metadata":
            if a == "DCGM Version":
                self.meta["dcgm_version"] = b[:64]
            elif a == "Driver Version Detected":
                self.meta["driver_version"] = b[:64]
            return
        if a in ("Warning", "Info", "Error"):
            self._close_message()
            if a != "Info":
                self.message = [cells[1]]
                self.message_kind = a
                self.message_owner = self.last_test or self.category_name or "Diagnostic"
                if a == "Error":
                    # a deployment-stage error prints this row and no Fail cell: the test
                    # (or the category it stopped in) failed
                    self._apply(self.message_owner, (_RANK["fail"], [], False))
            return
        st = _status(b)
        if not a:
            if st is not None and self.last_test is not None:
                self._close_message()
                self._apply(self.last_test, st)
            elif self.message is not None and b:
                self.message.append(cells[1])
            return
        self._close_message()
        if st is None:
            self.last_test = None
            return
        if _test_key(a) in KNOWN_TESTS:
            self.dcgm = True
        self.last_test = a
        self._apply(a, st)

    def _apply(self, name: str, st: tuple[int, list[int], bool]) -> None:
        rank, ids, _ = st
        self.tests[name] = max(rank, self.tests.get(name, -1))
        if rank == _RANK["fail"]:
            self.failed_gpus.update(ids)

    def event(self) -> FaultEvent | None:
        self._close_message()
        if not self.dcgm or not self.tests:
            return None
        lists: dict[str, list[str]] = {}
        for name, rank in self.tests.items():
            lists.setdefault(_LIST[rank], []).append(name)
        if "failed" not in lists and "warned" not in lists:
            return None
        details: dict[str, object] = {}
        for key in ("failed", "warned", "passed", "skipped"):
            if key in lists:
                details[key] = lists[key]
        if self.failed_gpus:
            details["failed_gpus"] = sorted(self.failed_gpus)
        if self.warnings:
            details["warnings"] = list(self.warnings)
        if self.errors:
            details["errors"] = list(self.errors)
        add_codes(details, ((owner, identify(text)) for owner, text in self.messages))
        details.update(self.meta)
        parts = []
        if "failed" in lists:
            parts.append("failed " + ", ".join(lists["failed"]))
        if "warned" in lists:
            parts.append("warned " + ", ".join(lists["warned"]))
        return FaultEvent(
            kind="dcgm_diag",
            xid=None,
            pci=None,
            pid=None,
            process=None,
            summary=("dcgmi diag: " + "; ".join(parts))[:300],
            text="\n".join(self.lines),
            details=details,
            level=False,
        )


def add_codes(details: dict[str, object], found: Iterable[tuple[str, str | None]]) -> None:
    """``details["dcgm_errors"]`` (``DCGM_FR_*`` names), ``dcgm_error_ids`` (their codes) and
    ``dcgm_error_tests`` (the test each was printed under), parallel lists in table order,
    one entry per (test, code); set only when some code was identified."""
    seen: list[tuple[str, str]] = []
    for owner, name in found:
        if name is not None and (owner, name) not in seen:
            seen.append((owner, name))
    if seen:
        details["dcgm_errors"] = [name for _, name in seen]
        details["dcgm_error_ids"] = [CODES[name] for _, name in seen]
        details["dcgm_error_tests"] = [owner for owner, _ in seen]


def is_dcgm_table(lines: list[str]) -> bool:
    """True when the boxed table ``lines`` is ``dcgmi diag`` output: it has the ``Diagnostic
    | Result`` header, a DCGM category row, or a result row naming a test of
    :data:`KNOWN_TESTS`."""
    t = _Table()
    for raw in lines:
        t.row(raw[:MAX_LINE_CHARS])
        if t.dcgm:
            return True
    return False


def parse_dcgm_diag(lines: list[str]) -> list[FaultEvent]:
    """``dcgmi diag`` table lines → one ``dcgm_diag`` event per table with a failed or
    warned test (a second ``Diagnostic | Result`` header starts a new table). Lines that are
    not table rows are ignored; a table that is not DCGM output gives nothing. Never raises."""
    events: list[FaultEvent] = []
    t = _Table()
    for raw in lines:
        line = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        cells = _cells(line)
        if cells is not None and cells[0].strip() == "Diagnostic" and cells[1].strip() == "Result":
            if t.tests:
                ev = t.event()
                if ev is not None:
                    events.append(ev)
                t = _Table()
        t.row(line)
    ev = t.event()
    if ev is not None:
        events.append(ev)
    return events
