"""Discrete-event simulation of a fleet of continuous-batching LLM serving replicas.

Events (all on one event loop, SimPy's ``Environment`` or an equivalent heapq loop; both order equal times by
insertion, so both give identical results):
  arrival        a request reaches the router, which picks a replica (prefill pool under PD)
  step end       a replica finished one engine step, or a run of decode-only steps (see below)
  KV transfer    (PD) a prompt's KV arrived at the decode replica

A replica step (vLLM V1 scheduling): every running decode sequence contributes one token; the rest of the
``max_num_batched_tokens`` budget goes to prefill chunks of admitted requests in arrival order (chunked prefill), then to
new admissions: a waiting request is admitted (FCFS, head-of-line) only while the step has budget left, fewer than
``max_num_seqs`` sequences run and its KV blocks (prompt + output, 512 tokens each, minus cached prefix blocks) fit,
evicting LRU prefix blocks if needed; KV is reserved for the whole output at admission (no preemption). The step that completes a prompt produces
the first token (TTFT); each later step produces one token (TPOT = (E2E - TTFT) / (output - 1)). A request reaches
the router ``request_delay_s`` after it arrives (``engine.request_overhead_ms``: the API server's per-request work),
which TTFT and E2E include and no step does.

Decode-only runs: when no prefill work is pending, the batch cannot change before its next sequence finishes, so
the replica schedules one event at the end of those k steps (closed-form sum of step times). An arrival in the
middle cuts the run at the first step boundary after it. This keeps the event count O(requests), not O(tokens).

Engine profile torch-tp (the model is a :class:`phase6.fleet.engines.TorchTPStepTime`): the replica follows
phase6.serving.tp_server instead -- whole prompts admitted FCFS while rows are free and (prompts) x (longest prompt)
fits ``max_num_batched_tokens`` (= --max-prefill-tokens), each step a decode forward of the running rows at their
padded (batch, KV length) shape then a prefill forward of the admitted prompts padded to the longest, no prefix
cache. Decode-only runs work the same way, with the longest running context in place of the context sum.

PD disaggregation: prefill replicas only prefill; at the end of a prompt the request reserves KV on the least-loaded
decode replica (waiting there if full; with ``EngineLimits.decode_swap`` only its prompt's, grown per token and
swapped out when full: ``phase6.fleet.preempt``), its KV is sent over the prefill replica's link (FIFO, bytes /
bandwidth), and it joins the decode replica's batch at its next step boundary. TTFT ends with the prefill (first token comes from
the prefill replica); the transfer delays token 2 and so shows in TPOT.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from itertools import takewhile
from operator import attrgetter
from typing import Any

import numpy as np

from phase6 import timing
from phase6.fleet.engines import TorchTPStepTime
from phase6.fleet.kvcache import HostTier, PrefixCache
from phase6.fleet.loops import HeapqLoop, SimpyLoop, _first_step_reaching, make_loop  # noqa: F401 (re-export)
from phase6.fleet.preempt import grow, next_growth, track
from phase6.fleet.request import EngineLimits, _Req
from phase6.fleet.results import SimResult, Topology
from phase6.fleet.steptime import StepTimeModel
from phase6.fleet.tokens import StepLog
from phase6.fleet.workload import Workload
from phase6.serving.traces import BLOCK_TOKENS

ROUTER_NAMES = ("random", "round_robin", "least_loaded", "prefix_aware", "session_affinity")

_outstanding = attrgetter("outstanding")
_load = attrgetter("queued_prefill_tokens", "outstanding")


# ---- replicas ----------------------------------------------------------------------------------------------------
class Replica:
    """One serving engine instance; role colocated, prefill (PD) or decode (PD)."""

    def __init__(
        self, rid: int, role: str, sim: Simulation, limits: EngineLimits, model: Any = None, host: Any = None
    ) -> None:
        self.rid, self.role, self.sim = rid, role, sim
        self.model = sim.model if model is None else model  # PD pools may run different TP (step models)
        self.max_seqs, self.budget = limits.max_num_seqs, limits.max_num_batched_tokens
        self.chunked = limits.chunked_prefill
        self.cache = PrefixCache(limits.kv_blocks, host)
        self.grows = limits.incremental_kv and role == "colocated" and not sim.padded  # KV grows per token
        self.block_tokens = BLOCK_TOKENS
        if role == "decode" and limits.decode_swap:  # DistServe: grows per token, swaps out when full
            self.grows, self.block_tokens = True, limits.block_tokens
        self.bheap: list[tuple[int, int, int, _Req]] = []  # (step of the next block growth, index, generation, req)
        self.log = StepLog()  # decode steps (token gaps of the running requests)
        self.run_dec = True  # the current step advances the decodes (False: a V0 prefill-only step)
        self.load_s = 0.0  # host-tier KV loads of the admissions in the current step
        self.waiting: deque[_Req] = deque()  # routed here, not admitted
        self.prefilling: deque[_Req] = deque()  # admitted, prompt not finished
        self.ready: list[_Req] = []  # decode role: KV arrived, joins at the next step
        self.reserve_q: deque[_Req] = deque()  # decode role: waiting for KV room
        self.reserved = 0  # decode role: sequences holding KV here (transferring or decoding)
        self.dheap: list[tuple[int, int, _Req]] = []  # (finish step, request index, request)
        self.n_dec = 0
        self.ctx_sum = 0
        self.steps = 0
        self.outstanding = 0  # requests routed here and not done here (router load)
        self.queued_prefill_tokens = 0  # prompt tokens still to compute here (prefix-aware router)
        self.busy = False
        self.gen = 0  # generation of the pending step-end event; stale events are ignored
        self.step_start = 0.0
        self.run_k = 0  # decode steps in the current event (1 for a mixed step)
        self.run_truncated = True
        self.run_ctx = 0  # context argument of the current decode run (sum; torch-tp: the longest)
        self.padded = sim.padded  # torch-tp scheduling and step shapes
        self.shapes: set[tuple[int, int]] = set(getattr(self.model, "warm_shapes", ()))  # torch-tp prefill shapes run
        self.chunks: list[tuple[_Req, int]] = []
        self.busy_s = 0.0
        self.link_free_s = 0.0  # prefill role: when its KV-transfer link is idle again

    # -- entry points ------------------------------------------------------------------------------------------------
    def enqueue(self, r: _Req, est_hit: int) -> None:
        """A request routed here (colocated / prefill role)."""
        self.outstanding += 1
        r.pending = r.n_in - est_hit
        self.queued_prefill_tokens += r.pending
        self.waiting.append(r)
        self.sim.n_waiting += 1
        self._kick()

    def join(self, r: _Req) -> None:
        """Decode role: a request's KV arrived."""
        self.ready.append(r)
        self._kick()

    def _kick(self) -> None:
        now = self.sim.loop.now
        if not self.busy:
            self._start_step(now)
        elif not self.run_truncated:
            self._truncate(now)

    # -- scheduling ----------------------------------------------------------------------------------------------------
    def _admit_head(self, now: float) -> _Req | None:
        """Admit the first waiting request if its KV fits (evicting LRU prefix blocks); FCFS, head-of-line."""
        sim, cache = self.sim, self.cache
        r = self.waiting[0]
        hid = r.hid
        m = cache.match(hid) if hid else 0
        m2 = cache.host_match(hid, m) if cache.host is not None and hid else 0  # more blocks in host memory
        hit = min((m + m2) * BLOCK_TOKENS, r.n_in - 1)
        need = r.blocks - m
        if not cache.acquire(hid, m, need):
            return None
        if m2:
            self.load_s += cache.host.load_s(m2)  # copied to HBM before the step computes (not overlapped)
        self.waiting.popleft()
        sim.n_waiting -= 1
        sim.wait_area_add(now)
        if not r.resumed:  # a recompute after preemption keeps the first admission's time and hit
            r.hit, r.admit_s = hit, now
        r.m, r.done, r.private = m, hit, need
        sim.admissions += 1
        r.adm = sim.admissions
        self.queued_prefill_tokens += (r.n_in - hit) - r.pending
        r.pending = r.n_in - hit
        self.prefilling.append(r)
        return r

    def running(self) -> list[_Req]:
        """Admitted requests holding KV here (decoding or prefilling)."""
        return [e[2] for e in self.dheap] + list(self.prefilling)

    def _start_step(self, now: float) -> None:
        self.run_dec, self.load_s = True, 0.0
        if self.role == "decode" and self.ready:
            self._join_ready(now)
        preempted = grow(self, now) if self.bheap and self.bheap[0][0] <= self.steps else 0  # new KV blocks
        if self.padded:
            self._start_step_padded(now)
            return
        if not self.chunked and self.role != "decode" and self.waiting:
            self._start_step_v0(now)
            return
        # Token budget (vLLM V1 order): one token per running decode, then running prefills, then new admissions.
        # A waiting request is admitted only while this step still has budget, so KV is allocated when its first
        # chunk runs, not while it queues (queued prompts would otherwise pin KV and evict the prefix cache).
        chunks = self.chunks = []
        budget = self.budget - self.n_dec
        p_tokens = 0
        pairs = 0.0
        for r in self.prefilling:
            if budget <= 0:
                break
            c = r.n_in - r.done
            if c > budget:
                c = budget
            pairs += c * r.done + c * (c + 1) / 2
            p_tokens += c
            budget -= c
            chunks.append((r, c))
        while not preempted and budget > 0 and self.waiting and len(self.prefilling) + self.n_dec < self.max_seqs:
            r = self._admit_head(now)
            if r is None:
                break
            c = r.n_in - r.done
            if c > budget:
                c = budget
            pairs += c * r.done + c * (c + 1) / 2
            p_tokens += c
            budget -= c
            chunks.append((r, c))
        model = self.model
        step_s = model.step_s(p_tokens, pairs, self.n_dec, self.ctx_sum) + self.load_s if p_tokens else None
        self._launch(now, step_s, model.decode_run_s, self.ctx_sum)

    def _start_step_v0(self, now: float) -> None:
        """vLLM V0's default scheduler (no chunked prefill): waiting prompts are admitted whole, FCFS, while their
        tokens fit the budget (the first always: V0 requires budget >= max_model_len), fewer than max_num_seqs run
        and their KV fits, and run in a prefill-only step; the running decodes wait for it (no token this step)."""
        chunks = self.chunks = []
        p_tokens, pairs = 0, 0.0
        while self.waiting and len(self.prefilling) + self.n_dec < self.max_seqs:
            if p_tokens and p_tokens + self.waiting[0].n_in > self.budget:
                break
            r = self._admit_head(now)
            if r is None:
                break
            c = r.n_in - r.done
            pairs += c * r.done + c * (c + 1) / 2
            p_tokens += c
            chunks.append((r, c))
        model = self.model
        if p_tokens:
            self.run_dec = False
            self._launch(now, model.step_s(p_tokens, pairs, 0, 0) + self.load_s, model.decode_run_s, self.ctx_sum)
        else:
            self._launch(now, None, model.decode_run_s, self.ctx_sum)

    def _start_step_padded(self, now: float) -> None:
        """torch-tp (``tp_server.Scheduler.step``): admit whole prompts FCFS while rows are free and (prompts) x
        (longest prompt) <= the padded-token budget (the first always goes; ``Scheduler._admit``), then one step =
        decode forward of the running rows + prefill forward of the admitted prompts padded to the longest."""
        chunks = self.chunks = []
        waiting, budget = self.waiting, self.budget
        n = width = 0
        while waiting and self.n_dec + n < self.max_seqs:
            w = max(width, waiting[0].n_in)
            if n and w * (n + 1) > budget:
                break
            r = self._admit_head(now)
            if r is None:
                break
            n, width = n + 1, w
            chunks.append((r, r.n_in))
        model = self.model
        max_ctx = self.steps + max(e[2].off for e in self.dheap) if self.n_dec else 0
        step_s = None
        if n:
            new = (n, width) not in self.shapes
            self.shapes.add((n, width))
            step_s = model.padded_step_s(n, width, self.n_dec, max_ctx, new_shape=new)
        self._launch(now, step_s, model.padded_decode_run_s, max_ctx)

    def _join_ready(self, now: float) -> None:
        """Decode role: requests whose KV arrived join the batch at this step boundary (before this step's block
        growth, which a joining request may already need: ``decode_swap``)."""
        sim = self.sim
        for r in self.ready:
            sim.join[r.i], sim.drep[r.i] = now, self.rid
            heapq.heappush(self.dheap, (self.steps + r.n_out - 1, r.i, r))
            self.n_dec += 1
            self.ctx_sum += r.n_in + 1
            if self.grows:
                sim.admissions += 1
                r.adm = sim.admissions
                track(self, r)
                if r.resumed:  # swapped back in: its gaps restart from its last token before the swap
                    sim.gap_from[r.i], sim.gap_n[r.i] = r.last_tok, r.n_out
        self.ready = []

    def _launch(
        self, now: float, step_s: float | None, decode_run_s: Callable[[int, int, int], float], ctx: int
    ) -> None:
        """Schedule the next step end: a step with prefill work of ``step_s`` seconds when there is one, else a
        decode-only run of k steps (to the next finishing row under ``sim.macro``, else 1) priced by
        ``decode_run_s(rows, ctx, k)``, else go idle."""
        if step_s is not None:
            dt = step_s
            self.run_k = 1
            self.run_truncated = True
        elif self.n_dec:
            k = self.dheap[0][0] - self.steps if self.sim.macro else 1
            if self.bheap and k > 1:  # a block growth ends the run (it may preempt)
                g = next_growth(self)
                if g is not None:
                    k = min(k, g - self.steps)
            dt = decode_run_s(self.n_dec, ctx, k)
            self.run_k = k
            self.run_truncated = k == 1
            self.run_ctx = ctx
        else:
            self.busy = False
            return
        self.busy = True
        self.step_start = now
        self.gen += 1
        self.sim.loop.call_in(dt, self._on_step_end, self.gen)

    def _truncate(self, now: float) -> None:
        """An arrival during a decode-only run: end the run at the first step boundary at or after ``now``."""
        self.run_truncated = True
        if self.role != "decode" and (len(self.waiting) > 1 or len(self.prefilling) + self.n_dec >= self.max_seqs):
            return  # the newcomer cannot be admitted before the run ends anyway
        model, d, s, k = self.model, self.n_dec, self.run_ctx, self.run_k
        run_s = model.padded_decode_run_s if self.padded else model.decode_run_s
        lo = _first_step_reaching(run_s, d, s, k, now - self.step_start)
        if lo == k:
            return
        self.run_k = lo
        self.gen += 1
        end = self.step_start + run_s(d, s, lo)
        self.sim.loop.call_in(max(end - now, 0.0), self._on_step_end, self.gen)

    def _on_step_end(self, gen: int) -> None:
        if gen != self.gen:
            return  # superseded by a truncated run
        sim = self.sim
        now = sim.loop.now
        self.busy_s += now - self.step_start
        k = self.run_k
        # decode progress: every running sequence made k tokens (none in a V0 prefill-only step)
        if self.n_dec and self.run_dec:
            self.log.add(self.step_start, now, k)
            self.steps += k
            self.ctx_sum += self.n_dec * k
            dheap, steps = self.dheap, self.steps
            while dheap and dheap[0][0] == steps:
                r = heapq.heappop(dheap)[2]
                self.n_dec -= 1
                self.ctx_sum -= r.n_in + r.n_out
                self._finish(r, now)
        elif self.run_dec:
            self.steps += k
        # prefill progress
        if self.chunks:
            pre = self.prefilling
            for r, c in self.chunks:
                r.done += c
                self.queued_prefill_tokens -= c
                r.pending -= c
                if r.done == r.n_in:
                    assert pre[0] is r
                    pre.popleft()
                    self._prompt_done(r, now)
            self.chunks = []
        self._start_step(now)

    def _prompt_done(self, r: _Req, now: float) -> None:
        if r.resumed:  # the recompute's last step emits its next token; gaps restart from its last one before
            self.sim.gap_from[r.i], self.sim.gap_n[r.i] = r.last_tok, r.n_out
        else:
            self.sim.first[r.i] = now
        if r.hid:
            self.cache.commit(r.hid, r.m)
        if r.n_out == 1:
            self._finish(r, now)
        elif self.role == "colocated":
            self.sim.join[r.i], self.sim.drep[r.i] = now, self.rid
            heapq.heappush(self.dheap, (self.steps + r.n_out - 1, r.i, r))
            self.n_dec += 1
            self.ctx_sum += r.n_in + 1
            r.off = r.n_in + 1 - self.steps
            if self.grows:
                track(self, r)
        else:  # prefill role: hand over to a decode replica
            self.outstanding -= 1
            r.prefill_rep = self
            self.sim.to_decode(r)

    def _finish(self, r: _Req, now: float) -> None:
        if self.role == "decode":
            self.cache.release((), r.private)
            self.reserved -= 1
            self.outstanding -= 1
            self.sim.finish(r, now)
            self.try_reserve()
            return
        # the new prompt blocks were committed to the prefix cache; what stays private is the output's room
        self.cache.release(r.hid, r.private - (len(r.hid) - r.m))
        if self.role == "colocated" or r.n_out == 1:
            self.outstanding -= 1
        self.sim.finish(r, now)

    # -- PD --------------------------------------------------------------------------------------------------------
    def try_reserve(self) -> None:
        """Decode role: give KV room to requests waiting for it, in order, and start their transfers."""
        q = self.reserve_q
        while q and self.reserved < self.max_seqs:
            r = q[0]
            # whole output reserved, or (decode_swap) the KV it holds now: its prompt (+ tokens before a swap)
            need = -(-(r.n_in if self.grows else r.n_in + r.n_out) // self.block_tokens)
            if not self.cache.acquire((), 0, need):
                break
            q.popleft()
            r.private = need
            self.reserved += 1
            self.sim.start_transfer(r, self)

    def transfer_done(self, r: _Req) -> None:
        if r.resumed:  # a swap-in from host memory: nothing held on the prefill side
            self.join(r)
            return
        p = r.prefill_rep
        assert p is not None
        p.cache.release(r.hid, r.blocks - len(r.hid) if r.hid else r.blocks)
        if p.waiting and not p.busy:  # its admissions may have waited for exactly this KV
            p._start_step(self.sim.loop.now)
        self.join(r)


# ---- the fleet -----------------------------------------------------------------------------------------------------
class Simulation:
    """One fleet, one router, one workload. Build, ``run()``, read the :class:`SimResult`."""

    def __init__(
        self,
        workload: Workload,
        model: StepTimeModel | TorchTPStepTime,
        limits: EngineLimits,
        topology: Topology,
        router: str,
        *,
        tp: int = 1,
        kv_transfer_s: Callable[[int], float] | None = None,
        engine: str = "simpy",
        closed_concurrency: int | None = None,
        macro: bool = True,
        decode_pool: tuple[StepTimeModel, EngineLimits, int] | None = None,
        host_tier: Callable[[int], HostTier | None] | None = None,
        seed: int = 0,
        request_delay_s: float = 0.0,
    ) -> None:
        """``request_delay_s``: the fixed time a request spends outside the engine before its first step (API server,
        tokenisation, hand-off; ``engine.request_overhead_ms``): it reaches the router and the engine's queue this long
        after it arrives, so it counts in TTFT and E2E and in no step. ``decode_pool``: PD only, the decode replicas' own (step model, limits, tp) when they run a different TP
        than the prefill pool (DistServe's per-phase parallelism); ``host_tier(replica id)``: its host-memory KV tier
        (the same object for every replica = one global pool) or None; ``seed``: the random router's."""
        if router not in ROUTER_NAMES:
            raise ValueError(f"fleet.routers: unknown router {router!r}; known: {', '.join(ROUTER_NAMES)}")
        self.padded = isinstance(model, TorchTPStepTime)
        if self.padded:
            tt = model.engine  # type: ignore[attr-defined]
            if topology.is_pd:
                raise ValueError(
                    f"fleet.policies: {topology.name} needs KV transfer between replicas; engine.profile=torch-tp "
                    "(phase6.serving.tp_server) has none: use colocated"
                )
            if (tt.max_batch, tt.max_prefill_tokens) != (limits.max_num_seqs, limits.max_num_batched_tokens):
                raise ValueError(
                    f"torch-tp: step model built for --max-batch {tt.max_batch} / --max-prefill-tokens "
                    f"{tt.max_prefill_tokens}, limits say {limits.max_num_seqs} / {limits.max_num_batched_tokens}"
                )
        elif limits.max_num_batched_tokens < limits.max_num_seqs:
            raise ValueError(
                f"engine.max_num_batched_tokens ({limits.max_num_batched_tokens}) must be >= engine.max_num_seqs "
                f"({limits.max_num_seqs}): every running sequence needs its decode token each step"
            )
        if topology.is_pd and kv_transfer_s is None:
            raise ValueError("a PD topology needs a kv_transfer_s(tokens) function")
        self.w, self.model, self.limits, self.topology, self.router = workload, model, limits, topology, router
        self.tp = tp
        self.kv_transfer_s = kv_transfer_s
        self.loop = make_loop(engine)
        self.closed = closed_concurrency
        if not request_delay_s >= 0:
            raise ValueError(f"engine.request_overhead_ms: must be >= 0, got {request_delay_s * 1e3}")
        self.delay = request_delay_s
        self.macro = macro  # False: one event per decode step (reference mode for tests; same results, slower)
        n = len(workload)
        self._check_fits()
        ht = host_tier or (lambda _rid: None)
        self.tp_decode = tp
        if topology.is_pd:
            self.front = [Replica(i, "prefill", self, limits, host=ht(i)) for i in range(topology.prefill)]
            d_model, d_limits, self.tp_decode = decode_pool or (model, limits, tp)
            bt = d_limits.block_tokens if d_limits.decode_swap else BLOCK_TOKENS
            need = int((-(-(workload.input_tokens + workload.output_tokens) // bt)).max()) if n else 0
            if need > d_limits.kv_blocks:
                raise ValueError(
                    f"{workload.source}: a request needs {need} KV blocks but a decode replica (tp "
                    f"{self.tp_decode}) holds {d_limits.kv_blocks}; raise engine.decode_tp or drop long requests"
                )
            self.back = [
                Replica(topology.prefill + i, "decode", self, d_limits, d_model) for i in range(topology.decode)
            ]
        else:
            self.front = [Replica(i, "colocated", self, limits, host=ht(i)) for i in range(topology.colocated)]
            self.back = []
        self.rng = random.Random(seed)
        self.join = [math.nan] * n
        self.drep = [-1] * n
        self.arr = [math.nan] * n
        self.first = [math.nan] * n
        self.gap_from = [math.nan] * n  # preempted requests: their last token before it (phase6.fleet.preempt)
        self.gap_n = [0] * n  # ... and the tokens after it
        self.preemptions = self.admissions = 0
        self.fin = [math.nan] * n
        self.admit = [math.nan] * n
        self.hits = [0] * n
        self.rep = [-1] * n
        self.rr = -1
        self.sticky: dict[int, Replica] = {}
        self.next_i = 0
        self.n_sys = 0
        self.n_waiting = 0
        self.area_sys = 0.0
        self.area_wait = 0.0
        self.t_sys = 0.0
        self.t_wait = 0.0
        self.done = 0

    def _check_fits(self) -> None:
        w = self.w
        if self.padded and len(w):
            ml = self.model.engine.max_model_len  # type: ignore[attr-defined]
            tot = w.input_tokens + w.output_tokens
            if int(tot.max()) > ml:
                i = int(tot.argmax())
                raise ValueError(
                    f"{w.source}: request {i} has {int(w.input_tokens[i])} + {int(w.output_tokens[i])} tokens, more "
                    f"than a torch-tp KV row holds (--max-model-len {ml}); drop it with workload.max_tokens"
                )
        need = -(-(w.input_tokens + w.output_tokens) // BLOCK_TOKENS)
        worst = int(need.max()) if len(need) else 0
        if worst > self.limits.kv_blocks:
            i = int(need.argmax())
            raise ValueError(
                f"{w.source}: request {i} needs {worst} KV blocks ({int(w.input_tokens[i])} + "
                f"{int(w.output_tokens[i])} tokens) but a replica holds {self.limits.kv_blocks}; "
                "drop long requests with workload.max_tokens or use a larger engine.tp"
            )

    # -- bookkeeping for Little's law ---------------------------------------------------------------------------------
    def wait_area_add(self, now: float) -> None:
        # called after n_waiting changed by -1 at admission: integrate the old value over the elapsed interval
        self.area_wait += (self.n_waiting + 1) * (now - self.t_wait)
        self.t_wait = now

    # -- arrivals ------------------------------------------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        w = self.w
        now = self.loop.now  # the request reaches the engine; it arrived self.delay earlier
        hid = w.hash_ids[i] if w.hash_ids is not None and not self.padded else ()  # torch-tp: no prefix cache
        r = _Req(i, now - self.delay, int(w.input_tokens[i]), int(w.output_tokens[i]), hid, int(w.session[i]))
        self.arr[i] = now - self.delay
        whole = not self.topology.is_pd and not (self.limits.incremental_kv and not self.padded)
        r.blocks = -(-(r.n_in + r.n_out) // BLOCK_TOKENS) if whole else -(-r.n_in // BLOCK_TOKENS)
        self.area_sys += self.n_sys * (now - self.t_sys) + self.delay  # + its time before reaching the engine
        self.t_sys = now
        self.n_sys += 1
        self.area_wait += self.n_waiting * (now - self.t_wait)
        self.t_wait = now
        rep, est = self._route(r)
        self.rep[i] = rep.rid
        rep.enqueue(r, est)
        if self.closed is None:
            self.next_i = i + 1
            if i + 1 < len(w):
                self.loop.call_in(float(w.arrival_s[i + 1]) + self.delay - now, self._arrive, i + 1)

    def _route(self, r: _Req) -> tuple[Replica, int]:
        pool = self.front
        name = self.router
        if name == "round_robin":
            self.rr = (self.rr + 1) % len(pool)
            return pool[self.rr], 0
        if name == "random":
            return pool[self.rng.randrange(len(pool))], 0
        if name == "least_loaded":
            return min(pool, key=_outstanding), 0
        if name == "session_affinity":
            rep = self.sticky.get(r.session)
            if rep is None:
                rep = self.sticky[r.session] = min(pool, key=_outstanding)
            return rep, 0
        # prefix_aware (Mooncake-style): minimise prompt tokens left to compute before this request's first token
        # on that replica = its queued prefill tokens + this prompt minus the prefix it already caches; ties go to
        # fewer outstanding requests, then the lower index. Only replicas caching the first block can have a hit:
        # the best of the rest is the best by (queued, outstanding) alone, so only those few are scored in full.
        best = min(pool, key=_load)
        best_key = (best.queued_prefill_tokens, best.outstanding, best.rid)
        best_hit = 0
        hid = r.hid
        if hid:
            h0, n_hit = hid[0], r.n_in - 1
            for rep in pool:
                ref = rep.cache.ref
                if h0 in ref:
                    hit = len(list(takewhile(ref.__contains__, hid))) * BLOCK_TOKENS
                    if hit > n_hit:
                        hit = n_hit
                    key = (rep.queued_prefill_tokens - hit, rep.outstanding, rep.rid)
                    if key < best_key:
                        best, best_key, best_hit = rep, key, hit
        return best, best_hit

    # -- PD hand-over --------------------------------------------------------------------------------------------------
    def to_decode(self, r: _Req) -> None:
        d = min(self.back, key=_outstanding)
        d.outstanding += 1
        d.reserve_q.append(r)
        d.try_reserve()

    def start_transfer(self, r: _Req, d: Replica) -> None:
        p = r.prefill_rep
        assert p is not None and self.kv_transfer_s is not None
        now = self.loop.now
        if r.resumed:  # swap-in of a request swapped out of d (decode_swap), priced as a KV transfer of its context
            self.loop.call_in(self.kv_transfer_s(r.n_in), _TransferDone(d, r), None)
            return
        start = max(now, p.link_free_s)
        p.link_free_s = start + self.kv_transfer_s(r.n_in)
        self.loop.call_in(p.link_free_s - now, _TransferDone(d, r), None)

    # -- completion ----------------------------------------------------------------------------------------------------
    def finish(self, r: _Req, now: float) -> None:
        i = r.i
        self.fin[i] = now
        self.admit[i] = r.admit_s
        self.hits[i] = r.hit
        self.area_sys += self.n_sys * (now - self.t_sys)
        self.t_sys = now
        self.n_sys -= 1
        self.done += 1
        if self.closed is not None and self.next_i < len(self.w):
            j = self.next_i
            self.next_i += 1
            self.loop.call_in(self.delay, self._arrive, j)

    def run(self) -> SimResult:
        t0 = timing.wall()
        w = self.w
        if len(w):
            if self.closed is None:
                self.loop.call_in(float(w.arrival_s[0]) + self.delay, self._arrive, 0)
            else:
                k = min(self.closed, len(w))
                self.next_i = k
                for j in range(k):
                    self.loop.call_in(self.delay, self._arrive, j)
        self.loop.run()
        wall = timing.wall() - t0
        assert self.done == len(w), f"simulation ended with {len(w) - self.done} requests unfinished"
        arrival = np.asarray(self.arr)
        first = np.asarray(self.first)
        fin = np.asarray(self.fin)
        events = self.loop.events
        roles = {"colocated": self.front} if not self.topology.is_pd else {"prefill": self.front, "decode": self.back}
        horizon = float(np.nanmax(fin)) if len(fin) else 0.0
        hosts = [r for r in self.front if r.cache.host is not None]
        little = {"horizon_s": horizon, "area_in_system": self.area_sys, "area_waiting": self.area_wait}
        return SimResult(
            arrival_s=arrival,
            first_token_s=first,
            finish_s=fin,
            admit_s=np.asarray(self.admit),
            input_tokens=w.input_tokens.copy(),
            output_tokens=w.output_tokens.copy(),
            hit_tokens=np.asarray(self.hits, dtype=np.int64),
            replica=np.asarray(self.rep, dtype=np.int64),
            num_gpus=len(self.front) * self.tp + len(self.back) * self.tp_decode,
            replicas={k: len(v) for k, v in roles.items()},
            busy_s={k: sum(r.busy_s for r in v) for k, v in roles.items()},
            events=events,
            wall_s=wall,
            little=little,
            evictions=sum(r.cache.evictions for r in self.front + self.back),
            prefill_shapes=frozenset().union(*(r.shapes for r in self.front + self.back)),
            logs={r.rid: r.log for r in self.front + self.back},
            decode_replica=np.asarray(self.drep, dtype=np.int64),
            join_s=np.asarray(self.join),
            preemptions=self.preemptions,
            gap_from_s=np.where(np.isnan(self.gap_from), first, self.gap_from),
            gap_tokens=np.where(np.asarray(self.gap_n) > 0, self.gap_n, w.output_tokens),
            host_hit_tokens=BLOCK_TOKENS
            * sum(h.hits for h in {id(r.cache.host): r.cache.host for r in hosts}.values()),
        )


class _TransferDone:
    """Callback object for a KV transfer's end (avoids a closure per request)."""

    __slots__ = ("d", "r")

    def __init__(self, d: Replica, r: _Req) -> None:
        self.d, self.r = d, r

    def __call__(self, _arg: Any) -> None:
        self.d.transfer_done(self.r)


def simulate(
    workload: Workload,
    model: StepTimeModel | TorchTPStepTime,
    limits: EngineLimits,
    topology: Topology,
    router: str,
    **kw: Any,
) -> SimResult:
    """Build and run one :class:`Simulation`."""
    return Simulation(workload, model, limits, topology, router, **kw).run()
