"""The GRPO step levers of issue 31 keep the numbers the loss uses (CPU, float32, tiny Qwen2 model).

- length buckets: the log-probs (and their gradient) of a padded batch, trimmed and sorted into chunks, equal the
  plain padded pass within 1e-5 nats (float32: only the RoPE angles' absolute offset moves, a ~1e-7 effect);
- one optimizer step (plain SGD, so the update is -lr x the clipped gradient) with length buckets on vs off: the
  parameter updates agree within 1e-4 relative (the micro-batches hold other rows; dapo sums over a normalizer
  fixed for the generation batch, so only float summation order differs);
- mismatch sampling: the current-policy forward runs on steps 0, N, 2N, ... only, and skipping it changes no
  parameter (lag 0: the PPO anchor is the behaviour log-probs either way; identical updates, 0 difference);
- the roofline bound of each phase (grpo_timing.phase_bounds) on a hand-computed shape;
- the Liger patch touches the given instance only and leaves the modeling module's globals as they were.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import test_grpo_train as grpo_train
import torch
from transformers import AutoModelForCausalLM

from phase6.posttrain import grpo_timing as T
from phase6.posttrain.grpo_trainer import (
    EngineGRPOTrainer,
    apply_liger_layers,
    bucket_order,
    trim_padding,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return grpo_train.tiny_model_dir(tmp_path_factory.mktemp("tiny_levers"))


def make_trainer(model_dir: tuple[Path, Any], tmp_path: Path, steps: int, **kw: Any) -> EngineGRPOTrainer:
    """tests/test_grpo_train.py's trainer at this file's shape: 4 prompts x 8 = 32 rows in 4 micro-batches of 8,
    12 new tokens, plain SGD at 0.1, the trainer's own lever defaults (length buckets on)."""
    batch = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "max_completion_length": 12}
    kw.setdefault("length_buckets", True)
    return grpo_train.make_trainer(
        model_dir, tmp_path, steps, 1e-1, num_rows=400, batch={**batch, "optim": "sgd"}, **kw
    )


def test_trim_padding_and_bucket_order() -> None:
    mask = torch.tensor(
        [
            [0, 0, 1, 1, 1, 1, 0, 0],  # prompt width 4, completion width 4 (logits_to_keep)
            [0, 0, 0, 1, 1, 1, 1, 0],
        ]
    )
    assert trim_padding(mask, 4) == (2, 1)
    # the last prompt column and the first completion column always stay
    assert trim_padding(torch.tensor([[0, 0, 0, 1, 0, 0]]), 3) == (2, 2)
    assert trim_padding(torch.tensor([[0, 0, 1, 1, 1, 1]]), 2) == (2, 0)
    order = bucket_order(torch.tensor([5, 3, 5, 4]), torch.tensor([2, 2, 1, 2]))
    assert order.tolist() == [2, 1, 3, 0]  # by completion length, then prompt length, stable


def padded_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts (3..9 tokens) + right-padded completions (1..7 tokens), widths 12 + 10."""
    g = torch.Generator().manual_seed(seed)
    rows, pw, cw = 12, 12, 10
    ids = torch.randint(3, vocab, (rows, pw + cw), generator=g)
    mask = torch.zeros(rows, pw + cw, dtype=torch.long)
    for r in range(rows):
        p = int(torch.randint(3, 10, (1,), generator=g))
        c = int(torch.randint(1, 8, (1,), generator=g))
        mask[r, pw - p : pw + c] = 1
    return ids.masked_fill(mask == 0, 0), mask, cw


def logps_and_grad(trainer: Any, model: Any, ids: torch.Tensor, mask: torch.Tensor, cw: int) -> tuple:
    """(no-grad log-probs in chunks of 4, training-pass log-probs, entropies, the flat gradient of their masked sum)
    under the trainer's current layout switches."""
    with torch.no_grad():
        nograd, _, _ = trainer._per_token_logps(model, ids, mask, cw, batch_size=4)
    model.zero_grad(set_to_none=True)
    lp, ent, _ = trainer._per_token_logps(model, ids, mask, cw, compute_entropy=True)
    (lp * mask[:, -cw:]).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return nograd, lp.detach(), ent, grad


