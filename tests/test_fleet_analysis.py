"""Goodput / SLO accounting, the rate and replica searches, and the PD-grid verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from phase6.config import HardwareConfig
from phase6.config.slo import SLOConfig
from phase6.cost import usd_per_1m_tokens
from phase6.fleet.analysis import RateSearch, binding_slo, max_rate_within_slo, min_replicas, pd_reason, summarize
from phase6.fleet.sim import SimResult

HW = HardwareConfig(name="h", usd_per_gpu_hour=2.0)
SLO = SLOConfig(ttft_ms=100.0, tpot_ms=10.0, attainment=0.9)


def result(ttft: list[float], tpot: list[float], out: list[int]) -> SimResult:
    n = len(ttft)
    arr = np.arange(n, dtype=float)
    first = arr + np.asarray(ttft)
    fin = first + np.asarray(tpot) * (np.asarray(out) - 1)
    return SimResult(
        arr,
        first,
        fin,
        arr.copy(),
        np.full(n, 100),
        np.asarray(out),
        np.asarray([50] * n),
        np.zeros(n, dtype=np.int64),
        num_gpus=4,
        replicas={"colocated": 1},
        busy_s={"colocated": 1.0},
        events=0,
        wall_s=0.0,
    )


def test_summarize_goodput_and_cost() -> None:
    # request 0 good; 1 misses TTFT; 2 misses TPOT; 3 has one output token (no TPOT to miss) and is good
    r = result([0.05, 0.2, 0.05, 0.01], [0.005, 0.005, 0.02, 0.0], [11, 11, 11, 1])
    row = summarize(r, SLO, HW)
    assert row["ttft_attainment"] == 0.75 and row["tpot_attainment"] == 0.75 and row["slo_attainment"] == 0.5
    duration = r.makespan_s
    assert duration == pytest.approx(3 + 0.01)  # request 3 (arrives at 3 s, one token after 10 ms) ends last
    assert row["goodput_req_s"] == pytest.approx(2 / duration)
    assert row["prefix_hit_rate"] == 0.5
    tok_s = 34 / duration
    assert row["throughput_tok_s"] == pytest.approx(tok_s)
    assert row["usd_per_1m_output_tokens"] == pytest.approx(usd_per_1m_tokens(4, tok_s, 2.0))
    assert row["usd_per_1m_good_output_tokens"] == pytest.approx(usd_per_1m_tokens(4, 12 / duration, 2.0))
    assert row["tpot_p50_ms"] == pytest.approx(5.0)  # one-token outputs are left out of TPOT percentiles


def fake_row(rate: float, limit: float, which: str = "tpot") -> dict:
    ok = rate <= limit
    return {
        "slo_attainment": 0.95 if ok else 0.5,
        "ttft_attainment": 0.95 if ok or which == "tpot" else 0.5,
        "tpot_attainment": 0.95 if ok or which == "ttft" else 0.5,
        "rate": rate,
    }


@pytest.mark.parametrize("start", [0.3, 7.0, 400.0])
def test_max_rate_bisection_brackets_and_converges(start: float) -> None:
    s = max_rate_within_slo(lambda r: fake_row(r, 7.3), SLO, start, steps=12)
    assert s.rate <= 7.3 and s.rate == pytest.approx(7.3, rel=0.01)
    assert s.ok_row is not None and s.fail_row is not None and s.fail_row["rate"] > 7.3


def test_max_rate_when_nothing_meets() -> None:
    s = max_rate_within_slo(lambda r: fake_row(r, 0.0), SLO, 1.0, steps=4, max_doublings=5)
    assert s.rate == 0.0 and s.ok_row is None and s.probes == 6


def test_min_replicas() -> None:
    calls: list[int] = []

    def run_with(n: int) -> dict:
        calls.append(n)
        return fake_row(-n, -11)  # meets iff n >= 11

    n, row = min_replicas(run_with, SLO, 1, 64)
    assert n == 11 and row is not None and len(calls) <= 8
    assert min_replicas(lambda n: fake_row(-n, -100), SLO, 1, 64)[0] is None


def test_pd_reason_names_the_binding_slo() -> None:
    colo = RateSearch(2.0, None, fake_row(3.0, 2.0, "tpot"), 5)
    pd = RateSearch(3.0, None, fake_row(4.0, 3.0, "ttft"), 5)
    assert binding_slo(colo.fail_row, SLO) == "TPOT"
    winner, why = pd_reason(colo, pd, "3:5", SLO)
    assert winner == "PD" and "1.50x" in why and "TPOT-bound" in why and "limit is TTFT" in why
    winner, why = pd_reason(pd, colo, "2:6", SLO)
    assert winner == "colocated" and "only 2 of 8 replicas prefill" not in why  # PD here is TPOT-bound
    pd_ttft = RateSearch(1.0, None, fake_row(2.0, 1.0, "ttft"), 5)
    winner, why = pd_reason(colo, pd_ttft, "2:6", SLO)
    assert winner == "colocated" and "only 2 of 8 replicas prefill" in why
    assert pd_reason(colo, RateSearch(2.05, None, None, 1), "1:1", SLO)[0] == "tie"
