"""AdamW with weight decay on matrices only, Muon for the hidden matrices, and the two LR schedules of 6A.

- Weight decay applies to parameters with dim >= 2 (Linear weights, embeddings); biases and LayerNorm gains are
  not decayed (nanoGPT configure_optimizers; Loshchilov & Hutter 2019 decouple decay from the gradient).
- optim.algorithm=muon: torch.optim.Muon (PyTorch >= 2.9; momentum, then a 5-step quintic Newton-Schulz
  orthogonalization in bf16, then p -= lr * sqrt(max(1, rows/cols)) * O) on the 2-D weights inside the transformer
  blocks, fused AdamW on the rest: embeddings and the tied LM head, biases, LayerNorm gains (modded-nanogpt's split:
  Muon is for hidden layers, Jordan 2024 https://kellerjordan.github.io/posts/muon/). One LR schedule scales both.
  Every rank orthogonalizes every matrix itself (DDP: the gradients are already all-reduced, so the ranks agree).
- 'cosine': linear warmup to lr, then cosine to min_lr_ratio * lr at max_steps (nanoGPT, GPT-3 paper).
- 'warmdown': linear warmup, constant lr, then a linear decay over the last warmdown_steps to min_lr_ratio * lr
  (modded-nanogpt record #2 "tuned AdamW": lr 0.0018, warmup 250, warmdown 2000, betas (0.9, 0.95)).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights inside the transformer blocks (attention qkv/proj, MLP fc/proj): Muon's parameters. The
    embeddings, the tied LM head, biases and LayerNorm gains are not among them."""
    return [p for p in model.transformer.h.parameters() if p.requires_grad and p.dim() == 2]


def _adamw(groups: list[dict], cfg: OptimConfig, on_cuda: bool) -> torch.optim.AdamW:
    fused = cfg.fused and on_cuda
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused, foreach=None if fused else True
    )


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over the hidden matrices and torch.optim.AdamW over the rest, used as one optimizer.

    `param_groups` is always the two optimizers' live group dicts (Muon's first; read on every access, because an
    optimizer's load_state_dict replaces its group dicts), so one LR scheduler sets both from each group's own peak
    LR, also after a resume; `optimizers` is what torch.distributed.checkpoint's get/set_optimizer_state_dict take,
    so a checkpoint holds both states (Muon's momentum buffers, AdamW's moments) keyed by parameter name.
    """

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        super().__init__([p for opt in (muon, adamw) for g in opt.param_groups for p in g["params"]], {})
        self.muon, self.adamw = muon, adamw
        self.optimizers = [muon, adamw]

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        inner = self.__dict__.get("optimizers")
        if inner is None:  # inside Optimizer.__init__: a scratch list of its own, unused afterwards
            return self.__dict__.setdefault("_init_groups", [])
        return [g for opt in inner for g in opt.param_groups]

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.__dict__["_init_groups"] = groups  # Optimizer.__init__'s assignment; the real groups are the inner ones

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers:
            opt.step()
        return loss

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW(betas=(beta1, beta2)) on everything, or MuonAdamW (cfg.algorithm='muon'); AdamW is the fused kernel on
    CUDA when cfg.fused, the foreach path otherwise."""
    on_cuda = next(model.parameters()).is_cuda
    if cfg.algorithm == "adamw":
        return _adamw(param_groups(model, cfg.weight_decay), cfg, on_cuda)
    hidden = hidden_matrices(model)
    in_muon = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_muon]
    decay = [p for p in rest if p.dim() >= 2]  # wte (= tied lm_head) and wpe
    no_decay = [p for p in rest if p.dim() < 2]
    muon = torch.optim.Muon(
        hidden,
        lr=cfg.muon_lr,
        weight_decay=cfg.muon_weight_decay,
        momentum=cfg.muon_momentum,
        nesterov=cfg.muon_nesterov,
        ns_steps=cfg.muon_ns_steps,
        adjust_lr_fn=cfg.muon_adjust_lr,
    )
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return MuonAdamW(muon, _adamw(groups, cfg, on_cuda))


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global grad norm before clipping (a plain tensor); clips to max_norm when > 0. DDP, FSDP2 (DTensor) or plain."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def lr_factor(cfg: OptimConfig, max_steps: int) -> Callable[[int], float]:
    """Multiplier of cfg.lr as a function of the number of optimizer steps already taken (0-based)."""
    floor = cfg.min_lr_ratio
    warmup = cfg.num_warmup_steps(max_steps)
    warmdown_steps = cfg.num_warmdown_steps(max_steps)

    def cosine(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def warmdown(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        start = max_steps - warmdown_steps
        if step < start:
            return 1.0
        progress = min(1.0, (step - start + 1) / max(1, warmdown_steps))
        return 1.0 - (1.0 - floor) * progress

    return cosine if cfg.schedule == "cosine" else warmdown


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over lr_factor; its state_dict (last_epoch) goes into checkpoints for exact resume."""
    check_schedule(cfg, max_steps)
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg, max_steps))
