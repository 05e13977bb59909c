"""Temperature sampling + the sampled token's log-prob in one pass over the (B, V) logits (Triton; issue 31).

Why: the decode loop's torch sampling (``hf_loop.sample_tokens``) makes ~12 passes over a float32 copy of the
logits per token step (cast, divide by T, exponential noise, its log, subtract, argmax; then the log-prob's own
cast, divide and logsumexp): at 512 rows x 151,936 vocab ~5.9 GB of HBM traffic, ~1.4 ms of the ~11.4 ms step at
4.24 TB/s, ~0.7 s of a 511-token rollout. This kernel reads the bf16 logits once (0.16 GB, ~0.04 ms): one program
per row keeps an online logsumexp of logits / T and the running argmax of logits / T + Gumbel noise.

Same distribution, same log-prob: Gumbel-max (argmax of s + G, G = -log(-log U)) is an exact sample of softmax(s),
as the torch path's argmax(s - log E) with E ~ Exp(1) (E = -log U); the log-prob is logits[tok] / T -
logsumexp(logits / T) in float32, TRL's convention, as ``sample_tokens``. The random stream differs (Triton's
Philox keyed by a per-call seed drawn from torch's generator, + step and row), so individual tokens differ from the
torch path for the same seed; the distribution does not (tests/test_fused_sample.py: chi-square on CPU under
``TRITON_INTERPRET=1``, log-probs within 1e-5). Only plain temperature sampling (no top-k / top-p / min-new-tokens,
not greedy) takes this path; anything else stays on ``sample_tokens``.

Captured in the loop's CUDA graphs: the seed and the step are read from device tensors, so a replay draws new noise.
"""

from __future__ import annotations

import torch

from phase6.rollout import SamplingParams

try:  # Triton ships with CUDA torch; on CPU it runs only under TRITON_INTERPRET=1 (tests)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def available(device: torch.device) -> bool:
    """Whether the fused kernel can run on ``device`` (CUDA with Triton, or the Triton interpreter on CPU)."""
    if triton is None:
        return False
    # on CPU only a kernel built by the interpreter runs (TRITON_INTERPRET=1 when this module was imported)
    return device.type == "cuda" or type(_sample_kernel).__name__ == "InterpretedFunction"


def applies(params: SamplingParams) -> bool:
    """Plain temperature sampling: what the kernel implements (anything else goes through ``sample_tokens``)."""
    return not params.greedy and params.top_k == 0 and params.top_p >= 1.0 and params.min_new_tokens == 0


if triton is not None:

    @triton.jit
    def _sample_kernel(
        logits_ptr,
        stride_row,
        inv_t,
        seed_ptr,
        step_ptr,
        tokens_ptr,
        logprobs_ptr,
        n_rows,
        VOCAB: tl.constexpr,
        WANT_LOGPROBS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * stride_row
        # one Philox key per (call, step, row): independent streams; the counter is the vocabulary index
        key = tl.load(seed_ptr) + tl.load(step_ptr) * n_rows + row
        run_max = tl.full((), -1e30, tl.float32)  # finite start: exp(-1e30 - m) = 0 without a NaN from -inf - -inf
        run_sum = tl.full((), 0.0, tl.float32)
        best_val = tl.full((), float("-inf"), tl.float32)
        best_idx = tl.full((), 0, tl.int32)
        for start in range(0, VOCAB, BLOCK):  # VOCAB constexpr: one compile per model
            offs = start + tl.arange(0, BLOCK)
            inside = offs < VOCAB
            x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32) * inv_t
            new_max = tl.maximum(run_max, tl.max(x, 0))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
            run_max = new_max
            # guard: a draw of exactly 1.0 (float32 rounding of the largest uint -> float conversions) would make
            # -log(u) = 0 and the Gumbel +inf, a forced pick; capped at the largest float32 < 1 (Gumbel <= 16.6: a tail
            # of mass ~6e-8 per element clipped, not inflated). u = 0 gives -inf: that element is just never drawn.
            u = tl.minimum(tl.rand(key, offs), 0.99999994)
            z = tl.where(inside, x - tl.log(-tl.log(u)), float("-inf"))
            block_best = tl.max(z, 0)
            block_idx = start + tl.argmax(z, 0).to(tl.int32)
            take = block_best > best_val
            best_idx = tl.where(take, block_idx, best_idx)
            best_val = tl.where(take, block_best, best_val)
        tl.store(tokens_ptr + row, best_idx.to(tl.int64))
        if WANT_LOGPROBS:
            chosen = tl.load(base + best_idx).to(tl.float32) * inv_t
            tl.store(logprobs_ptr + row, chosen - (run_max + tl.log(run_sum)))


def fused_sample(
    logits: torch.Tensor,
    temperature: float,
    seed: torch.Tensor,
    step: torch.Tensor,
    want_logprobs: bool = True,
    block: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token per row (B,) long and its log-prob (B,) float32 from (B, V) logits; ``seed`` and ``step`` are (1,)
    long device tensors (read inside the kernel, so a CUDA graph replay with a new ``step`` draws new noise)."""
    if triton is None:
        raise RuntimeError("fused_sample needs Triton")
    if temperature <= 0:
        raise ValueError(f"fused_sample needs temperature > 0, got {temperature}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _sample_kernel[(rows,)](
        logits,
        logits.stride(0),
        1.0 / temperature,
        seed,
        step,
        tokens,
        logprobs,
        rows,
        VOCAB=vocab,
        WANT_LOGPROBS=want_logprobs,
        BLOCK=block,
        num_warps=8,
    )
    return tokens, (logprobs if want_logprobs else None)
