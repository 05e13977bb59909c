"""`phase6 bench pretrain`: GPT-2 training-step throughput on one GPU. It measures the baseline, then each performance
lever alone, then the winners combined (also at the training shape), the same step through HF GPT2LMHeadModel in
the same process, and 2-GPU DDP / FSDP2 scaling of the combined config when two GPUs are visible. It prints one
markdown table and writes it as JSON (--out).

    phase6 bench pretrain --out bench.json         # the default run: one H200, ~7 min including every compile
    phase6 bench pretrain --rows baseline,levers --levers cudnn,liger            # trim the run
    phase6 bench pretrain --rows multi --combine cudnn,autotune                  # the 2-GPU rows for a chosen config
    phase6 bench pretrain --device cpu --preset gpt2_tiny --seq-len 32 --micro-batch-size 2 --grad-accum-steps 2 --levers flash,tf32
                                                                                 # the code path on CPU (no compile)

Rows, in run order (`--rows` picks among baseline, hf, levers, combined, accum, multi, muon; muon is not a default):
  baseline  ours, default torch.compile, SDPA auto, B=--micro-batch-size (64), one micro-step per optimizer step
  hf        HF GPT2LMHeadModel (attn_implementation=sdpa, vocab 50257 as shipped), compiled, B=--hf-batch-size (32)
  levers    ours + each lever of --levers alone, at the baseline shape (table below)
  combined  ours + every lever that beat the baseline by >= --min-gain-pct, at the baseline shape. Incompatible
            winners are resolved in favour of the faster one: one SDPA backend; fullgraph is dropped next to liger.
            `--combine a,b` names the levers instead.
  accum     the combined config at B x --grad-accum-steps micro-steps (64 x 8 x 1024 = 524,288 tokens: the training step)
  multi     the combined config under torchrun on 2 GPUs, DDP and FSDP2, B x --grad-accum-steps per GPU. Scaling efficiency is
            2-GPU tokens/s / (2 x the accum row).
  muon      the combined config with optim=muon (torch.optim.Muon on the hidden matrices + fused AdamW), at B x 1
            and B x --grad-accum-steps: the Newton-Schulz cost against the AdamW rows of the same shapes (baseline / accum).
A lever is a set of config overrides that projects/6a_pretrain/train.py honours too (the `overrides` line printed
at the end is the combined config, ready for `phase6 pretrain ...`).

What a row times: whole optimizer steps (micro-steps of fwd + bwd under bf16 autocast with fp32 master weights,
grad clip 1.0, fused AdamW, zero_grad) on synthetic tokens already on the device, with one host sync on the loss
per step (like nanoGPT's bench.py `loss.item()`). tokens/s = tokens per step / median step time over --steps steps.
Those steps follow --warmup untimed steps. compile s = the warm-up steps' time minus warmup x the median step: the
compile seen by this row. Inductor's on-disk caches are warmed by earlier rows, so a cold training start can
compile longer. MFU = tokens/s x FLOPs/token / peak, FLOPs/token = 6N + 12*L*H*Q*T (N = parameters without wpe;
phase6.metrics.FLOPS_FORMULA), peak from configs/hardware/<--hardware>.yaml.

Budget: the default run must fit one ~8-minute GPU call. The rows baseline, hf, combined, accum and multi always
run. A lever row runs only if its estimated time (compile_cost x the baseline's compile time + its steps) fits the
time left in --budget-s after the remaining rows are reserved. Levers with isolate=True (max-autotune, whose
compile time is open-ended) run in a child process that is killed at the time left. A skipped or killed row stays
in the table with the reason.

METHOD (predict, change, measure). Predictions for one H200, GPT-2 124M, B=64, T=1024. Measured before this bench:
499k tokens/s = 131 ms/step, 43.2% MFU. The expected split of that step is about 78 ms of GEMMs (48.5 TFLOP at
~620 TFLOP/s), ~13 ms of FA2 attention, ~7 ms of logits + cross-entropy (6.6 GB of bf16 logits read/written ~6
times), ~25-30 ms of memory-bound LayerNorm / GELU / bias / residual kernels over a fp32 residual stream, and ~3 ms
of clip + AdamW.
  cudnn      +3..4%   cuDNN 9 attention on Hopper (FA3-style warp-specialised kernels) vs FA2 for head_dim 64:
                      ~1.5x on the ~13 ms of attention.
  liger      -6..0%   a memory lever: -6..8 GiB peak at B=64 (no logits), same or more HBM traffic (mask add, two-
                      pass CE, 64 chunked fp32 grad_weight addmm ~20 GB), one host sync per micro-step.
  fullgraph  0%       the whole-model graph has no break already. The flag turns a future break into an error.
  autotune   +3..8%   max-autotune-no-cudagraphs: Triton GEMM templates with bias/GELU/residual fused into the
                      epilogue instead of cuBLAS + separate kernels. Compile 2..5 min.
  coord      +1..3%   coordinate-descent tuning of the block sizes of inductor's pointwise/reduction kernels
                      (~25% of the step). Compile +30..90 s.
  chunker    -3..+2%  inductor's auto-chunker (linear + CE in chunks, the compiled alternative to liger).
                      Experimental. Off by default.
  Numerics levers (second round, 2026-11-29; measured first: baseline 509k, coord 517k, cudnn +0.2%, liger -8%).
  They change the loss at the bf16-noise level, so each needs the loss check of docs/benchmarks.md beside its row:
  fp8        +5..12%  torchao float8 tensorwise on the 48 block Linears (69% of the GEMM FLOPs): FP8 tensor cores
                      (2x bf16 peak) on K=768/3072 GEMMs save ~20 ms of ~54 ms; the amax + cast kernels (fused by
                      compile into the neighbouring LayerNorm/GELU where possible) cost back ~8-12 ms.
  fp8_rowwise +0..6%  per-row scales: closer to bf16 numerics, slower scaling kernels and GEMMs than tensorwise.
  fp8_head   +8..16%  fp8 + the tied lm_head (the other 31% of GEMM FLOPs, the (B*T, 50304) GEMMs): ~6 ms more.
  bf16_resid +2..4%   residual stream in bf16 instead of fp32: halves ~6 ms of residual-stream traffic (adds, LN
                      inputs saved for backward); also -~3 GiB.
  Third round (2026-11-30), from the top-kernel list of `--profile`: the compiled cross-entropy is two kernels,
  5.8 ms (forward reduction) + 12.5 ms (backward pointwise) per step, ~1 TB/s on ~13-20 GB, a quarter of HBM speed.
  They read rows of 50257 bf16 logits (the [..., :50257] slice): 100,514 bytes, so no row starts 16-byte aligned
  and no load is vectorised.
  ce_padded  +8..11%  model.ce_vocab=padded: the CE reads all 50304 columns (aligned rows) with the 47 padding
                      columns set to -inf inside the same fused kernels; same loss. Predicted ~1.6 + ~3.2 ms at
                      ~4 TB/s, i.e. -12..14 ms of the ~123 ms step. Measured +6.6 % (backward 12.4 -> 5.5 ms,
                      forward 5.8 -> 5.5 ms) and made the default; the lever is now ce_sliced (the old path).
  Fourth round (2026-11-30), after ce_padded: combined row 118.0 ms = GEMMs 70.3 + inductor Triton 28.2 (CE
  forward 5.1, CE backward 4.7) + attention 18.4 (cuDNN sm90: forward ~7.5 ms for 1.24 TFLOP = ~165 TFLOP/s,
  backward ~10.8 ms for 3.1 TFLOP = ~290 TFLOP/s) + AdamW 1.5.
  fa4        +2..4%   parallel.sdpa_backend=fa4: FlashAttention-4's SM90 CuTe kernels (FA3's design: warp-
                      specialised, pingpong softmax/GEMM overlap) behind SDPA. Forward ~7.5 -> ~4.5 ms (~300
                      TFLOP/s), backward ~10.8 -> ~10 ms: -3..5 ms. Runs in a child process (the registry is
                      process-wide; first call JIT-compiles the kernels).
  two_pass   +1.5..2.5% inductor online_softmax=False: the CE forward is one online-softmax reduction, 2 exp per
                      logit (rescale + term) over 3.3e9 logits, 5.1 ms at ~1.3 TB/s: exp-bound, not HBM-bound. Two
                      passes (max, then sum of exp) read each 100 KB row twice, the second from L2 (132-264 rows in
                      flight = 13-26 MB < 50 MB), with 1 exp per logit: ~2.5 ms.
  autotune_sub +0..5% max-autotune-no-cudagraphs with autotune_in_subproc=True: the first round's device-side assert
                      came from a Triton GEMM candidate benchmarked in-process; in a subprocess a failing candidate
                      is discarded. Bias/GELU epilogue fusion (~7 ms of GELU + bias kernels) against Triton GEMMs
                      that may lose to cuBLAS at 87% of peak.
  Measured (docs/benchmarks.md, fourth round): fa4 +0.2% (attention 17.1 -> 15.3 GPU ms, but cuDNN's forward was
  already 4.1 ms at ~300 TFLOP/s and FA4's Python launch path adds 1.4 ms of GPU idle); two_pass -0.4% (CE forward
  5.1 -> 4.8 ms only); autotune_sub +0.7% (compiles now; 226 s, +5 GiB). Best combined: bf16_resid + coord + fa4,
  573.9k tokens/s.
  tf32       0%       no matmul runs in fp32 under bf16 autocast. Off by default.
  flash      0%       'auto' already picks FA2 on Hopper in torch 2.11. Off by default.
  Not levers:   allow_bf16_reduced_precision_reduction is already True by default. QKV already runs as one fused
                GEMM with bias (c_attn). The [..., :50257] logits slice is fused into the compiled CE and its
                backward. Checked in the AOT graph: the backward is one slice_scatter with no copy.
  combined   +8..12%  ~540-560k tokens/s. Below the 650k target: what remains is memory-bound work that bf16
                      autocast numerics (fp32 residual stream, biases) fix in place.
  accum x8   = combined +0..1% (the optimizer and clip amortised over 8 micro-steps)
  hf         ~417k (issue 3's measurement). DDP 2 GPUs: 97..99% scaling. FSDP2: 93..97%.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from phase6 import metrics
from phase6.bench.pretrain_levers import DEFAULT_LEVERS, LEVERS, ROW_PREDICTIONS, build_setup, combine, pick_winners
from phase6.bench.pretrain_steps import bench_hf, load_yaml, not_run, reset, run_setup
from phase6.config import HardwareConfig
from phase6.config.pretrain import ModelConfig, ParallelConfig
from phase6.dist import DistInfo, init_distributed, teardown
from phase6.timing import wall

RESULT_TAG = "PHASE6_BENCH_JSON "
ROWS = ("baseline", "hf", "levers", "combined", "accum", "multi", "muon")
DEFAULT_ROWS = ROWS[:-1]
# optim=muon: + 1.52 TFLOP of Newton-Schulz per optimizer step (GPT-2 124M, 5 iterations; phase6.plan.pretrain) at
# NS_EFFICIENCY = 15 % of 989 TFLOP/s = 10.3 ms per step, on ~115 ms (B=64) or ~930 ms (B=64 x 8) of AdamW step.
# Measured 2026-12-01 (one H200): -9.0 % at x1, -3.2 % at x8 (the blind prediction had been -5 % / -0.7 %).
MUON_PREDICTED = {1: "-8% vs AdamW at B x 1 (+10 ms NS)", 8: "-1% vs AdamW at x8 (+10 ms NS)"}


class Budget:
    """Wall-clock budget of the whole run (estimates decide which optional rows still fit)."""

    def __init__(self, total_s: float, clock: Callable[[], float] = wall) -> None:
        self.total_s, self.clock, self.t0 = total_s, clock, clock()

    def left(self) -> float:
        return self.total_s - (self.clock() - self.t0)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="phase6 bench pretrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gpt2_124m", help="model preset in configs/pretrain/model/")
    p.add_argument("--hardware", default="h200", help="peak FLOP/s source in configs/hardware/")
    p.add_argument("--seq-len", type=int, default=1024)
    # named as the config keys (train.micro_batch_size, grad_accum_steps); the old spellings stay accepted
    p.add_argument(
        "--micro-batch-size",
        "--batch-size",
        dest="batch_size",
        type=int,
        default=64,
        help="micro-batch of our rows (and per GPU in multi)",
    )
    p.add_argument(
        "--grad-accum-steps",
        "--accum",
        dest="accum",
        type=int,
        default=8,
        help="micro-steps per optimizer step of the accum / multi rows",
    )
    p.add_argument("--hf-batch-size", type=int, default=32, help="micro-batch of the HF GPT2LMHeadModel row")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma list of: {', '.join(ROWS)}")
    p.add_argument("--levers", default=DEFAULT_LEVERS, help=f"comma list of: {', '.join(LEVERS)}")
    p.add_argument("--combine", default="auto", help="'auto' (the winners), 'none', or a comma list of levers")
    p.add_argument("--min-gain-pct", type=float, default=1.0, help="a lever wins above this gain over the baseline")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the run (optional rows)")
    p.add_argument("--no-compile", action="store_true", help="eager rows (compilation is on by default on CUDA)")
    p.add_argument("--steps", type=int, default=15, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per row (the first compiles)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="profile N more steps of each of our rows: GPU ms per step by kernel type",
    )
    p.add_argument("--out", default=None, help="write the table as JSON here")
    p.add_argument("--worker", choices=["single", "ddp", "fsdp2"], help=argparse.SUPPRESS)  # child process
    p.add_argument("--worker-levers", default="", help=argparse.SUPPRESS)
    p.add_argument("--worker-accums", default="1", help=argparse.SUPPRESS)
    p.add_argument("--worker-label", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = set(args.rows.split(",")) - set(ROWS)
    if bad:
        raise ValueError(f"--rows: unknown rows {sorted(bad)}; use {', '.join(ROWS)}")
    for flag, value in (("--levers", args.levers), ("--combine", args.combine)):
        unknown = [n for n in value.split(",") if n and n not in LEVERS and n not in ("auto", "none")]
        if unknown:
            raise ValueError(f"{flag}: unknown levers {unknown}; known: {', '.join(LEVERS)}")
    for flag in ("batch_size", "accum", "hf_batch_size", "steps", "warmup"):
        if getattr(args, flag) < (0 if flag == "warmup" else 1):
            raise ValueError(f"--{flag.replace('_', '-')}: must be positive, got {getattr(args, flag)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device visible (use --device cpu to exercise the code path)")
    return args


def run_child(
    args: argparse.Namespace, worker: str, levers: tuple[str, ...], accums: list[int], label: str, timeout_s: float
) -> list[dict[str, Any]]:
    """Rows from a child process: `single` (one GPU, for isolate levers) or `ddp` / `fsdp2` under 2-process torchrun.
    The child runs in its own process group, killed as a whole at timeout_s (torchrun's workers included)."""
    child = [
        "-m", "phase6.bench.pretrain",
        "--preset", args.preset, "--hardware", args.hardware, "--seq-len", str(args.seq_len),
        "--micro-batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--device", args.device, "--worker", worker, "--worker-levers", ",".join(levers),
        "--worker-accums", ",".join(map(str, accums)), "--worker-label", label, "--profile", str(args.profile),
    ] + (["--no-compile"] if args.no_compile else [])  # fmt: skip
    if worker != "single":
        child = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *child]
    proc = subprocess.Popen(
        [sys.executable, *child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"killed after {timeout_s:.0f} s (time left in --budget-s)") from None
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        raise RuntimeError(f"{worker} child failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def worker_main(args: argparse.Namespace, mcfg: ModelConfig, hw: HardwareConfig) -> list[dict[str, Any]]:
    """Child process: the rows of one setup, JSON on (rank 0's) stdout."""
    levers = [n for n in args.worker_levers.split(",") if n]
    setup = build_setup(mcfg, base_parallel(args), levers)
    accums = [int(a) for a in args.worker_accums.split(",")]
    mode = "ddp" if args.worker == "single" else args.worker
    info = init_distributed(args.device) if args.worker != "single" else single_info(args)
    try:
        rows = run_setup(args, setup, info, hw.peak_bf16_tflops, accums, args.worker_label, mode=mode)
    finally:
        if args.worker != "single":
            teardown()
    if info.is_main:
        print(RESULT_TAG + json.dumps(rows), flush=True)
    return rows


def single_info(args: argparse.Namespace) -> DistInfo:
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(rank=0, local_rank=0, world_size=1, device=device)


def base_parallel(args: argparse.Namespace) -> ParallelConfig:
    return ParallelConfig(mode="ddp", compile=not args.no_compile and args.device == "cuda")


# ----------------------------------------------------------------------------------------------------------------
# the table


COLUMNS = ("row", "levers", "B", "accum", "GPUs", "tokens/step", "step ms", "tokens/s", "vs baseline %", "MFU %")
COLUMNS += ("peak mem GiB", "compile s", "scaling eff %", "predicted", "note")


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v).replace("|", "/")


def markdown(rows: list[dict[str, Any]]) -> str:
    present = {k for r in rows for k in r}
    cols = [c for c in COLUMNS if c in present] + sorted(present - set(COLUMNS))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    mcfg = ModelConfig(**load_yaml("pretrain/model", args.preset))
    if args.seq_len > mcfg.block_size:
        raise ValueError(f"--seq-len {args.seq_len} exceeds {args.preset} block_size {mcfg.block_size}")
    hw = HardwareConfig(**load_yaml("hardware", args.hardware))
    if args.worker:
        return worker_main(args, mcfg, hw)

    budget = Budget(args.budget_s)
    info = single_info(args)
    device, peak, B, A = info.device, hw.peak_bf16_tflops, args.batch_size, args.accum
    wanted = set(args.rows.split(","))
    lever_names = [n for n in args.levers.split(",") if n] if "levers" in wanted else []
    two_gpus = device.type == "cpu" or torch.cuda.device_count() >= 2  # on CPU the 2 processes run over gloo
    compile_on = base_parallel(args).compile
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"# phase6 bench pretrain: {args.preset}, T={args.seq_len}, {gpu}, torch {torch.__version__}, "
        f"peak {peak} TFLOP/s ({hw.name}), MFU formula {metrics.FLOPS_FORMULA}; budget {args.budget_s:.0f} s",
        flush=True,
    )
    rows: list[dict[str, Any]] = []

    def add(new: list[dict[str, Any]]) -> None:
        for r in new:
            if args.preset == "gpt2_124m" and device.type == "cuda" and "predicted" not in r:
                r["predicted"] = next((p for prefix, p in ROW_PREDICTIONS if r["row"].startswith(prefix)), None)
            rows.append(r)
            keys = ("tokens/s", "MFU %", "compile s", "peak mem GiB", "note")
            shown = ", ".join(f"{k} {fmt(r[k])}" for k in keys if r.get(k) is not None)
            print(f"  [{args.budget_s - budget.left():4.0f} s] {r['row']} ({r['levers']}): {shown}", flush=True)

    def attempt(label: str, levers: str, accums: list[int], gpus: int, fn: Callable[[], list[dict[str, Any]]]) -> None:
        """Run one row group; one that fails stays in the table with its reason and the other rows still run."""
        note = None
        try:
            new = fn()
        except Exception as e:
            msg = str(e).strip().splitlines()
            note = f"error: {type(e).__name__}: {msg[0][:240] if msg else ''}"
        if note is None:
            add(new)
            return
        reset(device)  # after the except block: the traceback no longer holds the failed row's tensors
        add([not_run(label if a == 1 else f"{label}, x{a} accum", levers, B, a, gpus, note) for a in accums])

    # 1. baseline: the reference of every lever and of the budget estimates
    base_setup = build_setup(mcfg, base_parallel(args), [])
    if wanted & {"baseline", "levers"} or (args.combine == "auto" and "combined" in wanted):
        attempt("ours baseline", "-", [1], 1, partial(run_setup, args, base_setup, info, peak, [1], "ours baseline"))
    base = rows[0] if rows and rows[0].get("tokens/s") else None
    compile_ref = max(base["compile s"], 1.0) if base else 60.0
    step_ref = base["step ms"] / 1000 if base else 0.15
    # 2. the HF reference
    if "hf" in wanted:
        attempt("HF GPT2LMHeadModel", "-", [1], 1, lambda: [bench_hf(args, mcfg, info, peak)])

    def timing_s(accum: int) -> float:
        return (args.warmup + args.steps) * step_ref * accum

    def multi_reserve_s() -> float:
        """torchrun start-up + compile + steps, per mode."""
        return 2 * (20.0 + 1.2 * compile_ref + timing_s(A)) if "multi" in wanted and two_gpus else 0.0

    def reserve_s() -> float:
        """Estimated time of the rows that always run after the levers (combined, accum, multi)."""
        combined = compile_ref + timing_s(1) + timing_s(A) if wanted & {"combined", "accum", "multi"} else 0.0
        return combined + multi_reserve_s()

    # 3. each lever alone
    lever_rows: dict[str, dict[str, Any]] = {}
    lever_compile: dict[str, float] = {}
    for name in lever_names:
        lever, label = LEVERS[name], f"ours + {name}"
        left = budget.left() - reserve_s()
        estimate = lever.compile_cost * compile_ref + timing_s(1)
        floor = compile_ref + timing_s(1)  # an isolated lever compiles at least as long as the baseline
        skip = None
        if base is None:
            skip = "skipped: no baseline row to compare with"
        elif lever.needs_cuda and device.type != "cuda":
            skip = "skipped: needs CUDA"
        elif lever.needs_compile and not compile_on:
            skip = "skipped: needs torch.compile (off: --no-compile or CPU)"
        elif (estimate if not lever.isolate else floor) > left:
            skip = f"skipped: est. {estimate:.0f} s > {max(left, 0):.0f} s left in --budget-s"
        if skip:
            add([{**not_run(label, name, B, 1, 1, skip), "predicted": lever.predicted}])
            continue
        setup = build_setup(mcfg, base_parallel(args), [name])
        if lever.isolate:
            reset(device)  # free this process's cached GPU memory for the child
            attempt(label, name, [1], 1, partial(run_child, args, "single", setup.levers, [1], label, left))
        else:
            attempt(label, name, [1], 1, partial(run_setup, args, setup, info, peak, [1], label))
        rows[-1]["predicted"] = lever.predicted
        if rows[-1].get("tokens/s"):
            lever_rows[name] = rows[-1]
            lever_compile[name] = rows[-1]["compile s"]

    # 4. combined (+ the training-shaped accumulation row, the 1-GPU base of the scaling efficiency)
    combined_setup, notes = base_setup, []
    if args.combine == "auto":
        winners = pick_winners(lever_rows, base["tokens/s"], args.min_gain_pct) if base else []
        combined_setup, notes = combine(winners, mcfg, base_parallel(args))
    elif args.combine != "none":
        combined_setup = build_setup(mcfg, base_parallel(args), args.combine.split(","))
    accums = [1] if "combined" in wanted else []
    if wanted & {"accum", "multi"} and A not in accums:
        accums.append(A)
    label = "ours combined"
    if accums:
        levers = "+".join(combined_setup.levers) or "-"
        isolated = [n for n in combined_setup.levers if LEVERS[n].isolate]
        left = budget.left() - multi_reserve_s()
        # an isolated lever's tuning results sit in inductor's on-disk caches now: expect ~40% of its compile again
        estimate = max([compile_ref] + [0.4 * lever_compile.get(n, 4 * compile_ref) for n in isolated])
        estimate += timing_s(1) + timing_s(A)
        if isolated and estimate <= left:
            reset(device)
            attempt(
                label, levers, accums, 1, partial(run_child, args, "single", combined_setup.levers, accums, label, left)
            )
        if isolated and not rows[-1].get("tokens/s") or isolated and estimate > left:
            why = rows[-1]["note"] if estimate <= left else f"est. {estimate:.0f} s > {max(left, 0):.0f} s left"
            kept = tuple(n for n in combined_setup.levers if n not in isolated)
            notes.append(f"without {'+'.join(isolated)} ({why})")
            combined_setup = build_setup(mcfg, base_parallel(args), kept)
            levers = "+".join(kept) or "-"
            isolated = []
        if not isolated:
            attempt(label, levers, accums, 1, partial(run_setup, args, combined_setup, info, peak, accums, label))
        if notes:
            rows[-1]["note"] = "; ".join([rows[-1].get("note", ""), *notes]).strip("; ")
    one_gpu = next((r for r in rows if r["row"].startswith(label) and r["accum"] == A and r["GPUs"] == 1), None)

    # 5. 2-GPU DDP / FSDP2 with the combined config
    if "multi" in wanted and two_gpus:
        for mode in ("ddp", "fsdp2"):
            mlabel = f"ours combined {mode.upper()}"
            timeout = max(budget.left(), 120.0)  # required rows: run even past the budget, but never unbounded
            attempt(
                mlabel,
                "+".join(combined_setup.levers) or "-",
                [A],
                2,
                partial(run_child, args, mode, combined_setup.levers, [A], mlabel, timeout),
            )
            if one_gpu and one_gpu.get("tokens/s") and rows[-1].get("tokens/s"):
                rows[-1]["scaling eff %"] = 100 * rows[-1]["tokens/s"] / (2 * one_gpu["tokens/s"])
    elif "multi" in wanted:
        print("(2-GPU rows skipped: fewer than 2 CUDA devices visible)", flush=True)

    # 6. Muon at the combined config's shapes (its AdamW twins: the baseline / combined row and the accum row)
    if "muon" in wanted:
        macc = [1, A]
        levers = "+".join(combined_setup.levers) or "-"
        mrun = partial(run_setup, args, combined_setup, info, peak, macc, "ours muon", optim="muon")
        attempt("ours muon", levers, macc, 1, mrun)
        for r in rows[-len(macc) :]:
            r["predicted"] = MUON_PREDICTED.get(r["accum"])

    if base:
        for r in rows:
            if r.get("tokens/s"):
                r["vs baseline %"] = 100 * (r["tokens/s"] / base["tokens/s"] - 1)
    profiled = [(r["row"], r.get("step ms"), r.pop("kernel_ms")) for r in rows if "kernel_ms" in r]
    top_kernels = [(r["row"], r.pop("top_kernels")) for r in rows if "top_kernels" in r]
    print("\n" + markdown(rows), flush=True)
    prof_rows = [
        {"row": name, "step ms": ms, **cats, "GPU busy ms": sum(cats.values()), "idle ms": ms - sum(cats.values())}
        for name, ms, cats in profiled
        if cats and ms
    ]
    if prof_rows:
        print(f"\nGPU kernel ms per step (torch.profiler, {args.profile} steps after the timed ones)", flush=True)
        print(markdown(prof_rows), flush=True)
        for name, top in top_kernels:
            if top:
                print(f"\ntop kernels by GPU ms per step: {name}", flush=True)
                print(markdown(top), flush=True)
    if accums:
        print(f"\ncombined config as training overrides: {combined_setup.overrides()}", flush=True)
    print(f"wall time {args.budget_s - budget.left():.0f} s of --budget-s {args.budget_s:.0f}", flush=True)
    if args.out:
        report = {
            "preset": args.preset,
            "seq_len": args.seq_len,
            "device_name": gpu,
            "torch": torch.__version__,
            "peak_tflops": peak,
            "flops_formula": metrics.FLOPS_FORMULA,
            "combined_levers": list(combined_setup.levers),
            "combined_overrides": combined_setup.overrides(),
            "wall_s": args.budget_s - budget.left(),
            "rows": rows,
            "kernel_ms": [{"row": n, "step ms": ms, **c} for n, ms, c in profiled],
            "top_kernels": [{"row": n, "kernels": top} for n, top in top_kernels],
        }
        Path(args.out).write_text(json.dumps(report, indent=2))
    return rows


if __name__ == "__main__":
    main()
