"""Prep: llm.c layout (EOT-prepended stream, shard 0 = val), sources, bad rows, and a killed prep resuming exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from phase6.config.data import DataConfig
from phase6.data.loader import ShardLoader
from phase6.data.prepare import PROGRESS_NAME, ensure_prepared, prepare_shards, verify
from phase6.data.shards import list_shards, load_manifest, read_shard
from phase6.data.sources import hf_documents, local_documents, resolve_hf_revision
from phase6.data.tokenizer import BYTE_EOT, load_data_tokenizer

VAL, SHARD = 1000, 1500


def _docs(n: int = 60, seed: int = 0) -> list[str]:
    """English-ish documents of very different lengths (some longer than a shard), with non-ASCII text."""
    rng = np.random.default_rng(seed)
    words = ["the", "loss", "falls", "when", "tokens", "flow", "naïve", "café", "→", "data", "shard", "<|endoftext|>"]
    return [" ".join(rng.choice(words, int(rng.integers(3, 700)))) + "." for _ in range(n)]


def _write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


def _cfg(tmp_path: Path, src: Path, out: str, **kw) -> DataConfig:
    base = dict(
        name="toy",
        source="local",
        local_path=str(src),
        out_dir=str(tmp_path / out),
        tokenizer="byte",
        num_val_tokens=VAL,
        shard_tokens=SHARD,
        num_workers=0,
    )
    return DataConfig(**{**base, **kw})


def _expected_stream(docs: list[str]) -> np.ndarray:
    """llm.c's rule restated: [EOT] + bytes of each document, concatenated."""
    return np.concatenate([np.array([BYTE_EOT, *d.encode("utf-8")], dtype=np.uint16) for d in docs])


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def _manifest_without_time(out: Path) -> dict:
    d = json.loads((out / "manifest.json").read_text())
    d.pop("created")
    return d


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    docs = _docs()
    return _write_jsonl(tmp_path / "corpus.jsonl", docs), docs


