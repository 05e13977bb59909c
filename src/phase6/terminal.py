"""Result rows as plain text that fits the terminal: what a job prints at its end (results.md stays the full record).

- one row: ``key: value`` lines (a single-row table at 80 columns squeezes every cell to "…");
- several rows: an aligned table if it fits the width, else the table transposed (one line per key, one column per
  row, headed by the rows' names) if that fits, else the columns in blocks that fit, each block repeating the
  columns that name the rows. A row's name is the fewest leading columns whose values tell the rows apart (policy,
  router, rate in a fleet sweep), or a row number ``#`` where none do; a block's last column that is still too wide
  (a long reason) wraps at spaces.

Nothing is ever cut: a cell wider than the terminal makes its line longer. The width is the terminal's, or COLUMNS
(``shutil.get_terminal_size``; 80 when the output is a pipe, as in CI logs and ``make demo``).
"""

from __future__ import annotations

import shutil
import textwrap
from typing import Any

GAP = "  "


def cell(value: Any) -> str:
    """The same number formatting as the step log lines: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def terminal_width() -> int:
    return shutil.get_terminal_size().columns


def _grid(header: list[str], body: list[list[str]], width: int | None = None) -> list[str]:
    """Left-aligned columns, a dashed rule under the header. With ``width``, a last column that would pass it is
    wrapped at spaces onto continuation lines (a long reason or path stays whole when it has no spaces)."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    room = width - sum(widths[:-1]) - len(GAP) * (len(widths) - 1) if width else 0
    if width and widths[-1] > room >= 20:  # below 20 columns a wrapped cell reads worse than a long line
        widths[-1] = max([room, len(header[-1])])
    else:
        room = 0

    def lines(r: list[str]) -> list[str]:
        parts = textwrap.wrap(r[-1], room, break_long_words=False, break_on_hyphens=False) if room else [r[-1]]
        out = []
        for i, part in enumerate(parts or [""]):
            cells = r[:-1] if i == 0 else [""] * (len(r) - 1)
            out.append(GAP.join(c.ljust(w) for c, w in zip([*cells, part], widths, strict=True)).rstrip())
        return out

    return [*lines(header), *lines(["-" * w for w in widths]), *(ln for r in body for ln in lines(r))]


def _fits(lines: list[str], width: int) -> bool:
    return max(len(ln) for ln in lines) <= width


def _row_names(keys: list[str], body: list[list[str]], width: int) -> tuple[list[str], list[list[str]], int]:
    """(keys, body, n): the table with its first ``n`` columns naming the rows, the fewest leading columns whose values
    tell every row apart; where none do (or they take over half the width), a row number column "#" is put first."""
    for n in range(1, len(keys)):
        if len({tuple(b[:n]) for b in body}) == len(body):
            if _fits(_grid(keys[:n], [b[:n] for b in body]), width // 2):
                return keys, body, n
            break
    return ["#", *keys], [[str(i), *b] for i, b in enumerate(body, 1)], 1


def format_rows(rows: list[dict[str, Any]], title: str = "", width: int | None = None) -> str:
    """``rows`` (dicts; keys in first-seen order, a missing key prints as None) as text at most ``width`` wide."""
    width = width or terminal_width()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = textwrap.wrap(title, width, break_long_words=False) if title else []
    if not rows:
        return "\n".join([*out, "(no rows)"])
    if len(rows) == 1:
        pad = max(len(k) for k in keys) + 1
        return "\n".join([*out, *(f"{(k + ':').ljust(pad)} {cell(rows[0].get(k))}" for k in keys)])
    body = [[cell(r.get(k)) for k in keys] for r in rows]
    table = _grid(keys, body)
    if _fits(table, width):
        return "\n".join([*out, *table])
    keys, body, n = _row_names(keys, body, width)
    # transposed: one line per key, one column per row, headed by the rows' names
    transposed = _grid(
        ["/".join(keys[:n]), *("/".join(b[:n]) for b in body)],
        [[k, *(b[i] for b in body)] for i, k in enumerate(keys) if i >= n],
    )
    if _fits(transposed, width):
        return "\n".join([*out, *transposed])
    # blocks of columns, each repeating the naming columns so every line still names its row
    blocks: list[list[int]] = []
    current: list[int] = []
    for i in range(n, len(keys)):
        cols = [*range(n), *current, i]
        if current and not _fits(_grid([keys[j] for j in cols], [[b[j] for j in cols] for b in body]), width):
            blocks.append(current)
            current = []
        current.append(i)
    blocks.append(current)
    for k, block in enumerate(blocks):
        if k:
            out.append("")
        cols = [*range(n), *block]
        out += _grid([keys[j] for j in cols], [[b[j] for j in cols] for b in body], width)
    return "\n".join(out)
