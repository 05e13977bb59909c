"""Serving model: decode is HBM-bound at small batch, per-token all-reduces, prefill compute-bound, closed forms."""

from __future__ import annotations

import pytest
from plan_hardware import HW

from phase6.config.plan import EfficiencyConfig
from phase6.plan import comm
from phase6.plan.model import resolve_model
from phase6.plan.serve import ServeCostModel, causal_pairs, serve_latency

EFF = EfficiencyConfig(prefill_mfu=0.5, decode_hbm_efficiency=0.7)
LLAMA70 = resolve_model("llama3.1-70b")


def test_decode_batch1_is_weight_streaming_plus_allreduces() -> None:
    m = ServeCostModel(LLAMA70, HW, tp=4, efficiency=EFF)
    ctx = 2048
    weights = LLAMA70.num_params() * 2
    mem = (weights + 327_680 * ctx) / (4 * 3.35e12 * 0.7)
    ar, _ = comm.all_reduce_time(8192 * 2, 4, m.fabric)
    assert m.decode_step_s(1, ctx) == pytest.approx(mem + 2 * 80 * ar)


def test_tp_2_to_4_is_not_2x_at_batch_1() -> None:
    t2 = serve_latency(LLAMA70, HW, 2, 1, 2048, efficiency=EFF).decode_ms
    t4 = serve_latency(LLAMA70, HW, 4, 1, 2048, efficiency=EFF).decode_ms
    assert 1.0 < t2 / t4 < 1.9  # the per-token all-reduce floor does not shrink with TP


def test_prefill_is_compute_bound_and_counts_causal_pairs() -> None:
    m = ServeCostModel(LLAMA70, HW, tp=8, efficiency=EFF)
    p = 4096
    flops = 2 * LLAMA70.num_matmul_params() * p + 4 * 80 * 64 * 128 * causal_pairs(0, p)
    compute = flops / (8 * 989.4e12 * 0.5)
    ar, _ = comm.all_reduce_time(p * 8192 * 2, 8, m.fabric)
    assert m.prefill_s(p) == pytest.approx(compute + 2 * 80 * ar)
    assert compute > m.memory_s(p, 0)


def test_decode_run_closed_form_matches_the_loop() -> None:
    for tp, d, ctx in ((1, 1, 10), (4, 64, 4000), (8, 256, 100)):
        m = ServeCostModel(resolve_model("llama3.1-8b"), HW, tp=tp, efficiency=EFF)
        k = 300
        loop = sum(m.step_s(0, 0.0, d, ctx + j * d) for j in range(k))
        assert m.decode_run_s(d, ctx, k) == pytest.approx(loop, rel=1e-9)


def test_moe_decode_reads_only_touched_experts() -> None:
    mix = resolve_model("mixtral-8x7b")
    m = ServeCostModel(mix, HW, tp=2, efficiency=EFF)
    one = m.weights_read_bytes(1)
    assert one == pytest.approx((mix.num_params() - 32 * 6 * 3 * 4096 * 14336) * 2)  # top-2 of 8 per layer
    assert m.weights_read_bytes(1000) == pytest.approx(mix.num_params() * 2, rel=1e-6)  # every expert touched


def test_latency_reports_fit_and_capacity() -> None:
    s = serve_latency(LLAMA70, HW, 1, 1, 8192, efficiency=EFF)
    assert not s.fits and s.max_concurrent_seqs == 0
    s4 = serve_latency(LLAMA70, HW, 4, 16, 8192, efficiency=EFF)
    assert s4.fits and s4.max_concurrent_seqs > 16 and s4.bound == "memory"


def test_bad_tp() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        ServeCostModel(LLAMA70, HW, tp=3)


def test_step_and_prefill_overheads() -> None:
    """step_overhead_ms is paid by every step, prefill_overhead_ms only by steps that prefill (docs/cost_model.md §5);
    decode runs and serve_latency's prefill/decode numbers carry them the same way."""
    spec = resolve_model("llama3.1-8b")
    base = ServeCostModel(spec, HW, tp=2, efficiency=EFF)
    eff = EfficiencyConfig(prefill_mfu=0.5, decode_hbm_efficiency=0.7, step_overhead_ms=4.0, prefill_overhead_ms=90.0)
    m = ServeCostModel(spec, HW, tp=2, efficiency=eff)
    assert m.decode_step_s(8, 1000) == pytest.approx(base.decode_step_s(8, 1000) + 4e-3, rel=1e-12)
    assert m.prefill_s(700) == pytest.approx(base.prefill_s(700) + 94e-3, rel=1e-12)
    mixed = (300, causal_pairs(0, 300), 8, 8000)
    assert m.step_s(*mixed) == pytest.approx(base.step_s(*mixed) + 94e-3, rel=1e-12)
    assert m.decode_run_s(8, 8000, 50) == pytest.approx(base.decode_run_s(8, 8000, 50) + 50 * 4e-3, rel=1e-12)
    lat = serve_latency(spec, HW, 2, 8, 1000, prompt_len=700, efficiency=eff)
    assert lat.prefill_ms == pytest.approx(1e3 * m.prefill_s(700, 8))
    assert lat.decode_ms == pytest.approx(1e3 * m.decode_step_s(8, 1000))
    with pytest.raises(ValueError, match=r"plan.efficiency.prefill_overhead_ms: must be >= 0 ms, got -1"):
        EfficiencyConfig(prefill_overhead_ms=-1.0)


def test_fp8_weights_prefill_on_fp8_tensor_cores() -> None:
    import yaml

    from phase6.config import HardwareConfig
    from phase6.plan.validate import HARDWARE_DIR

    hw = HardwareConfig(**yaml.safe_load((HARDWARE_DIR / "h100_sxm.yaml").read_text()))
    bf16 = ServeCostModel(LLAMA70, hw, tp=4, efficiency=EFF, weight_bytes=2.0)
    fp8 = ServeCostModel(LLAMA70, hw, tp=4, efficiency=EFF, weight_bytes=1.0)
    assert fp8.compute_s(8192, 0) == pytest.approx(bf16.compute_s(8192, 0) * hw.peak_bf16_tflops / hw.peak_fp8_tflops)
    assert fp8.prefill_s(4096) < bf16.prefill_s(4096)
    # no FP8 units (A100): same rate
    a100 = HardwareConfig(**yaml.safe_load((HARDWARE_DIR / "a100_80gb.yaml").read_text()))
    assert ServeCostModel(LLAMA70, a100, tp=4, weight_bytes=1.0).fp8_speedup == 1.0