def test_layout_is_llmc_stream_split(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, docs = corpus
    manifest = prepare_shards(_cfg(tmp_path, src, "out"), show_progress=False)
    out = tmp_path / "out"
    stream = _expected_stream(docs)
    shards = [read_shard(out / s.file) for s in manifest.shards]
    assert [s.split for s in manifest.shards] == ["val"] + ["train"] * (len(shards) - 1)
    assert [len(s) for s in shards[:-1]] == [VAL] + [SHARD] * (len(shards) - 2)
    assert 0 < len(shards[-1]) <= SHARD
    np.testing.assert_array_equal(np.concatenate(shards), stream)
    assert (manifest.num_docs, manifest.num_tokens) == (len(docs), len(stream))
    assert manifest.source == f"local:{src.resolve()}" and manifest.revision.startswith("sha256:")
    assert (manifest.tokenizer.name, manifest.tokenizer.vocab_size, manifest.tokenizer.eot_token) == ("byte", 257, 256)
    assert manifest.split_rule.startswith("shard 0 is val")
    assert verify(out) == load_manifest(out)
    assert list_shards(out, "val") == [out / "toy_val_000000.bin"]
    # decoding the shards gives the documents back, byte for byte
    tok = load_data_tokenizer(out)
    parts = tok.decode(np.concatenate(shards).tolist())
    assert parts == "".join(docs)
    ShardLoader(out, "train", 2, 64).next_batch()


@pytest.mark.parametrize("crash_after", [1, 2, 4])
def test_resume_after_crash_is_identical(tmp_path: Path, corpus: tuple[Path, list[str]], crash_after: int) -> None:
    src, _ = corpus
    prepare_shards(_cfg(tmp_path, src, "ref"), show_progress=False)

    class Crash(Exception):
        pass

    def crash(_shard) -> None:
        done = len(json.loads((tmp_path / "cut" / PROGRESS_NAME).read_text())["shards"])
        if done == crash_after:
            raise Crash

    with pytest.raises(Crash):
        prepare_shards(_cfg(tmp_path, src, "cut"), show_progress=False, on_shard=crash)
    progress = json.loads((tmp_path / "cut" / PROGRESS_NAME).read_text())
    assert len(progress["shards"]) == crash_after and not progress["done"]
    assert not (tmp_path / "cut" / "manifest.json").exists()
    # a shard written after the last recorded one (a kill between write and record) is redone, not trusted
    (tmp_path / "cut" / f"toy_train_{crash_after:06d}.bin").write_bytes(b"garbage")
    prepare_shards(_cfg(tmp_path, src, "cut"), show_progress=False)
    assert _shard_bytes(tmp_path / "cut") == _shard_bytes(tmp_path / "ref")
    assert _manifest_without_time(tmp_path / "cut") == _manifest_without_time(tmp_path / "ref")


def test_crash_points_include_a_document_split_across_shards(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    """The resume test above is only meaningful if some shard ends inside a document (doc_offset > 0)."""
    src, _ = corpus
    prepare_shards(_cfg(tmp_path, src, "out"), show_progress=False)
    offsets = [s["doc_offset"] for s in json.loads((tmp_path / "out" / PROGRESS_NAME).read_text())["shards"][:4]]
    assert any(o > 0 for o in offsets), offsets


def test_resume_after_sigkill(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, _ = corpus
    prepare_shards(_cfg(tmp_path, src, "ref"), show_progress=False)
    cut = _cfg(tmp_path, src, "cut")
    script = textwrap.dedent(f"""
        import os, signal
        from phase6.config.data import DataConfig
        from phase6.data.prepare import prepare_shards
        n = []
        def kill(shard):
            n.append(shard)
            if len(n) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        prepare_shards(DataConfig(**{cut.__dict__!r}), show_progress=False, on_shard=kill)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert len(json.loads((tmp_path / "cut" / PROGRESS_NAME).read_text())["shards"]) == 3
    prepare_shards(cut, show_progress=False)
    assert _shard_bytes(tmp_path / "cut") == _shard_bytes(tmp_path / "ref")


def test_worker_processes_give_identical_shards(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, _ = corpus
    prepare_shards(_cfg(tmp_path, src, "serial"), show_progress=False)
    prepare_shards(_cfg(tmp_path, src, "pool", num_workers=2, chunk_size=3), show_progress=False)
    assert _shard_bytes(tmp_path / "pool") == _shard_bytes(tmp_path / "serial")


def test_resume_refuses_a_changed_config(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, _ = corpus

    def stop(_shard) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_shards(_cfg(tmp_path, src, "out"), show_progress=False, on_shard=stop)
    with pytest.raises(ValueError, match="shard_tokens") as e:
        prepare_shards(_cfg(tmp_path, src, "out", shard_tokens=SHARD + 1), show_progress=False)
    assert str(tmp_path / "out" / PROGRESS_NAME) in str(e.value)
    src.write_text(src.read_text() + json.dumps({"text": "one more"}) + "\n")
    with pytest.raises(ValueError, match="revision"):
        prepare_shards(_cfg(tmp_path, src, "out"), show_progress=False)


def test_max_tokens_and_max_docs(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, docs = corpus
    m = prepare_shards(_cfg(tmp_path, src, "tok", max_tokens=3333), show_progress=False)
    assert m.num_tokens == 3333 and [s.num_tokens for s in m.shards] == [VAL, SHARD, 3333 - VAL - SHARD]
    np.testing.assert_array_equal(
        np.concatenate([read_shard(tmp_path / "tok" / s.file) for s in m.shards]), _expected_stream(docs)[:3333]
    )
    m = prepare_shards(_cfg(tmp_path, src, "docs", max_docs=20), show_progress=False)
    assert m.num_docs == 20 and m.num_tokens == len(_expected_stream(docs[:20]))


def test_txt_parquet_jsonl_and_hf_streaming_agree(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, docs = corpus
    pq.write_table(
        pa.table({"id": list(range(len(docs))), "text": docs}), tmp_path / "corpus.parquet", row_group_size=7
    )
    txt_dir = tmp_path / "txt"
    txt_dir.mkdir()
    for i, d in enumerate(docs):
        (txt_dir / f"doc{i:03d}.txt").write_text(d, encoding="utf-8")
    assert list(local_documents([tmp_path / "corpus.parquet"], "text")) == docs
    assert list(local_documents(sorted(txt_dir.glob("*.txt")), "text")) == docs
    # the HF code path (datasets streaming) on local files of the FineWeb schema: same documents, same order
    assert (
        list(hf_documents("parquet", None, "train", None, "text", data_files=str(tmp_path / "corpus.parquet"))) == docs
    )
    assert list(hf_documents("json", None, "train", None, "text", data_files=str(src))) == docs
    ref = prepare_shards(_cfg(tmp_path, src, "a"), show_progress=False)
    for path, out in ((tmp_path / "corpus.parquet", "b"), (txt_dir, "c")):
        m = prepare_shards(_cfg(tmp_path, path, out), show_progress=False)
        assert [s.sha256 for s in m.shards] == [s.sha256 for s in ref.shards]
    # the whole prep through the HF streaming source (what fineweb-edu uses), on the local parquet
    hf = _cfg(
        tmp_path, src, "d", source="hf", local_path=None, dataset="parquet", data_files=str(tmp_path / "corpus.parquet")
    )
    m = prepare_shards(hf, show_progress=False)
    assert [s.sha256 for s in m.shards] == [s.sha256 for s in ref.shards]
    assert m.source.startswith("hf:parquet/") and m.revision.startswith("sha256:")


def test_hub_revision_is_pinned_or_the_error_says_how() -> None:
    sha = "a" * 40
    assert resolve_hf_revision("HuggingFaceFW/fineweb-edu", sha) == sha  # a commit sha needs no network
    with pytest.raises(ValueError, match=r"^data.revision: could not resolve HuggingFaceFW/fineweb-edu@main"):
        resolve_hf_revision("HuggingFaceFW/fineweb-edu", None)  # HF_HUB_OFFLINE=1 in tests
    cfg = DataConfig(source="fineweb-edu")
    assert cfg.hf_dataset() == ("HuggingFaceFW/fineweb-edu", "sample-10BT")
    assert DataConfig(source="fineweb").hf_dataset() == ("HuggingFaceFW/fineweb", "sample-10BT")


def test_bad_rows_are_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match=rf"{bad}:3: not valid JSON"):
        prepare_shards(_cfg(tmp_path, bad, "o1"), show_progress=False)
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=rf"{bad}:2: row has no string key 'text'"):
        prepare_shards(_cfg(tmp_path, bad, "o2"), show_progress=False)
    pq.write_table(pa.table({"content": ["a", "b"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: no column 'text'"):
        prepare_shards(_cfg(tmp_path, tmp_path / "bad.parquet", "o3"), show_progress=False)
    with pytest.raises(ValueError, match="data.local_path must end in"):
        prepare_shards(_cfg(tmp_path, _touch(tmp_path / "x.csv"), "o4"), show_progress=False)


def _touch(path: Path) -> Path:
    path.write_text("a,b\n")
    return path


def test_too_little_text_for_a_train_shard(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "small.jsonl", ["tiny document"] * 3)
    with pytest.raises(ValueError, match="no train shard"):
        prepare_shards(_cfg(tmp_path, src, "out"), show_progress=False)


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"source": "s3"}, "data.source"),
        ({"tokenizer": "sentencepiece"}, "data.tokenizer"),
        ({"source": "local"}, "data.local_path"),
        ({"name": "a_b"}, "data.name"),
        ({"shard_tokens": 1}, "data.shard_tokens"),
        ({"source": "hf"}, "data.dataset"),
    ],
)
def test_config_errors_name_the_key(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key}: "):
        DataConfig(**kw)


def test_embedded_corpus_offline(tmp_path: Path) -> None:
    cfg = DataConfig(out_dir=str(tmp_path / "emb"), max_docs=12, num_val_tokens=4096, shard_tokens=8192, num_workers=0)
    m = prepare_shards(cfg, show_progress=False)
    from pydoc_data.topics import topics

    first = [topics[k] for k in sorted(topics)[:12]]
    assert m.source.startswith("embedded:cpython") and m.num_docs == 12
    assert m.num_tokens == len(_expected_stream(first))


def test_ensure_prepared_takes_finished_dirs_as_they_are(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, _ = corpus
    cfg = _cfg(tmp_path, src, "out")
    first = ensure_prepared(cfg, show_progress=False)  # prepares
    src.unlink()  # a finished directory needs no source any more
    assert ensure_prepared(cfg, show_progress=False) == first
    with pytest.raises(ValueError, match="tokenizer 'byte'"):
        ensure_prepared(_cfg(tmp_path, tmp_path, "out", tokenizer="gpt2"), show_progress=False)
    llmc = tmp_path / "llmc"
    llmc.mkdir()
    for p in (tmp_path / "out").glob("*.bin"):
        (llmc / p.name.replace("toy", "fineweb")).write_bytes(p.read_bytes())
    assert ensure_prepared(_cfg(tmp_path, tmp_path, "llmc"), show_progress=False) is None
    with pytest.raises(ValueError, match="holds shards no prep recorded"):  # a downloaded set is never overwritten
        prepare_shards(_cfg(tmp_path, tmp_path / "corpus.jsonl", "llmc", name="fineweb"), show_progress=False)
    assert len(list(llmc.glob("*.bin"))) == len(list((tmp_path / "out").glob("*.bin")))


def test_cli_prepare_and_check_tokenizer(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    from phase6.cli import app

    src, _ = corpus
    common = [
        f"data.local_path={src}",
        "data.source=local",
        "data.name=toy",
        "data.num_workers=0",
        f"data.num_val_tokens={VAL}",
        f"data.shard_tokens={SHARD}",
        "logger.console=false",
    ]
    runner = CliRunner()
    res = runner.invoke(
        app, ["prepare-data", *common, f"data.out_dir={tmp_path / 'out'}", f"run.dir={tmp_path / 'r1'}"]
    )
    assert res.exit_code == 0, res.output
    results = json.loads((tmp_path / "r1" / "results.json").read_text())
    assert [r["split"] for r in results["rows"]] == ["val", "train"]
    assert results["manifest"]["num_tokens"] == sum(r["tokens"] for r in results["rows"])
    assert res.output.strip().splitlines()[-1] == f"run dir: {tmp_path / 'r1'}"
    res = runner.invoke(app, ["prepare-data", "--check-tokenizer", *common, f"run.dir={tmp_path / 'r2'}"])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "r2" / "results.json").read_text())["rows"][0]
    assert row["round_trip"] == "byte-exact" and row["bytes_per_token"] == 1.0 and row["bytes"] > 10_000
    res = runner.invoke(app, ["prepare-data", "data.tokenizer=wordpiece", f"run.dir={tmp_path / 'r3'}"])
    assert res.exit_code == 2 and "data.tokenizer" in res.output


def test_bpe_prep_ships_its_tokenizer(tmp_path: Path, corpus: tuple[Path, list[str]]) -> None:
    src, docs = corpus
    m = prepare_shards(_cfg(tmp_path, src, "bpe", tokenizer="bpe", bpe_vocab_size=300), show_progress=False)
    out = tmp_path / "bpe"
    assert m.tokenizer.file == "tokenizer.json" and (out / "tokenizer.json").is_file()
    assert m.tokenizer.vocab_size <= 301 and m.tokenizer.eot_token == m.tokenizer.vocab_size - 1
    tokens = np.concatenate([read_shard(out / s.file) for s in m.shards])
    assert int((tokens == m.tokenizer.eot_token).sum()) == len(docs)
    assert m.num_tokens < len(_expected_stream(docs))  # merges compress relative to bytes
    assert load_data_tokenizer(out).decode(tokens.tolist()) == "".join(docs)
    # a resumed BPE prep reuses the trained file; a changed BPE setting is refused, not silently ignored
    with pytest.raises(ValueError, match="cannot resume: bpe"):
        prepare_shards(_cfg(tmp_path, src, "bpe", tokenizer="bpe", bpe_vocab_size=320), show_progress=False)


def test_local_path_comma_list_reads_files_in_the_given_order(tmp_path: Path) -> None:
    """data.local_path='a.jsonl,dir,b.txt': the files in the order listed (a directory expands sorted), so the
    first file's documents become the val shard; a file listed twice is an error naming it."""
    from phase6.data.sources import local_files

    (tmp_path / "web.jsonl").write_text('{"text": "web one"}\n{"text": "web two"}\n')
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "b.txt").write_text("book b")
    (tmp_path / "books" / "a.txt").write_text("book a")
    (tmp_path / "z.txt").write_text("last")
    spec = f"{tmp_path / 'web.jsonl'}, {tmp_path / 'books'},{tmp_path / 'z.txt'}"
    files = local_files(spec)
    assert [f.name for f in files] == ["web.jsonl", "a.txt", "b.txt", "z.txt"]
    assert list(local_documents(files, "text")) == ["web one", "web two", "book a", "book b", "last"]
    with pytest.raises(ValueError, match=r"z\.txt: listed twice in data\.local_path"):
        local_files(f"{tmp_path / 'z.txt'},{tmp_path / 'z.txt'}")
    with pytest.raises(ValueError, match=r"missing\.txt: data\.local_path does not exist"):
        local_files(f"{tmp_path / 'z.txt'},{tmp_path / 'missing.txt'}")
