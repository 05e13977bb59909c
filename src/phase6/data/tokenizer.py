"""Tokenizers for pretraining shards: GPT-2 BPE (tiktoken), bytes, or a BPE trained here with `tokenizers`.

Every tokenizer encodes *ordinary* text: a literal ``<|endoftext|>`` inside a document is text, never the EOT
id, which only the prep inserts (prepended to each document, as llm.c and build-nanogpt do). ``decode`` drops
EOT ids, so ``decode(encode(text)) == text`` byte for byte is the contract `check_tokenizer` verifies.

GPT-2 offline: tiktoken reads ``$TIKTOKEN_CACHE_DIR/<sha1 of the file's URL>``; `install_gpt2_bpe` copies
encoder.json and vocab.bpe from a local directory there after checking the sha256 tiktoken pins.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
# tiktoken 0.14 tiktoken_ext/openai_public.py gpt2(): file URL -> pinned sha256 (also in
# shared/data/gpt2-tokenizer/PROVENANCE.md, which lists the same hashes).
GPT2_BPE_FILES: dict[str, tuple[str, str]] = {
    "vocab.bpe": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ),
    "encoder.json": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
}
BYTE_EOT = 256
BPE_FILE = "tokenizer.json"


class Tokenizer(Protocol):
    """What prep, the trainer and the eval need from a tokenizer."""

    name: str
    vocab_size: int
    """Token ids are in [0, vocab_size), EOT included."""
    eot_token: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ordinary text (no special-token parsing, no EOT)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; EOT ids are dropped."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOT = 256: works everywhere, ~1 byte/token."""

    name = "byte"
    vocab_size = 257
    eot_token = BYTE_EOT

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i != BYTE_EOT).decode("utf-8", errors="replace")


class TiktokenGPT2:
    """OpenAI GPT-2 BPE through tiktoken (50257 ids, EOT 50256)."""

    name = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    eot_token = GPT2_EOT

    def __init__(self, tokenizer_dir: str | Path | None = None) -> None:
        import tiktoken

        if tokenizer_dir is not None:
            install_gpt2_bpe(tokenizer_dir)
        try:
            self._enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken raises requests/OS errors when offline without a cache
            raise ValueError(
                f"GPT-2 BPE files unavailable ({type(e).__name__}: {e}); set data.tokenizer_dir to a directory with "
                "encoder.json and vocab.bpe (e.g. shared/data/gpt2-tokenizer) or use data.tokenizer=byte"
            ) from None
        assert self._enc.eot_token == GPT2_EOT and self._enc.n_vocab == GPT2_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode([i for i in ids if i != GPT2_EOT])

    def sha256(self) -> str:
        """sha256 over the two pinned BPE files' hashes (identifies the GPT-2 vocabulary, not a local copy)."""
        return hashlib.sha256("".join(h for _, h in GPT2_BPE_FILES.values()).encode()).hexdigest()


class BPETokenizer:
    """Byte-level BPE trained locally with `tokenizers`; EOT is the id after the trained vocabulary."""

    name = "bpe"

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"{self.path}: BPE tokenizer file not found")
        self._tok = HFTokenizer.from_file(str(self.path))
        # EOT is not a `tokenizers` special token: those are matched inside text, and documents are ordinary text.
        self.eot_token = self._tok.get_vocab_size(with_added_tokens=True)
        self.vocab_size = self.eot_token + 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([i for i in ids if i != self.eot_token], skip_special_tokens=False)

    def sha256(self) -> str:
        return file_sha256(self.path)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tiktoken_cache_dir() -> Path:
    """The directory tiktoken reads cached files from (its own resolution order in tiktoken.load)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _cache_name(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()


def gpt2_bpe_cached() -> bool:
    """True when tiktoken's cache already holds both GPT-2 files with the pinned hashes (no network needed)."""
    cache = tiktoken_cache_dir()
    for url, sha in GPT2_BPE_FILES.values():
        path = cache / _cache_name(url)
        if not path.is_file() or file_sha256(path) != sha:
            return False
    return True


