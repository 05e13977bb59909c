"""Rollout tokens/s of the HF engine vs naive padded ``generate``, its fixes one by one, and a GRPO step breakdown.

    python projects/6d_grpo/bench.py                                  # throughput + ablations + ops + check (~4 min)
    python projects/6d_grpo/bench.py --part step                      # + trl, datasets (carried wheels on the H200)
    python projects/6d_grpo/bench.py --part step --step-engine vllm   # the same step with the colocated vLLM engine
    python projects/6d_grpo/bench.py --part all --out bench.json
    python projects/6d_grpo/bench.py --cpu-check                      # 2-layer model on CPU: checks the script only

Shape (issue 7): 64 prompts x 8 samples = 512 sequences x 512 new tokens, every token forced (min_new_tokens =
max_new_tokens, so EOS cannot end a row early and every row decodes the same number of tokens), sampling at
temperature 1. Model: Qwen2.5-1.5B-Instruct's architecture (preset qwen2.5-1.5b-instruct) with random bf16 weights
("dummy weights": same shapes, FLOPs and memory traffic as the real model; no download). Prompts: random token ids,
lengths 96..191 (GSM8K question + instruction + ChatML is ~120-250 Qwen tokens), so they pad to 192 and the static
cache holds 192 + 512 = 704 positions; the tokens/s do not depend on their content because every row generates
exactly 512 tokens.

Parts (``--part``, comma-separated):
- throughput: one row per ``--variants`` entry, each timed on its second call (same shape; the first call, with
  compilation or graph capture, is reported as first_call_s):
  naive = one padded ``model.generate``, dynamic cache, eager (TRL's ``use_vllm=False`` path);
  hf_static / hf_static_compiled = HFEngine(decode="generate"), static cache, eager / compiled decode step
  (torch.compile mode="reduce-overhead", i.e. CUDA graphs): the engine before the decode loop;
  hf_loop = HFEngine's decode loop (phase6.rollout.hf_loop): the default engine;
  vllm = vLLM's offline ``LLM.generate`` on the same prompt ids, in-process as TRL's colocate mode runs it
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``--vllm-gpu-memory-utilization`` 0.3 = TRL's default), dummy weights of
  the same architecture, ``min_tokens = max_tokens`` + ``ignore_eos``; needs vllm importable (on the lent H200:
  scripts/vllm_carry.py). Run it in its own process (``--variants vllm``) or first: vLLM keeps its memory.
- ablations: hf_loop with one fix turned off per row (``--ablations``), timed the same way: what each fix is worth
  (delta_ms_vs_hf_loop per token step).
- ops: the two per-token operations the predictions single out, timed alone at the benchmark shape: one layer's
  decode attention (transformers' repeat_kv SDPA vs packed GQA, full static length vs 480) and sampling one token
  from (512, 151936) bf16 logits (generate's float32 copy + EOS processor + softmax + multinomial vs Gumbel-max).
- check: correctness on the GPU at a small fp32 shape: greedy tokens and decode-time log-probs of the loop with CUDA
  graphs vs the eager loop and vs plain ``generate`` / a scoring forward.
- step: ``EngineGRPOTrainer`` for ``--steps`` optimizer steps at the same shape (max_completion_length 512, sampled,
  not forced), beta 0.001 (reference forward on), mean per-phase breakdown of the steps after the first, the weight
  sync (mechanism, tensors, bytes, ms) and the lag-0 rollout/training log-prob mismatch, then one row per step.
  ``--step-engine hf`` (default): HF engine (``--step-decode``); ``--step-engine vllm``: the colocated vLLM engine
  from ``phase6.rollout.vllm.build_vllm_engine``, the builder ``phase6 grpo engine=vllm`` uses (needs vllm, trl and
  datasets importable; on the lent H200: scripts/repro/vllm_h200_run.sh step_hf / step_vllm).
  Step levers (issue 31), on by default: ``--mismatch-every 10``, ``--length-buckets on``,
  ``--gradient-checkpointing off``, ``--liger on`` (Liger RMSNorm + SwiGLU on policy and reference, checked against
  float32 on the device first: ``liger_parity``). ``--step-trainer stock``: TRL 1.16's own GRPOTrainer (HF
  ``generate`` rollout, gradient checkpointing on), only timed. Every step run first measures the two ceilings
  (8192^3 bf16 matmul, 2 GiB device copy) and prints each phase's bound and % of bound
  (``phase6.posttrain.grpo_timing.phase_bounds``).

tokens/s = generated tokens / generate wall-clock (CUDA-synchronized); ms_per_token_step = generate wall-clock / new
tokens per row (prefill included). The behaviour log-probs are off unless ``--logprobs`` (the loop computes them inside
its graph, in generate_s; decode="generate" runs a scoring pass, in logprob_pass_s). predicted_ms_per_token_step: the
prediction written before the run (docs/benchmarks.md explains each). Baseline anchors (one H200, 2026-11-29): naive
4,094 tokens/s (issue 7) and 4,671 (lead's run), hf_static_compiled 11,791 tokens/s; target >= 3x naive.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from phase6.plan.model import qwen_config  # noqa: E402
from phase6.timing import timed, wall  # noqa: E402

# Qwen/Qwen2.5-1.5B-Instruct config.json (configs/plan/model/qwen2.5-1.5b-instruct.yaml)
QWEN25_15B = qwen_config("qwen2.5-1.5b-instruct")
EOS, PAD = 151645, 151643  # <|im_end|>, <|endoftext|> in Qwen2.5's vocabulary
# --cpu-check: the same code paths with a 2-layer model on CPU, to validate the script where there is no GPU
CPU_CHECK_ARCH = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
DEVICE = "cuda"

LOOP_ABLATIONS: dict[str, tuple[dict[str, Any], bool]] = {
    "repeat_kv": ({"attention": "sdpa"}, False),
    "full_length": ({"attend_bucket": 0}, False),
    "sync_every_token": ({"check_every": 1}, False),
    "no_dedup": ({"dedup_prefill": False}, False),
    "no_graphs": ({"cuda_graphs": False}, False),
    "with_logprobs": ({}, True),
}
"""hf_loop with one fix off: (phase6.rollout.hf_loop.LoopOptions fields, return behaviour log-probs).
``repeat_kv`` is transformers' own SDPA function, which repeats K/V to every query head under a mask in 5.17."""
# Predictions made before the first GPU run of the loop (ms per token step, 512 rows, prefill included; derivation in
# docs/benchmarks.md): matmuls 2.6 + KV read 2.0 (7.1 GB attended on average) + ~1,000 small unfused eager kernels 3.0
# + sampling 0.6 = 8.2 ms; each ablation adds its own cost.
PREDICTED_MS = {
    "hf_loop": 8.2,
    "hf_loop-repeat_kv": 29.0,  # + 6x KV written and read again over the attended length: +84 GB at ~4 TB/s
    "hf_loop-full_length": 9.0,  # + 3.3 GB of KV per step (704 instead of ~480 positions)
    "hf_loop-sync_every_token": 8.3,  # the host has nothing to do between tokens: the sync costs a graph launch
    "hf_loop-no_dedup": 9.1,  # + prefill of 512 x 192 instead of 64 x 192 tokens: +0.45 s
    "hf_loop-no_graphs": 12.0,  # the host issuing ~1,250 kernels per token through transformers' modules
    "hf_loop-with_logprobs": 8.4,  # + one float32 copy and logsumexp of the (512, 151936) logits
}


