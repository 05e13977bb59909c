"""Training step model: bubble fractions, per-dimension communication counts and bytes, overlap rules."""

from __future__ import annotations

import dataclasses

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
    # grads reduce-scatter in buckets of 40M parameters during the last backward; only the last bucket (launched after
    # the last backward block) and the first all-gather bucket (the first forward block waits for it) stay exposed
    buckets = -(-m.num_params() // 40e6)
    total = sum(c.time_s for c in p.comm if c.dim == "dp")
    assert sum(c.exposed_s for c in p.comm if c.dim == "dp") == pytest.approx(total / buckets)
    slow = build_profile(HardwareConfig(**{**HW.__dict__, "nvlink_gbps": 1.0}))
    q = predict_train_step(m, ParallelLayout(dp=8), big, slow, mfu=0.4)
    window = q.compute_s / q.num_microbatches  # grads: last backward (2/3), params: first forward (1/3)
    rs, ag = [c.time_s for c in q.comm if c.dim == "dp"]
    assert rs > window and ag > window / 3
    assert sum(c.exposed_s for c in q.comm if c.dim == "dp") == pytest.approx(rs - window * 2 / 3 + ag - window / 3)


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
    # FLOPs at the GEMM rate + a fixed 6 us per call: 4 linear groups x 3 GEMMs x 32 blocks + 3 head GEMMs, 1 micro-batch
    calls = 4 * 3 * 32 + 3
    assert b.gemm_s == pytest.approx(6 * m.num_matmul_params() * tokens / PROFILE.matmul_flops + calls * 6e-6)
    # causal half of the forward's 4LHQT, backward 2.5 forwards (FlashAttention's convention), cuDNN's rate at 4K
    attn = 0.5 * 4 * 32 * 32 * 128 * 4096 * tokens * 3.5 / PROFILE.attention_flops_at(4096, "cudnn")
    assert b.attention_s == pytest.approx(attn)
    # the embedding's dense vocab x h gradient, zero-filled once per micro-batch (bf16, no fp32 main grads here)
    assert b.main_grad_s == pytest.approx(2.0 * m.embedding_params() / PROFILE.stream_bytes_per_s)
    assert b.tp_copy_s == 0.0 and b.cp_merge_s == 0.0
    assert p.compute_s == pytest.approx(b.gemm_s + b.attention_s + b.elementwise_s + b.loss_s + b.main_grad_s)
    assert p.step_time_s == pytest.approx(p.compute_s + p.bubble_s + p.comm_exposed_s + b.optimizer_s + p.overlap_s)
    # the FSDP traffic hidden on NVLink slows the compute beside it by 18.9% of its length / 1.189
    assert p.overlap_s == pytest.approx(p.comm_hidden_s * 0.189 / 1.189)
    # recompute: full AC +2N GEMM and the attention forward again; selective +1N
    full = predict_train_step(
        m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, activation_checkpointing=True), PROFILE
    )
    sel = predict_train_step(m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, selective_ac=True), PROFILE)
    head = 6 * m.vocab_size * m.hidden_size * tokens / PROFILE.matmul_flops + 3 * 6e-6
    assert full.breakdown.gemm_s - head == pytest.approx((b.gemm_s - head) * 8 / 6)  # 4 GEMM passes per linear
    assert sel.breakdown.gemm_s - head == pytest.approx((b.gemm_s - head) * 7 / 6)  # 3.5
    assert full.breakdown.attention_s == pytest.approx(b.attention_s * 4.5 / 3.5)  # one more forward
    # FP8 GEMMs at the hardware's FP8 rate (h100_sxm.yaml has none in this test profile: bf16 rate x peak ratio)
    fp8 = predict_train_step(m, ParallelLayout(dp=8), TrainSetup(4096, 8 * 4096, zero=1, fp8=True), PROFILE)
    fixed = calls * 6e-6
    assert fp8.breakdown.gemm_s - fixed == pytest.approx(
        (b.gemm_s - fixed) * PROFILE.matmul_flops / PROFILE.matmul_flops_fp8
    )
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
    expect += (4 * 3 * 8 + 3) * 16 * 6e-6  # GEMM calls of 8 blocks and the head, 16 micro-batches
    assert p.breakdown.gemm_s == pytest.approx(expect)


