"""LoRA-DPO throughput and peak memory on one GPU: TRL's defaults vs our configuration, same batch, same data, one call.

    python projects/6c_dpo/bench.py                                  # trl_default, ours, ours_liger; ~3 min on one H200
    python projects/6c_dpo/bench.py --variants ours_v1,ours_mb4,ours_mb8,ref_step   # the 2026-11-29 config, micro-batches
    python projects/6c_dpo/bench.py --variants precompute_only,no_ckpt_only,group_only  # one change each vs trl_default
    python projects/6c_dpo/bench.py --steps 0                        # a measured full epoch instead of 16 steps

--data / --tokenizer default to $PHASE6_SHARED_DATA (or ../shared/data) llamafactory-dpo-en-demo / gpt2-tokenizer.
``ours_liger`` needs liger-kernel (pure Python; torch ships triton): without it that row says so, the rest run.

Model: Qwen2.5-7B-Instruct's architecture (preset qwen2.5-7b, 32K positions) with random bf16 weights built on the GPU
("dummy weights": same shapes, FLOPs and memory as the real model; no download). LoRA r=16, alpha=32 on every
linear layer, 8 pairs per optimizer step, max_length 1024, LLaMA-Factory's dpo_en_demo.json tokenised with the
GPT-2 BPE (no Qwen tokenizer offline): 300 pairs, of which TRL drops the 46 whose prompt alone fills 1024 tokens,
so an epoch is 254 pairs = 32 steps. Each variant runs in its own subprocess (a clean CUDA context per peak-memory
number; a crash or OOM is a row, not the end of the table).

Epoch numbers (the table's formula, so a 16-step run is not read as an epoch):
    epoch s = init s + one-off s + steps/epoch x s/step
- init s: trainer construction (tokenising, PEFT wrap, and the precomputed reference pass where a variant has one);
- s/step: measured seconds per padded token over the steps after ``--warmup``, times the mean padded tokens per step
  of a FULL epoch under this variant's sampler and micro-batch (expected value over 32 sampler seeds, computed from
  the tokenised lengths). Step time follows padded tokens, and the length-grouped sampler puts the longest batch
  first, so a plain mean or median of a few steps would not be an epoch's;
- one-off s: the warm-up steps' time beyond their token share (CUDA/cuBLAS start, triton JIT for liger);
- pairs/s steady = pairs per epoch / (steps x s/step); pairs/s epoch = pairs per epoch / epoch s.
Also printed: ref_pass_s (the reference pass inside init s), hash_s (TRL's hash_module: spent inside init s by
ours_v1; for ours / ours_liger what it WOULD cost, timed on 2 decoder layers and scaled by element count, after
training, not in any other column), the raw median s/step and the measured end-to-end pairs/s of the steps run.

Variants (knobs: gradient checkpointing, reference = TRL per step | TRL's precompute | ours sorted, length grouping,
liger layer kernels, micro-batch x accumulation = 8 pairs):
- trl_default: TRL 1.16 DPOConfig defaults with LoRA: gradient checkpointing, a reference forward (adapter disabled)
  every step, random batches of 8 pairs padded to their longest sequence (1.79x the real tokens on this data).
- ours (= configs/dpo.yaml): precomputed reference by phase6.posttrain.reference (length-sorted batches of 16 pairs,
  1.17x padding, no weight hash), no gradient checkpointing, length-grouped batches, micro-batch 2 x accumulation 4
  (1.14x padding).
- ours_liger: ours + TRL's use_liger_kernel (Liger RMSNorm, RoPE, SwiGLU; TRL 1.16 refuses Liger's fused linear
  cross-entropy because its own fused LM head already never builds the (B, T, 152064) logits).
- ours_mb4 / ours_mb8 / ours_liger_mb4: other micro-batches. ours_v1: the 2026-11-29 "ours" (TRL's own precompute
  incl. its hash, micro-batch 8). ref_step: ours with a reference forward per step instead of the precompute.
- precompute_only / no_ckpt_only / group_only: trl_default with one knob changed.

Why (measured 2026-11-29, one H200: trl_default 2.31 s/step, init 5.5 s, 24.0 GiB; ours_v1 1.17 s/step, init 71.6 s,
125.8 GiB):
- ours_v1's 66 s of extra init: TRL's precompute first runs trl.trainer.utils.hash_module over the whole model
  (every tensor to the CPU, bf16 -> fp32, .numpy().tobytes(), SHA-256 on one core: 30 GB; 47 s on the dev CPU) to
  key a cache an in-memory dataset never reuses, then scores the pairs in stored order at batch 16 (1.82x padding).
- its 125.8 GiB: without checkpointing every layer keeps its activations, ~6.6 MiB per token for this model
  (RMSNorm fp32 copies, q/k/v + RoPE, SDPA in/out, 3 x 18944-wide SwiGLU tensors, 28 layers); the logits are not the
  problem (TRL's fused head). The length-grouped sampler puts the 16 longest sequences together first: 16 x 1024
  tokens x 6.6 MiB + 14.2 GiB of weights = 120+ GiB. Peak therefore scales with micro-batch pairs x 2 x max_length.

Predictions for the default run (one H200; trl_default calibrated to 2.31 s/step; range = backward 2.0x or 4.5x a
forward, the two readings of the 2026-11-29 pair):
| variant | s/step | init s | epoch s | pairs/s epoch | x steady | x epoch | peak alloc GiB |
| trl_default | 2.3 | 5.5 | 81 | 3.1 | 1.0 | 1.0 | 24 |
| ours | 0.9-1.1 | 12-16 | 46-49 | 5.2-5.6 | 2.1-2.6 | 1.65-1.8 | 40-46 (fits 80 GB) |
| ours_liger | 0.8-1.0 | 12-16 | 47-57 | 4.5-5.4 | 2.3-2.8 | 1.45-1.75 | 32-38 |
ours_liger's steps are 5-10 % faster (fewer elementwise kernels) and it keeps ~30 % fewer activation bytes, but a fresh
machine compiles its triton kernels in the first step (5-15 s one-off), which a 254-pair epoch feels and a 60k-pair
UltraFeedback epoch does not. ours_mb4 within +-5 % of ours at 66-71 GiB (too close to 80 GB to ship); ours_v1 init
65-75 s again, hash_s 40-55 of it; ref_step the same epoch s as ours within 5 % (for one epoch the reference forward
costs the same wherever it runs; the precompute wins with every further epoch and every eval, which reuse it) but
s/step +30-40 %.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from phase6.plan.model import qwen_config  # noqa: E402
from phase6.timing import sync, wall  # noqa: E402

# Qwen/Qwen2.5-7B-Instruct config.json: the base model's shapes (configs/plan/model/qwen2.5-7b.yaml), 32K positions
QWEN25_7B = qwen_config("qwen2.5-7b", max_position_embeddings=32768)
# ref: "step" = TRL's reference forward in every step, "trl" = TRL's precompute, "sorted" = phase6.posttrain.reference
BASE = dict(gradient_checkpointing=True, ref="step", group=False, liger=False, micro_batch_size=8)
OURS = dict(BASE, gradient_checkpointing=False, ref="sorted", group=True, micro_batch_size=2)
VARIANTS: dict[str, dict[str, Any]] = {
    "trl_default": dict(BASE),
    "ours": dict(OURS),
    "ours_liger": dict(OURS, liger=True),
    "ours_mb4": dict(OURS, micro_batch_size=4),
    "ours_liger_mb4": dict(OURS, liger=True, micro_batch_size=4),
    "ours_mb8": dict(OURS, micro_batch_size=8),
    "ours_v1": dict(OURS, ref="trl", micro_batch_size=8),
    "ref_step": dict(OURS, ref="step"),
    "precompute_only": dict(BASE, ref="sorted"),
    "no_ckpt_only": dict(BASE, gradient_checkpointing=False),
    "group_only": dict(BASE, group=True),
}
DEFAULT_VARIANTS = "trl_default,ours,ours_liger"
PAIRS_PER_STEP = 8
REF_BATCH = 16  # configs/dpo.yaml dpo.trl.precompute_ref_batch_size
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


def epoch_padded_tokens(
    lengths: list[int], max_length: int, micro_batch_size: int, grouped: bool, num_seeds: int = 32
) -> float:
    """Expected padded tokens of one epoch: each micro-batch is 2 x n sequences padded to its longest (<= max_length).

    ``lengths``: prompt + longer completion per pair (sampling.pair_lengths). Order: TRL's random sampler, or the
    length-grouped one (transformers' get_length_grouped_indices at 8 pairs per step, as sampling.length_grouped).
    """
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    totals = []
    for seed in range(num_seeds):
        g = torch.Generator().manual_seed(seed)
        order = (
            get_length_grouped_indices(lengths, PAIRS_PER_STEP, generator=g)
            if grouped
            else torch.randperm(len(lengths), generator=g).tolist()
        )
        total = 0
        for i in range(0, len(order), micro_batch_size):
            mb = order[i : i + micro_batch_size]
            total += 2 * len(mb) * min(max(lengths[j] for j in mb), max_length)
        totals.append(total)
    return statistics.fmean(totals)


def epoch_estimate(
    times: list[float], tokens: list[int], warmup: int, init_s: float, epoch_tokens: float, num_pairs: int
) -> dict[str, float]:
    """The table's epoch numbers from measured step times and their padded tokens (module docstring's formula)."""
    assert len(times) == len(tokens) and len(times) > warmup, (len(times), len(tokens), warmup)
    s_per_token = sum(times[warmup:]) / sum(tokens[warmup:])
    one_off = sum(times[:warmup]) - s_per_token * sum(tokens[:warmup])
    steps = math.ceil(num_pairs / PAIRS_PER_STEP)
    s_per_step = s_per_token * epoch_tokens / steps
    epoch_s = init_s + one_off + steps * s_per_step
    return {
        "steps_per_epoch": steps,
        "s_per_step": s_per_step,
        "one_off_s": one_off,
        "epoch_s": epoch_s,
        "pairs_per_s": num_pairs / (steps * s_per_step),
        "pairs_per_s_epoch": num_pairs / epoch_s,
    }


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import trl.trainer.dpo_trainer as trl_dpo
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, Qwen2Config, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from phase6.posttrain.dpo_data import build_preference_pairs, read_rows
    from phase6.posttrain.reference import precomputed_reference
    from phase6.posttrain.sampling import length_grouped, pair_lengths

    v = VARIANTS[variant]
    cuda = not args.dry_run_cpu
    device = "cuda" if cuda else "cpu"  # sync(device): CUDA-synchronized clock reads, a no-op on CPU
    torch.manual_seed(0)
    tok = gpt2_tokenizer(Path(args.tokenizer))
    pairs, _ = build_preference_pairs(read_rows(args.data), "llamafactory", source=args.data)
    if args.dry_run_cpu:
        pairs = pairs[:24]
    arch = dict(QWEN25_7B, **TINY_OVERRIDES) if args.dry_run_cpu else QWEN25_7B
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**arch), dtype=torch.bfloat16 if cuda else torch.float32)
    weights_gib = torch.cuda.memory_allocated() / 2**30 if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            sync(device)
            self._t = wall()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            sync(device)
            self.times.append(wall() - self._t)

    timer = StepTimer()
    # instruments for the ref="trl" variant: TRL's weight hash and its reference pass, timed where TRL calls them
    spent = {"hash_s": 0.0, "ref_pass_s": 0.0}
    if v["ref"] == "trl":
        real_hash = trl_dpo.hash_module

        def timed_hash(module: Any) -> str:
            t = wall()
            out = real_hash(module)
            spent["hash_s"] += wall() - t
            return out

        trl_dpo.hash_module = timed_hash

    class TimedTRLPrecompute(DPOTrainer):
        def _precompute_ref_logps(self, *a: Any, **k: Any) -> Any:
            t = wall()
            out = super()._precompute_ref_logps(*a, **k)
            sync(device)
            spent["ref_pass_s"] += wall() - t
            return out

    mb = v["micro_batch_size"]
    max_length = 256 if args.dry_run_cpu else 1024
    cfg = DPOConfig(
        output_dir=str(Path(args.workdir) / variant),
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=PAIRS_PER_STEP // mb,
        max_length=max_length,
        learning_rate=5e-6,
        max_steps=args.steps if args.steps > 0 else -1,
        num_train_epochs=1,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=v["gradient_checkpointing"],
        precompute_ref_log_probs=v["ref"] == "trl",
        precompute_ref_batch_size=REF_BATCH if v["ref"] != "step" else None,
        use_liger_kernel=v["liger"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer_cls: Any = {"trl": TimedTRLPrecompute, "sorted": precomputed_reference(DPOTrainer), "step": DPOTrainer}[
        v["ref"]
    ]
    trainer_cls = length_grouped(trainer_cls) if v["group"] else trainer_cls
    t0 = wall()
    trainer = trainer_cls(
        model=model, args=cfg, train_dataset=Dataset.from_list(pairs), processing_class=tok, peft_config=lora
    )
    trainer.add_callback(timer)
    sync(device)
    init_s = wall() - t0
    if v["ref"] == "sorted":
        spent["ref_pass_s"] = trainer.reference_pass_s

    micro_tokens: list[int] = []  # padded tokens (2 x n x padded width) of every micro-batch, in training order
    collate = trainer.data_collator

    def counting_collator(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = collate(rows)
        micro_tokens.append(out["input_ids"].numel())
        return out

    trainer.data_collator = counting_collator
    t1 = wall()
    trainer.train()
    sync(device)
    train_s = wall() - t1
    if v["ref"] == "sorted":
        # what TRL's precompute would have spent on hash_module for this model: hash 2 decoder layers and scale by
        # element count (the hash is linear in it: every tensor goes to the CPU, is widened to fp32, SHA-256ed)
        layers = list(trainer.model.get_base_model().model.layers[:2])
        t = wall()
        for layer in layers:
            trl_dpo.hash_module(layer)
        sample_numel = sum(x.numel() for layer in layers for x in layer.state_dict().values())
        all_numel = sum(x.numel() for x in trainer.model.state_dict().values())
        spent["hash_s"] = (wall() - t) * all_numel / sample_numel

    num_pairs = len(trainer.train_dataset)  # after TRL drops pairs whose prompt alone fills max_length
    accum = PAIRS_PER_STEP // mb
    steps = len(timer.times)
    step_tokens = [sum(micro_tokens[i * accum : (i + 1) * accum]) for i in range(steps)]
    lengths = pair_lengths(trainer.train_dataset)
    epoch_tokens = epoch_padded_tokens(lengths, max_length, mb, grouped=v["group"])
    est = epoch_estimate(timer.times, step_tokens, args.warmup, init_s, epoch_tokens, num_pairs)
    real_tokens = sum(
        min(len(p) + len(c), max_length) + min(len(p) + len(r), max_length)
        for p, c, r in zip(
            trainer.train_dataset["prompt_ids"],
            trainer.train_dataset["chosen_ids"],
            trainer.train_dataset["rejected_ids"],
            strict=True,
        )
    )
    pairs_trained = min(steps * PAIRS_PER_STEP, num_pairs) if args.steps > 0 else num_pairs
    return {
        "variant": variant,
        "status": "ok",
        "mb_x_accum": f"{mb}x{accum}",
        "pairs_per_epoch": num_pairs,
        "steps": steps,
        **est,
        "init_s": init_s,
        "ref_pass_s": spent["ref_pass_s"] if v["ref"] != "step" else None,
        "hash_s": spent["hash_s"] if v["ref"] != "step" else None,  # ref="sorted": TRL's, estimated, not spent
        "epoch_padding": epoch_tokens / real_tokens,
        "median_s_per_step": statistics.median(timer.times[args.warmup :]),
        "pairs_per_s_measured": pairs_trained / (init_s + train_s),
        "train_s": train_s,
        "step_times": [round(t, 4) for t in timer.times],
        "step_padded_tokens": step_tokens,
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "weights_gib": weights_gib,
        "knobs": v,
    }


COLS = [
    "variant",
    "status",
    "mb_x_accum",
    "steps",
    "s_per_step",
    "pairs_per_s",
    "init_s",
    "ref_pass_s",
    "hash_s",
    "one_off_s",
    "epoch_s",
    "pairs_per_s_epoch",
    "speedup_steady",
    "speedup_epoch",
    "peak_alloc_gib",
    "peak_reserved_gib",
    "median_s_per_step",
    "pairs_per_s_measured",
]


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["variant"] == "trl_default" and r["status"] == "ok"), None)
    for r in rows:
        if base is not None and r["status"] == "ok":
            r["speedup_steady"] = r["pairs_per_s"] / base["pairs_per_s"]
            r["speedup_epoch"] = r["pairs_per_s_epoch"] / base["pairs_per_s_epoch"]
    lines = [
        "epoch s = init s + one-off s + steps/epoch x s/step; s/step = measured s per padded token (steps after "
        "warm-up) x a full epoch's mean padded tokens per step; pairs/s = pairs per epoch / (steps x s/step); "
        "hash_s: TRL's weight hash, spent in init (ours_v1) or estimated and not spent (ours*)",
        "| " + " | ".join(COLS) + " |",
        "|" + "---|" * len(COLS),
    ]
    for r in rows:
        lines.append(
            "| " + " | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in COLS) + " |"
        )
    return "\n".join(lines)


def _shared_data() -> Path:
    env = os.environ.get("PHASE6_SHARED_DATA")
    for p in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if p.is_dir():
            return p
    return REPO / "data"


def main() -> int:
    shared = _shared_data()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(shared / "llamafactory-dpo-en-demo" / "dpo_en_demo.json"))
    p.add_argument("--tokenizer", default=str(shared / "gpt2-tokenizer"), help="dir with encoder.json + vocab.bpe")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--steps", type=int, default=16, help="optimizer steps per variant (8 pairs each); 0 = one epoch")
    p.add_argument("--warmup", type=int, default=3, help="steps charged as one-off, not to the per-token rate")
    p.add_argument("--child-timeout", type=float, default=170.0, help="seconds per variant before it is a row")
    p.add_argument("--workdir", default="/tmp/phase6_dpo_bench")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    p.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="tiny model on CPU, 24 pairs, max_length 256: checks the code path only",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        try:
            row = child(args.child, args)
        except Exception as e:  # an OOM (or any failure) of one variant is a result row, not a crash of the table
            import traceback

            traceback.print_exc()
            row = {"variant": args.child, "status": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        print("BENCH_ROW " + json.dumps(row), flush=True)
        return 0
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    if args.steps != 0 and args.steps <= args.warmup:
        raise ValueError(f"--steps: must be 0 (one epoch) or > --warmup ({args.warmup}), got {args.steps}")
    for path, what in ((Path(args.data), "--data"), (Path(args.tokenizer) / "encoder.json", "--tokenizer")):
        if not path.is_file():
            raise ValueError(f"{what}: {path} not found")
    rows = []
    t_all = wall()
    for v in variants:
        t = wall()
        cmd = [sys.executable, __file__, "--child", v, *sys.argv[1:]]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = f"timed out after {args.child_timeout:.0f} s\n", "timeout"
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCH_ROW ")), None)
        row = json.loads(line[len("BENCH_ROW ") :]) if line else {"variant": v, "status": f"crashed rc={rc}"}
        if row["status"] != "ok":
            sys.stderr.write(err[-3000:])
        row["wall_s"] = wall() - t
        rows.append(row)
        short = {k: row.get(k) for k in ("variant", "status", "s_per_step", "init_s", "epoch_s", "peak_alloc_gib")}
        print(f"[{wall() - t_all:.0f}s] {json.dumps(short)}", flush=True)
    print("\n" + table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
