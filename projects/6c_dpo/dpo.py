"""6C: LoRA-DPO (sigmoid / IPO / ORPO) with TRL + PEFT, margin and length diagnostics, regression battery, verdict.

    phase6 dpo experiment=smoke                                    # tiny model, CPU, < 2 min
    phase6 dpo model=qwen2.5-7b-instruct lora=qwen2.5 data=ultrafeedback
    phase6 dpo -m dpo.beta=0.01,0.05,0.1,0.3                        # β ablation -> sweep summary.md
    phase6 dpo -m dpo.loss=sigmoid,ipo,orpo                         # loss ablation
    torchrun --nproc-per-node 8 -m phase6 dpo model=llama3.1-8b-instruct lora=llama3.1   # data parallel

Order: data (validated, split) -> model + tokenizer -> "before" generations (length stats, judge answers) ->
TRL trainer with the margin probe -> adapter saved -> "after" generations -> free the policy -> lm-eval battery on
base and on base + saved adapter (the artifact you ship is the one evaluated) -> verdict -> results.md.
The reference model is the base with the adapter disabled (TRL does this when ref_model=None with a PEFT model).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import httpx
import torch

from phase6 import metrics as M
from phase6.config.dpo import DPORunConfig
from phase6.cost import run_cost
from phase6.dist import barrier
from phase6.dtypes import engine_dtype, hf_load_dtype
from phase6.errors import one_line
from phase6.evals.battery import BatteryResult, delta_rows, run_battery
from phase6.evals.judge import judge_pairwise, probe_judge
from phase6.evals.verdict import dpo_verdict
from phase6.posttrain.diagnostics import (
    LengthComparison,
    LengthStats,
    MarginProbeCallback,
    generation_lengths,
    plot_margins,
    token_length_stats,
    tokenize_pairs,
)
from phase6.posttrain.dpo_data import load_preference_data, preflighted
from phase6.runrecord import RunRecord, trainer_log_callback
from phase6.timing import wall


def build_model_and_tokenizer(cfg: DPORunConfig, train_texts: list[str], use_cuda: bool) -> tuple[Any, Any, str]:
    """(model, tokenizer, base path for lm-eval). ``tiny`` is built locally and saved so lm-eval can load it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

    m = cfg.model
    if m.is_tiny:
        tok = build_tiny_tokenizer(train_texts, vocab_size=m.tiny_vocab_size)
        model = build_tiny_model(tok, hidden_size=m.tiny_hidden_size, num_layers=m.tiny_layers, seed=cfg.run.seed)
        base_path = str(Path(cfg.run.dir) / "base_model")
        if int(os.environ.get("RANK", "0")) == 0:
            model.save_pretrained(base_path)
            tok.save_pretrained(base_path)
        return model, tok, base_path
    dtype = hf_load_dtype(m.dtype, use_cuda)  # bf16 on a CPU-only machine loads as fp32
    kw: dict[str, Any] = {"revision": m.revision, "trust_remote_code": m.trust_remote_code}
    tok = AutoTokenizer.from_pretrained(m.name_or_path, **kw)
    model = AutoModelForCausalLM.from_pretrained(
        m.name_or_path, dtype=dtype, attn_implementation=m.attn_implementation, **kw
    )
    return model, tok, m.name_or_path


def lora_config(cfg: DPORunConfig, model: Any) -> Any:
    from peft import LoraConfig

    lc = cfg.lora
    if lc.target_modules != ["all-linear"]:
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        missing = [t for t in lc.target_modules if t not in names]
        if missing:
            raise ValueError(f"lora.target_modules: {missing} not in {type(model).__name__} (lora.arch={lc.arch})")
    targets: Any = "all-linear" if lc.target_modules == ["all-linear"] else list(lc.target_modules)
    return LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=targets,
        use_rslora=lc.use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )


