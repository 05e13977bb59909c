"""Request streams for the fleet simulator: Mooncake JSONL, Azure LLM-inference CSV, synthetic mixes.

A :class:`Workload` is columnar (numpy arrays + one tuple of prefix-block ids per request) so that a million
requests fit in memory and load in seconds. Units: seconds for time, tokens for lengths.

Prefix blocks follow Mooncake's trace format (kvcache-ai/Mooncake FAST25-release/README.md): ``hash_ids[i]`` names
the i-th 512-token block of the prompt, and ids are chained hashes, so an equal id means an equal *prefix* up to and
including that block. ``len(hash_ids) == ceil(input_length / 512)`` holds for every row of the published traces.
Traces without prefix information (Azure) get ``hash_ids = None``: their KV blocks are private and never hit.

The rows come from the one strict parser of each trace format (``phase6.serving.traces.iter_mooncake`` /
``iter_azure``), which 6B's request lists (``phase6.serving.workload``, which adds prompt text) read too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phase6.fleet.sessions import session_keys
from phase6.serving.traces import BLOCK_TOKENS, iter_azure, iter_mooncake


@dataclass
class Workload:
    """A time-ordered list of requests, stored as columns."""

    arrival_s: np.ndarray
    """(N,) float64 arrival times in seconds, non-decreasing, first = 0."""
    input_tokens: np.ndarray
    """(N,) int64 prompt tokens (>= 1)."""
    output_tokens: np.ndarray
    """(N,) int64 generated tokens (>= 1)."""
    session: np.ndarray
    """(N,) int64 session key for session-affinity routing (Mooncake: ``session_id`` or the first block after the
    shared prefix, phase6.fleet.sessions; Azure: row index; synthetic: the generator's session)."""
    hash_ids: list[tuple[int, ...]] | None
    """Per request prefix-block ids (512 tokens each), or None when the source has no prefix information."""
    source: str
    """Where it came from (file path or synthetic spec), for the run record."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        assert len(self.input_tokens) == n and len(self.output_tokens) == n and len(self.session) == n
        assert self.hash_ids is None or len(self.hash_ids) == n

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Span from first to last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate in requests/s over the span, (N-1)/span (N arrivals define N-1 gaps)."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else math.inf

    def scaled(self, factor: float) -> Workload:
        """Same requests with arrival times divided by ``factor``: rate x factor (factor 2 = twice the load)."""
        if not factor > 0:
            raise ValueError(f"workload time scale factor must be > 0, got {factor}")
        return Workload(
            self.arrival_s / factor, self.input_tokens, self.output_tokens, self.session, self.hash_ids, self.source
        )

    def at_rate(self, rate: float) -> Workload:
        """Same requests rescaled in time to a mean arrival rate of ``rate`` requests/s."""
        if not rate > 0:
            raise ValueError(f"workload rate must be > 0 req/s, got {rate}")
        return self.scaled(rate / self.rate)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests."""
        hid = None if self.hash_ids is None else self.hash_ids[:n]
        return Workload(
            self.arrival_s[:n], self.input_tokens[:n], self.output_tokens[:n], self.session[:n], hid, self.source
        )

    def repeated(self, times: int) -> Workload:
        """The trace played ``times`` times back to back (one mean gap between copies), prefix ids kept distinct."""
        if times < 1:
            raise ValueError(f"workload repeat must be >= 1, got {times}")
        if times == 1:
            return self
        gap = self.duration_s / max(len(self) - 1, 1)
        span = self.duration_s + gap
        arr = np.concatenate([self.arrival_s + k * span for k in range(times)])
        # Offsets keep copies from sharing prefixes or sessions across repetitions.
        id_off = 1 + max((max(h) for h in self.hash_ids if h), default=0) if self.hash_ids is not None else 0
        sess_off = int(self.session.max()) + 1 if len(self) else 0
        hid = None
        if self.hash_ids is not None:
            hid = [tuple(b + k * id_off for b in h) for k in range(times) for h in self.hash_ids]
        return Workload(
            arr,
            np.tile(self.input_tokens, times),
            np.tile(self.output_tokens, times),
            np.concatenate([self.session + k * sess_off for k in range(times)]),
            hid,
            f"{self.source} x{times}",
        )

    def filtered(self, max_tokens: int) -> tuple[Workload, int]:
        """Drop requests whose prompt + output exceed ``max_tokens``; returns (workload, number dropped)."""
        keep = (self.input_tokens + self.output_tokens) <= max_tokens
        dropped = int((~keep).sum())
        if dropped == 0:
            return self, 0
        idx = np.flatnonzero(keep)
        hid = None if self.hash_ids is None else [self.hash_ids[i] for i in idx]
        arr = self.arrival_s[idx]
        arr = arr - arr[0] if len(arr) else arr
        return Workload(
            arr, self.input_tokens[idx], self.output_tokens[idx], self.session[idx], hid, self.source
        ), dropped


def load_mooncake(path: str | Path, limit: int | None = None) -> Workload:
    """The first ``limit`` rows (all if None) of a Mooncake trace (:func:`iter_mooncake`) as columns.

    Session key: the rows' ``session_id`` when every row has one; else the first block after the prefix that the
    trace's requests share (``phase6.fleet.sessions.session_keys``: not the first block, which on real traffic is the
    same system prompt for every request).
    """
    rows = list(itertools.islice(iter_mooncake(path), limit))
    if not rows:
        raise ValueError(f"{path}: trace has no requests")
    arr = np.asarray([r.time_s for r in rows], dtype=np.float64)
    hid = [r.hash_ids or () for r in rows]
    if all(r.session is not None for r in rows):
        ids: dict[str, int] = {}
        sess = np.asarray([ids.setdefault(r.session, len(ids)) for r in rows], dtype=np.int64)  # type: ignore[arg-type]
    else:
        sess = session_keys(hid)
    return Workload(
        arr - arr[0],
        np.asarray([r.input_tokens for r in rows], dtype=np.int64),
        np.asarray([r.output_tokens for r in rows], dtype=np.int64),
        sess,
        hid,
        str(path),
    )


def load_azure(path: str | Path, limit: int | None = None) -> Workload:
    """The first ``limit`` rows (all if None) of an Azure trace (:func:`iter_azure`) as columns.

    No prefix information: ``hash_ids`` is None and every request is its own session.
    """
    rows = list(itertools.islice(iter_azure(path), limit))
    if not rows:
        raise ValueError(f"{path}: trace has no requests")
    arr = np.asarray([r.time_s for r in rows], dtype=np.float64)
    return Workload(
        arr - arr[0],
        np.asarray([r.input_tokens for r in rows], dtype=np.int64),
        np.asarray([r.output_tokens for r in rows], dtype=np.int64),
        np.arange(len(rows), dtype=np.int64),
        None,
        str(path),
    )


@dataclass
class RequestClass:
    """One component of a synthetic mix: lengths drawn uniformly from integer ranges (inclusive)."""

    weight: float = 1.0
    input_min: int = 100
    input_max: int = 2000
    output_min: int = 100
    output_max: int = 500


def synthetic(
    num_requests: int,
    rate: float,
    classes: Sequence[RequestClass],
    seed: int,
    *,
    burstiness: float = 1.0,
    prefix_groups: int = 0,
    prefix_tokens: int = 0,
    zipf_alpha: float = 0.0,
    turns: int = 1,
    think_time_s: float = 0.0,
) -> Workload:
    """A seeded synthetic workload.

    Arrivals: gamma inter-arrival gaps with shape ``burstiness`` (1 = Poisson, < 1 burstier), mean ``1/rate``; a
    session's later turns arrive ``think_time_s`` (exponential mean) after the earlier turn's arrival.
    Prefixes: with ``prefix_groups > 0`` every session starts with one of that many shared system prompts of
    ``prefix_tokens`` tokens (group picked uniformly, or Zipf(``zipf_alpha``) when alpha > 0). With ``turns > 1`` a
    session's turn k repeats the whole previous prompt plus the previous answer as its prefix (multi-turn chat).
    Block ids are chained the Mooncake way: a block's id identifies the full prefix up to it.
    """
    if num_requests < 1:
        raise ValueError(f"workload.num_requests must be >= 1, got {num_requests}")
    if not rate > 0:
        raise ValueError(f"workload.rate must be > 0, got {rate}")
    if not classes:
        raise ValueError("workload.classes must list at least one request class")
    for i, c in enumerate(classes):
        if not (1 <= c.input_min <= c.input_max and 1 <= c.output_min <= c.output_max and c.weight > 0):
            raise ValueError(
                f"workload.classes[{i}]: need weight > 0, 1 <= input_min <= input_max, "
                f"1 <= output_min <= output_max; got {c}"
            )
    if not burstiness > 0:
        raise ValueError(f"workload.burstiness must be > 0, got {burstiness}")
    if turns < 1:
        raise ValueError(f"workload.turns must be >= 1, got {turns}")
    if prefix_groups < 0 or prefix_tokens < 0 or (prefix_groups > 0) != (prefix_tokens > 0):
        raise ValueError("workload.prefix_groups and workload.prefix_tokens must both be > 0 or both 0")
    rng = np.random.default_rng(seed)
    num_sessions = math.ceil(num_requests / turns)
    # Session start times: gamma renewal process; sessions start at rate/turns so requests arrive at ~rate.
    session_rate = rate / turns
    gaps = rng.gamma(burstiness, 1.0 / (session_rate * burstiness), size=num_sessions)
    gaps[0] = 0.0
    starts = np.cumsum(gaps)
    w = np.asarray([c.weight for c in classes], dtype=np.float64)
    cls = rng.choice(len(classes), size=num_requests, p=w / w.sum())
    lo_in = np.asarray([c.input_min for c in classes])[cls]
    hi_in = np.asarray([c.input_max for c in classes])[cls]
    lo_out = np.asarray([c.output_min for c in classes])[cls]
    hi_out = np.asarray([c.output_max for c in classes])[cls]
    new_in = rng.integers(lo_in, hi_in + 1)
    out = rng.integers(lo_out, hi_out + 1)
    if prefix_groups > 0:
        if zipf_alpha > 0:
            p = 1.0 / np.arange(1, prefix_groups + 1) ** zipf_alpha
            group = rng.choice(prefix_groups, size=num_sessions, p=p / p.sum())
        else:
            group = rng.integers(0, prefix_groups, size=num_sessions)
    think = rng.exponential(think_time_s, size=num_requests) if think_time_s > 0 else np.zeros(num_requests)

    next_id = 0
    chain: dict[tuple[int, int], int] = {}

    def block_id(parent: int, key: int) -> int:
        nonlocal next_id
        k = (parent, key)
        if k not in chain:
            chain[k] = next_id
            next_id += 1
        return chain[k]

    arr = np.empty(num_requests)
    inp = np.empty(num_requests, dtype=np.int64)
    sess = np.empty(num_requests, dtype=np.int64)
    hid: list[tuple[int, ...]] = []
    uniq = 0  # salt for private content so that different sessions never share non-system blocks
    for s in range(num_sessions):
        t = starts[s]
        ctx = prefix_tokens if prefix_groups > 0 else 0  # tokens shared with the previous turn / system prompt
        blocks: list[int] = []
        prev_in = 0
        for k in range(turns):
            i = s * turns + k
            if i >= num_requests:
                break
            if k > 0:
                t = t + think[i]
            n_in = ctx + int(new_in[i])
            # Chained ids: the previous prompt's full blocks are reused; a partial last block, the previous answer
            # and the new question are new content.
            blocks = blocks[: prev_in // BLOCK_TOKENS]
            if prefix_groups > 0 and k == 0:
                g = int(group[s])
                parent = -1 - g  # system prompt g's chain root
                blocks = []
                for b in range(prefix_tokens // BLOCK_TOKENS):
                    parent = block_id(parent, b)
                    blocks.append(parent)
            parent = blocks[-1] if blocks else -1
            uniq += 1
            while len(blocks) < math.ceil(n_in / BLOCK_TOKENS):
                parent = block_id(parent, -uniq)  # new content is unique to this (session, turn)
                blocks.append(parent)
            arr[i] = t
            inp[i] = n_in
            sess[i] = s
            hid.append(tuple(blocks))
            prev_in = n_in
            ctx = n_in + int(out[i])
    order = np.argsort(arr, kind="stable")
    arr = arr[order]
    return Workload(
        arr - arr[0],
        inp[order],
        out[order].astype(np.int64),
        sess[order],
        [hid[i] for i in order],
        f"synthetic(n={num_requests}, rate={rate}, seed={seed})",
    )


def fixed_lengths(num_requests: int, rate: float, input_tokens: int, output_tokens: int, seed: int) -> Workload:
    """Poisson arrivals of identical requests without shared prefixes (used by the M/D/1 and PD-grid runs)."""
    return synthetic(
        num_requests, rate, [RequestClass(1.0, input_tokens, input_tokens, output_tokens, output_tokens)], seed
    )
