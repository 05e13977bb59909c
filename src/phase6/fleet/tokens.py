"""Per-token latency: every request's gaps between consecutive tokens, from the replicas' decode-step logs.

The simulator advances a replica from one batch change to the next in one event (a run of k decode steps), so it
does not store per-token times; each replica logs its decode events instead, ``(start, end, k)`` (``StepLog``).
A request decoding on that replica from ``join`` (the start of its first decode step) to ``finish`` took part in
exactly the logged events between them (runs are cut at every arrival and finish, and a request joins and leaves at
step boundaries), so its token gaps are:

- token 2: the end of its first decode step minus its first token (under PD this includes the KV transfer; under
  vLLM V0 the prefill-only steps it waited through);
- then per event, ``k`` steps of ``(end - start) / k`` each, except that the first step of an event also carries
  any time since the previous logged event ended (prefill-only steps of V0, during which decodes wait).

Steps within a run differ only by the growing context (< 1 %), so a run's steps count as equal. From the gaps:
``tbt_tail_s`` = mean of the slowest 10 % of a request's gaps (Mooncake, FAST'25 §8: the TBT it holds to a
threshold) and ``tbt_max_s`` = its longest gap. TPOT (the per-request mean, DistServe's and vLLM's) hides a stall:
one 1.1 s prefill step in a 300-token answer adds 3.7 ms to TPOT but is the request's worst gap.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, NamedTuple

import numpy as np

TAIL_FRACTION = 0.1
"""Mooncake's TBT statistic: the mean of the slowest 10 % of a request's token gaps."""


class StepLog:
    """Decode events of one replica: start time, end time, decode steps (every running request got k tokens)."""

    __slots__ = ("start", "end", "k")

    def __init__(self) -> None:
        self.start = array("d")
        self.end = array("d")
        self.k = array("q")

    def add(self, start: float, end: float, k: int) -> None:
        self.start.append(start)
        self.end.append(end)
        self.k.append(k)

    def __len__(self) -> int:
        return len(self.k)


class _Events(NamedTuple):
    """A replica's decode events as arrays: start, end, steps k, step time d = (end - start) / k, and g1 = the first
    step of each event including any pause since the previous event ended."""

    start: np.ndarray
    end: np.ndarray
    k: np.ndarray
    d: np.ndarray
    g1: np.ndarray


def _events(log: StepLog) -> _Events:
    s = np.frombuffer(log.start, dtype=np.float64)
    e = np.frombuffer(log.end, dtype=np.float64)
    k = np.frombuffer(log.k, dtype=np.int64)
    d = (e - s) / k
    prev_end = np.concatenate(([s[0]], e[:-1]))
    return _Events(s, e, k, d, s + d - prev_end)


def _gaps(ev: _Events, first: float, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct token gaps of a request in events a..b-1 (from its first token at ``first``) and how many gaps
    each value stands for: token 2, each later event's first step, the k - 1 equal steps of every event."""
    vals = np.concatenate(([ev.start[a] + ev.d[a] - first], ev.g1[a + 1 : b], ev.d[a:b]))
    wts = np.concatenate(([1], np.ones(b - a - 1, dtype=np.int64), ev.k[a:b] - 1))
    return vals, wts


def request_gaps(log: StepLog, first: float, join: float, finish: float) -> np.ndarray:
    """Every token gap (seconds, output tokens - 1 of them, not in time order) of a request that decoded on ``log``'s
    replica from ``join`` to ``finish`` after its first token at ``first``."""
    ev = _events(log)
    a = int(np.searchsorted(ev.start, join, "left"))
    b = int(np.searchsorted(ev.end, finish, "right"))
    vals, wts = _gaps(ev, first, a, b)
    return np.repeat(vals, wts)


def gap_stats(
    logs: dict[int, StepLog],
    replica: np.ndarray,
    first: np.ndarray,
    join: np.ndarray,
    finish: np.ndarray,
    output_tokens: np.ndarray,
    fraction: float = TAIL_FRACTION,
) -> tuple[np.ndarray, np.ndarray]:
    """(tail, max) token gap per request, seconds; NaN for one-token answers (no gap)."""
    n = len(replica)
    tail = np.full(n, math.nan)
    worst = np.full(n, math.nan)
    for rid, log in logs.items():
        idx = np.flatnonzero((replica == rid) & (output_tokens > 1))
        if not len(idx) or not len(log):
            continue
        ev = _events(log)
        a_all = np.searchsorted(ev.start, join[idx], side="left")
        b_all = np.searchsorted(ev.end, finish[idx], side="right")
        for i, a, b in zip(idx, a_all, b_all, strict=True):
            vals, wts = _gaps(ev, first[i], a, b)
            m = int(output_tokens[i]) - 1
            order = np.argsort(-vals, kind="stable")
            v, w = vals[order], wts[order]
            cum = np.cumsum(w)
            take = max(1, math.ceil(fraction * m))
            j = int(np.searchsorted(cum, take))
            top = float((v[:j] * w[:j]).sum()) + (take - (int(cum[j - 1]) if j else 0)) * float(v[j])
            tail[i] = top / take
            worst[i] = float(v[0])
    return tail, worst


def token_gap_total(logs: dict[int, StepLog], rid: int, join: float, finish: float) -> int:
    """Decode steps between ``join`` and ``finish`` on replica ``rid`` (tests: equals output tokens - 1)."""
    log = logs[rid]
    s = np.frombuffer(log.start, dtype=np.float64)
    e = np.frombuffer(log.end, dtype=np.float64)
    a, b = int(np.searchsorted(s, join, "left")), int(np.searchsorted(e, finish, "right"))
    return int(np.frombuffer(log.k, dtype=np.int64)[a:b].sum())


def describe(tail_s: np.ndarray) -> dict[str, Any]:
    """Percentiles over requests of the per-request tail gap, ms."""
    x = tail_s[np.isfinite(tail_s)] * 1e3
    if not len(x):
        return {"tbt_tail_p50_ms": math.nan, "tbt_tail_p90_ms": math.nan, "tbt_tail_p99_ms": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"tbt_tail_p50_ms": float(p50), "tbt_tail_p90_ms": float(p90), "tbt_tail_p99_ms": float(p99)}
