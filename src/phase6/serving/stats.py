"""From per-request results to one row of the scaling table (definitions: anchors-6b §8, client.py docstring).

- throughput_tok_s = output_tok_s = sum of server-reported output tokens of completed requests / duration, where
  duration = first dispatch -> last request end (vLLM ``output_throughput``); total_tok_s adds prompt tokens
  (server-reported when available, else the client count); req_s = completed / duration.
- TTFT, TPOT: per completed request; ITL: pooled per-token samples of all completed requests; tokens the client
  could not time (several SSE events in one socket read) are left out of ITL and counted (untimed_tokens), and
  answers that arrived whole in one read have no TPOT (untimed_requests): never a 0 ms reading; percentiles are
  numpy's linear interpolation (vLLM's choice; phase6.serving.slo.percentile, shared with the fleet).
- goodput_req_s = requests that completed AND meet every SLO threshold / duration; failed requests are never
  good; a single-token answer has no TPOT and passes that threshold (vLLM's rule; phase6.serving.slo.good_masks).
- gpu_hours_per_1m_output_tokens = GPUs * 1e6 / (3600 * output tok/s) (phase6.cost); usd = that * $/GPU-h.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from phase6.config.slo import SLOConfig
from phase6.cost import gpu_hours_per_1m_tokens, usd_per_1m_tokens
from phase6.serving.client import RequestResult, RunOutcome
from phase6.serving.slo import good_masks, percentile

ROW_KEYS = (
    "engine",
    "tp",
    "concurrency",
    "request_rate",
    "throughput_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "goodput_req_s",
    "gpu_hours_per_1m_output_tokens",
    "usd_per_1m_output_tokens",
    "completed",
    "failed",
)
EXTRA_ROW_KEYS = ("untimed_requests", "untimed_tokens", "output_tok_s", "total_tok_s", "req_s")


def good_requests(ok: list[RequestResult], slo: SLOConfig) -> np.ndarray:
    """Which completed requests meet every threshold of the SLO (phase6.serving.slo.good_masks)."""
    ttft, tpot, e2e = (np.array([getattr(r, k) for r in ok], dtype=np.float64) for k in ("ttft_s", "tpot_s", "e2e_s"))
    return good_masks(slo, ttft, tpot, e2e_s=e2e).good


def summarize(
    outcome: RunOutcome,
    *,
    engine: str,
    tp: int,
    concurrency: int | None,
    request_rate: float | None,
    num_gpus: int,
    usd_per_gpu_hour: float,
    slo: SLOConfig,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(row, details): the table row (``ROW_KEYS`` + ``EXTRA_ROW_KEYS``) and every other measured number."""
    ok = [r for r in outcome.results if r.ok]
    sent = [r for r in outcome.results if r.sent]
    dur = outcome.duration_s
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    out_rate = out_tok / dur if dur > 0 else 0.0
    ttft = [r.ttft_s * 1e3 for r in ok]
    tpot = [r.tpot_s * 1e3 for r in ok]  # NaN (left out) for untimed answers and single tokens
    itl = [g * 1e3 for r in ok for g in r.timed_itl_samples_s()]
    gaps = [g * 1e3 for r in ok for g in r.chunk_gaps_s()]
    e2e = [r.e2e_s * 1e3 for r in ok]
    arrived = [r for r in outcome.results if r.dispatched]
    queue = [r.queue_s * 1e3 for r in sent]
    lag = [r.dispatch_lag_s * 1e3 for r in arrived]
    good_mask = good_requests(ok, slo)
    good = int(good_mask.sum())
    span = max((r.dispatch_s for r in arrived), default=0.0) - min((r.dispatch_s for r in arrived), default=0.0)
    open_loop = len({r.scheduled_s for r in outcome.results}) > 1  # closed loop queues everything at t = 0
    offered = (len(arrived) - 1) / span if open_loop and len(arrived) > 1 and span > 0 else math.nan
    errors = Counter(r.error.split(":")[0] for r in sent if not r.ok)
    retok = [
        (r.retokenized_tokens, r.output_tokens)
        for r in ok
        if r.retokenized_tokens is not None and r.tokens_source == "usage" and r.output_tokens > 0
    ]
    row: dict[str, Any] = {  # the exact keys first
        "engine": engine,
        "tp": tp,
        "concurrency": concurrency,
        "request_rate": request_rate,
        "throughput_tok_s": out_rate,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "itl_p50_ms": percentile(itl, 50),
        "itl_p99_ms": percentile(itl, 99),
        "tpot_p50_ms": percentile(tpot, 50),
        "tpot_p99_ms": percentile(tpot, 99),
        "goodput_req_s": good / dur if dur > 0 else 0.0,
        "gpu_hours_per_1m_output_tokens": gpu_hours_per_1m_tokens(num_gpus, out_rate),
        "usd_per_1m_output_tokens": usd_per_1m_tokens(num_gpus, out_rate, usd_per_gpu_hour),
        "completed": len(ok),
        "failed": outcome.planned - len(ok),
        "untimed_requests": sum(r.untimed for r in ok),
        "untimed_tokens": sum(r.coalesced_tokens() for r in ok),
        "output_tok_s": out_rate,
        "total_tok_s": (out_tok + in_tok) / dur if dur > 0 else 0.0,
        "req_s": len(ok) / dur if dur > 0 else 0.0,
        "goodput_tok_s": sum(r.output_tokens for r, g in zip(ok, good_mask, strict=True) if g) / dur
        if dur > 0
        else 0.0,
        "good_fraction": good / outcome.planned if outcome.planned else math.nan,
        "mean_in_flight": sum(r.end_s - r.send_s for r in sent) / dur if dur > 0 else math.nan,
        "tpot_mean_ms": float(np.nanmean(tpot)) if any(not math.isnan(x) for x in tpot) else math.nan,
        "itl_mean_ms": float(np.mean(itl)) if itl else math.nan,
        "e2e_p50_ms": percentile(e2e, 50),
        "e2e_p99_ms": percentile(e2e, 99),
        "chunk_gap_p50_ms": percentile(gaps, 50),
        "chunk_gap_p99_ms": percentile(gaps, 99),
        "queue_p50_ms": percentile(queue, 50),
        "queue_p99_ms": percentile(queue, 99),
        "dispatch_lag_p50_ms": percentile(lag, 50),
        "dispatch_lag_p99_ms": percentile(lag, 99),
        "dispatch_lag_max_ms": max(lag, default=math.nan),
        "offered_rate_req_s": offered,
        "duration_s": dur,
        "planned": outcome.planned,
        "sent": len(sent),
        "not_sent": outcome.not_sent,
        "failed_sent": len(sent) - len(ok),
        "output_tokens": out_tok,
        "input_tokens": in_tok,
        "mean_output_tokens": out_tok / len(ok) if ok else math.nan,
        "tokens_from_usage_pct": 100.0 * sum(r.tokens_source == "usage" for r in ok) / len(ok) if ok else math.nan,
        "usage_vs_tokenizer_diff_pct": (
            100.0 * sum(abs(a - b) for a, b in retok) / sum(b for _, b in retok) if retok else math.nan
        ),
        "slo": slo.describe(),
        "errors": dict(errors),
        "abort_reason": outcome.abort_reason,
    }
    assert row["completed"] + row["failed"] == outcome.planned
    assert row["sent"] == row["completed"] + row["failed_sent"]
    keep = ROW_KEYS + EXTRA_ROW_KEYS
    return {k: row[k] for k in keep}, {k: v for k, v in row.items() if k not in keep}


