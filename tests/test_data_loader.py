"""Sequential distributed loader: llm.c windows, disjoint ranks, shard wrap, exact resume, val slice, synthetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from phase6.data.loader import ShardLoader, SyntheticLoader, ValLoader
from phase6.data.shards import HEADER_BYTES, Manifest, TokenizerInfo, write_manifest, write_shard

B, T = 2, 8


def _ramp_dir(tmp_path: Path, sizes: list[int]) -> tuple[Path, list[np.ndarray]]:
    """Shards whose tokens are consecutive integers across the whole stream: a token's value is its position."""
    arrays, shards, start = [], [], 0
    for i, n in enumerate(sizes):
        tokens = np.arange(start, start + n) % 60000
        start += n
        arrays.append(tokens)
        shards.append(write_shard(tmp_path / f"ramp_{'val' if i == 0 else 'train'}_{i:06d}.bin", tokens))
    write_manifest(tmp_path, Manifest("ramp", "r0", TokenizerInfo("byte", 60000, 0), shards=shards))
    return tmp_path, arrays


def test_llmc_windows_and_shard_wrap(tmp_path: Path) -> None:
    data, arrays = _ramp_dir(tmp_path, [100, 40, 50])
    train = arrays[1:]
    loader = ShardLoader(data, "train", B, T)
    seen = []
    for _ in range(5):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y.flatten()[:-1], x.flatten()[1:])  # y is x shifted by one token
        seen.append(int(x[0, 0]))
    # shard 1 (40 tokens) fits 2 steps of 16 (+1 target); shard 2 (50) fits 3; then back to shard 1 (epoch 1)
    assert seen == [train[0][0], train[0][16], train[1][0], train[1][16], train[1][32]]
    assert loader.shard_index == 0 and loader.epoch == 1
    np.testing.assert_array_equal(x.flatten().numpy(), train[1][32:48])
    np.testing.assert_array_equal(y.flatten().numpy(), train[1][33:49])


def test_two_ranks_disjoint_and_contiguous(tmp_path: Path) -> None:
    data, arrays = _ramp_dir(tmp_path, [100, 300, 300])
    ranks = [ShardLoader(data, "train", B, T, rank=r, world_size=2) for r in range(2)]
    for step in range(12):
        xs = [ld.next_batch()[0].flatten() for ld in ranks]
        assert not set(xs[0].tolist()) & set(xs[1].tolist()), step
        both = torch.cat(xs)
        assert torch.equal(both, torch.arange(int(both[0]), int(both[0]) + 2 * B * T))  # rank 0 then rank 1
    assert ranks[0].state_dict() == ranks[1].state_dict()


@pytest.mark.parametrize("k", [0, 3, 7])
def test_state_round_trip_gives_same_next_batches(tmp_path: Path, k: int) -> None:
    data, _ = _ramp_dir(tmp_path, [100, 70, 90, 60])
    ref = ShardLoader(data, "train", B, T, rank=1, world_size=2)
    for _ in range(k):
        ref.next_batch()
    state = ref.state_dict()
    expected = [ref.next_batch() for _ in range(9)]  # crosses shard boundaries and an epoch
    resumed = ShardLoader(data, "train", B, T, rank=1, world_size=2)
    resumed.load_state_dict(state)
    for (x0, y0), (x1, y1) in zip(expected, [resumed.next_batch() for _ in range(9)], strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert resumed.state_dict() == ref.state_dict()


def test_bad_state_is_rejected(tmp_path: Path) -> None:
    data, _ = _ramp_dir(tmp_path, [100, 70, 90])
    state = ShardLoader(data, "train", B, T).state_dict()
    with pytest.raises(ValueError, match="tokens_per_step"):
        ShardLoader(data, "train", B, 2 * T).load_state_dict(state)
    with pytest.raises(ValueError, match="same data directory"):
        ShardLoader(data, "train", B, T).load_state_dict({**state, "shard_file": "other_train_000001.bin"})
    with pytest.raises(ValueError, match="position"):
        ShardLoader(data, "train", B, T).load_state_dict({**state, "position": 10**6})


def test_val_loader_is_fixed_and_sized(tmp_path: Path) -> None:
    data, arrays = _ramp_dir(tmp_path, [200, 100])
    val = ValLoader(data, B, T, num_tokens=100, world_size=1)
    assert len(val) == 100 // (B * T) == 6 and val.num_tokens == 96
    first = [x for x, _ in val]
    second = [x for x, _ in val]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    np.testing.assert_array_equal(torch.cat([x.flatten() for x in first]).numpy(), arrays[0][:96])
    with pytest.raises(ValueError, match="less than one step"):
        ValLoader(data, B, T, num_tokens=B * T - 1)
    with pytest.raises(ValueError, match="fewer than val num_tokens") as e:
        ValLoader(data, B, T, num_tokens=400)
    assert "ramp_val_000000.bin" in str(e.value)


def test_manifest_mismatch_and_small_shard_named(tmp_path: Path) -> None:
    data, _ = _ramp_dir(tmp_path, [100, 70, 90])
    victim = data / "ramp_train_000002.bin"
    raw = bytearray(victim.read_bytes())
    raw[HEADER_BYTES] ^= 1
    victim.write_bytes(bytes(raw))
    loader = ShardLoader(data, "train", B, T)
    with pytest.raises(ValueError, match="sha256") as e:
        for _ in range(10):
            loader.next_batch()
    assert str(victim) in str(e.value)
    ShardLoader(data, "train", B, T, verify_sha256=False).next_batch()
    with pytest.warns(UserWarning, match="ramp_train_000001.bin: 70 tokens, fewer than one step"):
        skipping = ShardLoader(data, "train", 4, 20, verify_sha256=False)  # 81 tokens a step: shard 1 is skipped
    assert [p.name for p in skipping.paths] == ["ramp_train_000002.bin"]
    with pytest.raises(ValueError, match="no train shard has one step") as e, pytest.warns(UserWarning):
        ShardLoader(data, "train", 4, 32)
    assert str(data) in str(e.value)


def test_synthetic_loader() -> None:
    a = SyntheticLoader(vocab_size=50257, batch_size=B, seq_len=T, rank=0, world_size=2, num_batches=3)
    b = SyntheticLoader(vocab_size=50257, batch_size=B, seq_len=T, rank=1, world_size=2, num_batches=3)
    xa, ya = a.next_batch()
    assert xa.shape == (B, T) and xa.dtype == torch.int64 and int(xa.max()) < 50257
    assert torch.equal(ya.flatten()[:-1], xa.flatten()[1:])
    assert not torch.equal(xa, b.next_batch()[0])
    a.next_batch(), a.next_batch()
    assert torch.equal(a.next_batch()[0], xa)  # cycles through num_batches fixed batches
    state = a.state_dict()
    c = SyntheticLoader(vocab_size=50257, batch_size=B, seq_len=T, rank=0, world_size=2, num_batches=3)
    c.load_state_dict(state)
    assert torch.equal(c.next_batch()[0], a.next_batch()[0])
