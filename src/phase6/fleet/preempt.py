"""KV blocks allocated as tokens are written, and preemption by recompute when they run out (vLLM's behaviour).

With ``engine.kv_alloc=incremental`` (the default of the vllm profile, colocated replicas) a request is admitted
with the blocks of its prompt only; each decode step writes one token of KV per running request, and a request whose
next token starts a new 512-token block takes one more block at the start of that step. When none is free (after
evicting unused prefix-cache blocks) the scheduler preempts the most recently admitted running request: its blocks
are freed (its committed prompt blocks stay in the prefix cache, unpinned), it goes back to the front of the
waiting queue, and when readmitted it recomputes its prompt *and* the tokens it had generated (one prefill of
prompt + generated tokens, prefix-cache hits on its prompt blocks still count), whose last step emits its next
token. That is vLLM's default (V1 recompute: ``Scheduler.schedule`` pops ``self.running`` when ``allocate_slots``
fails and resets the request to ``num_computed_tokens = 0``; V0 recomputes single-sequence groups by default), so
memory pressure costs the colocated engine TTFT of new requests and stalls of preempted ones. With
``engine.kv_alloc=reserve`` a request reserves KV for its whole output at admission and is never preempted (the
earlier model: optimistic about tails, pessimistic about admission).

Per replica a heap holds (replica step at which a request needs its next block, request index, request); decode
runs are cut at its top, so block growth happens at step boundaries in both the closed-form runs and the
one-event-per-token reference mode (identical results). PD decode replicas keep reserving (DistServe and Mooncake
size their decode pools to the load); the torch-tp profile has static rows (no growth).

Token gaps of a preempted request (``phase6.fleet.tokens``) are taken from its last decode segment: the first gap
runs from its last token before the preemption to the end of its first decode step after the recompute (the stall),
its earlier gaps are not in the statistics; TPOT (per-request mean) is exact.
"""

from __future__ import annotations

import heapq
from typing import Any

from phase6.serving.traces import BLOCK_TOKENS


def track(rep: Any, r: Any) -> None:
    """``r`` joined ``rep``'s decode batch at replica step ``rep.steps``, holding the blocks of its prompt: schedule
    its first block growth, if its answer reaches a new block before it finishes."""
    r.join_step = rep.steps
    r.held = -(-r.n_in // rep.block_tokens)
    _push(rep, r)


def _push(rep: Any, r: Any) -> None:
    # step j after joining writes position n_in + j, so it needs ceil((n_in + j + 1) / 512) blocks
    at = r.join_step + rep.block_tokens * r.held - r.n_in
    if at < r.join_step + r.n_out - 1:  # the last decode step is join_step + n_out - 2
        heapq.heappush(rep.bheap, (at, r.i, r.bgen, r))


def next_growth(rep: Any) -> int | None:
    """Replica step of the next block growth (stale entries dropped), or None."""
    h = rep.bheap
    while h and h[0][2] != h[0][3].bgen:
        heapq.heappop(h)
    return h[0][0] if h else None


def grow(rep: Any, now: float) -> int:
    """Start of a step: give every request whose next token starts a new block that block, preempting the most
    recently admitted running requests while none is free; returns how many were preempted (a step that preempted
    admits no waiting request: vLLM V1 schedules the waiting queue only when it preempted nothing)."""
    h, cache = rep.bheap, rep.cache
    n = 0
    while h and h[0][0] <= rep.steps:
        at, _, gen, r = heapq.heappop(h)
        if gen != r.bgen:
            continue
        while not cache.acquire((), 0, 1):
            victim = max(rep.running(), key=_admitted)
            preempt(rep, victim, now)
            n += 1
            if victim is r:
                break
        else:
            r.held += 1
            r.private += 1
            _push(rep, r)
    return n


def _admitted(r: Any) -> int:
    return r.adm


def preempt(rep: Any, r: Any, now: float) -> None:
    """Free ``r``'s KV and requeue it at the front of ``rep``'s waiting queue to recompute prompt + generated."""
    sim = rep.sim
    r.bgen += 1
    sim.preemptions += 1
    if rep.role == "decode":
        swap_out(rep, r, now)
        return
    if r.done < r.n_in:  # still prefilling: its prompt blocks past the cached prefix are private, uncommitted
        rep.prefilling.remove(r)
        rep.cache.release(r.hid[: r.m], r.private)
        rep.queued_prefill_tokens -= r.pending
    else:
        rep.dheap.remove(next(e for e in rep.dheap if e[2] is r))
        heapq.heapify(rep.dheap)
        done = rep.steps - r.join_step  # decode steps it took part in
        rep.n_dec -= 1
        rep.ctx_sum -= r.n_in + 1 + done
        rep.cache.release(r.hid, r.private - (len(r.hid) - r.m))
        g = done + 1  # tokens it has (the prefill's first token + one per decode step)
        r.last_tok = now if done else sim.first[r.i]
        r.n_in += g
        r.n_out -= g
        r.resumed = True  # (a request preempted before its first token just starts over)
    r.blocks = -(-r.n_in // BLOCK_TOKENS)
    r.pending = r.n_in
    rep.queued_prefill_tokens += r.n_in
    sim.area_wait += sim.n_waiting * (now - sim.t_wait)
    sim.t_wait = now
    sim.n_waiting += 1
    rep.waiting.appendleft(r)


def swap_out(rep: Any, r: Any, now: float) -> None:
    """PD decode replica with ``decode_swap`` (DistServe ``DecodingStageFCFSScheduler``: when the batches' KV
    exceeds the GPU's blocks it swaps the last request of the batch out to CPU memory, and swapped requests are
    readmitted first): free ``r``'s blocks and put it at the front of the replica's queue for KV room; when it gets
    room its KV comes back (priced as a KV transfer of its context) and it decodes on from where it stopped."""
    sim = rep.sim
    rep.dheap.remove(next(e for e in rep.dheap if e[2] is r))
    heapq.heapify(rep.dheap)
    done = rep.steps - r.join_step  # decode steps it took part in here
    rep.n_dec -= 1
    rep.ctx_sum -= r.n_in + 1 + done
    rep.cache.release((), r.private)
    rep.reserved -= 1
    if done:  # its last token came at the end of the previous step
        r.last_tok = now
    elif not r.resumed:  # swapped before its first decode step: its last token is the prefill's
        r.last_tok = sim.first[r.i]
    # it holds KV for n_in + done tokens and needs n_out - 1 - done more decode steps: rejoin as a request with that
    # context whose first token is already out (join adds 1 to the context, its last step is n_out - 1 steps later)
    r.n_in += done
    r.n_out -= done
    r.resumed = True
    rep.reserve_q.appendleft(r)