def dummy_model(device: str, arch: dict[str, Any] | None = None, dtype: Any = None) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    arch = arch or (QWEN25_15B | (CPU_CHECK_ARCH if DEVICE == "cpu" else {}))
    config = Qwen2Config(**arch, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype or torch.bfloat16)
    return model.eval()


def prompts(num_prompts: int, group: int, seed: int = 0, lengths: tuple[int, int] = (96, 192)) -> list[list[int]]:
    rng = random.Random(seed)
    unique = [[rng.randrange(1000, 150000) for _ in range(rng.randrange(*lengths))] for _ in range(num_prompts)]
    return [p for p in unique for _ in range(group)]


def free_memory() -> None:
    """Drop compiled graphs and cached blocks so the next row's memory columns are its own."""
    import torch

    gc.collect()
    if DEVICE == "cuda":
        torch._dynamo.reset()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def gib(x: int) -> float:
    return round(x / 2**30, 1)


def vllm_generate(args: argparse.Namespace, ids: list[list[int]]) -> tuple[Any, float, dict[str, Any]]:
    """vLLM offline generation of ``ids`` at the bench shape: (output like RolloutOutput's timing fields, first-call
    seconds, extra columns). In-process engine (TRL colocate); the second ``generate`` call is the timed one."""
    import types

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    # --cpu-check: vLLM's CPU attention needs head_dim >= 32; the check model gets head_dim 64
    arch = QWEN25_15B | (CPU_CHECK_ARCH | {"hidden_size": 256, "intermediate_size": 512} if DEVICE == "cpu" else {})
    tmp = Path(tempfile.mkdtemp(prefix="bench6d_vllm_"))
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **arch,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": "bfloat16",
    }
    (tmp / "config.json").write_text(json.dumps(config))
    t0 = wall()
    llm = LLM(
        model=str(tmp),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=1024,
        max_num_seqs=len(ids),
        seed=0,
    )
    init_s = wall() - t0
    params = VSamplingParams(
        max_tokens=args.new_tokens,
        min_tokens=args.new_tokens,
        ignore_eos=True,
        temperature=1.0,
        detokenize=False,
        logprobs=0 if args.logprobs else None,
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
    t0 = wall()
    llm.generate(prompts, params, use_tqdm=False)
    first = wall() - t0
    with timed(DEVICE) as gen:
        outs = llm.generate(prompts, params, use_tqdm=False)
    gen_s = gen.s
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    if n != len(ids) * args.new_tokens:
        raise RuntimeError(f"vllm generated {n} tokens, expected {len(ids) * args.new_tokens} (forced lengths)")
    cache = llm.llm_engine.vllm_config.cache_config
    extra = {
        "init_s": round(init_s, 1),
        "kv_cache_gib": round((cache.num_gpu_blocks or 0) * cache.block_size * kv_bytes_per_token(arch) / 2**30, 1),
        "note": f"vllm {vllm.__version__} LLM.generate, in-process, gpu_memory_utilization "
        f"{args.vllm_gpu_memory_utilization}, prefix caching {cache.enable_prefix_caching}",
    }
    out = types.SimpleNamespace(num_tokens=n, generate_s=gen_s, tokens_per_s=n / gen_s, logprob_s=None)
    del llm
    return out, first, extra


def kv_bytes_per_token(arch: dict[str, Any]) -> int:
    """K and V of every layer for one token in bf16."""
    head_dim = arch["hidden_size"] // arch["num_attention_heads"]
    return arch["num_hidden_layers"] * 2 * arch["num_key_value_heads"] * head_dim * 2


def bench_throughput(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The --variants rows and the --ablations rows (hf_loop with one fix off), each timed on its second call."""
    import torch

    from phase6.rollout import SamplingParams
    from phase6.rollout.hf import HFEngine, naive_generate
    from phase6.rollout.hf_loop import LoopOptions

    ids = prompts(args.prompts, args.group)
    forced = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, temperature=1.0)
    variants = [v for v in args.variants.split(",") if v]
    # every HF row but the compiled ones (which keep compiled state on their model); not built for a vllm-only run,
    # whose memory columns would otherwise carry this 2.9 GiB copy (the 2026-12-01 vllm row did)
    need_shared = bool({"naive", "hf_loop"} & set(variants)) or bool(args.ablations.strip(","))
    shared = dummy_model(DEVICE) if need_shared else None
    rows: list[dict[str, Any]] = []
    ablations: list[dict[str, Any]] = []
    base_ms: dict[str, float] = {}

    def mem() -> tuple[float | None, float | None]:
        if DEVICE != "cuda":
            return None, None
        return gib(torch.cuda.memory_allocated()), gib(torch.cuda.max_memory_allocated())

    def row(
        table: list[dict[str, Any]], name: str, out: Any, first: float | None, start_mem: Any, **extra: Any
    ) -> None:
        ms = 1e3 * out.generate_s / args.new_tokens
        r = {
            "variant": name,
            "tokens": out.num_tokens,
            "generate_s": round(out.generate_s, 2),
            "tokens_per_s": round(out.tokens_per_s),
            "ms_per_token_step": round(ms, 1),
            "predicted_ms_per_token_step": PREDICTED_MS.get(name),
            "speedup_vs_naive": round(base_ms["naive"] / ms, 2) if "naive" in base_ms else None,
            "first_call_s": None if first is None else round(first, 1),
            "logprob_pass_s": round(out.logprob_s, 2) if out.logprob_s else None,
            "start_mem_gib": start_mem,
            "peak_mem_gib": mem()[1],
            **extra,
        }
        table.append(r)
        print(json.dumps(r), flush=True)

    def loop_engine(model: Any, logprobs: bool, **options: Any) -> Any:
        return HFEngine(
            model,
            PAD,
            [EOS],
            decode="loop",
            pad_to_multiple=64,
            return_logprobs=logprobs,
            loop_options=LoopOptions(**options),
        )

    def loop_extra(engine: Any) -> dict[str, Any]:
        t = engine.last_timing
        return {"prefill_s": round(t["prefill_s"], 2), "graphs_captured": t["graphs_captured"]}

    for name in variants:
        free_memory()
        start_mem = mem()[0]
        try:
            if name == "vllm":
                out, first, extra = vllm_generate(args, ids)
                row(rows, name, out, first, start_mem, **extra)
            elif name == "naive":
                naive_generate(shared, ids[:8], SamplingParams(max_new_tokens=8), PAD, {EOS})  # CUDA/cuBLAS warm-up
                out = naive_generate(shared, ids, forced, PAD, {EOS})
                base_ms[name] = 1e3 * out.generate_s / args.new_tokens
                row(rows, name, out, None, start_mem, note="dynamic cache, eager")
            elif name in ("hf_static", "hf_static_compiled"):
                compiled = name == "hf_static_compiled"
                model = dummy_model(DEVICE)
                engine = HFEngine(
                    model,
                    PAD,
                    [EOS],
                    decode="generate",
                    static_cache=True,
                    compile_decode=compiled,
                    pad_to_multiple=64,
                    return_logprobs=args.logprobs,
                    score_batch_size=8,
                )
                t0 = wall()
                engine.generate(ids, forced)  # compiles and records the CUDA graphs that the next call replays
                first = wall() - t0
                note = "generate, static cache" + (", compiled decode (reduce-overhead)" if compiled else ", eager")
                row(rows, name, engine.generate(ids, forced), first, start_mem, note=note)
                del engine, model
            elif name == "hf_loop":
                engine = loop_engine(shared, args.logprobs)
                t0 = wall()
                engine.generate(ids, forced)  # captures one CUDA graph per attention bucket
                first = wall() - t0
                out = engine.generate(ids, forced)
                base_ms[name] = 1e3 * out.generate_s / args.new_tokens
                row(rows, name, out, first, start_mem, **loop_extra(engine), note="decode loop, CUDA graphs")
                del engine
            else:
                raise SystemExit(f"unknown variant {name!r}")
        except Exception:  # one broken row must not cost the others (this runs once, on a rented GPU)
            traceback.print_exc()
            rows.append({"variant": name, "note": "FAILED: " + traceback.format_exc(limit=1).splitlines()[-1]})
    for ab in [a for a in args.ablations.split(",") if a]:
        if ab not in LOOP_ABLATIONS:
            raise SystemExit(f"unknown ablation {ab!r}; one of {list(LOOP_ABLATIONS)}")
        name = f"hf_loop-{ab}"
        free_memory()
        start_mem = mem()[0]
        try:
            options, logprobs = LOOP_ABLATIONS[ab]
            engine = loop_engine(shared, logprobs, **options)
            t0 = wall()
            engine.generate(ids, forced)
            first = wall() - t0
            out = engine.generate(ids, forced)
            extra = loop_extra(engine)
            if "hf_loop" in base_ms:
                extra["delta_ms_vs_hf_loop"] = round(1e3 * out.generate_s / args.new_tokens - base_ms["hf_loop"], 2)
            extra["note"] = f"LoopOptions({options}), logprobs={logprobs}"
            row(ablations, name, out, first, start_mem, **extra)
            del engine
        except Exception:
            traceback.print_exc()
            ablations.append({"variant": name, "note": "FAILED: " + traceback.format_exc(limit=1).splitlines()[-1]})
    del shared
    free_memory()
    return rows, ablations


def _time_ms(fn: Any, reps: int) -> float:
    """Milliseconds per call: one warm call, then ``reps`` calls in one CUDA-synchronized region."""
    fn()
    with timed(DEVICE) as t:
        for _ in range(reps):
            fn()
    return 1e3 * t.s / reps


def _attention_rows(rows_n: int, length: int, full: int, cfg: dict[str, Any], reps: int) -> list[dict[str, Any]]:
    """One layer's decode attention over the first ``length`` of ``full`` cache positions (a slice, as in the loop)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from phase6.models.packed_gqa import packed_gqa_attention

    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // heads
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv
    q = torch.randn(rows_n, heads, 1, head_dim, device=DEVICE, dtype=dtype)
    k = torch.randn(rows_n, kv, full, head_dim, device=DEVICE, dtype=dtype)[:, :, :length]
    v = torch.randn(rows_n, kv, full, head_dim, device=DEVICE, dtype=dtype)[:, :, :length]
    mask = torch.ones(rows_n, 1, 1, length, dtype=torch.bool, device=DEVICE)
    mask[: rows_n // 2, :, :, : length // 4] = False  # left padding on half the rows
    kv_gb = 2 * k.numel() * k.element_size() / 1e9
    rows = []
    for name, fn in (
        ("transformers' sdpa_attention_forward (repeat_kv under a mask in 5.17)", sdpa_attention_forward),
        ("packed GQA SDPA (hf_loop)", packed_gqa_attention),
    ):
        ms = _time_ms(lambda fn=fn: fn(module, q, k, v, mask, scaling=head_dim**-0.5), reps)
        rows.append(
            {
                "op": f"decode attention, 1 layer, {rows_n} rows x {length} of {full} cached keys",
                "variant": name,
                "ms": round(ms, 3),
                "x_layers_ms": round(cfg["num_hidden_layers"] * ms, 1),
                "kv_gb_per_layer": round(kv_gb, 3),
                "kv_gb_per_s": round(kv_gb / ms * 1e3),
            }
        )
    return rows


def _sampling_rows(rows_n: int, vocab: int, reps: int) -> list[dict[str, Any]]:
    import torch

    from phase6.rollout import SamplingParams
    from phase6.rollout.hf_loop import sample_tokens

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    logits = torch.randn(rows_n, vocab, device=DEVICE, dtype=dtype)
    eos = torch.tensor([EOS % vocab], device=DEVICE)
    eos_mask = torch.isin(torch.arange(vocab, device=DEVICE), eos)
    forced = SamplingParams(max_new_tokens=512, min_new_tokens=512, temperature=1.0)
    step = torch.tensor([3], device=DEVICE)

    def generate_way() -> Any:  # generate per token: float32 copy, processors (min-new-tokens here), sample
        scores = logits.to(copy=True, dtype=torch.float32)
        scores = torch.where(eos_mask, float("-inf"), scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)

    rows = []
    for name, fn in (
        ("generate: fp32 copy + EOS processor + softmax + multinomial", generate_way),
        ("hf_loop: Gumbel-max", lambda: sample_tokens(logits, forced, step, eos, want_logprobs=False)),
        ("hf_loop: Gumbel-max + behaviour log-prob", lambda: sample_tokens(logits, forced, step, eos)),
    ):
        rows.append(
            {"op": f"sample 1 token, {rows_n} x {vocab} logits", "variant": name, "ms": round(_time_ms(fn, reps), 3)}
        )
    return rows


def bench_ops(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One layer's decode attention and one token's sampling, alone, at the benchmark shape."""
    cfg = QWEN25_15B | (CPU_CHECK_ARCH if DEVICE == "cpu" else {})
    rows_n = args.prompts * args.group
    full = 192 + args.new_tokens  # the static length: prompts pad to 192
    reps = 20 if DEVICE == "cuda" else 2
    out = _attention_rows(rows_n, full, full, cfg, reps) + _attention_rows(rows_n, min(full, 480), full, cfg, reps)
    out += _sampling_rows(rows_n, cfg["vocab_size"], reps)
    for r in out:
        print(json.dumps(r), flush=True)
    free_memory()
    return out


def _max_diff(got: list[list[float]] | None, ref: list[list[float]]) -> float:
    assert got is not None
    return max(abs(x - y) for a, b in zip(got, ref, strict=True) for x, y in zip(a, b, strict=True))


def bench_check(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The loop with CUDA graphs against the eager loop and plain generate, fp32, small shape (correctness)."""
    import torch

    from phase6.rollout import SamplingParams
    from phase6.rollout.hf import naive_generate, sequence_logprobs
    from phase6.rollout.hf_loop import DecodeLoop, LoopOptions

    arch = QWEN25_15B | dict(num_hidden_layers=2)  # real vocab, width and head layout; 2 layers
    if DEVICE == "cpu":
        arch = QWEN25_15B | CPU_CHECK_ARCH
    model = dummy_model(DEVICE, arch, torch.float32)
    with (
        torch.no_grad()
    ):  # 8x the init scale: attention, positions and masks decide the tokens (tests/test_grpo_loop.py)
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(8.0)
    num_prompts, group, new = (16, 4, 48) if DEVICE == "cuda" else (3, 2, 6)
    ids = prompts(num_prompts, group, seed=1, lengths=(20, 150))  # pads to 192: buckets 192..256 crossed
    greedy = SamplingParams(max_new_tokens=new, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=new, min_new_tokens=new // 6, temperature=1.0, top_p=0.95)
    plain = naive_generate(model, ids, greedy, PAD, {EOS})
    result = []
    for label, opts in (("loop, CUDA graphs", LoopOptions()), ("loop, eager", LoopOptions(cuda_graphs=False))):
        loop = DecodeLoop(model, PAD, {EOS}, 64, opts)
        for call in (1, 2):  # first call captures, second replays only
            got = loop.generate(ids, greedy, want_logprobs=True)
            same = sum(a == b for a, b in zip(got.completion_ids, plain.completion_ids, strict=True))
            diff = _max_diff(got.logprobs, sequence_logprobs(model, ids, got.completion_ids, 0.0, PAD))
            result.append(
                {
                    "check": f"greedy, {label}, call {call}",
                    "rows_equal_to_generate": f"{same}/{len(ids)}",
                    "max_abs_logprob_diff_vs_forward": float(f"{diff:.2e}"),
                    "graphs_captured": got.graphs_captured,
                    "pass": same == len(ids) and diff < 1e-3,
                }
            )
        torch.manual_seed(0)
        got = loop.generate(ids, sampled, want_logprobs=True)
        diff = _max_diff(got.logprobs, sequence_logprobs(model, ids, got.completion_ids, 1.0, PAD))
        short = min(len(c) for c in got.completion_ids)
        result.append(
            {
                "check": f"sampled T=1 top_p=0.95 min_new={sampled.min_new_tokens}, {label}",
                "rows_equal_to_generate": None,
                "max_abs_logprob_diff_vs_forward": float(f"{diff:.2e}"),
                "graphs_captured": got.graphs_captured,
                "pass": diff < 1e-3 and short >= sampled.min_new_tokens,
            }
        )
    for r in result:
        print(json.dumps(r), flush=True)
    del model
    free_memory()
    return result


def measure_ceilings() -> dict[str, Any]:
    """The two rates every phase is held against, measured here (docs: /work/.library/device/METHOD.md): an 8192^3
    bf16 matmul (random data, 3 input pairs rotated, median of 20 after warm-up) and a 2 GiB device-to-device copy
    (bytes read + written, median of 20), both timed with CUDA events."""
    import torch

    if DEVICE != "cuda":
        return {"matmul_tflops": None, "copy_tb_per_s": None, "note": "no CUDA device: no bounds"}

    from phase6.timing import kernel_ms as median_ms

    n = 8192

    def matmul_ms() -> float:
        pairs = [
            (
                torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
                torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
            )
            for _ in range(3)
        ]
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        turn = iter(range(10**9))
        return median_ms(lambda: torch.matmul(*pairs[next(turn) % 3], out=out))

    def copy_ms() -> tuple[float, int]:
        src = torch.randn(2**29, device="cuda", dtype=torch.float32)  # 2 GiB
        dst = torch.empty_like(src)
        return median_ms(lambda: dst.copy_(src)), 2 * src.numel() * src.element_size()

    mm_ms = matmul_ms()
    cp_ms, nbytes = copy_ms()
    torch.cuda.empty_cache()
    return {
        "matmul_tflops": round(2 * n**3 / (mm_ms / 1e3) / 1e12, 1),
        "copy_tb_per_s": round(nbytes / (cp_ms / 1e3) / 1e12, 2),
        "matmul_ms": round(mm_ms, 3),
        "copy_ms": round(cp_ms, 3),
    }


def liger_parity(dtype: Any) -> dict[str, Any]:
    """Equal-numerics check of the liger lever on this device: per-token log-probs and one loss's gradient of the
    dummy model (bf16) with transformers' RMSNorm/SwiGLU vs Liger's, each against the same model in float32.
    Pass: Liger's error against float32 is within 1.5x of transformers' own bf16 error (+1e-3 nats)."""
    import torch

    from phase6.posttrain.grpo_trainer import apply_liger_layers

    torch.manual_seed(1)
    model = dummy_model(DEVICE, dtype=torch.float32)
    ids = torch.randint(1000, 150000, (4, 704), device=DEVICE)

    def logps(m: Any) -> tuple[torch.Tensor, float]:
        m.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, enabled=False):
            logits = m(input_ids=ids).logits[:, -513:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, -512:, None]).squeeze(-1)
        lp.mean().backward()
        g = m.model.layers[0].mlp.down_proj.weight.grad.float()
        return lp.detach(), g

    ref_lp, ref_g = logps(model)
    bf = model.to(dtype)
    hf_lp, hf_g = logps(bf)
    patched = apply_liger_layers(bf)
    lg_lp, lg_g = logps(bf)
    del model, bf
    free_memory()

    def rel(g: torch.Tensor) -> float:
        return float((g - ref_g).norm() / ref_g.norm())

    hf_err, lg_err = float((hf_lp - ref_lp).abs().mean()), float((lg_lp - ref_lp).abs().mean())
    return {
        "patched_modules": len(patched),
        "logp_mean_abs_err_hf_bf16": hf_err,
        "logp_mean_abs_err_liger_bf16": lg_err,
        "logp_mean_abs_diff_liger_vs_hf": float((lg_lp - hf_lp).abs().mean()),
        "grad_rel_err_hf_bf16": rel(hf_g),
        "grad_rel_err_liger_bf16": rel(lg_g),
        "pass": lg_err <= 1.5 * hf_err + 1e-3 and rel(lg_g) <= 1.5 * rel(hf_g) + 1e-3,
    }


def sampler_parity(vocab: int | None = None, rows: int = 512, draws: int = 65536) -> dict[str, Any]:
    """Equal-numerics check of the fused sampler (``phase6.rollout.fused_sample``) on this device, at the benchmark's
    vocabulary: (1) 512 rows of random bf16 logits (std 3): the sampled token's log-prob against torch's float32
    log_softmax (pass: max |diff| < 1e-3); (2) 65,536 draws from one row whose mass sits on 16 tokens spread over the
    vocabulary (every other logit -1e4, so every 4,096-wide block is crossed): every draw is one of the 16 and the
    counts follow softmax (pass: chi-square, 15 degrees of freedom, below its 99.9 % quantile 37.70; the torch path
    ``sample_tokens`` on the same row is reported beside it). Plus the time of one sampling call at 512 rows, fused
    and torch (CUDA events, median of 20 after 3 warm-ups): the per-token-step saving."""
    import torch

    from phase6.rollout import SamplingParams
    from phase6.rollout.fused_sample import available, fused_sample
    from phase6.rollout.hf_loop import sample_tokens

    dev = torch.device(DEVICE)
    if not available(dev):
        return {"pass": False, "error": "Triton not available on this device"}
    vocab = vocab or QWEN25_15B["vocab_size"]
    gen = torch.Generator(device=dev).manual_seed(2)
    logits = (torch.randn(rows, vocab, device=dev, generator=gen) * 3).to(torch.bfloat16)
    seed, step = torch.tensor([12345], device=dev), torch.tensor([7], device=dev)
    tok, lp = fused_sample(logits, 1.0, seed, step)
    ref = torch.log_softmax(logits.float(), -1).gather(1, tok[:, None]).squeeze(1)
    lp_err = float((lp - ref).abs().max())
    cand = torch.linspace(5, vocab - 5, 16, device=dev).long()
    row = torch.full((vocab,), -1e4, device=dev)
    row[cand] = torch.randn(16, device=dev, generator=gen) * 1.5
    row = row.to(torch.bfloat16)
    probs = torch.softmax(row.float()[cand], -1).double()

    def chi2(tokens: torch.Tensor) -> tuple[float, bool]:
        inside = bool(torch.isin(tokens, cand).all())
        counts = (tokens[:, None] == cand[None]).sum(0).double()
        return float(((counts - draws * probs) ** 2 / (draws * probs)).sum()), inside

    fused_chi2, fused_inside = chi2(fused_sample(row.expand(draws, vocab), 1.0, seed, step, False)[0])
    params = SamplingParams(max_new_tokens=1, temperature=1.0)
    eos = torch.tensor([EOS], device=dev)
    torch_chi2, _ = chi2(
        torch.cat([sample_tokens(row.expand(draws // 16, vocab), params, step, eos, False)[0] for _ in range(16)])
    )

    from phase6.timing import kernel_ms as ms

    out = {
        "logp_max_abs_err": lp_err,
        "chi2_fused": fused_chi2,
        "chi2_torch": torch_chi2,
        "fused_draws_inside_support": fused_inside,
        "pass": lp_err < 1e-3 and fused_inside and fused_chi2 < 37.70,
    }
    if DEVICE == "cuda":
        batch = logits
        out["ms_fused_512"] = ms(lambda: fused_sample(batch, 1.0, seed, step))
        out["ms_torch_512"] = ms(lambda: sample_tokens(batch, params, step, eos, True))
    return out  # the caller frees the cached blocks (free_memory)


def lever_check(
    check: Callable[..., dict[str, Any]], lever: str, flag: str, extras: dict[str, Any], *args: Any
) -> bool:
    """Run a lever's parity check (``liger_parity``, ``sampler_parity``) before the run; its result goes into
    ``extras[<its name>]`` and is printed. True when it passes; an exception counts as a failure (any failure of the
    optional kernels turns the lever off)."""
    name = check.__name__
    try:
        extras[name] = check(*args)
    except Exception as e:  # noqa: BLE001 - a failed optional kernel turns the lever off, never costs the row
        extras[name] = {"pass": False, "error": f"{type(e).__name__}: {e}"}
    free_memory()
    print(json.dumps({name: extras[name]}), flush=True)
    if extras[name]["pass"]:
        return True
    print(f"{lever}: parity check failed or errored; this run continues with {flag} off", flush=True)
    return False


def lever_parity(trainer: Any) -> dict[str, Any]:
    """The layout levers on this device, in its dtype: the last step's first micro-batch scored by the policy with
    the plain padded pass, with trimmed padding (length buckets, masked), right-aligned (no mask: causal flash) and
    with the shared prompt; mean / max |d logp| over its completion tokens against the plain pass (bf16: the kernels
    see other shapes, so ~1e-3..1e-2 is noise)."""
    import torch

    batch = trainer._buffered_inputs[0]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width, real = batch["completion_ids"].size(1), batch["completion_mask"].bool()
    saved = trainer.length_buckets, trainer.shared_prompt, trainer.right_align
    out: dict[str, Any] = {"rows": int(ids.size(0)), "tokens": int(real.sum())}
    variants = {
        "trimmed": (True, False, False),
        "right_aligned": (True, False, True),
        "shared_prompt": (True, True, False),
    }
    try:
        with torch.no_grad():
            trainer.length_buckets, trainer.shared_prompt, trainer.right_align = False, False, False
            plain = trainer._per_token_logps(trainer.model, ids, mask, width)[0].float()
            for name, (buckets, shared, aligned) in variants.items():
                trainer.length_buckets, trainer.shared_prompt, trainer.right_align = buckets, shared, aligned
                diff = (trainer._per_token_logps(trainer.model, ids, mask, width)[0].float() - plain).abs()[real]
                out[f"{name}_vs_plain_mean_abs"] = float(diff.mean())
                out[f"{name}_vs_plain_max_abs"] = float(diff.max())
    finally:
        trainer.length_buckets, trainer.shared_prompt, trainer.right_align = saved
    return out


def bench_step(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """A few GRPO steps at the benchmark shape: (mean breakdown of the steps after the first with each phase's bound,
    one row per step, extras).

    ``--step-trainer phase6`` (default): ``EngineGRPOTrainer`` with ``--step-engine hf`` (HFEngine, ``--step-decode``)
    or ``vllm`` (the colocated vLLM engine built by ``phase6.rollout.vllm.build_vllm_engine`` -- the function
    ``phase6 grpo engine=vllm`` calls -- with ``gpu_memory_utilization = --vllm-gpu-memory-utilization``); the step
    levers ``--mismatch-every``, ``--length-buckets``, ``--liger``, ``--gradient-checkpointing``.
    ``--step-trainer stock``: TRL 1.16's GRPOTrainer as shipped (its HF ``generate`` rollout, ``use_vllm=False``,
    gradient checkpointing on: TRL's default), only timed (``TimedGRPOTrainer``); the levers do not apply."""
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig

    from phase6.posttrain.grpo_timing import PHASES, Ceilings, ModelShape, add_bound_columns, phase_bounds, summarize
    from phase6.posttrain.grpo_trainer import EngineGRPOTrainer, TimedGRPOTrainer
    from phase6.posttrain.tiny import CHATML_TEMPLATE
    from phase6.rollout.hf import HFEngine
    from phase6.rollout.hf_loop import LoopOptions
    from phase6.tasks.digits import digit_reward

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    stock = args.step_trainer == "stock"
    extras: dict[str, Any] = {"ceilings": measure_ceilings()}
    print(json.dumps({"ceilings": extras["ceilings"]}), flush=True)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    # a lever with its own kernels runs only if it imports and keeps the numerics on this device (checked first);
    # otherwise the run goes on without it and says why (a failed optional lever must not cost the whole row)
    liger = args.liger == "on" and not stock and lever_check(liger_parity, "liger", "--liger", extras, dtype)
    fused_sampling = (
        args.fused_sampling == "on"
        and not stock
        and args.step_engine == "hf"
        and lever_check(sampler_parity, "fused sampling", "--fused-sampling", extras)
    )
    # A word-level tokenizer over Qwen's id space ("t<id>"), ChatML specials at Qwen's ids: text round-trips to the
    # same ids, so prompts and completions have the real shapes without the Qwen tokenizer files.
    specials = {"<|endoftext|>": PAD, "<|im_start|>": 151644, "<|im_end|>": EOS}
    vocab = {f"t{i}": i for i in range(QWEN25_15B["vocab_size"]) if i not in specials.values()} | specials
    tok_obj = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok_obj.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok_obj, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHATML_TEMPLATE
    work = Path(tempfile.mkdtemp(prefix="grpo_bench_"))
    arch = None
    if DEVICE == "cpu" and args.step_engine == "vllm":  # vLLM's CPU attention needs head_dim >= 32
        arch = QWEN25_15B | CPU_CHECK_ARCH | {"hidden_size": 256, "intermediate_size": 512}
    # random weights drawn on the device (seconds instead of ~15 s of CPU init for 1.5B parameters), saved once
    init_model = dummy_model(DEVICE if DEVICE == "cuda" and arch is None else "cpu", arch)
    init_model.save_pretrained(work / "model")
    del init_model
    free_memory()
    tok.save_pretrained(work / "model")
    rng = random.Random(0)
    rows = [
        {
            "prompt": [
                {
                    "role": "user",
                    "content": " ".join(f"t{rng.randrange(1000, 150000)}" for _ in range(rng.randrange(80, 176))),
                }
            ],
            "solution": str(rng.randrange(10)),
        }
        for _ in range(args.prompts * (args.steps + 1))
    ]
    micro_steps = args.prompts * args.group // args.micro_batch_size
    checkpointing = True if stock else args.gradient_checkpointing == "on"
    cfg = GRPOConfig(
        output_dir=str(work / "out"),
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=micro_steps,
        num_generations=args.group,
        max_completion_length=args.new_tokens,
        max_steps=args.steps,
        learning_rate=1e-6,
        beta=0.001,
        bf16=DEVICE == "cuda",
        use_cpu=DEVICE == "cpu",
        gradient_checkpointing=checkpointing,
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        model_init_kwargs={"dtype": dtype, "attn_implementation": "sdpa"},
    )

    def build(trainer: Any) -> Any:
        if args.step_engine == "vllm":
            from phase6.rollout.vllm import build_vllm_engine

            options = {"gpu_memory_utilization": args.vllm_gpu_memory_utilization} if DEVICE == "cuda" else {}
            return build_vllm_engine(trainer, "colocate", options, engine_logprobs=args.vllm_logprobs == "on")
        m = AutoModelForCausalLM.from_pretrained(work / "model", dtype=dtype).to(DEVICE)
        return HFEngine(
            m,
            PAD,
            [EOS],
            decode=args.step_decode,
            pad_to_multiple=64,
            score_batch_size=8,
            loop_options=LoopOptions(fused_sampling=fused_sampling),
        )

    common = dict(
        model=str(work / "model"),
        reward_funcs=[digit_reward],
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )
    t0 = wall()
    if stock:
        trainer = TimedGRPOTrainer(**common)
    else:
        trainer = EngineGRPOTrainer(
            **common,
            engine_builder=build,
            probe_every=0,
            mismatch_every=args.mismatch_every,
            length_buckets=args.length_buckets == "on",
            shared_prompt=args.shared_prompt == "on",
            liger=liger,
            liger_engine=args.liger_engine == "on",
            right_align=args.right_align == "on",
        )
    init_s = wall() - t0
    trainer.train()
    # per step: the phase seconds, and what the trainer logged for it (engine tokens/s, lengths, sync, mismatch)
    logs = [h for h in trainer.state.log_history if "time/step_s" in h]
    syncs = {s["step"]: s for s in getattr(trainer, "sync_log", [])}
    mismatch = {m["step"]: m for m in getattr(trainer, "mismatch_log", [])}
    tokens = {t["step"]: t for t in trainer.token_log}
    per_step = []
    for i, r in enumerate(trainer.step_rows):
        log = logs[i] if i < len(logs) else {}
        s, m, t = syncs.get(i, {}), mismatch.get(i, {}), tokens.get(i, {})
        row = {"step": i + 1, "step_s": round(r["step"], 3), **{k: round(r[k], 3) for k in PHASES if r[k]}}
        row |= {
            "engine_tokens_per_s": round(log["rollout/engine_tokens_per_s"])
            if "rollout/engine_tokens_per_s" in log
            else None,
            "completion_mean_len": log.get("completions/mean_length"),
            "clipped_ratio": log.get("completions/clipped_ratio"),
            "real_tokens": t["prompt_tokens"] + t["completion_tokens"] if t else None,
            "padded_tokens": t.get("padded_tokens"),
            "sync_bytes": s.get("bytes"),
            "sync_tensors": s.get("num_tensors"),
            "sync_ms": round(s["ms"], 1) if s else None,
            "logp_mismatch_mean": m.get("logp_mismatch_mean"),
            "logp_mismatch_max": m.get("logp_mismatch_max"),
            "mismatch_tokens": m.get("tokens"),
            "nan_tokens": m.get("nan_tokens"),
        }
        per_step.append(row)
        print(json.dumps(row), flush=True)
    table = summarize(trainer.step_rows, skip_first=1)
    for r in table:
        r.pop("what")
    # bounds from the mean token counts of the timed steps (the same steps the table averages)
    c = extras["ceilings"]
    timed_tokens = trainer.token_log[1:] or trainer.token_log
    later = getattr(trainer, "sync_log", [])[1:] or getattr(trainer, "sync_log", [])
    if c.get("matmul_tflops") and timed_tokens:
        mean_tokens = {k: sum(t[k] for t in timed_tokens) / len(timed_tokens) for k in timed_tokens[0] if k != "step"}
        extras["tokens_per_step"] = mean_tokens
        shape = ModelShape.of(trainer.accelerator.unwrap_model(trainer.model))
        extras["model_shape"] = dataclasses.asdict(shape)
        bounds = phase_bounds(
            mean_tokens,
            shape,
            Ceilings(c["matmul_tflops"] * 1e12, c["copy_tb_per_s"] * 1e12),
            ref_forward=trainer.beta != 0.0,
            sync_bytes=later[0]["bytes"] if later else 0.0,
            micro_steps=micro_steps,
        )
        extras["bounds"] = bounds
        add_bound_columns(table, bounds)
    if later:
        table.append(
            {
                "phase": "weight_sync detail",
                "mean_s_per_step": sum(s["ms"] for s in later) / len(later) / 1e3,
                "share_pct": None,
                "gib": later[0]["bytes"] / 2**30,
                "tensors": later[0]["num_tensors"],
                "mechanism": later[0]["mechanism"],
            }
        )
    mlog = getattr(trainer, "mismatch_log", [])
    if mlog:
        table.append(
            {
                "phase": "logp mismatch, abs(log pi_train - log mu_engine), lag 0, steps "
                + ",".join(str(m["step"] + 1) for m in mlog),
                "mean_s_per_step": None,
                "share_pct": None,
                "mean": sum(m["logp_mismatch_mean"] for m in mlog) / len(mlog),
                "max": max(m["logp_mismatch_max"] for m in mlog),
                "tokens": sum(m["tokens"] for m in mlog),
                "nan_tokens": sum(m["nan_tokens"] for m in mlog),
            }
        )
    table.append({"phase": "trainer + engine init (s, once)", "mean_s_per_step": init_s, "share_pct": None})
    if DEVICE == "cuda":
        table.append(
            {
                "phase": "peak GPU memory (GiB, torch allocator)",
                "mean_s_per_step": None,
                "share_pct": None,
                "gib": gib(torch.cuda.max_memory_allocated()),
            }
        )
    if not stock:
        try:
            extras["lever_parity"] = lever_parity(trainer)
        except Exception as e:  # noqa: BLE001 - a diagnostic after the timed steps; never costs the row
            extras["lever_parity"] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps({"lever_parity": extras["lever_parity"]}), flush=True)
    extras["trainer"] = "TRL 1.16 GRPOTrainer (stock, timed)" if stock else "phase6 EngineGRPOTrainer"
    extras["levers"] = (
        {"gradient_checkpointing": True}
        if stock
        else {
            "gradient_checkpointing": checkpointing,
            "mismatch_every": args.mismatch_every,
            "length_buckets": args.length_buckets == "on",
            "sorted_micro_batches": trainer.sort_micro_batches,
            "shared_prompt": trainer.shared_prompt,
            "liger": liger,
            "liger_engine": liger and args.liger_engine == "on" and args.step_engine == "hf",
            "liger_patched_modules": {k: len(v) for k, v in trainer.liger_patched.items()},
            "fused_sampling": bool(getattr(trainer.engine, "last_timing", {}).get("fused_sampling", False)),
            "micro_batch_size": args.micro_batch_size,
            "right_align": trainer.right_align,
            "right_aligned_chunks": trainer.right_aligned_chunks,
        }
    )
    del trainer
    return table, per_step, extras


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print(f"\n{title}\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print(
            "| "
            + " | ".join(
                "" if r.get(c) is None else (f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])) for c in cols
            )
            + " |"
        )


PARTS = ("throughput", "ops", "check", "step")
DEFAULT_VARIANTS = "naive,hf_static_compiled,hf_loop"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def onoff(flag: str, default: str, help: str) -> None:
        p.add_argument(flag, default=default, choices=("on", "off"), help=help)

    p.add_argument("--part", default="throughput,ops,check", help=f"comma-separated of {PARTS}, or all")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="naive,hf_static,hf_static_compiled,hf_loop,vllm")
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3, help="vllm row (TRL colocate default)")
    p.add_argument("--ablations", default=",".join(LOOP_ABLATIONS), help="hf_loop rows with one fix off ('' = none)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--logprobs", action="store_true", help="engines also return behaviour log-probs (GRPO needs them)")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps for --part step (the first is warm-up)")
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=32,
        help="rows per micro-batch (32: measured fastest on one H200, issue 31)",
    )
    p.add_argument("--step-decode", default="loop", choices=("loop", "generate"), help="HF engine decode, --part step")
    p.add_argument(
        "--step-engine",
        default="hf",
        choices=("hf", "vllm"),
        help="--part step rollout engine: hf (HFEngine) | vllm (colocated vLLM, phase6 grpo engine=vllm's builder)",
    )
    p.add_argument(
        "--step-trainer",
        default="phase6",
        choices=("phase6", "stock"),
        help="--part step: phase6 (EngineGRPOTrainer + our engine) | stock (TRL's GRPOTrainer with HF generate)",
    )
    onoff("--gradient-checkpointing", "off", "--part step, phase6 trainer")
    p.add_argument(
        "--mismatch-every",
        type=int,
        default=10,
        help="--part step: current-policy forward for the lag-0 mismatch metric every N steps (1 = every step)",
    )
    onoff("--length-buckets", "on", "--part step: sorted, trimmed batches")
    onoff(
        "--shared-prompt",
        "off",
        "--part step: each distinct prompt once per log-prob pass, its KV cache shared by its completions",
    )
    onoff("--liger", "on", "--part step: Liger RMSNorm + SwiGLU on policy and ref")
    onoff(
        "--right-align",
        "on",
        "--part step, with length buckets: rows shifted to right padding, log-prob passes without a mask",
    )
    onoff(
        "--liger-engine",
        "on",
        "--part step, with --liger on: the same kernels in the HF engine's model (prefill + decode CUDA graphs)",
    )
    onoff(
        "--fused-sampling",
        "on",
        "--part step, HF engine: Triton sampling + log-prob in one pass over the logits (checked first)",
    )
    onoff(
        "--vllm-logprobs",
        "on",
        "--part step --step-engine vllm: off = no engine log-probs, the trainer's forward is the anchor",
    )
    p.add_argument("--out", default=None, help="write every table as JSON here")
    p.add_argument("--cpu-check", action="store_true", help="2-layer model, tiny shape, on CPU: checks the script only")
    args = p.parse_args()
    parts = PARTS if args.part == "all" else tuple(x for x in args.part.split(",") if x)
    if not set(parts) <= set(PARTS):
        raise SystemExit(f"--part: unknown {sorted(set(parts) - set(PARTS))}; choose from {PARTS} or all")
    import torch

    global DEVICE
    if args.cpu_check:
        DEVICE = "cpu"
        args.prompts, args.group, args.new_tokens, args.steps, args.micro_batch_size = 4, 2, 8, 2, 4
        args.liger = "off"  # Triton kernels: CUDA only
    elif not torch.cuda.is_available():
        raise SystemExit("bench.py measures GPU throughput; no CUDA device here (--cpu-check runs the code paths)")
    import transformers

    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (check only)"
    result: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "shape": vars(args),
    }
    print(json.dumps({k: result[k] for k in ("device", "torch", "transformers", "date")}), flush=True)
    shape = f"{args.prompts} prompts x {args.group} x {args.new_tokens} forced tokens"
    tables: list[tuple[str, str]] = []
    if "throughput" in parts:
        result["throughput"], result["ablations"] = bench_throughput(args)
        tables += [("throughput", f"Rollout tokens/s, {shape}, {device} (second call timed)")]
        tables += [("ablations", f"hf_loop with one fix off, {shape} (second call timed)")]
    if "ops" in parts:
        result["ops"] = bench_ops(args)
        tables.append(("ops", "Per-token operations alone (ms per call)"))
    if "check" in parts:
        result["check"] = bench_check(args)
        tables.append(("check", "Correctness on this device (fp32, 2 layers; 64 rows x 48 tokens on a GPU)"))
    if "step" in parts:
        result["step"], result["step_rows"], result["step_extras"] = bench_step(args)
        engine = f"HF engine, {args.step_decode}" if args.step_engine == "hf" else "vLLM colocate"
        if args.step_trainer == "stock":
            engine = "TRL 1.16 stock GRPOTrainer, HF generate"
        tables.append(
            (
                "step",
                f"GRPO step breakdown ({engine}), {args.prompts}x{args.group}x"
                f"{args.new_tokens}, mean of steps 2..{args.steps}",
            )
        )
        tables.append(("step_rows", "GRPO steps one by one (s per phase; rollout, sync and mismatch columns)"))
    for key, title in tables:
        if result[key]:
            print_table(title, result[key])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
