"""Serving latency: prefill (compute-bound) and decode (HBM-bandwidth-bound) step times of one TP(xPP) replica.

One engine step processes ``prefill_tokens`` new prompt tokens (``prefill_pairs`` causal query-key pairs) and one
token for each of ``decode_seqs`` running sequences whose contexts sum to ``decode_ctx`` tokens:

    compute   = (2·N_active·tokens + 4·L·H·Q·(prefill_pairs + decode_ctx)) / (tp · peak · prefill_mfu)
    memory    = (weights read + KV bytes/token/GPU · decode_ctx) / (HBM bw · decode_hbm_efficiency)
    allreduce = 2·L · all_reduce(tokens · hidden · 2 B over tp)       (Megatron TP: after attention and after MLP)
    step      = max(compute, memory) + allreduce + (pp-1) · p2p + step_overhead
                + prefill_overhead                                   (only when prefill_tokens > 0)

step_overhead / prefill_overhead (``EfficiencyConfig.step_overhead_ms`` / ``prefill_overhead_ms``, 0 by default)
are the fixed costs of an engine step that the roofline does not see (scheduling, sampling, launches; a prefill
step's extra host work): docs/cost_model.md §5 gives their source and how `phase6 fleet` fits them.

Weights read per GPU are (dense + experts touched) / tp; for MoE a batch of n tokens touches
E·(1 - (1 - k/E)^n) of the E experts per layer in expectation (uniform routing). KV heads replicate when
tp > kv_heads (vLLM), so KV bytes per GPU stop shrinking there. PP does not shorten a step: the stages run one
after the other for a given token. ``ServeCostModel`` has the ``step_s`` / ``decode_run_s`` interface of
``phase6.fleet.steptime.StepTimeModel``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from phase6.config import HardwareConfig
from phase6.config.plan import EfficiencyConfig
from phase6.plan import comm
from phase6.plan.memory import GIB, ServeMemory, kv_heads_per_gpu, serve_memory
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile, build_profile


def causal_pairs(done: int, chunk: int) -> float:
    """(query, key) pairs of causal attention for ``chunk`` new tokens after ``done`` cached ones."""
    return chunk * done + chunk * (chunk + 1) / 2


class ServeCostModel:
    """Step-time model of one serving replica (tp GPUs per stage, pp stages)."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareConfig | HardwareProfile,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        efficiency: EfficiencyConfig | None = None,
        weight_bytes: float = 2.0,
        kv_bytes: float = 2.0,
    ) -> None:
        if tp < 1 or pp < 1 or ep < 1:
            raise ValueError(f"serving layout needs tp, pp, ep >= 1, got tp={tp} pp={pp} ep={ep}")
        if model.num_heads % tp:
            raise ValueError(f"tp: {tp} does not divide {model.name}'s {model.num_heads} attention heads")
        if pp > model.num_layers:
            raise ValueError(f"pp: {pp} exceeds {model.name}'s {model.num_layers} layers")
        self.model, self.tp, self.pp, self.ep = model, tp, pp, ep
        self.profile = hardware if isinstance(hardware, HardwareProfile) else build_profile(hardware)
        self.eff = efficiency or EfficiencyConfig()
        self.weight_bytes, self.kv_bytes = weight_bytes, kv_bytes
        self.fabric = self.profile.fabric_for(tp)
        p = self.profile
        # FP8 weights (weight_bytes <= 1) run their GEMMs on FP8 tensor cores: scale by the FP8/bf16 peak ratio
        # (Hopper 1979/989 TF; 1 where the GPU has no FP8 units). Attention stays bf16, counted at the same rate.
        fp8 = weight_bytes <= 1.0 and p.hardware.peak_fp8_tflops > 0
        self.fp8_speedup = p.hardware.peak_fp8_tflops / p.hardware.peak_bf16_tflops if fp8 else 1.0
        self.flops_per_s = tp * p.peak_flops * self.eff.prefill_mfu
        self.bytes_per_s = tp * p.hbm_bytes_per_s * self.eff.decode_hbm_efficiency  # tp GPUs stream in parallel
        self.mm_flops_per_token = 2.0 * model.num_matmul_params() / self.fp8_speedup  # bf16-equivalent FLOPs
        self.attn_flops_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self.expert_bytes = model._mlp_params(model.expert_size) * weight_bytes if model.is_moe else 0.0
        self.always_bytes = (model.num_params() - model.num_expert_params()) * weight_bytes
        # all KV bytes the tp GPUs together read per context token (replicated KV heads counted on every GPU)
        self.kv_bytes_per_token = 2 * model.num_layers * kv_heads_per_gpu(model, tp) * tp * model.head_dim * kv_bytes
        self.overhead_s = self.eff.step_overhead_ms * 1e-3
        self.prefill_overhead_s = self.eff.prefill_overhead_ms * 1e-3
        self._allreduce: dict[int, float] = {}
        self._per_tokens: dict[int, tuple[float, float, float, float, float, float]] = {}
        self.p2p_s = (pp - 1) * comm.p2p_time(model.hidden_size * 2, self.profile.fabric_for(tp * pp))

    # -- pieces ------------------------------------------------------------------------------------------------------
    def weights_read_bytes(self, tokens: int) -> float:
        """Weight bytes one step streams from HBM (all tp GPUs together)."""
        if not self.model.is_moe or tokens <= 0:
            return self.always_bytes + (self.model.num_expert_params() * self.weight_bytes if tokens > 0 else 0.0)
        e, k = self.model.num_experts, self.model.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        return self.always_bytes + self.model.num_layers * touched * self.expert_bytes

    def allreduce_s(self, tokens: int) -> float:
        t = self._allreduce.get(tokens)
        if t is None:
            t = self._allreduce[tokens] = self._allreduce_uncached(tokens)
        return t

    def _allreduce_uncached(self, tokens: int) -> float:
        if self.tp <= 1 or tokens <= 0:
            return 0.0
        t, _ = comm.all_reduce_time(tokens * self.model.hidden_size * 2.0, self.tp, self.fabric)
        return 2 * self.model.num_layers * t

    def compute_s(self, tokens: int, pairs: float) -> float:
        return (self.mm_flops_per_token * tokens + self.attn_flops_per_pair * pairs) / self.flops_per_s

    def memory_s(self, tokens: int, decode_ctx: int) -> float:
        return (self.weights_read_bytes(tokens) + self.kv_bytes_per_token * decode_ctx) / self.bytes_per_s

    # -- the StepTimeModel interface ---------------------------------------------------------------------------------
    # The fleet simulator calls these millions of times: terms that depend only on the token count are cached per
    # count (the same floating-point expressions, so cached and uncached results are bit-identical).
    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        per = self._per_tokens.get(tokens) or self._tokens_terms(tokens)
        compute = (per[0] + self.attn_flops_per_pair * (prefill_pairs + decode_ctx)) / self.flops_per_s
        memory = (per[2] + self.kv_bytes_per_token * decode_ctx) / self.bytes_per_s
        step = max(compute, memory) + per[4] + self.p2p_s + self.overhead_s
        return step + self.prefill_overhead_s if prefill_tokens > 0 else step

    def forward_s(self, tokens: int, pairs: float, kv_read_tokens: int) -> float:
        """One forward pass without the fixed step / prefill overheads: max(compute, memory) + TP all-reduces +
        pipeline p2p, for ``tokens`` tokens through the matmuls, ``pairs`` attention (query, key) pairs and the KV of
        ``kv_read_tokens`` cached tokens read from HBM. ``step_s(p, pp, d, ctx)`` is ``forward_s(p + d, pp + ctx,
        ctx)`` plus the overheads; engines that run decode and prefill as separate forwards (phase6.fleet.engines)
        add several of these."""
        if tokens <= 0:
            return 0.0
        per = self._per_tokens.get(tokens) or self._tokens_terms(tokens)
        compute = (per[0] + self.attn_flops_per_pair * pairs) / self.flops_per_s
        memory = (per[2] + self.kv_bytes_per_token * kv_read_tokens) / self.bytes_per_s
        return max(compute, memory) + per[4] + self.p2p_s

    def _tokens_terms(self, tokens: int) -> tuple[float, float, float, float, float, float]:
        """(matmul FLOPs, attention s per context token, weight bytes read, KV s per context token, all-reduce s,
        fixed s = all-reduces + pipeline p2p + step overhead) of a step of ``tokens`` tokens."""
        ar = self.allreduce_s(tokens)
        per = (
            self.mm_flops_per_token * tokens,
            self.attn_flops_per_pair * tokens / self.flops_per_s,
            self.weights_read_bytes(tokens),
            self.kv_bytes_per_token * tokens / self.bytes_per_s,
            ar,
            ar + self.p2p_s + self.overhead_s,
        )
        self._per_tokens[tokens] = per
        return per

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        """Sum over j < num_steps of step_s(0, 0, decode_seqs, decode_ctx + j·decode_seqs), in closed form."""
        d, k = decode_seqs, num_steps
        if d <= 0 or k <= 0:
            return 0.0
        mm, c1, wbytes, m1, _, fixed1 = self._per_tokens.get(d) or self._tokens_terms(d)
        c0 = (mm + self.attn_flops_per_pair * decode_ctx) / self.flops_per_s
        m0 = (wbytes + self.kv_bytes_per_token * decode_ctx) / self.bytes_per_s
        fixed = k * fixed1
        # Both lines grow linearly in j; the max switches at most once, at j* where they cross.
        if c1 == m1:
            return k * max(c0, m0) + (c1 * k * (k - 1) / 2) + fixed
        cross = (m0 - c0) / (c1 - m1)
        switch = min(max(math.ceil(cross), 0), k)
        if c1 > m1:  # memory-bound first, compute-bound from the crossing on
            a0, b0, a1, b1 = m0, m1, c0, c1
        else:
            a0, b0, a1, b1 = c0, c1, m0, m1
        # sum of a + b·j over j in [0, switch) and [switch, k): n·a + b·n·(j0 + j1 - 1)/2 each
        first = switch * a0 + b0 * switch * (switch - 1) / 2 if switch > 0 else 0.0
        n = k - switch
        second = n * a1 + b1 * n * (switch + k - 1) / 2 if n > 0 else 0.0
        return first + second + fixed

    # -- conveniences ------------------------------------------------------------------------------------------------
    def prefill_s(self, prompt_len: int, batch: int = 1) -> float:
        """Time to prefill ``batch`` prompts of ``prompt_len`` tokens in one step (TTFT at an idle server)."""
        return self.step_s(batch * prompt_len, batch * causal_pairs(0, prompt_len), 0, 0)

    def decode_step_s(self, batch: int, context: int) -> float:
        """One decode step for ``batch`` sequences each holding ``context`` tokens (TPOT at that batch)."""
        return self.step_s(0, 0.0, batch, batch * context)

    def memory(self, context_len: int) -> ServeMemory:
        return serve_memory(
            self.model,
            self.tp,
            self.pp,
            context_len,
            self.profile.hardware.hbm_gib,
            self.eff.gpu_memory_utilization,
            self.eff.runtime_overhead_gib,
            self.weight_bytes,
            self.kv_bytes,
            self.ep,
            self.eff.max_num_batched_tokens,
        )


