"""A toy verifiable task for CPU tests and smoke runs: the prompt names a digit, the completion should repeat it.

Reward = min(1, occurrences of the named digit / ``TARGET_COUNT``): dense, so a randomly initialised 0.1M-parameter
model gets a non-zero group variance from its first batch and GRPO has a signal, and not normalized by length, so
stopping early never pays (a length-normalized share made "digit then EOS" optimal and runs collapsed into
immediate EOS, where whole groups score 0 and GRPO has no gradient left to recover).
It exercises exactly the GSM8K path (conversational prompt, ``solution`` column, reward function by name), so an
end-to-end test on it checks the trainer, not the task.
"""

from __future__ import annotations

import random
from typing import Any

from phase6.tasks.gsm8k import completion_text

TARGET_COUNT = 8
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digit_rows(num_rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows in TRL's conversational form: {"prompt": [user message], "solution": "7"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        d = rng.randrange(10)
        rows.append({"prompt": [{"role": "user", "content": f"Say {WORDS[d]}: {d} {d} {d}"}], "solution": str(d)})
    return rows


def digit_score(text: str, digit: str) -> float:
    """min(1, occurrences of ``digit`` / TARGET_COUNT)."""
    return min(1.0, text.count(digit) / TARGET_COUNT)


def digit_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: ``digit_score`` of each completion against its row's digit."""
    return [digit_score(completion_text(c), s) for c, s in zip(completions, solution, strict=True)]


def tokenizer_corpus() -> list[str]:
    """Texts to train the tiny test tokenizer on (prompts + digit runs), so digits are single tokens."""
    return [f"Say {w}: {d} {d} {d}" for d, w in enumerate(WORDS)] * 20 + [" ".join("0123456789")] * 20
