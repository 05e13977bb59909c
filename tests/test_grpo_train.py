"""GRPO end to end on CPU: TRL's GRPOTrainer + our HF engine on a tiny model and the toy digits task.

- k = 0: mean reward rises measurably (first 10 steps vs last 15), every parameter moves, the breakdown of every step
  adds up to that step and the steps add up to (almost all of) the training wall-clock;
- k = 2 with truncated IS: each rollout batch comes from policy version max(0, s - 2), the engine really holds those
  weights, and the IS statistics are logged.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from phase6.posttrain import grpo_timing as T
from phase6.posttrain.grpo_trainer import EngineGRPOTrainer
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer
from phase6.rollout.hf import HFEngine
from phase6.tasks.digits import digit_reward, digit_rows, tokenizer_corpus

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def tiny_model_dir(d: Path) -> tuple[Path, Any]:
    """The tiny model and tokenizer saved in ``d`` (the trainer loads the policy by path)."""
    tok = build_tiny_tokenizer(tokenizer_corpus(), vocab_size=300)
    build_tiny_model(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d, tok


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_grpo"))


def make_trainer(
    model_dir: tuple[Path, Any],
    tmp_path: Path,
    steps: int,
    lr: float,
    *,
    num_rows: int = 4000,
    batch: dict[str, Any] | None = None,
    **kw: Any,
) -> EngineGRPOTrainer:
    """The tiny GRPO trainer of these tests (tests/test_grpo_levers.py builds its own shape through ``batch``:
    GRPOConfig fields that replace the defaults below)."""
    path, tok = model_dir
    shape = {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1, "max_completion_length": 8}
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=8,
        learning_rate=lr,
        **{**shape, **(batch or {})},
        lr_scheduler_type="constant",
        max_steps=steps,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
    )

    def build(trainer: Any) -> HFEngine:
        return HFEngine(
            AutoModelForCausalLM.from_pretrained(path), tok.pad_token_id, [tok.eos_token_id], pad_to_multiple=8
        )

    # the learning thresholds below were calibrated on TRL's shuffled micro-batches: length buckets draw no
    # torch.randperm, so they continue the seeded stream differently (tests/test_grpo_levers.py holds their step equal)
    kw.setdefault("length_buckets", False)
    return EngineGRPOTrainer(
        model=str(path),
        reward_funcs=[digit_reward],
        args=args,
        train_dataset=Dataset.from_list(digit_rows(num_rows, seed=0)),
        processing_class=tok,
        engine_builder=build,
        **kw,
    )


@pytest.mark.slow  # 23 s on the loaded 2-core box
def test_reward_rises_and_breakdown_adds_up(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    trainer = make_trainer(model_dir, tmp_path, steps=60, lr=1e-2, probe_every=20)
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0

    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-15:]) / 15
    assert last > first + 0.08 and last > 4 * first, (first, last, rewards)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h and "reward" in h]
    assert all(torch.isfinite(torch.tensor(losses)))
    unchanged = [n for n, p in trainer.model.named_parameters() if p.requires_grad and torch.equal(p, start[n])]
    assert not unchanged, unchanged

    rows = trainer.step_rows
    assert len(rows) == 60
    for r in rows:
        assert all(r[p] >= -1e-9 for p in T.PHASES), r
        assert sum(r[p] for p in T.PHASES) == pytest.approx(r["step"], rel=1e-9, abs=1e-9)
        assert r[T.ROLLOUT] > 0 and r[T.POLICY_UPDATE] > 0 and r[T.REWARD] > 0
        assert r[T.BEHAVIOUR_LOGPROBS] == 0  # the HF decode loop returns them with the tokens (no scoring pass)
    assert sum(r["step"] for r in rows) <= wall
    assert sum(r["step"] for r in rows) > 0.7 * wall  # the windows cover the loop, not a fraction of it
    assert [r[T.THROUGHPUT_PROBE] > 0 for r in rows].count(True) == 3  # steps 0, 20, 40
    logged = trainer.state.log_history[5]
    for key in ("time/rollout_s", "time/step_s", "rollout/policy_version", "rollout/engine_tokens_per_s", "sync/ms"):
        assert key in logged, key
    assert [v["lag"] for v in trainer.version_log] == [0] * 60
    probe = trainer.throughput_log[0]
    assert probe["engine_tokens_per_s"] > 0 and probe["hf_generate_tokens_per_s"] > 0


def test_fixed_staleness_serves_version_s_minus_k(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    trainer = make_trainer(model_dir, tmp_path, steps=6, lr=1e-2, staleness=2, is_correction="tis", is_clip=2.0)
    served: list[torch.Tensor] = []
    policy_at: dict[int, torch.Tensor] = {}
    original = trainer.engine.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        step = trainer.state.global_step
        policy_at[step] = trainer.model.lm_head.weight.detach().clone()
        served.append(trainer.engine.model.lm_head.weight.detach().clone())
        return original(*args, **kwargs)

    trainer.engine.generate = spy  # type: ignore[method-assign]
    trainer.train()
    assert [(v["step"], v["policy_version"]) for v in trainer.version_log] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 1),
        (4, 2),
        (5, 3),
    ]
    for step, weights in enumerate(served):  # the engine held exactly the policy of step max(0, s - 2)
        assert torch.equal(weights, policy_at[max(0, step - 2)]), step
    assert not torch.equal(policy_at[5], policy_at[3])  # the policy did move: the lag is real
    assert [s["version"] for s in trainer.sync_log] == [1, 2, 3]
    assert trainer.history.held == [4, 5]  # never more than k versions kept after a sync
    logged = [h for h in trainer.state.log_history if "staleness/is_weight_mean" in h]
    assert len(logged) == 6 and all(0 < h["staleness/is_weight_mean"] <= 2.0 for h in logged)
    assert logged[0]["staleness/kl_behaviour_current"] == pytest.approx(0.0, abs=1e-5)  # step 0 is on-policy
    assert max(h["staleness/logp_abs_diff_mean"] for h in logged[3:]) > 1e-3  # later steps are not
