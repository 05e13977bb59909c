"""Document streams for prep: CPython's own docs (offline default), local .txt/.jsonl/.parquet, HF streaming.

Every stream yields documents (``str``) in a fixed order for a fixed revision, so a resumed prep can skip the
documents it already wrote. A bad row is a ValueError naming the file (or dataset) and the row.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import platform
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from phase6.config.data import LOCAL_SUFFIXES, DataConfig
from phase6.textio import base_suffix, iter_jsonl, open_text, read_text


@dataclass
class Source:
    """A resolved document source: a label and revision for the manifest, and how to stream it."""

    label: str
    """e.g. 'hf:HuggingFaceFW/fineweb-edu/sample-10BT/train', 'local:/data/x.jsonl', 'embedded:cpython'."""
    revision: str
    """HF commit sha, sha256 over the local files, or the CPython version."""
    num_docs: int | None
    """Documents in the stream when cheaply known (for the progress bar's ETA), else None."""
    cfg: DataConfig

    def documents(self) -> Iterator[str]:
        """The documents, in the same order on every call."""
        cfg = self.cfg
        if cfg.source == "embedded":
            return embedded_documents()
        if cfg.source == "local":
            assert cfg.local_path is not None
            return local_documents(local_files(cfg.local_path), cfg.text_column)
        repo, subset = cfg.hf_dataset()
        revision = self.revision if is_hub_repo(repo) else None
        return hf_documents(repo, subset, cfg.split, revision, cfg.text_column, cfg.data_files)


def is_hub_repo(dataset: str) -> bool:
    """'owner/name' is a Hub dataset repo; a bare name ('parquet', 'json') is a packaged builder over data_files."""
    return "/" in dataset and not Path(dataset).exists()


def resolve_source(cfg: DataConfig) -> Source:
    """Pin the source to a revision (HF commit sha, local file hashes, CPython version)."""
    if cfg.source == "embedded":
        return Source(
            "embedded:cpython-docs (pydoc_data.topics, LICENSE.txt, stdlib module docstrings)",
            embedded_revision(),
            None,
            cfg,
        )
    if cfg.source == "local":
        assert cfg.local_path is not None
        files = local_files(cfg.local_path)
        return Source(f"local:{Path(cfg.local_path).resolve()}", local_revision(files), count_local_docs(files), cfg)
    repo, subset = cfg.hf_dataset()
    files = f"/{cfg.data_files}" if cfg.data_files else ""
    label = f"hf:{repo}/{subset or 'default'}/{cfg.split}{files}"
    if is_hub_repo(repo):
        revision = resolve_hf_revision(repo, cfg.revision)
        return Source(label, revision, hf_num_docs(repo, subset, cfg.split, revision, cfg.data_files), cfg)
    if not cfg.data_files:
        raise ValueError(f"data.data_files: is required for the packaged builder data.dataset={repo!r}")
    matched = sorted(Path(p) for p in glob.glob(cfg.data_files))
    if not matched:
        raise ValueError(f"{cfg.data_files}: data.data_files matches no file")
    return Source(label, local_revision(matched), None, cfg)


# ---------------------------------------------------------------------------------------------------- embedded


def embedded_revision() -> str:
    return f"cpython-{platform.python_version()}"


def embedded_documents() -> Iterator[str]:
    """English text that ships with every CPython: the pydoc topic pages (the language reference, ~465 KB),
    the license, then each stdlib module's docstring; a fresh clone can train offline on it."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError("data.source=embedded: this Python has no pydoc_data; use data.source=local") from None
    for key in sorted(topics):
        yield topics[key]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    license_file = stdlib / "LICENSE.txt"
    if license_file.is_file():
        yield license_file.read_text(encoding="utf-8")
    for path in sorted(stdlib.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
        except (SyntaxError, UnicodeDecodeError):
            continue  # a stdlib file this parser cannot read adds nothing to the corpus
        if doc:
            yield doc


def join_documents(docs: Iterator[str], max_chars: int) -> str:
    """The first documents of a stream joined by blank lines, cut to ``max_chars`` (a page for tokenizer checks)."""
    parts, size = [], 0
    for doc in docs:
        parts.append(doc)
        size += len(doc) + 2
        if size >= max_chars:
            break
    return "\n\n".join(parts)[:max_chars]


# ---------------------------------------------------------------------------------------------------- local


def local_files(path: str | Path) -> list[Path]:
    """The file, or the .txt/.jsonl/.parquet files under a directory (sorted, recursive); a comma-separated list of
    files and directories is read in the order given (the first documents become the val shard)."""
    if isinstance(path, str) and "," in path:
        files = [f for part in path.split(",") if part.strip() for f in local_files(part.strip())]
        duplicated = sorted({str(f) for f in files if files.count(f) > 1})
        if duplicated:
            raise ValueError(f"{duplicated[0]}: listed twice in data.local_path (its documents would repeat)")
        return files
    path = Path(path)
    if path.is_file():
        if base_suffix(path) not in LOCAL_SUFFIXES:
            raise ValueError(f"{path}: data.local_path must end in one of {LOCAL_SUFFIXES} (optionally .gz/.zst)")
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: data.local_path does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file() and base_suffix(p) in LOCAL_SUFFIXES)
    if not files:
        raise ValueError(f"{path}: no {'/'.join(LOCAL_SUFFIXES)} files under data.local_path")
    return files


def local_revision(files: list[Path]) -> str:
    """sha256 over the files' names and contents (identifies the exact local corpus)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def count_local_docs(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    n = 0
    for path in files:
        if base_suffix(path) == ".txt":
            n += 1
        elif path.suffix == ".parquet":
            n += pq.ParquetFile(path).metadata.num_rows
        else:
            with open_text(path) as f:
                n += sum(1 for line in f if line.strip())
    return n


def local_documents(files: list[Path], text_column: str) -> Iterator[str]:
    """.txt: the whole file is one document; .jsonl: one object per line; .parquet: one row per document."""
    for path in files:
        if base_suffix(path) == ".txt":
            yield read_text(path)
        elif base_suffix(path) == ".jsonl":
            yield from _jsonl_documents(path, text_column)
        else:
            yield from _parquet_documents(path, text_column)


def _jsonl_documents(path: Path, text_column: str) -> Iterator[str]:
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict) or not isinstance(row.get(text_column), str):
            raise ValueError(f"{path}:{lineno}: row has no string key {text_column!r} (data.text_column)")
        yield row[text_column]


