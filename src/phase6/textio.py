"""Open the JSON / JSONL / CSV files users give us, compressed or not, with errors that name the file.

``.gz`` (gzip, in the standard library) and ``.zst`` (when the ``zstandard`` package is importable) are read
transparently; ``base_suffix`` gives the format suffix under the compression one (``pairs.jsonl.gz`` -> ``.jsonl``).
Undecodable bytes and broken archives become one-line ``UserError`` naming the file, never a ``UnicodeDecodeError``
from deep inside a parser.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from phase6.errors import UserError

COMPRESSED = (".gz", ".zst")


def base_suffix(path: str | Path) -> str:
    """The format suffix, under a compression suffix: ``a.jsonl.gz`` -> ``.jsonl``, ``a.csv`` -> ``.csv``."""
    p = Path(path)
    return Path(p.stem).suffix if p.suffix in COMPRESSED else p.suffix


def _binary(path: Path) -> io.BufferedIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if path.suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise UserError(f"{path}: .zst input needs the zstandard package (pip install zstandard)") from None
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)  # type: ignore[return-value]
    return open(path, "rb")


@contextmanager
def open_text(path: str | Path, newline: str | None = None) -> Iterator[TextIO]:
    """A UTF-8 text stream of ``path`` (decompressed); decoding or archive errors -> UserError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: file not found")
    raw = _binary(p)
    try:
        with io.TextIOWrapper(raw, encoding="utf-8", newline=newline) as f:  # type: ignore[arg-type]
            yield f
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x}: {e.reason})") from None
    except (OSError, EOFError) as e:  # gzip.BadGzipFile, truncated archive, zstd frame errors
        if isinstance(e, FileNotFoundError):
            raise
        raise UserError(f"{p}: cannot read ({type(e).__name__}: {e})") from None
    except Exception as e:
        if type(e).__module__.startswith("zstd"):
            raise UserError(f"{p}: cannot read ({type(e).__name__}: {e})") from None
        raise


def read_text(path: str | Path) -> str:
    """The whole (decompressed) file as text."""
    with open_text(path) as f:
        return f.read()


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(1-based line, parsed value) of each non-blank line of a JSONL file (decompressed); a line that is not JSON
    raises a one-line ``ValueError`` naming ``file:line``. Lazy: a caller that stops early reads no further."""
    with open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            yield line_no, value
