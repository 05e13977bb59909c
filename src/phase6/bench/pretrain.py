"""`phase6 bench pretrain`: GPT-2 training-step throughput on one GPU, the same step through HF GPT2LMHeadModel in
the same process, and 2-GPU DDP / FSDP2 scaling efficiency when two GPUs are visible. Prints a markdown table.

    phase6 bench pretrain                                  # default rows, ~6-8 min on one H200 (compilation included)
    phase6 bench pretrain --only ours --batch-sizes 32,64 --compile-mode max-autotune-no-cudagraphs
    phase6 bench pretrain --only multi                     # just the 2-GPU DDP / FSDP2 rows (needs 2 GPUs)
    phase6 bench pretrain --device cpu --preset gpt2_tiny --seq-len 64 --steps 2 --only ours,hf   # code path on CPU

What a row times: whole optimizer steps (grad-accumulation micro-steps of fwd + bwd in bf16 autocast, grad clip 1.0,
fused AdamW, zero_grad) on synthetic tokens already on the device, after `--warmup` steps that include compilation;
one host sync per step (like nanoGPT's bench.py `loss.item()`). tokens/s = tokens per step / median step time.
MFU = tokens/s x FLOPs/token / (peak x GPUs), FLOPs/token = 6N + 12*L*H*Q*T (N = parameters without wpe;
phase6.metrics.FLOPS_FORMULA), peak from configs/hardware/<--hardware>.yaml. Scaling efficiency = 2-GPU tokens/s /
(2 x 1-GPU tokens/s at the same per-GPU batch and accumulation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import yaml

from phase6 import metrics
from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.pretrain import ModelConfig, OptimConfig, ParallelConfig
from phase6.dist import DistInfo, init_distributed, teardown
from phase6.models.gpt2 import GPT
from phase6.models.hf import hf_config_from
from phase6.optim import build_optimizer, clip_grad_norm
from phase6.parallel import parallelize, set_grad_sync

RESULT_TAG = "PHASE6_BENCH_JSON "


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="phase6 bench pretrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gpt2_124m", help="model preset in configs/pretrain/model/")
    p.add_argument("--hardware", default="h200", help="peak FLOP/s source in configs/hardware/")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-sizes", default="32,64", help="micro-batch sizes of the single-GPU rows")
    p.add_argument(
        "--accum",
        type=int,
        default=8,
        help="micro-steps per optimizer step of the training-shaped row (B=--multi-batch-size) and the 2-GPU rows",
    )
    p.add_argument("--hf-batch-size", type=int, default=32, help="micro-batch of the HF GPT2LMHeadModel row")
    p.add_argument("--multi-batch-size", type=int, default=64, help="per-GPU micro-batch of the 2-GPU rows")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default | max-autotune-no-cudagraphs)")
    p.add_argument("--no-compile", action="store_true", help="eager rows (compilation is on by default)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per row (the first compiles)")
    p.add_argument("--only", default="ours,hf,multi", help="comma list of: ours, hf, multi")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--worker", choices=["ddp", "fsdp2"], help=argparse.SUPPRESS)  # torchrun child
    args = p.parse_args(argv)
    bad = set(args.only.split(",")) - {"ours", "hf", "multi"}
    if bad:
        raise ValueError(f"--only: unknown parts {sorted(bad)}; use ours, hf, multi")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device visible (use --device cpu to exercise the code path)")
    return args


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


def time_steps(step: Callable[[], torch.Tensor], warmup: int, steps: int) -> list[float]:
    """Seconds per step, each ending in a host sync on the loss (as a training loop logging every step would)."""
    for _ in range(warmup):
        step().item()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    return times


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
    name: str,
    B: int,
    accum: int,
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
        "config": name,
        "B": B,
        "accum": accum,
        "GPUs": gpus,
        "tokens/step": tokens,
        "step ms": 1000 * step_s,
        "tokens/s": tps,
        "MFU %": metrics.mfu_pct(tps, flops_tok, peak, gpus),
        "peak mem GiB": mem,
    }


def peak_mem(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset(device: torch.device) -> None:
    torch._dynamo.reset()  # each row compiles for its own shapes, never as a dynamic-shape graph
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def bench_ours(
    args: argparse.Namespace,
    mcfg: ModelConfig,
    info: DistInfo,
    peak: float,
    settings: list[tuple[int, int]],
    mode: str = "ddp",
) -> list[dict[str, Any]]:
    """Our GPT through phase6.parallel (compile, DDP / FSDP2) and phase6.optim (fused AdamW): one row per
    (micro-batch, accumulation) setting; settings with the same micro-batch share one compiled model."""
    device, T = info.device, args.seq_len
    use_bf16 = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    compile_on = not args.no_compile and device.type == "cuda"
    ocfg = OptimConfig(**{k: v for k, v in load_yaml("pretrain/optim", "adamw_tuned").items() if k != "name"})
    rows = []
    for B in dict.fromkeys(b for b, _ in settings):
        reset(device)
        torch.manual_seed(0)
        with torch.device(device):
            model = GPT(mcfg)
        pcfg = ParallelConfig(mode=mode, compile=compile_on, compile_mode=args.compile_mode)
        pmodel = parallelize(model, pcfg, info, param_dtype=torch.bfloat16 if use_bf16 else None)
        opt = build_optimizer(model, ocfg)
        n = model.num_params() - model.transformer.wpe.weight.numel()
        flops_tok = metrics.flops_per_token(n, mcfg.n_layer, mcfg.n_head, mcfg.head_dim, T)
        batch = synthetic(mcfg.vocab_size, B, T, device, seed=info.rank)
        for accum in [a for b, a in settings if b == B]:
            times = time_steps(make_step(pmodel, model, opt, batch, accum, autocast), args.warmup, args.steps)
            label = "phase6 GPT" + (f" {mode}" if info.distributed else "")
            label += f" compiled ({args.compile_mode or 'default'})" if compile_on else " eager"
            tokens = B * T * accum * info.world_size
            rows.append(row(label, B, accum, times, tokens, flops_tok, peak, info.world_size, peak_mem(device)))
        del model, pmodel, opt
    return rows


def bench_hf(args: argparse.Namespace, mcfg: ModelConfig, info: DistInfo, peak: float) -> dict[str, Any]:
    """HF GPT2LMHeadModel (sdpa attention, vocab 50257 as shipped), same optimizer and step, torch.compile'd."""
    from transformers import GPT2LMHeadModel

    device, T, B = info.device, args.seq_len, args.hf_batch_size
    reset(device)
    torch.manual_seed(0)
    config = hf_config_from(mcfg)  # the same network as ours, dropout off, vocab 50257 as HF ships it
    hf = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa").to(device)
    ocfg = OptimConfig(**{k: v for k, v in load_yaml("pretrain/optim", "adamw_tuned").items() if k != "name"})
    opt = build_optimizer(hf, ocfg)
    compile_on = not args.no_compile and device.type == "cuda"
    if compile_on:
        hf.compile(mode=args.compile_mode)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    batch = synthetic(mcfg.vocab_size, B, T, device, seed=0)
    n = sum(p.numel() for p in hf.parameters()) - hf.transformer.wpe.weight.numel()
    flops_tok = metrics.flops_per_token(n, mcfg.n_layer, mcfg.n_head, mcfg.head_dim, T)
    times = time_steps(make_step(hf, hf, opt, batch, 1, autocast, hf=True), args.warmup, args.steps)
    label = "HF GPT2LMHeadModel sdpa" + (f" compiled ({args.compile_mode or 'default'})" if compile_on else " eager")
    return row(label, B, 1, times, B * T, flops_tok, peak, 1, peak_mem(device))


