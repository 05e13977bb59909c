"""Grouped-query attention with K/V read once: an attention function for transformers' decoder layers.

transformers 5.17 (the GPU image) repeats K/V to every query head whenever a mask is given (``repeat_kv``), i.e.
rewrites the whole cache (Hq/Hkv = 5x for Qwen2.5-14B, 6x for Qwen2.5-1.5B) in every layer of every step, and a
static or slot cache always passes a mask. Here the query heads of one KV head are packed into the query length
instead, so SDPA reads each K/V once. (transformers 5.24 does the same, ``pack_gqa``, but only when not compiling.)
Used by the torch-tp server (phase6.serving.tp_server) and the GRPO decode loop (phase6.rollout.hf_loop).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PACKED_GQA = "phase6_packed_gqa"
"""Name of ``packed_gqa_attention`` in transformers' attention registry."""


def packed_gqa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA with the query heads of one KV head packed into the query length, so K/V are read once.

    Query (B, Hq, T, D) -> (B, Hkv, g*T, D) with g = Hq/Hkv (head h belongs to KV head h // g, as in repeat_kv);
    key/value (B, Hkv, L, D); bool mask (B, 1, T, L) (True = attend) -> (B, 1, g*T, L). A decode step (T = 1) is
    g query rows per KV head. Without a mask (plain causal forward) this is transformers' own SDPA path.
    Returns (B, T, Hq, D), the layout transformers' layers expect.
    """
    if attention_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    q = query.reshape(b, hkv, g * t, d)
    mask = attention_mask[:, :, None].expand(b, 1, g, t, attention_mask.shape[-1]).reshape(b, 1, g * t, -1)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)  # (B, Hkv, g*T, D)
    return out.reshape(b, hq, t, d).transpose(1, 2).contiguous(), None  # (B, T, Hq, D)


def register_packed_gqa() -> str:
    """Register ``packed_gqa_attention`` with transformers' AttentionInterface; returns its name there (a model
    uses it once ``model.config._attn_implementation`` is set to that name, read by every layer at call time)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_GQA, packed_gqa_attention)
    return PACKED_GQA


def apply_packed_gqa(model: nn.Module) -> None:
    """Masked attention of every layer of a transformers model through ``packed_gqa_attention``."""
    model.config._attn_implementation = register_packed_gqa()
