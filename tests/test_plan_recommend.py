"""Recommender: only legal layouts, never one over memory or with TP not dividing the heads; ranked by time."""

from __future__ import annotations

import pytest
from plan_hardware import HW, PROFILE

from phase6.config.plan import PlanConfig
from phase6.plan.memory import GIB
from phase6.plan.model import resolve_model
from phase6.plan.recommend import TIE_TOLERANCE, layouts, recommend_serve, recommend_train


@pytest.mark.parametrize("name,gpus", [("qwen2.5-7b", 8), ("gpt2", 8), ("llama3.1-70b", 16), ("mixtral-8x7b", 8)])
@pytest.mark.parametrize("workload", ["train", "serve"])
def test_candidates_fit_and_tp_divides_heads(name: str, gpus: int, workload: str) -> None:
    m = resolve_model(name)
    plan = PlanConfig(top_k=50, seq_len=2048, global_batch_tokens=2048 * 64)
    rec = (recommend_train if workload == "train" else recommend_serve)(m, gpus, plan, PROFILE)
    key = "step_time_s" if workload == "train" else "decode_ms_per_token"
    for c in rec.candidates:
        d = c.as_dict()
        assert d["fits"] and d["memory_gib_per_gpu"] <= HW.hbm_gib, d
        assert m.num_heads % d["tp"] == 0, d
        assert d["dp"] * d["tp"] * d["pp"] * d["cp"] == gpus
        assert d["reason"]
    times = [c.as_dict()[key] for c in rec.candidates]
    # fastest first, except that layouts within TIE_TOLERANCE of the fastest come first, simplest first
    n_tie = sum(1 for t in times if t <= min(times) * (1 + TIE_TOLERANCE)) if workload == "train" else 0
    assert all(t <= min(times) * (1 + TIE_TOLERANCE) for t in times[:n_tie])
    assert times[n_tie:] == sorted(times[n_tie:])
    assert all(not c.fits for c in rec.rejected)


def test_qwen7b_has_no_tp8_layout() -> None:
    # 28 heads: TP 8 does not divide them
    assert all(lay.tp in (1, 2, 4) for lay in layouts(resolve_model("qwen2.5-7b"), 8, "serve", {}))


def test_llama70b_serving_on_8_gpus_rejects_tp1_and_ranks_tp8_fastest() -> None:
    rec = recommend_serve(resolve_model("llama3.1-70b"), 8, PlanConfig(), PROFILE)
    assert all(c.layout.tp >= 2 for c in rec.candidates)
    assert rec.candidates[0].layout.tp == 8
    assert any(c.layout.tp == 1 and not c.fits for c in rec.rejected)
    (tp1,) = [c for c in rec.rejected if c.layout.tp == 1]
    assert tp1.memory_gib_per_gpu > 0.9 * HW.hbm_gib  # 131 GiB of weights alone


def test_llama70b_training_does_not_fit_8_gpus_but_fits_64() -> None:
    m = resolve_model("llama3.1-70b")
    plan = PlanConfig(seq_len=4096)
    assert recommend_train(m, 8, plan, PROFILE).candidates == []  # 70.6B x 16 B = 1.1 TB > 8 x 80 GB
    rec = recommend_train(m, 64, plan, PROFILE)
    assert rec.candidates and all(c.detail.memory.total <= HW.hbm_gib * GIB for c in rec.candidates)


def test_fixed_sizes_are_honoured_and_impossible_ones_fail_in_one_line() -> None:
    m = resolve_model("llama3.1-8b")
    assert all(lay.tp == 2 for lay in layouts(m, 8, "train", {"tp": 2}, 4096))
    with pytest.raises(ValueError, match="no legal layout of 8 GPUs") as e:
        layouts(m, 8, "train", {"tp": 3}, 4096)
    assert "\n" not in str(e.value)
