"""Regression battery on tiny local lm-eval tasks (parity with a hand computation), verdict rules, pairwise judge."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from phase6.evals.battery import BatteryResult, LocalTask, TaskScore, delta_rows, run_battery, write_local_task
from phase6.evals.judge import judge_pairwise, parse_verdict
from phase6.evals.verdict import dpo_verdict, length_check
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

MC_ROWS = [
    {"question": f"What is {a} + {b}?", "choices": [str(a + b), str(a + b + 1), str(a - b)], "answer": i % 3}
    for i, (a, b) in enumerate([(3, 4), (10, 2), (7, 7), (12, 5), (9, 1), (6, 8), (2, 2), (15, 3)])
]
GEN_ROWS = [{"prompt": f"Call the tool for city {c}:", "target": f'get_weather("{c}")'} for c in ("Oslo", "Rome")]


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    texts = [r["question"] + " " + " ".join(r["choices"]) for r in MC_ROWS] * 4 + [r["prompt"] for r in GEN_ROWS]
    tok = build_tiny_tokenizer(texts, vocab_size=300)
    model = build_tiny_model(tok, seed=1)
    d = tmp_path / "base"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def hand_mc_accuracy(model_dir: Path, rows: list[dict]) -> float:
    """lm-eval multiple_choice by hand: argmax over choices of log P(" " + choice | "Question: q\\nAnswer:")."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    correct = 0
    for r in rows:
        ctx = f"Question: {r['question']}\nAnswer:"
        scores = []
        for c in r["choices"]:
            whole = tok(ctx + " " + c, add_special_tokens=False)["input_ids"]
            n_ctx = len(tok(ctx, add_special_tokens=False)["input_ids"])
            ids = torch.tensor([whole])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            scores.append(sum(logp[t - 1, whole[t]].item() for t in range(n_ctx, len(whole))))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == r["answer"])
    return correct / len(rows)


def test_battery_local_tasks_match_hand_computation_and_adapter_changes_scores(tiny_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tasks = [
        LocalTask(name="arith_mc", path=jsonl(tmp_path / "mc.jsonl", MC_ROWS)),
        LocalTask(name="toolcall", path=jsonl(tmp_path / "gen.jsonl", GEN_ROWS), kind="generate", max_gen_toks=8),
    ]
    base = run_battery(
        str(tiny_dir),
        [],
        label="base",
        local_tasks=tasks,
        task_dir=tmp_path / "t",
        batch_size=4,
        device="cpu",
        dtype="float32",
    )
    assert set(base.scores) == {"arith_mc", "toolcall"}
    assert base.scores["arith_mc"].metric == "acc" and base.scores["arith_mc"].n == len(MC_ROWS)
    # parity with the hand computation: identical decisions, so exactly equal accuracy
    assert base.scores["arith_mc"].value == pytest.approx(hand_mc_accuracy(tiny_dir, MC_ROWS), abs=1e-12)
    assert base.scores["toolcall"].value == 0.0  # a random model does not emit the exact call

    # An adapter with large random B must change the log-likelihoods lm-eval sees through peft=<dir>
    torch.manual_seed(3)  # this fixed adapter flips one of the 8 decisions of the fixed tiny base (checked by hand)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_dir),
        LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=1.0)
    peft_model.save_pretrained(tmp_path / "adapter")
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "merged")
    after = run_battery(
        str(tiny_dir),
        [],
        label="base+adapter",
        peft=str(tmp_path / "adapter"),
        local_tasks=tasks[:1],
        task_dir=tmp_path / "t",
        batch_size=4,
        device="cpu",
        dtype="float32",
    )
    assert after.scores["arith_mc"].value == pytest.approx(hand_mc_accuracy(tmp_path / "merged", MC_ROWS), abs=1e-12)
    assert after.scores["arith_mc"].value != base.scores["arith_mc"].value
    rows = delta_rows(BatteryResult("base", {"arith_mc": base.scores["arith_mc"]}, {}), after)
    d = 100 * (after.scores["arith_mc"].value - base.scores["arith_mc"].value)
    assert rows[0]["task"] == "arith_mc" and rows[0]["delta (pts)"] == f"{d:+.2f}"


def test_local_task_rows_are_validated(tmp_path: Path) -> None:
    bad = [MC_ROWS[0], {"question": "q", "choices": ["a", "b"], "answer": 2}]
    with pytest.raises(ValueError, match=r"mc\.jsonl: line 2: expected"):
        write_local_task(LocalTask(name="x", path=jsonl(tmp_path / "mc.jsonl", bad)), tmp_path / "t")
    with pytest.raises(ValueError, match=r"gen\.jsonl: line 1: expected"):
        write_local_task(
            LocalTask(name="y", path=jsonl(tmp_path / "gen.jsonl", [{"prompt": "p"}]), kind="generate"), tmp_path / "t"
        )
    with pytest.raises(ValueError, match=r"eval\.local_tasks\.kind"):
        LocalTask(name="z", path="p", kind="loglikelihood")


