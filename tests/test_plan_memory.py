"""Memory per GPU: 16 B/param mixed-precision Adam and its ZeRO divisions, Korthikanti activations, serving fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from phase6.plan import memory as memory_mod
from phase6.plan.memory import (
    GIB,
    ParallelLayout,
    TrainSetup,
    activation_bytes_per_layer,
    serve_memory,
    train_memory,
    zero_state_bytes,
)
from phase6.plan.model import ModelSpec, resolve_model

PSI = 7.5e9  # the ZeRO paper's worked example: 7.5B params, N_d = 64 (arXiv 1910.02054 Figure 1)


def test_mixed_precision_adam_is_16_bytes_per_param() -> None:
    p, g, o = zero_state_bytes(PSI, 0, 64)
    assert (p, g, o) == (2 * PSI, 2 * PSI, 12 * PSI)
    assert (p + g + o) / 1e9 == pytest.approx(120.0)  # "120GB" in the paper


@pytest.mark.parametrize("stage,expected_gb", [(1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_the_paper(stage: int, expected_gb: float) -> None:
    total = sum(zero_state_bytes(PSI, stage, 64))
    hand = {1: 4 * PSI + 12 * PSI / 64, 2: 2 * PSI + 14 * PSI / 64, 3: 16 * PSI / 64}[stage]
    assert total == pytest.approx(hand)
    assert total / 1e9 == pytest.approx(expected_gb, abs=0.06)


def test_bad_zero_stage() -> None:
    with pytest.raises(ValueError, match="zero stage"):
        zero_state_bytes(1.0, 4, 2)


def gpt2_like(h: int = 768, a: int = 12, L: int = 12) -> ModelSpec:
    return ModelSpec.gpt2(L, a, h, vocab_size=50304, block_size=1024)


def test_activations_reduce_to_korthikanti_34_plus_5as_over_h() -> None:
    m = gpt2_like()
    s, b, h, a = 1024, 8, 768, 12
    got = activation_bytes_per_layer(m, s, b, flash_attention=False, dropout=True)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    # tensor + sequence parallel divides every term by t (Korthikanti eq. with SP)
    assert activation_bytes_per_layer(m, s, b, tp=4, flash_attention=False, dropout=True) == pytest.approx(got / 4)


def test_flash_attention_removes_the_score_matrix() -> None:
    m = gpt2_like()
    s, b, h, a = 1024, 8, 768, 12
    flash = activation_bytes_per_layer(m, s, b, flash_attention=True, dropout=False)
    # 32·sbh (34 minus two dropout masks) plus the fp32 log-sum-exp (4 B per row and head)
    assert flash == pytest.approx(32 * s * b * h + 4 * s * b * a)


def test_activation_checkpointing_keeps_only_block_inputs() -> None:
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=8)
    no_ac = train_memory(m, lay, TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=3))
    ac = train_memory(
        m, lay, TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=3, activation_checkpointing=True)
    )
    per_layer = activation_bytes_per_layer(m, 4096, 1)
    workspace = 2 * (2 * 4096 * 14336)  # s = h: both moments give 2·s·f (TP 1: no gathered output grad)
    assert no_ac.activations == pytest.approx(32 * per_layer + workspace)
    # 32 block inputs, the recomputed block minus its input (its checkpoint), the backward's working set
    assert ac.activations == pytest.approx(32 * 2 * 4096 * 4096 + per_layer - 2 * 4096 * 4096 + workspace)
    assert ac.total < no_ac.total


def test_sequence_parallel_gathered_inputs_and_eager_swiglu_are_counted() -> None:
    # torchtitan SP saves the all-gathered QKV and MLP inputs at full length; eager SwiGLU saves a 4th s·f tensor
    m = resolve_model("llama3.1-8b")
    s, h, f = 8192, 4096, 14336
    base = activation_bytes_per_layer(m, s, 1, tp=4)
    gathered = activation_bytes_per_layer(m, s, 1, tp=4, sp_gathered=True)
    assert gathered - base == pytest.approx(2 * (2 * s * h) * (1 - 1 / 4))
    assert activation_bytes_per_layer(m, s, 1, tp=1, sp_gathered=True) == activation_bytes_per_layer(m, s, 1, tp=1)
    eager = activation_bytes_per_layer(m, s, 1, tp=4, eager_swiglu=True)
    assert eager - base == pytest.approx(2 * s * f / 4)
    # the same through TrainSetup: activation_layout bsh (torchtitan) and fused_elementwise false
    lay = ParallelLayout(dp=2, tp=4)
    kw = dict(seq_len=s, global_batch_tokens=2 * s, zero=1)
    tt = train_memory(m, lay, TrainSetup(activation_layout="bsh", fused_elementwise=False, **kw)).activations
    mg = train_memory(m, lay, TrainSetup(**kw)).activations
    # the backward working set is the same for both (SP's output grad is all-gathered in either framework)
    assert tt - mg == pytest.approx(32 * (2 * (2 * s * h) * 0.75 + 2 * s * f / 4))


def test_selective_ac_keeps_what_torchtitan_op_sac_saves() -> None:
    # saved per block: input + wq out + wv out + attention out + fp32 lse + w1 out + w2 out (full length with SP)
    m = resolve_model("llama3.1-70b")
    s, h, q, kv, f, heads, tp = 8192, 8192, 8192, 1024, 28672, 64, 4
    setup = TrainSetup(seq_len=s, global_batch_tokens=s, zero=1, selective_ac=True, activation_layout="bsh")
    t = memory_mod.activation_terms(m, setup, tp=tp)
    kept = 2 * s * (q + kv + q + f) / tp + 4 * s * heads / tp + 2 * s * h
    assert t["saved"] == pytest.approx(2 * s * h / tp + kept)
    assert t["recompute"] == pytest.approx(t["per_layer"] - 2 * s * h / tp - (kept - 2 * s * h))
    assert t["saved"] < t["per_layer"]


def test_train_memory_shards_states_over_dp_and_tp() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=2048, global_batch_tokens=2048 * 8, zero=3)
    one = train_memory(m, ParallelLayout(dp=8), setup)
    assert one.params + one.grads + one.optimizer == pytest.approx(16 * m.num_params() / 8)
    tp2 = train_memory(m, ParallelLayout(dp=4, tp=2), setup)
    assert tp2.params + tp2.grads + tp2.optimizer == pytest.approx(16 * m.num_params() / 8)


def test_pipeline_schedules_hold_different_microbatch_counts() -> None:
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=1, pp=4)
    kw = dict(seq_len=2048, global_batch_tokens=2048 * 16, zero=1)
    gpipe = train_memory(m, lay, TrainSetup(pp_schedule="gpipe", **kw)).activations
    onef = train_memory(m, lay, TrainSetup(pp_schedule="1f1b", **kw)).activations
    inter = train_memory(m, lay, TrainSetup(pp_schedule="interleaved", virtual_stages=2, **kw)).activations
    per_layer = activation_bytes_per_layer(m, 2048, 1)
    ws = 2 * (2048 * 14336 + 4096 * 14336)  # one working set (w2's backward: s·f + h·f, h > s), any schedule
    assert gpipe == pytest.approx(8 * 16 * per_layer + ws)  # 8 layers/stage x all 16 micro-batches
    assert onef == pytest.approx(8 * 4 * per_layer + ws)  # x p = 4 in flight
    assert inter - ws == pytest.approx((onef - ws) * (1 + 3 / 8))


def test_llama70b_bf16_serving_fit_on_80gb() -> None:
    m = resolve_model("llama3.1-70b")
    kw = dict(context_len=8192, hbm_gib=80, gpu_memory_utilization=0.9, overhead_gib=1.5)
    one = serve_memory(m, 1, 1, **kw)
    assert one.weights_bytes == pytest.approx(m.num_params() * 2) and one.weights_bytes / GIB > 80
    assert not one.fits
    for tp in (2, 4):
        mem = serve_memory(m, tp, 1, **kw)
        assert mem.fits, tp
        assert mem.weights_bytes == pytest.approx(m.num_params() * 2 / tp)
        assert mem.kv_bytes_per_token == 327_680 / tp


def test_kv_heads_replicate_beyond_their_count() -> None:
    qwen = resolve_model("qwen2.5-7b")  # 4 KV heads: tp=4 holds one each
    assert serve_memory(qwen, 4, 1, 1024, 80, 0.9, 1.0).kv_bytes_per_token == 2 * 28 * 1 * 128 * 2
    llama = resolve_model("llama3.1-70b")  # 8 KV heads: tp=16 still holds one each (replicated), not half
    assert serve_memory(llama, 16, 1, 1024, 80, 0.9, 1.0).kv_bytes_per_token == 2 * 80 * 1 * 128 * 2
    assert serve_memory(llama, 8, 1, 1024, 80, 0.9, 1.0).kv_bytes_per_token == 327_680 / 8


def test_pp_with_fsdp_keeps_the_stage_unsharded_as_torchtitan_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchtitan: reshard_after_forward = not pp_enabled. Llama-3.1-405B FSDP8 x TP8 x PP8: the old per-block model
    # said 21-23 GiB/GPU, torchtitan reports 72.7-82.5 GiB (benchmarks/llama3_h100_202412_torchtitan.md Table 5,
    # local batch 32 = 8 micro-batches of 4, full AC, Float8 + compile). The formula's terms alone (no GPU-measured
    # allocator reserve: with it, 86 GiB, docs/benchmarks.md "plan memory measured on one H200").
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "none.json")
    m = ModelSpec.from_hf_config(
        dict(
            model_type="llama",
            num_hidden_layers=126,
            hidden_size=16384,
            num_attention_heads=128,
            num_key_value_heads=8,
            intermediate_size=53248,
            vocab_size=128256,
            max_position_embeddings=131072,
        )
    )
    lay = ParallelLayout(dp=8, tp=8, pp=8)
    s = TrainSetup(
        8192, 256 * 8192, micro_batch_size=4, zero=3, activation_checkpointing=True, pp_schedule="interleaved"
    )
    mem = train_memory(m, lay, s, overhead_gib=1.5)
    stage = (16 * 16384 * (2 * 16384 + 2 * 1024) + 16 * 3 * 16384 * 53248) / 8  # ~16 blocks / TP8, per GPU
    assert mem.transient >= stage * (2 + 4) * 0.95  # bf16 params + unsharded grads of the stage stay resident
    assert 70 <= mem.total / GIB <= 85
    no_pp = train_memory(m, ParallelLayout(dp=64, tp=8), s, overhead_gib=1.5)
    # without PP only one block's 10 B/param FSDP2 buffers (2 gathered + grads + reduce input) vs 16 blocks x 6 B
    assert no_pp.transient < mem.transient / 9


def test_serving_reserve_grows_with_context_up_to_the_chunk() -> None:
    m = resolve_model("llama3.1-8b")
    mems = [serve_memory(m, 1, 1, ctx, 80.0, 0.9, 1.0, max_num_batched_tokens=8192) for ctx in (1024, 4096, 32768)]
    over = [x.overhead_bytes for x in mems]
    assert over[0] < over[1] < over[2]
    assert over[2] == pytest.approx(over[1] + (8192 - 4096) * 2 * (3 * 14336 + 4 * 4096))  # capped at the chunk
    flat = serve_memory(m, 1, 1, 32768, 80.0, 0.9, 1.0)
    assert flat.overhead_bytes == 1.0 * GIB  # max_num_batched_tokens=0: the fixed reserve only


def test_fp32_main_grads_hold_4_bytes_per_param() -> None:
    import dataclasses

    from phase6.plan.memory import ParallelLayout, TrainSetup, train_memory
    from phase6.plan.model import resolve_model

    m = resolve_model("llama3.1-8b")
    base = TrainSetup(4096, 8 * 4096, zero=1)
    lay = ParallelLayout(dp=8)
    bf16 = train_memory(m, lay, base)
    fp32 = train_memory(m, lay, dataclasses.replace(base, fp32_grad_accumulation=True))
    assert fp32.grads == 2 * bf16.grads and fp32.params == bf16.params and fp32.optimizer == bf16.optimizer


def test_zero3_buffers_follow_fsdp2_post_backward() -> None:
    # three moments over the activation peak: A 2 gathered blocks (4 B/param); B + the previous fp32 reduce-scatter
    # input, one block's kept bytes freed (8 B - saved); C all 10 B, two blocks' kept bytes and the working set freed
    p = 1e9
    z = memory_mod.zero3_buffer_bytes
    assert z(p, 0.0) == pytest.approx(10 * p)  # nothing kept, nothing in backward: C
    assert z(p, 0.5e9, 1.5e9) == pytest.approx(7.5 * p)  # full AC: B (C = 10 - 1 - 1.5)
    assert z(p, 0.2e9, 0.5e9) == pytest.approx(9.1 * p)  # C = 10 - 0.4 - 0.5 > B = 7.8
    assert z(p, 20e9, 1e9) == pytest.approx(4 * p)  # large activations: A
    assert z(p, 0.0, grad_reduce_bytes=2) == pytest.approx(8 * p)
    assert z(p, 20e9, 1e9, grads_at_peak=0.3e9) == pytest.approx(4.3 * p)  # w2's grad held at the SwiGLU peak
    # the second block's output gradient is new at moment B (the first block's is the loss's)
    assert z(p, 0.5e9, 1.5e9, incoming_grad=0.2e9) == pytest.approx(7.7 * p)
    assert z(p, 20e9, 1e9, incoming_grad=0.2e9) == pytest.approx(4 * p)  # A still wins: B = 8 - 20 + 0.2


def test_zero3_grads_held_move_the_peak_along_the_mlp_backward() -> None:
    # ZeRO-3 holds a block's own bf16 grads until its backward ends (the plain run preallocated them), so the peak
    # moves from w2's backward to w1's once h·f/TP is large against s·f/TP. Llama-3.1-405B at TP 8, s 8192: t = h/2,
    # so 4·t·f = 2·h·f and w1's moment exceeds w2's by exactly the two full-length input grads minus one: t·h x 2 B.
    m405 = ModelSpec.from_hf_config(
        dict(model_type="llama", num_hidden_layers=126, hidden_size=16384, num_attention_heads=128,
             num_key_value_heads=8, intermediate_size=53248, vocab_size=128256, max_position_embeddings=131072),
        name="405b", source="Llama-3.1-405B config.json",
    )  # fmt: skip
    setup = TrainSetup(8192, 8192, activation_layout="bsh", fused_elementwise=False)
    t = memory_mod.activation_terms(m405, setup, tp=8)
    assert t["grads_at_peak"] == pytest.approx(2 * 8192 * 16384)
    assert t["incoming_grad"] == pytest.approx(2 * 8192 * 16384 / 8)
    # Llama-3.1-8B at TP 1: the SwiGLU backward (2·s·f) beats w2's (s·f + h·f): w2's grad, h·f x 2 B, is the excess
    t8 = memory_mod.activation_terms(resolve_model("llama3.1-8b"), setup, tp=1)
    assert t8["grads_at_peak"] == pytest.approx(2 * 4096 * 14336)


def test_the_h200_sweep_matches_the_formula_per_term_group() -> None:
    # the committed H200 run (docs/results/i30_plan_memory_2026-12-02_full2, 72 cases) against the planner's terms:
    # saved after forward, activations at the backward's peak (per AC mode) and ZeRO-3 buffers within 1 %
    import json
    import sys

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts/repro"))
    import plan_memory_fit as fitmod

    data = json.loads((root / "docs/results/i30_plan_memory_2026-12-02_full2/plan_memory.json").read_text())
    _, cal = fitmod.fit(data["records"])
    assert cal["cases"] == 72
    for group, g in cal["groups"].items():
        assert 0.99 <= g["min"] and g["max"] <= 1.01, (group, g)


@pytest.mark.slow  # ~11 s alone on the 2-core box (6 CPU fwd+bwd under MemTracker)
def test_activation_terms_match_live_bytes_of_the_h200_sweep_block_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweep's own Llama block (torchtitan SP, eager SwiGLU, torchtitan op-SAC), grads preallocated, 3 blocks, with
    # torch's MemTracker (live storage bytes at dispatch level) as the allocator: saved after forward and the peak
    # over forward + backward equal activation_terms within 1 % (the remainder: the norms' fp32 rstd per row).
    # The working set's two moments differ here: w2's backward (s·f + h·f) and the SwiGLU backward (2·s·f).
    import sys
    from pathlib import Path

    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts/repro"))
    import h200_plan_memory as hm

    monkeypatch.setattr(hm, "DEV", "cpu")
    h, f, s, n = 256, 1024, 512, 3  # s > h as at 8K sequences (with h > s, CPU mm's own temporaries add ~5 %)
    shape = {"hidden": h, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": f}
    m = ModelSpec.from_hf_config(
        dict(model_type="llama", num_hidden_layers=n, hidden_size=h, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=f, vocab_size=1000, max_position_embeddings=4096),
        name="tiny", source="test",
    )  # fmt: skip
    live = lambda mt, kind: sum(v.get("Total", 0) for v in mt.get_tracker_snapshot(kind).values())  # noqa: E731
    for tp in (1, 2):
        for ac in ("none", "selective", "full"):
            torch.manual_seed(0)
            blocks = [hm.Block(shape, tp, s) for _ in range(n)]
            for b in blocks:
                for p in b.parameters():
                    p.grad = torch.zeros_like(p)
            x = torch.randn(s // tp, h, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn_like(x)
            mt = MemTracker()
            mt.track_external(*blocks, x, g)
            with mt:
                base = live(mt, "current")
                out = x
                for b in blocks:
                    if ac == "none":
                        out = b(out)
                    else:
                        ctx = {"context_fn": hm.sac_context} if ac == "selective" else {}
                        out = torch.utils.checkpoint.checkpoint(b, out, use_reentrant=False, **ctx)
                saved = live(mt, "current") - base
                out.backward(g)
            peak = live(mt, "peak") - base
            setup = TrainSetup(
                seq_len=s, global_batch_tokens=s, activation_layout="bsh", fused_elementwise=False,
                activation_checkpointing=ac == "full", selective_ac=ac == "selective",
            )  # fmt: skip
            t = memory_mod.activation_terms(m, setup, tp)
            assert saved == pytest.approx(n * t["saved"], rel=0.01), (tp, ac)
            assert peak == pytest.approx(n * t["saved"] + t["recompute"] + t["workspace"], rel=0.01), (tp, ac)
