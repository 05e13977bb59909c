"""Fleet workloads: Mooncake / Azure trace loaders (good and bad files), time scaling, synthetic prefix chains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from phase6.fleet.workload import BLOCK_TOKENS, RequestClass, load_azure, load_mooncake, synthetic

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mooncake_rows() -> list[dict]:
    return [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 512, "output_length": 5, "hash_ids": [7]},
    ]


def test_mooncake_loads_columns(tmp_path: Path) -> None:
    w = load_mooncake(write_jsonl(tmp_path / "t.jsonl", mooncake_rows()))
    assert len(w) == 3
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.5, 1.5])  # ms -> s
    assert w.input_tokens.tolist() == [1000, 1100, 512] and w.output_tokens.tolist() == [10, 20, 5]
    assert w.hash_ids == [(0, 1), (0, 1, 2), (7,)]
    assert w.session.tolist() == [0, 0, 7]  # first block = conversation key
    assert w.rate == pytest.approx(2 / 1.5)


@pytest.mark.parametrize(
    "bad,line,msg",
    [
        ({"timestamp": 600, "input_length": 10, "output_length": 1}, 2, "missing field 'hash_ids'"),
        ({"timestamp": 600, "input_length": -5, "output_length": 1, "hash_ids": []}, 2, "input length"),
        ({"timestamp": 600, "input_length": 10, "output_length": 0, "hash_ids": [3]}, 2, "output length"),
        ({"timestamp": 100, "input_length": 10, "output_length": 1, "hash_ids": [3]}, 2, "not sorted"),
        ({"timestamp": 600, "input_length": 2000, "output_length": 1, "hash_ids": [3]}, 2, "needs ceil"),
        ({"timestamp": "x", "input_length": 10, "output_length": 1, "hash_ids": [3]}, 2, "timestamp must be a number"),
    ],
)
def test_mooncake_bad_rows_name_the_line(tmp_path: Path, bad: dict, line: int, msg: str) -> None:
    rows = [{"timestamp": 500, "input_length": 10, "output_length": 1, "hash_ids": [1]}, bad]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=msg) as e:
        load_mooncake(path)
    assert f"bad.jsonl:{line}:" in str(e.value) and "\n" not in str(e.value)


def test_mooncake_not_json(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{oops\n')
    with pytest.raises(ValueError, match=r"x.jsonl:2: not valid JSON"):
        load_mooncake(p)


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_loads_and_parses_seven_digit_fractions(tmp_path: Path) -> None:
    p = tmp_path / "az.csv"
    p.write_text(AZ_HEADER + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    w = load_azure(p)
    assert w.input_tokens.tolist() == [374, 396] and w.output_tokens.tolist() == [44, 109]
    assert w.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert w.hash_ids is None and w.session.tolist() == [0, 1]


@pytest.mark.parametrize(
    "body,line,msg",
    [
        ("2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:45.1,10,1\n", 3, "not sorted"),
        ("2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:47.1,-3,1\n", 3, "input length"),
        ("2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:47.1,,1\n", 3, "missing field 'ContextTokens'"),
        ("2023-11-16 18:15:46.1,374,44\nyesterday,3,1\n", 3, "TIMESTAMP"),
    ],
)
def test_azure_bad_rows_name_the_line(tmp_path: Path, body: str, line: int, msg: str) -> None:
    p = tmp_path / "az.csv"
    p.write_text(AZ_HEADER + body)
    with pytest.raises(ValueError, match=msg) as e:
        load_azure(p)
    assert f"az.csv:{line}:" in str(e.value)


def test_azure_missing_column(tmp_path: Path) -> None:
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.1,374\n")
    with pytest.raises(ValueError, match=r"az.csv:1: missing column\(s\) GeneratedTokens"):
        load_azure(p)


def test_time_scaling_and_repeat(tmp_path: Path) -> None:
    w = load_mooncake(write_jsonl(tmp_path / "t.jsonl", mooncake_rows()))
    assert w.at_rate(10.0).rate == pytest.approx(10.0)
    assert w.scaled(2.0).duration_s == pytest.approx(w.duration_s / 2)
    r = w.repeated(3)
    assert len(r) == 9 and np.all(np.diff(r.arrival_s) >= 0)
    first, second = set().union(*r.hash_ids[:3]), set().union(*r.hash_ids[3:6])
    assert not first & second  # copies never share prefixes or sessions
    assert not set(r.session[:3]) & set(r.session[3:6])


def test_synthetic_is_seeded_and_chains_prefixes() -> None:
    cls = [RequestClass(1.0, 100, 600, 10, 50)]
    a = synthetic(300, 5.0, cls, seed=3, prefix_groups=2, prefix_tokens=1024, turns=3, think_time_s=2.0)
    b = synthetic(300, 5.0, cls, seed=3, prefix_groups=2, prefix_tokens=1024, turns=3, think_time_s=2.0)
    assert a.hash_ids == b.hash_ids and np.array_equal(a.arrival_s, b.arrival_s)
    assert a.rate == pytest.approx(5.0, rel=0.2)
    for h, n in zip(a.hash_ids, a.input_tokens, strict=True):
        assert len(h) == math.ceil(n / BLOCK_TOKENS)
    # every session starts with one of two 2-block system prompts
    assert len({h[:2] for h in a.hash_ids}) == 2
    # a later turn repeats its session's previous prompt (full blocks) as its prefix
    by_sess: dict[int, list[int]] = {}
    for i, s in enumerate(a.session.tolist()):
        by_sess.setdefault(s, []).append(i)
    checked = 0
    for idx in by_sess.values():
        for prev, nxt in zip(idx, idx[1:], strict=False):
            full = int(a.input_tokens[prev]) // BLOCK_TOKENS
            assert a.hash_ids[nxt][:full] == a.hash_ids[prev][:full]
            assert a.input_tokens[nxt] > a.input_tokens[prev] + a.output_tokens[prev]
            checked += 1
    assert checked > 100


def test_synthetic_rejects_bad_class() -> None:
    with pytest.raises(ValueError, match=r"workload.classes\[0\]"):
        synthetic(10, 1.0, [RequestClass(1.0, 500, 100, 1, 2)], seed=0)


@pytest.mark.skipif(not (SHARED / "mooncake-traces").is_dir(), reason="shared data not present")
def test_real_traces_load() -> None:
    m = load_mooncake(SHARED / "mooncake-traces" / "synthetic_trace.jsonl")
    assert len(m) == 3993 and m.input_tokens.mean() == pytest.approx(15325.48, abs=0.01)
    a = load_azure(SHARED / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv")
    assert len(a) == 19366 and a.output_tokens.mean() == pytest.approx(211.13, abs=0.01)
