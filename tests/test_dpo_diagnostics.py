"""Diagnostics: the probe scores exactly the tokens TRL trains on, its log-probs match a hand computation, and the
length statistics count generated tokens the way the report says."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from phase6.config import CONFIG_DIR
from phase6.posttrain.diagnostics import (
    LengthComparison,
    LengthStats,
    generation_lengths,
    sequence_logps,
    tokenize_pairs,
)
from phase6.posttrain.dpo_data import load_preference_data
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer

SMOKE = CONFIG_DIR.parent / "projects" / "6c_dpo" / "data" / "smoke_pairs.jsonl"


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any, Any]:
    splits = load_preference_data(str(SMOKE), "preference", eval_size=8, seed=0)
    texts = [m["content"] for r in splits.train for k in ("prompt", "chosen", "rejected") for m in r[k]]
    tok = build_tiny_tokenizer(texts, vocab_size=384)
    return splits, tok, build_tiny_model(tok, seed=0)


def test_probe_tokenisation_equals_trl(tiny: tuple[Any, Any, Any], tmp_path: Path) -> None:
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    splits, tok, _ = tiny
    model = build_tiny_model(tok, seed=0)  # get_peft_model edits the module in place: keep the shared one clean
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], max_length=128)
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=splits.eval,
        processing_class=tok,
        peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
    )
    ours = tokenize_pairs([splits.eval[i] for i in range(len(splits.eval))], tok, 128)
    theirs = [
        {k: trainer.train_dataset[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
        for i in range(len(trainer.train_dataset))
    ]
    assert ours == theirs


def test_sequence_logps_match_hand_computation(tiny: tuple[Any, Any, Any]) -> None:
    splits, tok, model = tiny
    probe = tokenize_pairs([splits.eval[i] for i in range(3)], tok, None)
    chosen, rejected = sequence_logps(model, probe, tok.pad_token_id, None, batch_size=2)  # padding in a batch
    for i, t in enumerate(probe):
        for key, got in (("chosen_ids", chosen[i]), ("rejected_ids", rejected[i])):
            ids = t["prompt_ids"] + t[key]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            want = sum(logp[j - 1, ids[j]].item() for j in range(len(t["prompt_ids"]), len(ids)))
            assert got.item() == pytest.approx(want, abs=1e-4)  # fp32; padding must not leak into the sums


def test_length_stats_and_comparison() -> None:
    s = LengthStats.of(list(range(1, 11)), max_new_tokens=10, finished=[True] * 9 + [False])
    assert (s.n, s.mean, s.median, s.max) == (10, 5.5, 5.5, 10)
    assert s.p90 == pytest.approx(statistics.quantiles(range(1, 11), n=10, method="inclusive")[8])
    assert s.truncated_frac == pytest.approx(0.1)
    before = LengthStats.of([10, 10], 100, [True, True])
    c = LengthComparison(before, LengthStats.of([14, 14], 100, [True, True]), threshold=1.3)
    assert c.ratio == pytest.approx(1.4) and c.flagged and c.status == "FLAG > 1.3x"
    ok = LengthComparison(before, LengthStats.of([12, 12], 100, [True, True]), threshold=1.3)
    assert not ok.flagged and ok.status == "ok ≤ 1.3x"
    capped = LengthComparison(before, LengthStats.of([12, 100], 100, [True, False]), threshold=1.3)
    assert capped.ratio == pytest.approx(5.6) and capped.flagged  # above the bar: a lower bound that already fails
    capped_low = LengthComparison(
        LengthStats.of([90, 90], 100, [True, True]), LengthStats.of([100, 80], 100, [False, True]), threshold=1.3
    )
    assert capped_low.status == "lower bound (after hit max_new_tokens)"


def test_generation_lengths_count_to_eos(tiny: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """generate() is replaced by a scripted one: lengths include the EOS, stop at the first EOS, and a row without
    EOS counts as truncated at max_new_tokens."""
    splits, tok, model = tiny
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = [splits.eval[i]["prompt"] for i in range(3)]
    seen: dict[str, Any] = {}

    def fake_generate(input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
        seen.update(kw, padding_left=bool((attention_mask[:, 0] == 0).any() or (attention_mask[:, -1] == 1).all()))
        new = torch.tensor([[5, 6, eos, pad, pad], [7, eos, 8, eos, pad], [5, 5, 5, 5, 5]])
        return torch.cat([input_ids, new[: input_ids.shape[0]]], dim=1)

    monkeypatch.setattr(model, "generate", fake_generate)
    sides = (tok.padding_side, tok.truncation_side)
    lengths, finished, texts = generation_lengths(model, tok, prompts, max_new_tokens=5, batch_size=3)
    assert lengths == [3, 2, 5] and finished == [True, True, False]
    assert seen["do_sample"] is False and seen["max_new_tokens"] == 5 and seen["padding_left"]
    assert (tok.padding_side, tok.truncation_side) == sides  # restored after the left-padded batch
    assert len(texts) == 3