@dataclass
class ServeLatency:
    """Predicted serving numbers for (model, tp, batch, context) on one replica."""

    tp: int
    batch: int
    context: int
    prompt_len: int
    prefill_ms: float
    """Prefill of ``batch`` prompts of ``prompt_len`` tokens in one step (TTFT lower bound)."""
    decode_ms: float
    """One decode step = time per output token of every sequence in the batch (TPOT)."""
    decode_compute_ms: float
    decode_weights_ms: float
    decode_kv_ms: float
    decode_allreduce_ms: float
    bound: str
    """memory | compute: which roof the decode step sits under."""
    tokens_per_s: float
    """batch / decode step: output tokens per second of the replica."""
    weights_gib_per_gpu: float
    max_concurrent_seqs: int
    fits: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def serve_latency(
    model: ModelSpec,
    hardware: HardwareConfig | HardwareProfile,
    tp: int,
    batch: int,
    context: int,
    prompt_len: int | None = None,
    efficiency: EfficiencyConfig | None = None,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    pp: int = 1,
) -> ServeLatency:
    """Prefill and decode step times for ``batch`` sequences at ``context`` tokens on a TP=``tp`` replica."""
    if batch < 1 or context < 1:
        raise ValueError(f"serve_latency: batch and context must be >= 1, got {batch}, {context}")
    m = ServeCostModel(
        model, hardware, tp=tp, pp=pp, efficiency=efficiency, weight_bytes=weight_bytes, kv_bytes=kv_bytes
    )
    prompt = prompt_len or context
    decode = m.decode_step_s(batch, context)
    compute = m.compute_s(batch, batch * context)
    w = m.weights_read_bytes(batch) / m.bytes_per_s
    kv = m.kv_bytes_per_token * batch * context / m.bytes_per_s
    mem = m.memory(context)
    return ServeLatency(
        tp=tp,
        batch=batch,
        context=context,
        prompt_len=prompt,
        prefill_ms=1e3 * m.prefill_s(prompt, batch),
        decode_ms=1e3 * decode,
        decode_compute_ms=1e3 * compute,
        decode_weights_ms=1e3 * w,
        decode_kv_ms=1e3 * kv,
        decode_allreduce_ms=1e3 * m.allreduce_s(batch),
        bound="compute" if compute > w + kv else "memory",
        tokens_per_s=batch / decode,
        weights_gib_per_gpu=mem.weights_bytes / GIB,
        max_concurrent_seqs=mem.max_concurrent_seqs,
        fits=mem.fits,
    )
