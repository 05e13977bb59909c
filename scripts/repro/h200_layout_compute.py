"""Per-rank compute of tensor- and context-parallel layouts, timed on one GPU with torch's own TP and CP code.

Reproduces: docs/benchmarks.md § plan: per-rank compute of TP and CP layouts, one H200
(the comparison with the planner's terms is scripts/repro/plan_layout_compute.py: CPU, reads this script's JSON).

Why: two of `phase6 plan validate`'s held-out misses (torchtitan's 2025 Llama-3.1 8B / 70B FSDP·TP8 bf16 rows at 8K)
are decided by terms of one GPU's own work that were priced from counted bytes, never timed: the CP output merges and
ring-attention steps of TP4·CP2, and the batch-first copies around TP8's sequence-parallel collectives. What runs:
- one rank of a ``cp x tp`` mesh over torch's fake process group (``torch.testing._internal.distributed.fake_pg``:
  collectives complete at once and move nothing), so every kernel a rank launches runs on the one GPU and none of the
  communication does. The time measured is a rank's compute; the collectives are the planner's (NCCL, datasheet);
- ``--layers`` torchtitan-style Llama blocks (separate wq/wk/wv/wo and w1/w3/w2, nn.RMSNorm, ``repeat_kv`` before
  SDPA, no RoPE) at the model's full width, bf16 parameters, parallelized with torchtitan's Llama TP plan
  (``parallelize_module``: SequenceParallel norms, PrepareModuleInput Shard(1) -> Replicate, Colwise wq/wk/wv/w1/w3,
  Rowwise wo/w2 with Shard(1) output). DTensor's redistributions therefore run torch's functional all_gather_tensor /
  reduce_scatter_tensor with their batch-first chunk + cat copies, as in torchtitan;
- CP through ``torch.distributed.tensor.experimental.context_parallel`` (load-balanced, torch's default rotation):
  the SDPA calls dispatch to torch's ring attention, with its merges and gradient accumulations, on this rank's chunks;
- activation checkpointing none / full (per block) / selective (torchtitan's op-level policy, from
  h200_plan_memory.py); forward + backward of the blocks, eager (no torch.compile: the planner is compared with its
  eager elementwise count, ``fused_elementwise: false``).
Measured per case: step time (CUDA events, median of ``--iters`` after 2 warm-ups) and one profiled step's kernel
time by kind (GEMM, flash attention, cat copies, other), with the top kernels. A case that fails (OOM, a backend
refusing a shape) is recorded and the sweep goes on; a case that would start past ``--budget-s`` is recorded as
skipped (budget).

Device command (from the repo root; writes layout_compute.json + layout_compute.md to $OUT, prints the table):
    timeout 400 python3 scripts/repro/h200_layout_compute.py --out "$OUT" --budget-s 330
CPU logic check (TP cases only: torch's CP has no sharding rule for the CPU SDPA kernel):
    python scripts/repro/h200_layout_compute.py --out /tmp/lc --smoke
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_plan_memory import MODELS, run_blocks  # noqa: E402  (the AC'd block stack, torchtitan's SAC policy)

SMOKE_MODELS = {"tiny": {"hidden": 256, "heads": 8, "kv_heads": 2, "head_dim": 32, "ffn": 512}}
# (model, seq, micro-batch, tp, cp, AC, rank, layers): the 8K rows' published layout and the planner's #1 at the
# published local batch and recompute, both CP ranks (load balancing gives them different ring paths); then the
# long-sequence CP rows (torchtitan 8B, 64K CP2 / 128K CP4 / 256K CP8, micro-batch 1, full AC) beside TP of the same degree.
CASES = [
    ("llama3.1-8b", 8192, 12, 8, 1, "selective", 0, 2),
    ("llama3.1-8b", 8192, 12, 4, 2, "selective", 0, 2),
    ("llama3.1-8b", 8192, 12, 4, 2, "selective", 1, 2),
    ("llama3.1-70b", 8192, 16, 8, 1, "full", 0, 1),
    ("llama3.1-70b", 8192, 16, 4, 2, "full", 0, 1),
    ("llama3.1-70b", 8192, 16, 4, 2, "full", 1, 1),
    ("llama3.1-8b", 65536, 1, 1, 2, "full", 0, 2),
    ("llama3.1-8b", 65536, 1, 1, 2, "full", 1, 2),
    ("llama3.1-8b", 65536, 1, 2, 1, "full", 0, 2),
    ("llama3.1-8b", 131072, 1, 1, 4, "full", 0, 1),
    ("llama3.1-8b", 131072, 1, 1, 4, "full", 3, 1),
    ("llama3.1-8b", 131072, 1, 4, 1, "full", 0, 1),
    ("llama3.1-8b", 262144, 1, 1, 8, "full", 0, 1),
    ("llama3.1-8b", 262144, 1, 1, 8, "full", 7, 1),
    ("llama3.1-8b", 262144, 1, 8, 1, "full", 0, 1),
    # the 8K rows' other CP splits (1K and 512-token half chunks), added after the first run put TP2·CP4 first
    ("llama3.1-8b", 8192, 12, 2, 4, "selective", 0, 2),
    ("llama3.1-8b", 8192, 12, 2, 4, "selective", 3, 2),
    ("llama3.1-8b", 8192, 12, 1, 8, "selective", 0, 2),
    ("llama3.1-8b", 8192, 12, 1, 8, "selective", 7, 2),
    ("llama3.1-70b", 8192, 16, 2, 4, "full", 0, 1),
    ("llama3.1-70b", 8192, 16, 2, 4, "full", 3, 1),
]
SMOKE_CASES = [("tiny", 256, 2, 2, 1, "none", 0, 2), ("tiny", 256, 2, 2, 1, "full", 1, 2)]
SMOKE_CASES += [("tiny", 256, 2, 2, 1, "selective", 0, 2)]


class Attention(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.wq = nn.Linear(h, heads * head_dim, bias=False)
        self.wk = nn.Linear(h, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(h, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # local heads under TP: view(..., -1, head_dim), as torchtitan does
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        rep = q.shape[2] // k.shape[2]  # torchtitan's repeat_kv: expand + reshape (a copy) to the query heads
        if rep > 1:
            k = k[:, :, :, None, :].expand(b, t, k.shape[2], rep, self.head_dim).reshape(b, t, -1, self.head_dim)
            v = v[:, :, :, None, :].expand(b, t, v.shape[2], rep, self.head_dim).reshape(b, t, -1, self.head_dim)
        o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        self.attention_norm = nn.RMSNorm(s["hidden"], eps=1e-5)
        self.attention = Attention(s["hidden"], s["heads"], s["kv_heads"], s["head_dim"])
        self.ffn_norm = nn.RMSNorm(s["hidden"], eps=1e-5)
        self.feed_forward = FeedForward(s["hidden"], s["ffn"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def sdpa(q, k, v):
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def tp_plan() -> dict:
    """torchtitan's Llama block plan (torchtitan/models/llama3/infra/parallelize.py apply_tp), bf16 (no Float8)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    prep = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))  # noqa: E731
    return {
        "attention_norm": SequenceParallel(),
        "attention": prep(),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prep(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def kernel_kind(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n:
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "matmul")):
        return "gemm"
    if "catarraybatchedcopy" in n or "cat_" in n:
        return "cat"
    return "other"


def run_case(case: tuple, dev: str, iters: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    model, seq, mb, tp, cp, ac, rank, layers = case
    s = {**MODELS, **SMOKE_MODELS}[model]
    rec = {"model": model, "seq": seq, "micro_batch": mb, "tp": tp, "cp": cp, "ac": ac, "rank": rank}
    rec.update({"layers": layers, "hidden": s["hidden"], "heads": s["heads"], "kv_heads": s["kv_heads"]})
    rec.update({"head_dim": s["head_dim"], "ffn": s["ffn"]})
    blocks = x = None
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp * cp)
        mesh = init_device_mesh(dev, (cp, tp), mesh_dim_names=("cp", "tp"))
        t0 = time.monotonic()
        with torch.device(dev):
            blocks = nn.ModuleList(Block(s) for _ in range(layers)).to(torch.bfloat16)
        for b in blocks:
            parallelize_module(b, mesh["tp"], tp_plan()) if tp > 1 else None
        rec["init_s"] = round(time.monotonic() - t0, 3)
        rec["rank_params"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in blocks[0].parameters()
        )
        # The rank's input: its sequence-parallel slice of its CP chunks, [mb, seq / (cp tp), h]. As in torchtitan,
        # context_parallel shards the step's token ids (here a [mb, seq] dummy), not a hidden-size tensor.
        x = torch.randn(mb, seq // (cp * tp), s["hidden"], dtype=torch.bfloat16, device=dev)
        ids = torch.zeros(mb, seq, dtype=torch.long, device=dev)

        def step() -> None:
            if cp > 1:
                with context_parallel(mesh["cp"], buffers=[ids], buffer_seq_dims=[1]):
                    fwd_bwd()
            else:
                fwd_bwd()

        def fwd_bwd() -> None:
            h = run_blocks(blocks, x.detach().requires_grad_(), ac)
            h.backward(torch.ones_like(h))
            for p in blocks.parameters():
                p.grad = None

        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        for _ in range(2):
            step()
        sync()
        times = []
        for _ in range(iters):
            if dev == "cuda":
                a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                e.record()
                sync()
                times.append(a.elapsed_time(e) / 1e3)
            else:
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
        rec["step_s"] = statistics.median(times)
        rec["step_s_all"] = [round(t, 6) for t in times]
        if dev == "cuda":
            rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                sync()
            kinds: dict[str, float] = {}
            kernels: dict[str, list] = {}
            for ev in prof.events():
                if ev.device_type.name != "CUDA":
                    continue
                us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
                kinds[kernel_kind(ev.name)] = kinds.get(kernel_kind(ev.name), 0.0) + us / 1e6
                k = kernels.setdefault(ev.name[:120], [0, 0.0])
                k[0] += 1
                k[1] += us / 1e6
            rec["kernel_s"] = {k: round(v, 6) for k, v in sorted(kinds.items())}
            rec["top_kernels"] = [
                {"name": n, "calls": c, "s": round(t, 6), "kind": kernel_kind(n)}
                for n, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:25]
            ]
        rec["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        rec["status"] = "OOM"
        rec["error"] = str(e).splitlines()[0][:300]
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError) as e:
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    finally:
        blocks = x = None  # noqa: F841  (freed before the next case's empty_cache)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
        if dev == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return rec


def run_isolated(case: tuple, a: argparse.Namespace) -> dict:
    """One case in its own process: DeviceMesh and the functional collectives cache process groups by name, so a
    second fake group in one process fails ("Could not resolve the process group registered under the name 1", the
    2026-12-02 10:20 UTC run); a fresh process also starts each case with an empty CUDA cache."""
    cmd = [sys.executable, __file__, "--out", a.out, "--iters", str(a.iters), "--case", json.dumps(case)]
    cmd += ["--smoke"] if a.smoke else []
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60.0, a.budget_s))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])
    keys = ("model", "seq", "micro_batch", "tp", "cp", "ac", "rank", "layers")
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
    return {**dict(zip(keys, case, strict=True)), "status": "error", "error": f"rc {p.returncode}: {tail[0][:300]}"}


