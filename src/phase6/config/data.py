"""Typed config of token data: where the text comes from, how it is tokenized and sharded, where shards live.

``DataConfig`` is the Hydra group ``data`` of two jobs: its presets live in ``configs/prepare_data/data/*.yaml``
and ``configs/pretrain/data`` links to the same folder (job-specific groups, so DPO's own ``data`` group does not
see them). `phase6 prepare-data` writes shards into ``out_dir`` and `phase6 pretrain` reads them from the same
place, so one ``data=<preset>`` override selects both.
``PrepareDataRunConfig`` is the root of the `phase6 prepare-data` job (``configs/prepare_data.yaml``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from phase6.config import HardwareConfig, LoggerConfig, RunConfig, require

SOURCES = ("embedded", "local", "hf", "fineweb-edu", "fineweb")
TOKENIZERS = ("gpt2", "byte", "bpe", "auto")
LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")

# HF dataset presets the 6A anchors are defined on (reference/anchors-6a-pretrain.md §0-§2).
HF_PRESETS: dict[str, tuple[str, str]] = {
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
    "fineweb": ("HuggingFaceFW/fineweb", "sample-10BT"),
}


@dataclass
class DataConfig:
    """Token shards: their source text, tokenizer and shard layout (prep writes them, the trainer reads them)."""

    name: str = "embedded"
    """Preset name, used as the shard file prefix (``<name>_val_000000.bin``) and in run names."""
    source: str = "embedded"
    """'embedded' (CPython's own docs, offline), 'local' (local_path), 'hf' (dataset), 'fineweb-edu', 'fineweb'."""
    dataset: str | None = None
    """HF dataset repo for source=hf; fineweb-edu / fineweb fill it (HuggingFaceFW/...)."""
    subset: str | None = None
    """HF dataset config name (subset), e.g. 'sample-10BT'; fineweb-edu / fineweb default to sample-10BT."""
    data_files: str | None = None
    """HF ``data_files``: a subset of the repo's files (e.g. 'sample/10BT/000_00000.parquet'), or with
    dataset=parquet|json a local file/glob of the same schema (the streaming code path, offline)."""
    split: str = "train"
    """HF split streamed from (the val shard is cut from the head of this stream, as in llm.c)."""
    revision: str | None = None
    """HF commit to stream; None = resolve the current head to its commit sha and record it in manifest.json."""
    local_path: str | None = None
    """source=local: a .txt (one document per file), .jsonl or .parquet file, a directory of them, or a comma-separated
    list of those (read in that order; the first documents fill the val shard)."""
    text_column: str = "text"
    """Column / JSON key holding the document text (.jsonl, .parquet, HF)."""
    out_dir: str = "data/embedded-byte"
    """Directory of the shards, manifest.json and prep progress; the trainer's data directory."""
    tokenizer: str = "byte"
    """'gpt2' (tiktoken, EOT 50256), 'byte' (256 bytes + EOT 256), 'bpe' (trained here on the source), 'auto'."""
    tokenizer_dir: str | None = None
    """Directory with GPT-2's encoder.json + vocab.bpe for offline tiktoken; None = tiktoken's own cache/download."""
    bpe_vocab_size: int = 4096
    """tokenizer=bpe: merges vocabulary size including the 256 byte tokens (EOT is one more id)."""
    bpe_train_docs: int = 20000
    """tokenizer=bpe: documents from the head of the source used to train the BPE."""
    shard_tokens: int = 100_000_000
    """Tokens per train shard (llm.c / build-nanogpt default 1e8 = 200 MB of uint16)."""
    num_val_tokens: int = 65_536
    """Tokens of shard 0 (val), cut from the head of the stream; llm.c uses a full 1e8-token shard."""
    num_workers: int | None = None
    """Tokenizer worker processes; None = cpu_count // 2 (llm.c's fineweb.py); 0 = tokenize in-process."""
    chunk_size: int = 16
    """Documents per task sent to a tokenizer worker process."""
    max_docs: int | None = None
    """Stop after this many documents (None = whole source)."""
    max_tokens: int | None = None
    """Stop after exactly this many tokens in all shards together (None = whole source)."""

    def __post_init__(self) -> None:
        require(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.\-]*", self.name) is not None,
            "data.name",
            f"must be letters, digits, '.', '-' (it prefixes shard files; '_' separates the split), got {self.name!r}",
        )
        require(self.source in SOURCES, "data.source", f"must be one of {SOURCES}, got {self.source!r}")
        require(self.tokenizer in TOKENIZERS, "data.tokenizer", f"must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if self.source == "local":
            require(bool(self.local_path), "data.local_path", "is required when data.source=local")
        else:
            require(
                self.local_path is None,
                "data.local_path",
                f"is only used with data.source=local, got {self.local_path!r}",
            )
        if self.source == "hf":
            require(bool(self.dataset), "data.dataset", "is required when data.source=hf (an HF dataset repo)")
        require(bool(self.out_dir), "data.out_dir", "must be a directory path")
        require(bool(self.text_column), "data.text_column", "must be a non-empty column name")
        require(self.shard_tokens >= 2, "data.shard_tokens", f"must be >= 2, got {self.shard_tokens}")
        require(self.num_val_tokens >= 2, "data.num_val_tokens", f"must be >= 2, got {self.num_val_tokens}")
        require(
            257 <= self.bpe_vocab_size < 65535,
            "data.bpe_vocab_size",
            f"must be in [257, 65535) (256 bytes + merges; uint16 shards), got {self.bpe_vocab_size}",
        )
        require(self.bpe_train_docs >= 1, "data.bpe_train_docs", f"must be >= 1, got {self.bpe_train_docs}")
        require(
            self.num_workers is None or self.num_workers >= 0,
            "data.num_workers",
            f"must be >= 0 or null, got {self.num_workers}",
        )
        require(self.chunk_size >= 1, "data.chunk_size", f"must be >= 1, got {self.chunk_size}")
        require(
            self.max_docs is None or self.max_docs >= 1, "data.max_docs", f"must be >= 1 or null, got {self.max_docs}"
        )
        require(
            self.max_tokens is None or self.max_tokens >= 2,
            "data.max_tokens",
            f"must be >= 2 or null, got {self.max_tokens}",
        )

    def hf_dataset(self) -> tuple[str, str | None]:
        """(repo, subset) streamed for source in hf / fineweb-edu / fineweb."""
        if self.source in HF_PRESETS:
            repo, subset = HF_PRESETS[self.source]
            return self.dataset or repo, self.subset or subset
        assert self.source == "hf", self.source
        assert self.dataset is not None
        return self.dataset, self.subset


@dataclass
class PrepareDataRunConfig:
    """`phase6 prepare-data`: tokenize a corpus into llm.c-format shards (shard 0 = val) with a manifest."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    data: DataConfig = field(default_factory=DataConfig)
    check_tokenizer: bool = False
    """Only round-trip an English page through the tokenizer byte for byte and report bytes/token; write nothing."""
    check_text: str | None = None
    """Text file for check_tokenizer; None = the source's first document(s), CPython's docs for embedded."""
    verify: bool = True
    """After prep (or when shards already exist) re-read every shard and check header, token count and sha256."""
