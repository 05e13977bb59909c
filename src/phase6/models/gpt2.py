"""GPT-2 (Radford et al. 2019) as a plain nn.Module; HF conversion lives in phase6.models.hf.

Architecture only: no distributed code, no logging, no config parsing. Module names follow the HF checkpoint
(`transformer.wte`, `transformer.h.{i}.attn.c_attn`, ..., `transformer.ln_f`, `lm_head`) so conversion is a
rename-free copy plus a transpose of the four Conv1D weights per block.

Vocabulary: wte/lm_head have `padded_vocab_size` rows (50304 for GPT-2: a multiple of 64 for tensor cores), but
only the first `vocab_size` (50257) logits are returned or scored. The padding rows therefore never change a
loss, which makes HF import (50257 rows, zero-padded) and export (truncated) exact in both directions.

Kernel choices that do not change the model are attributes set from outside: `attn.sdpa_backends`
(phase6.parallel.apply_sdpa), `loss_fn` (a compiled copy under FSDP2) and, for model.fused_ce=liger, `fused_loss`
(phase6.models.fused_ce), which scores the hidden states without materialising the logits.

Numerics choices (they change the loss at the bf16 noise level and are checked against the default before use,
docs/benchmarks.md): model.residual_dtype=bf16 (below) and model.float8 (phase6.parallel.apply_float8 swaps the
blocks' Linear layers for torchao Float8Linear before compilation).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from phase6.models.fused_ce import LigerLMLoss


@dataclass(frozen=True)
class GPTConfig:
    """The architecture GPT is built from. The pretrain job's ``model`` group (config/pretrain.py ModelConfig) holds
    the same fields with their defaults, documentation and key-naming validation; ``GPTConfig.of`` copies them."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    pad_vocab_multiple: int
    bias: bool
    dropout: float
    fused_ce: str
    float8: str
    float8_lm_head: bool
    residual_dtype: str
    ce_vocab: str

    def __post_init__(self) -> None:
        assert self.n_embd % self.n_head == 0, "config validation (model.n_embd, model.n_head) comes first"

    @classmethod
    def of(cls, cfg: Any) -> GPTConfig:
        """``cfg`` itself if it is a GPTConfig, else a GPTConfig of its same-named fields (a ModelConfig)."""
        if isinstance(cfg, cls):
            return cfg
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

    @property
    def padded_vocab_size(self) -> int:
        """Rows of wte / lm_head: vocab_size rounded up to pad_vocab_multiple."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v projection
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # None = PyTorch's priority order; phase6.parallel.apply_sdpa pins one kernel. Entered here (not around the
        # blocks) so an activation-checkpointing recompute in backward runs the same kernel as the forward.
        self.sdpa_backends: list[SDPBackend] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        # is_causal lets SDPA pick the flash / memory-efficient kernel without materialising a (T, T) mask
        with sdpa_kernel(self.sdpa_backends) if self.sdpa_backends else nullcontext():
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")  # HF "gelu_new" is the tanh approximation: needed for parity
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # pre-norm residual, (B, T, C)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig | Any) -> None:
        """``cfg``: a GPTConfig, or the pretrain job's ModelConfig (copied into one: ``GPTConfig.of``)."""
        super().__init__()
        self.cfg = cfg = GPTConfig.of(cfg)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied input/output embedding (GPT-2)
        self.loss_fn = lm_loss  # phase6.parallel.apply_compile may swap in a compiled copy
        self.fused_loss = LigerLMLoss(cfg.vocab_size, cfg.padded_vocab_size) if cfg.fused_ce == "liger" else None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, residual projections N(0, 0.02/sqrt(2L)), zero biases."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                # each block adds two residual branches (attn.c_proj, mlp.c_proj): scale keeps the residual
                # stream variance O(1) at depth (GPT-2 paper sec. 2.3)
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith("c_proj") else 0.02
                if module is not self.lm_head:  # tied to wte, initialised there
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (tied wte counted once); exclude_embeddings drops wte and wpe (Kaplan's N)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) int64 -> logits (B, T, vocab_size), or the mean cross-entropy if targets (B, T) are given.

        Targets equal to -100 are ignored (F.cross_entropy default).
        """
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        if self.cfg.residual_dtype == "bf16":
            # under bf16 autocast every branch output is bf16, so the residual adds (and the LayerNorm inputs saved
            # for backward) stay bf16 from here on instead of fp32
            x = x.to(torch.bfloat16)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None and self.fused_loss is not None:
            return self.fused_loss(x, self.lm_head.weight, targets)  # scores rows < vocab_size, like the slice below
        logits = self.lm_head(x)  # (B, T, Vp)
        if targets is None:
            return logits[..., : self.cfg.vocab_size]  # (B, T, V): padding columns are never scored
        if self.cfg.ce_vocab == "sliced":
            logits = logits[..., : self.cfg.vocab_size]
        return self.loss_fn(logits, targets, self.cfg.vocab_size)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of (B, T, V') logits against (B, T) targets (-100 = ignored), scored over the
    first `vocab_size` columns (all of them if None): columns beyond it are set to -inf, so they add exp(-inf) = 0
    to the softmax and get a zero gradient.

    The log-softmax runs in fp32 even under bf16 autocast; compiled (whole model, or this function alone under
    per-block compilation) the upcast and the mask fuse into the CE kernels instead of materialising fp32 logits.
    """
    logits = logits.float()
    if vocab_size is not None and logits.shape[-1] > vocab_size:
        padding = torch.arange(logits.shape[-1], device=logits.device) >= vocab_size
        logits = logits.masked_fill(padding, float("-inf"))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