def score(task: str, value: float, se: float | None = 0.004) -> TaskScore:
    return TaskScore(task=task, metric="acc", value=value, stderr=se, n=1000)


def battery(label: str, **values: float) -> BatteryResult:
    return BatteryResult(label, {k: score(k, v) for k, v in values.items()}, {})


def test_verdict_rules() -> None:
    before = battery("base", mmlu=0.700, truthfulqa_mc2=0.500)
    ok = dpo_verdict(before, battery("a", mmlu=0.685, truthfulqa_mc2=0.560), target="truthfulqa_mc2", length_ratio=1.2)
    assert ok.status == "PASS"
    assert [c.passed for c in ok.checks] == [True, True, True]
    assert ok.checks[0].bar == "delta > 2 SE (1.13 pts)"  # 200 * sqrt(2) * 0.004
    within = dpo_verdict(
        before, battery("a", mmlu=0.70, truthfulqa_mc2=0.505), target="truthfulqa_mc2", length_ratio=1.0
    )
    assert within.status == "FAIL" and within.checks[0].note == "improved within noise"
    mmlu_drop = dpo_verdict(
        before, battery("a", mmlu=0.675, truthfulqa_mc2=0.56), target="truthfulqa_mc2", length_ratio=1.0
    )
    assert mmlu_drop.status == "FAIL" and mmlu_drop.checks[1].value == "-2.50 pts"
    no_target = dpo_verdict(
        before, battery("a", mmlu=0.70, truthfulqa_mc2=0.50), target="truthfulqa_mc2", length_ratio=1.0
    )
    assert no_target.status == "FAIL" and no_target.checks[0].passed is False
    unmeasured = dpo_verdict(
        battery("b", truthfulqa_mc2=0.5), battery("a", truthfulqa_mc2=0.6), target="truthfulqa_mc2", length_ratio=1.0
    )
    assert unmeasured.status == "INCOMPLETE" and unmeasured.checks[1].passed is None
    # length: above the bar fails even when truncated (a lower bound); below the bar with truncation is unmeasured
    assert length_check(1.31).passed is False
    assert length_check(1.5, truncated_frac=0.2).passed is False
    assert length_check(1.1, truncated_frac=0.2).passed is None
    assert length_check(1.3).passed is True
    judge_skipped = dpo_verdict(None, None, target="judge", length_ratio=1.0)
    assert judge_skipped.checks[0].passed is None and "no judge endpoint" in judge_skipped.checks[0].note


def test_pairwise_judge_swaps_positions_and_parses_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake OpenAI-compatible judge that always prefers the longer answer (and sees the API key header)."""
    seen_auth = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_auth.append(request.headers.get("authorization"))
        body = json.loads(request.content)
        text = body["messages"][1]["content"]
        a = text.split("[The Start of Assistant A's Answer]\n", 1)[1].split("\n[The End", 1)[0]
        b = text.split("[The Start of Assistant B's Answer]\n", 1)[1].split("\n[The End", 1)[0]
        verdict = "[[A]]" if len(a) > len(b) else "[[B]]" if len(b) > len(a) else "[[C]]"
        if "broken" in text:
            verdict = "no verdict here"
        return httpx.Response(200, json={"choices": [{"message": {"content": f"Reasoning... {verdict}"}}]})

    monkeypatch.setenv("JUDGE_KEY", "sk-test-not-a-real-key-123456")
    res = judge_pairwise(
        ["q1", "q2", "q3", "broken"],
        before=["short", "a much longer answer", "same", "x"],
        after=["a longer answer", "tiny", "same", "y"],
        base_url="http://127.0.0.1:9/v1",
        model="judge",
        api_key_env="JUDGE_KEY",
        transport=httpx.MockTransport(handler),
    )
    assert (res.wins, res.losses, res.ties, res.errors) == (1, 1, 1, 1)
    assert res.win_rate == pytest.approx(0.5)
    assert len(seen_auth) == 8 and all(h == "Bearer sk-test-not-a-real-key-123456" for h in seen_auth)
    assert parse_verdict("first [[B]] then final [[A]]") == "A" and parse_verdict("none") is None
    with pytest.raises(ValueError, match=r"judge\.api_key_env: environment variable MISSING_KEY is not set"):
        judge_pairwise(["q"], ["a"], ["b"], base_url="http://x", model="m", api_key_env="MISSING_KEY")
