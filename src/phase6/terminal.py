"""Result rows as plain text that fits the terminal: what a job prints at its end (results.md stays the full record).

- one row: ``key: value`` lines (a single-row table at 80 columns squeezes every cell to "…");
- several rows: an aligned table if it fits the width, else the table transposed (one line per key, one column per
  row, headed by the first column's values when they name the rows) if that fits, else the columns in blocks that
  fit, each block repeating the first column (the row's name).

Nothing is ever cut: a cell wider than the terminal makes its line longer. The width is the terminal's, or COLUMNS
(``shutil.get_terminal_size``; 80 when the output is a pipe, as in CI logs and ``make demo``).
"""

from __future__ import annotations

import shutil
from typing import Any

GAP = "  "


def cell(value: Any) -> str:
    """The same number formatting as the step log lines: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def terminal_width() -> int:
    return shutil.get_terminal_size().columns


def _grid(header: list[str], body: list[list[str]]) -> list[str]:
    """Left-aligned columns, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return GAP.join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in body)]


def _fits(lines: list[str], width: int) -> bool:
    return max(len(ln) for ln in lines) <= width


def format_rows(rows: list[dict[str, Any]], title: str = "", width: int | None = None) -> str:
    """``rows`` (dicts; keys in first-seen order, a missing key prints as None) as text at most ``width`` wide."""
    width = width or terminal_width()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = [title] if title else []
    if not rows:
        return "\n".join([*out, "(no rows)"])
    if len(rows) == 1:
        pad = max(len(k) for k in keys) + 1
        return "\n".join([*out, *(f"{(k + ':').ljust(pad)} {cell(rows[0].get(k))}" for k in keys)])
    body = [[cell(r.get(k)) for k in keys] for r in rows]
    table = _grid(keys, body)
    if _fits(table, width):
        return "\n".join([*out, *table])
    names = [b[0] for b in body]
    if len(set(names)) == len(names):  # the first column names the rows: it heads the transposed columns
        transposed = _grid([keys[0], *names], [[k, *(b[i] for b in body)] for i, k in enumerate(keys) if i])
    else:
        transposed = _grid(
            ["", *map(str, range(1, len(rows) + 1))], [[k, *(b[i] for b in body)] for i, k in enumerate(keys)]
        )
    if _fits(transposed, width):
        return "\n".join([*out, *transposed])
    # blocks of columns, each repeating the first column so every line still names its row
    blocks: list[list[int]] = []
    current: list[int] = []
    for i in range(1, len(keys)):
        trial = _grid([keys[j] for j in (0, *current, i)], [[b[j] for j in (0, *current, i)] for b in body])
        if current and not _fits(trial, width):
            blocks.append(current)
            current = []
        current.append(i)
    blocks.append(current)
    for n, block in enumerate(blocks):
        if n:
            out.append("")
        cols = [0, *block]
        out += _grid([keys[j] for j in cols], [[b[j] for j in cols] for b in body])
    return "\n".join(out)