def test_pipeline_leaving_the_node_pays_the_nic() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=1)
    inside = predict_train_step(m, ParallelLayout(dp=1, tp=2, pp=4), setup, PROFILE, mfu=0.4)
    across = predict_train_step(m, ParallelLayout(dp=1, tp=4, pp=4), setup, PROFILE, mfu=0.4)
    assert [c.fabric for c in inside.comm if c.dim == "pp"] == ["nvlink"]
    assert [c.fabric for c in across.comm if c.dim == "pp"] == ["ib"]


def test_attention_rate_follows_the_published_kernel_curves() -> None:
    # FlashAttention-3 paper (arXiv 2407.08608) Figs. 5-6 on H100: FA2 causal fwd+bwd 302 TF at 16K, 208 at 1K; cuDNN 486
    # and 317. The hardware's attention_tflops_bf16 is FA2's long-sequence rate; cuDNN scales it by 486/302.
    hopper = build_profile(dataclasses.replace(HW, peak_fp8_tflops=1978.9))
    fa2_16k = hopper.attention_flops_at(16384, "fa2")
    assert fa2_16k == pytest.approx(hopper.attention_flops)
    assert hopper.attention_flops_at(1024, "fa2") / fa2_16k == pytest.approx(208 / 302)
    assert hopper.attention_flops_at(16384, "cudnn") / fa2_16k == pytest.approx(486 / 302)
    assert hopper.attention_flops_at(2**18, "fa2") == pytest.approx(fa2_16k)  # flat beyond the measured range
    mid = hopper.attention_flops_at(1448.15, "fa2") / fa2_16k  # halfway between 1K and 2K in log2
    assert mid == pytest.approx((208 + 254) / 2 / 302, rel=1e-3)
    with pytest.raises(ValueError, match="unknown kernel 'xformers'"):
        hopper.attention_flops_at(4096, "xformers")
    # no FP8 tensor cores (this A100-like profile): cuDNN's Hopper curve does not apply
    assert PROFILE.attention_flops_at(4096, "cudnn") == pytest.approx(PROFILE.attention_flops_at(4096, "fa2"))


def test_tp_overlap_covers_the_framework_s_passes_and_leaves_the_reduce_scatter_tail() -> None:
    m = resolve_model("llama3.1-70b")
    setup = TrainSetup(
        seq_len=8192, global_batch_tokens=16 * 8192, micro_batch_size=2, zero=3, activation_checkpointing=True
    )
    lay = ParallelLayout(dp=8, tp=8)
    plain = predict_train_step(m, lay, setup, PROFILE)
    te = predict_train_step(m, lay, dataclasses.replace(setup, tp_comm_overlap=True), PROFILE)
    fwd_only = predict_train_step(
        m, lay, dataclasses.replace(setup, tp_comm_overlap=True, tp_overlap_backward=False), PROFILE
    )
    (tp0,) = [c for c in plain.comm if c.dim == "tp"]
    (tp1,) = [c for c in te.comm if c.dim == "tp"]
    (tp2,) = [c for c in fwd_only.comm if c.dim == "tp"]
    assert tp0.exposed_s == pytest.approx(tp0.time_s)  # not overlapped: all on the critical path
    # TE: every pass covered; the last chunk of each reduce-scatter (1/tp of half the collectives) stays exposed
    assert tp1.exposed_s == pytest.approx(tp1.time_s / 16)
    # AsyncTP: forward + recompute covered (4 of the 6 collectives per block with full AC), backward's exposed
    assert tp2.exposed_s == pytest.approx(tp2.time_s * 2 / 6 + tp2.time_s * 4 / 6 / 16)
    assert plain.step_time_s > fwd_only.step_time_s > te.step_time_s
    # the decomposed peer copies do not charge the SM-contention slowdown; hidden NCCL traffic would
    assert tp1.contention == 0.0


