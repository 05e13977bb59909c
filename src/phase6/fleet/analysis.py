"""From simulated request times to the numbers a user defends: goodput at an SLO, max rate, replicas, cost, PD grid.

Definitions (serving metrics as in 6B, shared/reference/anchors-6b-serving.md §8):
- TTFT = first token - arrival; TPOT = (E2E - TTFT) / (output - 1); a request is *good* when TTFT <= slo.ttft_ms
  AND TPOT <= slo.tpot_ms AND (with slo.tbt_ms) the mean of its slowest 10 % of token gaps <= slo.tbt_ms
  (Mooncake's TBT; phase6.fleet.tokens). ``tpot_p90_ms`` is DistServe's statistic (90 % of requests within it).
- SLO attainment = good / all; goodput_req_s = good / duration, duration = first arrival -> last completion.
- A rate is *served within SLO* when attainment >= slo.attainment (DistServe's 90 % rule); the max rate within
  SLO is found by bisection on the request rate (each probe is one simulation of the same trace, time-rescaled).
- GPU-hours and $ per 1M output tokens = num_gpus · 1e6 / (3600 · output tok/s) (``phase6.cost``), for all output
  tokens and for good requests' tokens only; ``usd_per_1m_tokens`` counts prompt + output tokens (the fair unit for
  prefill-heavy traces such as Mooncake's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from phase6.config import HardwareConfig
from phase6.config.slo import SLOConfig
from phase6.cost import gpu_hours_per_1m_tokens, usd_per_1m_tokens
from phase6.fleet.sim import SimResult
from phase6.fleet.tokens import describe as describe_gaps
from phase6.serving.slo import good_masks, percentile

GAP_STATS_MAX_REQUESTS = 50_000
"""Without a per-token SLO, per-token columns are computed for runs up to this size (they cost ~20 us a request)."""


def good_mask(res: SimResult, slo: SLOConfig) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT ok, token gaps ok) per request (phase6.serving.slo.good_masks): TPOT (per-request mean) <= slo.tpot_ms
    and, with slo.tbt_ms, the mean of the request's slowest 10 % of token gaps (phase6.fleet.tokens) <= slo.tbt_ms;
    one-token answers have no gap; E2E (slo.e2e_ms) counts with the token gaps; a request that never finished is
    not good (its NaN TPOT would pass)."""
    tail = res.token_gaps[0] if slo.tbt_ms is not None else None
    m = good_masks(slo, res.ttft_s, res.tpot_s, e2e_s=res.e2e_s, tbt_tail_s=tail)
    return m.ttft, m.token & m.e2e & np.isfinite(res.finish_s)


