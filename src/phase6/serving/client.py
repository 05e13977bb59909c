"""Async streaming client: sends a precomputed schedule of OpenAI-style requests and times every SSE chunk.

One asyncio loop, one ``aiohttp.ClientSession`` whose connector is sized to the concurrency (0 = unlimited;
aiohttp's default cap of 100 connections silently queues requests, anchors §4), request bodies serialized before
the clock starts; for the run the GC heap is frozen, the collector off and the descriptor table pre-grown (each a
multi-ms stall of the loop otherwise: docs/benchmarks.md, "Strict 256-stream timing test").

Per request (all times on ``phase6.timing.wall``, relative to the run start ``t0``):
- ``scheduled_s``: planned arrival; ``dispatch_s``: when the client actually started it (dispatch lag =
  dispatch - scheduled); ``send_s``: after the concurrency gate, just before the HTTP request (client queue time
  = send - dispatch, reported apart and excluded from TTFT, vLLM #54101).
- TTFT: send -> first chunk with non-empty content (SGLang's trigger; a role-only opening chunk is not a token).
- Chunk times: when the bytes that completed the SSE event came off the socket: the transport's
  ``data_received`` callback stamps every read (``TimedResponseHandler``), so the time the coroutine takes to resume
  behind other streams' callbacks is not counted; events completed by the same read share its timestamp. (Where
  that hook is unavailable, the time the reading coroutine resumes.)
- Tokens per chunk: difference of cumulative ``usage.completion_tokens`` when the server streams usage per chunk
  (vLLM/SGLang ``stream_options.continuous_usage_stats``); else the client tokenizer's count of the chunk text;
  else 1. ITL samples: a chunk carrying k tokens after a gap g contributes k samples of g/k (SGLang-native
  split), so ITL stays per token when a server bundles tokens (transformers: 64 tokens in 53 chunks). Chunks
  completed by the same socket read (same timestamp) are one delivery of their summed tokens: on a loaded host
  several SSE events arrive in one read, and their 0 s spacing is an artefact of the read, not an inter-token gap.
  Untimed tokens: the tokens of such a coalesced delivery (several events, one read) were not timed by the client:
  the row's ITL leaves them out (``timed_itl_samples_s``) and counts them (``untimed_tokens``); an answer that
  arrived whole in one read has no TPOT (``untimed``, counted as ``untimed_requests``), never TPOT 0.
- Output tokens: the server's final ``usage.completion_tokens``; fallback the tokenizer count of the text, then
  the number of content chunks, flagged in ``tokens_source``.
- E2E: send -> last content chunk. TPOT = (E2E - TTFT) / (output tokens - 1), over the timed answers.
- Success: HTTP 200, at least one content chunk, and a ``finish_reason`` or ``[DONE]`` (transformers sends no
  ``[DONE]``); anything else (HTTP error, malformed SSE, error event, disconnect, read stall, timeout, run
  deadline, server exit) is a failure with its reason. Accounting: sent = completed + failed, always.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import math
import os
import resource
import select
import selectors
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from aiohttp.client_proto import ResponseHandler

from phase6.serving.workload import BenchRequest, TokenizerLike
from phase6.timing import wall

T = TypeVar("T")
API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
API_KEY_ENV = "OPENAI_API_KEY"
"""The environment variable holding a server's API key (``vllm serve --api-key``, SGLang's ``--api-key``): the one
the OpenAI client and ``vllm bench serve`` read. Sent as ``Authorization: Bearer``; never written anywhere."""


def auth_headers() -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}`` when $OPENAI_API_KEY is set, else none."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


GC_VALVE = 2_000_000
"""Net tracked allocations after which a run with the collector off still collects its young generations."""
_decode = json.JSONDecoder().decode  # str in, no encoding sniffing: the per-chunk hot path


class PreciseEpollSelector(selectors.EpollSelector):
    """epoll with microsecond timeouts, for event loops whose timers must fire on time.

    epoll_wait takes whole milliseconds and CPython rounds timeouts up, so every asyncio timer fires 0-1 ms late
    (a scheduled send, a scripted chunk). Waiting on the epoll descriptor itself with select() (microsecond
    timeout; one low-numbered fd, so no FD_SETSIZE limit on the sockets epoll watches) and then harvesting with a
    zero-timeout epoll_wait keeps epoll's scaling and fixes the timer error.
    """

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            select.select([self._selector.fileno()], [], [], timeout)
            timeout = 0
        return super().select(timeout)


class TimedResponseHandler(ResponseHandler):
    """aiohttp's connection protocol, stamping every socket read as it arrives (before any coroutine resumes).

    ``rx_log`` holds ``(payload bytes received so far, wall())`` for each read of the current response
    body (``rx_owner``, its ``StreamReader``); a new response on the connection gets a fresh list, so a reader
    that kept the old list is not disturbed when aiohttp reuses the connection before it finished reading.
    """

    rx_owner: Any = None
    rx_log: list[tuple[int, float]] | None = None

    def data_received(self, data: bytes) -> None:
        t = wall()
        super().data_received(data)
        p = self._payload
        if p is None:
            return
        if p is not self.rx_owner:
            self.rx_owner, self.rx_log = p, []
        self.rx_log.append((p.total_bytes, t))  # type: ignore[union-attr]


KEEPALIVE_S = 4.0
"""Client-side idle keep-alive, below the 5 s of uvicorn-based servers (see ``run_requests``)."""


def _timed_connector(**kwargs: Any) -> aiohttp.TCPConnector:
    """A TCPConnector whose connections are ``TimedResponseHandler`` (plain aiohttp if its internals moved)."""
    conn = aiohttp.TCPConnector(**kwargs)
    factory = getattr(conn, "_factory", None)
    if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
        conn._factory = functools.partial(TimedResponseHandler, *factory.args, **factory.keywords)
    return conn


def run_precise(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a loop with ``PreciseEpollSelector`` (Linux; the default loop elsewhere)."""
    if not hasattr(selectors, "EpollSelector"):
        return asyncio.run(coro)
    loop = asyncio.SelectorEventLoop(PreciseEpollSelector())
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def request_body(
    req: BenchRequest,
    *,
    engine: str,
    api: str,
    model: str,
    fix_output_len: bool,
    temperature: float,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenAI-compatible streaming body with the per-engine fields each server accepts.

    transformers serve answers HTTP 422 to unknown fields (``ignore_eos``), ignores ``stream_options`` and puts
    usage in its last chunk; it fixes lengths through ``generation_config`` (anchors §7). vLLM and SGLang take
    ``ignore_eos`` and stream usage per chunk with ``continuous_usage_stats``.
    """
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": req.output_len, "temperature": temperature}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if engine in ("vllm", "sglang", "torch-tp"):
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if fix_output_len:
            body["ignore_eos"] = True
    elif engine == "transformers":
        if fix_output_len:
            body["generation_config"] = json.dumps({"min_new_tokens": req.output_len, "max_new_tokens": req.output_len})
    else:  # any OpenAI-compatible server: standard fields only; engine knobs go through extra_body
        body["stream_options"] = {"include_usage": True}
    body.update(extra_body or {})
    return body


@dataclass
class RequestResult:
    """What the client observed for one request (times in seconds; see the module docstring)."""

    index: int
    scheduled_s: float
    prompt_len: int = 0
    """Client-side prompt tokens (tokenizer, no template)."""
    requested_output_len: int = 0
    ok: bool = False
    error: str = ""
    status: int | None = None
    dispatch_s: float = math.nan
    send_s: float = math.nan
    end_s: float = math.nan
    """When the request finished (success or failure), relative to t0."""
    chunk_times_s: list[float] = field(default_factory=list)
    """Arrival of each content chunk, relative to send."""
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    tokens_source: str = ""
    """usage | tokenizer | chunks: where ``output_tokens`` came from."""
    chunk_tokens_source: str = ""
    """usage | tokenizer | chunks: where ``chunk_tokens`` came from."""
    retokenized_tokens: int | None = None
    """Client tokenizer's count of the generated text (for the usage-vs-tokenizer discrepancy)."""
    prompt_tokens: int | None = None
    """Server-reported prompt tokens (chat template included)."""
    finish_reason: str | None = None
    text: str = ""

    @property
    def dispatched(self) -> bool:
        """Arrived at the client (its scheduled time came); may still have waited for a concurrency slot."""
        return not math.isnan(self.dispatch_s)

    @property
    def sent(self) -> bool:
        """Issued to the server (passed the concurrency gate)."""
        return not math.isnan(self.send_s)

    @property
    def ttft_s(self) -> float:
        return self.chunk_times_s[0] if self.chunk_times_s else math.nan

    @property
    def e2e_s(self) -> float:
        return self.chunk_times_s[-1] if self.chunk_times_s else math.nan

    @property
    def queue_s(self) -> float:
        return self.send_s - self.dispatch_s

    @property
    def dispatch_lag_s(self) -> float:
        return self.dispatch_s - self.scheduled_s

    @property
    def tpot_s(self) -> float:
        """(E2E - TTFT) / (out - 1); NaN for a single-token answer (excluded from TPOT stats, passes the SLO) and
        for an untimed one (``untimed``: every token in one socket read, TTFT = E2E, the client saw no decode)."""
        if self.output_tokens <= 1 or not self.chunk_times_s or self.untimed:
            return math.nan
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def untimed(self) -> bool:
        """A multi-token answer that reached the client in one delivery (one socket read): its decode was not
        observed, so it has no TPOT and no ITL (not 0 ms); counted as ``untimed_requests``."""
        return self.output_tokens > 1 and len({*self.chunk_times_s}) == 1

    def coalesced_tokens(self) -> int:
        """Tokens after the first that arrived in a delivery of several SSE events (events completed by one socket
        read): their spacing is unknown, they give no ITL sample (counted as ``untimed_tokens``)."""
        n, events = 0, Counter(self.chunk_times_s)
        for i, (t, k) in enumerate(self.deliveries()):
            if events[t] > 1:
                n += k - (1 if i == 0 else 0)
        return n

    def deliveries(self) -> list[tuple[float, int]]:
        """(arrival time, tokens) per delivery: content chunks stamped with the same time (SSE events completed by
        one socket read) are one multi-token chunk. The client cannot tell apart tokens that reached it together,
        so their spacing is unknown, not 0 ms (a loaded host batches events into one read)."""
        out: list[tuple[float, int]] = []
        for i, t in enumerate(self.chunk_times_s):
            k = self.chunk_tokens[i] if i < len(self.chunk_tokens) else 1
            if out and t == out[-1][0]:
                out[-1] = (t, out[-1][1] + k)
            else:
                out.append((t, k))
        return out

    def itl_samples_s(self) -> list[float]:
        """Per-token gaps: delivery i (i >= 1) with k_i tokens after gap g_i gives k_i samples of g_i / k_i."""
        return [g for g, _ in self._itl_samples()]

    def timed_itl_samples_s(self) -> list[float]:
        """``itl_samples_s`` without the samples of deliveries made of several SSE events coalesced by one socket
        read: when each of those left the server is unknown (their tokens are ``coalesced_tokens``). A server's own
        multi-token event (one event, k tokens) still gives k samples of g/k. What the row's ITL is made of."""
        return [g for g, timed in self._itl_samples() if timed]

    def _itl_samples(self) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        carry = 0.0  # a delivery that carried no new token passes its gap to the next token-bearing one
        d = self.deliveries()
        events = Counter(self.chunk_times_s)
        for i in range(1, len(d)):
            gap = d[i][0] - d[i - 1][0] + carry
            k = d[i][1]
            if k <= 0:
                carry = gap
                continue
            carry = 0.0
            out.extend([(gap / k, events[d[i][0]] == 1)] * k)
        return out

    def chunk_gaps_s(self) -> list[float]:
        """Gaps between deliveries of content (what vLLM/SGLang bench call ITL; events of one read are one)."""
        t = [t for t, _ in self.deliveries()]
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "ok": self.ok,
            "error": self.error,
            "status": self.status,
            "scheduled_s": self.scheduled_s,
            "dispatch_s": self.dispatch_s,
            "send_s": self.send_s,
            "end_s": self.end_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "untimed": self.untimed,
            "coalesced_tokens": self.coalesced_tokens(),
            "tpot_s": self.tpot_s,
            "queue_s": self.queue_s,
            "dispatch_lag_s": self.dispatch_lag_s,
            "prompt_len": self.prompt_len,
            "prompt_tokens": self.prompt_tokens,
            "requested_output_len": self.requested_output_len,
            "output_tokens": self.output_tokens,
            "tokens_source": self.tokens_source,
            "retokenized_tokens": self.retokenized_tokens,
            "chunk_tokens_source": self.chunk_tokens_source,
            "finish_reason": self.finish_reason,
            "chunk_times_s": self.chunk_times_s,
            "chunk_tokens": self.chunk_tokens,
        }


