"""Token batch loaders for pretraining: sequential over llm.c shards (train / val), and synthetic tokens.

`ShardLoader` is llm.c's / build-nanogpt's distributed sequential loader: every global step takes the next
B*T*world (+1) tokens of the current shard, rank r reading the window at offset r*B*T; when the next step
would run past the shard's end it moves to the next shard (after the last, back to the first: a new epoch).
Its ``state_dict()`` (shard index + position of the next global step) restores the exact next batch, and does
not depend on the rank, so rank 0's checkpoint resumes every rank.

    train = ShardLoader("data/fineweb_edu-gpt2", "train", batch_size=16, seq_len=1024, rank=rank, world_size=world)
    x, y = train.next_batch()             # (B, T) int64 each, y = x shifted by one token
    val = ValLoader("data/fineweb_edu-gpt2", 16, 1024, num_tokens=10 * 2**20, rank=rank, world_size=world)
    for x, y in val: ...                  # the same fixed tokens of shard 0 on every call
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from phase6.data.shards import list_shards, load_manifest, read_header, read_shard, sha256_file
from phase6.errors import UserError

# (path, size, mtime_ns) of shards whose sha256 matched manifest.json in this process: hash each file once.
_VERIFIED: set[tuple[str, int, int]] = set()


class TokenLoader(Protocol):
    """What the trainer needs from a batch source."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, T) int64 on CPU; y[:, t] is the token after x[:, t]."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def mark_verified(paths: list[Path]) -> None:
    """Record shards whose sha256 a pre-flight check (``shards.verify_shards``) already matched: not hashed again."""
    for path in paths:
        st = path.stat()
        _VERIFIED.add((str(path.resolve()), st.st_size, st.st_mtime_ns))