def test_unfused_cross_entropy_moves_40_bytes_per_vocab_entry() -> None:
    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(seq_len=4096, global_batch_tokens=8 * 4096, zero=1)
    fused = predict_train_step(m, ParallelLayout(dp=8), setup, PROFILE).breakdown
    eager = predict_train_step(m, ParallelLayout(dp=8), dataclasses.replace(setup, fused_elementwise=False), PROFILE)
    megatron = predict_train_step(m, ParallelLayout(dp=8), dataclasses.replace(setup, fused_loss=False), PROFILE)
    assert fused.loss_s == pytest.approx(16 * m.vocab_size * 4096 / PROFILE.stream_bytes_per_s)
    assert eager.breakdown.loss_s == pytest.approx(fused.loss_s * 40 / 16)  # follows fused_elementwise by default
    assert megatron.breakdown.loss_s == pytest.approx(eager.breakdown.loss_s)  # fused norms, unfused CE
    assert megatron.breakdown.elementwise_s == pytest.approx(fused.elementwise_s)


def test_selective_ac_with_tp_reruns_the_all_gathers() -> None:
    # torchtitan's op SAC saves reduce-scatter outputs, not all-gather outputs: the recompute reruns the 2 all-gathers
    # of each block (one all-reduce's bytes), so 5 all-reduce equivalents per block and micro-batch instead of 4.
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=1, tp=8)
    none = predict_train_step(m, lay, TrainSetup(8192, 8192, zero=1), PROFILE)
    sac = predict_train_step(m, lay, TrainSetup(8192, 8192, zero=1, selective_ac=True), PROFILE)
    tp_none = next(c for c in none.comm if c.dim == "tp")
    tp_sac = next(c for c in sac.comm if c.dim == "tp")
    assert tp_none.count == 32 * 4 and tp_sac.count == 32 * 5
    assert tp_sac.time_s == pytest.approx(tp_none.time_s * 5 / 4)
    assert "reruns the all-gathers" in tp_sac.note


def test_batch_first_layout_copies_the_gathered_tensor_per_collective() -> None:
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=1, tp=8)
    sbh = predict_train_step(m, lay, TrainSetup(8192, 2 * 8192, micro_batch_size=2, zero=1), PROFILE)
    bsh = predict_train_step(
        m, lay, TrainSetup(8192, 2 * 8192, micro_batch_size=2, zero=1, activation_layout="bsh"), PROFILE
    )
    assert sbh.breakdown.tp_copy_s == 0.0
    gathered = 2 * 8192 * 4096 * 2  # mb x T x h x bf16, the whole gathered tensor
    # 8 all-gathers + reduce-scatters per block (4 forward, 4 backward), each a read + a write of it
    expected = 32 * 8 * 2 * gathered / PROFILE.stream_bytes_per_s
    assert bsh.breakdown.tp_copy_s == pytest.approx(expected)
    assert bsh.step_time_s > sbh.step_time_s
    # no TP, no copy
    dp = predict_train_step(
        m, ParallelLayout(dp=8), TrainSetup(8192, 16 * 8192, 2, zero=1, activation_layout="bsh"), PROFILE
    )
    assert dp.breakdown.tp_copy_s == 0.0


def test_fp32_main_grads_add_the_wgrad_read_write_and_the_zeroing() -> None:
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=8)
    base = TrainSetup(4096, 8 * 4 * 4096, zero=1)  # 4 micro-batches per rank
    plain = predict_train_step(m, lay, base, PROFILE)
    fp32 = predict_train_step(m, lay, dataclasses.replace(base, fp32_grad_accumulation=True), PROFILE)
    bw = PROFILE.stream_bytes_per_s
    matmul = m.num_matmul_params()  # body + head weight elements (the head is untied)
    emb = m.embedding_params()
    assert plain.breakdown.main_grad_s == pytest.approx(4 * 2.0 * emb / bw)
    assert fp32.breakdown.main_grad_s == pytest.approx(4 * (6.0 * matmul + 12.0 * emb) / bw)
    assert fp32.optimizer_s - plain.optimizer_s == pytest.approx(4.0 * m.num_params() / bw)


def test_cp_ring_steps_run_at_the_measured_fraction_of_the_unsplit_rate() -> None:
    from phase6.plan.train import cp_ring_step_efficiency

    m = resolve_model("llama3.1-8b")
    setup = TrainSetup(8192, 8 * 8192, zero=3, attention_kernel="fa2")
    one = predict_train_step(m, ParallelLayout(dp=8), setup, PROFILE).breakdown.attention_s
    cp4 = predict_train_step(m, ParallelLayout(dp=2, cp=4), setup, PROFILE).breakdown.attention_s
    # same tokens per GPU; the rate read at the full length for both; the 3 off-diagonal steps of 4 at the measured
    # efficiency of 1K-token half chunks
    eff = cp_ring_step_efficiency(1024)  # the half chunk T/(2cp)
    assert eff == 0.903
    assert cp4 == pytest.approx(one * (1 / 4 + 3 / 4 / eff))
    assert cp4 / one == pytest.approx(1.0806, abs=5e-4)  # the H200 measured 1.079 (8B) and 1.083 (70B) at 8K CP4


