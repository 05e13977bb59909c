"""A request's state inside the fleet simulator, and the engine limits a replica schedules under (moved out of
``phase6.fleet.sim``, which re-exports ``EngineLimits``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


# ---- requests and replicas -----------------------------------------------------------------------------------------
class _Req:
    __slots__ = (
        "i",
        "arrival",
        "n_in",
        "n_out",
        "hid",
        "session",
        "hit",
        "m",
        "done",
        "pending",
        "blocks",
        "private",
        "admit_s",
        "prefill_rep",
        "off",
        "join_step",
        "held",
        "bgen",
        "adm",
        "resumed",
        "last_tok",
    )

    def __init__(self, i: int, arrival: float, n_in: int, n_out: int, hid: tuple[int, ...], session: int) -> None:
        self.i, self.arrival, self.n_in, self.n_out, self.hid, self.session = i, arrival, n_in, n_out, hid, session
        self.hit = 0  # prompt tokens served from the prefix cache
        self.m = 0  # leading prompt blocks found in the prefix cache at admission
        self.done = 0  # prompt tokens with KV (cached + computed)
        self.pending = 0  # prompt tokens counted in the replica's queued_prefill_tokens
        self.blocks = 0
        self.private = 0
        self.admit_s = -1.0
        self.prefill_rep: Any = None  # the prefill Replica (PD)
        self.off = 0  # torch-tp: context at a decode step = (replica steps before it) + off
        self.join_step = self.held = self.bgen = self.adm = 0  # incremental KV (phase6.fleet.preempt)
        self.resumed = False  # preempted once: recomputes prompt + generated tokens
        self.last_tok = math.nan


@dataclass
class EngineLimits:
    """What the simulator needs of a serving engine besides step times."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    """KV capacity per replica, 512-token blocks."""
    chunked_prefill: bool = True
    """False: vLLM V0's default scheduler -- whole prompts in prefill-only steps that run before (and pause) every
    decode (``phase6.fleet.interference``); True: vLLM V1 chunked prefill, decodes first in every step."""
    incremental_kv: bool = False
    """True: colocated replicas allocate KV as tokens are written and preempt by recompute when it runs out
    (``phase6.fleet.preempt``, vLLM); False: the whole output is reserved at admission."""
    decode_swap: bool = False
    """PD decode replicas: False (default) reserve KV for the whole output when a request's transfer starts; True
    allocate it as tokens are written, in ``block_tokens`` blocks, and when none is free swap the most recently
    joined request out to host memory (DistServe's decoding scheduler: ``phase6.fleet.preempt``)."""
    block_tokens: int = 512
    """KV block size of a PD decode replica's accounting (``kv_blocks`` counts blocks of this size there);
    colocated and prefill replicas use 512-token blocks, the prefix-hash granularity."""