def build_trainer(cfg: DPORunConfig, model: Any, tok: Any, splits: Any, use_cuda: bool, callbacks: list[Any]) -> Any:
    """TRL DPOTrainer (sigmoid, ipo, ...) or the experimental ORPOTrainer, with our typed knobs + the pass-through.

    ``dpo.trl`` keys must be fields of DPOConfig or ORPOConfig; under ORPO, DPO-only keys (e.g.
    precompute_ref_batch_size, which has no meaning without a reference) are left out and listed on the console.
    """
    import dataclasses

    from trl import DPOConfig
    from trl.experimental.orpo import ORPOConfig

    d = cfg.dpo
    target_cls = ORPOConfig if d.loss == "orpo" else DPOConfig
    known = {f.name for f in dataclasses.fields(DPOConfig)} | {f.name for f in dataclasses.fields(ORPOConfig)}
    unknown = sorted(set(d.trl) - known)
    if unknown:
        raise ValueError(f"dpo.trl: {unknown} are not fields of trl.DPOConfig or ORPOConfig")
    target_fields = {f.name for f in dataclasses.fields(target_cls)}
    passed = {k: v for k, v in d.trl.items() if k in target_fields}
    if set(d.trl) - set(passed):
        print(f"dpo.trl: {sorted(set(d.trl) - set(passed))} do not apply to {target_cls.__name__}; left out")
    common: dict[str, Any] = dict(
        output_dir=str(Path(cfg.run.dir) / "trainer"),
        learning_rate=d.learning_rate,
        num_train_epochs=d.num_epochs,
        max_steps=d.max_steps,
        per_device_train_batch_size=d.micro_batch_size,
        per_device_eval_batch_size=d.micro_batch_size,
        gradient_accumulation_steps=d.grad_accum_steps,
        max_length=d.max_length,
        gradient_checkpointing=d.gradient_checkpointing,
        warmup_steps=d.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the total steps
        lr_scheduler_type=d.lr_scheduler,
        beta=d.beta,
        bf16=use_cuda and model.dtype == torch.bfloat16,
        use_cpu=not use_cuda,
        seed=cfg.run.seed,
        eval_strategy="steps",
        eval_steps=d.eval_steps,
        logging_steps=d.logging_steps,
        save_strategy="no",
        report_to=[],  # RunRecord owns W&B (one run per sweep member) and metrics.jsonl
        **{"disable_tqdm": True, **passed},  # RunRecord prints one line per log step (dpo.trl may turn the bar on)
    )
    peft_cfg = lora_config(cfg, model)
    from phase6.posttrain.sampling import length_grouped

    if d.loss == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        args = ORPOConfig(**common)
        orpo_cls = length_grouped(ORPOTrainer) if d.group_by_length else ORPOTrainer
        return orpo_cls(
            model=model,
            args=args,
            train_dataset=splits.train,
            eval_dataset=splits.eval,
            processing_class=tok,
            peft_config=peft_cfg,
            callbacks=callbacks,
        )
    from trl import DPOTrainer

    from phase6.posttrain.reference import precomputed_reference

    # dpo.precompute_ref_log_probs runs our length-sorted pass; TRL's own (False here) first SHA-256es every weight
    # on the CPU (~50 s for a 7B model) for a cache an in-memory dataset cannot reuse (posttrain/reference.py)
    trainer_cls: Any = precomputed_reference(DPOTrainer) if d.precompute_ref_log_probs else DPOTrainer
    trainer_cls = length_grouped(trainer_cls) if d.group_by_length else trainer_cls
    args = DPOConfig(loss_type=[d.loss], precompute_ref_log_probs=False, **common)
    return trainer_cls(
        model=model,
        ref_model=None,
        args=args,
        train_dataset=splits.train,
        eval_dataset=splits.eval,
        processing_class=tok,
        peft_config=peft_cfg,
        callbacks=callbacks,
    )


def record_callback(rec: RunRecord) -> Any:
    """Forward every Trainer log (TRL's loss, rewards/*, logps/*, eval_*) to RunRecord under fixed key names."""
    rename = {"loss": M.LOSS, "eval_loss": M.VAL_LOSS, "learning_rate": M.LR, "grad_norm": M.GRAD_NORM}
    return trainer_log_callback(rec, rename)


