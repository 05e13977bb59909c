"""Timing one setup of `phase6 bench pretrain`: our GPT (phase6.parallel + phase6.optim) or HF GPT2LMHeadModel, whole
optimizer steps on synthetic tokens, one table row per accumulation setting, and the optional GPU-kernel breakdown
(torch.profiler). What a row times is described in phase6/bench/pretrain.py's docstring."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import yaml

from phase6 import metrics
from phase6.bench.pretrain_levers import Setup
from phase6.config import CONFIG_DIR
from phase6.config.pretrain import ModelConfig, OptimConfig, check_precision
from phase6.dist import DistInfo
from phase6.models.gpt2 import GPT
from phase6.models.hf import hf_config_from
from phase6.optim import build_optimizer, clip_grad_norm
from phase6.parallel import parallelize, set_grad_sync
from phase6.timing import sync, wall


def load_yaml(group: str, name: str) -> dict[str, Any]:
    path = CONFIG_DIR / group / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: no such preset")
    return yaml.safe_load(path.read_text())


def synthetic(
    vocab: int, batch: int, seq_len: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    buf = torch.randint(0, vocab, (batch, seq_len + 1), generator=g).to(device)
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()  # (B, T) each


def time_steps(step: Callable[[], torch.Tensor], warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """(warm-up, timed) seconds per step, each ending in a host sync on the loss (as a loop logging every step)."""
    warm, times = [], []
    for out, n in ((warm, warmup), (times, steps)):
        for _ in range(n):
            t0 = wall()
            step().item()
            out.append(wall() - t0)
    return warm, times


def make_step(
    pmodel: torch.nn.Module,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    accum: int,
    autocast: Any,
    hf: bool = False,
) -> Callable[[], torch.Tensor]:
    """One optimizer step as projects/6a_pretrain/train.py runs it (sync only on the last micro-step)."""
    x, y = batch

    def step() -> torch.Tensor:
        total = torch.zeros((), device=x.device)
        for micro in range(accum):
            set_grad_sync(pmodel, micro == accum - 1)
            with autocast:
                loss = pmodel(input_ids=x, labels=x).loss if hf else pmodel(x, y)
            (loss / accum).backward()
            total += loss.detach()
        clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / accum

    return step


def row(
    label: str,
    levers: str,
    B: int,
    accum: int,
    warm: list[float],
    times: list[float],
    tokens: int,
    flops_tok: float,
    peak: float,
    gpus: int,
    mem: float | None,
) -> dict[str, Any]:
    step_s = statistics.median(times)
    tps = tokens / step_s
    return {
        "row": label,
        "levers": levers,
        "B": B,
        "accum": accum,
        "GPUs": gpus,
        "tokens/step": tokens,
        "step ms": 1000 * step_s,
        "tokens/s": tps,
        "MFU %": metrics.mfu_pct(tps, flops_tok, peak, gpus),
        "peak mem GiB": mem,
        "compile s": max(0.0, sum(warm) - len(warm) * step_s),
    }


def not_run(label: str, levers: str, B: int, accum: int, gpus: int, note: str) -> dict[str, Any]:
    return {"row": label, "levers": levers, "B": B, "accum": accum, "GPUs": gpus, "note": note}


def peak_mem(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset(device: torch.device) -> None:
    torch._dynamo.reset()  # each row compiles its own graphs, never as a dynamic-shape graph
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_setup(
    args: argparse.Namespace,
    setup: Setup,
    info: DistInfo,
    peak: float,
    accums: list[int],
    label: str,
    mode: str = "ddp",
    optim: str = "adamw_tuned",
) -> list[dict[str, Any]]:
    """Our GPT through phase6.parallel (SDPA pin, compile, DDP / FSDP2) and phase6.optim (fused AdamW, or Muon +
    AdamW with optim='muon'), one row per accumulation setting; all share one compiled model (same micro-batch
    shape)."""
    device, T, B = info.device, args.seq_len, args.batch_size
    reset(device)
    torch.backends.cuda.matmul.allow_tf32 = setup.tf32  # set for every row: no leak from the previous one
    use_bf16 = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    check_precision(setup.model, use_bf16)
    ocfg = OptimConfig(**{k: v for k, v in load_yaml("pretrain/optim", optim).items() if k != "name"})
    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(setup.model)
    pmodel = parallelize(
        model, dataclasses.replace(setup.parallel, mode=mode), info, torch.bfloat16 if use_bf16 else None
    )
    opt = build_optimizer(model, ocfg)
    n = model.num_params() - model.transformer.wpe.weight.numel()
    flops_tok = metrics.flops_per_token(n, setup.model.n_layer, setup.model.n_head, setup.model.head_dim, T)
    batch = synthetic(setup.model.vocab_size, B, T, device, seed=info.rank)
    levers = "+".join(setup.levers) or "-"
    rows = []
    try:
        for accum in accums:
            warm, times = time_steps(make_step(pmodel, model, opt, batch, accum, autocast), args.warmup, args.steps)
            name = label if accum == 1 else f"{label}, x{accum} accum"
            tokens = B * T * accum * info.world_size
            rows.append(
                row(name, levers, B, accum, warm, times, tokens, flops_tok, peak, info.world_size, peak_mem(device))
            )
            if args.profile and accum == 1 and info.is_main:
                step = make_step(pmodel, model, opt, batch, accum, autocast)
                rows[-1]["kernel_ms"], rows[-1]["top_kernels"] = kernel_breakdown(step, args.profile, device)
    finally:
        del model, pmodel, opt
    return rows


# kernel-name patterns -> category of `--profile` (first match wins; matched against the lower-cased CUDA kernel name)
KERNEL_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "scaled_mm", "matmul", "sm90_", "sm80_")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("inductor fused (triton)", ("triton",)),
    ("copy / fill", ("copy", "fill", "memset", "memcpy")),
)


def kernel_category(name: str) -> str:
    lname = name.lower()
    return next((cat for cat, keys in KERNEL_CATEGORIES if any(k in lname for k in keys)), "other")


def kernel_breakdown(
    step: Callable[[], torch.Tensor], steps: int, device: torch.device, top: int = 15
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """GPU kernel time per optimizer step by category (torch.profiler over `steps` steps after the timed ones): where
    the step's milliseconds go, measured rather than estimated. Sum = GPU busy time; step ms - sum = GPU idle.
    Also the `top` kernels by time (name, category, ms and launches per step): which fused kernel holds the time."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return {}, []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step().item()
        sync(device)
    totals: dict[str, float] = {}
    kernels = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", 0.0) or 0.0
        if us and ev.device_type == torch.autograd.DeviceType.CUDA:
            cat = kernel_category(ev.key)
            totals[cat] = totals.get(cat, 0.0) + us / 1e3 / steps
            kernels.append({"kernel": ev.key[:90], "category": cat, "ms": us / 1e3 / steps, "calls": ev.count / steps})
    kernels.sort(key=lambda k: -k["ms"])
    top_rows = [{**k, "ms": round(k["ms"], 2), "calls": round(k["calls"], 1)} for k in kernels[:top]]
    return {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}, top_rows


