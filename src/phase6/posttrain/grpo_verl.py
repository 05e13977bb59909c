"""``engine=verl``: translate our GRPO config into verl's ``main_ppo`` overrides, write its data, launch it.

verl lives in its own environment (its pins: verl 0.9.1 wants vLLM 0.24.0, transformers 5.9, Ray), so phase6 never
imports it: it writes ``<run dir>/verl/{train,val}.parquet`` in verl's GSM8K schema
(verl:examples/data_preprocess/gsm8k.py: chat ``prompt``, ``data_source``, ``reward_model.ground_truth``),
``overrides.yaml`` / ``command.sh``, and runs ``python -m verl.trainer.main_ppo <overrides>``.

The reward is ours, not verl's built-in ``gsm8k.compute_score`` (that one compares strings, so 18.0 != 18, and only
reads the last 300 characters): ``reward.custom_reward_function.path`` points at this file, whose ``compute_score``
calls ``phase6.tasks.gsm8k.score``. Keys follow verl's GSM8K GRPO example (verl:examples/grpo_trainer/run_qwen2-7b.sh)
and are held against verl's own config, dataset and reward code by ``phase6.posttrain.verl_check`` in CI
(tests/test_grpo_verl.py); :data:`VERIFIED` says what that covers and what it does not.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from phase6.config.grpo import GrpoRunConfig
from phase6.posttrain.verl_check import VERL_VERSION

# TRL loss_type -> verl actor.loss_agg_mode (verl:examples/grpo_trainer/README.md)
LOSS_AGG = {
    "dapo": "token-mean",
    "bnpo": "token-mean",
    "grpo": "seq-mean-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}
VERIFIED = (
    f"engine=verl: checked against verl {VERL_VERSION} on CPU (main_ppo's Hydra config composes with these overrides and "
    "passes validate_config; verl's RLHFDataset loads the parquet; verl's reward worker loads and calls phase6's "
    "compute_score, scores equal to phase6's GSM8K scorer); NOT verified: a verl training run (never run on a GPU)"
)
"""``phase6 grpo engine=verl``'s first output line (the 6D README and docs/benchmarks.md, issue 32, say why)."""
MAX_PROMPT_LENGTH = 512
"""verl's GSM8K example value; GSM8K questions + instruction are < 300 Qwen tokens."""


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any
) -> float:
    """verl custom reward entry point (signature of verl's default_compute_score; verl's reward manager adds
    ``reward_router_address``/``reward_model_tokenizer`` keywords when a reward model is served: ignored)."""
    from phase6.tasks.gsm8k import score

    return score(solution_str, ground_truth)


def verl_overrides(
    cfg: GrpoRunConfig, data_dir: Path, run_dir: Path, num_gpus: int, model_path: str | None = None
) -> dict[str, Any]:
    """Dotted verl keys -> values, from our config (then ``engine.verl_overrides`` on top). ``model_path``: the
    directory the tiny model was saved to (``model=tiny``), else ``model.name_or_path``."""
    g = cfg.grpo
    if g.loss_type not in LOSS_AGG:
        raise ValueError(f"grpo.loss_type: {g.loss_type!r} has no verl equivalent; use one of {sorted(LOSS_AGG)}")
    if cfg.data.task != "gsm8k":
        raise ValueError("data.task: engine=verl is wired for gsm8k only")
    micro = max(1, g.micro_batch_size // max(1, num_gpus))
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": str(data_dir / "train.parquet"),
        "data.val_files": str(data_dir / "val.parquet"),
        "data.train_batch_size": g.num_prompts,
        "data.max_prompt_length": MAX_PROMPT_LENGTH,
        "data.max_response_length": g.max_completion_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "actor_rollout_ref.model.path": model_path or cfg.model.name_or_path,
        "actor_rollout_ref.model.trust_remote_code": cfg.model.trust_remote_code,
        "actor_rollout_ref.model.enable_gradient_checkpointing": g.gradient_checkpointing,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.optim.lr": g.learning_rate,
        # one optimizer step per rollout batch: the same on-policy schedule as the TRL path
        "actor_rollout_ref.actor.ppo_mini_batch_size": g.num_prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_epochs": 1,
        "actor_rollout_ref.actor.use_kl_loss": g.beta > 0,
        "actor_rollout_ref.actor.kl_loss_coef": g.beta,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",  # = Schulman k3, TRL's estimator
        "actor_rollout_ref.actor.clip_ratio": g.epsilon,
        "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG[g.loss_type],
        "actor_rollout_ref.actor.entropy_coeff": 0,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": g.num_generations,
        "actor_rollout_ref.rollout.temperature": g.temperature,
        "actor_rollout_ref.rollout.top_p": g.top_p,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.gpu_memory_utilization": cfg.engine.vllm.get("gpu_memory_utilization", 0.6),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        # verl >= 0.9 reads reward.custom_reward_function; its top-level custom_reward_function is a legacy key
        # that main_ppo composes but never reads (only the fully-async entry point migrates it): a silent
        # fallback to verl's built-in GSM8K string match (tests/test_grpo_verl.py runs verl's reward worker)
        "reward.custom_reward_function.path": str(Path(__file__).resolve()),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.n_gpus_per_node": num_gpus,
        "trainer.nnodes": 1,
        "trainer.total_training_steps": g.max_steps,
        "trainer.total_epochs": 100,  # the step limit above ends training first
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.val_before_train": cfg.eval.enabled and cfg.eval.before,
        "trainer.logger": ["console"] + (["wandb"] if cfg.logger.wandb else []),
        "trainer.project_name": cfg.logger.project,
        "trainer.experiment_name": cfg.run.name,
        "trainer.default_local_dir": str(run_dir / "verl" / "checkpoints"),
    }
    out.update(flatten(cfg.engine.verl_overrides))
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"nnodes": 2}} -> {"trainer.nnodes": 2} (command-line overrides arrive nested)."""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def verl_rows(rows: list[Any], split: str) -> list[dict[str, Any]]:
    """Gsm8kRow -> verl's GSM8K parquet schema."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": r.to_trl()["prompt"],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r.solution},
            "extra_info": {"split": split, "index": i, "question": r.question, "answer": r.answer},
        }
        for i, r in enumerate(rows)
    ]


def command(overrides: dict[str, Any]) -> list[str]:
    """``python -m verl.trainer.main_ppo key=value ...`` (lists as Hydra lists)."""
    args = []
    for k, v in overrides.items():
        value = "[" + ",".join(str(x) for x in v) + "]" if isinstance(v, list) else str(v)
        args.append(f"{k}={value}")
    return [sys.executable, "-m", "verl.trainer.main_ppo", *args]


def write_verl_job(
    cfg: GrpoRunConfig,
    train_rows: list[Any],
    val_rows: list[Any],
    run_dir: Path,
    num_gpus: int,
    model_path: str | None = None,
) -> Path:
    """Write data, overrides.yaml and command.sh under ``<run_dir>/verl``; returns that directory."""
    import yaml
    from datasets import Dataset

    out = run_dir / "verl"
    out.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(verl_rows(train_rows, "train")).to_parquet(str(out / "train.parquet"))
    Dataset.from_list(verl_rows(val_rows, "test")).to_parquet(str(out / "val.parquet"))
    overrides = verl_overrides(cfg, out, run_dir, num_gpus, model_path)
    (out / "overrides.yaml").write_text(yaml.safe_dump(overrides, sort_keys=False))
    (out / "command.sh").write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + shlex.join(command(overrides)) + "\n")
    return out