SERVER_CLIENT_BOUND = 0.25
"""Client and server mean TPOT/ITL of one run may differ by this fraction (of the server's) before the row warns:
the client adds the network and its own event loop, the server times its output steps; on a local link the two
agree to a few percent unless the client stalls or its reads coalesce."""


def server_side_latency(delta: dict[str, float], client: dict[str, Any]) -> dict[str, Any]:
    """The server's mean TPOT/ITL over the measured run from its /metrics histogram deltas (``*_s_sum`` /
    ``*_s_count``, phase6.serving.telemetry.PROM_NAMES: vLLM's and SGLang's names) beside the client's
    ``tpot_mean_ms`` / ``itl_mean_ms``, and a warning per quantity that differs by more than SERVER_CLIENT_BOUND.
    A quantity the server does not export is reported missing with the reason, never 0."""
    out: dict[str, Any] = {}
    warnings = []
    for name in ("tpot", "itl"):
        n, total = delta.get(f"{name}_s_count"), delta.get(f"{name}_s_sum")
        if not n or total is None:
            out[f"server_{name}_mean_ms"] = None
            out[f"server_{name}_missing"] = "no such histogram in /metrics, or no sample in the run"
            continue
        server = 1e3 * total / n
        mine = client.get(f"{name}_mean_ms")
        out[f"server_{name}_mean_ms"] = server
        if isinstance(mine, (int, float)) and not math.isnan(mine) and server > 0:
            out[f"client_vs_server_{name}"] = mine / server
            if abs(mine / server - 1) > SERVER_CLIENT_BOUND:
                warnings.append(
                    f"{name.upper()} mean: client {mine:.3g} ms vs server {server:.3g} ms "
                    f"(differ by more than {SERVER_CLIENT_BOUND:.0%})"
                )
    out["server_client_warnings"] = warnings
    return out
