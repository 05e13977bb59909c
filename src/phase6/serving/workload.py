"""Request lists and arrival schedules for the serving benchmark, all precomputed from the seed.

Loaders (each returns ``list[BenchRequest]``, prompt/output lengths counted with the served model's tokenizer):
- ``load_sharegpt``: ShareGPT V3 JSON; first human turn = prompt, the answer's length = requested output length;
  seeded shuffle, then kept iff prompt in [prompt_min, prompt_max] and output in [output_min, output_max] tokens
  (vLLM caps prompts at 1024 / total 2048 and SGLang keeps >= 2 tokens; our window is explicit, anchors §0.3).
  Prefix-stable: the first N requests are the same for every N, engine and row.
- ``load_synthetic``: lengths drawn from ``LengthDist``; prompt text = random vocabulary tokens decoded.
- ``load_mooncake``: Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``); each
  512-token block's text is derived from its hash id, so equal ids give equal prefixes (prefix-cache reuse).
- ``load_azure``: Azure LLM inference CSV (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``).
  Both trace formats are parsed by the strict row parsers (``phase6.serving.traces.iter_mooncake``
  / ``iter_azure``: one parser per format, so 6B and the fleet replay the same rows); only the prompt text is added
  here.

Schedules (``build_schedule``, seconds after the run start): closed loop = all at 0 (a semaphore gates them);
gamma inter-arrivals with shape k = burstiness and mean 1/rate, rescaled so the last arrival is exactly N/rate
(vLLM ``serve.py``: keeps the offered rate exact for every seed); Poisson = gamma with k = 1; constant = i/rate;
trace = the trace's own timestamps times ``time_scale``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from phase6.config.serve import LengthDist
from phase6.serving.traces import BLOCK_TOKENS, TraceRow, iter_azure, iter_mooncake
from phase6.textio import read_text


class TokenizerLike(Protocol):
    """The slice of a Hugging Face tokenizer the workload needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass
class BenchRequest:
    """One request of the benchmark; the same list is sent to every engine and row."""

    index: int
    """Position in the measured list (warmup requests have negative indices)."""
    prompt: str
    """User message (chat API) or raw prompt (completions API)."""
    prompt_len: int
    """Prompt tokens by the client tokenizer, without chat template or special tokens."""
    output_len: int
    """Requested output tokens (max_tokens; exact when fix_output_len)."""
    trace_time_s: float | None = None
    """Arrival time from a trace (already scaled), None for datasets without timestamps."""


