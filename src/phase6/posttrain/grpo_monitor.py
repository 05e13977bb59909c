"""Reward-hacking monitor: what the policy is being paid for, step by step.

Per generation batch it records the completion lengths (tokens) and, from the batch's reward columns and texts:

- ``hack/format_only_frac``      share of completions with the ``#### N`` format but a wrong answer
- ``hack/format_reward_share``   share of the total (weighted) reward paid by the format reward alone
- ``hack/no_reasoning_frac``     share of completions with fewer than ``min_reasoning_words`` words before the answer
- ``hack/no_reasoning_correct_frac`` share of *correct* completions without reasoning (guessed or copied answers)
- ``hack/truncated_frac``        share that hit ``max_completion_length`` (truncation silently zeroes GSM8K rewards)
- ``lengths/p10|p50|p90``        completion-length quantiles

The first and last batches' lengths give the before/after histogram. The signatures of the hacks we watch for: format
share rising while correctness is flat (format farming); lengths collapsing together with no-reasoning answers rising
(answer guessing); lengths pinned at the cap (rambling, zero reward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phase6.figures import save_figure


def _quantile(sorted_values: Sequence[int], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[idx])


@dataclass
class RewardMonitor:
    """Per-step hacking indicators; ``observe`` once per generation batch."""

    max_completion_length: int
    correct_column: str
    """Name of the reward function whose value > 0.5 means 'correct'."""
    format_column: str | None = None
    """Name of the format reward function, if one is used."""
    has_format: Callable[[str], bool] = lambda text: False
    reasoning_words: Callable[[str], int] = lambda text: len(text.split())
    min_reasoning_words: int = 5
    lengths_by_step: dict[int, list[int]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def observe(
        self,
        step: int,
        texts: list[str],
        lengths: list[int],
        rewards: dict[str, list[float]],
        weights: dict[str, float],
    ) -> dict[str, float]:
        n = len(texts)
        assert n == len(lengths) and all(len(v) == n for v in rewards.values()), "one value per completion"
        correct = [r > 0.5 for r in rewards[self.correct_column]]
        formatted = [self.has_format(t) for t in texts]
        no_reasoning = [self.reasoning_words(t) < self.min_reasoning_words for t in texts]
        total = sum(weights[k] * sum(v) for k, v in rewards.items())
        fmt_paid = weights[self.format_column] * sum(rewards[self.format_column]) if self.format_column else 0.0
        ordered = sorted(lengths)
        metrics = {
            "hack/format_only_frac": sum(f and not c for f, c in zip(formatted, correct, strict=True)) / n,
            "hack/format_reward_share": fmt_paid / total if total > 0 else 0.0,
            "hack/no_reasoning_frac": sum(no_reasoning) / n,
            "hack/no_reasoning_correct_frac": (
                sum(c and nr for c, nr in zip(correct, no_reasoning, strict=True)) / max(1, sum(correct))
            ),
            "hack/truncated_frac": sum(ln >= self.max_completion_length for ln in lengths) / n,
            "lengths/p10": _quantile(ordered, 0.1),
            "lengths/p50": _quantile(ordered, 0.5),
            "lengths/p90": _quantile(ordered, 0.9),
            "accuracy": sum(correct) / n,
        }
        self.lengths_by_step.setdefault(step, []).extend(lengths)
        self.rows.append({"step": step, **metrics})
        return metrics

    def before_after(self) -> tuple[list[int], list[int]]:
        steps = sorted(self.lengths_by_step)
        if not steps:
            return [], []
        return self.lengths_by_step[steps[0]], self.lengths_by_step[steps[-1]]

    def summary(self) -> list[dict[str, Any]]:
        """First vs last batch of every indicator (the rows of the report's reward-hacking table)."""
        if not self.rows:
            return []
        first, last = self.rows[0], self.rows[-1]
        return [
            {"indicator": k, "first_step": first[k], "last_step": last[k], "change": last[k] - first[k]}
            for k in first
            if k != "step"
        ]


def plot_length_histogram(before: list[int], after: list[int], path: Path, cap: int) -> Path:
    """Completion-length histograms of the first and the last rollout batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    bins = list(range(0, cap + max(1, cap // 32), max(1, cap // 32)))
    ax.hist(before, bins=bins, alpha=0.55, label=f"first batch (n={len(before)})")
    ax.hist(after, bins=bins, alpha=0.55, label=f"last batch (n={len(after)})")
    ax.axvline(cap, color="k", ls="--", lw=0.8, label="max_completion_length")
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("completions")
    ax.legend(fontsize=8, loc="upper left")  # "best" scans every bar (slow, and matplotlib warns)
    return save_figure(fig, path)