def _check_geometry(batch_size: int, seq_len: int, rank: int, world_size: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")


class ShardLoader:
    """Distributed sequential loader over the ``split`` shards of a data directory (or a shard glob)."""

    def __init__(
        self,
        data: str | Path,
        split: str,
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        verify_sha256: bool = True,
    ) -> None:
        _check_geometry(batch_size, seq_len, rank, world_size)
        self.paths = list_shards(data, split)
        self.B, self.T, self.rank, self.world_size = batch_size, seq_len, rank, world_size
        self.split = split
        manifest = load_manifest(data) if Path(data).is_dir() else None
        # sha256 is checked against manifest.json the first time each shard is opened (~0.1 s per 200 MB shard)
        self._expected = {s.file: s for s in manifest.shards} if manifest is not None and verify_sha256 else {}
        self.vocab_size = manifest.tokenizer.vocab_size if manifest is not None else None
        # Headers only: a broken shard fails now, not hours into the run. A shard shorter than one step (the last,
        # partial one of a prep) is skipped, like the tail of every shard that does not fill a whole step.
        usable = []
        for path in self.paths:
            num_tokens = read_header(path)
            if num_tokens >= self.tokens_per_step + 1:
                usable.append(path)
            else:
                warnings.warn(
                    f"{path}: {num_tokens} tokens, fewer than one step (B*T*world+1 = "
                    f"{self.tokens_per_step + 1}); skipped",
                    stacklevel=2,
                )
        if not usable:
            raise ValueError(
                f"{self.paths[0].parent}: no {split} shard has one step of tokens "
                f"(B*T*world+1 = {self.tokens_per_step + 1}); use a smaller batch or bigger shards"
            )
        self.paths = usable
        self.reset()

    @property
    def tokens_per_step(self) -> int:
        """Tokens one global step consumes over all ranks (B * T * world)."""
        return self.B * self.T * self.world_size

    def reset(self) -> None:
        """Back to the first shard, position 0, epoch 0."""
        self.epoch = 0
        self._open(0)
        self.position = 0

    def _check_size(self, path: Path, num_tokens: int) -> None:
        if num_tokens < self.tokens_per_step + 1:
            raise ValueError(
                f"{path}: {num_tokens} tokens, fewer than one step needs (B*T*world+1 = {self.tokens_per_step + 1})"
            )

    def _open(self, index: int) -> None:
        path = self.paths[index]
        info = self._expected.get(path.name)
        tokens = read_shard(path)
        if info is not None:
            if len(tokens) != info.num_tokens:
                raise UserError(
                    f"{path}: manifest mismatch: header has {len(tokens)} tokens, manifest.json says {info.num_tokens}"
                )
            st = path.stat()
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
            if key not in _VERIFIED:
                digest = sha256_file(path)
                if digest != info.sha256:
                    raise UserError(
                        f"{path}: manifest mismatch: sha256 {digest[:16]}... != manifest.json {info.sha256[:16]}..."
                    )
                _VERIFIED.add(key)
        self._check_size(path, len(tokens))
        self.shard_index, self.tokens = index, tokens

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        start = self.position + self.rank * B * T
        buf = torch.from_numpy(self.tokens[start : start + B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T)  # (B, T)
        y = buf[1:].view(B, T)  # (B, T)
        self.position += self.tokens_per_step
        if self.position + self.tokens_per_step + 1 > len(self.tokens):  # llm.c: the next step would not fit
            nxt = (self.shard_index + 1) % len(self.paths)
            self.epoch += int(nxt == 0)
            self._open(nxt)
            self.position = 0
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Where the next global step starts; identical on every rank."""
        return {
            "shard_index": self.shard_index,
            "shard_file": self.paths[self.shard_index].name,
            "position": self.position,
            "epoch": self.epoch,
            "tokens_per_step": self.tokens_per_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state_dict()`` was taken (same shards, same B*T*world)."""
        for key in ("shard_index", "shard_file", "position", "epoch", "tokens_per_step"):
            if key not in state:
                raise ValueError(f"loader state: missing key {key!r}")
        index = int(state["shard_index"])
        if not 0 <= index < len(self.paths) or self.paths[index].name != state["shard_file"]:
            raise ValueError(
                f"loader state: shard {index} was {state['shard_file']!r}, the {self.split} shards now are "
                f"{[p.name for p in self.paths[:3]]}... ({len(self.paths)}); resume with the same data directory"
            )
        if int(state["tokens_per_step"]) != self.tokens_per_step:
            raise ValueError(
                f"loader state: tokens_per_step was {state['tokens_per_step']}, now B*T*world = {self.tokens_per_step}"
            )
        self._open(index)
        position = int(state["position"])
        if not 0 <= position <= len(self.tokens) - self.tokens_per_step - 1:
            raise ValueError(f"loader state: position {position} is outside shard {self.paths[index]}")
        self.position, self.epoch = position, int(state["epoch"])


class ValLoader:
    """A fixed slice of the val split (shard 0): ``num_tokens // (B*T*world)`` steps from its start, every time."""

    def __init__(
        self,
        data: str | Path,
        batch_size: int,
        seq_len: int,
        num_tokens: int,
        rank: int = 0,
        world_size: int = 1,
        verify_sha256: bool = True,
    ) -> None:
        self._loader = ShardLoader(data, "val", batch_size, seq_len, rank, world_size, verify_sha256)
        self.num_steps = num_tokens // self._loader.tokens_per_step
        if self.num_steps < 1:
            raise ValueError(
                f"val num_tokens={num_tokens} is less than one step (B*T*world = {self._loader.tokens_per_step})"
            )
        usable = len(self._loader.tokens) - 1
        if len(self._loader.paths) == 1 and self.num_steps * self._loader.tokens_per_step > usable:
            raise ValueError(
                f"{self._loader.paths[0]}: val shard has {usable + 1} tokens, fewer than val num_tokens "
                f"rounded to steps ({self.num_steps} x {self._loader.tokens_per_step} + 1)"
            )

    @property
    def num_tokens(self) -> int:
        """Tokens scored per evaluation over all ranks (whole steps only)."""
        return self.num_steps * self._loader.tokens_per_step

    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._loader.reset()
        for _ in range(self.num_steps):
            yield self._loader.next_batch()


class SyntheticLoader:
    """Random tokens for throughput benchmarks (no data on disk): ``num_batches`` fixed batches, cycled."""

    def __init__(
        self,
        vocab_size: int,
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        num_batches: int = 8,
    ) -> None:
        _check_geometry(batch_size, seq_len, rank, world_size)
        if vocab_size < 2 or num_batches < 1:
            raise ValueError(f"need vocab_size >= 2 and num_batches >= 1, got {vocab_size} and {num_batches}")
        gen = torch.Generator().manual_seed(seed * world_size + rank)  # distinct streams per rank
        self._data = torch.randint(0, vocab_size, (num_batches, batch_size * seq_len + 1), generator=gen)
        self.B, self.T, self.step = batch_size, seq_len, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self._data[self.step % len(self._data)]
        self.step += 1
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)  # (B, T) each

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