def main(cfg: DPORunConfig) -> Path:
    use_cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(cfg.run.seed)
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    # ---- data: validated before anything heavy is loaded
    splits = preflighted(cfg) or load_preference_data(
        cfg.data.path,
        cfg.data.format,
        split=cfg.data.split,
        data_dir=cfg.data.data_dir,
        drop_invalid=cfg.data.drop_invalid,
        max_rows=cfg.data.max_rows,
        eval_size=cfg.data.eval_size,
        seed=cfg.run.seed,
    )
    if cfg.eval.judge.base_url is not None and int(os.environ.get("RANK", "0")) == 0:
        probe_judge(cfg.eval.judge.base_url, cfg.eval.judge.api_key_env)  # a dead judge fails now, not after training
    rec = RunRecord(cfg, "dpo")
    run_dir = Path(cfg.run.dir)
    rec.print(
        f"data: {splits.summary.num_kept}/{splits.summary.num_rows} pairs kept "
        f"(dropped {splits.summary.dropped or 'none'}); train {len(splits.train)}, held-out {len(splits.eval)}"
    )

    def texts(row: dict[str, Any]) -> list[str]:
        return [
            m if isinstance(m, str) else m["content"]
            for k in ("prompt", "chosen", "rejected")
            for m in (row[k] if isinstance(row[k], list) else [row[k]])
        ]

    train_texts = [t for row in splits.train for t in texts(row)] if cfg.model.is_tiny else []
    model, tok, base_path = build_model_and_tokenizer(cfg, train_texts, use_cuda)
    if tok.pad_token is None:  # Llama 3.1 ships none; TRL makes the same choice
        tok.pad_token = tok.eos_token
    model.to(device)

    # ---- fixed held-out sets: probe pairs, length prompts, data length statistics
    probe_pairs = [splits.eval[i] for i in range(cfg.diagnostics.probe_size)]
    probe = tokenize_pairs(probe_pairs, tok, cfg.dpo.max_length)
    prompts = [splits.eval[i]["prompt"] for i in range(cfg.diagnostics.length_prompts)]
    n_stat = min(len(splits.train), 2000)
    data_len = token_length_stats(tokenize_pairs([splits.train[i] for i in range(n_stat)], tok, None))

    # ---- "before" generations from the base model (no adapter yet)
    diag = cfg.diagnostics
    before_len, before_done, before_txt = generation_lengths(
        model, tok, prompts, diag.max_new_tokens, diag.length_batch_size, cfg.dpo.max_length
    )

    # ---- train
    probe_cb = MarginProbeCallback(
        probe, tok.pad_token_id, cfg.dpo.max_length, diag.probe_batch_size, out_path=run_dir / "margins.jsonl"
    )
    trainer = build_trainer(cfg, model, tok, splits, use_cuda, [probe_cb, record_callback(rec)])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # RunRecord prints the logs; Trainer would print them again as dicts
    if use_cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = wall()
    train_out = trainer.train()
    train_s = wall() - t0
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if use_cuda else None
    final_eval = trainer.evaluate()
    if not probe_cb.records or probe_cb.records[-1].step != trainer.state.global_step:
        probe_cb.score(trainer.model, trainer.state.global_step)

    adapter_dir = run_dir / "adapter"
    policy = trainer.model
    if rec.is_main:
        policy.save_pretrained(str(adapter_dir))  # adapter_model.safetensors + adapter_config.json
        tok.save_pretrained(str(adapter_dir))

    # ---- "after" generations from base + adapter, same prompts and decoding
    after_len, after_done, after_txt = generation_lengths(
        policy, tok, prompts, diag.max_new_tokens, diag.length_batch_size, cfg.dpo.max_length
    )
    lengths = LengthComparison(
        LengthStats.of(before_len, diag.max_new_tokens, before_done),
        LengthStats.of(after_len, diag.max_new_tokens, after_done),
        cfg.eval.max_length_ratio,
    )

    judge_note, judge_rows, win_rate = "skipped: no judge endpoint configured (eval.judge.base_url=null)", [], None
    judge_error: str | None = None
    j = cfg.eval.judge
    if j.base_url is not None and rec.is_main:
        from phase6.posttrain.diagnostics import render_prompts

        qs = render_prompts(prompts[: j.num_prompts], tok)
        try:
            res = judge_pairwise(
                qs,
                before_txt[: j.num_prompts],
                after_txt[: j.num_prompts],
                base_url=j.base_url,
                model=j.model,
                api_key_env=j.api_key_env,
            )
            win_rate, judge_rows = res.win_rate, res.rows()
            judge_note = f"{j.model} at {j.base_url}: both answer orders, a win needs both to agree"
        except (httpx.HTTPError, ValueError, KeyError) as err:  # the trained adapter is saved: report, do not crash
            judge_error = f"{j.model} at {j.base_url}: {type(err).__name__}: {one_line(err)}"
            judge_note = f"UNAVAILABLE after training: {judge_error}"
            rec.print(f"judge: {judge_note}")

    # the adapter goes up before merge_and_unload folds it into the base weights
    if cfg.output.push_to_hub and rec.is_main:
        token = os.environ.get(cfg.output.hub_token_env)
        if not token:
            raise ValueError(f"output.hub_token_env: environment variable {cfg.output.hub_token_env} is not set")
        policy.push_to_hub(cfg.output.hub_model_id, private=cfg.output.hub_private, token=token)
    if cfg.output.merge and rec.is_main:
        policy.merge_and_unload().save_pretrained(str(run_dir / "merged"))
        tok.save_pretrained(str(run_dir / "merged"))

    steps = trainer.state.global_step
    pairs = steps * cfg.dpo.pairs_per_step(world)
    hist = [h for h in trainer.state.log_history if "num_tokens" in h]
    tokens = float(hist[-1]["num_tokens"]) if hist else 0.0
    trainer.accelerator.free_memory()  # the Accelerator keeps references to the prepared model and optimizer
    del trainer, policy, model
    gc.collect()
    barrier()  # rank 0 wrote the adapter (and the tiny base) that every rank's lm-eval loads next
    if use_cuda:
        torch.cuda.empty_cache()

    # ---- regression battery: base vs base + saved adapter, identical settings
    before_b: BatteryResult | None = None
    after_b: BatteryResult | None = None
    battery_error: str | None = None
    e = cfg.eval
    if e.enabled and (e.tasks or e.local_tasks):
        kw: dict[str, Any] = dict(
            local_tasks=[t.to_task() for t in e.local_tasks],
            task_dir=run_dir / "lm_eval_tasks",
            num_fewshot=e.num_fewshot,
            limit=e.limit,
            batch_size=e.batch_size,
            device=str(device),
            dtype=engine_dtype("bf16" if (use_cuda and cfg.model.dtype == "bf16") else "fp32"),
            apply_chat_template=e.apply_chat_template,
            trust_remote_code=cfg.model.trust_remote_code,
            seed=cfg.run.seed,
        )
        tasks = list(e.tasks)
        try:
            before_b = run_battery(base_path, tasks, label="base", **kw)
            after_b = run_battery(base_path, tasks, label="base+adapter", peft=str(adapter_dir), **kw)
        except Exception as err:  # a task's data unreachable, lm-eval failing: the run and its adapter still report
            battery_error = f"{type(err).__name__}: {one_line(err)}"
            before_b = after_b = None
            rec.print(f"battery: UNAVAILABLE: {battery_error}")

    verdict = dpo_verdict(
        before_b,
        after_b,
        target=e.target,
        length_ratio=lengths.ratio,
        length_truncated_frac=lengths.after.truncated_frac,
        judge_win_rate=win_rate,
        max_mmlu_drop_pts=e.max_mmlu_drop_pts,
        max_length_ratio=e.max_length_ratio,
        judge_error=judge_error,
        battery_error=battery_error,
    )

    # ---- report
    first, last = probe_cb.records[0].summary(cfg.dpo.beta), probe_cb.records[-1].summary(cfg.dpo.beta)
    plot_margins(probe_cb.records, rec.plots_dir / "margins.png", beta=cfg.dpo.beta)
    row: dict[str, Any] = {
        "loss": cfg.dpo.loss,
        "beta": cfg.dpo.beta,
        "lr": cfg.dpo.learning_rate,
        "steps": steps,
        "train_loss": train_out.training_loss,
        "eval_reward_acc": final_eval.get("eval_rewards/accuracies"),
        "probe_margin_start": first["margin_mean"],
        "probe_margin_end": last["margin_mean"],
        "probe_reward_acc_end": last["reward_accuracy"],
        "length_ratio": lengths.ratio,
        "pairs_per_s": pairs / train_s,
        M.MEM_MAX_ALLOCATED_GIB: peak_gib,
        "verdict": verdict.status,
    }
    if before_b is not None and after_b is not None:
        for task in before_b.scores:
            row[f"d_{task}_pts"] = 100 * (after_b.scores[task].value - before_b.scores[task].value)
    rec.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=steps)
    tables = {
        "Verdict": verdict.rows(),
        "Regression battery (lm-eval, points)": delta_rows(before_b, after_b) if before_b and after_b else [],
        "Margin on the probe set (per-pair distribution in plots/margins.png, values in margins.jsonl)": [
            r.summary(cfg.dpo.beta) for r in probe_cb.records
        ],
        "Generation length (tokens, greedy, same prompts)": lengths.rows(),
        f"Preference data: completion tokens (first {n_stat} train pairs)": [data_len],
        "Data validation": splits.summary.rows(),
        "Pairwise judge": judge_rows,
        "Hyperparameters": [
            {"setting": k, "value": v, "why": cfg.dpo.justify.get(k, "")}
            for k, v in (
                ("loss", cfg.dpo.loss),
                ("beta", cfg.dpo.beta),
                ("learning_rate", cfg.dpo.learning_rate),
                ("lora.r", cfg.lora.r),
                ("lora.alpha", cfg.lora.alpha),
                ("max_length", cfg.dpo.max_length),
                ("pairs_per_step", cfg.dpo.pairs_per_step(world)),
                (
                    "precompute_ref_log_probs",
                    "n/a (ORPO has no reference)" if cfg.dpo.loss == "orpo" else cfg.dpo.precompute_ref_log_probs,
                ),
                ("gradient_checkpointing", cfg.dpo.gradient_checkpointing),
                ("group_by_length", cfg.dpo.group_by_length),
            )
        ],
    }
    notes = {
        "Judge": judge_note,
        **({"Regression battery": f"UNAVAILABLE: {battery_error}"} if battery_error else {}),
        "Reading the margins": "margin = log π(y+) − log π(y−) summed over completion tokens; the log-ratio margin "
        "subtracts the same quantity at step 0 (= the reference: LoRA starts at B = 0). DPO often lowers both "
        "log-probs while the margin grows; that is expected (eric-mitchell/direct-preference-optimization#8).",
    }
    return rec.finish([row], cost=run_cost(cfg.hardware, world, train_s, tokens), tables=tables, notes=notes)