def test_bad_activation_layout_is_one_line() -> None:
    with pytest.raises(ValueError, match="activation_layout: must be sbh or bsh") as e:
        TrainSetup(4096, 4096, activation_layout="bhs")
    assert "\n" not in str(e.value)


def test_torch_ring_bytes_follow_the_torch_code() -> None:
    from phase6.plan.train import cp_merge_bytes

    m = resolve_model("llama3.1-8b")  # q width 4096, KV width 1024 (8 of 32 heads)
    q, k = 4096.0, 1024.0
    p2p = TrainSetup(8192, 8192)
    torch_gqa = TrainSetup(8192, 8192, cp_ring="torch")
    torch_rep = TrainSetup(8192, 8192, cp_ring="torch", repeat_kv=True)
    assert cp_merge_bytes(m, 2, 1, 1, p2p) == cp_merge_bytes(m, 2, 1, 1) == 38 * q + 10 * q + 20 * k
    # cp = 2, one forward pass, per token and block: forward merges 38 q, first/last casts 12 q, K/V contiguous +
    # one send cat 8 kv each; backward: fp32 zeros 4 q + 8 kv, contiguous + one cat 16 kv, two steps of dQ (10 q) and
    # dK/dV (20 kv accumulate + 16 kv fp32 send cat), final casts 6 q + 12 kv, one half step's partial cats 3 q + 6 kv
    # (on average 1/2 per rank).
    for setup, kv in ((torch_gqa, k), (torch_rep, q)):
        fwd = 38 * q + 12 * q + 16 * kv
        bwd = 4 * q + 8 * kv + 16 * kv + 2 * (10 * q + 36 * kv) + 6 * q + 12 * kv + 0.5 * (3 * q + 6 * kv)
        assert cp_merge_bytes(m, 2, 1, 1, setup) == pytest.approx(fwd + bwd)
    assert cp_merge_bytes(m, 8, 2, 2, torch_rep) > cp_merge_bytes(m, 8, 2, 2, torch_gqa) > cp_merge_bytes(m, 8, 2, 2)
    assert cp_merge_bytes(m, 1, 1, 2, torch_rep) == 0.0


def test_torch_ring_exposes_the_last_dkv_send_and_moves_repeated_kv() -> None:
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=2, cp=4)
    setup = TrainSetup(8192, 8 * 8192, zero=3, attention_kernel="fa2", cp_ring="torch", repeat_kv=True)
    p = predict_train_step(m, lay, setup, PROFILE)
    (cp,) = [c for c in p.comm if c.dim == "cp"]
    chunk = 2 * 1 * (8192 / 4) * 4096 * 2  # K and V of the local 2K tokens at the query width, bf16
    assert cp.message_bytes == chunk
    f = PROFILE.group_fabric(1, 4)
    # per layer and micro-batch: 1 forward gather + 1 backward gather + 4 fp32 dK/dV sends; the last send is exposed
    assert cp.count == 32 * 4 * (1 + 1 + 4)
    assert cp.time_s == pytest.approx(
        32 * 4 * (2 * comm.all_gather_time(4 * chunk, 4, f) + 4 * comm.p2p_time(2 * chunk, f))
    )
    assert cp.exposed_s >= 32 * 4 * comm.p2p_time(2 * chunk, f)
    grouped = predict_train_step(m, lay, dataclasses.replace(setup, repeat_kv=False), PROFILE)
    (cp_g,) = [c for c in grouped.comm if c.dim == "cp"]
    assert cp_g.message_bytes * 4 == chunk  # 32 query heads over 8 KV heads


def test_bad_cp_ring_is_one_line() -> None:
    with pytest.raises(ValueError, match="cp_ring: must be p2p or torch") as e:
        TrainSetup(4096, 4096, cp_ring="ring")
    assert "\n" not in str(e.value)


