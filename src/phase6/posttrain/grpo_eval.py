"""pass@1 (greedy) and pass@k (sampled) of a rollout engine on a verifiable task, and the paired before/after test.

The same engine that generates rollouts answers the eval questions, with the same chat template TRL applies in
training (``apply_chat_template(add_generation_prompt=True)``) and the same scorer, so before and after differ only
in the weights. Greedy pass@1 is reported with the flexible scorer (headline) and the strict ``#### N`` scorer (a
strict-only gain is format learning; anchors §5). pass@k uses Chen et al.'s unbiased estimator with n = k samples.
Before/after significance: exact McNemar test on the per-question greedy outcomes (GSM8K test n = 1,319: one
question is 0.076 points, the standard error at 75% is ~1.2 points, so a paired test is the honest comparison).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from phase6.rollout import RolloutEngine, SamplingParams
from phase6.tasks.gsm8k import pass_at_k


@dataclass
class EvalResult:
    """Aggregates plus the per-question greedy outcomes (for the paired test)."""

    metrics: dict[str, float]
    greedy_correct: list[bool]


def tokenize_prompts(tokenizer: Any, prompts: Sequence[list[dict[str, str]]], **chat_kwargs: Any) -> list[list[int]]:
    """Chat-template token ids exactly as TRL's GRPOTrainer builds them for conversational prompts."""
    out = tokenizer.apply_chat_template(
        conversation=list(prompts), add_generation_prompt=True, tokenize=True, return_dict=True, **chat_kwargs
    )
    return [list(ids) for ids in out["input_ids"]]


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    score: Callable[[str, str], float],
    k: int,
    temperature: float,
    max_new_tokens: int,
    batch_prompts: int,
    strict_score: Callable[[str, str], float] | None = None,
) -> EvalResult:
    """Greedy + k samples per row (``rows``: {"prompt": messages, "solution": str}); scores with ``score``."""
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    correct: list[bool] = []
    strict: list[bool] = []
    pass_k: list[float] = []
    sampled_acc: list[float] = []
    lengths: list[int] = []
    truncated = 0
    for start in range(0, len(rows), batch_prompts):
        chunk = rows[start : start + batch_prompts]
        ids = tokenize_prompts(tokenizer, [r["prompt"] for r in chunk])
        out = engine.generate(ids, greedy, num_generations=1)
        texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        for row, text, comp in zip(chunk, texts, out.completion_ids, strict=True):
            correct.append(score(text, row["solution"]) > 0.5)
            if strict_score is not None:
                strict.append(strict_score(text, row["solution"]) > 0.5)
            lengths.append(len(comp))
            truncated += len(comp) >= max_new_tokens
        if k > 1:
            repeated = [p for p in ids for _ in range(k)]
            outs = engine.generate(repeated, sampled, num_generations=k)
            texts = tokenizer.batch_decode(outs.completion_ids, skip_special_tokens=True)
            for i, row in enumerate(chunk):
                c = sum(score(t, row["solution"]) > 0.5 for t in texts[i * k : (i + 1) * k])
                pass_k.append(pass_at_k(k, c, k))
                sampled_acc.append(c / k)
    n = len(rows)
    metrics = {
        "num_questions": float(n),
        "pass@1": 100.0 * sum(correct) / n,
        "mean_length": sum(lengths) / n,
        "truncated_pct": 100.0 * truncated / n,
    }
    if strict:
        metrics["pass@1_strict"] = 100.0 * sum(strict) / n
    if pass_k:
        metrics[f"pass@{k}"] = 100.0 * sum(pass_k) / n
        metrics["sampled_acc"] = 100.0 * sum(sampled_acc) / n
    return EvalResult(metrics, correct)


def mcnemar(before: Sequence[bool], after: Sequence[bool]) -> dict[str, float]:
    """Exact two-sided McNemar test on paired outcomes: flips wrong->right vs right->wrong."""
    if len(before) != len(after):
        raise ValueError(f"paired test needs equal lengths, got {len(before)} and {len(after)}")
    gained = sum((not b) and a for b, a in zip(before, after, strict=True))
    lost = sum(b and (not a) for b, a in zip(before, after, strict=True))
    n = gained + lost
    if n == 0:
        p = 1.0
    else:
        tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
        p = min(1.0, 2 * tail)
    delta = 100.0 * (gained - lost) / len(before) if before else 0.0
    return {"gained": float(gained), "lost": float(lost), "delta_points": delta, "p_value": p}
