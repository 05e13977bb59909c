"""`phase6 plan calibrate`: measure matmul peak and collective latency/bandwidth, write a hardware profile.

    phase6 plan calibrate --nproc-per-node 2 --hardware h200 --out outputs/calib/h200x2.json      # GPU node (NCCL)
    phase6 plan calibrate --nproc-per-node 2 --sizes 1024,65536 --matmul-size 128 --out /tmp/p.json  # CPU (gloo)
    phase6 plan model=gpt2 hardware=h200 workload=train plan.profile=outputs/calib/h200x2.json       # use it

It launches itself under torchrun (``python -m torch.distributed.run --standalone``); run it on one node per fabric
you want measured (one node: NVLink; one GPU per node on N nodes: the NIC). Per size it times ``--iters`` calls
after ``--warmup`` (max over ranks of the mean) and reports the nccl-tests bus bandwidth (doc/PERFORMANCE.md):
all-reduce busbw = S/t · 2(n-1)/n, all-gather / reduce-scatter busbw = S/t · (n-1)/n (S = the full size).
The profile keeps every point, the small-message floor (median time of sizes <= 8 KiB: ``latency_us``) and the
bus bandwidth at the largest size (``busbw_gbps``); ``phase6.plan.profile`` turns them into the fabric model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from phase6.plan.profile import COLLECTIVES, PROFILE_KIND
from phase6.timing import timed

GPU_SIZES = [8 * 4**i for i in range(14)] + [2**30]  # 8 B ... 512 MiB, then 1 GiB
SMALL_BYTES = 8192


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="phase6 plan calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc-per-node", type=int, default=0, help="ranks (default: CUDA GPUs, else 2)")
    p.add_argument("--out", default="", help="profile JSON path (default outputs/plan/calibrate/<time>/profile.json)")
    p.add_argument("--hardware", default="", help="hardware config name this profile belongs to, e.g. h200")
    p.add_argument("--sizes", default="", help="comma-separated message sizes in bytes (default 8 B .. 1 GiB)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size")
    p.add_argument("--matmul-size", type=int, default=0, help="n of the n x n x n matmul (default 8192 GPU, 256 CPU)")
    p.add_argument("--backend", default="", help="nccl | gloo (default: nccl with CUDA, else gloo)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0:
        raise ValueError(f"calibrate: --iters must be >= 1 and --warmup >= 0, got {a.iters}, {a.warmup}")
    if a.sizes:
        try:
            sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
        except ValueError as e:
            raise ValueError(f"calibrate: --sizes must be comma-separated integers, got {a.sizes!r}") from e
        if not sizes or min(sizes) < 4:
            raise ValueError(f"calibrate: --sizes must be >= 4 bytes each, got {a.sizes!r}")
        a.sizes = sizes
    return a


def cli_main(argv: list[str]) -> Path:
    """Validate arguments, then run the workers under torchrun; returns the profile path."""
    a = parse_args(argv)
    if a.worker:
        worker(a)
        return Path(a.out)
    nproc = a.nproc_per_node
    if nproc <= 0:
        try:
            import torch

            nproc = torch.cuda.device_count() or 2
        except ImportError:
            nproc = 2
    out = Path(a.out or Path("outputs/plan/calibrate") / time.strftime("%Y%m%d-%H%M%S") / "profile.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    forwarded = [x for x in argv if x != "--worker"]
    for flag in ("--out", "--nproc-per-node"):  # re-emitted explicitly below
        while flag in forwarded:
            i = forwarded.index(flag)
            del forwarded[i : i + 2]
    forwarded = [x for x in forwarded if not x.startswith(("--out=", "--nproc-per-node="))]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "phase6.plan.calibrate",
        "--worker",
        "--out",
        str(out),
        *forwarded,
    ]
    print("calibrate: " + " ".join(cmd), file=sys.stderr, flush=True)
    rc = subprocess.run(cmd, check=False).returncode
    if rc != 0 or not out.is_file():
        raise ValueError(f"calibrate: torchrun exited with {rc} and no profile at {out} (see the output above)")
    print(f"profile: {out}", flush=True)
    return out


def _time_calls(fn: Any, iters: int, warmup: int, device: Any) -> float:
    """Seconds per call of ``fn``: ``iters`` calls after ``warmup``, in one CUDA-synchronized region."""
    for _ in range(warmup):
        fn()
    with timed(device) as t:
        for _ in range(iters):
            fn()
    return t.s / iters


def worker(a: argparse.Namespace) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    # torch >= 2.13 renames these to *_single; the old names work on every torch we support (2.11+).
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*_single", category=FutureWarning)
    cuda = torch.cuda.is_available()
    backend = a.backend or ("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group(backend, device_id=device if cuda else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    nodes = max(1, n // int(os.environ.get("LOCAL_WORLD_SIZE", str(n))))

    def max_over_ranks(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # Matmul peak: bf16 on GPU (tensor cores), fp32 on CPU (no fast bf16 GEMM there).
    mm_n = a.matmul_size or (8192 if cuda else 256)
    dtype = torch.bfloat16 if cuda else torch.float32
    x = torch.randn(mm_n, mm_n, device=device, dtype=dtype)
    y = torch.randn(mm_n, mm_n, device=device, dtype=dtype)
    t_mm = _time_calls(lambda p=x, q=y: torch.mm(p, q), a.iters, a.warmup, device)
    mm_tflops = 2 * mm_n**3 / t_mm / 1e12
    mm_tflops = -max_over_ranks(-mm_tflops)  # the slowest rank bounds a synchronous step
    del x, y

    sizes = a.sizes or (GPU_SIZES if cuda else [2**10, 2**14, 2**18, 2**20])
    results: dict[str, Any] = {}
    for name in COLLECTIVES:
        points = []
        for size in sizes:
            elems = max(n, size // 4 // n * n)  # fp32 elements, divisible by n for the sharded collectives
            nbytes = elems * 4
            buf = torch.ones(elems, device=device, dtype=torch.float32)
            if name == "all_reduce":
                fn = lambda b=buf: dist.all_reduce(b)  # noqa: E731
                factor = 2 * (n - 1) / n
            elif name == "all_gather":
                shard = torch.ones(elems // n, device=device, dtype=torch.float32)
                fn = lambda o=buf, s=shard: dist.all_gather_into_tensor(o, s)  # noqa: E731
                factor = (n - 1) / n
            else:
                shard = torch.empty(elems // n, device=device, dtype=torch.float32)
                fn = lambda o=shard, s=buf: dist.reduce_scatter_tensor(o, s)  # noqa: E731
                factor = (n - 1) / n
            t = max_over_ranks(_time_calls(fn, a.iters, a.warmup, device))
            points.append(
                {
                    "bytes": nbytes,
                    "time_us": t * 1e6,
                    "algbw_gbps": nbytes / t / 1e9,
                    "busbw_gbps": nbytes / t / 1e9 * factor,
                }
            )
            del buf
        small = [p["time_us"] for p in points if p["bytes"] <= SMALL_BYTES] or [points[0]["time_us"]]
        results[name] = {
            "points": points,
            "latency_us": statistics.median(small),
            "busbw_gbps": points[-1]["busbw_gbps"],
            "at_bytes": points[-1]["bytes"],
        }
    if rank == 0:
        profile = {
            "kind": PROFILE_KIND,
            "version": 1,
            "date": time.strftime("%Y-%m-%d"),
            "hardware": a.hardware or None,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "backend": backend,
            "world_size": n,
            "nodes": nodes,
            "torch": torch.__version__,
            "iters": a.iters,
            "warmup": a.warmup,
            "matmul": {"n": mm_n, "dtype": str(dtype).replace("torch.", ""), "tflops": mm_tflops},
            "collectives": results,
            "method": "mean of --iters calls after --warmup, max over ranks; busbw per nccl-tests PERFORMANCE.md; "
            f"latency_us = median time of sizes <= {SMALL_BYTES} B; busbw_gbps at the largest size",
        }
        Path(a.out).write_text(json.dumps(profile, indent=2))
        print(f"matmul {mm_n}^3 {profile['matmul']['dtype']}: {mm_tflops:.2f} TFLOP/s")
        print(f"{'collective':15s} {'bytes':>12s} {'time_us':>10s} {'busbw_GB/s':>10s}")
        for name, r in results.items():
            for p in r["points"]:
                print(f"{name:15s} {p['bytes']:12d} {p['time_us']:10.1f} {p['busbw_gbps']:10.2f}")
            print(f"{name:15s} floor {r['latency_us']:.1f} us, busbw {r['busbw_gbps']:.1f} GB/s at {r['at_bytes']} B")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cli_main(sys.argv[1:])
