"""Latency percentiles and goodput at an SLO: the one definition 6B (measured requests, phase6.serving.stats) and the
fleet (simulated requests, phase6.fleet.analysis) both use. numpy only (no torch, no HTTP client).

- ``percentile``: numpy's linear interpolation (vLLM's choice) over the non-NaN values; NaN when none is left.
- ``good_masks``: per request, whether it meets each threshold of a ``SLOConfig`` (seconds in, ms limits). A NaN
  TPOT or token-gap statistic (a one-token answer has no gap) passes, a NaN TTFT or E2E (no first token, never
  finished) fails; an unset threshold passes everything. goodput = good requests / duration (the caller's span).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from phase6.config.slo import SLOConfig


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """q-th percentile (linear) of the non-NaN values; NaN for an empty list."""
    x = np.asarray(values, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else math.nan


class GoodMasks(NamedTuple):
    """Per-request booleans: TTFT ok, per-token ok (TPOT and, with slo.tbt_ms, the TBT tail), E2E ok."""

    ttft: np.ndarray
    token: np.ndarray
    e2e: np.ndarray

    @property
    def good(self) -> np.ndarray:
        return self.ttft & self.token & self.e2e


def good_masks(
    slo: SLOConfig,
    ttft_s: np.ndarray,
    tpot_s: np.ndarray,
    e2e_s: np.ndarray | None = None,
    tbt_tail_s: np.ndarray | None = None,
) -> GoodMasks:
    """Which requests meet each threshold of ``slo``; ``e2e_s`` / ``tbt_tail_s`` are needed only when that threshold
    is set (``tbt_tail_s``: the mean of each request's slowest 10 % of token gaps, phase6.fleet.tokens)."""
    ttft_s, tpot_s = np.asarray(ttft_s, dtype=np.float64), np.asarray(tpot_s, dtype=np.float64)
    every = np.ones(len(ttft_s), dtype=bool)
    ttft_ok = ttft_s <= slo.ttft_ms / 1e3 if slo.ttft_ms is not None else every
    tok_ok = ~(tpot_s > slo.tpot_ms / 1e3) if slo.tpot_ms is not None else every.copy()
    if slo.tbt_ms is not None:
        assert tbt_tail_s is not None, "slo.tbt_ms is set: pass each request's token-gap tail"
        tok_ok &= ~(np.asarray(tbt_tail_s) > slo.tbt_ms / 1e3)
    e2e_ok = every
    if slo.e2e_ms is not None:
        assert e2e_s is not None, "slo.e2e_ms is set: pass each request's end-to-end latency"
        e2e_ok = np.asarray(e2e_s, dtype=np.float64) <= slo.e2e_ms / 1e3
    return GoodMasks(ttft_ok, tok_ok, e2e_ok)