def _encode(tok: TokenizerLike, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _batch_lengths(tok: Any, texts: list[str]) -> list[int]:
    """Token counts of many texts at once (fast tokenizers batch in Rust); falls back to one by one."""
    if callable(tok):
        enc = tok(texts, add_special_tokens=False)
        return [len(ids) for ids in enc["input_ids"]]
    return [len(_encode(tok, t)) for t in texts]


def load_sharegpt(
    path: str | Path,
    tok: TokenizerLike,
    num_requests: int,
    seed: int,
    prompt_min: int,
    prompt_max: int,
    output_min: int,
    output_max: int,
) -> list[BenchRequest]:
    """``num_requests`` seeded ShareGPT requests inside the token window; ValueError if the file has too few."""
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except OSError as e:
        raise ValueError(f"{path}: cannot read ShareGPT file ({e.strerror})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of conversations, got {type(data).__name__}")
    pairs: list[tuple[str, str]] = []
    for i, conv in enumerate(data):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: row {i}: missing 'conversations' list")
        if len(turns) < 2:
            continue  # vLLM/SGLang convention: a conversation needs a prompt and an answer
        for j in (0, 1):
            if not isinstance(turns[j], dict) or not isinstance(turns[j].get("value"), str):
                raise ValueError(f"{path}: row {i}: conversations[{j}] needs a string 'value'")
        pairs.append((turns[0]["value"], turns[1]["value"]))
    order = np.random.default_rng(seed).permutation(len(pairs))
    out: list[BenchRequest] = []
    batch = 256
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        prompts = [pairs[k][0] for k in idx]
        answers = [pairs[k][1] for k in idx]
        plens, olens = _batch_lengths(tok, prompts), _batch_lengths(tok, answers)
        for p, pl, ol in zip(prompts, plens, olens, strict=True):
            if prompt_min <= pl <= prompt_max and output_min <= ol <= output_max:
                out.append(BenchRequest(len(out), p, pl, ol))
                if len(out) == num_requests:
                    return out
    raise ValueError(
        f"{path}: only {len(out)} of {len(pairs)} conversations have prompt in [{prompt_min}, "
        f"{prompt_max}] and output in [{output_min}, {output_max}] tokens; need {num_requests} "
        "(lower load.num_requests or widen the window)"
    )


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` integer lengths from ``dist``, clipped to [min, max]."""
    if dist.kind == "fixed":
        x = np.full(n, dist.mean)
    elif dist.kind == "uniform":
        x = rng.integers(dist.min, dist.max + 1, size=n).astype(float)
    elif dist.kind == "normal":
        x = rng.normal(dist.mean, dist.std, size=n)
    elif dist.kind == "lognormal":
        # parameters of the underlying normal from the mean/std of the lengths themselves
        sigma2 = math.log1p((dist.std / dist.mean) ** 2)
        x = rng.lognormal(math.log(dist.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    else:
        raise ValueError(f"unknown length distribution kind {dist.kind!r}")
    return np.clip(np.rint(x), dist.min, dist.max).astype(int)


_POOLS: dict[int, np.ndarray] = {}


def _content_ids(tok: Any) -> np.ndarray:
    """Ids of whole words that survive a decode/encode round trip alone and after each other.

    Random ids of a byte-level BPE decode to byte soup that re-encodes to ~1.5x as many tokens (measured on a
    512-token BPE; vLLM PR #17408 saw +2.7% on a large vocabulary). Tokens that are a space followed by letters
    and encode back to themselves are split apart again by the pre-tokenizer, so a sequence of them keeps its
    length. Falls back to every non-special id when a vocabulary has fewer than 64 such tokens.
    """
    key = id(tok)
    if key in _POOLS:
        return _POOLS[key]
    vocab = len(tok) if hasattr(tok, "__len__") else int(tok.vocab_size)
    special = set(getattr(tok, "all_special_ids", []) or [])
    candidates = [i for i in range(vocab) if i not in special]
    texts = (
        tok.batch_decode([[i] for i in candidates])
        if hasattr(tok, "batch_decode")
        else [tok.decode([i]) for i in candidates]
    )
    maybe = [(i, t) for i, t in zip(candidates, texts, strict=True) if len(t) > 1 and t[0] == " " and t[1:].isalpha()]
    if callable(tok) and maybe:  # one batched encode (Rust) instead of one call per candidate
        encs = tok([t for _, t in maybe], add_special_tokens=False)["input_ids"]
    else:
        encs = [_encode(tok, t) for _, t in maybe]
    words = [i for (i, _), e in zip(maybe, encs, strict=True) if list(e) == [i]]
    pool = np.array(words if len(words) >= 64 else candidates, dtype=np.int64)
    _POOLS[key] = pool
    return pool


def _fit(tok: TokenizerLike, text: str, num_tokens: int) -> str:
    """Cut ``text`` to at most ``num_tokens`` tokens of ``tok`` (re-encoding can merge across the cut)."""
    for _ in range(3):
        enc = _encode(tok, text)
        if len(enc) <= num_tokens:
            break
        text = tok.decode(enc[:num_tokens], skip_special_tokens=True)
    return text


def random_text(tok: TokenizerLike, ids_pool: np.ndarray, num_tokens: int, rng: np.random.Generator) -> str:
    """Text of ``num_tokens`` random whole-word tokens (at most that many after re-encoding; callers record it)."""
    ids = rng.choice(ids_pool, size=num_tokens).tolist()
    return _fit(tok, tok.decode(ids, skip_special_tokens=True), num_tokens)


def load_synthetic(
    tok: TokenizerLike, num_requests: int, seed: int, prompt_dist: LengthDist, output_dist: LengthDist
) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    plens = sample_lengths(prompt_dist, num_requests, rng)
    olens = sample_lengths(output_dist, num_requests, rng)
    pool = _content_ids(tok)
    out = []
    for i, (pl, ol) in enumerate(zip(plens.tolist(), olens.tolist(), strict=True)):
        text = random_text(tok, pool, pl, rng)
        out.append(BenchRequest(i, text, len(_encode(tok, text)), ol))
    return out


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea, Flood 2014) on a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


_STREAM_TOKENS = 1 << 22
"""Length of the seeded random word stream that Mooncake blocks are windows of (4M tokens, ~30 MB of text)."""


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """`_splitmix64` elementwise on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class _BlockStream:
    """Mooncake prompt blocks as 512-token windows of one seeded random stream of whole-word tokens.

    Block ``h`` starts at splitmix64(splitmix64(seed) ^ h) mod N: a pure function of (hash id, seed), so equal hash
    ids give equal blocks (the trace's shared prefixes) and different ones different windows. Two ids may land on the
    same window (birthday bound ~n^2 / 2N): harmless for prefix caching, whose block hash chains over every earlier
    block. A block's text is one slice of the stream's text when whole-word tokens decode to the join of their
    strings and re-encode to themselves; ``exact`` says whether that held on sample windows of this tokenizer."""

    def __init__(self, tok: Any, pool: np.ndarray, seed: int) -> None:
        ids = tok.batch_decode([[i] for i in pool.tolist()]) if hasattr(tok, "batch_decode") else None
        pieces = np.array(ids if ids is not None else [tok.decode([i]) for i in pool.tolist()], dtype=object)
        rng = np.random.default_rng([seed, 0x6D6F6F6E])
        draw = rng.integers(0, len(pool), _STREAM_TOKENS + BLOCK_TOKENS)
        self.ids = pool[draw]
        lengths = np.fromiter((len(t) for t in pieces), dtype=np.int64, count=len(pieces))[draw]
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.text = "".join(pieces[draw])
        self.key = np.uint64(_splitmix64(seed & _MASK64))
        self.exact = all(self._window_ok(tok, int(s)) for s in rng.integers(0, _STREAM_TOKENS, 3))

    def _window_ok(self, tok: Any, s: int) -> bool:
        text = self.text[self.offsets[s] : self.offsets[s + BLOCK_TOKENS]]
        ids = self.ids[s : s + BLOCK_TOKENS].tolist()
        return tok.decode(ids, skip_special_tokens=True) == text and _encode(tok, text) == ids

    def starts(self, hash_ids: Sequence[int]) -> np.ndarray:
        h = np.array([int(x) & _MASK64 for x in hash_ids], dtype=np.uint64)
        return (_splitmix64_np(self.key ^ h) % np.uint64(_STREAM_TOKENS)).astype(np.int64)

    def ids_of(self, hash_id: int, n: int = BLOCK_TOKENS) -> np.ndarray:
        s = int(self.starts([hash_id])[0])
        return self.ids[s : s + n]

    def prompt(self, hash_ids: Sequence[int], num_tokens: int) -> str:
        """The text of the first ``num_tokens`` tokens of the blocks ``hash_ids``: one slice per block, one join."""
        full, rest = divmod(num_tokens, BLOCK_TOKENS)
        starts = self.starts(hash_ids[: full + (rest > 0)])
        ends = starts + BLOCK_TOKENS
        if rest:
            ends[-1] = starts[-1] + rest
        t = self.text
        return "".join(
            [t[i:j] for i, j in zip(self.offsets[starts].tolist(), self.offsets[ends].tolist(), strict=True)]
        )


def _trace_requests(
    rows: Iterator[TraceRow],
    text: Callable[[TraceRow], str],
    tok: TokenizerLike,
    time_scale: float,
    max_rows: int | None,
    max_total_len: int | None,
    quick: Callable[[TraceRow], str] | None = None,
    check_rows: int | None = None,
) -> tuple[list[BenchRequest], int, float | None]:
    """Validated trace rows -> requests with prompt text and scaled trace times (origin: the file's first row).

    ``text`` builds a prompt through the tokenizer (decode, cut, re-encode for the length); ``quick``, when given,
    builds the same prompt by joining per-token strings, with exactly ``row.input_tokens`` tokens and no tokenizer
    call (~0.1 ms instead of ~0.1 s for a 12k-token prompt). It is used only after it produced the very prompts of
    ``text`` on the first ``_QUICK_CHECK`` rows; otherwise every row takes the tokenizer path.
    Returns (requests, rows dropped for max_total_len, first row's time); stops reading after ``max_rows`` kept.
    """
    out: list[BenchRequest] = []
    dropped = 0
    t0: float | None = None
    checked = 0
    check_rows = _QUICK_CHECK if check_rows is None else check_rows
    for row in rows:
        if t0 is None:
            t0 = row.time_s
        if max_total_len is not None and row.input_tokens + row.output_tokens > max_total_len:
            dropped += 1
            continue
        if quick is not None and checked >= check_rows:
            prompt, prompt_len = quick(row), row.input_tokens
        else:
            prompt = text(row)
            prompt_len = len(_encode(tok, prompt))
            if quick is not None:
                same = quick(row) == prompt and prompt_len == row.input_tokens
                checked, quick = (checked + 1, quick) if same else (0, None)
        out.append(BenchRequest(len(out), prompt, prompt_len, row.output_tokens, (row.time_s - t0) * time_scale))
        if max_rows is not None and len(out) == max_rows:
            break
    return out, dropped, t0


_QUICK = True
"""Build trace prompts without the tokenizer where it is exact (tests and benchmarks turn it off to compare)."""
_QUICK_CHECK = 2
"""Rows on which the quick prompt builder must match the tokenizer path before it is trusted."""


class _Pieces:
    """The decoded string of each pool id (one batched decode): ``join(ids)`` builds a text without the tokenizer."""

    def __init__(self, tok: Any, pool: np.ndarray) -> None:
        ids = pool.tolist()
        texts = tok.batch_decode([[i] for i in ids]) if hasattr(tok, "batch_decode") else [tok.decode([i]) for i in ids]
        self.text = np.full(int(pool.max()) + 1, "", dtype=object)
        self.text[pool] = texts

    def join(self, ids: np.ndarray) -> str:
        return "".join(self.text[ids])


def load_mooncake(
    path: str | Path,
    tok: TokenizerLike,
    seed: int,
    time_scale: float = 1.0,
    max_rows: int | None = None,
    max_total_len: int | None = None,
) -> tuple[list[BenchRequest], int]:
    """Mooncake trace rows (``phase6.serving.traces.iter_mooncake``: strict, one-line errors naming file:line) ->
    requests with trace times; returns (requests, rows dropped for max_total_len)."""
    stream = _BlockStream(tok, _content_ids(tok), seed)

    def text(row: TraceRow) -> str:
        assert row.hash_ids is not None  # the parser checked ceil(input / 512) ids: they cover the prompt
        ids = np.concatenate([stream.ids_of(h) for h in row.hash_ids])[: row.input_tokens].tolist()
        return _fit(tok, tok.decode(ids, skip_special_tokens=True), row.input_tokens)

    def quick(row: TraceRow) -> str:
        """The same prompt as slices of the stream's text, exactly ``input_tokens`` tokens (``stream.exact``)."""
        assert row.hash_ids is not None
        return stream.prompt(row.hash_ids, row.input_tokens)

    out, dropped, _ = _trace_requests(
        iter_mooncake(path),
        text,
        tok,
        time_scale,
        max_rows,
        max_total_len,
        quick if stream.exact and _QUICK else None,
        0,
    )
    if not out:
        raise ValueError(f"{path}: no usable rows (dropped {dropped} longer than {max_total_len} tokens)")
    return out, dropped


def load_azure(
    path: str | Path,
    tok: TokenizerLike,
    seed: int,
    time_scale: float = 1.0,
    max_rows: int | None = None,
    max_total_len: int | None = None,
) -> tuple[list[BenchRequest], int]:
    """Azure LLM inference CSV rows (``phase6.serving.traces.iter_azure``: strict, one-line errors naming file:line)
    -> requests with random whole-word prompts and trace times; returns (requests, rows dropped for max_total_len).

    Each row's prompt ids are drawn from a generator seeded by (seed, line), so the quick builder and the tokenizer
    path draw the same ids."""
    pool = _content_ids(tok)
    piece = _Pieces(tok, pool)

    def ids_of(row: TraceRow) -> np.ndarray:
        return np.random.default_rng([seed, row.line]).choice(pool, size=row.input_tokens)

    def text(row: TraceRow) -> str:
        return _fit(tok, tok.decode(ids_of(row).tolist(), skip_special_tokens=True), row.input_tokens)

    def quick(row: TraceRow) -> str:
        return piece.join(ids_of(row))

    out, dropped, _ = _trace_requests(
        iter_azure(path), text, tok, time_scale, max_rows, max_total_len, quick if _QUICK else None
    )
    if not out:
        raise ValueError(f"{path}: no usable rows (dropped {dropped} longer than {max_total_len} tokens)")
    return out, dropped


def build_schedule(
    arrival: str,
    n: int,
    seed: int,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    trace_times: list[float] | None = None,
) -> np.ndarray:
    """Send times (seconds after the run start) of ``n`` requests; see the module docstring for each process."""
    if arrival == "concurrency":
        return np.zeros(n)
    if arrival == "trace":
        if trace_times is None or len(trace_times) != n:
            raise ValueError("arrival=trace needs one trace time per request")
        t = np.asarray(trace_times, dtype=float)
        return t - t.min()
    if request_rate is None or not request_rate > 0:
        raise ValueError(f"arrival={arrival} needs request_rate > 0, got {request_rate}")
    if arrival == "constant":
        return np.arange(1, n + 1) / request_rate
    shape = 1.0 if arrival == "poisson" else burstiness
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"unknown arrival {arrival!r}")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape, 1.0 / (request_rate * shape), size=n)
    t = np.cumsum(gaps)
    return t * (n / request_rate) / t[-1]  # vLLM: last arrival exactly at N/rate


HF_PREFIX = "hf://"


def resolve_path(path: str) -> Path:
    """A local file, or ``hf://<owner>/<dataset>/<file>`` fetched once into the HF cache (dataset repos)."""
    if not path.startswith(HF_PREFIX):
        p = Path(path).expanduser()
        if not p.is_file():
            raise ValueError(f"load.path: no such file {path!r}")
        return p
    parts = path[len(HF_PREFIX) :].split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"load.path: expected hf://<owner>/<dataset>/<file>, got {path!r}")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(f"{parts[0]}/{parts[1]}", parts[2], repo_type="dataset"))
    except Exception as e:  # offline, missing file, no access: one line naming the path
        raise ValueError(f"load.path: cannot fetch {path!r} ({type(e).__name__}: {str(e).splitlines()[0]})") from e


@dataclass
class BenchWorkload:
    """What one run sends: measured requests, warmup requests and the send schedule (seconds after start); the
    fleet's columnar request stream is the other shape of the same trace rows (``phase6.fleet.workload.Workload``)."""

    requests: list[BenchRequest]
    warmup: list[BenchRequest]
    schedule: np.ndarray
    info: dict[str, Any]


def build_workload(load: Any, tok: TokenizerLike, seed: int, max_model_len: int | None = None) -> BenchWorkload:
    """Requests + warmup + schedule for a ``LoadConfig``; every choice recorded in ``info``."""
    info: dict[str, Any] = {"dataset": load.dataset, "arrival": load.arrival, "seed": seed}
    warm_n = load.warmup()
    dropped = 0
    if load.dataset in ("mooncake", "azure"):
        path = resolve_path(load.path)
        loader = load_mooncake if load.dataset == "mooncake" else load_azure
        limit = load.num_requests
        rows, dropped = loader(
            path, tok, seed, load.time_scale, None if limit is None else limit + warm_n, max_model_len
        )
        n = load.measured_requests(trace_rows=max(1, len(rows) - warm_n)) if len(rows) > warm_n else len(rows)
        warm_n = min(warm_n, len(rows) - n)
        # the trace head warms the server; measured requests keep their own trace clock
        warmup = [BenchRequest(-1 - i, r.prompt, r.prompt_len, r.output_len) for i, r in enumerate(rows[:warm_n])]
        requests = [
            BenchRequest(i, r.prompt, r.prompt_len, r.output_len, r.trace_time_s)
            for i, r in enumerate(rows[warm_n : warm_n + n])
        ]
        info["path"] = str(path)
        info["rows_dropped_over_max_model_len"] = dropped
    else:
        n = load.measured_requests()
        if load.dataset == "sharegpt":
            path = resolve_path(load.path)
            sample = load_sharegpt(
                path,
                tok,
                n + warm_n,
                seed,
                load.prompt_len_min,
                load.prompt_len_max,
                load.output_len_min,
                load.output_len_max,
            )
            info["path"] = str(path)
            info["window"] = {
                "prompt": [load.prompt_len_min, load.prompt_len_max],
                "output": [load.output_len_min, load.output_len_max],
            }
        else:
            sample = load_synthetic(tok, n + warm_n, seed, load.prompt_dist, load.output_dist)
        # measured = the seeded sample's prefix (identical for every row and engine); warmup = the tail
        requests = sample[:n]
        warmup = [BenchRequest(-1 - i, r.prompt, r.prompt_len, r.output_len) for i, r in enumerate(sample[n:])]
    if "path" in info:
        info["sha256"] = hashlib.sha256(Path(info["path"]).read_bytes()).hexdigest()
    schedule = build_schedule(
        load.arrival,
        len(requests),
        seed,
        load.request_rate,
        load.burstiness,
        [r.trace_time_s or 0.0 for r in requests] if load.arrival == "trace" else None,
    )
    plens = [r.prompt_len for r in requests]
    olens = [r.output_len for r in requests]
    info.update(
        {
            "num_requests": len(requests),
            "num_warmup": len(warmup),
            "prompt_len_mean": float(np.mean(plens)),
            "prompt_len_p50": float(np.median(plens)),
            "prompt_len_max": int(max(plens)),
            "output_len_mean": float(np.mean(olens)),
            "output_len_p50": float(np.median(olens)),
            "output_len_max": int(max(olens)),
            "schedule_span_s": float(schedule.max()) if len(schedule) else 0.0,
            "request_list_sha256": hashlib.sha256(
                json.dumps([[r.prompt, r.output_len] for r in requests]).encode()
            ).hexdigest(),
        }
    )
    return BenchWorkload(requests, warmup, schedule, info)
