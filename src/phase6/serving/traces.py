"""Request traces, one strict parser per format: Mooncake FAST'25 JSONL and Azure LLM-inference CSV.

Both the fleet simulator (``phase6.fleet.workload``: columnar loaders) and 6B's request lists
(``phase6.serving.workload``: adds prompt text) read traces through :func:`iter_mooncake` / :func:`iter_azure`, so
both replay the same validated rows (:class:`TraceRow`). Units: seconds for time, tokens for lengths.

Prefix blocks follow Mooncake's trace format (kvcache-ai/Mooncake FAST25-release/README.md): ``hash_ids[i]`` names
the i-th 512-token block of the prompt, and ids are chained hashes, so an equal id means an equal *prefix* up to and
including that block.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from phase6.textio import iter_jsonl, open_text

BLOCK_TOKENS = 512
"""Tokens per prefix block of a Mooncake trace (``len(hash_ids) == ceil(input_length / 512)``)."""


def _check_lengths(path: Path, line: int, inp: object, out: object) -> None:
    where = f"{path}:{line}"
    if not isinstance(inp, int) or isinstance(inp, bool) or inp < 1:
        raise ValueError(f"{where}: input length must be an integer >= 1, got {inp!r}")
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise ValueError(f"{where}: output length must be an integer >= 1, got {out!r}")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One validated row of a request trace; the only parse of each trace format (fleet and 6B both use it)."""

    line: int
    """1-based line of the file (error messages and derived per-row seeds name it)."""
    time_s: float
    """Arrival time in seconds on the trace's own clock (Mooncake: ms / 1000; Azure: UTC epoch seconds)."""
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None
    """Mooncake: ids of the prompt's 512-token prefix blocks (chained); Azure: None."""
    session: str | None = None
    """Mooncake: the row's optional ``session_id`` (a conversation named by the trace); None when absent."""


def iter_mooncake(path: str | Path) -> Iterator[TraceRow]:
    """Rows of a Mooncake FAST'25 JSONL trace: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Any missing field, a negative or non-integer length, an unsorted timestamp or a ``hash_ids`` list whose length
    is not ``ceil(input_length / 512)`` raises a one-line ``ValueError`` naming ``file:line``. Lazy: a caller that
    stops early does not read (or check) the rest of the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: Mooncake trace not found")
    prev = 0.0
    for line_no, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in row:
                raise ValueError(f"{path}:{line_no}: missing field {key!r}")
        t = row["timestamp"]
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            raise ValueError(f"{path}:{line_no}: timestamp must be a number (ms), got {t!r}")
        t_s = float(t) / 1000.0
        if not math.isfinite(t_s) or t_s < 0:
            raise ValueError(f"{path}:{line_no}: timestamp must be finite and >= 0 ms, got {t!r}")
        if t_s < prev:
            raise ValueError(
                f"{path}:{line_no}: timestamps not sorted ({t!r} ms after {prev * 1000:g} ms); "
                "sort the trace by arrival"
            )
        _check_lengths(path, line_no, row["input_length"], row["output_length"])
        h = row["hash_ids"]
        if not isinstance(h, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in h):
            raise ValueError(f"{path}:{line_no}: hash_ids must be a list of integers")
        if len(h) != math.ceil(row["input_length"] / BLOCK_TOKENS):
            raise ValueError(
                f"{path}:{line_no}: hash_ids has {len(h)} blocks but input_length "
                f"{row['input_length']} needs ceil(/{BLOCK_TOKENS}) = "
                f"{math.ceil(row['input_length'] / BLOCK_TOKENS)}"
            )
        sid = row.get("session_id")
        if sid is not None and (not isinstance(sid, (str, int)) or isinstance(sid, bool)):
            raise ValueError(f"{path}:{line_no}: session_id must be a string or an integer, got {sid!r}")
        prev = t_s
        yield TraceRow(
            line_no, t_s, row["input_length"], row["output_length"], tuple(h), None if sid is None else str(sid)
        )


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _parse_azure_time(s: str) -> float:
    # 7 fractional digits ("2023-11-16 18:17:03.9799600"): datetime takes at most 6. UTC, so that a daylight-saving
    # change of the machine's zone cannot open or close an hour inside a trace.
    head, _, frac = s.strip().partition(".")
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def iter_azure(path: str | Path) -> Iterator[TraceRow]:
    """Rows of an Azure LLM inference trace CSV (Splitwise, ISCA'24): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    A missing column or field, a bad timestamp, a non-integer or < 1 length or an unsorted timestamp raises a
    one-line ``ValueError`` naming ``file:line``. No prefix information: ``hash_ids`` is None. Lazy, like
    :func:`iter_mooncake`.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: Azure trace not found")
    prev = -math.inf
    with open_text(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}:1: empty file, expected header {','.join(_AZURE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in _AZURE_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)} in header {header}")
        col = [header.index(c) for c in _AZURE_COLUMNS]
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < len(header):
                raise ValueError(f"{path}:{line_no}: expected {len(header)} fields, got {len(row)}")
            vals = [row[c].strip() for c in col]
            for name, v in zip(_AZURE_COLUMNS, vals, strict=True):
                if v == "":
                    raise ValueError(f"{path}:{line_no}: missing field {name!r}")
            try:
                t = _parse_azure_time(vals[0])
            except ValueError:
                raise ValueError(
                    f"{path}:{line_no}: TIMESTAMP {vals[0]!r} is not 'YYYY-MM-DD HH:MM:SS[.frac]'"
                ) from None
            try:
                a, b = int(vals[1]), int(vals[2])
            except ValueError:
                raise ValueError(
                    f"{path}:{line_no}: ContextTokens/GeneratedTokens must be integers, got {vals[1]!r}, {vals[2]!r}"
                ) from None
            _check_lengths(path, line_no, a, b)
            if t < prev:
                raise ValueError(
                    f"{path}:{line_no}: timestamps not sorted ({vals[0]} is earlier than the row "
                    f"before); sort the trace by arrival"
                )
            prev = t
            yield TraceRow(line_no, t, a, b, None)
