"""Token shards in the llm.c / modded-nanogpt format, and the ``manifest.json`` that versions them.

A shard is a 256 x int32 little-endian header (1024 bytes) followed by uint16 tokens:
header[0] = magic 20240520 (GPT-2 family), header[1] = version 1, header[2] = number of tokens
(llm.c: dev/data/data_common.py ``write_datafile``, llmc/dataloader.h; modded-nanogpt train_gpt.py
``_load_data_shard``). Files are named ``<prefix>_{val,train}_%06d.bin`` and shard 0 is val, so the
pre-tokenized sets (``fineweb_val_000000.bin``, ``finewebedu_train_000001.bin``, ...) load as they are.

``manifest.json`` (written by `phase6 prepare-data`, optional for llm.c sets) records the source, its revision,
the tokenizer, the split rule and, per shard, the token count and sha256; a shard that disagrees with it is an error.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phase6.errors import UserError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAGIC = 20240520
"""llm.c magic for GPT-2-family uint16 token shards (Llama-3's uint32 shards use 20240801, version 7)."""
VERSION = 1
TOKEN_DTYPE = np.dtype("<u2")
MAX_TOKEN_ID = int(np.iinfo(np.uint16).max)
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "phase6-shards/1"
SPLIT_RULE = "shard 0 is val: the first num_val_tokens tokens of the stream; shards 1.. are train"
SPLITS = ("val", "train")
_SHARD_NAME = re.compile(r"(?:^|[_\-.])(val|train)(?:[_\-.]?)(\d+)?\.bin$")


@dataclass
class ShardInfo:
    """One shard as listed in manifest.json."""

    file: str
    """File name relative to the data directory."""
    split: str
    """'val' or 'train'."""
    num_tokens: int
    """Tokens after the header."""
    sha256: str
    """sha256 of the whole file (header + tokens), hex."""


@dataclass
class TokenizerInfo:
    """Which tokenizer produced the token ids."""

    name: str
    """'gpt2' (tiktoken), 'byte' or 'bpe'."""
    vocab_size: int
    """Number of token ids including EOT (GPT-2: 50257)."""
    eot_token: int
    """Document delimiter id, prepended to every document (GPT-2: 50256)."""
    sha256: str = ""
    """sha256 of the tokenizer's defining file(s) (vocab.bpe + encoder.json, tokenizer.json); '' for byte."""
    file: str | None = None
    """Tokenizer file shipped in the data directory (tokenizer.json for bpe), relative to it."""


@dataclass
class Manifest:
    """manifest.json: everything needed to say exactly which tokens a run was trained on."""

    source: str
    """Where the text came from: 'hf:HuggingFaceFW/fineweb-edu/sample-10BT', 'local:/path', 'embedded:cpython-...'."""
    revision: str
    """HF commit sha, sha256 of the local file(s), or the CPython version of the embedded corpus."""
    tokenizer: TokenizerInfo
    split_rule: str = SPLIT_RULE
    doc_delimiter: str = "EOT prepended to each document"
    shard_tokens: int = 0
    """Target tokens per train shard (the last one may be shorter)."""
    num_val_tokens: int = 0
    num_docs: int = 0
    num_tokens: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    format: str = MANIFEST_FORMAT
    created: str = ""
    """UTC time the prep finished, ISO 8601."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @staticmethod
    def from_dict(d: dict[str, Any], path: Path) -> Manifest:
        """Parse a manifest dict; a missing or mistyped key -> ValueError naming the file and key."""

        def need(obj: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
            if key not in obj:
                raise UserError(f"{path}: manifest is missing key {where}{key!r}")
            if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
                raise UserError(f"{path}: manifest key {where}{key!r} has type {type(obj[key]).__name__}")
            return obj[key]

        fmt = need(d, "format", str, "")
        if fmt != MANIFEST_FORMAT:
            raise UserError(f"{path}: manifest format {fmt!r} is not {MANIFEST_FORMAT!r}")
        tok = need(d, "tokenizer", dict, "")
        tokenizer = TokenizerInfo(
            name=need(tok, "name", str, "tokenizer."),
            vocab_size=need(tok, "vocab_size", int, "tokenizer."),
            eot_token=need(tok, "eot_token", int, "tokenizer."),
            sha256=tok.get("sha256", ""),
            file=tok.get("file"),
        )
        shards = []
        for i, s in enumerate(need(d, "shards", list, "")):
            where = f"shards[{i}]."
            if not isinstance(s, dict):
                raise UserError(f"{path}: manifest key shards[{i}] is not an object")
            split = need(s, "split", str, where)
            if split not in SPLITS:
                raise UserError(f"{path}: manifest key {where}split must be one of {SPLITS}, got {split!r}")
            shards.append(
                ShardInfo(
                    need(s, "file", str, where), split, need(s, "num_tokens", int, where), need(s, "sha256", str, where)
                )
            )
        return Manifest(
            source=need(d, "source", str, ""),
            revision=need(d, "revision", str, ""),
            tokenizer=tokenizer,
            split_rule=d.get("split_rule", SPLIT_RULE),
            doc_delimiter=d.get("doc_delimiter", ""),
            shard_tokens=int(d.get("shard_tokens", 0)),
            num_val_tokens=int(d.get("num_val_tokens", 0)),
            num_docs=int(d.get("num_docs", 0)),
            num_tokens=int(d.get("num_tokens", 0)),
            shards=shards,
            format=fmt,
            created=str(d.get("created", "")),
        )


def shard_name(prefix: str, index: int) -> str:
    """llm.c file name of shard ``index``: shard 0 is val."""
    return f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.bin"


def encode_header(num_tokens: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, num_tokens
    return header.tobytes()


def write_shard(path: str | Path, tokens: np.ndarray) -> ShardInfo:
    """Write ``tokens`` (1-D ints in [0, 65535]) as an llm.c shard atomically (tmp file + fsync + os.replace).

    Returns its ShardInfo (split taken from the file name); a reader never sees a half-written shard.
    """
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise UserError(f"{path}: shard tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise UserError(f"{path}: shard tokens must be integers, got dtype {tokens.dtype}")
    if tokens.dtype != TOKEN_DTYPE:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > MAX_TOKEN_ID:
            raise UserError(f"{path}: token ids must be in [0, {MAX_TOKEN_ID}] for uint16 shards, got [{lo}, {hi}]")
        tokens = tokens.astype(TOKEN_DTYPE)
    header = encode_header(tokens.size)
    body = memoryview(np.ascontiguousarray(tokens)).cast("B")
    digest = hashlib.sha256(header)
    digest.update(body)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return ShardInfo(path.name, split_of(path), int(tokens.size), digest.hexdigest())


def read_header(path: str | Path) -> int:
    """Validate the header and file size of a shard; return its token count. Any defect -> ValueError naming it."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UserError(f"{path}: shard file not found") from None
    if size < HEADER_BYTES:
        raise UserError(f"{path}: truncated shard: {size} bytes, the header alone is {HEADER_BYTES}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, num_tokens = int(header[0]), int(header[1]), int(header[2])
    if magic != MAGIC:
        hint = " (20240801 = llm.c Llama-3 uint32 shards, not supported)" if magic == 20240801 else ""
        raise UserError(f"{path}: wrong magic {magic}{hint}; expected {MAGIC} (llm.c GPT-2 uint16 shard)")
    if version != VERSION:
        raise UserError(f"{path}: unsupported shard version {version}; expected {VERSION}")
    expected = HEADER_BYTES + num_tokens * TOKEN_DTYPE.itemsize
    if num_tokens <= 0:
        raise UserError(f"{path}: header says {num_tokens} tokens; a shard holds at least one")
    if size < expected:
        raise UserError(f"{path}: truncated shard: header says {num_tokens} tokens ({expected} bytes), file has {size}")
    if size > expected:
        raise UserError(
            f"{path}: token count mismatch: header says {num_tokens} tokens ({expected} bytes), file has {size} bytes"
        )
    return num_tokens


def read_shard(path: str | Path) -> np.memmap:
    """Memory-map a validated shard's tokens: a read-only uint16 array of shape (num_tokens,)."""
    num_tokens = read_header(path)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(num_tokens,))


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def split_of(path: str | Path) -> str:
    """'val' or 'train' from an llm.c-style file name (``*_val_000000.bin``, ``fineweb_train_000001.bin``)."""
    m = _SHARD_NAME.search(Path(path).name)
    if m is None:
        raise UserError(f"{path}: shard name must contain '_val_' or '_train_' and end in .bin (llm.c naming)")
    return m.group(1)


def _shard_sort_key(path: Path) -> tuple[int, str]:
    m = _SHARD_NAME.search(path.name)
    return (int(m.group(2)) if m and m.group(2) else -1, path.name)


def write_manifest(data_dir: str | Path, manifest: Manifest) -> Path:
    """Write ``data_dir/manifest.json`` atomically."""
    path = Path(data_dir) / MANIFEST_NAME
    atomic_write_text(path, manifest.to_json())
    return path


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_manifest(data_dir: str | Path) -> Manifest | None:
    """Parse ``data_dir/manifest.json``; None when there is none (e.g. a pre-tokenized llm.c set)."""
    path = Path(data_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise UserError(f"{path}: manifest must be a JSON object")
    return Manifest.from_dict(d, path)


def check_shard(path: Path, info: ShardInfo, *, sha256: bool) -> None:
    """A shard must agree with its manifest entry: header token count, and (if ``sha256``) the file hash."""
    num_tokens = read_header(path)
    if num_tokens != info.num_tokens:
        raise UserError(
            f"{path}: manifest mismatch: header has {num_tokens} tokens, manifest.json says {info.num_tokens}"
        )
    if sha256:
        digest = sha256_file(path)
        if digest != info.sha256:
            raise UserError(
                f"{path}: manifest mismatch: sha256 {digest[:16]}... != manifest.json {info.sha256[:16]}..."
            )


def list_shards(data: str | Path, split: str) -> list[Path]:
    """Shard files of ``split`` in order, from a data directory (manifest.json if present, else llm.c file names)
    or a glob pattern such as ``data/fineweb10B/fineweb_train_*.bin``.

    An unfinished prep (progress.json without manifest.json) and a missing split are errors naming the directory.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    pattern = str(data)
    if glob.has_magic(pattern):
        paths = sorted((Path(p) for p in glob.glob(pattern)), key=_shard_sort_key)
        paths = [p for p in paths if split_of(p) == split]
        if not paths:
            raise UserError(f"{pattern}: no {split} shards match this pattern")
        return paths
    data_dir = Path(data)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: data directory not found (run `phase6 prepare-data` first)")
    manifest = load_manifest(data_dir)
    if manifest is not None:
        paths = [data_dir / s.file for s in manifest.shards if s.split == split]
    else:
        if (data_dir / "progress.json").exists():
            raise UserError(f"{data_dir}: prep is unfinished (progress.json, no manifest.json); rerun prepare-data")
        paths = sorted((p for p in data_dir.glob("*.bin") if _SHARD_NAME.search(p.name)), key=_shard_sort_key)
        paths = [p for p in paths if split_of(p) == split]
    if not paths:
        raise UserError(
            f"{data_dir}: no {split} shards (expected *_{split}_NNNNNN.bin or a manifest.json listing them)"
        )
    return paths


def check_manifest_counts(data_dir: Path, manifest: Manifest) -> None:
    """The manifest's totals must add up: num_tokens = the shards' sum, and at least one val and one train shard."""
    where = data_dir / MANIFEST_NAME
    for split in SPLITS:
        if not any(s.split == split for s in manifest.shards):
            raise UserError(f"{where}: manifest lists no {split} shard")
    total = sum(s.num_tokens for s in manifest.shards)
    if manifest.num_tokens and manifest.num_tokens != total:
        raise UserError(f"{where}: manifest num_tokens is {manifest.num_tokens} but its shards hold {total}")


def default_hash_workers(world_size: int = 1) -> int:
    """Threads hashing shards on one process: the node's cores shared by its ranks, at most 16 (hashlib releases
    the GIL on large buffers, so threads scale until the disk is the bound)."""
    return max(1, min(16, (os.cpu_count() or 1) // max(1, world_size)))


def verify_shards(
    data_dir: str | Path,
    *,
    sha256: bool = True,
    workers: int | None = None,
    part: tuple[int, int] = (0, 1),
) -> Manifest | None:
    """Check every shard in a data directory: header, size, and against manifest.json (token count, sha256).

    Headers and the manifest's counts are checked for every shard (cheap); sha256 is computed for the shards of
    ``part`` = (index, count) (shard i when i % count == index, so the ranks of a job share the hashing), on
    ``workers`` threads. Returns the manifest (None for a manifest-less llm.c set, whose headers are still checked).
    """
    from concurrent.futures import ThreadPoolExecutor

    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    if manifest is None:
        for split in SPLITS:
            for path in list_shards(data_dir, split):
                read_header(path)
        return None
    check_manifest_counts(data_dir, manifest)
    for info in manifest.shards:
        check_shard(data_dir / info.file, info, sha256=False)
    if sha256:
        mine = [info for i, info in enumerate(manifest.shards) if i % part[1] == part[0]]
        with ThreadPoolExecutor(workers or default_hash_workers(part[1])) as pool:
            digests = list(pool.map(lambda info: sha256_file(data_dir / info.file), mine))
        for info, digest in zip(mine, digests, strict=True):  # the first bad shard in manifest order
            if digest != info.sha256:
                raise UserError(
                    f"{data_dir / info.file}: manifest mismatch: sha256 {digest[:16]}... != manifest.json "
                    f"{info.sha256[:16]}... (corrupt or modified shard)"
                )
    return manifest
