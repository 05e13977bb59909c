"""6B table row: every number recomputed by hand from four scripted request results."""

from __future__ import annotations

import math

import pytest

from phase6.config.slo import SLOConfig
from phase6.serving.client import RequestResult, RunOutcome
from phase6.serving.stats import EXTRA_ROW_KEYS, ROW_KEYS, summarize


def result(
    i: int,
    dispatch: float,
    chunks: list[float],
    tokens: list[int],
    ok: bool = True,
    out: int | None = None,
    sched: float = 0.0,
) -> RequestResult:
    r = RequestResult(
        i,
        sched,
        prompt_len=100,
        requested_output_len=sum(tokens),
        ok=ok,
        dispatch_s=dispatch,
        send_s=dispatch,
        chunk_times_s=chunks,
        chunk_tokens=tokens,
        tokens_source="usage",
        prompt_tokens=110,
    )
    r.output_tokens = sum(tokens) if out is None else out
    r.end_s = dispatch + (chunks[-1] if chunks else 0.5)
    r.error = "" if ok else "HTTP 500: boom"
    return r


def test_row_numbers_by_hand() -> None:
    rs = [
        result(0, 0.0, [0.5, 0.6, 0.7], [1, 1, 1]),  # TTFT 500, TPOT 100 ms: good (<= 100)
        result(1, 0.0, [2.5, 2.6], [1, 3]),  # TTFT 2500 ms: not good; ITL chunk of 3 -> 3 x 33.3
        result(2, 1.0, [0.1, 0.5], [1, 1]),  # TPOT 400 ms: not good
        result(3, 1.0, [], [], ok=False),  # failed: never good
    ]
    out = RunOutcome(rs, duration_s=3.0, first_dispatch_s=0.0)
    row, details = summarize(
        out,
        engine="vllm",
        tp=4,
        concurrency=2,
        request_rate=None,
        num_gpus=4,
        usd_per_gpu_hour=3.0,
        slo=SLOConfig(ttft_ms=2000, tpot_ms=100),
    )
    assert tuple(row) == ROW_KEYS + EXTRA_ROW_KEYS
    tokens = 3 + 4 + 2
    assert row["throughput_tok_s"] == pytest.approx(tokens / 3.0) and row["output_tok_s"] == row["throughput_tok_s"]
    assert row["total_tok_s"] == pytest.approx((tokens + 3 * 110) / 3.0)
    assert row["req_s"] == pytest.approx(1.0) and row["goodput_req_s"] == pytest.approx(1 / 3.0)
    assert (row["completed"], row["failed"]) == (3, 1)
    assert row["ttft_p50_ms"] == pytest.approx(500.0)  # median of 100, 500, 2500
    assert row["ttft_p99_ms"] == pytest.approx(500 + 0.98 * 2000)  # numpy linear interpolation
    tpots = [100.0, 100.0 / 3, 400.0]  # (E2E - TTFT)/(out - 1)
    assert row["tpot_p50_ms"] == pytest.approx(100.0)
    assert row["tpot_p99_ms"] == pytest.approx(sorted(tpots)[1] + 0.98 * (400.0 - sorted(tpots)[1]))
    itl = sorted([100.0, 100.0] + [100.0 / 3] * 3 + [400.0])
    assert row["itl_p50_ms"] == pytest.approx((itl[2] + itl[3]) / 2)
    gh = 4 * 1e6 / (3600 * tokens / 3.0)
    assert row["gpu_hours_per_1m_output_tokens"] == pytest.approx(gh)
    assert row["usd_per_1m_output_tokens"] == pytest.approx(3.0 * gh)
    assert details["chunk_gap_p50_ms"] == pytest.approx(100.0)  # raw gaps 100, 100, 100, 400
    assert details["errors"] == {"HTTP 500": 1} and details["sent"] == 4 and details["not_sent"] == 0
    assert math.isnan(details["offered_rate_req_s"])  # closed loop: no offered rate


def test_unsent_requests_are_failures_and_slo_knobs_apply() -> None:
    rs = [
        result(0, 0.0, [0.1, 0.2], [1, 1], sched=0.0),
        result(1, 0.5, [0.1, 0.2], [1, 1], sched=0.5),
        RequestResult(2, 1.0),
    ]
    out = RunOutcome(rs, duration_s=1.0, first_dispatch_s=0.0, abort_reason="server process exited with code -9")
    row, details = summarize(
        out,
        engine="sglang",
        tp=2,
        concurrency=None,
        request_rate=2.0,
        num_gpus=2,
        usd_per_gpu_hour=0.0,
        slo=SLOConfig(ttft_ms=None, tpot_ms=None, e2e_ms=150),
    )
    assert (row["completed"], row["failed"], details["not_sent"], details["sent"]) == (2, 1, 1, 2)
    assert row["goodput_req_s"] == 0.0  # E2E 200 ms > 150 ms
    assert details["offered_rate_req_s"] == pytest.approx(2.0) and details["abort_reason"].startswith("server")