def install_gpt2_bpe(tokenizer_dir: str | Path) -> Path:
    """Copy encoder.json + vocab.bpe from ``tokenizer_dir`` into tiktoken's cache (checked against tiktoken's
    pinned sha256) and point ``TIKTOKEN_CACHE_DIR`` at it, so ``tiktoken.get_encoding("gpt2")`` works offline."""
    src = Path(tokenizer_dir)
    for fname, (_, sha) in GPT2_BPE_FILES.items():
        path = src / fname
        if not path.is_file():
            raise ValueError(
                f"{path}: GPT-2 BPE file not found (data.tokenizer_dir must hold encoder.json and vocab.bpe)"
            )
        if file_sha256(path) != sha:
            raise ValueError(f"{path}: sha256 differs from the GPT-2 file tiktoken pins ({sha[:16]}...)")
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(Path.home() / ".cache" / "phase6" / "tiktoken")
    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    for fname, (url, sha) in GPT2_BPE_FILES.items():
        dst = cache / _cache_name(url)
        if not dst.is_file() or file_sha256(dst) != sha:
            tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
            shutil.copyfile(src / fname, tmp)
            os.replace(tmp, dst)
    return cache


def gpt2_available(tokenizer_dir: str | Path | None) -> bool:
    """Whether GPT-2 BPE can be built without the network: from ``tokenizer_dir`` or tiktoken's cache."""
    if tokenizer_dir is not None:
        return all((Path(tokenizer_dir) / f).is_file() for f in GPT2_BPE_FILES)
    return gpt2_bpe_cached()


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | Path) -> BPETokenizer:
    """Train a byte-level BPE (GPT-2 pre-tokenizer regex, 256 byte symbols + merges) and save it to ``path``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not 257 <= vocab_size < 65535:
        raise ValueError(f"bpe vocab_size must be in [257, 65535), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return BPETokenizer(path)


def load_tokenizer(name: str, path: str | Path | None = None) -> Tokenizer:
    """Build a tokenizer by name: 'gpt2' (``path`` = dir with the BPE files, or None), 'byte', 'bpe' (``path`` =
    tokenizer.json)."""
    if name == "gpt2":
        return TiktokenGPT2(path)
    if name == "byte":
        return ByteTokenizer()
    if name == "bpe":
        if path is None:
            raise ValueError("tokenizer 'bpe' needs the path of its tokenizer.json")
        return BPETokenizer(path)
    raise ValueError(f"unknown tokenizer {name!r}; expected gpt2, byte or bpe")


def load_data_tokenizer(data_dir: str | Path) -> Tokenizer:
    """The tokenizer that produced a prepared data directory (from its manifest.json), e.g. to decode samples."""
    from phase6.data.shards import MANIFEST_NAME, load_manifest

    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    if manifest is None:
        raise ValueError(f"{data_dir / MANIFEST_NAME}: not found; cannot tell which tokenizer made these shards")
    info = manifest.tokenizer
    path: Path | None = data_dir / info.file if info.file else None
    tok = load_tokenizer(info.name, path)
    if (tok.vocab_size, tok.eot_token) != (info.vocab_size, info.eot_token):
        raise ValueError(
            f"{data_dir / MANIFEST_NAME}: tokenizer {info.name} has vocab {tok.vocab_size} / EOT "
            f"{tok.eot_token}, manifest says {info.vocab_size} / {info.eot_token}"
        )
    return tok


def encode_document(tok: Tokenizer, text: str) -> np.ndarray:
    """One document's uint16 tokens with EOT prepended (llm.c dev/data/fineweb.py ``tokenize``)."""
    ids = tok.encode(text)
    out = np.empty(len(ids) + 1, dtype=np.uint16)
    out[0] = tok.eot_token
    out[1:] = ids
    return out


@dataclass
class TokenizerCheck:
    """Result of a byte-exact round trip of a text through a tokenizer."""

    tokenizer: str
    source: str
    """What text was checked (file or source label)."""
    num_bytes: int
    num_tokens: int

    @property
    def bytes_per_token(self) -> float:
        return self.num_bytes / max(self.num_tokens, 1)


def check_tokenizer(tok: Tokenizer, text: str, source: str = "text") -> TokenizerCheck:
    """Encode then decode ``text``; the bytes must come back identical (else ValueError at the first difference)."""
    if not text:
        raise ValueError(f"{source}: empty text, nothing to check")
    ids = tok.encode(text)
    if any(i == tok.eot_token or not 0 <= i < tok.vocab_size for i in ids):
        raise ValueError(f"{source}: {tok.name} produced an EOT or out-of-range id for ordinary text")
    original, back = text.encode("utf-8"), tok.decode(ids).encode("utf-8")
    if back != original:
        at = next(
            (i for i, (a, b) in enumerate(zip(original, back, strict=False)) if a != b), min(len(original), len(back))
        )
        raise ValueError(
            f"{source}: {tok.name} round trip differs at byte {at}: {original[at : at + 20]!r} -> "
            f"{back[at : at + 20]!r} ({len(original)} -> {len(back)} bytes)"
        )
    return TokenizerCheck(tok.name, source, len(original), len(ids))
