"""Training step model: bubble fractions, per-dimension communication counts and bytes, overlap rules."""

from __future__ import annotations

import pytest
from plan_hardware import HW, PROFILE

from phase6.config import HardwareConfig
from phase6.plan import comm
from phase6.plan.memory import ParallelLayout, TrainSetup
from phase6.plan.model import resolve_model
from phase6.plan.profile import build_profile
from phase6.plan.train import bubble_fraction, predict_train_step


@pytest.mark.parametrize(
    "schedule,expected", [("gpipe", 3 / 8), ("1f1b", 3 / 8), ("interleaved", 3 / 16), ("zero_bubble", 1 / 8)]
)
def test_bubble_fractions(schedule: str, expected: float) -> None:
    assert bubble_fraction(schedule, 4, 8, virtual_stages=2) == pytest.approx(expected)
    assert bubble_fraction(schedule, 1, 8) == 0.0


def test_compute_time_is_flops_over_mfu_peak() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=8), setup, PROFILE, mfu=0.4)
    flops = m.flops_per_token(4096) * 8 * 4096
    assert p.compute_s == pytest.approx(flops / (8 * 0.4 * 989.4e12))
    assert p.tokens_per_step == 8 * 4096


def test_tp_has_four_all_reduces_per_block_on_nvlink() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=2 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=2, tp=4), setup, PROFILE, mfu=0.4)
    (tp,) = [c for c in p.comm if c.dim == "tp"]
    assert tp.count == 32 * 1 * 4  # layers x micro-batches x (2 fwd + 2 bwd)
    size = 1 * 4096 * 4096 * 2
    assert tp.message_bytes == size
    assert tp.wire_bytes == pytest.approx(tp.count * 2 * 3 / 4 * size)
    assert tp.fabric == "nvlink" and tp.exposed_s == tp.time_s  # TP is not overlapped


def test_groups_spanning_nodes_use_the_nic() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=16 * 4096, zero=0)
    p = predict_train_step(m, ParallelLayout(dp=16), setup, PROFILE, mfu=0.4)
    (dp,) = [c for c in p.comm if c.dim == "dp"]
    # 8 GPUs of each node in the group: NCCL's rings cross nodes on all 8 NICs at once (nccl#1576: 8 HDR -> 192 GB/s)
    assert dp.fabric == "ib x8 NICs"
    f = PROFILE.group_fabric(1, 16)
    assert f.bandwidth_gbps == pytest.approx(min(PROFILE.intra.bandwidth_gbps, 8 * PROFILE.inter.bandwidth_gbps))
    grad = m.num_params() * 4  # fp32 gradient reduce
    assert dp.wire_bytes == pytest.approx(comm.ring_all_reduce_bytes(grad, 16))
    # one GPU per node (DP across nodes with TP=8 inside): one NIC
    q = predict_train_step(m, ParallelLayout(dp=2, tp=8), setup, PROFILE, mfu=0.4)
    assert [c.fabric for c in q.comm if c.dim == "dp"] == ["ib"]


def test_dp_sync_hides_behind_backward_until_it_cannot() -> None:
    m = resolve_model("llama3.1-8b")
    big = TrainSetup(seq_len=4096, global_batch_tokens=64 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=8), big, PROFILE, mfu=0.4)
    assert all(c.exposed_s == 0.0 for c in p.comm if c.dim == "dp")
    slow = build_profile(HardwareConfig(**{**HW.__dict__, "nvlink_gbps": 1.0}))
    q = predict_train_step(m, ParallelLayout(dp=8), big, slow, mfu=0.4)
    window = q.compute_s / q.num_microbatches  # grads: last backward (2/3), params: first forward (1/3)
    total = sum(c.time_s for c in q.comm if c.dim == "dp")
    assert sum(c.exposed_s for c in q.comm if c.dim == "dp") == pytest.approx(total - window)


def test_moe_expert_parallel_all_to_all_and_pp_p2p() -> None:
    m = resolve_model("mixtral-8x7b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=16 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=4, pp=2, ep=4), setup, PROFILE, mfu=0.4)
    dims = {c.dim: c for c in p.comm}
    assert dims["ep"].count == 16 * 4 * 4  # 16 layers/stage x 4 micro-batches x (2 fwd + 2 bwd)
    assert dims["ep"].message_bytes == 4096 * 2 * 4096 * 2  # tokens x top-2 x hidden x bf16
    assert dims["pp"].count == 2 * 4 and dims["pp"].message_bytes == 4096 * 4096 * 2
    # the bubble idles a stage for (p-1)/m of its per-micro-batch time, exposed EP all-to-alls included
    assert p.bubble_s == pytest.approx((p.compute_s + dims["ep"].exposed_s) * 1 / 4)


def test_context_parallel_passes_kv_around_the_ring() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=32768, global_batch_tokens=32768, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=1, cp=8), setup, PROFILE)
    (cp,) = [c for c in p.comm if c.dim == "cp"]
    assert cp.count == 32 * 1 * 7 * 3  # layers x micro-batches x (cp-1) x (1 fwd + 2 bwd)
    assert cp.message_bytes == 2 * (32768 / 8) * 8 * 128 * 2  # K and V of the local chunk
    # each ring pass hides only behind the attention block it overlaps: 1/cp of the layer's attention work unit
    t_pass = comm.p2p_time(cp.message_bytes, PROFILE.intra)
    piece = p.breakdown.attention_s / 32 / 3 / 8
    assert cp.exposed_s == pytest.approx(cp.count * max(0.0, t_pass - piece))


