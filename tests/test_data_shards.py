"""llm.c shard format and manifest.json: round trip, byte parity with llm.c's writer, every defect named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phase6.data.shards import (
    HEADER_BYTES,
    MAGIC,
    Manifest,
    TokenizerInfo,
    list_shards,
    load_manifest,
    read_header,
    read_shard,
    sha256_file,
    verify_shards,
    write_manifest,
    write_shard,
)


def _llmc_bytes(tokens: np.ndarray) -> bytes:
    """llm.c dev/data/data_common.py write_datafile, restated: int32 header [magic, version, n, 0...] + uint16."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    return header.tobytes() + tokens.astype(np.uint16).tobytes()


def _one_line_error(excinfo: pytest.ExceptionInfo[ValueError], path: Path) -> str:
    msg = str(excinfo.value)
    assert str(path) in msg, msg
    assert "\n" not in msg, msg
    return msg


def _make_dir(tmp_path: Path, sizes: list[int], prefix: str = "toy") -> tuple[Path, Manifest]:
    rng = np.random.default_rng(0)
    shards = []
    for i, n in enumerate(sizes):
        name = f"{prefix}_{'val' if i == 0 else 'train'}_{i:06d}.bin"
        shards.append(write_shard(tmp_path / name, rng.integers(0, 50257, n)))
    manifest = Manifest("test", "r0", TokenizerInfo("gpt2", 50257, 50256), shards=shards)
    write_manifest(tmp_path, manifest)
    return tmp_path, manifest


def test_round_trip_and_llmc_byte_parity(tmp_path: Path) -> None:
    tokens = np.random.default_rng(1).integers(0, 65536, 5000).astype(np.int64)
    path = tmp_path / "x_train_000001.bin"
    info = write_shard(path, tokens)
    assert path.read_bytes() == _llmc_bytes(tokens)
    assert path.stat().st_size == HEADER_BYTES + 2 * len(tokens)
    assert (info.file, info.split, info.num_tokens, info.sha256) == (path.name, "train", 5000, sha256_file(path))
    back = read_shard(path)
    assert back.dtype == np.uint16 and back.shape == (5000,)
    np.testing.assert_array_equal(back, tokens)
    assert not list(tmp_path.glob("*.tmp"))


def test_write_rejects_bad_tokens(tmp_path: Path) -> None:
    path = tmp_path / "x_val_000000.bin"
    with pytest.raises(ValueError) as e:
        write_shard(path, np.array([1, 2, 70000]))
    assert "70000" in _one_line_error(e, path)
    with pytest.raises(ValueError):
        write_shard(path, np.array([], dtype=np.uint16))
    assert not path.exists()


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda b: b[:-7], "truncated"),
        (lambda b: b[:500], "truncated"),
        (lambda b: b + b"\0\0", "token count mismatch"),
        (lambda b: np.int32(12345).tobytes() + b[4:], "wrong magic 12345"),
        (lambda b: np.int32(20240801).tobytes() + b[4:], "Llama-3"),
        (lambda b: b[:4] + np.int32(7).tobytes() + b[8:], "version 7"),
    ],
)
def test_damaged_shard_is_named(tmp_path: Path, damage, words: str) -> None:
    path = tmp_path / "x_val_000000.bin"
    write_shard(path, np.arange(1000))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError) as e:
        read_shard(path)
    assert words in _one_line_error(e, path)


def test_manifest_sha_and_token_mismatch(tmp_path: Path) -> None:
    data, manifest = _make_dir(tmp_path, [300, 400, 500])
    assert verify_shards(data) == manifest
    assert load_manifest(data) == manifest

    victim = data / manifest.shards[1].file
    raw = bytearray(victim.read_bytes())
    raw[HEADER_BYTES + 10] ^= 0xFF  # one token changes, size and header stay valid
    victim.write_bytes(bytes(raw))
    read_shard(victim)  # the file alone still looks fine ...
    with pytest.raises(ValueError) as e:  # ... only the manifest catches it
        verify_shards(data)
    assert "sha256" in _one_line_error(e, victim)

    d = json.loads((data / "manifest.json").read_text())
    d["shards"][1]["sha256"] = sha256_file(victim)
    d["shards"][2]["num_tokens"] = 499
    (data / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        verify_shards(data)
    assert "499" in _one_line_error(e, data / manifest.shards[2].file)


def test_manifest_schema_errors_name_file_and_key(tmp_path: Path) -> None:
    data, _ = _make_dir(tmp_path, [100, 100])
    d = json.loads((data / "manifest.json").read_text())
    del d["shards"][0]["sha256"]
    (data / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        load_manifest(data)
    assert "shards[0].'sha256'" in _one_line_error(e, data / "manifest.json")


def test_pretokenized_llmc_set_without_manifest(tmp_path: Path) -> None:
    # modded-nanogpt / llm.c cached sets: fineweb_val_000000.bin, fineweb_train_000001.bin, ... no manifest
    for i in (2, 0, 10, 1):
        name = f"fineweb_{'val' if i == 0 else 'train'}_{i:06d}.bin"
        (tmp_path / name).write_bytes(_llmc_bytes(np.full(64, i)))
    assert [p.name for p in list_shards(tmp_path, "val")] == ["fineweb_val_000000.bin"]
    train = list_shards(tmp_path, "train")
    assert [p.name for p in train] == [f"fineweb_train_{i:06d}.bin" for i in (1, 2, 10)]
    assert [int(read_shard(p)[0]) for p in train] == [1, 2, 10]
    assert list_shards(str(tmp_path / "fineweb_train_*.bin"), "train") == train
    assert verify_shards(tmp_path) is None
    assert read_header(train[0]) == 64 and MAGIC == 20240520


def test_unfinished_or_empty_dirs_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        list_shards(tmp_path / "missing", "train")
    _one_line_error(e, tmp_path / "missing")
    (tmp_path / "progress.json").write_text("{}")
    with pytest.raises(ValueError, match="unfinished") as e:
        list_shards(tmp_path, "train")
    _one_line_error(e, tmp_path)
