"""Conversion between phase6's GPT and HF `GPT2LMHeadModel`, and export of an HF directory.

- HF GPT-2 stores c_attn/c_proj/c_fc weights as Conv1D (in, out): transposed against nn.Linear (out, in).
- HF checkpoints have 50257 vocab rows; GPT has padded_vocab_size rows (50304) of which only vocab_size are scored,
  so zero-padding on import and truncation on export change no logit.
- HF GPT-2 always has biases: a bias-free GPT exports with zero biases (the same function).
- The exported directory (config.json + model.safetensors [+ tokenizer]) loads in transformers, vLLM and lm-eval.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from phase6.models.gpt2 import GPT, GPTConfig

if TYPE_CHECKING:
    from transformers import GPT2Config, PreTrainedTokenizerFast

# HF GPT-2 uses Conv1D (weight stored as (in, out)); nn.Linear stores (out, in)
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_config_from(cfg: GPTConfig, eos_token_id: int | None = None) -> GPT2Config:
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


def model_config_from_hf(hf_config: GPT2Config) -> GPTConfig:
    """GPTConfig for an HF GPT-2 config (bias=True: HF checkpoints carry biases; plain fp32/bf16 GEMMs, no dropout)."""
    if hf_config.model_type != "gpt2":
        raise ValueError(f"expected an HF config with model_type 'gpt2', got {hf_config.model_type!r}")
    if hf_config.activation_function != "gelu_new":
        raise ValueError(f"HF config activation_function {hf_config.activation_function!r} is not 'gelu_new'")
    return GPTConfig(
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        n_embd=hf_config.n_embd,
        block_size=hf_config.n_positions,
        vocab_size=hf_config.vocab_size,
        pad_vocab_multiple=64,
        bias=True,
        dropout=0.0,
        fused_ce="none",
        float8="none",
        float8_lm_head=False,
        residual_dtype="fp32",
        ce_vocab="padded",
    )


def state_dict_from_hf(hf_sd: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
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


def from_hf(hf_model: nn.Module) -> GPT:
    """A GPT holding the weights of an HF GPT2LMHeadModel (same logits up to float rounding)."""
    cfg = model_config_from_hf(hf_model.config)
    model = GPT(cfg)
    sd = state_dict_from_hf({k: v.detach().float() for k, v in hf_model.state_dict().items()}, cfg)
    model.load_state_dict(sd, strict=True)
    return model


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
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


EOT_TEXT = "<|endoftext|>"


def hf_tokenizer(
    name: str, gpt2_dir: str | os.PathLike[str] | None = None, bpe_file: str | os.PathLike[str] | None = None
) -> PreTrainedTokenizerFast | None:
    """An HF fast tokenizer with the same ids as the data tokenizer ('gpt2' or 'bpe'); None for 'byte'.

    gpt2: built from encoder.json + vocab.bpe (`gpt2_dir`, else tiktoken's cache) with GPT-2's byte-level
    pre-tokenizer; ids equal tiktoken's and EOT_TEXT is id 50256. bpe: the trained tokenizer.json plus EOT_TEXT as
    the id after its vocabulary (phase6.data.tokenizer.BPETokenizer's EOT). The byte tokenizer has no HF equivalent.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if name == "byte":
        return None
    if name == "gpt2":
        from phase6.data.tokenizer import GPT2_BPE_FILES, _cache_name, tiktoken_cache_dir

        if gpt2_dir is not None:
            files = {f: Path(gpt2_dir) / f for f in GPT2_BPE_FILES}
        else:
            files = {f: tiktoken_cache_dir() / _cache_name(url) for f, (url, _) in GPT2_BPE_FILES.items()}
        for f, path in files.items():
            if not path.is_file():
                raise ValueError(
                    f"{path}: GPT-2 {f} not found; set data.tokenizer_dir to a directory with the BPE files"
                )
        tok = Tokenizer(models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"])))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    elif name == "bpe":
        if bpe_file is None or not Path(bpe_file).is_file():
            raise ValueError(f"{bpe_file}: BPE tokenizer.json not found")
        tok = Tokenizer.from_file(str(bpe_file))
    else:
        raise ValueError(f"unknown tokenizer {name!r}; expected gpt2, bpe or byte")
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT_TEXT, bos_token=EOT_TEXT, unk_token=EOT_TEXT)


def export_hf(
    model: GPT,
    out_dir: str | os.PathLike[str],
    tokenizer: PreTrainedTokenizerFast | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write an HF directory (config.json + model.safetensors [+ tokenizer]) for transformers / vLLM / lm-eval.

    The tokenizer's EOT id becomes the config's bos/eos id (GPT-2: 50256); without one, the last vocab id.
    """
    out = Path(out_dir)
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    if eos is not None and eos >= model.cfg.vocab_size:
        raise ValueError(f"tokenizer EOT id {eos} is outside model.vocab_size {model.cfg.vocab_size}")
    hf = to_hf(model, eos).to(dtype)
    hf.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.model_max_length = model.cfg.block_size
        tokenizer.save_pretrained(out)
    return out