def bench_hf(args: argparse.Namespace, mcfg: ModelConfig, info: DistInfo, peak: float) -> dict[str, Any]:
    """HF GPT2LMHeadModel (sdpa attention, vocab 50257 as shipped), same optimizer and step, torch.compile'd."""
    from transformers import GPT2LMHeadModel

    device, T, B = info.device, args.seq_len, args.hf_batch_size
    reset(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    config = hf_config_from(mcfg)  # the same network as ours, dropout off, vocab 50257 as HF ships it
    hf = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa").to(device)
    ocfg = OptimConfig(**{k: v for k, v in load_yaml("pretrain/optim", "adamw_tuned").items() if k != "name"})
    opt = build_optimizer(hf, ocfg)
    compile_on = not args.no_compile and device.type == "cuda"
    if compile_on:
        hf.compile()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    batch = synthetic(mcfg.vocab_size, B, T, device, seed=0)
    n = sum(p.numel() for p in hf.parameters()) - hf.transformer.wpe.weight.numel()
    flops_tok = metrics.flops_per_token(n, mcfg.n_layer, mcfg.n_head, mcfg.head_dim, T)
    warm, times = time_steps(make_step(hf, hf, opt, batch, 1, autocast, hf=True), args.warmup, args.steps)
    label = "HF GPT2LMHeadModel sdpa" + (" compiled" if compile_on else " eager")
    del hf, opt
    return row(label, "-", B, 1, warm, times, B * T, flops_tok, peak, 1, peak_mem(device))
