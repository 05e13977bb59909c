"""Parallelism as free functions on a plain GPT, applied in ONE order by `parallelize` (torchtitan style).

    apply_float8   swap the blocks' Linear layers for torchao Float8Linear (model.float8)  (first: compile and
                   FSDP2 must see the final modules; parameters and their names are unchanged)
    apply_sdpa     pin the attention kernel (flash / cudnn / efficient / math / fa4)  (before compile: it is traced)
    apply_ac       wrap each block in activation checkpointing      (first: compile must trace the recompute)
    apply_compile  torch.compile: per block under FSDP2 (each block is one graph between FSDP's all-gather /
                   reduce-scatter hooks), the whole model otherwise (so the lm_head + cross-entropy fuse)
    apply_fsdp     FSDP2 fully_shard per block, then the root (wte/wpe/ln_f/tied lm_head form one unit)
    apply_ddp      DistributedDataParallel around the (compiled) model
                   (last: the data-parallel wrapper must see the final modules and parameters)

A world of one with mode 'ddp' gets no wrapper at all. Gradient sync during accumulation micro-steps is switched
off with `set_grad_sync` (DDP no_sync / FSDP2 set_requires_gradient_sync), so each optimizer step communicates once.

    apply_tp       Megatron-style tensor parallelism of a transformers causal LM for inference, from the TP plan
                   the model declares (the torch-tp server, phase6.serving.tp_server)
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.attention import SDPBackend
from torch.nn.parallel import DistributedDataParallel as DDP

from phase6.config.pretrain import ParallelConfig
from phase6.dist import DistInfo


def _blocks(model: nn.Module) -> nn.ModuleList:
    return model.transformer.h  # type: ignore[return-value]


SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
    "fa4": SDPBackend.FLASH_ATTENTION,  # the flash backend, routed to FlashAttention-4 by activate_fa4
}


def activate_fa4() -> None:
    """Route SDPA's flash backend to FlashAttention-4 (the flash-attn-4 package's CuTe kernels, SM90 and SM100)
    through PyTorch's flash-attention registry. Process-wide: every later flash-backend SDPA call runs FA4, and an
    input FA4 cannot take raises (torch.nn.attention._fa4) instead of falling back to FA2."""
    import torch.nn.attention as attention

    if not hasattr(attention, "register_flash_attention_impl"):
        raise ValueError(
            f"parallel.sdpa_backend: 'fa4' needs torch >= 2.11 (flash-attention registry), got {torch.__version__}"
        )
    try:
        import flash_attn.cute  # noqa: F401  (the FA4 kernels; torch imports them lazily, this fails early and clearly)
    except ImportError as e:
        raise ValueError(
            f"parallel.sdpa_backend: 'fa4' needs the flash-attn-4 package (pip install flash-attn-4): {e}"
        ) from None
    from torch.nn.attention import _fa4

    # torch's FA4 glue expects 2 outputs of flash-attn-4's forward; phase6.models.fa4_interface adapts newer releases
    register = functools.partial(_fa4.register_flash_attention_fa4, module_path="phase6.models.fa4_interface")
    attention.register_flash_attention_impl("FA4", register_fn=register)
    attention.activate_flash_attention_impl("FA4")


def apply_sdpa(model: nn.Module, backend: str) -> None:
    """Pin scaled_dot_product_attention to one kernel ('auto' = PyTorch's own priority order). Each attention runs
    SDPA under torch.nn.attention.sdpa_kernel([that backend]); torch.compile traces the context, so the compiled
    graph calls the chosen kernel (and its backward). A backend that cannot run raises, it never falls back.
    'fa4' pins the flash backend after routing it to FlashAttention-4 (activate_fa4)."""
    if backend not in ("auto", *SDPA_BACKENDS):
        raise ValueError(f"parallel.sdpa_backend: must be auto or one of {sorted(SDPA_BACKENDS)}, got {backend!r}")
    if backend == "fa4":
        activate_fa4()
    for block in _blocks(model):
        block.attn.sdpa_backends = None if backend == "auto" else [SDPA_BACKENDS[backend]]


def apply_float8(model: nn.Module, recipe: str, lm_head: bool = False) -> None:
    """FP8 training GEMMs (torchao.float8, dynamic scaling) for every Linear in the blocks, and the tied lm_head if
    `lm_head`. Float8Linear keeps the module's weight/bias Parameters (the wte tie survives), so state dicts,
    checkpoints, the optimizer and HF export are unchanged; only the three GEMMs of each layer (forward, grad input,
    grad weight) run on e4m3/e5m2 operands with fp32 accumulation. torch.compile fuses the scale/cast kernels."""
    if recipe == "none":
        return
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ValueError(f"model.float8: {recipe!r} needs the torchao package (pip install torchao): {e}") from None
    config = Float8LinearConfig.from_recipe_name(recipe)  # "tensorwise" gives the default Float8LinearConfig()

    def wanted(module: nn.Module, fqn: str) -> bool:
        return fqn.startswith("transformer.h.") or (lm_head and fqn == "lm_head")

    convert_to_float8_training(model, config=config, module_filter_fn=wanted)


def apply_ac(model: nn.Module) -> None:
    """Full activation checkpointing per block: keep block inputs, recompute the block in backward."""
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block)  # state_dict hooks strip the wrapper prefix: keys stay unchanged


def apply_compile(model: nn.Module, per_block: bool, options: dict | None = None, fullgraph: bool = False) -> None:
    """In-place torch.compile (nn.Module.compile keeps parameter names, so checkpoints need no prefix fix).

    `options` are inductor options (ParallelConfig.compile_options(): the mode's options plus parallel.inductor).
    Per block (FSDP2) every block is one graph, so fullgraph always holds there.
    """
    options = options or None  # torch.compile: {} and None both mean the default mode
    if per_block:
        for block in _blocks(model):
            block.compile(options=options, fullgraph=True)
        # the (B, T, V) loss outside the blocks: compiled alone so the fp32 upcast fuses into cross-entropy
        model.loss_fn = torch.compile(model.loss_fn, options=options)
    else:
        model.compile(options=options, fullgraph=fullgraph)


def apply_fsdp(
    model: nn.Module,
    info: DistInfo,
    param_dtype: torch.dtype | None,
    reshard_after_forward: bool = True,
) -> None:
    """FSDP2 over all ranks: fully_shard each block, then the root; bf16 params / fp32 grad reduce on GPU."""
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    # params are all-gathered in param_dtype for compute; gradients are reduce-scattered in fp32 so the sum over
    # ranks does not lose precision (torchtitan mixed_precision_reduce default); the sharded master copy stays fp32
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        # the last block's params would be re-gathered immediately for backward: keep them (torchtitan)
        last = i == len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """Classic DDP (bucketed all-reduce overlapping backward); gradients are views into the buckets."""
    device_ids = [info.local_rank] if info.device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, gradient_as_bucket_view=True)


def parallelize(
    model: nn.Module,
    cfg: ParallelConfig,
    info: DistInfo,
    param_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Apply float8 -> SDPA -> AC -> compile -> FSDP2 | DDP in that order; returns the module to call (DDP wrapper
    or `model`). The float8 recipe is a model choice (it changes the numerics): read from `model.cfg`."""
    apply_float8(model, model.cfg.float8, lm_head=model.cfg.float8_lm_head)
    apply_sdpa(model, cfg.sdpa_backend)
    if cfg.activation_checkpointing:
        apply_ac(model)
    if cfg.compile:
        apply_compile(model, per_block=cfg.mode == "fsdp2", options=cfg.compile_options(), fullgraph=cfg.fullgraph)
    if cfg.mode == "fsdp2":
        apply_fsdp(model, info, param_dtype, cfg.reshard_after_forward)
        return model
    if info.distributed:
        return apply_ddp(model, info)
    return model


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Turn gradient communication on (last micro-step) or off (earlier micro-steps) for DDP / FSDP2 / plain."""
    if isinstance(model, DDP):
        model.require_backward_grad_sync = enabled  # exactly what DDP.no_sync() toggles
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


TP_STYLES = ("colwise", "rowwise", "colwise_gather_output")


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The TP plan the model declares: config.base_model_tp_plan (under the base-model prefix) + class _tp_plan."""
    prefix = model.base_model_prefix
    plan = {f"{prefix}.{k}": v for k, v in (getattr(model.config, "base_model_tp_plan", None) or {}).items()}
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    return plan


def _all_reduce_hook(group: dist.ProcessGroup | None, bias: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(out, group=group)  # sum of the N partial products (rowwise split of the input features)
        return out if bias is None else out + bias

    return hook


def _all_gather_hook(group: dist.ProcessGroup | None, world: int) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.contiguous()
        parts = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(parts, out, group=group)
        return torch.cat(parts, dim=-1)  # (..., V): rank r holds vocabulary slice r

    return hook


def apply_tp(model: nn.Module, rank: int, world: int, group: dist.ProcessGroup | None = None) -> dict[str, str]:
    """Keep this rank's slice of every Linear in the model's TP plan and install the collectives; returns
    {module name: style} of what was split. ValueError names the config key that does not divide by ``world``.

    Plan styles (Llama/Qwen2/Qwen3/Mistral: q/k/v, gate/up "colwise"; o, down "rowwise"; lm_head
    "colwise_gather_output"): colwise Linears keep their 1/N slice of output features (whole heads, so attention
    runs on local heads unchanged); rowwise Linears keep 1/N of input features and all-reduce their output in a
    forward hook; lm_head all-gathers the vocabulary slices. Embeddings and norms are replicated. Plain local
    tensors rather than DTensor ``parallelize_module``: measured on torch 2.13 (CPU), a DTensor ColwiseParallel
    Linear costs ~115 us per call against 9 us plain, ~40 ms of host overhead per decode step for 48 layers x 7
    Linears, which would be measured as "TP cost"."""
    if world == 1:
        return {}
    cfg = model.config
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = getattr(cfg, key, None)
        if value is not None and value % world:
            raise ValueError(f"config.{key} = {value} is not divisible by the tensor-parallel size {world}")
    plan = tp_plan(model)
    if not plan:
        raise ValueError(f"model_type {cfg.model_type!r} declares no tensor-parallel plan (config.base_model_tp_plan)")
    done: dict[str, str] = {}
    for name, module in model.named_modules():
        style = next((s for pat, s in plan.items() if fnmatch.fnmatchcase(name, pat)), None)
        if style is None:
            continue
        if style not in TP_STYLES:
            raise ValueError(
                f"tp plan of {cfg.model_type!r}: style {style!r} at {name!r} is not supported "
                f"(supported: {', '.join(TP_STYLES)})"
            )
        if not isinstance(module, nn.Linear):
            raise ValueError(f"tp plan of {cfg.model_type!r}: {name!r} is a {type(module).__name__}, not nn.Linear")
        w = module.weight
        if style in ("colwise", "colwise_gather_output"):
            module.weight = nn.Parameter(w.detach().chunk(world, dim=0)[rank].clone(), requires_grad=False)
            if module.bias is not None:
                module.bias = nn.Parameter(module.bias.detach().chunk(world)[rank].clone(), requires_grad=False)
            module.out_features = module.weight.shape[0]
            if style == "colwise_gather_output":
                module.register_forward_hook(_all_gather_hook(group, world))
        else:
            module.weight = nn.Parameter(w.detach().chunk(world, dim=1)[rank].clone(), requires_grad=False)
            module.in_features = module.weight.shape[1]
            bias = module.bias.detach().clone() if module.bias is not None else None
            module.bias = None  # added once, after the reduction
            module.register_forward_hook(_all_reduce_hook(group, bias))
        done[name] = style
    if not done:
        raise ValueError(f"tp plan of {cfg.model_type!r} matched no module: {sorted(plan)}")
    return done
