"""GPT-2 (Radford et al. 2019) as a plain nn.Module, plus conversion to and from HF `GPT2LMHeadModel`.

Architecture only: no distributed code, no logging, no config parsing. Module names follow the HF checkpoint
(`transformer.wte`, `transformer.h.{i}.attn.c_attn`, ..., `transformer.ln_f`, `lm_head`) so conversion is a
rename-free copy plus a transpose of the four Conv1D weights per block.

Vocabulary: wte/lm_head have `padded_vocab_size` rows (50304 for GPT-2: a multiple of 64 for tensor cores), but
only the first `vocab_size` (50257) logits are returned or scored. The padding rows therefore never change a
loss, which makes HF import (50257 rows, zero-padded) and export (truncated) exact in both directions.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from phase6.config.pretrain import ModelConfig

if TYPE_CHECKING:
    from transformers import GPT2Config


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v projection
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, Q)
        # is_causal lets SDPA pick the flash / memory-efficient kernel without materialising a (T, T) mask
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")  # HF "gelu_new" is the tanh approximation: needed for parity
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # pre-norm residual, (B, T, C)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
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
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)[..., : self.cfg.vocab_size]  # (B, T, V): padding rows are never scored
        if targets is None:
            return logits
        # fp32 log-softmax even under bf16 autocast; torch.compile fuses the upcast into the CE kernel
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# --- HF GPT2LMHeadModel conversion ---------------------------------------------------------------------------

# HF GPT-2 uses Conv1D (weight stored as (in, out)); nn.Linear stores (out, in)
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_config_from(cfg: ModelConfig, eos_token_id: int | None = None) -> GPT2Config:
    """The HF GPT2Config describing the same network (HF GPT-2 always has biases; dropout off)."""
    from transformers import GPT2Config

    eos = cfg.vocab_size - 1 if eos_token_id is None else eos_token_id  # GPT-2 and byte tokenizers: EOT is last
    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
    )


def model_config_from_hf(hf_config: GPT2Config, name: str = "hf") -> ModelConfig:
    """ModelConfig for an HF GPT-2 config (bias=True: HF checkpoints carry biases)."""
    if hf_config.model_type != "gpt2":
        raise ValueError(f"expected an HF config with model_type 'gpt2', got {hf_config.model_type!r}")
    if hf_config.activation_function != "gelu_new":
        raise ValueError(f"HF config activation_function {hf_config.activation_function!r} is not 'gelu_new'")
    return ModelConfig(
        name=name,
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        n_embd=hf_config.n_embd,
        block_size=hf_config.n_positions,
        vocab_size=hf_config.vocab_size,
        bias=True,
    )


def state_dict_from_hf(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Map an HF GPT2LMHeadModel state dict onto GPT's (transpose Conv1D, pad vocab rows with zeros)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in hf_sd.items():
        if key.endswith(("attn.bias", "attn.masked_bias")) and value.dim() > 1:
            continue  # causal-mask buffers of old HF checkpoints, not parameters
        if key == "lm_head.weight":
            continue  # tied to transformer.wte.weight
        if not key.startswith("transformer."):
            key = "transformer." + key  # bare GPT2Model checkpoints lack the prefix
        if key.endswith(_CONV1D_SUFFIXES):
            value = value.t()
        if key == "transformer.wte.weight":
            padded = value.new_zeros(cfg.padded_vocab_size, value.shape[1])
            padded[: value.shape[0]] = value
            value = padded
        out[key] = value.contiguous()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def from_hf(hf_model: nn.Module, name: str = "hf") -> GPT:
    """A GPT holding the weights of an HF GPT2LMHeadModel (same logits up to float rounding)."""
    cfg = model_config_from_hf(hf_model.config, name=name)
    model = GPT(cfg)
    sd = state_dict_from_hf({k: v.detach().float() for k, v in hf_model.state_dict().items()}, cfg)
    model.load_state_dict(sd, strict=True)
    return model


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Map a GPT state dict onto HF GPT2LMHeadModel keys (transpose, drop vocab padding, add zero biases)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key == "lm_head.weight":
            continue
        if key.endswith(_CONV1D_SUFFIXES):
            value = value.t()
        if key == "transformer.wte.weight":
            value = value[: cfg.vocab_size]
        out[key] = value.detach().contiguous()
    if not cfg.bias:  # HF GPT-2 always has biases: zeros reproduce the bias-free network exactly
        C = cfg.n_embd
        for i in range(cfg.n_layer):
            p = f"transformer.h.{i}."
            like = out[p + "ln_1.weight"]
            for key, size in (("ln_1.bias", C), ("ln_2.bias", C), ("attn.c_attn.bias", 3 * C)):
                out[p + key] = like.new_zeros(size)
            for key, size in (("attn.c_proj.bias", C), ("mlp.c_fc.bias", 4 * C), ("mlp.c_proj.bias", C)):
                out[p + key] = like.new_zeros(size)
        out["transformer.ln_f.bias"] = out["transformer.ln_f.weight"].new_zeros(C)
    return out


def to_hf(model: GPT, eos_token_id: int | None = None) -> nn.Module:
    """An HF GPT2LMHeadModel (fp32, eval mode) with the weights of `model`."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_config_from(model.cfg, eos_token_id))
    sd = to_hf_state_dict({k: v.float().cpu() for k, v in model.state_dict().items()}, model.cfg)
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(("attn.bias", "attn.masked_bias"))]
    assert not missing and not unexpected, (missing, unexpected)
    hf.tie_weights()
    return hf.eval()


def export_hf(
    model: GPT,
    out_dir: str | os.PathLike[str],
    eos_token_id: int | None = None,
    tokenizer_dir: str | os.PathLike[str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write an HF directory (config.json + model.safetensors [+ tokenizer files]) for transformers/vLLM/lm-eval."""
    out = Path(out_dir)
    hf = to_hf(model, eos_token_id).to(dtype)
    hf.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(out)
    return out