def test_bucketed_logps_equal_plain_pass(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    trainer = make_trainer(model_dir, tmp_path, steps=1)
    ids, mask, cw = padded_batch(len(model_dir[1]))
    model = trainer.model
    results = {}
    for buckets in (False, True):
        trainer.length_buckets = buckets
        results[buckets] = logps_and_grad(trainer, model, ids, mask, cw)
    (a0, b0, e0, g0), (a1, b1, e1, g1) = results[False], results[True]
    real = mask[:, -cw:].bool()
    assert real.sum() > 30 and (~real).sum() > 10  # the batch really has padding to trim
    assert (a0 - a1)[real].abs().max() < 1e-5
    assert (b0 - b1)[real].abs().max() < 1e-5
    assert (e0 - e1)[real].abs().max() < 1e-5
    assert torch.all(a1[~real] == 0) and torch.all(b1[~real] == 0)  # padding positions stay 0, as TRL's pass
    assert float((g0 - g1).norm() / g0.norm()) < 1e-5


def step_update(model_dir: tuple[Path, Any], tmp_path: Path, **kw: Any) -> tuple[torch.Tensor, EngineGRPOTrainer]:
    trainer = make_trainer(model_dir, tmp_path, steps=1, **kw)
    start = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    end = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return end - start, trainer


@pytest.mark.slow  # trains full steps (2-3 trainers): > 30 s on a loaded 2-core box
def test_one_step_equal_with_and_without_levers(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    plain, t_plain = step_update(model_dir, tmp_path / "a", length_buckets=False, mismatch_every=1)
    bucketed, t_b = step_update(model_dir, tmp_path / "b", length_buckets=True, mismatch_every=1)
    assert t_b.sort_micro_batches and not t_plain.sort_micro_batches
    assert float(plain.norm()) > 0  # the step moved the policy
    assert float((plain - bucketed).norm() / plain.norm()) < 1e-4
    # the same rollout went into both (same seed, the engine samples before any shuffle)
    assert t_plain.token_log[0] == t_b.token_log[0]
    skipped, t_s = step_update(model_dir, tmp_path / "c", length_buckets=True, mismatch_every=0)
    assert t_s.mismatch_log == [] and len(t_b.mismatch_log) == 1
    assert torch.equal(skipped, bucketed)


@pytest.mark.slow  # trains full steps (2-3 trainers): > 30 s on a loaded 2-core box
def test_mismatch_sampled_every_n_steps(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    trainer = make_trainer(model_dir, tmp_path, steps=4, mismatch_every=3)
    trainer.train()
    assert [m["step"] for m in trainer.mismatch_log] == [0, 3]
    ref = [r[T.REF_LOGPROBS] for r in trainer.step_rows]
    # beta = 0: no reference forward, so the no-grad phase is the current-policy pass of steps 0 and 3 alone
    assert ref[0] > 0 and ref[3] > 0 and ref[1] == 0 and ref[2] == 0
    assert [t["step"] for t in trainer.token_log] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="mismatch_every"):
        make_trainer(model_dir, tmp_path, steps=1, mismatch_every=-1)


def test_phase_bounds_by_hand() -> None:
    model = T.ModelShape(params=1000, lm_head_params=200, layers=2, q_width=8, kv_bytes_per_token=16, param_bytes=2000)
    ceilings = T.Ceilings(matmul_flops_per_s=1e6, copy_bytes_per_s=1e5)
    tokens = {
        "prompt_tokens": 40,
        "completion_tokens": 60,
        "group": 4,
        "attention_pairs": 500.0,
        "decode_context": 300.0,
        "max_completion": 20,
    }
    b = T.phase_bounds(tokens, model, ceilings, ref_forward=True, sync_bytes=3000, micro_steps=2)
    forward = 2 * 800 * 100 + 2 * 200 * 60 + 4 * 2 * 8 * 500  # 160,000 + 24,000 + 32,000
    assert b[T.REF_LOGPROBS]["flops"] == forward
    assert b[T.REF_LOGPROBS]["bound_s"] == pytest.approx(forward / 1e6)
    assert b[T.POLICY_UPDATE]["flops"] == 3 * forward
    assert b[T.POLICY_UPDATE]["bytes"] == (3 * 2 + 7) * 2000
    rollout = 2 * 800 * (10 + 60) + 2 * 200 * 60 + 4 * 2 * 8 * 300
    assert b[T.ROLLOUT]["flops"] == rollout
    assert b[T.ROLLOUT]["bytes"] == 20 * 2000 + 16 * 300
    assert b[T.ROLLOUT]["binds"] == "bytes"  # 44,800 B / 1e5 = 0.448 s > 0.155 s of FLOPs
    assert b[T.WEIGHT_SYNC]["bound_s"] == pytest.approx(6000 / 1e5)
    assert b["step"]["bound_s"] == pytest.approx(sum(b[p]["bound_s"] for p in b if p != "step"))
    table = T.add_bound_columns([{"phase": T.REF_LOGPROBS, "mean_s_per_step": 0.432}, {"phase": T.OTHER}], b)
    assert table[0]["pct_of_bound"] == pytest.approx(100 * 0.216 / 0.432)
    assert table[1]["pct_of_bound"] is None
    none_ref = T.phase_bounds(tokens, model, ceilings, ref_forward=False)
    assert T.REF_LOGPROBS not in none_ref and T.WEIGHT_SYNC not in none_ref


def test_liger_patch_is_instance_only(monkeypatch: pytest.MonkeyPatch, model_dir: tuple[Path, Any]) -> None:
    """A stand-in for liger_kernel's instance patch (Triton does not run here), doing what the real one does:
    rebinding module-level names and the instance's forwards. The instance keeps its patch; the module does not."""
    from transformers.models.qwen2 import modeling_qwen2

    def fake_apply(model: Any, **kw: Any) -> None:
        assert kw["rope"] is False and kw["fused_linear_cross_entropy"] is False
        modeling_qwen2.Qwen2RMSNorm = object  # type: ignore[misc,assignment]
        modeling_qwen2.apply_rotary_pos_emb = None  # type: ignore[assignment]
        modeling_qwen2.liger_leftover = 1  # type: ignore[attr-defined]
        for layer in model.model.layers:
            layer.mlp.forward = types.MethodType(lambda self, x: x, layer.mlp)

    fake = types.ModuleType("liger_kernel.transformers.monkey_patch")
    fake._apply_liger_kernel_to_instance = fake_apply  # type: ignore[attr-defined]
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", fake)
    norm, rope = modeling_qwen2.Qwen2RMSNorm, modeling_qwen2.apply_rotary_pos_emb
    model = AutoModelForCausalLM.from_pretrained(model_dir[0])
    patched = apply_liger_layers(model)
    assert patched == [f"model.layers.{i}.mlp" for i in range(len(model.model.layers))]
    assert modeling_qwen2.Qwen2RMSNorm is norm and modeling_qwen2.apply_rotary_pos_emb is rope
    assert not hasattr(modeling_qwen2, "liger_leftover")
    other = AutoModelForCausalLM.from_pretrained(model_dir[0])
    assert "forward" not in vars(other.model.layers[0].mlp)


@pytest.mark.slow  # trains full steps (2-3 trainers): > 30 s on a loaded 2-core box
def test_engine_without_logprobs_anchors_on_the_trainer(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    """An engine that returns no log-probs (engine.vllm_logprobs=false; here the HF engine with its log-probs
    replaced by NaN): the current-policy forward runs every step whatever mismatch_every says, becomes the PPO
    anchor, and the step equals the one anchored on the engine's own log-probs within 1e-4 relative (lag 0,
    float32: the two log-probs differ by ~1e-7); the mismatch is reported as not measured (NaN), not as 0."""
    with_lp, _ = step_update(model_dir, tmp_path / "a", mismatch_every=0)
    trainer = make_trainer(model_dir, tmp_path / "b", steps=1, mismatch_every=0)
    original = trainer.engine.generate

    def without_logprobs(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        return dataclasses.replace(out, logprobs=[[float("nan")] * len(c) for c in out.completion_ids])

    trainer.engine.generate = without_logprobs  # type: ignore[method-assign]
    start = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    without = torch.cat([p.detach().flatten() for p in trainer.model.parameters()]) - start
    assert trainer.step_rows[0][T.REF_LOGPROBS] > 0  # beta = 0: this is the current-policy pass
    (row,) = trainer.mismatch_log
    assert row["tokens"] == 0 and row["nan_tokens"] > 0 and math.isnan(row["logp_mismatch_mean"])
    assert float((with_lp - without).norm() / with_lp.norm()) < 1e-4


def grouped_batch(vocab: int, groups: int = 3, group: int = 4) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``groups`` prompts (left-padded, 3..9 tokens) each repeated ``group`` times with its own completion."""
    g = torch.Generator().manual_seed(1)
    pw, cw = 10, 8
    rows = []
    for _ in range(groups):
        p = int(torch.randint(3, 10, (1,), generator=g))
        prompt = torch.randint(3, vocab, (p,), generator=g)
        for _ in range(group):
            c = int(torch.randint(1, cw + 1, (1,), generator=g))
            ids = torch.zeros(pw + cw, dtype=torch.long)
            mask = torch.zeros(pw + cw, dtype=torch.long)
            ids[pw - p : pw], mask[pw - p : pw + c] = prompt, 1
            ids[pw : pw + c] = torch.randint(3, vocab, (c,), generator=g)
            rows.append((ids, mask))
    perm = torch.randperm(len(rows), generator=g)  # groups interleaved, as a shuffled batch would be
    return torch.stack([rows[i][0] for i in perm]), torch.stack([rows[i][1] for i in perm]), cw


def test_shared_prompt_pass_equals_plain_pass(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    """Each distinct prompt through the backbone once, its KV cache shared by the rows of its group: log-probs,
    entropies and the gradient equal the plain one-pass forward within 1e-5 (float32), no-grad chunked and in
    training; the sort keeps every group inside one chunk."""
    trainer = make_trainer(model_dir, tmp_path, steps=1, shared_prompt=True)
    assert trainer.shared_prompt
    ids, mask, cw = grouped_batch(len(model_dir[1]))
    model = trainer.model
    calls: list[int] = []
    backbone = trainer.accelerator.unwrap_model(model).base_model
    hook = backbone.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].size(0)), with_kwargs=True)
    results = {}
    for shared in (False, True):
        trainer.shared_prompt, trainer.length_buckets = shared, shared
        calls.clear()
        with torch.no_grad():
            nograd, _, _ = trainer._per_token_logps(model, ids, mask, cw, batch_size=8)
        nograd_calls = list(calls)
        model.zero_grad(set_to_none=True)
        lp, ent, _ = trainer._per_token_logps(model, ids, mask, cw, compute_entropy=True)
        (lp * mask[:, -cw:]).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[shared] = (nograd, lp.detach(), ent, grad, nograd_calls)
    hook.remove()
    (a0, b0, e0, g0, c0), (a1, b1, e1, g1, c1) = results[False], results[True]
    real = mask[:, -cw:].bool()
    assert (a0 - a1)[real].abs().max() < 1e-5
    assert (b0 - b1)[real].abs().max() < 1e-5
    assert (e0 - e1)[real].abs().max() < 1e-5
    assert float((g0 - g1).norm() / g0.norm()) < 1e-5
    # plain: 2 chunks of 8 rows hit the backbone; shared: per chunk one prompt pass over its distinct prompts
    # (groups kept whole: 2 + 1 prompts across the two chunks of 8 and 4 rows) and one pass over the rows
    assert c0 == [8, 4] and c1 == [2, 8, 1, 4]


def test_right_aligned_pass_equals_masked_pass(model_dir: tuple[Path, Any], tmp_path: Path) -> None:
    """Rows shifted to right padding and run without an attention mask (causal flash attention on CUDA): log-probs,
    entropies and the gradient equal the masked left-padded pass within 1e-5 (float32), no-grad chunked and in
    training, and the right-aligned path really ran; padding positions stay 0."""
    trainer = make_trainer(model_dir, tmp_path, steps=1)
    assert trainer.right_align
    ids, mask, cw = padded_batch(len(model_dir[1]))
    model = trainer.model
    results = {}
    for aligned in (False, True):
        trainer.right_align = aligned
        trainer.right_aligned_chunks = 0
        results[aligned] = (*logps_and_grad(trainer, model, ids, mask, cw), trainer.right_aligned_chunks)
    (a0, b0, e0, g0, n0), (a1, b1, e1, g1, n1) = results[False], results[True]
    real = mask[:, -cw:].bool()
    assert n0 == 0 and n1 >= 2
    assert (a0 - a1)[real].abs().max() < 1e-5
    assert (b0 - b1)[real].abs().max() < 1e-5
    assert (e0 - e1)[real].abs().max() < 1e-5
    assert torch.all(a1[~real] == 0) and torch.all(b1[~real] == 0)
    assert float((g0 - g1).norm() / g0.norm()) < 1e-5


def test_right_align_layout() -> None:
    """Left-padded prompt + right-padded completion -> every row starts at column 0; labels only on completion
    tokens; cols point at each completion token in the shifted layout."""
    from phase6.posttrain.grpo_trainer import right_align

    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [0, 4, 5, 6, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]])
    ids_r, mask_r, labels, cols = right_align(ids, mask, 3, pad_id=0)
    assert ids_r.tolist() == [[5, 6, 7, 8, 0, 0, 0], [4, 5, 6, 7, 8, 9, 0]]
    assert mask_r.tolist() == [[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]]
    assert labels.tolist() == [[-100, -100, 7, 8, -100, -100, -100], [-100, -100, -100, 7, 8, 9, -100]]
    assert cols.tolist() == [[2, 3, 4], [3, 4, 5]]
    assert torch.equal(ids_r.gather(1, cols)[1], ids[1, -3:])