def test_dp_collectives_pay_latency_per_block_or_bucket() -> None:
    # ZeRO-3 (FSDP2): one all-gather / reduce-scatter per block; ZeRO 0-2: one per gradient bucket of
    # max(40M, 1M x DP) parameters (Megatron DDP's default). Each call pays the base latency and its ring steps.
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=16)
    f = PROFILE.group_fabric(1, 16)
    fsdp = predict_train_step(m, lay, TrainSetup(4096, 16 * 4096, zero=3), PROFILE)
    (ag, ag_bwd, rs) = [c for c in fsdp.comm if c.dim == "dp"]
    params = m.num_params()
    one_block = comm.all_gather_time(params * 2 / 32, 16, f)
    assert ag.time_s == pytest.approx(32 * one_block)  # 32 blocks, one micro-batch
    assert ag.time_s - comm.all_gather_time(params * 2, 16, f) == pytest.approx(
        31 * (f.latency_us + 15 * f.hop_latency_us) * 1e-6
    )
    z1 = predict_train_step(m, lay, TrainSetup(4096, 16 * 4096, zero=1), PROFILE)
    (rs1, _) = [c for c in z1.comm if c.dim == "dp"]
    buckets = -(-params // 40e6)  # 1M x 16 < 40M: the floor wins
    assert rs1.time_s == pytest.approx(buckets * comm.reduce_scatter_time(params * 4 / buckets, 16, f))


def test_fp8_training_all_gathers_tp_activations_in_float8() -> None:
    # torchao's Float8 TP (torchtitan's default with Float8Linear): the block input is cast to e4m3 before the forward
    # all-gather and the output gradient to e5m2 before the backward all-gather; reduce-scatters stay bf16.
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=1, tp=8)
    setup = TrainSetup(8192, 2 * 8192, micro_batch_size=2, zero=1, activation_layout="bsh")
    bf16 = predict_train_step(m, lay, setup, PROFILE)
    fp8 = predict_train_step(m, lay, dataclasses.replace(setup, fp8=True), PROFILE)
    tp_b = next(c for c in bf16.comm if c.dim == "tp")
    tp_f = next(c for c in fp8.comm if c.dim == "tp")
    gathered = 2 * 8192 * 4096 * 2  # bf16 bytes of one gathered tensor
    f = PROFILE.intra
    ag, rs = comm.all_gather_time(gathered / 2, 8, f), comm.reduce_scatter_time(gathered, 8, f)
    # 4 all-gathers + 4 reduce-scatters per block (2 + 2 forward, 2 + 2 backward), one micro-batch
    assert tp_f.time_s == pytest.approx(32 * (4 * ag + 4 * rs))
    assert tp_f.wire_bytes == pytest.approx(tp_b.wire_bytes * 3 / 4)
    assert tp_f.time_s < tp_b.time_s and "fp8 all-gathers" in tp_f.op
    # the batch-first copies of the all-gathers move 1 B per element too: 4 x 1 + 4 x 2 instead of 8 x 2
    assert fp8.breakdown.tp_copy_s == pytest.approx(bf16.breakdown.tp_copy_s * 12 / 16)


def test_tp_layout_copies_skip_the_all_gather_at_micro_batch_one() -> None:
    # torch's all_gather_single views instead of chunk + cat when every dim before the gather dim is 1; the
    # reduce-scatter always copies (timed on one H200: 0.38x the old count at micro-batch 1)
    from phase6.plan.train import tp_collective_counts, tp_layout_copy_bytes

    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=1, tp=8)
    one = TrainSetup(65536, 65536, micro_batch_size=1, activation_checkpointing=True, activation_layout="bsh")
    two = dataclasses.replace(one, micro_batch_size=2, global_batch_tokens=2 * 65536)
    ag, rs, _, _ = tp_collective_counts(one)
    assert (ag, rs) == (6, 6)
    elements = 65536 * m.hidden_size
    assert tp_layout_copy_bytes(m, lay, one) == pytest.approx(2 * elements * rs * 2.0)
    assert tp_layout_copy_bytes(m, lay, two) == pytest.approx(2 * 2 * elements * (ag + rs) * 2.0)
    assert tp_layout_copy_bytes(m, lay, dataclasses.replace(one, activation_layout="sbh")) == 0.0
