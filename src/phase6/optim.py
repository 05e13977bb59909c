"""AdamW with weight decay on matrices only, and the two LR schedules of 6A.

- Weight decay applies to parameters with dim >= 2 (Linear weights, embeddings); biases and LayerNorm gains are
  not decayed (nanoGPT configure_optimizers; Loshchilov & Hutter 2019 decouple decay from the gradient).
- 'cosine': linear warmup to lr, then cosine to min_lr_ratio * lr at max_steps (nanoGPT, GPT-3 paper).
- 'warmdown': linear warmup, constant lr, then a linear decay over the last warmdown_steps to min_lr_ratio * lr
  (modded-nanogpt record #2 "tuned AdamW": lr 0.0018, warmup 250, warmdown 2000, betas (0.9, 0.95)).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from phase6.config.pretrain import OptimConfig, check_schedule


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed 2-D+ tensors and undecayed 1-D tensors (tied weights appear once)."""
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() de-duplicates the tied wte / lm_head weight
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW(betas=(beta1, beta2)); the fused kernel on CUDA when cfg.fused, the foreach path otherwise."""
    on_cuda = next(model.parameters()).is_cuda
    fused = cfg.fused and on_cuda
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused,
        foreach=None if fused else True,
    )


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global grad norm before clipping (a plain tensor); clips to max_norm when > 0. DDP, FSDP2 (DTensor) or plain."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def lr_factor(cfg: OptimConfig, max_steps: int) -> Callable[[int], float]:
    """Multiplier of cfg.lr as a function of the number of optimizer steps already taken (0-based)."""
    floor = cfg.min_lr_ratio
    warmup = cfg.warmup_steps

    def cosine(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def warmdown(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        start = max_steps - cfg.warmdown_steps
        if step < start:
            return 1.0
        progress = min(1.0, (step - start + 1) / max(1, cfg.warmdown_steps))
        return 1.0 - (1.0 - floor) * progress

    return cosine if cfg.schedule == "cosine" else warmdown


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over lr_factor; its state_dict (last_epoch) goes into checkpoints for exact resume."""
    check_schedule(cfg, max_steps)
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg, max_steps))
