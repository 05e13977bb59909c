"""LoRA-DPO throughput and peak memory on one GPU: TRL's defaults vs our configuration, same batch, same data, one call.

    python projects/6c_dpo/bench.py --data data/llamafactory-dpo-en-demo/dpo_en_demo.json --tokenizer data/gpt2-tokenizer
    python projects/6c_dpo/bench.py ... --variants precompute_only,no_ckpt_only,group_only    # one change each
    python projects/6c_dpo/bench.py ... --variants ours_liger                                  # needs liger-kernel

Model: Qwen2.5-7B-Instruct's architecture (config.json numbers below) with random bf16 weights built on the GPU
("dummy weights": same shapes, FLOPs and memory as the real model; no download). LoRA r=16, alpha=32 on every
linear layer, 8 pairs per optimizer step, max_length 1024, the pairs of LLaMA-Factory's dpo_en_demo.json tokenised
with the GPT-2 BPE (no Qwen tokenizer offline; the tokens/s column makes the comparison tokenizer-independent).

Each variant runs in its own subprocess, so every peak-memory number starts from a clean CUDA context. Times:
- s/step (steady): median optimizer-step time after ``--warmup`` steps (CUDA-synchronised step boundaries);
- pairs/s (steady) = 8 / that; pairs/s (end to end) = pairs trained / (trainer construction + train), which charges
  the precomputed reference pass (done at construction) to the variant that uses it.

Variants (each knob is a field of configs/dpo.yaml's ``dpo`` group):
- trl_default: TRL 1.16 DPOConfig defaults with LoRA: gradient checkpointing on, a reference forward (adapter
  disabled) every step, random batches padded to their longest pair.
- ours: precompute_ref_log_probs (one no-grad reference pass at batch 16 before training instead of one per step),
  gradient_checkpointing off (7B bf16 weights + activations of 16 x 1024 tokens fit in 141 GB, so the recompute
  forward is pure cost), group_by_length (TRL 1.16 disabled padding_free; similar-length batches pad less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# Qwen/Qwen2.5-7B-Instruct config.json
QWEN25_7B = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    hidden_act="silu",
)
BASE = dict(gradient_checkpointing=True, precompute=False, group=False, liger=False, micro_batch=8)
VARIANTS: dict[str, dict[str, Any]] = {
    "trl_default": dict(BASE),
    "ours": dict(BASE, gradient_checkpointing=False, precompute=True, group=True),
    "precompute_only": dict(BASE, precompute=True),
    "no_ckpt_only": dict(BASE, gradient_checkpointing=False),
    "group_only": dict(BASE, group=True),
    "ours_mb4": dict(BASE, gradient_checkpointing=False, precompute=True, group=True, micro_batch=4),
    "ours_liger": dict(BASE, gradient_checkpointing=False, precompute=True, group=True, liger=True),
}
PAIRS_PER_STEP = 8
# --dry-run-cpu: same code path on a CPU with a 2-layer, 64-wide model of the same family (for tests, not numbers)
TINY_OVERRIDES = dict(
    vocab_size=50304,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def gpt2_tokenizer(tok_dir: Path) -> Any:
    """GPT-2 BPE from encoder.json + vocab.bpe (shared/data/gpt2-tokenizer) with a ChatML template as text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = models.BPE.from_file(str(tok_dir / "encoder.json"), str(tok_dir / "vocab.bpe"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, Qwen2Config, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    sys.path.insert(0, str(REPO / "src"))
    from phase6.posttrain.dpo_data import build_preference_pairs, read_rows
    from phase6.posttrain.sampling import length_grouped

    v = VARIANTS[variant]
    cuda = not args.dry_run_cpu
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    tok = gpt2_tokenizer(Path(args.tokenizer))
    pairs, summary = build_preference_pairs(read_rows(args.data), "llamafactory", source=args.data)
    if args.dry_run_cpu:
        pairs = pairs[:16]
    train = Dataset.from_list(pairs)
    arch = dict(QWEN25_7B, **TINY_OVERRIDES) if args.dry_run_cpu else QWEN25_7B
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**arch), dtype=torch.bfloat16 if cuda else torch.float32)
    weights_gib = torch.cuda.memory_allocated() / 2**30 if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            sync()
            self._t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            sync()
            self.times.append(time.perf_counter() - self._t)

    timer = StepTimer()
    mb = v["micro_batch"]
    cfg = DPOConfig(
        output_dir=str(Path(args.workdir) / variant),
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=PAIRS_PER_STEP // mb,
        max_length=256 if args.dry_run_cpu else 1024,
        learning_rate=5e-6,
        max_steps=args.steps if args.steps > 0 else -1,
        num_train_epochs=1,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=v["gradient_checkpointing"],
        precompute_ref_log_probs=v["precompute"],
        precompute_ref_batch_size=16 if v["precompute"] else None,
        use_liger_kernel=v["liger"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer_cls = length_grouped(DPOTrainer) if v["group"] else DPOTrainer
    t0 = time.perf_counter()
    trainer = trainer_cls(
        model=model, args=cfg, train_dataset=train, processing_class=tok, peft_config=lora, callbacks=[timer]
    )
    sync()
    t_init = time.perf_counter() - t0
    t1 = time.perf_counter()
    trainer.train()
    sync()
    t_train = time.perf_counter() - t1
    steps = len(timer.times)
    steady = statistics.median(timer.times[args.warmup :]) if steps > args.warmup else float("nan")
    tokens = max((h.get("num_tokens", 0.0) for h in trainer.state.log_history), default=0.0)
    # one epoch covers every pair once (the last step may be partial); a step cap trains steps x 8
    pairs_trained = len(train) if args.steps <= 0 else min(steps * PAIRS_PER_STEP, len(train))
    return {
        "variant": variant,
        "status": "ok",
        "pairs_in_data": summary.num_kept,
        "steps": steps,
        "s_per_step": steady,
        "pairs_per_s": PAIRS_PER_STEP / steady,
        "pairs_per_s_e2e": pairs_trained / (t_init + t_train),
        "init_s": t_init,
        "train_s": t_train,
        "tokens_per_s_e2e": tokens / (t_init + t_train),
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "weights_gib": weights_gib,
        "knobs": v,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="LLaMA-Factory dpo_en_demo.json")
    p.add_argument("--tokenizer", required=True, help="directory with GPT-2 encoder.json + vocab.bpe")
    p.add_argument("--variants", default="trl_default,ours,ours_mb4", help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per variant (8 pairs each); 0 = one epoch")
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from the steady-state median")
    p.add_argument("--workdir", default="/tmp/phase6_dpo_bench")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    p.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="tiny model on CPU, 16 pairs, max_length 256: checks the code path only",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        try:
            row = child(args.child, args)
        except Exception as e:  # an OOM (or any failure) of one variant is a result row, not a crash of the table
            row = {"variant": args.child, "status": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        print("BENCH_ROW " + json.dumps(row), flush=True)
        return 0
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    for path, what in ((Path(args.data), "--data"), (Path(args.tokenizer) / "encoder.json", "--tokenizer")):
        if not path.is_file():
            raise ValueError(f"{what}: {path} not found")
    rows = []
    for v in variants:
        cmd = [sys.executable, __file__, "--child", v, *sys.argv[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_ROW ")), None)
        row = (
            json.loads(line[len("BENCH_ROW ") :]) if line else {"variant": v, "status": f"crashed rc={proc.returncode}"}
        )
        if not line:
            sys.stderr.write(proc.stderr[-3000:])
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = next((r for r in rows if r["variant"] == "trl_default" and r["status"] == "ok"), None)
    cols = [
        "variant",
        "status",
        "steps",
        "s_per_step",
        "pairs_per_s",
        "pairs_per_s_e2e",
        "init_s",
        "tokens_per_s_e2e",
        "peak_alloc_gib",
        "peak_reserved_gib",
        "speedup_steady",
        "speedup_e2e",
    ]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        if base is not None and r["status"] == "ok":
            r["speedup_steady"] = r["pairs_per_s"] / base["pairs_per_s"]
            r["speedup_e2e"] = r["pairs_per_s_e2e"] / base["pairs_per_s_e2e"]
        print(
            "| " + " | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
