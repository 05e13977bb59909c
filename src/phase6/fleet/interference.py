"""Step cost of a mixed batch (chunked prefill + decodes) with the interference a real engine has.

The planner's ``ServeCostModel.step_s`` prices a step as ``max(compute, memory)`` of the whole batch, as if the
decode rows' KV reads hid under the prefill chunk's matmuls. An engine runs a step as a sequence of kernels: the
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

``engine.mixed_step=overlap`` keeps the planner's max (the earlier behaviour).
"""

from __future__ import annotations

from phase6.plan.serve import ServeCostModel


class SerialKernelStepTime(ServeCostModel):
    """``ServeCostModel`` with mixed steps priced as serial kernel classes (module docstring); a step without decode
    rows or without prefill tokens, and every decode-only run, costs exactly the planner's."""

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        if prefill_tokens <= 0 or decode_seqs <= 0:
            return super().step_s(prefill_tokens, prefill_pairs, decode_seqs, decode_ctx)
        tokens = prefill_tokens + decode_seqs
        per = self._per_tokens.get(tokens) or self._tokens_terms(tokens)
        linear = max(per[0] / self.flops_per_s, per[2] / self.bytes_per_s)
        attn = self.attn_flops_per_pair * prefill_pairs / self.flops_per_s
        attn += (
            max(self.kv_bytes_per_token / self.bytes_per_s, self.attn_flops_per_pair / self.flops_per_s) * decode_ctx
        )
        return linear + attn + per[5] + self.prefill_overhead_s