def summarize(
    res: SimResult, slo: SLOConfig, hardware: HardwareConfig, window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """One results row for a simulation: latency percentiles, SLO attainment, goodput, hit rate, cost.

    ``window = (t0, t1)``: latency, attainment and goodput count only requests arriving in [t0, t1] (steady state:
    no warm-up on an empty fleet, no drain after the last arrival); goodput is then good requests / (t1 - t0).
    Throughput and cost always use the whole run.
    """
    n_all = len(res.arrival_s)
    sel = np.ones(n_all, dtype=bool)
    if window is not None:
        sel = (res.arrival_s >= window[0]) & (res.arrival_s <= window[1])
        if sel.sum() < 2:
            raise ValueError(f"steady-state window {window} holds {int(sel.sum())} requests; simulate more requests")
    ttft_ok, tpot_ok = good_mask(res, slo)
    ttft_ok, tpot_ok = ttft_ok[sel], tpot_ok[sel]
    good = ttft_ok & tpot_ok
    n = int(sel.sum())
    duration = res.makespan_s
    span = float(res.arrival_s[-1] - res.arrival_s[0]) if n_all > 1 else 0.0
    good_span = (window[1] - window[0]) if window is not None else duration
    out_tok = float(res.output_tokens.sum())
    good_tok = float(res.output_tokens[sel][good].sum())
    tok_s = out_tok / duration if duration > 0 else 0.0
    all_tok_s = (out_tok + float(res.input_tokens.sum())) / duration if duration > 0 else 0.0
    good_tok_s = good_tok / good_span if good_span > 0 else 0.0
    ttft_ms, tpot_ms = res.ttft_s[sel] * 1e3, res.tpot_s[sel] * 1e3
    multi = res.output_tokens[sel] > 1
    busy = {f"busy_{k}": v / (res.replicas[k] * duration) if duration > 0 else 0.0 for k, v in res.busy_s.items()}
    per_token: dict[str, Any] = {}
    if slo.tbt_ms is not None or n_all <= GAP_STATS_MAX_REQUESTS:
        tail, worst = res.token_gaps
        per_token = describe_gaps(tail[sel])
        per_token["tbt_max_p99_ms"] = percentile(worst[sel][np.isfinite(worst[sel])] * 1e3, 99)
    return {
        "requests": n,
        "offered_rate": (n_all - 1) / span if span > 0 else math.nan,
        "num_gpus": res.num_gpus,
        "ttft_p50_ms": percentile(ttft_ms, 50),
        "ttft_p99_ms": percentile(ttft_ms, 99),
        "tpot_p50_ms": percentile(tpot_ms[multi], 50),
        "tpot_p90_ms": percentile(tpot_ms[multi], 90),
        "tpot_p99_ms": percentile(tpot_ms[multi], 99),
        **per_token,
        "e2e_p50_s": percentile(res.e2e_s, 50),
        "ttft_attainment": float(ttft_ok.mean()) if n else math.nan,
        "tpot_attainment": float(tpot_ok.mean()) if n else math.nan,
        "slo_attainment": float(good.mean()) if n else math.nan,
        "goodput_req_s": good.sum() / good_span if good_span > 0 else 0.0,
        "throughput_tok_s": tok_s,
        "prefix_hit_rate": res.prefix_hit_rate,
        "host_hit_rate": res.host_hit_tokens / max(float(res.input_tokens.sum()), 1.0),
        "gpu_hours_per_1m_output_tokens": gpu_hours_per_1m_tokens(res.num_gpus, tok_s),
        "usd_per_1m_output_tokens": usd_per_1m_tokens(res.num_gpus, tok_s, hardware.usd_per_gpu_hour),
        "usd_per_1m_good_output_tokens": usd_per_1m_tokens(res.num_gpus, good_tok_s, hardware.usd_per_gpu_hour),
        "usd_per_1m_tokens": usd_per_1m_tokens(res.num_gpus, all_tok_s, hardware.usd_per_gpu_hour),
        **busy,
        "duration_s": duration,
        "sim_events": res.events,
        "sim_wall_s": res.wall_s,
    }


def meets(row: dict[str, Any], slo: SLOConfig) -> bool:
    return bool(row["slo_attainment"] >= slo.attainment)


@dataclass
class RateSearch:
    """Result of a max-rate bisection: the best rate found within SLO and the rows at the bracket ends."""

    rate: float
    """Highest probed rate meeting the SLO (0 if even the lowest probe failed)."""
    ok_row: dict[str, Any] | None
    fail_row: dict[str, Any] | None
    probes: int


def max_rate_within_slo(
    run_at: Callable[[float], dict[str, Any]], slo: SLOConfig, start: float, steps: int, max_doublings: int = 12
) -> RateSearch:
    """Bisection on the request rate. ``run_at(rate)`` simulates and returns a :func:`summarize` row.

    Brackets by halving / doubling from ``start``, then ``steps`` bisection steps on the log scale.
    """
    probes = 0

    def probe(rate: float) -> dict[str, Any]:
        nonlocal probes
        probes += 1
        return run_at(rate)

    row = probe(start)
    lo, hi = (start, None) if meets(row, slo) else (None, start)
    lo_row, hi_row = (row, None) if lo is not None else (None, row)
    for _ in range(max_doublings):
        if lo is not None and hi is not None:
            break
        rate = (lo * 2) if lo is not None else (hi / 2)  # type: ignore[operator]
        row = probe(rate)
        if meets(row, slo):
            lo, lo_row = rate, row
        else:
            hi, hi_row = rate, row
    if lo is None:
        return RateSearch(0.0, None, hi_row, probes)
    if hi is None:
        return RateSearch(lo, lo_row, None, probes)
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        row = probe(mid)
        if meets(row, slo):
            lo, lo_row = mid, row
        else:
            hi, hi_row = mid, row
    return RateSearch(lo, lo_row, hi_row, probes)


def min_replicas(
    run_with: Callable[[int], dict[str, Any]], slo: SLOConfig, lo: int, hi: int
) -> tuple[int | None, dict[str, Any] | None]:
    """Fewest replicas in [lo, hi] meeting the SLO, assuming more replicas never hurt (bisection).

    Returns (None, row at ``hi``) when even ``hi`` fails.
    """
    top = run_with(hi)
    if not meets(top, slo):
        return None, top
    best, best_row = hi, top
    while lo < best:
        mid = (lo + best) // 2
        row = run_with(mid)
        if meets(row, slo):
            best, best_row = mid, row
        else:
            lo = mid + 1
    return best, best_row


def binding_slo(row: dict[str, Any] | None, slo: SLOConfig) -> str:
    """Which SLO fails first at a rate just above the limit: 'TTFT', 'TPOT' or 'TTFT+TPOT'."""
    if row is None:
        return "not reached"
    t_fail = row["ttft_attainment"] < slo.attainment
    p_fail = row["tpot_attainment"] < slo.attainment
    if t_fail and p_fail:
        return "TTFT+TPOT"
    if t_fail:
        return "TTFT"
    if p_fail:
        return "TPOT"
    return "joint"  # each alone passes, their conjunction does not


def pd_reason(colo: RateSearch, pd: RateSearch, split: str, slo: SLOConfig) -> tuple[str, str]:
    """(winner, reason) for one cell of the 'when PD disaggregation pays' table, from the searches' rows."""
    c, p = colo.rate, pd.rate
    c_bind, p_bind = binding_slo(colo.fail_row, slo), binding_slo(pd.fail_row, slo)
    if c <= 0 and p <= 0:
        return "neither", f"no probed rate meets the SLO (colocated fails {c_bind}, PD {split} fails {p_bind})"
    gain = p / c if c > 0 else math.inf
    if gain >= 1.05:
        why = f"PD {split} serves {gain:.2f}x the rate within SLO; colocated is {c_bind}-bound"
        if c_bind in ("TPOT", "TTFT+TPOT"):
            why += " (prefill chunks in the same step stretch every decode step)"
        elif c_bind == "TTFT":
            why += " (a new prompt first waits for the running decode step, then shares a step with the decodes)"
        return "PD", why + f"; PD's limit is {p_bind}"
    if gain <= 1 / 1.05:
        why = f"colocated serves {1 / gain:.2f}x the rate within SLO; PD {split} is {p_bind}-bound"
        if p_bind == "TTFT":
            pre, dec = split.split(":")
            why += f" (only {pre} of {int(pre) + int(dec)} replicas prefill)"
        elif p_bind in ("TPOT", "TTFT+TPOT"):
            why += " (decode pool saturates / KV transfer adds to TPOT)"
        return "colocated", why
    return "tie", f"within 5 % ({c:.3g} vs {p:.3g} req/s); colocated {c_bind}-bound, PD {p_bind}-bound"
