"""The length-sorted reference pass (phase6.posttrain.reference) gives TRL's own precomputed reference log-probs,
skips TRL's weight hash, and feeds TRL's loss the same numbers as a reference forward per step (tiny model, fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from phase6.posttrain.dpo_data import load_preference_data
from phase6.posttrain.reference import REF_COLUMNS, precomputed_reference, reference_batches
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

SMOKE = Path(__file__).resolve().parents[1] / "projects" / "6c_dpo" / "data" / "smoke_pairs.jsonl"


def test_reference_batches_cover_every_row_once_longest_first() -> None:
    lengths = [5, 9, 1, 9, 7, 3, 8, 2, 6, 4, 10]
    world = 3
    per_rank = [reference_batches(lengths, 2, rank, world) for rank in range(world)]
    rows = [i for batches in per_rank for b in batches for i in b]
    assert sorted(rows) == list(range(len(lengths)))
    everything = reference_batches(lengths, 2)
    assert [lengths[i] for b in everything for i in b] == sorted(lengths, reverse=True)
    assert per_rank[0] == everything[0::3] and per_rank[2] == everything[2::3]  # batch k goes to rank k % world
    with pytest.raises(ValueError, match="precompute_ref_batch_size: must be >= 1"):
        reference_batches(lengths, 0)


def _trainer(tmp_path: Path, ours: bool, precompute_trl: bool = False, batch: int = 4, seed: int = 0) -> Any:
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    splits = load_preference_data(str(SMOKE), "preference", eval_size=8, seed=0)
    texts = [m["content"] for r in splits.train for k in ("prompt", "chosen", "rejected") for m in r[k]]
    tok = build_tiny_tokenizer(texts, vocab_size=384)
    torch.manual_seed(seed)
    args = DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_length=64,  # shorter than some pairs: the reference pass must truncate exactly like the collator
        precompute_ref_log_probs=precompute_trl,
        precompute_ref_batch_size=batch,
        use_cpu=True,
        bf16=False,  # TRL's default is True, which autocasts the reference pass to bf16 even on a CPU
        report_to=[],
    )
    cls = precomputed_reference(DPOTrainer) if ours else DPOTrainer
    return cls(
        model=build_tiny_model(tok, seed=0),
        args=args,
        train_dataset=splits.train,
        eval_dataset=splits.eval,
        processing_class=tok,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )


def test_sorted_pass_equals_trl_precompute_and_skips_the_weight_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trl.trainer.dpo_trainer as dpo_mod

    calls: list[int] = []
    real_hash = dpo_mod.hash_module
    monkeypatch.setattr(dpo_mod, "hash_module", lambda m: calls.append(1) or real_hash(m))
    trl_own = _trainer(tmp_path / "trl", ours=False, precompute_trl=True, batch=3)
    assert calls == [1], "TRL's own precompute hashes the model once per trainer"
    ours = _trainer(tmp_path / "ours", ours=True, batch=5)  # other batch size and order: other padding
    assert calls == [1], "the sorted pass must not hash the weights"
    assert ours.precompute_ref_logps and ours.reference_pass_s > 0
    for split in ("train_dataset", "eval_dataset"):
        a, b = getattr(trl_own, split), getattr(ours, split)
        assert len(a) == len(b) and a["prompt_ids"] == b["prompt_ids"]
        for col in REF_COLUMNS:
            # fp32 sums of up to 64 per-token log-probs (|sum| ~ 50-160 nats); only each batch's padding differs
            torch.testing.assert_close(torch.tensor(b[col]), torch.tensor(a[col]), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="precompute_ref_log_probs=False"):
        _trainer(tmp_path / "bad", ours=True, precompute_trl=True)


def test_loss_with_precomputed_reference_equals_reference_forward_per_step(tmp_path: Path) -> None:
    """With a trained-looking adapter (random LoRA B), TRL's loss from the precomputed columns equals its loss with
    a reference forward in the step (adapter disabled): the columns hold the right rows."""
    ours = _trainer(tmp_path / "ours", ours=True)
    per_step = _trainer(tmp_path / "step", ours=False)
    assert not per_step.precompute_ref_logps
    torch.manual_seed(1)
    for (n, p), (n2, p2) in zip(ours.model.named_parameters(), per_step.model.named_parameters(), strict=True):
        assert n == n2
        if "lora_B" in n:
            p.data.normal_(0, 3.0)
            p2.data.copy_(p.data)
    batch = ours.data_collator([ours.train_dataset[i] for i in (3, 0, 7, 5)])
    assert set(REF_COLUMNS) <= set(batch)
    plain = {k: v for k, v in batch.items() if k not in REF_COLUMNS}
    with torch.no_grad():
        loss_ours = ours.compute_loss(ours.model, batch).item()
        loss_step = per_step.compute_loss(per_step.model, plain).item()
    assert abs(loss_ours - 0.6931) > 0.01, "the adapter must move the policy off the reference for this to test"
    # fp32 both ways, same kernels: equal to float rounding (a wrong row would be off by > 0.01)
    assert loss_ours == pytest.approx(loss_step, abs=1e-6)
