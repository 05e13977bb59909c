"""How long one continuous-batching step of a replica takes: the simulator's only notion of the hardware.

A step processes ``prefill_tokens`` new prompt tokens (chunked prefill, ``prefill_pairs`` query-key pairs of causal
attention) and one token for each of ``decode_seqs`` running sequences whose contexts sum to ``decode_ctx`` tokens.

Two sources:
- :class:`RooflineStepTime`: max(compute, memory) + tensor-parallel all-reduces + a fixed per-step overhead, from
  the planner's model shapes (``phase6.plan.model.ModelSpec``) and the hardware config. Formulas below.
- :class:`TableStepTime`: measured by ``phase6 serve-bench`` (TTFT at concurrency 1 -> prefill ms per prompt token;
  TPOT at each concurrency C -> decode step ms at batch C, linear in between).

``decode_run_s`` returns the time of ``k`` consecutive pure-decode steps in closed form: the simulator advances a
replica from one batch change to the next in one event instead of one event per token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

from phase6.config import HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.workload import BLOCK_TOKENS
from phase6.plan.model import ModelSpec


class StepTimeModel(Protocol):
    """Time of one engine step, and of ``k`` back-to-back decode-only steps, in seconds."""

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float: ...

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        """Sum over j < num_steps of step_s(0, 0, decode_seqs, decode_ctx + j * decode_seqs)."""
        ...


def prefill_pairs(done: int, chunk: int) -> float:
    """Causal attention (query, key) pairs of a prefill chunk of ``chunk`` tokens after ``done`` computed ones."""
    return chunk * done + chunk * (chunk + 1) / 2


def _arith(a: float, b: float, j0: int, j1: int) -> float:
    """Sum_{j=j0}^{j1-1} (a + b j)."""
    n = j1 - j0
    return n * a + b * n * (j0 + j1 - 1) / 2 if n > 0 else 0.0


class RooflineStepTime:
    """Roofline step time of a TP replica.

    compute  = (2·N_matmul·(prefill_tokens + decode_seqs) + 4·L·H·Q·(prefill_pairs + decode_ctx)) / (tp·peak·mfu)
    memory   = (weight_bytes + kv_bytes_per_token · decode_ctx) / (tp·hbm_bw·mbu)
    allreduce= 2·L·(latency + 2(tp-1)/tp · tokens·hidden·2 B / nvlink_bw)      (tp > 1; two per block, Megatron TP)
    step     = max(compute, memory) + allreduce + overhead

    Forward FLOPs 2N + 4·L·H·Q·context per token are the planner's ``forward_flops_per_token``; all weights are read
    once per step (for MoE this over-counts at small batch). Prefill KV reads and KV writes are left out (prefill
    is compute-bound). Exact single-request numbers: TTFT = step_s(L, pairs(0, L), 0, 0) when L fits the token
    budget; decode step g (g = 1..O-1) = step_s(0, 0, 1, L + g).
    """

    def __init__(self, spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig) -> None:
        tp = engine.tp
        if tp > hardware.gpus_per_node:
            raise ValueError(f"engine.tp: {tp} exceeds hardware.gpus_per_node {hardware.gpus_per_node} "
                             "(a replica is one node here)")
        if spec.num_heads % tp:
            raise ValueError(f"engine.tp: {tp} does not divide {spec.name}'s {spec.num_heads} attention heads")
        self.spec, self.hardware, self.engine = spec, hardware, engine
        self.mm_flops_per_token = 2.0 * spec.num_matmul_params()
        self.attn_flops_per_pair = 4.0 * spec.num_layers * spec.num_heads * spec.head_dim
        self.flops_per_s = tp * hardware.peak_bf16_tflops * 1e12 * engine.mfu
        self.bytes_per_s = tp * hardware.hbm_tbps * 1e12 * engine.mbu
        self.weight_bytes = spec.num_params() * engine.bytes_per_param
        self.kv_bytes_per_token = spec.kv_cache_bytes_per_token(engine.kv_bytes_per_elem)
        if tp > 1:
            self.ar_fixed_s = 2 * spec.num_layers * hardware.intranode_latency_us * 1e-6
            self.ar_per_token_s = (2 * spec.num_layers * 2 * (tp - 1) / tp * spec.hidden_size * 2.0
                                   / (hardware.nvlink_gbps * 1e9))
        else:
            self.ar_fixed_s = self.ar_per_token_s = 0.0
        self.overhead_s = engine.step_overhead_ms * 1e-3

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        tokens = prefill_tokens + decode_seqs
        compute = (self.mm_flops_per_token * tokens + self.attn_flops_per_pair * (prefill_pairs + decode_ctx)) \
            / self.flops_per_s
        memory = (self.weight_bytes + self.kv_bytes_per_token * decode_ctx) / self.bytes_per_s
        return max(compute, memory) + self.ar_fixed_s + self.ar_per_token_s * tokens + self.overhead_s

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        d, s, k = decode_seqs, decode_ctx, num_steps
        # step j: compute c0 + c1 j, memory m0 + m1 j (context grows by d per step); the max switches at most once.
        c0 = (self.mm_flops_per_token * d + self.attn_flops_per_pair * s) / self.flops_per_s
        c1 = self.attn_flops_per_pair * d / self.flops_per_s
        m0 = (self.weight_bytes + self.kv_bytes_per_token * s) / self.bytes_per_s
        m1 = self.kv_bytes_per_token * d / self.bytes_per_s
        const = k * (self.ar_fixed_s + self.ar_per_token_s * d + self.overhead_s)
        if c1 == m1:
            split = 0 if c0 >= m0 else k  # compute-bound on [0, split)
        else:
            cross = (m0 - c0) / (c1 - m1)  # compute >= memory for j >= cross if c1 > m1, else for j <= cross
            if c1 > m1:
                first = min(max(math.ceil(cross), 0), k)
                return _arith(m0, m1, 0, first) + _arith(c0, c1, first, k) + const
            split = min(max(math.floor(cross) + 1, 0), k)
        return _arith(c0, c1, 0, split) + _arith(m0, m1, split, k) + const


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted points; flat below the first, last segment's slope above the last."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


class TableStepTime:
    """Step times from serve-bench measurements.

    step = prefill_tokens · prefill_s_per_token + decode_step_s(decode_seqs), where decode_step_s is linear between
    measured (batch, TPOT) points. Context length is not a variable: the table holds at the measured prompt mix.
    """

    def __init__(self, prefill_s_per_token: float, decode_points: list[tuple[float, float]], source: str = "") -> None:
        if not prefill_s_per_token > 0:
            raise ValueError(f"{source}: prefill seconds per token must be > 0, got {prefill_s_per_token}")
        if not decode_points or any(b < 1 or t <= 0 for b, t in decode_points):
            raise ValueError(f"{source}: decode points need batch >= 1 and step time > 0, got {decode_points}")
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_points = sorted(decode_points)
        self.source = source

    def decode_step_s(self, decode_seqs: int) -> float:
        return _interp(self.decode_points, decode_seqs) if decode_seqs > 0 else 0.0

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        return prefill_tokens * self.prefill_s_per_token + self.decode_step_s(decode_seqs)

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        return num_steps * self.decode_step_s(decode_seqs)

    @classmethod
    def from_serve_bench(cls, path: str | Path, input_tokens: int) -> TableStepTime:
        """Read a serve-bench results.json: the lowest-concurrency row's TTFT p50 / ``input_tokens`` gives prefill
        seconds per token; each row's (concurrency, TPOT p50) is a decode point."""
        rows = read_serve_bench_rows(path)
        first = min(rows, key=lambda r: r["concurrency"])
        pts = [(float(r["concurrency"]), float(r["tpot_p50_ms"]) / 1e3) for r in rows]
        # Keep one point per concurrency (repeats / rates at equal C are averaged).
        by_c: dict[float, list[float]] = {}
        for c, t in pts:
            by_c.setdefault(c, []).append(t)
        points = [(c, sum(ts) / len(ts)) for c, ts in sorted(by_c.items())]
        return cls(float(first["ttft_p50_ms"]) / 1e3 / input_tokens, points, source=str(path))


