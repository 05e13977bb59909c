"""Tokenizers: byte-exact round trips on real English, GPT-2 ids match OpenAI's, EOT only where prep puts it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import shared_data

from phase6.config.data import DataConfig
from phase6.data.prepare import resolve_tokenizer_name
from phase6.data.sources import embedded_documents, join_documents
from phase6.data.tokenizer import (
    GPT2_BPE_FILES,
    ByteTokenizer,
    TiktokenGPT2,
    check_tokenizer,
    encode_document,
    gpt2_available,
    install_gpt2_bpe,
    train_bpe,
)


def _english() -> tuple[str, str]:
    """A real English page: Tiny Shakespeare when shared/data is present, else CPython's own docs."""
    data = shared_data()
    if data is not None and (data / "tinyshakespeare" / "input.txt").is_file():
        path = data / "tinyshakespeare" / "input.txt"
        return path.read_text(encoding="utf-8")[:200_000], str(path)
    return join_documents(embedded_documents(), 200_000), "embedded"


@pytest.fixture
def gpt2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TiktokenGPT2:
    """GPT-2 BPE from shared/data/gpt2-tokenizer via a private tiktoken cache; skipped when no files are offline."""
    data = shared_data()
    bpe_dir = data / "gpt2-tokenizer" if data is not None else None
    if bpe_dir is None or not gpt2_available(bpe_dir):
        if not gpt2_available(None):
            pytest.skip("no GPT-2 BPE files available offline")
        return TiktokenGPT2()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    return TiktokenGPT2(bpe_dir)


def test_byte_round_trip_on_english() -> None:
    text, label = _english()
    check = check_tokenizer(ByteTokenizer(), text + " naïve → 🙂", label)
    assert check.bytes_per_token == 1.0 and check.num_bytes == len((text + " naïve → 🙂").encode())


def test_gpt2_ids_round_trip_and_eot(gpt2: TiktokenGPT2) -> None:
    # ids from OpenAI's GPT-2 vocabulary (encoder.json): "Hello" = 15496, " world" = 995
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("<|endoftext|>") != [50256]  # literal text in a document is not the delimiter
    assert list(encode_document(gpt2, "Hello world")) == [50256, 15496, 995]
    text, label = _english()
    check = check_tokenizer(gpt2, text, label)
    # English prose under GPT-2 BPE is ~4 bytes/token (Shakespeare's short lines ~3.3; docs with code ~3.4)
    assert 3.0 < check.bytes_per_token < 5.0, check


def test_check_tokenizer_catches_a_lossy_tokenizer() -> None:
    class Lossy(ByteTokenizer):
        def decode(self, ids):  # drops the case of every letter
            return super().decode(ids).lower()

    with pytest.raises(ValueError, match=r"page: byte round trip differs at byte 0: b'Hello"):
        check_tokenizer(Lossy(), "Hello world", "page")


def test_trained_bpe_round_trips_bytes(tmp_path: Path) -> None:
    train = list(embedded_documents())[:40]
    tok = train_bpe(train, 400, tmp_path / "tokenizer.json")
    assert tok.eot_token == tok.vocab_size - 1 <= 400
    text, label = _english()
    tricky = text[:20_000] + "\n\t  naïve café → 🙂 <|endoftext|>  \n\n\r\n"
    check = check_tokenizer(tok, tricky, label)
    assert check.bytes_per_token > 1.3  # merges learned on English docs compress English
    assert tok.eot_token not in tok.encode("<|endoftext|>")


def test_install_gpt2_bpe_checks_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = shared_data()
    if data is None or not (data / "gpt2-tokenizer" / "vocab.bpe").is_file():
        pytest.skip("no GPT-2 BPE files in shared/data")
    fake = tmp_path / "bpe"
    fake.mkdir()
    shutil.copy(data / "gpt2-tokenizer" / "vocab.bpe", fake / "vocab.bpe")
    (fake / "encoder.json").write_text("{}")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"{fake / 'encoder.json'}: sha256 differs"):
        install_gpt2_bpe(fake)
    cache = install_gpt2_bpe(data / "gpt2-tokenizer")
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        __import__("hashlib").sha1(url.encode()).hexdigest() for url, _ in GPT2_BPE_FILES.values()
    )


def test_auto_tokenizer_is_explicit_about_what_it_picks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    assert resolve_tokenizer_name(DataConfig(tokenizer="auto")) == "byte"
    bpe_dir = tmp_path / "bpe"
    bpe_dir.mkdir()
    for name in GPT2_BPE_FILES:
        (bpe_dir / name).write_text("x")
    assert resolve_tokenizer_name(DataConfig(tokenizer="auto", tokenizer_dir=str(bpe_dir))) == "gpt2"
    assert resolve_tokenizer_name(DataConfig(tokenizer="byte", tokenizer_dir=str(bpe_dir))) == "byte"


def test_gpt2_token_counts_match_nanogpt_shakespeare(gpt2: TiktokenGPT2) -> None:
    """nanoGPT data/shakespeare/prepare.py: 90/10 char split, encode_ordinary -> 301,966 train + 36,059 val tokens."""
    data = shared_data()
    if data is None or not (data / "tinyshakespeare" / "input.txt").is_file():
        pytest.skip("shared/data/tinyshakespeare not present")
    text = (data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    n = len(text)
    assert (len(gpt2.encode(text[: int(n * 0.9)])), len(gpt2.encode(text[int(n * 0.9) :]))) == (301_966, 36_059)
