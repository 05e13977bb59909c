"""Fused lm_head + cross-entropy (`model.fused_ce=liger`): Liger-Kernel's LigerFusedLinearCrossEntropyLoss.

What it changes: the (B, T, V) logits are never materialised. Liger walks the B*T rows in chunks, computes a chunk's
logits, turns them into d(loss)/d(logits) in place with a Triton kernel, and folds them into grad_input / grad_weight
right away (Hsu et al. 2024, arXiv 2410.10989). At GPT-2 124M, B=64, T=1024 that frees the 6.6 GB bf16 logits and
their gradient. It is a memory lever. Its HBM traffic is no lower than the compiled logits + cross-entropy path.

Same loss as GPT's sliced path: wte / lm_head have padded_vocab_size rows (50304), and only the first vocab_size
(50257) logits are scored. Liger takes the full padded weight, which keeps the tensor-core-friendly 50304-wide
GEMMs. A bias of 0 on real rows and -inf on padding rows removes the padding from the softmax: exp(-inf) = 0 in
the forward and a zero gradient for those rows. Slicing the weight to 50257 rows instead would give odd leading
dimensions to all three lm_head GEMMs.

Precision: the chunk matmuls follow autocast (bf16 logits, as on the sliced path), the softmax runs in fp32 inside
the kernel, and grad_weight accumulates over chunks in fp32 (accum_dtype). Under FSDP2's bf16 params it is returned
as bf16 like every other gradient.

Liger launches Triton kernels from Python and calls `.item()` on the count of non-ignored targets. The loss
therefore runs outside torch.compile (torch.compiler.disable). The graph breaks once, after ln_f.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def load_liger() -> type[nn.Module]:
    """LigerFusedLinearCrossEntropyLoss, imported only when asked for (liger imports Triton); missing -> the key."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as e:
        raise ValueError(
            f"model.fused_ce: 'liger' needs the liger-kernel package (pip install liger-kernel): {e}"
        ) from None
    return LigerFusedLinearCrossEntropyLoss


class LigerLMLoss(nn.Module):
    """Mean next-token cross-entropy of hidden states (B, T, C) through the tied lm_head weight (Vp, C), scored over
    the first `vocab_size` rows only; targets (B, T), -100 ignored (F.cross_entropy's convention)."""

    def __init__(self, vocab_size: int, padded_vocab_size: int) -> None:
        super().__init__()
        self.loss = load_liger()(ignore_index=-100, reduction="mean", accum_dtype=torch.float32)
        mask = torch.zeros(padded_vocab_size)  # (Vp,): 0 = scored row, -inf = padding row
        mask[vocab_size:] = float("-inf")
        # not a parameter and not in the state_dict: checkpoints and HF exports are identical with and without it
        self.register_buffer("vocab_mask", mask if padded_vocab_size > vocab_size else None, persistent=False)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Triton's CPU interpreter (TRITON_INTERPRET=1) runs the same kernels on CPU tensors: used for parity checks
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("model.fused_ce: 'liger' runs Triton GPU kernels; use model.fused_ce=none on CPU")
        bias = None
        if self.vocab_mask is not None:
            # the mask in the logits' dtype: a bf16 chunk + fp32 bias would promote every logits chunk to fp32
            dtype = (
                torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else weight.dtype
            )
            bias = self.vocab_mask.to(dtype)
        return self.loss(weight, x.flatten(0, 1), targets.flatten(), bias)  # x (B*T, C), targets (B*T,)