def table(records: list[dict]) -> str:
    head = (
        "| model | seq | mb | tp | cp | AC | rank | layers | step ms/layer | GEMM | attention | cat | other | status |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in records:
        per = lambda v, n=r["layers"]: f"{1e3 * v / n:.1f}"  # noqa: E731
        ks = r.get("kernel_s", {})
        cells = [per(ks[k]) if k in ks else "-" for k in ("gemm", "attention", "cat", "other")]
        step = per(r["step_s"]) if "step_s" in r else "-"
        lines.append(
            f"| {r['model']} | {r['seq']} | {r['micro_batch']} | {r['tp']} | {r['cp']} | {r['ac']} | {r['rank']} | "
            f"{r['layers']} | {step} | {' | '.join(cells)} | {r['status']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for layout_compute.json and layout_compute.md")
    ap.add_argument("--budget-s", type=float, default=330.0, help="no case starts after this many seconds")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, TP cases only: a logic check")
    ap.add_argument("--select", help="comma-separated indices into CASES (default: all)")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case (JSON list) and print its record
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() and not a.smoke:
        print("h200_layout_compute: no CUDA device (use --smoke for a CPU logic check)", file=sys.stderr)
        return 2
    dev = "cpu" if a.smoke else "cuda"
    importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers the "fake" backend

    if a.case:
        print(json.dumps(run_case(tuple(json.loads(a.case)), dev, a.iters)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    meta = {
        "script": "scripts/repro/h200_layout_compute.py",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "iters": a.iters,
    }
    records = []
    todo = SMOKE_CASES if a.smoke else CASES
    if a.select:
        todo = [todo[int(i)] for i in a.select.split(",")]
    for case in todo:
        if time.monotonic() - t0 > a.budget_s:
            keys = ("model", "seq", "micro_batch", "tp", "cp", "ac", "rank", "layers")
            records.append({**dict(zip(keys, case, strict=True)), "status": "skipped (budget)"})
            continue
        rec = run_isolated(case, a)
        rec["elapsed_s"] = round(time.monotonic() - t0, 1)
        records.append(rec)
        keys = ("model", "tp", "cp", "rank", "step_s", "kernel_s", "status", "error")
        print(json.dumps({k: rec[k] for k in keys if k in rec}), flush=True)
        (out / "layout_compute.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    md = table(records)
    (out / "layout_compute.md").write_text(md + "\n")
    print(md)
    return 0 if all(r["status"] in ("ok", "skipped (budget)") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
