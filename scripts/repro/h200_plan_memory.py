"""Per-GPU training memory of real Llama-3.1 shard shapes on one GPU, for `phase6 plan`'s memory model (issue 30).

Reproduces docs/benchmarks.md "## plan memory measured on one H200 (issue 30)": the fit that turns this script's JSON
into the table there is scripts/repro/plan_memory_fit.py (CPU, reads the JSON, compares with phase6.plan.memory).

What runs, per case (torch only, no phase6 import, so it runs from a bare checkout on the device):
- a stack of ``--layers`` Llama decoder blocks of Llama-3.1-8B / 70B / 405B at the width one tensor-parallel rank holds
  at TP 1/2/4/8 (query heads, KV heads and the MLP width divided by TP; hidden size whole), torchtitan's projections
  (separate wq, wk, wv, wo, w1, w3, w2), bf16 parameters and gradients, sequence 8192, micro-batch 1;
- sequence parallelism as torchtitan runs it for TP > 1: norms and residuals on seq/TP tokens, an all-gather (emulated
  by ``repeat``) before the QKV and w1/w3 projections, a reduce-scatter (emulated by a sum over the TP chunks) after
  the wo and w2 projections - the gathered GEMM input is what the matmul saves for its backward;
- fused RMSNorm (saves its input and one fp32 rstd per row, as a compiled/TE norm does), SwiGLU as torchtitan's eager
  ``silu(w1 x) * w3 x``, flash attention (SDPA flash backend, GQA without expanding K/V when torch allows it); no RoPE;
- activation checkpointing none / selective (torchtitan op-level SAC: every other mm output and the attention output
  saved) / full (each block's input only);
- plain (no ZeRO-3): every bf16 grad preallocated, the steady state of gradient accumulation (micro-batch 2 of m),
  which is what the planner's params + grads + activations sum describes;
- ``zero3``: a ZeRO-3 / FSDP2-style layer: the layer's bf16 params live in one flat buffer whose storage is freed after
  the layer's forward and re-allocated (all-gather emulated, shard 1/8 kept) before its backward; one layer prefetched
  ahead in forward and backward (FSDP2's default); when a block's gradients are all accumulated (bf16), FSDP2's
  post_backward order: the block is resharded, the previous block's fp32 reduce-scatter input is reclaimed, the grads
  are copied into a new fp32 reduce-scatter input of the block's size (reduce_dtype fp32), folded into the 1/8 fp32
  shard (reduce-scatter emulated), and that input is kept in flight until the next block's reduce
  (reduce_scatter_max_input_buffers = 1).
Measured per case: parameter bytes, bytes saved for backward (allocated after forward - before), peak allocated and
peak reserved over forward+backward (torch.cuda.max_memory_{allocated,reserved} after a reset and empty_cache). An
out-of-memory case is recorded as OOM and the sweep goes on; cases that would start past ``--budget-s`` are recorded
as skipped (budget). Memory does not depend on timing, so each case runs once (after one small warm-up case).
Cases run cheapest first (``case_cost``; the table keeps its order), so a budget cut drops the largest shapes.

Time per case: the weights are created and initialised on the GPU. The first H200 run (2026-12-02 01:07 UTC) built
them on the CPU (bf16 ``normal_`` then ``.to(cuda)``): 7 cases in 88.6 s, 25-28 s per 1e9 parameters in every case
whatever the AC mode (full AC does 1/3 more GEMM work and took no longer), while the step of the largest of them
(8B TP1, 6.5e8 parameters) is ~0.1 s of GEMMs. Predicted now: GEMMs ~ 6-8 x rank params x 8192 tokens at ~600
TFLOP/s = 0.01-1.1 s per case (405B TP1 full the largest), plus ~0.05 s of device init / cudaMalloc after the
per-case empty_cache; ~15 s of compute for all 72, ~20-35 s with CUDA start-up. ``init_s`` and ``step_s`` per case
are in the JSON so the next run shows where its time went.

Device command (from the repo root of a checkout; writes plan_memory.json + plan_memory.md to $OUT, prints the table):
    timeout 100 python3 scripts/repro/h200_plan_memory.py --out "$OUT" --budget-s 85
(or from the carry folder: mkdir -p $OUT/i30 && timeout 100 python3 .device/i30/h200_plan_memory.py --out $OUT/i30 --budget-s 85)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

GIB = 2**30
DEV = "cuda"
MODELS = {  # HF config.json fields of meta-llama/Llama-3.1-{8B,70B,405B}
    "llama3.1-8b": {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 14336},
    "llama3.1-70b": {"hidden": 8192, "heads": 64, "kv_heads": 8, "head_dim": 128, "ffn": 28672},
    "llama3.1-405b": {"hidden": 16384, "heads": 128, "kv_heads": 8, "head_dim": 128, "ffn": 53248},
}
SMOKE_MODELS = {"tiny": {"hidden": 256, "heads": 8, "kv_heads": 2, "head_dim": 32, "ffn": 512}}


class _Mem:
    """torch.cuda memory counters; zeros on CPU (--smoke, a logic check only: its numbers mean nothing)."""

    def __getattr__(self, name):
        if DEV == "cuda":
            return getattr(torch.cuda, name)
        return lambda *a, **k: 0


MEM = _Mem()


class RMSNormFn(torch.autograd.Function):
    """Fused RMSNorm: saves the bf16 input and one fp32 rstd per row (what a compiled or TE norm keeps)."""

    @staticmethod
    def forward(ctx, x, w, eps=1e-5):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (xf * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, g):
        x, w, rstd = ctx.saved_tensors
        xf, gf = x.float(), g.float()
        xhat = xf * rstd
        gw = (gf * xhat).sum(0).to(w.dtype)
        gx = gf * w.float()
        gx = rstd * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


class Block(torch.nn.Module):
    """One Llama decoder block at one TP rank's width, torchtitan-style sequence parallelism for tp > 1."""

    def __init__(self, shape: dict, tp: int, seq: int):
        super().__init__()
        h, d = shape["hidden"], shape["head_dim"]
        self.tp, self.seq = tp, seq
        self.hq, self.hkv = shape["heads"] // tp, max(1, shape["kv_heads"] // tp)
        self.d, self.f = d, shape["ffn"] // tp
        # Created and initialised on the device: the 2026-12-02 01:07 run built them on the CPU (normal_ on bf16 CPU
        # tensors, then .to(cuda)), ~25 s per 1e9 parameters, which was its whole ~12 s/case (the step is < 1 s).
        mk = lambda *s: torch.nn.Parameter(torch.empty(*s, dtype=torch.bfloat16, device=DEV).normal_(0, 0.02))  # noqa: E731
        # torchtitan's Llama: separate wq / wk / wv and w1 / w3 (so op-level SAC counts 7 mms per block as it does)
        self.attn_norm = torch.nn.Parameter(torch.ones(h, dtype=torch.bfloat16, device=DEV))
        self.wq = mk(self.hq * d, h)
        self.wk = mk(self.hkv * d, h)
        self.wv = mk(self.hkv * d, h)
        self.wo = mk(h, self.hq * d)
        self.mlp_norm = torch.nn.Parameter(torch.ones(h, dtype=torch.bfloat16, device=DEV))
        self.w1 = mk(self.f, h)
        self.w3 = mk(self.f, h)
        self.w2 = mk(h, self.f)

    def gather(self, x):  # SP all-gather: [s/tp, h] -> [s, h]
        return x.repeat(self.tp, 1) if self.tp > 1 else x

    def scatter(self, y):  # SP reduce-scatter: [s, h] partial sums -> [s/tp, h]
        return y.view(self.tp, -1, y.shape[-1]).sum(0) if self.tp > 1 else y

    def forward(self, x):
        s = self.seq
        a = self.gather(RMSNormFn.apply(x, self.attn_norm))
        q = (a @ self.wq.t()).view(1, s, self.hq, self.d).transpose(1, 2)
        k = (a @ self.wk.t()).view(1, s, self.hkv, self.d).transpose(1, 2)
        v = (a @ self.wv.t()).view(1, s, self.hkv, self.d).transpose(1, 2)
        o = sdpa(q, k, v).transpose(1, 2).reshape(s, self.hq * self.d)
        x = x + self.scatter(o @ self.wo.t())
        m = self.gather(RMSNormFn.apply(x, self.mlp_norm))
        return x + self.scatter((F.silu(m @ self.w1.t()) * (m @ self.w3.t())) @ self.w2.t())


