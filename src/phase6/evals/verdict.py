"""The 6C evidence bar as code: target improved; MMLU drop ≤ 2 points; generation length ratio ≤ 1.3×.

"Improved" means the gain exceeds two standard errors of the before/after difference (lm-eval's per-task stderr,
combined as if independent, which is conservative because the same items are scored twice); a gain inside that band
is reported as "improved within noise" and does not pass. The MMLU bar is a point estimate: at 14,042 questions its
standard error is ~0.4 points, well below the 2-point bar.

A check that was not measured (task not in the battery, no length stats) is reported as ``not measured`` and makes the
verdict ``INCOMPLETE``, never ``PASS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from phase6.evals.battery import BatteryResult


@dataclass
class Check:
    name: str
    value: str
    bar: str
    passed: bool | None
    """None = not measured."""
    note: str = ""

    def row(self) -> dict[str, Any]:
        status = "not measured" if self.passed is None else ("pass" if self.passed else "FAIL")
        return {"check": self.name, "value": self.value, "bar": self.bar, "status": status, "note": self.note}


@dataclass
class Verdict:
    checks: list[Check]

    @property
    def status(self) -> str:
        if any(c.passed is False for c in self.checks):
            return "FAIL"
        if any(c.passed is None for c in self.checks):
            return "INCOMPLETE"
        return "PASS"

    def rows(self) -> list[dict[str, Any]]:
        return [c.row() for c in self.checks]


def _noise_pts(before: BatteryResult, after: BatteryResult, task: str) -> float | None:
    """Two standard errors of the difference of two independent estimates, in points (a conservative noise band:
    the same items are scored twice, so the paired stderr would be smaller)."""
    b, a = before.scores[task].stderr, after.scores[task].stderr
    if b is None or a is None:
        return None
    return 200 * math.sqrt(b * b + a * a)


def target_check(
    before: BatteryResult | None,
    after: BatteryResult | None,
    target: str,
    judge_win_rate: float | None,
    judge_error: str | None = None,
    battery_error: str | None = None,
) -> Check:
    """Target improved: a battery task whose score must rise, or ``judge`` (pairwise win rate > 50%)."""
    if target == "judge":
        if judge_win_rate is None:
            why = f"judge unavailable: {judge_error}" if judge_error else "no judge endpoint configured"
            return Check("target improved (judge)", "skipped", "win rate > 50%", None, why)
        return Check("target improved (judge)", f"{100 * judge_win_rate:.1f}%", "win rate > 50%", judge_win_rate > 0.5)
    if before is None or after is None or target not in before.scores or target not in after.scores:
        why = f"battery unavailable: {battery_error}" if battery_error else f"{target} not in the battery"
        return Check(f"target improved ({target})", "—", "delta > 0", None, why)
    d = 100 * (after.scores[target].value - before.scores[target].value)
    noise = _noise_pts(before, after, target)
    if noise is None:
        return Check(f"target improved ({target})", f"{d:+.2f} pts", "delta > 0", d > 0, "no stderr: point estimate")
    bar = f"delta > 2 SE ({noise:.2f} pts)"
    note = "" if d > noise else ("improved within noise" if d > 0 else "")
    return Check(f"target improved ({target})", f"{d:+.2f} pts", bar, d > noise, note)


def mmlu_check(
    before: BatteryResult | None,
    after: BatteryResult | None,
    max_drop_pts: float = 2.0,
    task: str = "mmlu",
    battery_error: str | None = None,
) -> Check:
    if before is None or after is None or task not in before.scores or task not in after.scores:
        why = f"battery unavailable: {battery_error}" if battery_error else f"{task} not in the battery"
        return Check("MMLU drop", "—", f"≤ {max_drop_pts:g} pts", None, why)
    d = 100 * (after.scores[task].value - before.scores[task].value)
    return Check("MMLU drop", f"{d:+.2f} pts", f"≥ -{max_drop_pts:g} pts", d >= -max_drop_pts)


def length_check(ratio: float | None, max_ratio: float = 1.3, truncated_frac: float | None = None) -> Check:
    """Mean generated tokens after/before. When some 'after' generations hit max_new_tokens the measured ratio is only
    a lower bound: above the bar it is still a definite FAIL, below it the check is not measured (no false PASS)."""
    name, bar = "length ratio (mean tokens)", f"≤ {max_ratio:g}x"
    if ratio is None:
        return Check(name, "—", bar, None, "no length statistics")
    if ratio > max_ratio:
        return Check(name, f"{ratio:.3f}x", bar, False)
    if truncated_frac:
        note = (
            f"{100 * truncated_frac:.0f}% of 'after' generations hit max_new_tokens, so the ratio is a lower "
            "bound; raise diagnostics.max_new_tokens"
        )
        return Check(name, f"≥ {ratio:.3f}x", bar, None, note)
    return Check(name, f"{ratio:.3f}x", bar, True)


def dpo_verdict(
    before: BatteryResult | None,
    after: BatteryResult | None,
    *,
    target: str,
    length_ratio: float | None,
    length_truncated_frac: float | None = None,
    judge_win_rate: float | None = None,
    max_mmlu_drop_pts: float = 2.0,
    max_length_ratio: float = 1.3,
    judge_error: str | None = None,
    battery_error: str | None = None,
) -> Verdict:
    """``judge_error`` / ``battery_error``: why an evaluation that was asked for could not run (the checks it feeds
    are then ``not measured`` with that reason, and the verdict INCOMPLETE)."""
    return Verdict(
        [
            target_check(before, after, target, judge_win_rate, judge_error, battery_error),
            mmlu_check(before, after, max_mmlu_drop_pts, battery_error=battery_error),
            length_check(length_ratio, max_length_ratio, length_truncated_frac),
        ]
    )
