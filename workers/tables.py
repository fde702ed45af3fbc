"""Tables of the operator commands that fit the terminal (``repairs list``, ``status``).

Rich shrinks every column of a table wider than the console, down to ``…``: in an
80-column terminal or a pipe (rich assumes 80 columns there) the repairs table showed
``…`` for cluster, node, requester and updated. :func:`fitted_table` instead drops
whole columns, lowest priority first, until the rest fits at full width; columns marked
``keep`` (ids, node, stage: what people copy into commands) are never dropped or cut,
and ``wrap`` columns (summaries) wrap onto more lines instead of being cut. The caption
names what was dropped and that ``--json`` has every field.

:func:`limit_rows` bounds the rows of a table (``status --watch`` on a 24-line terminal
must show every table, if only its first rows, rather than lose the last ones below the
screen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table

WRAP_MIN = 16
"""Narrowest width, in cells, a wrapping column is given before columns are dropped."""


@dataclass(frozen=True, slots=True)
class Col:
    """A column: ``keep`` never dropped nor cut; ``priority`` higher = dropped later;
    ``wrap`` may wrap over several lines (at least :data:`WRAP_MIN` cells wide)."""

    name: str
    keep: bool = False
    priority: int = 0
    wrap: bool = False
    justify: str = "left"


def _table_width(widths: Sequence[int]) -> int:
    """Cells a rich table with the default box and padding (1 each side) takes."""
    return sum(widths) + 3 * len(widths) + 1


def fitted_table(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]],
                 width: int, *, compact: bool = False, note: str = "") -> Table:
    """A rich table of ``rows`` (cells as strings, one per column of ``cols``) that fits
    ``width`` cells: lowest-priority columns are dropped (rightmost first among equals)
    until the kept ones fit at their natural width (wrapping columns at
    :data:`WRAP_MIN`). ``compact``: a lighter box without edges (three lines of
    overhead instead of five) and no caption naming the dropped columns. ``note``: a
    caption line (e.g. rows left out)."""
    natural = [max([cell_len(c.name), *(cell_len(r[i]) for r in rows)])
               for i, c in enumerate(cols)]

    def need(idx: Sequence[int]) -> int:
        widths = [min(natural[i], WRAP_MIN) if cols[i].wrap else natural[i] for i in idx]
        return _table_width(widths) - (2 if compact else 0)

    shown = list(range(len(cols)))
    dropped: list[str] = []
    while need(shown) > width:
        optional = [i for i in shown if not cols[i].keep]
        if not optional:
            break
        victim = min(optional, key=lambda i: (cols[i].priority, -i))
        shown.remove(victim)
        dropped.append(cols[victim].name)
    captions = [note] if note else []
    if dropped and not compact:  # compact (a live view): every line counts
        captions.append(f"not shown at {width} columns: {', '.join(dropped)} (--json has "
                        "every field)")
    t = Table(title=title, caption="\n".join(captions) or None, caption_justify="left",
              box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, show_edge=not compact,
              title_justify="left" if compact else "center")
    for i in shown:
        c = cols[i]
        if c.wrap:
            t.add_column(c.name, overflow="fold", ratio=1, min_width=min(natural[i], WRAP_MIN),
                         justify=c.justify)  # type: ignore[arg-type]
        else:
            t.add_column(c.name, no_wrap=True, min_width=natural[i],
                         justify=c.justify)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(*(r[i] for i in shown))
    return t


def limit_rows(rows: list[list[str]], limit: int | None, what: str) -> tuple[list[list[str]], str]:
    """The first ``limit`` rows and a note naming how many more there are
    (``"… 3 more: autorepair repairs list"``); all rows and ``""`` when they fit or
    ``limit`` is ``None``."""
    if limit is None or len(rows) <= limit:
        return rows, ""
    keep = max(1, limit)
    return rows[:keep], f"… {len(rows) - keep} more: {what}"
