"""6C training on a tiny random Qwen2 model (CPU, seconds): DPO raises the probe margin, the reference is the base
with the adapter disabled, and dpo.loss selects TRL's sigmoid / IPO losses or the ORPO trainer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from phase6.config import CONFIG_DIR, RunConfig, load_object
from phase6.config.dpo import (
    DiagnosticsConfig,
    DPODataConfig,
    DPOEvalConfig,
    DPOLoraConfig,
    DPOModelConfig,
    DPORunConfig,
    DPOTrainConfig,
)
from phase6.posttrain.diagnostics import MarginProbeCallback, adapter_disabled, sequence_logps, tokenize_pairs
from phase6.posttrain.dpo_data import load_preference_data
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

SMOKE = CONFIG_DIR.parent / "projects" / "6c_dpo" / "data" / "smoke_pairs.jsonl"
build_trainer = load_object("projects/6c_dpo/dpo.py:build_trainer")


def tiny(seed: int = 0) -> tuple[Any, Any, Any]:
    splits = load_preference_data(str(SMOKE), "preference", eval_size=8, seed=seed)
    texts = [m["content"] for r in splits.train for k in ("prompt", "chosen", "rejected") for m in r[k]]
    tok = build_tiny_tokenizer(texts, vocab_size=384)
    return splits, tok, build_tiny_model(tok, seed=seed)


def run_cfg(tmp_path: Path, **dpo: Any) -> DPORunConfig:
    train = dict(
        learning_rate=5e-3,
        grad_accum_steps=1,
        max_steps=12,
        micro_batch_size=8,
        max_length=128,
        eval_steps=4,
        logging_steps=2,
        warmup_ratio=0.0,
    )
    train.update(dpo)
    return DPORunConfig(
        run=RunConfig(dir=str(tmp_path), name="t", seed=0),
        model=DPOModelConfig(name_or_path="tiny", dtype="fp32"),
        lora=DPOLoraConfig(r=8, alpha=16, dropout=0.0),
        data=DPODataConfig(path=str(SMOKE), eval_size=8),
        dpo=DPOTrainConfig(**train),
        diagnostics=DiagnosticsConfig(probe_size=8, length_prompts=8),
        eval=DPOEvalConfig(enabled=False, tasks=[], target="judge"),
    )


def test_dpo_raises_margin_on_training_pairs_and_reference_is_the_disabled_adapter(tmp_path: Path) -> None:
    splits, tok, model = tiny()
    cfg = run_cfg(tmp_path)
    probe = tokenize_pairs([splits.train[i] for i in range(16)], tok, cfg.dpo.max_length)
    cb = MarginProbeCallback(probe, tok.pad_token_id, cfg.dpo.max_length, batch_size=8)
    trainer = build_trainer(cfg, model, tok, splits, False, [cb])
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(v) for v in losses)
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])]
    assert sorted(changed) == sorted(lora), "every LoRA parameter must change"
    steps = [r.step for r in cb.records]
    assert steps == [0, 4, 8, 12]
    first, last = cb.records[0], cb.records[-1]
    # chosen = terse correct answer, rejected = wrong + verbose: the margin must rise by more than noise
    assert last.summary()["margin_mean"] > first.summary()["margin_mean"] + 2.0
    assert first.reward_accuracy == 0.0 and last.reward_accuracy >= 0.9
    # reference = base with the adapter disabled = the step-0 policy (LoRA B starts at 0); fp32, tolerance 1e-4 nats
    with adapter_disabled(trainer.model):
        c, r = sequence_logps(trainer.model, probe, tok.pad_token_id, cfg.dpo.max_length, batch_size=8)
    assert torch.allclose(c, torch.tensor(first.chosen_logps), atol=1e-4)
    assert torch.allclose(r, torch.tensor(first.rejected_logps), atol=1e-4)


@pytest.mark.parametrize("loss,beta,expected", [("sigmoid", 0.1, math.log(2.0)), ("ipo", 0.1, 1 / (4 * 0.1**2))])
def test_loss_selection_reaches_trl_loss(tmp_path: Path, loss: str, beta: float, expected: float) -> None:
    """At step 0 the policy equals the reference, so the log-ratios are 0: sigmoid DPO = ln 2, IPO = (1/(2β))²."""
    from trl import DPOTrainer

    splits, tok, model = tiny()
    trainer = build_trainer(run_cfg(tmp_path, loss=loss, beta=beta), model, tok, splits, False, [])
    assert isinstance(trainer, DPOTrainer) and trainer.args.loss_type == [loss] and trainer.beta == beta
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        value = trainer.compute_loss(trainer.model, batch).item()
    assert value == pytest.approx(expected, rel=1e-5)


def test_orpo_selects_trl_single_stage_trainer(tmp_path: Path) -> None:
    from trl.experimental.orpo import ORPOTrainer

    splits, tok, model = tiny()
    trainer = build_trainer(
        run_cfg(tmp_path, loss="orpo", beta=0.1, max_steps=2, trl={"precompute_ref_batch_size": 16}),
        model,
        tok,
        splits,
        False,
        [],
    )
    assert isinstance(trainer, ORPOTrainer) and trainer.args.beta == 0.1
    trainer.train()
    logged = {k for h in trainer.state.log_history for k in h}
    assert "log_odds_ratio" in logged and "nll_loss" in logged
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_config_validation_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dpo\.loss: must be one of"):
        DPOTrainConfig(loss="kto")
    with pytest.raises(ValueError, match=r"dpo\.trl: keys \['beta'\] are typed fields"):
        DPOTrainConfig(trl={"beta": 0.5})
    with pytest.raises(ValueError, match=r"lora\.target_modules: must not contain lm_head"):
        DPOLoraConfig(target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"eval\.target: must be 'judge' or one of the battery tasks"):
        DPOEvalConfig(tasks=["mmlu"], target="truthfulqa_mc2")
    splits, tok, model = tiny()
    cfg = run_cfg(tmp_path)
    with pytest.raises(ValueError, match=r"dpo\.trl: \['not_a_field'\] are not fields of trl\.DPOConfig"):
        build_trainer(run_cfg(tmp_path, trl={"not_a_field": 1}), model, tok, splits, False, [])
    cfg.lora.target_modules = ["c_attn"]  # a GPT-2 name on a Qwen2 model
    with pytest.raises(ValueError, match=r"lora\.target_modules: \['c_attn'\] not in Qwen2ForCausalLM"):
        build_trainer(cfg, model, tok, splits, False, [])


def test_group_by_length_cuts_padding(tmp_path: Path) -> None:
    """Pairs of very different lengths: the length-grouped sampler pads far less than TRL's random sampler."""
    from datasets import Dataset
    from trl import DPOTrainer

    from phase6.posttrain.dpo_data import PreferenceSplits, PreferenceSummary
    from phase6.posttrain.sampling import pair_lengths

    rows = [{"prompt": "count " * (1 + (7 * i) % 60), "chosen": "yes", "rejected": "no no"} for i in range(64)]
    splits = PreferenceSplits(
        Dataset.from_list(rows[8:]), Dataset.from_list(rows[:8]), PreferenceSummary("x", "p", 64, 64)
    )
    tok = build_tiny_tokenizer([r["prompt"] for r in rows], vocab_size=300)

    def padding(group: bool) -> int:
        # batch 2: LengthGroupedSampler sorts mega-batches of min(len // (4 * batch), 50) batches
        cfg = run_cfg(tmp_path, group_by_length=group, micro_batch_size=2)
        trainer = build_trainer(cfg, build_tiny_model(tok), tok, splits, False, [])
        assert isinstance(trainer, DPOTrainer)
        total = 0
        for batch in trainer.get_train_dataloader():
            total += int((batch["attention_mask"] == 0).sum())
        lengths = pair_lengths(trainer.train_dataset)
        assert len(lengths) == 56
        return total

    grouped, random = padding(True), padding(False)
    assert grouped < 0.5 * random, (grouped, random)
