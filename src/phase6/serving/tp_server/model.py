"""The served model: a transformers causal LM from a local directory or config.json, never downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phase6.models.packed_gqa import apply_packed_gqa
from phase6.serving.tp_server.args import ServerArgs


def load_config(model: str) -> Any:
    """AutoConfig of a model directory or of a bare config.json (fields written by hand for dummy runs)."""
    from transformers import AutoConfig

    path = Path(model)
    if path.is_dir():
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read config JSON ({e})") from e
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError(f'{path}: key \'model_type\' missing (e.g. "llama", "qwen2")')
    model_type = fields.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as e:
        raise ValueError(f"{path}: model_type {model_type!r}: {e}") from e


def build_model(args: ServerArgs, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The full (unsharded) causal LM on ``device``: random init from config, or the directory's weights."""
    from transformers import AutoModelForCausalLM

    if args.dummy_weights:
        config = load_config(args.model)
        torch.manual_seed(args.seed)
        with torch.device(device):  # the model's own _init_weights, run on the device (seconds for 14B on a GPU)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=dtype, attn_implementation="sdpa", device_map={"": device}, trust_remote_code=False
        )
    apply_packed_gqa(model)  # masked attention reads each KV head once (phase6.models.packed_gqa)
    return model.eval().requires_grad_(False)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's stack of decoder layers: the ModuleList of ``config.num_hidden_layers`` blocks."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return list(module)
    raise ValueError(f"model {type(model).__name__}: no ModuleList of config.num_hidden_layers = {n} decoder layers")


def broadcast_weights(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Every rank gets rank 0's parameters and buffers (dummy weights: identical model whatever the RNG did)."""
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0, group=group)
