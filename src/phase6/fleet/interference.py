"""Step cost of a mixed batch (chunked prefill + decodes) with the interference a real engine has.

The planner's ``ServeCostModel.step_s`` prices a step as ``max(compute, memory)`` of the whole batch, as if the
decode rows' KV reads hid under the prefill chunk's matmuls. With ``engine.mixed_step=serial`` an engine runs a step
as a sequence of kernels: the
linear layers (one GEMM per layer over all the step's tokens: decode rows ride along for almost nothing, Sarathi-Serve,
OSDI'24 §3), then attention, which for the prefill chunk is compute-bound and for the decode rows is a read of their
whole KV cache, memory-bound, in kernels that do not overlap the GEMMs. So here

    linear    = max(2 N_active (p + d) / (tp peak mfu),  weight bytes / (tp HBM eff))
    attention = 4 L H Q prefill_pairs / (tp peak mfu)  +  KV bytes/token x decode_ctx / (tp HBM eff)
    step      = linear + attention + TP all-reduces + pipeline p2p + step_overhead (+ prefill_overhead)

A pure decode step and a pure prefill step cost exactly what the planner says (there the two agree to < 1 %: one
attention term is 0 and the other rides with the term that bound the max); only mixed steps get dearer: on the issue's example (A100 TP8, an
8,192-token chunk + 100 decodes at 12k context) by the decode rows' KV read, ~40 ms. The larger interference is not
in the step's cost but in who waits for it: every decode row's next token waits for the whole step, which is what
the per-token gaps (``phase6.fleet.tokens``) report and the TBT SLO scores.

``engine.mixed_step=overlap`` (the default) keeps the planner's max: measured on vLLM 0.26 (H200, Qwen2.5-14B), whose
mixed batch runs its attention as one FlashAttention varlen kernel, isolated mixed steps at 64 decode rows match the
max to 0.0 % and sit 2.2 ms (5 standard errors) under the serial sum (docs/fleet.md "Mixed steps on vLLM",
``scripts/repro/fleet_vllm_steps.py``). ``serial`` is for engines that run the decode rows' attention as kernels of their
own.

Per-sequence decode cost (``engine.decode_seq_ms``, issue 23): every step also costs ``decode_seq_ms`` per decode row
it carries, a term the roofline lacks (it sees a decode row only as one more GEMM row, nearly free while the weights
dominate, and as its KV read); its default is per engine profile (``phase6.config.fleet.PROFILE_DEFAULTS``). On
vLLM 0.26 it is small: 0.0066 ms per row (decode-only steps at 1 / 16 / 64 rows, -0.10 / +0.03 / +0.33 ms off the
roofline). Measured on phase6's torch-tp engine (H200, docs/benchmarks.md "C=64 diagnosis"):
decode-only steps run 1.5-4.3 ms longer than the roofline at 16-64 rows, in proportion to the rows the CUDA graph
computes, while the KV-length bucket (1024 vs 1536 tokens at 64 rows) moves the step by <= 0.5 ms, less than the
roofline's own KV term: the missing cost is per row, not per KV byte (least squares over the six loaded cells:
0.059 ms per row). Engines of the vLLM 0.2 era paid far more per sequence (Python scheduling, block tables and
sampling per sequence): Splitwise's measured profile (Mutinifni/splitwise-sim ``data/perf_model.csv``, Llama2-70B
TP8, prompt 512) grows 0.32 ms (A100) / 0.28 ms (H100) per sequence from batch 1 to 32 with KV reads that the
roofline prices at < 0.02 ms per sequence.
"""

from __future__ import annotations

from typing import Any

from phase6.plan.serve import ServeCostModel


class EngineStepTime(ServeCostModel):
    """``ServeCostModel`` plus what an engine adds to its roofline: ``seq_s`` seconds per decode row of a step
    (``engine.decode_seq_ms``), and, with ``serial``, mixed steps priced as serial kernel classes (module
    docstring). With ``serial=False`` and ``seq_s=0`` it is exactly the planner's model; a step without decode rows or
    without prefill tokens costs the planner's plus the rows' term."""

    def __init__(self, *args: Any, serial: bool = True, seq_s: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if seq_s < 0:
            raise ValueError(f"engine.decode_seq_ms: must be >= 0, got {seq_s * 1e3}")
        self.serial, self.seq_s = serial, seq_s

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        rows = decode_seqs * self.seq_s
        if not self.serial or prefill_tokens <= 0 or decode_seqs <= 0:
            return super().step_s(prefill_tokens, prefill_pairs, decode_seqs, decode_ctx) + rows
        tokens = prefill_tokens + decode_seqs
        per = self._per_tokens.get(tokens) or self._tokens_terms(tokens)
        linear = max(per[0] / self.flops_per_s, per[2] / self.bytes_per_s)
        attn = self.attn_flops_per_pair * prefill_pairs / self.flops_per_s
        attn += (
            max(self.kv_bytes_per_token / self.bytes_per_s, self.attn_flops_per_pair / self.flops_per_s) * decode_ctx
        )
        return linear + attn + per[5] + self.prefill_overhead_s + rows

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        t = super().decode_run_s(decode_seqs, decode_ctx, num_steps)
        return t + num_steps * decode_seqs * self.seq_s if decode_seqs > 0 and num_steps > 0 else t


SerialKernelStepTime = EngineStepTime
"""The earlier name (serial mixed steps, no per-row term by default)."""
