"""Rank 0's engine loop: admit requests FCFS into free KV rows, plan and broadcast each step, sample, emit."""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from phase6.serving.tp_server.args import ServerArgs
from phase6.serving.tp_server.engine import CMD_NOOP, CMD_STEP, CMD_STOP, Engine, StepPlan
from phase6.timing import wall

IDLE_HEARTBEAT_S = 30.0  # an idle rank 0 sends NOOP this often, far inside the control group's timeout

log = logging.getLogger("phase6.tp_server")


@dataclass
class GenParams:
    """What one request asks for (validated from the HTTP body)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    return_token_ids: bool = False
    """vLLM's extension: put ``token_ids`` (and ``prompt_token_ids``) in each choice."""


@dataclass
class Request:
    rid: str
    params: GenParams
    sink: Callable[[list[tuple[Request, int | None, str | None]]], None]
    """Called from the engine thread with this step's events; must be thread-safe (call_soon_threadsafe)."""
    arrival: float = field(default_factory=wall)
    output: list[int] = field(default_factory=list)
    cache_len: int = 0
    """Tokens of this request currently in its KV row."""
    cancelled: bool = False
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    number: int = 0
    """Submission order (default sampling seed = --seed + number)."""


class Scheduler:
    """Rank 0's engine loop (its own thread): admit, plan, broadcast, execute, sample, emit."""

    def __init__(self, engine: Engine, args: ServerArgs, eos_ids: set[int], sample_vocab: int) -> None:
        self.engine, self.args = engine, args
        self.eos_ids = eos_ids
        self.sample_vocab = sample_vocab
        """Ids >= this are never sampled (checkpoint vocab padding beyond the tokenizer's ids)."""
        self.inbox: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # index = KV row
        self.pending_moves: list[tuple[int, int, int]] = []
        self.stopping = False
        self.submitted = 0
        self.error: str | None = None
        self.counters = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "success": 0,
            "ttft_sum": 0.0,
            "ttft_count": 0,
            "queue_sum": 0.0,
            "queue_count": 0,
            "steps": 0,
        }

    # -- called from the HTTP thread -------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        self.submitted += 1
        req.number = self.submitted
        self.inbox.put(req)

    def stop(self) -> None:
        self.inbox.put(None)

    def gauges(self) -> dict[str, float]:
        active = list(self.active)
        used = sum(r.cache_len for r in active)
        return {
            "running": len(active),
            "waiting": len(self.waiting) + self.inbox.qsize(),
            "kv_cache_usage": used / (self.args.max_batch * self.args.max_model_len),
        }

    # -- engine thread ---------------------------------------------------------------------------------------

    def _drain(self, block: bool) -> bool:
        """Move submitted requests to ``waiting``; False when idle for the heartbeat period (send a NOOP)."""
        try:
            item = self.inbox.get(timeout=IDLE_HEARTBEAT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return not block
        while True:
            if item is None:
                self.stopping = True
            else:
                self.waiting.append(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _remove(self, row: int) -> None:
        last = self.active.pop()
        if row < len(self.active):
            self.active[row] = last
            self.pending_moves.append((len(self.active), row, last.cache_len))

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        width = 0
        while self.waiting and len(self.active) + len(admitted) < self.args.max_batch:
            req = self.waiting[0]
            if req.cancelled:
                self.waiting.popleft()
                continue
            w = max(width, len(req.params.prompt_ids))
            if admitted and w * (len(admitted) + 1) > self.args.max_prefill_tokens:
                break
            width = w
            admitted.append(self.waiting.popleft())
        return admitted

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        if self.sample_vocab < logits.shape[-1]:
            logits[:, self.sample_vocab :] = -math.inf
        tokens = logits.argmax(dim=-1)
        for i, r in enumerate(reqs):
            p = r.params
            if p.temperature <= 0:
                continue
            probs = torch.softmax(logits[i] / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, si = probs.sort(descending=True)
                keep = sp.cumsum(0) - sp < p.top_p  # smallest prefix whose mass reaches top_p
                probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
            if r.generator is None:
                r.generator = torch.Generator(device=logits.device)
                r.generator.manual_seed(p.seed if p.seed is not None else self.args.seed + r.number)
            tokens[i] = torch.multinomial(probs, 1, generator=r.generator)[0]
        return tokens.cpu().tolist()  # .cpu() waits for the step with the GIL released: HTTP streams meanwhile

    def _finish_reason(self, r: Request, token: int) -> str | None:
        p = r.params
        if len(r.output) >= p.max_tokens:
            return "length"
        if token in self.eos_ids and not p.ignore_eos and len(r.output) >= p.min_tokens:
            return "stop"
        return None

    def step(self) -> bool:
        """One iteration; False once stopped."""
        if not self._drain(block=not self.active and not self.waiting):
            self.engine.send(CMD_NOOP)
            return True
        if self.stopping:
            return False
        events: list[tuple[Request, int | None, str | None]] = []
        for row in range(len(self.active) - 1, -1, -1):  # disconnected clients free their rows
            if self.active[row].cancelled:
                self._remove(row)
        decode_rows = list(self.active)
        admitted = self._admit()
        if not decode_rows and not admitted:
            if self.pending_moves:
                self.pending_moves.clear()  # nothing runs: the moved rows are empty anyway
            return True
        now = wall()
        for r in admitted:
            self.counters["queue_sum"] += now - r.arrival
            self.counters["queue_count"] += 1
        plan = StepPlan(
            self.pending_moves,
            [r.output[-1] for r in decode_rows],
            [r.cache_len for r in decode_rows],
            [r.params.prompt_ids for r in admitted],
        )
        self.pending_moves = []
        self.engine.send(CMD_STEP, plan)
        logits = self.engine.execute(plan)
        assert logits is not None
        reqs = decode_rows + admitted
        tokens = self._sample(logits, reqs)
        self.active.extend(admitted)
        now = wall()
        for r in decode_rows:
            r.cache_len += 1
        for r in admitted:
            r.cache_len = len(r.params.prompt_ids)
            self.counters["prompt_tokens"] += r.cache_len
            self.counters["ttft_sum"] += now - r.arrival
            self.counters["ttft_count"] += 1
        finished: list[Request] = []
        for r, tok in zip(reqs, tokens, strict=True):
            r.output.append(tok)
            r.finish_reason = self._finish_reason(r, tok)
            events.append((r, tok, r.finish_reason))
            if r.finish_reason is not None:
                finished.append(r)
        self.counters["generation_tokens"] += len(tokens)
        self.counters["steps"] += 1
        for r in finished:
            self._remove(self.active.index(r))
            self.counters["success"] += 1
        by_sink: dict[int, tuple[Callable[..., None], list[tuple[Request, int | None, str | None]]]] = {}
        for ev in events:
            by_sink.setdefault(id(ev[0].sink), (ev[0].sink, []))[1].append(ev)
        for sink, evs in by_sink.values():
            sink(evs)
        return True

    def run(self) -> None:
        """Engine thread body: step until stopped, then release every rank; failures end all requests."""
        try:
            if self.engine.device.type == "cuda":
                torch.cuda.set_device(self.engine.device)  # the current device is per thread
            with torch.inference_mode():
                while self.step():
                    pass
        except Exception:  # the server cannot continue; report to every open request and to /health
            self.error = traceback.format_exc()
            log.error("engine failed:\n%s", self.error)
        finally:
            with contextlib.suppress(Exception):
                self.engine.send(CMD_STOP)
            pending = self.active + list(self.waiting)
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    pending.append(item)
            for r in pending:
                r.sink([(r, None, "abort")])