def _parquet_documents(path: Path, text_column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if text_column not in pf.schema_arrow.names:
        raise ValueError(f"{path}: no column {text_column!r} (data.text_column); columns: {pf.schema_arrow.names}")
    row = 0
    for batch in pf.iter_batches(columns=[text_column], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if not isinstance(text, str):
                raise ValueError(f"{path}: row {row}: {text_column!r} is {type(text).__name__}, not a string")
            row += 1
            yield text


# ---------------------------------------------------------------------------------------------------- HF hub


def resolve_hf_revision(repo: str, revision: str | None) -> str:
    """A commit sha for the dataset repo (a branch/tag name or None = main is resolved through the Hub API)."""
    if revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    from huggingface_hub import HfApi

    try:
        return str(HfApi().dataset_info(repo, revision=revision or "main").sha)
    except Exception as e:  # offline, unknown repo, gated: the message says what to do either way
        raise ValueError(
            f"data.revision: could not resolve {repo}@{revision or 'main'} to a commit "
            f"({type(e).__name__}: {e}); pass data.revision=<40-hex commit sha>"
        ) from None


def hf_num_docs(repo: str, subset: str | None, split: str, revision: str, data_files: str | None) -> int | None:
    """Rows of the split from the dataset card's metadata, for the progress bar's ETA only (None if not listed)."""
    if data_files is not None:
        return None  # the card counts the whole split, not a file subset
    import datasets

    try:
        splits = datasets.load_dataset_builder(repo, name=subset, revision=revision).info.splits
        return int(splits[split].num_examples) if splits and split in splits else None
    except Exception:  # metadata only feeds the ETA; the stream itself reports real errors
        return None


def hf_documents(
    repo: str,
    subset: str | None,
    split: str,
    revision: str | None,
    text_column: str,
    data_files: str | list[str] | None = None,
) -> Iterator[str]:
    """Stream ``text_column`` of an HF dataset without downloading it (``datasets`` streaming), in file order.

    ``repo`` may also be a packaged builder ('parquet', 'json') with ``data_files``: the same code path on local
    files of the same schema.
    """
    import datasets

    # data_files picks the files itself; a subset (config name) on top of it would select a second file list
    name = subset if data_files is None else None
    ds = datasets.load_dataset(repo, name=name, split=split, streaming=True, revision=revision, data_files=data_files)
    if ds.column_names is not None and text_column not in ds.column_names:
        raise ValueError(f"{repo}: no column {text_column!r} (data.text_column); columns: {ds.column_names}")
    for row_index, row in enumerate(ds.select_columns([text_column])):
        text = row[text_column]
        if not isinstance(text, str):
            raise ValueError(f"{repo}: row {row_index}: {text_column!r} is {type(text).__name__}, not a string")
        yield text
