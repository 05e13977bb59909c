"""6B engine benchmark: one prefill step of the torch-tp server, eager vs ``--compile-prefill``, on one GPU.

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    python projects/6b_serving/bench_prefill.py --model outputs/models/qwen2.5-14b --out prefill.json

What it times: ``Engine._prefill`` (the server's own prefill path: padded (n, width) batch, 4-D mask, slot KV cache,
last-token logits) on random weights, CUDA-synchronized at both ends (``phase6.timing.timed``); the median of ``--repeat``
steps after one warm step per shape. Each shape is run eagerly and compiled (the same engine; the compiled graphs
are built once by ``warm_prefill`` before any timing). Its columns:

- ``eager_cacheview_ms``: eager, attention through the slot cache's row views (the server's prefill before
  ``--compile-prefill``; ``_prefill(fresh=False)``); ``eager_ms``: eager, attention on the step's own K/V.
- ``eager_ms`` / ``compiled_ms``: wall time of one step (~70 dispatched ops per layer eagerly, a few fused kernels
  compiled).
- ``gpu_bound_ms``: the step if only the GPU's arithmetic counted, FLOPs / peak:
  FLOPs = 2 * N_params_without_embeddings * n * width + 4 * L * n * width^2 * H * d_head (matmuls of every padded
  token, plus the full width x width attention the masked SDPA computes), peak = ``--peak-tflops`` (789.6: bf16
  matmul peak that ``phase6 plan calibrate`` measured on an H200).
- ``compiled_vs_bound``: compiled_ms / gpu_bound_ms (1.0 = all arithmetic at the matmul peak).

``--new-widths K`` adds the first-time-shape check (the fleet simulator's "new-shape cost", calibrated at C=16): K
one-prompt prefills, each at a width not run before (the first pass), then the same K widths again (the second
pass); p50 of each pass, eager and compiled. Run it once more under
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` to see whether the caching allocator is the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from phase6.serving.tp_server import ServerArgs
from phase6.serving.tp_server.engine import Engine
from phase6.serving.tp_server.model import build_model
from phase6.timing import timed


def one_step_ms(engine: Engine, prompts: list[list[int]], fresh: bool = True) -> float:
    """Wall time of one prefill step, GPU work included."""
    with timed("cuda") as t:
        engine._prefill(prompts, 0, fresh)
    return t.s * 1e3


def step_ms(engine: Engine, prompts: list[list[int]], compiled: bool, repeat: int, fresh: bool = True) -> float:
    """Median of `repeat` steps after a warm one (the first run of a shape: allocator, cuBLAS heuristics)."""
    engine.compile_prefill = compiled
    one_step_ms(engine, prompts, fresh)
    return statistics.median(one_step_ms(engine, prompts, fresh) for _ in range(repeat))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model directory or config.json (random weights)")
    p.add_argument("--shapes", default="1x128,1x600,1x1000,2x600,4x900,8x1000", help="n x width, comma-separated")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--peak-tflops", type=float, default=789.6)
    p.add_argument("--new-widths", type=int, default=0, help="K: first-time vs repeated widths (0 = skip)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    a = p.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    model_path = Path(a.model)
    config = model_path / "config.json" if model_path.is_dir() else model_path
    args = ServerArgs(
        model=str(config), dummy_weights=True, max_batch=max(8, *(n for n, _ in shapes)), max_model_len=4096
    )
    dev = torch.device("cuda", 0)
    model = build_model(args, dev, torch.bfloat16)
    cfg = model.config
    engine = Engine(model, args, dev, 0, 1, None, compile_prefill=True)
    with torch.inference_mode():
        took, graphs = engine.warm_prefill()
        print(f"compiled the prefill: {graphs} graphs in {took:.1f} s")
        n_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
        heads, layers = cfg.num_attention_heads, cfg.num_hidden_layers
        d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        rows = []
        for n, w in shapes:
            prompts = [[(7 * i + j) % cfg.vocab_size for j in range(w)] for i in range(n)]
            cacheview = step_ms(engine, prompts, False, a.repeat, fresh=False)
            eager = step_ms(engine, prompts, False, a.repeat)
            compiled = step_ms(engine, prompts, True, a.repeat)
            flops = 2 * n_params * n * w + 4 * layers * n * w * w * heads * d_head
            bound = flops / (a.peak_tflops * 1e12) * 1e3
            rows.append(
                {
                    "n": n,
                    "width": w,
                    "padded_tokens": n * w,
                    "eager_cacheview_ms": round(cacheview, 2),
                    "eager_ms": round(eager, 2),
                    "compiled_ms": round(compiled, 2),
                    "speedup": round(eager / compiled, 2),
                    "gpu_bound_ms": round(bound, 2),
                    "compiled_vs_bound": round(compiled / bound, 2),
                }
            )
        shape_rows = []
        for mode, compiled in (("eager", False), ("compiled", True)) if a.new_widths else ():
            engine.compile_prefill = compiled
            # widths no earlier step ran, inside the range the timed shapes already allocated for (128..8x1000)
            widths = [(602 if compiled else 601) + 3 * i for i in range(a.new_widths)]
            prompts = [[[(5 * j) % cfg.vocab_size for j in range(w)]] for w in widths]
            # two passes over the same widths, in order: every width new in the first, seen in the second
            first, again = [statistics.median([one_step_ms(engine, p) for p in prompts]) for _ in range(2)]
            shape_rows.append(
                {
                    "mode": mode,
                    "widths": f"{widths[0]}..{widths[-1]}",
                    "first_ms_p50": round(first, 1),
                    "repeat_ms_p50": round(again, 1),
                    "new_shape_cost_ms": round(first - again, 1),
                }
            )
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    if shape_rows:
        print(f"\nfirst-time widths (PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r})")
        print("| " + " | ".join(shape_rows[0]) + " |\n|" + "---|" * len(shape_rows[0]))
        for r in shape_rows:
            print("| " + " | ".join(str(v) for v in r.values()) + " |")
    if a.out:
        meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "host": platform.node()}
        meta["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        report = {"meta": meta, "compile_s": took, "graphs": graphs, "rows": rows, "new_widths": shape_rows}
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
