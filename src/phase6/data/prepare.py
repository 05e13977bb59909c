"""Tokenize a document stream into llm.c shards (shard 0 = val) with manifest.json; a killed prep resumes.

Layout (llm.c dev/data/fineweb.py): the documents, each as [EOT] + tokens, form one token stream; shard 0 holds
its first ``num_val_tokens`` tokens, shards 1.. the next ``shard_tokens`` each (the last may be shorter); a
document that does not fit continues in the next shard.

Resume: after each shard is written (atomically) ``progress.json`` records where the stream stands: the index
of the first document not completely written and how many of its tokens are already in shards. A restarted prep
checks that the config and source revision are the same, skips that many documents, drops that many tokens of
the next one and carries on, so shards come out identical to an uninterrupted prep. Only completed shards count;
a shard written but not yet recorded is simply rewritten with the same bytes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from phase6.config.data import DataConfig
from phase6.data.shards import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    TokenizerInfo,
    atomic_write_text,
    check_shard,
    load_manifest,
    shard_name,
    verify_shards,
    write_manifest,
    write_shard,
)
from phase6.data.sources import Source, join_documents, resolve_source
from phase6.data.tokenizer import (
    BPE_FILE,
    BPETokenizer,
    TiktokenGPT2,
    Tokenizer,
    TokenizerCheck,
    check_tokenizer,
    encode_document,
    gpt2_available,
    load_tokenizer,
    train_bpe,
)
from phase6.timing import wall

PROGRESS_NAME = "progress.json"
CHECK_CHARS = 200_000


@dataclass
class ShardProgress:
    """A completed shard and the stream position right after it."""

    shard: ShardInfo
    next_doc: int
    """Index of the first document not completely written to shards 0..this one."""
    doc_offset: int
    """Tokens of document ``next_doc`` (EOT included) already written."""
    total_tokens: int
    """Tokens in shards 0..this one."""


@dataclass
class Progress:
    """progress.json: the prep's identity and its completed shards."""

    fingerprint: dict[str, Any]
    shards: list[ShardProgress] = field(default_factory=list)
    done: bool = False

    def save(self, out_dir: Path) -> None:
        atomic_write_text(out_dir / PROGRESS_NAME, json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def load(out_dir: Path) -> Progress | None:
        path = out_dir / PROGRESS_NAME
        if not path.exists():
            return None
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            shards = [
                ShardProgress(ShardInfo(**s["shard"]), s["next_doc"], s["doc_offset"], s["total_tokens"])
                for s in d["shards"]
            ]
            return Progress(d["fingerprint"], shards, d["done"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path}: unreadable prep progress ({type(e).__name__}: {e}); delete data.out_dir to start over"
            ) from None


def resolve_tokenizer_name(cfg: DataConfig) -> str:
    """'auto' -> 'gpt2' when GPT-2's BPE files are available offline (tokenizer_dir or tiktoken cache), else 'byte'."""
    if cfg.tokenizer != "auto":
        return cfg.tokenizer
    return "gpt2" if gpt2_available(cfg.tokenizer_dir) else "byte"


def build_prep_tokenizer(
    cfg: DataConfig, name: str, source: Source, out_dir: Path, *, train: bool
) -> tuple[Tokenizer, str | None]:
    """The tokenizer for this prep and the path its worker processes load it from.

    tokenizer=bpe is trained by a fresh prep (``train``; a leftover file is overwritten) and saved in out_dir; a
    resumed prep reuses that file, whose sha256 the progress fingerprint pins.
    """
    if name == "gpt2":
        return TiktokenGPT2(cfg.tokenizer_dir), cfg.tokenizer_dir
    if name == "byte":
        return load_tokenizer("byte"), None
    path = out_dir / BPE_FILE
    if train:
        train_bpe(islice(source.documents(), cfg.bpe_train_docs), cfg.bpe_vocab_size, path)
    elif not path.exists():
        raise ValueError(
            f"{path}: missing, but {out_dir / PROGRESS_NAME} says this prep trained it; start over in "
            "an empty data.out_dir"
        )
    return BPETokenizer(path), str(path)


def tokenizer_info(tok: Tokenizer) -> TokenizerInfo:
    sha = tok.sha256() if isinstance(tok, TiktokenGPT2 | BPETokenizer) else ""
    return TokenizerInfo(tok.name, tok.vocab_size, tok.eot_token, sha, BPE_FILE if tok.name == "bpe" else None)


def fingerprint(cfg: DataConfig, source: Source, tok: TokenizerInfo) -> dict[str, Any]:
    """Everything that decides the bytes of the shards; a resume must match it exactly."""
    return {
        "name": cfg.name,
        "source": source.label,
        "revision": source.revision,
        "split": cfg.split,
        "text_column": cfg.text_column,
        "tokenizer": asdict(tok),
        "shard_tokens": cfg.shard_tokens,
        "num_val_tokens": cfg.num_val_tokens,
        "max_docs": cfg.max_docs,
        "max_tokens": cfg.max_tokens,
        "bpe": {"vocab_size": cfg.bpe_vocab_size, "train_docs": cfg.bpe_train_docs} if tok.name == "bpe" else None,
    }


_worker_tok: Tokenizer | None = None


def _init_worker(name: str, path: str | None) -> None:
    global _worker_tok
    _worker_tok = load_tokenizer(name, path)


def _encode_chunk(texts: list[str]) -> list[np.ndarray]:
    assert _worker_tok is not None, "worker initializer did not run"
    return [encode_document(_worker_tok, text) for text in texts]


class _Stats:
    """Progress display (rich): documents, tokens, tokens/s, shard, elapsed and ETA, or nothing.

    The bar counts tokens when their total is known (max_tokens), else documents when theirs is (max_docs, local
    files, HF split metadata); with neither it shows counts and rate without an ETA.
    """

    def __init__(
        self, enabled: bool, total_docs: int | None, total_tokens: int | None, start_docs: int, start_tokens: int
    ) -> None:
        self.t0 = wall()
        self.start_tokens = start_tokens
        self.by_tokens = total_tokens is not None
        self.progress = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]prep"),
                BarColumn(),
                TextColumn("{task.fields[docs]:,} docs"),
                TextColumn("{task.fields[tokens]:,} tok"),
                TextColumn("{task.fields[tok_s]:,.0f} tok/s"),
                TextColumn("{task.fields[shard]} shards"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            total, done = (total_tokens, start_tokens) if self.by_tokens else (total_docs, start_docs)
            self.task = self.progress.add_task(
                "prep", total=total, completed=done, docs=start_docs, tokens=start_tokens, tok_s=0.0, shard=0
            )
            self.progress.start()

    def update(self, docs: int, tokens: int, shard: int) -> None:
        if self.progress is not None:
            rate = (tokens - self.start_tokens) / max(wall() - self.t0, 1e-9)
            done = tokens if self.by_tokens else docs
            self.progress.update(self.task, completed=done, docs=docs, tokens=tokens, tok_s=rate, shard=shard)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _tokenized(
    docs: Iterable[str], tok: Tokenizer, name: str, path: str | None, num_workers: int, chunk_size: int
) -> Iterator[np.ndarray]:
    """[EOT] + tokens per document, in document order; spread over worker processes when num_workers > 0.

    At most ``4 * num_workers`` chunks are in flight, so memory stays bounded on a 10B-token stream (Pool.imap
    would queue results without limit), and a worker that dies raises BrokenProcessPool instead of hanging.
    """
    if num_workers == 0:
        for text in docs:
            yield encode_document(tok, text)
        return
    # spawn, not fork: the parent may hold threads (pyarrow, datasets streaming) that fork would copy mid-lock.
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(num_workers, mp_context=ctx, initializer=_init_worker, initargs=(name, path)) as pool:
        it = iter(docs)
        pending: deque[Future[list[np.ndarray]]] = deque()

        def submit() -> None:
            chunk = list(islice(it, chunk_size))
            if chunk:
                pending.append(pool.submit(_encode_chunk, chunk))

        try:
            for _ in range(4 * num_workers):
                submit()
            while pending:
                done = pending.popleft().result()
                submit()
                yield from done
        finally:  # stopped early (max_tokens, an error): drop queued chunks instead of tokenizing them
            pool.shutdown(wait=True, cancel_futures=True)


def prepare_shards(
    cfg: DataConfig, *, show_progress: bool = True, on_shard: Callable[[ShardInfo], None] | None = None
) -> Manifest:
    """Write (or finish, or confirm) the shards of ``cfg`` in ``cfg.out_dir`` and return their manifest.

    ``on_shard`` is called after each shard is written and recorded in progress.json (progress hook).
    """
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress.load(out_dir)
    if progress is None and ((out_dir / MANIFEST_NAME).exists() or any(out_dir.glob("*.bin"))):
        # e.g. a downloaded llm.c set (kjj0/finewebedu10B-gpt2): the trainer reads it as it is; never overwrite it
        raise ValueError(
            f"{out_dir}: holds shards no prep recorded (no progress.json); a pre-tokenized set is used "
            "as it is, or choose an empty data.out_dir"
        )
    source = resolve_source(cfg)
    tok_name = resolve_tokenizer_name(cfg)
    tok, tok_path = build_prep_tokenizer(cfg, tok_name, source, out_dir, train=progress is None)
    info = tokenizer_info(tok)
    fp = fingerprint(cfg, source, info)

    if progress is None:
        progress = Progress(fp)
        progress.save(out_dir)  # from here on a rerun resumes (and reuses a trained BPE)
    else:
        _check_same(fp, progress.fingerprint, out_dir / PROGRESS_NAME)
        if progress.done:
            manifest = load_manifest(out_dir)
            if manifest is None:
                raise ValueError(f"{out_dir / PROGRESS_NAME}: says done but {MANIFEST_NAME} is missing")
            return manifest
        for sp in progress.shards:  # completed shards must be intact: they are not rewritten
            check_shard(out_dir / sp.shard.file, sp.shard, sha256=True)
    _remove_strays(out_dir, cfg.name, len(progress.shards))

    done_tokens = progress.shards[-1].total_tokens if progress.shards else 0
    doc_index = progress.shards[-1].next_doc if progress.shards else 0
    skip = progress.shards[-1].doc_offset if progress.shards else 0  # tokens of doc_index already in shards
    remaining = cfg.max_tokens - done_tokens if cfg.max_tokens is not None else sys.maxsize
    num_workers = cfg.num_workers if cfg.num_workers is not None else max(1, (os.cpu_count() or 2) // 2)
    stats = _Stats(show_progress, cfg.max_docs or source.num_docs, cfg.max_tokens, doc_index, done_tokens)

    def capacity(index: int) -> int:
        return cfg.num_val_tokens if index == 0 else cfg.shard_tokens

    buf = np.empty(capacity(len(progress.shards)), dtype=np.uint16)
    fill = 0

    def flush(next_doc: int, doc_offset: int) -> None:
        nonlocal buf, fill, done_tokens
        index = len(progress.shards)
        shard = write_shard(out_dir / shard_name(cfg.name, index), buf[:fill])
        done_tokens += fill
        progress.shards.append(ShardProgress(shard, next_doc, doc_offset, done_tokens))
        progress.save(out_dir)  # only now does the shard count: a kill before this line rewrites it
        if on_shard is not None:
            on_shard(shard)
        buf, fill = np.empty(capacity(index + 1), dtype=np.uint16), 0

    try:
        if remaining > 0:
            docs = islice(source.documents(), doc_index, cfg.max_docs)
            for tokens in _tokenized(docs, tok, tok_name, tok_path, num_workers, cfg.chunk_size):
                while remaining > 0:  # copy this document into shards, flushing each shard when full
                    take = min(len(tokens) - skip, len(buf) - fill, remaining)
                    buf[fill : fill + take] = tokens[skip : skip + take]
                    fill, skip, remaining = fill + take, skip + take, remaining - take
                    doc_done = skip == len(tokens)
                    if doc_done:
                        doc_index, skip = doc_index + 1, 0
                    if fill == len(buf):
                        flush(doc_index, skip)
                    if doc_done:
                        break
                if doc_index % 256 == 0:  # the bar needs no per-document refresh on a 10M-document stream
                    stats.update(doc_index, done_tokens + fill, len(progress.shards))
                if remaining == 0:
                    break
        if fill:
            flush(doc_index, skip)
        stats.update(doc_index, done_tokens, len(progress.shards))
    finally:
        stats.close()

    if len(progress.shards) < 2:
        raise ValueError(
            f"{out_dir}: the source gave {done_tokens} tokens, not more than data.num_val_tokens="
            f"{cfg.num_val_tokens}, so there is no train shard; lower data.num_val_tokens"
        )
    final = progress.shards[-1]
    manifest = Manifest(
        source=source.label,
        revision=source.revision,
        tokenizer=info,
        shard_tokens=cfg.shard_tokens,
        num_val_tokens=cfg.num_val_tokens,
        num_docs=final.next_doc + (1 if final.doc_offset else 0),
        num_tokens=final.total_tokens,
        shards=[sp.shard for sp in progress.shards],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    write_manifest(out_dir, manifest)
    progress.done = True
    progress.save(out_dir)
    return manifest


def _check_same(now: dict[str, Any], before: dict[str, Any], path: Path) -> None:
    for key in sorted(set(now) | set(before)):
        if now.get(key) != before.get(key):
            raise ValueError(
                f"{path}: cannot resume: {key} was {before.get(key)!r}, now {now.get(key)!r}; "
                "use the same config or another data.out_dir"
            )


def _remove_strays(out_dir: Path, prefix: str, num_done: int) -> None:
    """Delete half-written tmp files and shards written after the last recorded one (they are redone)."""
    for p in out_dir.glob("*.tmp"):
        p.unlink()
    for p in out_dir.glob(f"{prefix}_*_*.bin"):
        if p.name == shard_name(prefix, int(p.stem.rsplit("_", 1)[1])) and int(p.stem.rsplit("_", 1)[1]) >= num_done:
            p.unlink()


def ensure_prepared(cfg: DataConfig, *, show_progress: bool = True) -> Manifest | None:
    """What a trainer calls before loading: the manifest of ``cfg.out_dir`` when it is already prepared,
    None for a pre-tokenized llm.c set without a manifest, else run (or finish) the prep first.

    A finished directory is taken as it is (no source or network access); its tokenizer must match data.tokenizer.
    """
    out_dir = Path(cfg.out_dir)
    progress = Progress.load(out_dir) if out_dir.is_dir() else None
    manifest = load_manifest(out_dir) if out_dir.is_dir() else None
    if manifest is not None and (progress is None or progress.done):
        if cfg.tokenizer != "auto" and manifest.tokenizer.name != cfg.tokenizer:
            raise ValueError(
                f"{out_dir / MANIFEST_NAME}: shards use tokenizer {manifest.tokenizer.name!r} but "
                f"data.tokenizer={cfg.tokenizer!r}; use another data.out_dir"
            )
        return manifest
    if manifest is None and progress is None and out_dir.is_dir() and any(out_dir.glob("*_val_*.bin")):
        return None  # llm.c / modded-nanogpt pre-tokenized shards (GPT-2 ids); headers are checked on load
    return prepare_shards(cfg, show_progress=show_progress)


def tokenizer_check(cfg: DataConfig, text_path: str | None = None) -> TokenizerCheck:
    """Round-trip an English page byte for byte through the configured tokenizer; report bytes/token.

    The page is ``text_path`` or the source's first documents (200,000 chars). tokenizer=bpe uses
    the tokenizer.json a prep already trained in data.out_dir.
    """
    name = resolve_tokenizer_name(cfg)
    if name == "bpe":
        path = Path(cfg.out_dir) / BPE_FILE
        if not path.exists():
            raise ValueError(f"{path}: no trained BPE yet; run prepare-data first (it trains and saves it)")
        tok: Tokenizer = BPETokenizer(path)
    elif name == "gpt2":
        tok = TiktokenGPT2(cfg.tokenizer_dir)
    else:
        tok = load_tokenizer(name)
    if text_path is not None:
        p = Path(text_path)
        if not p.is_file():
            raise ValueError(f"{p}: check_text file not found")
        try:
            text, label = p.read_text(encoding="utf-8"), str(p)
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not UTF-8 text ({e})") from None
    else:
        source = resolve_source(cfg)
        text, label = join_documents(source.documents(), CHECK_CHARS), f"{source.label} (first {CHECK_CHARS:,} chars)"
    return check_tokenizer(tok, text, label)


def verify(out_dir: str | Path) -> Manifest:
    """Re-read every shard of a finished prep: header, token count and sha256 against manifest.json."""
    manifest = verify_shards(out_dir, sha256=True)
    if manifest is None:
        raise ValueError(f"{Path(out_dir) / MANIFEST_NAME}: not found")
    return manifest