SERVE_BENCH_KEYS = ("concurrency", "ttft_p50_ms", "tpot_p50_ms")


def read_serve_bench_rows(path: str | Path) -> list[dict]:
    """The closed-loop rows of a serve-bench results.json that carry concurrency, TTFT p50 and TPOT p50."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: serve-bench results.json not found")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{p}: expected a phase6 results.json with a non-empty 'rows' list")
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in SERVE_BENCH_KEYS if not isinstance(r.get(k), (int, float))]
        if missing:
            raise ValueError(f"{p}: rows[{i}] lacks numeric {', '.join(missing)}")
        out.append(r)
    return out


def kv_capacity_blocks(spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig) -> int:
    """512-token KV blocks one replica holds: tp · HBM · gpu_memory_utilization minus the weights."""
    if engine.kv_blocks is not None:
        return engine.kv_blocks
    usable = engine.tp * hardware.hbm_gib * 2**30 * engine.gpu_memory_utilization
    weights = spec.num_params() * engine.bytes_per_param
    per_block = spec.kv_cache_bytes_per_token(engine.kv_bytes_per_elem) * BLOCK_TOKENS
    blocks = int((usable - weights) // per_block)
    if blocks < 1:
        raise ValueError(f"engine.tp: {spec.name} weights ({weights / 2**30:.1f} GiB) leave no KV memory in "
                         f"{engine.tp} x {hardware.hbm_gib} GiB x {engine.gpu_memory_utilization} ({hardware.name}); "
                         "raise engine.tp")
    return blocks


def kv_transfer_s(spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig, link: str, tokens: int) -> float:
    """Time to move a prompt's KV from a prefill to a decode replica: latency + bytes / (tp · per-GPU link bw).

    Each of the tp GPUs sends its own KV shard over its own NIC / NVLink port, so bandwidth scales with tp.
    """
    gbps = hardware.internode_gbps if link == "internode" else hardware.nvlink_gbps
    lat_us = hardware.internode_latency_us if link == "internode" else hardware.intranode_latency_us
    nbytes = spec.kv_cache_bytes_per_token(engine.kv_bytes_per_elem) * tokens
    return lat_us * 1e-6 + nbytes / (engine.tp * gbps * 1e9)
