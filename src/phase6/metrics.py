"""Metric key names (fixed strings, one place) and the FLOPs/MFU formulas every report states.

Keys follow torchtitan's convention: ``<area>/<name>_<unit>``; loss keys are bare.
"""

from __future__ import annotations

# training
LOSS = "loss"
VAL_LOSS = "val/loss"
LR = "lr"
GRAD_NORM = "grad_norm"
STEP_TIME_S = "perf/step_time_s"
TOKENS_PER_S = "perf/tokens_per_s"
MFU_PCT = "perf/mfu_pct"
MEM_MAX_ALLOCATED_GIB = "mem/max_allocated_gib"
MEM_MAX_RESERVED_GIB = "mem/max_reserved_gib"
TOKENS_SEEN = "data/tokens_seen"
# serving
SERVE_TTFT_MS_P50 = "serve/ttft_ms_p50"
SERVE_TTFT_MS_P99 = "serve/ttft_ms_p99"
SERVE_ITL_MS_P50 = "serve/itl_ms_p50"
SERVE_ITL_MS_P99 = "serve/itl_ms_p99"
SERVE_TPOT_MS_P50 = "serve/tpot_ms_p50"
SERVE_TPOT_MS_P99 = "serve/tpot_ms_p99"
SERVE_THROUGHPUT_TOK_S = "serve/throughput_tok_s"
SERVE_GOODPUT_REQ_S = "serve/goodput_req_s"
# cost
COST_USD = "cost/usd"
COST_GPU_HOURS = "cost/gpu_hours"
# post-training
REWARD_MEAN = "reward/mean"
KL = "kl"

FLOPS_FORMULA = "6N + 12*L*H*Q*T (PaLM appendix B; nanoGPT estimate_mfu, torchtitan)"


def flops_per_token(num_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token = 6N + 12·L·H·Q·T (forward+backward; attention counted without causal sparsity).

    N excludes the position embedding (nanoGPT's get_num_params); the tied token embedding counts once.
    """
    return 6.0 * num_params + 12.0 * n_layer * n_head * head_dim * seq_len


def mfu_pct(tokens_per_s: float, flops_per_tok: float, peak_tflops: float, num_gpus: int = 1) -> float:
    """Model FLOPs utilisation in percent of the dense bf16 peak of ``num_gpus`` accelerators."""
    return 100.0 * tokens_per_s * flops_per_tok / (peak_tflops * 1e12 * num_gpus)
