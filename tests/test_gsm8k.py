"""GSM8K task: answer extraction edge cases, adversarial inputs in bounded time, loader validation, pass@k."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from phase6.tasks import gsm8k
from phase6.tasks.gsm8k import extract_answer, pass_at_k, score, score_strict

REF = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"


@pytest.mark.parametrize(
    "completion",
    [
        "#### 72",
        "So the total is 72.\n#### 72",
        "#### 72.",
        "#### $72",
        "#### 72 clips",
        "#### 72.0",
        "#### 72.00",
        "####72",
        "work...\n#### 1,000 no\n#### 72",  # several ####: the last one counts
        "The answer is 72.",  # no #### -> last number
        "She sold \\boxed{72} clips in total, after 3 days",  # boxed beats a later number
        "Total: $72 dollars.",
        "٧٢",  # Arabic-Indic digits
        "＃＃＃＃ ７２",  # full-width digits (and full-width #, so: last number)
    ],
)
def test_score_accepts_equal_values(completion: str) -> None:
    assert score(completion, REF) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "#### 27",
        "#### 720",
        "#### 7.2",
        "#### -72",
        "The answer is 72, no wait, 73",
        "72 is wrong; the answer is #### 71",
        "#### 72 is what I'd guess but really \n#### 70",
        "no numbers at all",
    ],
)
def test_score_rejects_other_values(completion: str) -> None:
    assert score(completion, REF) == 0.0


def test_negatives_commas_and_ranges() -> None:
    assert score("#### -5", "#### -5") == 1.0
    assert score("the change is −5 degrees", "#### -5") == 1.0  # U+2212 minus
    assert score("pages 3-5", "#### 5") == 1.0  # a hyphen glued to a word is not a sign
    assert score("#### 1,080", "... #### 1,080") == 1.0
    assert score("#### 1080.", "#### 1,080") == 1.0
    assert gsm8k.reference_answer("x\n#### 109,200,000") == "109200000"
    assert gsm8k.reference_answer("18.50") == "18.5"


def test_strict_needs_the_marker() -> None:
    assert score_strict("The answer is 72.", REF) == 0.0
    assert score_strict("blah\n#### 72", REF) == 1.0
    assert gsm8k.has_answer_format("#### 3") and not gsm8k.has_answer_format("#### none")


@pytest.mark.parametrize(
    "completion",
    [
        "9" * 1_000_000,  # 1 MB of digits: not an answer, and must not hit int()'s digit limit
        "#### " + "9" * 1_000_000,
        "1," * 500_000,
        "#" * 1_000_000,
        "#### " * 200_000 + "72",
        "1 " * 500_000 + "72",
        "٣" * 300_000,
        "\\boxed{" * 100_000,
        "-" * 1_000_000 + "5",
        "." * 1_000_000,
        "$" * 1_000_000,
        "\x00\ud800" * 1000,  # lone surrogate and NUL
    ],
)
def test_adversarial_strings_are_fast_and_never_raise(completion: str) -> None:
    elapsed = []
    for _ in range(3):  # best of 3: other jobs share these cores
        t0 = time.perf_counter()
        value = score(completion, REF)
        elapsed.append(time.perf_counter() - t0)
    assert value in (0.0, 1.0)
    # Linear scans take a few ms per MB here; a quadratic regex or int() of 1M digits would take seconds.
    assert min(elapsed) < 0.05, f"{min(elapsed) * 1e3:.1f} ms"


def test_adversarial_results() -> None:
    assert score("#### " * 200_000 + "72", REF) == 1.0
    assert score("1 " * 500_000 + "72", REF) == 1.0
    assert extract_answer("9" * 1_000_000) is None
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert score("#### 72", None) == 0.0  # type: ignore[arg-type]


def test_reasoning_words_and_completion_text() -> None:
    assert gsm8k.reasoning_words("#### 72") == 0
    assert gsm8k.reasoning_words("48 / 2 = 24, 48 + 24 = 72\n#### 72") == 10
    assert gsm8k.completion_text([{"role": "assistant", "content": "#### 1"}]) == "#### 1"


def test_trl_reward_functions() -> None:
    completions = [[{"role": "assistant", "content": "#### 72"}], [{"role": "assistant", "content": "#### 0"}]]
    assert gsm8k.correctness_reward(completions, solution=["72", "72"]) == [1.0, 0.0]
    assert gsm8k.format_reward(completions) == [1.0, 1.0]


def test_pass_at_k() -> None:
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(8, 3, 8) == 1.0
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(2, 1, 3)


def test_prompt_template() -> None:
    (message,) = gsm8k.build_prompt("  What is 2+2? ")
    assert message["role"] == "user"
    assert message["content"] == 'What is 2+2?\nLet\'s think step by step and output the final answer after "####".'


def test_loader_roundtrip_and_validation(tmp_path: Path) -> None:
    rows = gsm8k.synthetic_rows(5, seed=1)
    path = gsm8k.write_jsonl(rows, tmp_path / "train.jsonl")
    loaded = gsm8k.load_gsm8k(str(tmp_path), "train")
    assert loaded == rows
    assert all(score(r.answer, r.answer) == 1.0 for r in loaded)
    assert gsm8k.load_gsm8k(str(path), limit=2) == rows[:2]
    trl_row = loaded[0].to_trl()
    assert trl_row["solution"] == loaded[0].solution and trl_row["prompt"][0]["role"] == "user"

    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"question": "q", "answer": "a"}) + "\n" + json.dumps({"question": "q", "answer": "no marker"})
    )
    with pytest.raises(ValueError, match=r"bad.jsonl: row 0: key 'answer' must end in '#### N'"):
        gsm8k.load_gsm8k(str(bad))
    bad.write_text(json.dumps({"question": "", "answer": "#### 1"}))
    with pytest.raises(ValueError, match=r"row 0: key 'question'"):
        gsm8k.load_gsm8k(str(bad))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"row 0: not valid JSON"):
        gsm8k.load_gsm8k(str(bad))
    with pytest.raises(ValueError, match="no test.jsonl"):
        gsm8k.load_gsm8k(str(tmp_path), "test")
    with pytest.raises(ValueError, match="data.path"):
        gsm8k.load_gsm8k("does-not-exist")


def test_real_train_split_loads_and_self_scores(shared: Path) -> None:
    """../shared/data/gsm8k (the official release file; skipped on a user's clone via the `shared` fixture)."""
    rows = gsm8k.load_gsm8k(str(shared / "gsm8k"), "train")
    assert len(rows) == 7473
    assert rows[0].solution == "72"
    # Every worked solution scores 1.0 against itself, strictly and flexibly.
    assert all(score_strict(r.answer, r.answer) == 1.0 for r in rows)
    assert sum("," in r.answer.rsplit("####", 1)[1] for r in rows) == 79  # thousands separators in the gold
