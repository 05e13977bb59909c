"""6B workloads: ShareGPT sampling window and determinism, synthetic lengths, Mooncake/Azure traces, schedules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phase6.config.serve import LengthDist, LoadConfig
from phase6.serving.workload import (
    build_schedule,
    build_workload,
    load_azure,
    load_mooncake,
    load_sharegpt,
    resolve_path,
    sample_lengths,
)


@pytest.fixture(scope="module")
def tok():
    from phase6.posttrain.tiny import build_tiny_tokenizer
    from phase6.serving.tiny import stdlib_corpus

    return build_tiny_tokenizer(stdlib_corpus(), vocab_size=512)


def words(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    vocab = ["alpha", "beta", "gamma", "delta", "server", "token", "latency", "queue", "model", "the"]
    return " ".join(rng.choice(vocab, size=n))


@pytest.fixture
def sharegpt_file(tmp_path: Path) -> Path:
    """60 conversations with prompt/answer word counts spread over 5..400 words, plus rows to be skipped."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        p, a = int(rng.integers(5, 400)), int(rng.integers(5, 200))
        rows.append(
            {
                "id": f"c{i}",
                "conversations": [
                    {"from": "human", "value": words(p, i)},
                    {"from": "gpt", "value": words(a, 1000 + i)},
                ],
            }
        )
    rows.append({"id": "short", "conversations": [{"from": "human", "value": "only a prompt"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return path


def test_sharegpt_window_seed_and_prefix_stability(tok, sharegpt_file: Path) -> None:
    a = load_sharegpt(sharegpt_file, tok, 10, seed=3, prompt_min=50, prompt_max=600, output_min=20, output_max=300)
    assert len(a) == 10
    for r in a:  # lengths are the served tokenizer's counts of the text actually sent
        assert 50 <= r.prompt_len <= 600 and 20 <= r.output_len <= 300
        assert r.prompt_len == len(tok.encode(r.prompt, add_special_tokens=False))
    b = load_sharegpt(sharegpt_file, tok, 5, seed=3, prompt_min=50, prompt_max=600, output_min=20, output_max=300)
    assert [r.prompt for r in b] == [r.prompt for r in a[:5]]  # a longer run sends a superset, same order
    c = load_sharegpt(sharegpt_file, tok, 10, seed=4, prompt_min=50, prompt_max=600, output_min=20, output_max=300)
    assert [r.prompt for r in c] != [r.prompt for r in a]


def test_sharegpt_errors_name_file_and_row(tok, tmp_path: Path, sharegpt_file: Path) -> None:
    with pytest.raises(ValueError, match="need 500"):
        load_sharegpt(sharegpt_file, tok, 500, 0, 50, 600, 20, 300)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"id": 1, "conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]}]')
    with pytest.raises(ValueError, match=r"bad.json: row 0: conversations\[0\] needs a string 'value'"):
        load_sharegpt(bad, tok, 1, 0, 1, 10, 1, 10)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        load_sharegpt(bad, tok, 1, 0, 1, 10, 1, 10)
    with pytest.raises(ValueError, match="load.path: no such file"):
        resolve_path(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="expected hf://<owner>/<dataset>/<file>"):
        resolve_path("hf://only-owner")


def test_sample_lengths_match_their_distributions() -> None:
    rng = np.random.default_rng(0)
    u = sample_lengths(LengthDist("uniform", 0, 0, 100, 2000), 20000, rng)
    assert u.min() >= 100 and u.max() <= 2000 and abs(u.mean() - 1050) < 15
    n = sample_lengths(LengthDist("normal", 300, 50, 1, 10000), 20000, rng)
    assert abs(n.mean() - 300) < 2 and abs(n.std() - 50) < 2
    ln = sample_lengths(LengthDist("lognormal", 400, 200, 1, 100000), 50000, rng)
    assert abs(ln.mean() - 400) / 400 < 0.02 and abs(ln.std() - 200) / 200 < 0.05
    assert set(sample_lengths(LengthDist("fixed", 64, 0, 1, 100), 10, rng)) == {64}


def test_synthetic_prompts_have_the_sampled_token_counts(tok) -> None:
    load = LoadConfig(
        dataset="synthetic",
        path=None,
        concurrency=2,
        num_requests=20,
        warmup_requests=2,
        prompt_dist=LengthDist("uniform", 0, 0, 30, 300),
        output_dist=LengthDist("fixed", 16, 0, 1, 64),
    )
    wl = build_workload(load, tok, seed=0)
    rng = np.random.default_rng(0)
    want = sample_lengths(load.prompt_dist, 22, rng)
    # whole-word random text survives re-encoding: the client count equals the sampled length
    assert [r.prompt_len for r in wl.requests] == want[:20].tolist()
    assert all(r.output_len == 16 for r in wl.requests) and len(wl.warmup) == 2
    assert wl.info["request_list_sha256"] == build_workload(load, tok, seed=0).info["request_list_sha256"]


def test_mooncake_equal_hash_ids_give_equal_prefixes_and_time_scaling(tok, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 600, "output_length": 9, "hash_ids": [1, 4]},
        {"timestamp": 4000, "input_length": 300, "output_length": 5, "hash_ids": [9]},
        {"timestamp": 5000, "input_length": 9000, "output_length": 5, "hash_ids": list(range(20, 38))},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reqs, dropped = load_mooncake(path, tok, seed=0, time_scale=0.5, max_total_len=4096)
    assert dropped == 1 and len(reqs) == 3
    assert [r.trace_time_s for r in reqs] == [0.0, 0.25, 1.5]
    assert [r.prompt_len for r in reqs] == [1100, 600, 300] and [r.output_len for r in reqs] == [7, 9, 5]
    ids0, ids1 = (tok.encode(r.prompt, add_special_tokens=False) for r in reqs[:2])
    assert ids0[:512] == ids1[:512] and ids0[512:1024] != ids1[512:1024]  # block 1 shared, block 2 differs
    # rows go through the fleet's strict parser: one-line errors naming file:line, the same as `phase6 fleet`
    path.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"trace.jsonl:1: missing field 'output_length'"):
        load_mooncake(path, tok, 0)
    path.write_text(
        '{"timestamp": 9, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 3, "input_length": 5, "output_length": 2, "hash_ids": [2]}\n'
    )
    with pytest.raises(ValueError, match=r"trace.jsonl:2: timestamps not sorted"):
        load_mooncake(path, tok, 0)
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(ValueError, match=r"trace.jsonl:1: hash_ids has 1 blocks but input_length 600"):
        load_mooncake(path, tok, 0)


def test_azure_trace_times_and_errors(tok, tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,96,109\n2023-11-16 18:15:51.2224670,8000,55\n"
    )
    reqs, dropped = load_azure(path, tok, seed=0, time_scale=2.0, max_total_len=4096)
    assert dropped == 1 and [r.output_len for r in reqs] == [44, 109]
    assert reqs[1].trace_time_s == pytest.approx(2 * 4.314579, abs=1e-5)
    assert [r.prompt_len for r in reqs] == [374, 96]
    path.write_text("TIMESTAMP,Context\n1,2\n")
    with pytest.raises(ValueError, match=r"azure.csv:1: missing column\(s\) ContextTokens, GeneratedTokens"):
        load_azure(path, tok, 0)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n")
    with pytest.raises(ValueError, match="azure.csv:2: TIMESTAMP 'yesterday' is not"):
        load_azure(path, tok, 0)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,0,3\n")
    with pytest.raises(ValueError, match="azure.csv:2: input length must be an integer >= 1, got 0"):
        load_azure(path, tok, 0)


def test_schedules() -> None:
    n, rate = 2000, 50.0
    p = build_schedule("poisson", n, seed=1, request_rate=rate)
    assert p[-1] == pytest.approx(n / rate) and np.all(np.diff(p) >= 0)  # offered rate exact by construction
    gaps = np.diff(p)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.08  # exponential: coefficient of variation 1
    bursty = np.diff(build_schedule("gamma", n, seed=1, request_rate=rate, burstiness=0.25))
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.25  # gamma shape k: CV = 1/sqrt(k)
    assert np.array_equal(p, build_schedule("poisson", n, seed=1, request_rate=rate))
    assert not np.array_equal(p, build_schedule("poisson", n, seed=2, request_rate=rate))
    assert np.allclose(build_schedule("constant", 4, 0, request_rate=2.0), [0.5, 1.0, 1.5, 2.0])
    assert not build_schedule("concurrency", 5, 0).any()
    assert build_schedule("trace", 3, 0, trace_times=[2.0, 2.5, 4.0]).tolist() == [0.0, 0.5, 2.0]


def test_real_shared_files(tok, shared: Path) -> None:
    """The files shipped in ../shared/data parse with the real schemas (skipped on a user's clone)."""
    reqs = load_sharegpt(shared / "sharegpt/sharegpt_test.json", tok, 8, 0, 1, 100000, 1, 100000)
    assert len(reqs) == 8
    moon, _ = load_mooncake(shared / "mooncake-traces/synthetic_trace.jsonl", tok, 0, max_rows=50, max_total_len=4096)
    assert len(moon) == 50 and all(r.trace_time_s is not None for r in moon)
    az, _ = load_azure(shared / "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv", tok, 0, max_rows=50)
    assert len(az) == 50 and az[-1].trace_time_s > 0