def run_multi(argv: list[str], mode: str) -> dict[str, Any]:
    """One 2-GPU row: this module under torchrun (a fresh process group per layout)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "phase6.bench.pretrain",
        *argv,
        "--worker",
        mode,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"2-GPU {mode} bench failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    mcfg = ModelConfig(**load_yaml("pretrain/model", args.preset))
    if args.seq_len > mcfg.block_size:
        raise ValueError(f"--seq-len {args.seq_len} exceeds {args.preset} block_size {mcfg.block_size}")
    hw = HardwareConfig(**load_yaml("hardware", args.hardware))
    multi_base = (args.multi_batch_size, args.accum)
    if args.worker:  # torchrun child: one distributed row, JSON on rank 0's stdout
        info = init_distributed(args.device)
        try:
            rows = bench_ours(args, mcfg, info, hw.peak_bf16_tflops, [multi_base], mode=args.worker)
        finally:
            teardown()
        if info.is_main:
            print(RESULT_TAG + json.dumps(rows[-1]), flush=True)
        return rows
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    only = set(args.only.split(","))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"# phase6 bench pretrain: {args.preset}, T={args.seq_len}, {gpu}, torch {torch.__version__}, "
        f"peak {hw.peak_bf16_tflops} TFLOP/s ({hw.name}); MFU formula {metrics.FLOPS_FORMULA}",
        flush=True,
    )
    settings = [(int(b), 1) for b in args.batch_sizes.split(",")] if "ours" in only else []
    if (("ours" in only and args.accum > 1) or "multi" in only) and multi_base not in settings:
        settings.append(multi_base)  # the training-shaped row, and the 1-GPU base of the scaling efficiency
    rows = bench_ours(args, mcfg, info, hw.peak_bf16_tflops, settings) if settings else []
    if rows:
        print(markdown(rows), flush=True)
    if "hf" in only:
        rows.append(bench_hf(args, mcfg, info, hw.peak_bf16_tflops))
    # on CPU the 2-process rows run over gloo: they check the code path, not NVLink scaling
    if "multi" in only and (device.type == "cpu" or torch.cuda.device_count() >= 2):
        base = next(r for r in rows if (r["B"], r["accum"], r["GPUs"]) == (*multi_base, 1))
        for mode in ("ddp", "fsdp2"):
            r = run_multi(argv, mode)
            r["scaling eff %"] = 100 * r["tokens/s"] / (2 * base["tokens/s"])
            rows.append(r)
    elif "multi" in only:
        print("(2-GPU rows skipped: fewer than 2 CUDA devices visible)", flush=True)
    print("\n" + markdown(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
