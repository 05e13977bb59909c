"""A toy verifiable task for CPU tests and smoke runs: the prompt names a digit, the completion should repeat it.

Reward = share of the completion's non-space characters that are the named digit (in [0, 1], dense, so a randomly
initialised 0.1M-parameter model gets a non-zero group variance from its first batch and GRPO has a signal).
It exercises exactly the GSM8K path (conversational prompt, ``solution`` column, reward function by name), so an
end-to-end test on it checks the trainer, not the task.
"""

from __future__ import annotations

import random
from typing import Any

from phase6.tasks.gsm8k import completion_text

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digit_rows(num_rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows in TRL's conversational form: {"prompt": [user message], "solution": "7"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        d = rng.randrange(10)
        rows.append({"prompt": [{"role": "user", "content": f"Say {WORDS[d]}: {d} {d} {d}"}], "solution": str(d)})
    return rows


def digit_share(text: str, digit: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c == digit for c in chars) / len(chars) if chars else 0.0


def digit_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: share of the completion's characters equal to the row's digit."""
    return [digit_share(completion_text(c), s) for c, s in zip(completions, solution, strict=True)]


def tokenizer_corpus() -> list[str]:
    """Texts to train the tiny test tokenizer on (prompts + digit runs), so digits are single tokens."""
    return [f"Say {w}: {d} {d} {d}" for d, w in enumerate(WORDS)] * 20 + [" ".join("0123456789")] * 20
