"""The one percentile and goodput (phase6.serving.slo) under 6B's stats and the fleet's analysis."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phase6.config.slo import SLOConfig
from phase6.serving.slo import good_masks, percentile


def test_percentile_is_linear_and_skips_nan() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, math.nan, 3.0], 99) == pytest.approx(1.0 + 0.99 * 2.0)
    assert math.isnan(percentile([], 50)) and math.isnan(percentile([math.nan], 50))
    assert percentile(np.arange(101.0), 99) == pytest.approx(99.0)


def test_good_masks_thresholds_and_nan_rules() -> None:
    slo = SLOConfig(ttft_ms=100.0, tpot_ms=10.0)
    ttft = np.array([0.05, 0.1, 0.2, math.nan, 0.05])
    tpot = np.array([0.01, 0.005, 0.001, 0.001, math.nan])  # the last is a one-token answer: no TPOT, passes
    m = good_masks(slo, ttft, tpot)
    assert m.ttft.tolist() == [True, True, False, False, True]  # the limit itself is good, NaN TTFT is not
    assert m.token.tolist() == [True, True, True, True, True]
    assert m.good.tolist() == [True, True, False, False, True]
    assert good_masks(SLOConfig(ttft_ms=100.0, tpot_ms=5.0), ttft, tpot).good.tolist() == [
        False,
        True,
        False,
        False,
        True,
    ]


def test_good_masks_unset_limits_e2e_and_tbt() -> None:
    ttft, tpot = np.array([5.0, 0.1]), np.array([1.0, 0.01])
    e2e_only = SLOConfig(ttft_ms=None, tpot_ms=None, e2e_ms=1000.0)
    assert good_masks(e2e_only, ttft, tpot, e2e_s=np.array([0.9, 1.5])).good.tolist() == [True, False]
    tbt = SLOConfig(ttft_ms=None, tpot_ms=None, tbt_ms=20.0)
    assert good_masks(tbt, ttft, tpot, tbt_tail_s=np.array([0.03, math.nan])).good.tolist() == [False, True]


def test_one_slo_type_for_both_jobs() -> None:
    from phase6.config.fleet import FleetRunConfig
    from phase6.config.serve import ServeBenchRunConfig

    assert type(FleetRunConfig().slo) is type(ServeBenchRunConfig().slo) is SLOConfig
    assert SLOConfig(e2e_ms=5000.0).describe() == "TTFT <= 2000 ms AND TPOT <= 100 ms AND E2E <= 5000 ms"
