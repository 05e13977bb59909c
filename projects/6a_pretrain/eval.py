"""6A eval: lm-eval-harness on an HF model (a 6A run's export or any HF model), plus val loss on our shards.

    phase6 eval model=outputs/pretrain/<run>/hf                        # HellaSwag, ARC-Easy, PIQA (0-shot)
    phase6 eval model=gpt2 val_data=data/finewebedu10B-gpt2 tasks=[]   # the calibration point: OpenAI GPT-2 124M
                                                                       # on our FineWeb-Edu val shard (anchor 3.2924)
    phase6 eval model=<run>/hf tasks=[hellaswag] limit=200             # a quick look (a capped task is not the task)

The val loss is the mean next-token cross-entropy (fp32 log-softmax) over the first `val_tokens` tokens of shard 0,
in windows of `val_seq_len` tokens, exactly the windows the trainer's val loss uses (phase6.data.loader.ValLoader),
so a 6A export's number here equals its run's final val/loss and HF gpt2's number is directly comparable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from phase6 import metrics
from phase6.config.pretrain import EvalRunConfig
from phase6.data.loader import ValLoader
from phase6.data.shards import check_shard, list_shards, load_manifest, read_header
from phase6.dtypes import engine_dtype, torch_dtype
from phase6.errors import UserError
from phase6.evals.battery import run_battery
from phase6.runrecord import RunRecord

# Anchors (shared/reference/anchors-6a-pretrain.md): OpenAI GPT-2 124M on the FineWeb-Edu val shard, and llm.c's
# 124M on FineWeb val; HellaSwag acc_norm of GPT-2 124M (build-nanogpt play.ipynb).
ANCHORS = {
    "GPT-2 124M (OpenAI) val loss on FineWeb-Edu val shard": 3.2924,
    "llm.c GPT-2 124M, 10.26B FineWeb tokens, FineWeb val loss": 3.2722,
    "GPT-2 124M (OpenAI) HellaSwag acc_norm 0-shot, points": 29.4,
}


@torch.no_grad()
def val_loss(cfg: EvalRunConfig, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """Mean loss of the HF model on the val shard of cfg.val_data (fp32 log-softmax, bf16 or fp32 weights)."""
    from transformers import AutoModelForCausalLM

    assert cfg.val_data is not None
    manifest = load_manifest(cfg.val_data) if Path(cfg.val_data).is_dir() else None
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
    model = model.to(device).eval()
    data_vocab = manifest.tokenizer.vocab_size if manifest is not None else 50257  # llm.c shards: GPT-2 ids
    if data_vocab > model.config.vocab_size:
        raise ValueError(
            f"val_data: {cfg.val_data} uses a {data_vocab}-token vocabulary, model {cfg.model} has "
            f"{model.config.vocab_size}: the model was not trained on this tokenizer"
        )
    max_pos = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    seq_len = cfg.val_seq_len or max_pos
    if seq_len is None:
        raise ValueError(f"val_seq_len: the config of {cfg.model} states no context length; set val_seq_len")
    if max_pos is not None and seq_len > max_pos:
        raise ValueError(f"val_seq_len: {seq_len} exceeds the model's context {max_pos}")
    loader = ValLoader(cfg.val_data, cfg.val_batch_size, seq_len, cfg.val_tokens)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for x, y in loader:
        logits = model(input_ids=x.to(device)).logits  # (B, T, V)
        total += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()).double()
    return {"val_loss": (total / len(loader)).item(), "tokens": loader.num_tokens, "seq_len": seq_len}


def preflight(cfg: EvalRunConfig) -> None:
    """The model directory and the val shards (header, manifest count, sha256), before any model is loaded."""
    model = cfg.model
    looks_local = model.startswith((".", "/", "~")) or os.sep in model and Path(model).expanduser().exists()
    if looks_local and not (Path(model).expanduser() / "config.json").is_file():
        raise UserError(f"model: {model} is not a model directory (no config.json); give an HF export or a hub id")
    if cfg.val_data:
        manifest = load_manifest(cfg.val_data) if Path(cfg.val_data).is_dir() else None
        if manifest is None:
            for path in list_shards(cfg.val_data, "val"):
                read_header(path)
        else:
            for info in manifest.shards:
                if info.split == "val":
                    check_shard(Path(cfg.val_data) / info.file, info, sha256=True)


def main(cfg: EvalRunConfig) -> dict[str, Any]:
    preflight(cfg)
    rec = RunRecord(cfg, job="eval")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bf16" if device == "cuda" else "fp32")
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"model": cfg.model}
    measured: dict[str, Any] = {}
    if cfg.tasks or cfg.local_tasks:
        res = run_battery(
            cfg.model,
            [*cfg.tasks, *(t.name for t in cfg.local_tasks)],
            label=Path(cfg.model).name or cfg.model,
            local_tasks=cfg.local_tasks,
            task_dir=rec.dir / "tasks",
            num_fewshot=cfg.num_fewshot,
            limit=cfg.limit,
            batch_size=cfg.batch_size,
            device=device,
            dtype=engine_dtype(dtype),
            trust_remote_code=cfg.trust_remote_code,
            seed=cfg.run.seed,
        )
        for s in res.scores.values():
            rows.append(
                {
                    "model": cfg.model,
                    "task": s.task,
                    "metric": s.metric,
                    "score (pts)": 100 * s.value,
                    "stderr (pts)": 100 * s.stderr if s.stderr is not None else None,
                    "n": s.n,
                }
            )
            measured[f"eval/{s.task}_{s.metric}"] = s.value
        extra["lm_eval"] = res.raw
    if cfg.val_data:
        v = val_loss(cfg, device, torch_dtype(dtype))
        rows.append(
            {
                "model": cfg.model,
                "task": f"val loss ({cfg.val_data}, shard 0)",
                "metric": "nats/token",
                "score (pts)": None,
                "value": v["val_loss"],
                "n": v["tokens"],
            }
        )
        measured[metrics.VAL_LOSS] = v["val_loss"]
    notes = {
        "Settings": (
            f"lm-eval hf backend, {engine_dtype(dtype)} on {device}, num_fewshot={cfg.num_fewshot}, "
            f"limit={cfg.limit or 'none'}; val loss = mean CE over {cfg.val_tokens:,} val tokens in "
            f"{cfg.val_seq_len or 'model-context'}-token windows (the trainer's val/loss definition)"
        ),
        "Anchors": "\n".join(f"- {k}: {v}" for k, v in ANCHORS.items()),
    }
    rec.finish(rows, measured=measured, extra=extra, notes=notes)
    return {"run_dir": str(rec.dir), "rows": rows, "measured": measured}