@dataclass
class RunOutcome:
    """All results of one measured run plus its accounting."""

    results: list[RequestResult]
    duration_s: float
    """First dispatch -> last request end (the throughput denominator)."""
    first_dispatch_s: float
    abort_reason: str | None = None
    warmup_failed: int = 0
    """Warmup requests that failed (warmup results are otherwise discarded)."""

    @property
    def planned(self) -> int:
        return len(self.results)

    @property
    def sent(self) -> int:
        return sum(r.sent for r in self.results)

    @property
    def completed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        """Sent but not completed."""
        return sum(r.sent and not r.ok for r in self.results)

    @property
    def not_sent(self) -> int:
        """Never issued to the server (not yet due, or still waiting for a slot, when the run was aborted)."""
        return self.planned - self.sent


@dataclass
class _Stream:
    """Parser state of one SSE response (kept apart from the result until the stream ends)."""

    texts: list[str] = field(default_factory=list)
    cum_usage: list[int | None] = field(default_factory=list)
    final_usage: int | None = None
    done: bool = False


def _parse_event(event: bytes, now_rel: float, r: RequestResult, s: _Stream) -> None:
    """Apply one SSE event (the bytes between blank lines) to the request; raises ValueError on bad data."""
    data_lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data_lines.append(line[5:].strip())
        elif line.startswith(b"event:") and line[6:].strip() == b"error":
            raise ValueError(f"error event: {event[:200]!r}")
        # ':' comment/keep-alive lines and other fields are ignored (SSE spec)
    if not data_lines:
        return
    payload = b"\n".join(data_lines)
    if payload == b"[DONE]":
        s.done = True
        return
    try:
        obj = _decode(payload.decode())
    except ValueError as e:
        raise ValueError(f"malformed SSE data: {payload[:120]!r}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"malformed SSE data (not an object): {payload[:120]!r}")
    if obj.get("error") is not None and not obj.get("choices"):
        raise ValueError(f"server error in stream: {str(obj['error'])[:200]}")
    usage = obj.get("usage")
    cum = None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        cum = usage["completion_tokens"]
        s.final_usage = cum
        if isinstance(usage.get("prompt_tokens"), int):
            r.prompt_tokens = usage["prompt_tokens"]
    for ch in obj.get("choices") or ():
        if "delta" in ch:
            delta = ch.get("delta") or {}
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        else:
            text = ch.get("text") or ""
        if text:
            r.chunk_times_s.append(now_rel)
            s.texts.append(text)
            s.cum_usage.append(cum)
        if ch.get("finish_reason"):
            r.finish_reason = ch["finish_reason"]


def _finalize(r: RequestResult, s: _Stream, tok: TokenizerLike | None) -> None:
    """Token accounting of a finished stream (off the hot path: runs once per request)."""
    r.text = "".join(s.texts)
    n = len(s.texts)
    if n and all(c is not None for c in s.cum_usage):
        prev = 0
        ks = []
        for c in s.cum_usage:
            assert c is not None
            ks.append(c - prev)
            prev = c
        r.chunk_tokens, r.chunk_tokens_source = ks, "usage"
    elif tok is not None:
        r.chunk_tokens = [max(1, len(tok.encode(t, add_special_tokens=False))) for t in s.texts]
        r.chunk_tokens_source = "tokenizer"
    else:
        r.chunk_tokens, r.chunk_tokens_source = [1] * n, "chunks"
    if tok is not None and r.text:
        r.retokenized_tokens = len(tok.encode(r.text, add_special_tokens=False))
    if s.final_usage is not None:
        r.output_tokens, r.tokens_source = s.final_usage, "usage"
    elif r.retokenized_tokens is not None:
        r.output_tokens, r.tokens_source = r.retokenized_tokens, "tokenizer"
    else:
        r.output_tokens, r.tokens_source = sum(r.chunk_tokens), "chunks"


def _raise_nofile_limit(reserve: int = 16384) -> None:
    """Thousands of sockets need more than the common soft limit of 1024 descriptors; and the descriptor table is
    grown to ``reserve`` entries now, before the clock starts.

    Linux doubles a process's descriptor table when a new descriptor does not fit, and in a multi-threaded process
    it then waits for an RCU grace period (``expand_fdtable`` -> ``synchronize_rcu``): the event loop stood still
    for 10-20 ms when the 256th connection opened mid-run, stamping every chunk that arrived meanwhile late.
    Taking one high descriptor number and closing it again leaves the table grown (the kernel never shrinks it).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    high = min(reserve, resource.getrlimit(resource.RLIMIT_NOFILE)[0]) - 1
    if high > 2:
        with contextlib.suppress(OSError):
            fd = os.open(os.devnull, os.O_RDONLY)
            try:
                if fd < high:
                    os.dup2(fd, high)
                    os.close(high)
            finally:
                os.close(fd)


async def run_requests(
    base_url: str,
    api: str,
    bodies: list[bytes],
    schedule: list[float],
    concurrency: int | None,
    *,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 120.0,
    request_timeout_s: float = 1800.0,
    deadline_s: float | None = None,
    abort_check: Callable[[], str | None] | None = None,
    tokenizer: TokenizerLike | None = None,
    requests: list[BenchRequest] | None = None,
    warmup_bodies: list[bytes] | None = None,
    send_time_header: bool = False,
    stall_after: int | None = None,
    before_start: Callable[[], None] | None = None,
    on_start: Callable[[float], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
    progress_every_s: float = 10.0,
) -> RunOutcome:
    """Send ``bodies[i]`` at ``schedule[i]`` seconds (gated by ``concurrency``) and collect every stream.

    ``warmup_bodies`` run first, closed loop at the same concurrency and over the same connection pool (so the
    measured run does not pay TCP connects or server warm-up), and are discarded. Three things end the run early:
    ``abort_check`` returning a reason (polled every 0.2 s, e.g. "server exited"), ``stall_after`` consecutive
    requests failing on a timeout (default max(8, concurrency): a stalled server would otherwise cost N/C waves of
    read timeouts), and ``deadline_s`` after the start (None = none); in-flight requests then fail with the
    reason and unsent ones stay unsent.
    ``before_start()`` runs after the warmup and before the clock starts (nothing in flight: e.g. a /metrics
    scrape whose counters then exclude the warmup); ``on_progress(finished, sent, planned)`` is called every
    ``progress_every_s`` seconds.
    ``send_time_header`` adds ``x-send-time`` (this host's CLOCK_MONOTONIC at send) for the scripted test
    server, which then times its script from the client's send instead of its own receive.
    """
    assert len(bodies) == len(schedule)
    url = base_url.rstrip("/") + API_PATHS[api]
    n = len(bodies)
    results = [RequestResult(i, float(schedule[i])) for i in range(n)]
    if requests is not None:
        for r, q in zip(results, requests, strict=True):
            r.prompt_len, r.requested_output_len = q.prompt_len, q.output_len
    order = sorted(range(n), key=lambda i: schedule[i])
    _raise_nofile_limit()
    limit = concurrency or 0
    # Idle pooled connections are dropped before the server's own keep-alive timeout closes them (uvicorn's default,
    # used by vLLM's, SGLang's and transformers' OpenAI servers, is 5 s): reusing one the server is closing at that
    # moment fails the request with ServerDisconnectedError before a byte is sent (seen: 21 of 160 requests after a
    # > 5 s pause on a loaded 2-core box). A new connection costs one loopback/LAN handshake.
    connector = _timed_connector(limit=limit, limit_per_host=limit, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=connect_timeout_s, sock_read=read_timeout_s)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    abort: list[str] = []
    perf = wall
    warm_results: list[RequestResult] = []
    timeouts = [0]  # consecutive requests that ended in a timeout (reset by any other outcome)
    streams: dict[int, _Stream] = {}
    stall_n = stall_after or max(8, concurrency or 0)

    async def send(r: RequestResult, body: bytes, session: aiohttp.ClientSession, t0: float) -> None:
        s = _Stream()
        st = perf()
        r.send_s = st - t0
        headers = {"x-send-time": repr(st)} if send_time_header else None
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                r.status = resp.status
                if resp.status != 200:
                    r.error = f"HTTP {resp.status}: {(await resp.text(errors='replace'))[:200]}"
                    return
                content = resp.content
                proto = resp.connection.protocol if resp.connection is not None else None
                rx = getattr(proto, "rx_log", None) if getattr(proto, "rx_owner", None) is content else None
                buf = b""
                got = 0  # body bytes read so far
                now = 0.0
                while True:
                    data = await content.readany()
                    if not data:
                        break
                    base, end = got, got + len(data)
                    # one piece per socket read that the data spans, each with the time that read arrived
                    pieces: list[tuple[bytes, float]] = []
                    while rx and got < end:
                        upto, t_rx = rx[0]
                        if upto <= got:
                            del rx[0]
                            continue
                        cut_at = min(upto, end)
                        pieces.append((data[got - base : cut_at - base], t_rx - st))
                        got = cut_at
                    if got < end:  # not stamped (no hook): the time we got to read it
                        pieces.append((data[got - base :], perf() - st))
                        got = end
                    for piece, now in pieces:
                        buf += piece
                        if b"\r" in buf[-len(piece) - 1 :]:
                            buf = buf.replace(b"\r\n", b"\n")
                        while True:
                            cut = buf.find(b"\n\n")
                            if cut < 0:
                                break
                            event, buf = buf[:cut], buf[cut + 2 :]
                            _parse_event(event, now, r, s)
                if buf.strip():  # an unterminated last event: its bytes were all in by the last read
                    _parse_event(buf.strip(b"\n"), now, r, s)
            if not r.chunk_times_s:
                r.error = "stream ended without any content token"
            elif not (s.done or r.finish_reason):
                r.error = "stream ended without finish_reason or [DONE] (truncated)"
            else:
                r.ok = True
        except ValueError as e:
            r.error = str(e)
        except asyncio.TimeoutError:
            silent = perf() - st - (r.chunk_times_s[-1] if r.chunk_times_s else 0.0)
            r.error = (
                f"timeout: no data for {silent:.1f} s (read timeout {read_timeout_s:g} s, total "
                f"{request_timeout_s:g} s)"
            )
        except aiohttp.ClientError as e:
            r.error = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            timeouts[0] = timeouts[0] + 1 if r.error.startswith("timeout") else 0
            streams[r.index] = s  # token accounting after the run: tokenizer calls here would delay other streams

    async def one(r: RequestResult, body: bytes, session: aiohttp.ClientSession, t0: float) -> None:
        r.dispatch_s = perf() - t0
        try:
            if sem is None:
                await send(r, body, session, t0)
            else:
                async with sem:
                    await send(r, body, session, t0)
        except asyncio.CancelledError:
            r.ok = False
            r.error = r.error or f"cancelled: {abort[0] if abort else 'run cancelled'}"
        finally:
            r.end_s = perf() - t0

    async def dispatch(session: aiohttp.ClientSession, t0: float) -> None:
        for i in order:
            delay = t0 + schedule[i] - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            if abort:
                return
            tasks.append(loop.create_task(one(results[i], bodies[i], session, t0)))

    async def watchdog(t0: float, dispatcher: asyncio.Task[None]) -> None:
        next_progress = perf() + progress_every_s
        while True:
            await asyncio.sleep(0.2)
            if on_progress is not None and perf() >= next_progress:
                next_progress += progress_every_s
                on_progress(sum(not math.isnan(r.end_s) for r in results), len(tasks), n)
            if gc.get_count()[0] > GC_VALVE:  # safety valve for very long runs (one pause, not thousands)
                gc.collect(1)
            reason = abort_check() if abort_check is not None else None
            now = perf()
            if reason is None and deadline_s is not None and now - t0 > deadline_s:
                reason = f"run deadline of {deadline_s:.0f} s reached"
            if reason is None and timeouts[0] >= stall_n:
                reason = f"server stalled: {timeouts[0]} requests in a row timed out"
            if reason is not None:
                abort.append(reason)
                dispatcher.cancel()
                for t in tasks:
                    t.cancel()
                return

    # Collector pauses land in the measured latencies (every chunk that arrives during one is stamped late): freeze
    # the heap built so far (vLLM freeze_gc_heap) and switch the collector off for the run. The streaming path
    # makes next to no cyclic garbage (measured: ~1,000 unreachable objects after 10,000 requests), so memory
    # stays flat; the watchdog still collects the young generations if GC_VALVE tracked objects pile up.
    gc.collect()
    gc.freeze()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers={"Content-Type": "application/json", **auth_headers()}
        ) as session:
            if warmup_bodies:
                t_w = perf()
                warm_sem = asyncio.Semaphore(concurrency or len(warmup_bodies))

                async def warm(i: int, body: bytes) -> None:
                    r = RequestResult(-1 - i, 0.0)
                    warm_results.append(r)
                    async with warm_sem:
                        await send(r, body, session, t_w)

                await asyncio.gather(*(warm(i, b) for i, b in enumerate(warmup_bodies)))
            timeouts[0] = 0
            if before_start is not None:
                before_start()
            t0 = perf()
            if on_start is not None:
                on_start(t0)
            dispatcher = loop.create_task(dispatch(session, t0))
            dog = loop.create_task(watchdog(t0, dispatcher))
            try:
                await asyncio.gather(dispatcher, return_exceptions=True)
                while True:  # tasks can be appended until the dispatcher returns; then wait for all of them
                    pending = [t for t in tasks if not t.done()]
                    if not pending:
                        break
                    await asyncio.wait(pending)
            finally:
                dog.cancel()
                await asyncio.gather(dog, return_exceptions=True)
    finally:
        if gc_was_enabled:
            gc.enable()
        gc.unfreeze()
    for r in results:
        if r.index in streams:
            _finalize(r, streams[r.index], tokenizer)
    sent = [r for r in results if r.sent]
    assert all(r.sent for r in results if r.ok) and all(r.dispatched for r in sent)
    first = min((r.dispatch_s for r in sent), default=0.0)
    last = max((r.end_s for r in sent), default=first)
    return RunOutcome(
        results, last - first, first, abort[0] if abort else None, warmup_failed=sum(not r.ok for r in warm_results)
    )


def run_benchmark(
    base_url: str,
    api: str,
    bodies: list[dict[str, Any]],
    schedule: list[float],
    concurrency: int | None,
    warmup: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> RunOutcome:
    """Synchronous wrapper: serialize bodies before the clock starts, then run one event loop."""
    encoded = [json.dumps(b).encode() for b in bodies]
    warm = [json.dumps(b).encode() for b in warmup or []]
    return run_precise(
        run_requests(base_url, api, encoded, [float(s) for s in schedule], concurrency, warmup_bodies=warm, **kwargs)
    )