def test_context_parallel_at_4k_is_no_faster_so_the_simpler_fsdp_wins() -> None:
    # Issue 21: CP=2 used to win at 4-8K sequences (it sharded optimizer state and raised the micro-batch count for
    # free). Now CP buys nothing at 4K (same tokens per GPU, same sharding) and the tie goes to the simpler layout.
    from phase6.config.plan import PlanConfig
    from phase6.plan.recommend import recommend_train

    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=64 * 4096, zero=3)
    fsdp = predict_train_step(m, ParallelLayout(dp=8), setup, PROFILE)
    cp2 = predict_train_step(m, ParallelLayout(dp=4, cp=2), setup, PROFILE)
    assert cp2.step_time_s >= fsdp.step_time_s
    rec = recommend_train(m, 8, PlanConfig(seq_len=4096, global_batch_tokens=64 * 4096, zero=3), PROFILE)
    assert rec.candidates[0].layout == ParallelLayout(dp=8)
    assert "a tie, simpler layouts first" in rec.candidates[0].reason


def test_kernel_level_compute_counts_each_part_once() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=8), setup, PROFILE)
    b = p.breakdown
    tokens = 4096  # per GPU
    assert b.gemm_s == pytest.approx(6 * m.num_matmul_params() * tokens / PROFILE.matmul_flops)
    attn = 0.5 * 12 * 32 * 32 * 128 * 4096 * tokens / PROFILE.attention_flops  # causal half of 12LHQT
    assert b.attention_s == pytest.approx(attn)
    assert p.compute_s == pytest.approx(b.gemm_s + b.attention_s + b.elementwise_s + b.loss_s)
    assert p.step_time_s == pytest.approx(p.compute_s + p.bubble_s + p.comm_exposed_s + b.optimizer_s)
    # recompute: full AC +2N GEMM and the attention forward again; selective +1N
    full = predict_train_step(
        m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, activation_checkpointing=True), PROFILE
    )
    sel = predict_train_step(m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, selective_ac=True), PROFILE)
    head = 6 * m.vocab_size * m.hidden_size * tokens / PROFILE.matmul_flops
    assert full.breakdown.gemm_s - head == pytest.approx((b.gemm_s - head) * 8 / 6)
    assert sel.breakdown.gemm_s - head == pytest.approx((b.gemm_s - head) * 7 / 6)
    assert full.breakdown.attention_s == pytest.approx(b.attention_s * 4 / 3)
    # FP8 GEMMs at the hardware's FP8 rate (h100_sxm.yaml has none in this test profile: bf16 rate x peak ratio)
    fp8 = predict_train_step(m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, fp8=True), PROFILE)
    assert fp8.breakdown.gemm_s == pytest.approx(b.gemm_s * PROFILE.matmul_flops / PROFILE.matmul_flops_fp8)
    q, k, h, f = m.q_dim, m.kv_dim, m.hidden_size, m.intermediate_size
    casts = 32 * 5 * ((2 * h + q + f) + (q + 2 * k + 2 * h + 2 * f)) * tokens  # activations; + weights per micro-batch
    assert fp8.breakdown.elementwise_s - b.elementwise_s > casts / PROFILE.stream_bytes_per_s


def test_pipeline_stage_imbalance_the_last_stage_carries_the_head() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=16 * 4096, zero=1)
    p = predict_train_step(m, ParallelLayout(dp=1, pp=4), setup, PROFILE)
    layer_mm = (m.num_matmul_params() - m.vocab_size * m.hidden_size) / 32
    tokens = 16 * 4096
    expect = 6 * (8 * layer_mm + m.vocab_size * m.hidden_size) * tokens / PROFILE.matmul_flops
    assert p.breakdown.gemm_s == pytest.approx(expect)


def test_pipeline_leaving_the_node_pays_the_nic() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=1)
    inside = predict_train_step(m, ParallelLayout(dp=1, tp=2, pp=4), setup, PROFILE, mfu=0.4)
    across = predict_train_step(m, ParallelLayout(dp=1, tp=4, pp=4), setup, PROFILE, mfu=0.4)
    assert [c.fabric for c in inside.comm if c.dim == "pp"] == ["nvlink"]
    assert [c.fabric for c in across.comm if c.dim == "pp"] == ["ib"]
