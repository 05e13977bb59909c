"""Rollout tokens/s of the HF engine vs naive padded ``generate``, and a GRPO step breakdown, on one GPU.

    python projects/6d_grpo/bench.py --part throughput          # needs torch + transformers only
    python projects/6d_grpo/bench.py --part step                # + trl, datasets (carried wheels on the H200 image)
    python projects/6d_grpo/bench.py --part all --out bench.json

Shape (issue 7): 64 prompts x 8 samples = 512 sequences x 512 new tokens, every token forced (min_new_tokens =
max_new_tokens, so EOS cannot end a row early and every row decodes the same number of tokens), sampling at
temperature 1. Model: Qwen2.5-1.5B-Instruct's architecture (its config.json numbers below) with random bf16 weights
("dummy weights": same shapes, FLOPs and memory traffic as the real model; no download). Prompts: random token ids,
lengths 96..191 (GSM8K question + instruction + ChatML is ~120-250 Qwen tokens); the tokens/s do not depend on
their content because every row generates exactly 512 tokens.

Rows of the throughput table (same prompts, same sampling settings, one process):
- naive: one padded ``model.generate`` call, dynamic cache, eager (TRL's ``use_vllm=False`` path);
- hf_static: our HFEngine with a static cache, eager decode;
- hf_static_compiled: HFEngine, static cache + compiled decode step (torch.compile mode="reduce-overhead", i.e.
  CUDA graphs), timed on the second call (the first call compiles and records the graphs: reported separately).
tokens/s = generated tokens / generate wall-clock (CUDA-synchronized). The behaviour-log-prob scoring pass the
engine runs for GRPO is timed in its own column, not in tokens/s.

The step part runs ``EngineGRPOTrainer`` (HF engine, compiled) for ``--steps`` optimizer steps at the same shape
(max_completion_length 512, sampled, not forced), beta 0.001 (reference forward on), and prints the mean per-phase
breakdown of the steps after the first. Baseline anchors from issue 7 (one H200, 2026-11-29): naive 4,094 tokens/s,
``generate_batch`` (continuous batching, default settings) 1,543 tokens/s; target >= 12,000 tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

# Qwen/Qwen2.5-1.5B-Instruct config.json
QWEN25_15B = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)
EOS, PAD = 151645, 151643  # <|im_end|>, <|endoftext|> in Qwen2.5's vocabulary
# --cpu-check: the same code paths with a 2-layer model on CPU, to validate the script where there is no GPU
CPU_CHECK_ARCH = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
DEVICE = "cuda"


def dummy_model(device: str) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    arch = QWEN25_15B | (CPU_CHECK_ARCH if DEVICE == "cpu" else {})
    config = Qwen2Config(**arch, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def prompts(num_prompts: int, group: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    unique = [[rng.randrange(1000, 150000) for _ in range(rng.randrange(96, 192))] for _ in range(num_prompts)]
    return [p for p in unique for _ in range(group)]


def bench_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from phase6.rollout import SamplingParams
    from phase6.rollout.hf import HFEngine, naive_generate

    model = dummy_model(DEVICE)
    ids = prompts(args.prompts, args.group)
    forced = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, temperature=1.0)
    rows = []

    def row(name: str, out: Any, first_call_s: float | None, note: str) -> None:
        rows.append(
            {
                "variant": name,
                "sequences": len(out.completion_ids),
                "tokens": out.num_tokens,
                "generate_s": round(out.generate_s, 2),
                "tokens_per_s": round(out.tokens_per_s),
                "first_call_s": None if first_call_s is None else round(first_call_s, 1),
                "logprob_pass_s": round(out.logprob_s, 2) if out.logprob_s else None,
                "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if DEVICE == "cuda" else None,
                "note": note,
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    for name in args.variants.split(","):
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if name == "naive":
            naive_generate(model, ids[:8], SamplingParams(max_new_tokens=8), PAD, {EOS})  # CUDA/cuBLAS warm-up
            row(name, naive_generate(model, ids, forced, PAD, {EOS}), None, "dynamic cache, eager")
        elif name in ("hf_static", "hf_static_compiled"):
            compiled = name == "hf_static_compiled"
            engine = HFEngine(
                model,
                PAD,
                [EOS],
                static_cache=True,
                compile_decode=compiled,
                pad_to_multiple=64,
                return_logprobs=args.logprobs,
                score_batch_size=8,
            )
            t0 = time.perf_counter()
            engine.generate(ids, forced)  # same shape: compiles and records the CUDA graphs that the next call replays
            first = time.perf_counter() - t0
            row(name, engine.generate(ids, forced), first, "static cache" + (", compiled decode" if compiled else ""))
        else:
            raise SystemExit(f"unknown variant {name!r}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_step(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A few GRPO steps at the benchmark shape; the mean breakdown of the steps after the first."""
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig

    from phase6.posttrain.grpo_timing import summarize
    from phase6.posttrain.grpo_trainer import EngineGRPOTrainer
    from phase6.posttrain.tiny import CHATML_TEMPLATE
    from phase6.rollout.hf import HFEngine
    from phase6.tasks.digits import digit_reward

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
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
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    dummy_model("cpu").save_pretrained(work / "model")
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
    cfg = GRPOConfig(
        output_dir=str(work / "out"),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.prompts * args.group // args.micro_batch,
        num_generations=args.group,
        max_completion_length=args.new_tokens,
        max_steps=args.steps,
        learning_rate=1e-6,
        beta=0.001,
        bf16=DEVICE == "cuda",
        use_cpu=DEVICE == "cpu",
        gradient_checkpointing=True,
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        model_init_kwargs={"dtype": dtype, "attn_implementation": "sdpa"},
    )

    def build(trainer: Any) -> HFEngine:
        m = AutoModelForCausalLM.from_pretrained(work / "model", dtype=dtype).to(DEVICE)
        return HFEngine(m, PAD, [EOS], compile_decode=True, pad_to_multiple=64, score_batch_size=8)

    trainer = EngineGRPOTrainer(
        model=str(work / "model"),
        reward_funcs=[digit_reward],
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        engine_builder=build,
        probe_every=0,
    )
    trainer.train()
    for i, r in enumerate(trainer.step_rows, 1):
        print(json.dumps({"step": i, **{k: round(v, 3) for k, v in r.items()}}), flush=True)
    table = summarize(trainer.step_rows, skip_first=1)
    for r in table:
        r.pop("what")
    syncs = trainer.sync_log[1:] or trainer.sync_log
    if syncs:
        table.append(
            {
                "phase": "weight_sync detail",
                "mean_s_per_step": sum(s["ms"] for s in syncs) / len(syncs) / 1e3,
                "share_pct": None,
                "gib": syncs[0]["bytes"] / 2**30,
                "mechanism": syncs[0]["mechanism"],
            }
        )
    return table


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("throughput", "step", "all"), default="all")
    p.add_argument("--variants", default="naive,hf_static,hf_static_compiled")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--logprobs", action="store_true", help="also time the engine's behaviour-log-prob pass")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps for --part step (the first is warm-up)")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--out", default=None, help="write both tables as JSON here")
    p.add_argument("--cpu-check", action="store_true", help="2-layer model, tiny shape, on CPU: checks the script only")
    args = p.parse_args()
    import torch

    global DEVICE
    if args.cpu_check:
        DEVICE = "cpu"
        args.prompts, args.group, args.new_tokens, args.steps, args.micro_batch = 4, 2, 8, 2, 4
    elif not torch.cuda.is_available():
        raise SystemExit("bench.py measures GPU throughput; no CUDA device here (--cpu-check runs the code paths)")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (check only)",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "shape": vars(args),
    }
    if args.part in ("throughput", "all"):
        result["throughput"] = bench_throughput(args)
        print_table(
            f"Rollout tokens/s, {args.prompts} prompts x {args.group} x {args.new_tokens} forced tokens, "
            f"{result['device']}",
            result["throughput"],
        )
    if args.part in ("step", "all"):
        result["step"] = bench_step(args)
        print_table(
            f"GRPO step breakdown (HF engine, compiled), {args.prompts}x{args.group}x{args.new_tokens}, "
            f"mean of steps 2..{args.steps}",
            result["step"],
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