GQA_MODE = {"mode": None}


def sdpa(q, k, v):
    """Flash attention (causal); GQA native when the backend takes enable_gqa, else K/V expanded (recorded)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.shape[1] != k.shape[1] and GQA_MODE["mode"] != "expand":
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            GQA_MODE["mode"] = "flash enable_gqa"
            return out
        except (RuntimeError, TypeError):
            GQA_MODE["mode"] = "expand"
    if q.shape[1] != k.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sac_context():
    """torchtitan op-level selective AC: save every other mm output and the attention outputs, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {
        aten.mm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,  # --smoke on CPU
        aten.max.default,
    }
    if hasattr(torch.ops, "_c10d_functional"):  # torchtitan's list saves TP's reduce-scatter outputs too
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    count = {"fwd": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "fwd"
        if func == aten.mm.default:
            count[key] += 1
        to_save = func in save and not (func == aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def run_blocks(blocks, h: torch.Tensor, ac: str) -> torch.Tensor:
    """The blocks' forward under activation checkpointing none / selective (``sac_context``) / full (per block)."""
    for b in blocks:
        if ac == "full":
            h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False)
        elif ac == "selective":
            h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False, context_fn=sac_context)
        else:
            h = b(h)
    return h


class Zero3:
    """FSDP-style parameter lifetime for a list of blocks: flat bf16 buffer per block, freed after its forward,
    re-allocated before its backward (one block prefetched ahead both ways); a block's bf16 grads are kept until all
    are accumulated, then copied into one fp32 reduce-scatter input, folded into the 1/dp fp32 shard and dropped."""

    def __init__(self, blocks: list[Block], dp: int):
        self.blocks, self.dp, self.phase = blocks, dp, "fwd"
        self.flat, self.shards, self.grad_shards, self.pending = [], [], [], []
        self.rs_inflight: torch.Tensor | None = None  # the previous block's reduce-scatter input (FSDP2 keeps one)
        self.handles: list = []  # hooks; held from C++ (invisible to Python's GC), so close() removes them
        for i, b in enumerate(blocks):
            ps = list(b.parameters())
            n = sum(p.numel() for p in ps)
            flat = torch.empty(n, dtype=torch.bfloat16, device=DEV)
            off = 0
            for p in ps:
                flat[off : off + p.numel()].copy_(p.data.view(-1))
                p.data = flat[off : off + p.numel()].view(p.shape)
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))
                off += p.numel()
            shard_n = math.ceil(n / dp)
            self.flat.append(flat)
            self.shards.append(flat[:shard_n].clone())
            self.grad_shards.append(torch.zeros(shard_n, dtype=torch.float32, device=DEV))
            self.pending.append(len(ps))
            self._free(i)
            self.handles.append(b.register_forward_pre_hook(self._pre_fwd(i)))
            self.handles.append(b.register_forward_hook(self._post_fwd(i)))

    def close(self) -> None:
        """Break the param -> hook -> self -> blocks cycle: its grad hooks live in C++, where the cyclic GC cannot see
        them, so without this every ZeRO-3 case's blocks, buffers and shards stayed allocated for the rest of the run
        (the 2026-12-02 03:45 UTC run: base memory grew case by case and the 405B TP1 cases OOMed)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.blocks = self.flat = self.shards = self.grad_shards = []
        self.rs_inflight = None

    def _gathered(self, i: int) -> bool:
        return self.flat[i].untyped_storage().size() > 0

    def _gather(self, i: int) -> None:
        if 0 <= i < len(self.flat) and not self._gathered(i):
            self.flat[i].untyped_storage().resize_(self.flat[i].numel() * 2)  # all-gather output buffer

    def _free(self, i: int) -> None:
        self.flat[i].untyped_storage().resize_(0)

    def _pre_fwd(self, i):
        def hook(mod, args):
            self._gather(i)
            if self.phase == "fwd":
                self._gather(i + 1)  # prefetch

        return hook

    def _post_fwd(self, i):
        def hook(mod, args, out):
            if self.phase == "fwd":
                self._free(i)
                out.register_hook(lambda g: (self._gather(i), self._gather(i - 1), g)[-1])

        return hook

    def _grad_hook(self, i):
        def hook(p):
            self.pending[i] -= 1
            if self.pending[i] == 0:  # FSDP2's FSDPParamGroup.post_backward, in its order:
                ps = list(self.blocks[i].parameters())
                grads = [q.grad for q in ps]
                for q in ps:
                    q.grad = None
                self._free(i)  # 1. reshard (the block's gathered params freed) before the reduce
                self.rs_inflight = None  # 2. the previous block's reduce-scatter input reclaimed (max 1 in flight)
                flat32 = torch.empty(self.flat[i].numel(), dtype=torch.float32, device=DEV)  # 3. copy-in, fp32
                off = 0
                for g in grads:
                    flat32[off : off + g.numel()].copy_(g.view(-1))
                    off += g.numel()
                del grads, g  # the unsharded bf16 grads dropped after the copy-in
                self.grad_shards[i].add_(flat32[: self.grad_shards[i].numel()])  # this rank's 1/dp (emulated)
                self.rs_inflight = flat32  # 4. kept until the next block's reduce (ReduceScatterState)
                self.pending[i] = len(ps)

        return hook


def run_case(model: str, tp: int, ac: str, zero3: bool, layers: int, seq: int, dp: int) -> dict:
    shape = {**MODELS, **SMOKE_MODELS}[model]
    rec = {"model": model, "tp": tp, "ac": ac, "zero3": zero3, "zero3_dp": dp if zero3 else 1, "layers": layers}
    rec.update({"seq": seq, "micro_batch": 1, "hidden": shape["hidden"], "heads_local": shape["heads"] // tp})
    rec.update({"kv_heads_local": max(1, shape["kv_heads"] // tp), "ffn_local": shape["ffn"] // tp})
    # what the emulation is, for the fit's formula: torchtitan SP (gathered GEMM inputs saved), eager SwiGLU, and
    # grads preallocated (plain) or FSDP2 buffers (zero3)
    rec.update({"sp": "gathered", "swiglu": "eager", "grads": "fsdp2" if zero3 else "preallocated"})
    rec["head_dim"] = shape["head_dim"]
    blocks = x = y = z3 = None
    gc.collect()  # selective AC's checkpoint contexts hold the blocks in reference cycles until the cyclic GC runs
    MEM.empty_cache()
    base = MEM.memory_allocated()
    rec["base_bytes"] = base  # allocated before the case (cuBLAS workspace etc.); the byte fields are relative to it
    try:
        t_init = time.monotonic()
        blocks = [Block(shape, tp, seq) for _ in range(layers)]
        rec["param_bytes_per_layer"] = sum(p.numel() * 2 for p in blocks[0].parameters())
        if zero3:
            z3 = Zero3(blocks, dp)
        else:  # gradient accumulation's steady state (micro-batch 2 of m): every bf16 grad already allocated
            for b in blocks:
                for p in b.parameters():
                    p.grad = torch.zeros_like(p)
        MEM.synchronize()
        rec["init_s"] = round(time.monotonic() - t_init, 3)
        t_step = time.monotonic()
        x = torch.randn(seq // tp, shape["hidden"], dtype=torch.bfloat16, device=DEV, requires_grad=True)
        g_out = torch.randn_like(x)
        MEM.empty_cache()
        MEM.reset_peak_memory_stats()
        before = MEM.memory_allocated()
        rec["resident_bytes"] = before - base  # params (+ shards) + input + output grad
        h = run_blocks(blocks, x, ac)
        MEM.synchronize()
        rec["saved_bytes"] = MEM.memory_allocated() - before  # saved for backward + the output
        rec["fwd_peak_allocated_bytes"] = MEM.max_memory_allocated() - base
        if z3:
            z3.phase = "bwd"
            z3._gather(layers - 1)  # FSDP2 keeps the root's last block; its output hook may not fire on the root
        h.backward(g_out)
        MEM.synchronize()
        rec["step_s"] = round(time.monotonic() - t_step, 3)
        rec["peak_allocated_bytes"] = MEM.max_memory_allocated() - base
        rec["peak_reserved_bytes"] = MEM.max_memory_reserved()
        rec["after_bytes"] = MEM.memory_allocated() - base  # params + grads (or shards) + input grad
        rec["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        rec["status"] = "OOM"
        rec["error"] = str(e).splitlines()[0][:300]
    except RuntimeError as e:  # a backend refusing a shape: recorded, the sweep goes on
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    finally:
        if z3 is not None:
            z3.close()
        del blocks, x, y, z3
        h = g_out = None  # noqa: F841
        gc.collect()
        MEM.synchronize()
        MEM.empty_cache()
    return rec


def cases(layers: int, names: list[str]) -> list[tuple]:
    out = []
    for zero3 in (False, True):
        for model in names:
            for tp in (1, 2, 4, 8):
                for ac in ("none", "selective", "full"):
                    out.append((model, tp, ac, zero3, layers))
    return out


def case_cost(case: tuple) -> tuple:
    """Run order: the step's GEMM work is ~6 x (params of one TP rank's blocks) x seq, so cheapest first; a ZeRO-3 case
    right after its plain twin (the fit compares the two). If the budget bites, the largest shapes are the ones cut."""
    model, tp, ac, zero3, layers = case
    sh = {**MODELS, **SMOKE_MODELS}[model]
    h, d, hq, hkv, f = sh["hidden"], sh["head_dim"], sh["heads"] // tp, max(1, sh["kv_heads"] // tp), sh["ffn"] // tp
    params = layers * (h * d * (2 * hq + 2 * hkv) + 3 * h * f)
    return (params * {"none": 6, "selective": 7, "full": 8}[ac], zero3)


def table(records: list[dict]) -> str:
    cols = "| model | tp | ac | zero3 | layers | params GiB/layer | saved GiB | peak alloc GiB | peak reserved GiB | status |"
    lines = [cols, "|" + "---|" * 10]
    g = lambda r, k: f"{r[k] / GIB:.2f}" if k in r else "-"  # noqa: E731
    for r in records:
        lines.append(
            f"| {r['model']} | {r['tp']} | {r['ac']} | {'yes' if r['zero3'] else 'no'} | {r['layers']} | "
            f"{g(r, 'param_bytes_per_layer')} | {g(r, 'saved_bytes')} | {g(r, 'peak_allocated_bytes')} | "
            f"{g(r, 'peak_reserved_bytes')} | {r['status']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for plan_memory.json and plan_memory.md")
    ap.add_argument("--budget-s", type=float, default=85.0, help="no case starts after this many seconds")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--dp", type=int, default=8, help="ZeRO-3 shard count emulated")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU allowed: checks the code paths only")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if not torch.cuda.is_available() and not a.smoke:
        print("h200_plan_memory: no CUDA device (use --smoke for a CPU logic check)", file=sys.stderr)
        return 2
    DEV = "cuda" if torch.cuda.is_available() else "cpu"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    meta = {
        "script": "scripts/repro/h200_plan_memory.py",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "gpu": torch.cuda.get_device_properties(0).name if DEV == "cuda" else "cpu (smoke)",
        "hbm_bytes": torch.cuda.get_device_properties(0).total_memory if DEV == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "seq": a.seq,
        "layers": a.layers,
        "zero3_dp": a.dp,
        "budget_s": a.budget_s,
        "smoke": a.smoke,
    }
    torch.empty(1, device=DEV)
    meta["context_reserved_bytes"] = torch.cuda.memory_reserved() if DEV == "cuda" else None
    names = list(SMOKE_MODELS) if a.smoke else list(MODELS)
    warm = run_case(names[0], 8 if not a.smoke else 2, "selective", False, 1, 1024 if not a.smoke else 64, a.dp)
    meta["warmup_status"] = warm["status"]
    todo = cases(a.layers, names)
    records: list[dict] = [{}] * len(todo)  # written in the table's order, run cheapest first
    for i in sorted(range(len(todo)), key=lambda j: case_cost(todo[j])):
        c = todo[i]
        if time.monotonic() - t0 > a.budget_s:
            records[i] = {"model": c[0], "tp": c[1], "ac": c[2], "zero3": c[3], "layers": c[4]}
            records[i]["status"] = "skipped (budget)"
            continue
        t = time.monotonic()
        r = run_case(*c, seq=a.seq, dp=a.dp)
        r["wall_s"] = round(time.monotonic() - t, 2)
        records[i] = r
    meta["gqa_mode"] = GQA_MODE["mode"]
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["note"] = "bytes are relative to the allocation before the case; peak_reserved_bytes is torch's whole pool"
    (out / "plan_memory.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    md = table(records)
    (out / "plan_memory.md").write_text(f"# plan memory on {meta['gpu']} ({meta['date_utc']} UTC)\n\n{md}\n")
    print(json.dumps({k: meta[k] for k in ("gpu", "torch", "gqa_mode", "wall_s", "warmup_status")}))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
