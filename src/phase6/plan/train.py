"""Training step time for one parallel layout: kernel-level compute, pipeline bubble, each exposed communication.

    step = compute (GEMM + attention + memory-bound kernels, slowest pipeline stage) + bubble
           + TP + CP + EP + PP + DP (each exposed part only) + optimizer

Compute runs at the GPU type's kernel-level rates (``HardwareProfile.matmul_flops`` / ``attention_flops`` /
``stream_bytes_per_s``: sustained GEMM, flash attention, HBM), not at an end-to-end MFU, so the bubble and the
communication are not counted twice (issue 21; formulas and sources in docs/cost_model.md §4).
Rank order is Megatron's ``tp-cp-ep-dp-pp`` (TP innermost): a group stays on NVLink when it fits in a node; across
nodes it gets one NIC per GPU it holds in each node (``HardwareProfile.group_fabric``). Overlap assumptions:
- TP, EP and PP communication sit on the critical path (TP hides behind the block's GEMMs with ``tp_comm_overlap``);
- DP: ZeRO-0 grads overlap the last micro-batch's backward, ZeRO-1/2 grads the last backward and params the first
  forward, ZeRO-3 gathers and reduce-scatters the whole forward+backward (first gather / last reduce-scatter exposed);
- CP: each ring pass of K/V overlaps 1/cp of the layer's attention (the block computed with the chunk already held).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from phase6.plan import comm
from phase6.plan.memory import GIB, ParallelLayout, TrainMemory, TrainSetup, stage_params, train_memory
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile, _curve

GEMM_CALL_OVERHEAD_S = 6e-6
"""Fixed time of one GEMM call beyond its FLOPs at the large-GEMM rate (compute_breakdown; XLA's H100 table)."""

# Communication hidden behind compute is not free: NCCL's kernels occupy SMs (one CTA per channel) and HBM bandwidth
# while the GEMMs run. Measured on A100, H100, MI250 and MI210 training GPT and Llama layers, compute overlapped with
# communication runs on average 18.9% slower (max 40%) than alone (Lee et al. 2025, "Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114). With compute at
# 1/(1 + k) of its speed while a collective of length C runs beside it, the step grows by C·k/(1 + k). That was
# measured inside a node (NVLink / Infinity Fabric), where NCCL drives the most channels (one CTA = one SM each) and
# HBM traffic; a collective on a slower fabric occupies fewer channels and moves fewer bytes per second, so its share
# is scaled by its bus bandwidth over NVLink's (an approximation: ``CommTerm.contention``).
OVERLAP_COMPUTE_SLOWDOWN = 0.189


# Ring attention (torch's load-balanced context_parallel): each rank runs 1/cp of the sequence's causal attention work
# as one causal call on its two head-tail chunks plus cp-1 non-causal calls on half chunks (T/(2cp) tokens). Priced as
# the unsplit sequence's attention (the flash curve read at the full length T: the head-tail chunks keep the causal
# mask's density of the whole sequence, and the off-diagonal steps have no masked tiles), 1/cp of it per rank, with
# the cp-1 off-diagonal steps at ``cp_ring_step_efficiency`` of that rate, a curve over the half-chunk length.
# **Measured on a GPU** (issue 30, seventh round): one rank of torch's own ring over a fake process group on one H200,
# against TP of the same degree on the same sequence (scripts/repro/h200_layout_compute.py; docs/benchmarks.md
# "plan: per-rank compute of TP and CP layouts"). The flash kernels' time ratio CP / TP, 13 layouts in three calls:
# 1.36 at 512-token halves (8K, CP8), 1.08 at 1K (8K, CP4), 1.02-1.04 at 2K (8K, CP2), 1.04-1.07 at 16K (64K CP2,
# 128K CP4, 256K CP8). Each point is least squares in log over its length's layouts in 1/cp + (cp-1)/(cp * eff);
# residuals -1.5%..+3.5% (`PYTHONPATH=src python scripts/repro/plan_layout_compute.py
# docs/results/i30_layout_compute_2026-12-02/run*.json`; a test refits it). No published run enters it. History:
# 0.81/0.845 least squares on the three held-out torchtitan CP rows (until the fifth round), then 1.0 on the causal
# curve read at the half-chunk length (the kernels' published bound; fifth and sixth rounds), which the H200
# contradicts: at 8K CP2 that charged +11% where the GPU measured +2-4%, at 64K-256K nothing where it measured +4-7%.
CP_RING_STEP_EFFICIENCY_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.71),
    (1024, 0.903),
    (2048, 0.953),
    (16384, 0.935),
)


def cp_ring_step_efficiency(half_chunk: float, curve: tuple[tuple[int, float], ...] | None = None) -> float:
    """Rate of an off-diagonal ring step as a fraction of the unsplit kernel's, at the ring's half-chunk length
    T/(2cp) (``CP_RING_STEP_EFFICIENCY_CURVE``: log-linear between the measured lengths, flat outside them)."""
    return _curve(curve or CP_RING_STEP_EFFICIENCY_CURVE, half_chunk)


# Muon's Newton-Schulz GEMMs are small (768 x 768 x 3072 at GPT-2 124M) and come with ~10 elementwise kernels per
# matrix. Fraction of the dense bf16 peak they reach: calibrated on one H200 (2026-12-01, docs/benchmarks.md "6A Muon
# vs AdamW"): +9.2 ms (B=32) and +11.2 ms (B=64) per optimizer step for 1.52 TFLOP = ~150 TFLOP/s. The prior written
# before that measurement was 0.25 (6.2 ms). Larger models' matrices run closer to the GEMM rate: conservative there.
NS_EFFICIENCY = 0.15


def muon_matrix_shapes(model: ModelSpec, layers: int | None = None) -> list[tuple[int, int]]:
    """(rows, cols) of the matrices Muon orthogonalizes in ``layers`` blocks (default: all): GPT-2 keeps Q, K, V in
    one c_attn matrix and a plain MLP (c_attn, c_proj, c_fc, mlp c_proj); HF Llama/Qwen-style models have separate
    q/k/v/o and gate/up/down projections. Embeddings, the LM head, norms and biases stay on AdamW."""
    if model.is_moe:
        raise ValueError(
            f"optimizer=muon: {model.name} is a mixture of experts; the planner prices Muon for dense models"
        )
    h, q, k, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
    if model.gated_mlp:
        per_layer = [(q, h), (k, h), (k, h), (h, q), (f, h), (f, h), (h, f)]
    else:
        per_layer = [(q + 2 * k, h), (h, q), (f, h), (h, f)]
    return per_layer * (model.num_layers if layers is None else layers)


def newton_schulz_flops(shapes: list[tuple[int, int]], ns_steps: int = 5) -> float:
    """FLOPs of Muon's orthogonalization per optimizer step: each quintic iteration on X (m x n, m <= n) is
    A = X X^T (2 m^2 n), B = b A + c A A (2 m^3), X = a X + B X (2 m^2 n)."""
    total = 0.0
    for rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += ns_steps * (4 * m * m * n + 2 * m**3)
    return total


def muon_seconds(model: ModelSpec, layout: ParallelLayout, setup: TrainSetup, profile: HardwareProfile) -> float:
    """Newton-Schulz time per step on one GPU: torch.optim.Muon orthogonalizes every matrix of the GPU's pipeline
    stage on every data-parallel rank (no split of the work across ranks), at NS_EFFICIENCY of the bf16 peak."""
    if setup.optimizer != "muon":
        return 0.0
    layers = math.ceil(model.num_layers / layout.pp)
    return newton_schulz_flops(muon_matrix_shapes(model, layers), setup.ns_steps) / (NS_EFFICIENCY * profile.peak_flops)


def overlap_penalty(hidden_s: float, contention: float = 1.0) -> float:
    """Extra compute time caused by ``hidden_s`` seconds of communication running beside it."""
    k = OVERLAP_COMPUTE_SLOWDOWN * contention
    return max(0.0, hidden_s) * k / (1.0 + k)


def _contention(profile: HardwareProfile, f: comm.Fabric) -> float:
    return min(1.0, f.bandwidth_gbps / profile.intra.bandwidth_gbps)


@dataclass
class CommTerm:
    """One dimension's communication per optimizer step on one GPU."""

    dim: str
    op: str
    fabric: str
    count: int
    """Collectives per step."""
    message_bytes: float
    """Size of one collective's buffer."""
    wire_bytes: float
    """Bytes this GPU sends per step (algorithm volume x count)."""
    time_s: float
    exposed_s: float
    note: str = ""
    contention: float = 1.0
    """Share of ``OVERLAP_COMPUTE_SLOWDOWN`` its hidden part costs the compute beside it (fabric busbw / NVLink's)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "op": self.op,
            "fabric": self.fabric,
            "count": self.count,
            "message_mib": self.message_bytes / 2**20,
            "wire_gib": self.wire_bytes / GIB,
            "time_ms": self.time_s * 1e3,
            "exposed_ms": self.exposed_s * 1e3,
            "note": self.note,
        }


def bubble_fraction(schedule: str, pp: int, m: int, virtual_stages: int = 2) -> float:
    """Pipeline idle time as a fraction of the ideal compute time.

    GPipe and 1F1B: (p-1)/m (Huang et al. 2019; Narayanan et al. 2021); interleaved 1F1B: (p-1)/(v·m) (Narayanan
    et al. 2021 §2.2); zero-bubble ZB-H1: (p-1)/(3m), a third of 1F1B's, at 1F1B's memory (Qi et al. 2023, ZB-H1).
    """
    if pp <= 1:
        return 0.0
    base = (pp - 1) / m
    if schedule == "interleaved":
        return base / virtual_stages
    if schedule == "zero_bubble":
        return base / 3
    if schedule in ("gpipe", "1f1b"):
        return base
    raise ValueError(f"plan.pp_schedule: unknown schedule {schedule!r}")


@dataclass
class StepPrediction:
    """Everything predicted for one layout."""

    layout: ParallelLayout
    setup: TrainSetup
    memory: TrainMemory
    fits: bool
    usable_gib: float
    num_microbatches: int
    tokens_per_step: float
    model_flops_per_step: float
    compute_s: float
    bubble_s: float
    comm: list[CommTerm] = field(default_factory=list)
    mfu_assumed: float = 0.0
    """The end-to-end compute efficiency given (``mfu=``); 0 when the kernel-level model was used."""
    breakdown: ComputeBreakdown | None = None
    optimizer_s: float = 0.0
    overlap_s: float = 0.0
    """Compute slowed by the communication hidden behind it (``overlap_penalty``)."""

    @property
    def comm_exposed_s(self) -> float:
        return sum(c.exposed_s for c in self.comm)

    @property
    def comm_hidden_s(self) -> float:
        return sum(c.time_s - c.exposed_s for c in self.comm)

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.bubble_s + self.comm_exposed_s + self.optimizer_s + self.overlap_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    def mfu(self, peak_flops: float) -> float:
        """Model FLOPs utilisation (6N + 12LHQT, recompute not counted) of the predicted step."""
        return self.model_flops_per_step / (self.step_time_s * self.layout.gpus * peak_flops)

    def dominant(self) -> str:
        parts = {
            "compute": self.compute_s,
            "pipeline bubble": self.bubble_s,
            "optimizer step": self.optimizer_s,
            "compute slowed by overlapped communication": self.overlap_s,
        }
        for c in self.comm:
            parts[f"{c.dim} {c.op}"] = parts.get(f"{c.dim} {c.op}", 0.0) + c.exposed_s
        return max(parts, key=lambda k: parts[k])

    def reason(self) -> str:
        step = self.step_time_s
        bits = [
            f"{'fits' if self.fits else 'does NOT fit'} at {self.memory.total / GIB:.1f}/{self.usable_gib:.0f} GiB "
            f"(ZeRO-{self.setup.zero}, AC {self.setup.ac_mode})",
            f"compute {100 * self.compute_s / step:.0f}% of step",
        ]
        if self.layout.pp > 1:
            sched = self.setup.pp_schedule + (
                f" v={self.setup.virtual_stages}" if self.setup.pp_schedule == "interleaved" else ""
            )
            bits.append(f"schedule {sched}, bubble {100 * self.bubble_s / step:.0f}% (m={self.num_microbatches})")
        for c in self.comm:
            share = 100 * c.exposed_s / step
            hidden = " hidden" if c.exposed_s < 0.05 * c.time_s else ""
            bits.append(f"{c.dim} {c.op} on {c.fabric}{hidden} {share:.0f}%")
        if self.overlap_s:
            bits.append(f"overlap slowdown {100 * self.overlap_s / step:.0f}%")
        return f"dominated by {self.dominant()}; " + ", ".join(bits)


def _group_fabric(profile: HardwareProfile, stride: int, size: int) -> comm.Fabric:
    return profile.group_fabric(stride, size)


def elementwise_bytes_per_token_layer(model: ModelSpec, fused: bool) -> float:
    """HBM bytes one token moves through the non-matmul, non-attention kernels of one block's forward (bf16 = 2 B).

    Fused (torch.compile / TE / llm.c): each norm reads and writes h, each residual add reads 2h and writes h, RoPE
    reads and writes q and k, the activation reads its inputs and writes its output (gated 3f, GELU 2f):
    2·(10h + 2(q + k)·rope + 3f | 2f). Eager PyTorch (one kernel per op, torchtitan's RMSNorm/RoPE upcast to fp32):
    RMSNorm = cast, pow, mean, mul, cast, weight-mul ~ 40h B each; RoPE on fp32 complex views ~ 20 B per q/k element;
    SiLU + mul ~ 10f B (GELU 4f); residual adds 6h B each; q/k/v/out layout copies for SDPA 4(q + 2k) + 4q B.
    Backward moves about twice the forward's bytes (read saved input + incoming grad, write grad): x3 per step.
    """
    h, q, k, f = (
        model.hidden_size,
        model.q_dim,
        model.kv_dim,
        model.expert_size if model.is_moe else model.intermediate_size,
    )
    f_tok = f * (model.experts_per_token if model.is_moe else 1) + model.shared_expert_intermediate_size
    rope = 0.0 if model.learned_positions else 1.0
    if fused:
        return 2.0 * (10 * h + 2 * (q + k) * rope + (3 if model.gated_mlp else 2) * f_tok)
    return (
        80.0 * h + 12.0 * h + 20.0 * (q + k) * rope + (10 if model.gated_mlp else 4) * f_tok + 4 * (q + 2 * k) + 4 * q
    )


@dataclass
class ComputeBreakdown:
    """Kernel-level compute of one GPU for one optimizer step (seconds), before bubble and communication."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    loss_s: float
    optimizer_s: float
    recompute_note: str = ""
    cp_merge_s: float = 0.0
    """Ring attention's per-step output merges (fp32 rescaling) and gradient accumulations (``cp_merge_bytes``)."""
    tp_copy_s: float = 0.0
    """Chunk + cat copies around the sequence-parallel collectives of a batch-first layout (``tp_layout_copy_bytes``)."""
    main_grad_s: float = 0.0
    """Weight-gradient GEMM outputs read and written in fp32 main grads (``main_grad_bytes``)."""

    @property
    def fwd_bwd_s(self) -> float:
        return (
            self.gemm_s
            + self.attention_s
            + self.elementwise_s
            + self.loss_s
            + self.cp_merge_s
            + self.tp_copy_s
            + self.main_grad_s
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "gemm_ms": 1e3 * self.gemm_s,
            "attention_ms": 1e3 * self.attention_s,
            "elementwise_ms": 1e3 * self.elementwise_s,
            "loss_ms": 1e3 * self.loss_s,
            "optimizer_ms": 1e3 * self.optimizer_s,
            "cp_merge_ms": 1e3 * self.cp_merge_s,
            "tp_copy_ms": 1e3 * self.tp_copy_s,
            "main_grad_ms": 1e3 * self.main_grad_s,
        }


def cp_kv_width(model: ModelSpec, setup: TrainSetup | None) -> int:
    """Width (elements per token) of each of K and V as ring attention moves them: the query width when the model
    expands K/V to the query heads before the attention call (``TrainSetup.repeat_kv``, torchtitan), else the KV
    heads' width."""
    return model.q_dim if setup is not None and setup.repeat_kv else model.kv_dim


def cp_merge_bytes(model: ModelSpec, cp: int, tp: int, fwd_passes: int, setup: TrainSetup | None = None) -> float:
    """HBM bytes per token and block that ring attention adds on top of the attention kernels (context parallelism).

    "p2p" ring (``TrainSetup.cp_ring``, the default): each of the cp-1 ring steps after the local one yields a
    partial attention output and log-sum-exp that is merged into the running output in fp32 (torch's ring attention
    ``_SDPAMerger``: cast the block output 2+4 B, out - block 4+4+4, x sigmoid(lse gap) 4+4, out - that 4+4+4 = 38 B
    per output element), once per forward pass (twice with full AC); the backward accumulates each step's dQ into an
    fp32 buffer (read bf16 dQ 2 B, read + write the sum 8 B = 10 B per query element) and rotates fp32 dK/dV
    accumulators (10 B per K and per V element). Per token: (cp-1) x [fwd_passes x 38 q + 10 q + 20 kv] / tp.

    "torch" ring (torch.distributed.tensor.experimental._attention ``_templated_ring_attention`` and its backward,
    as torchtitan runs it), counted from that code, kv = ``cp_kv_width``:
    - forward, per pass: the merges as above, the first step's output cast to fp32 and the result's cast back (6 q
      each), key/value ``.contiguous()`` (read + write 2 kv x 2 B = 8 kv) and the ``torch.cat([key, value])`` of the
      rotation buffer at each of the cp-1 steps that send (8 kv each);
    - backward: fp32 zeros for dQ, dK, dV (4 q + 8 kv), the contiguous and cp-1 cat copies of K/V (8 kv each), dQ
      accumulated at all cp steps (10 q each, step 0 included), dK/dV accumulated (20 kv each) and cat into the fp32
      send buffer (read + write 2 kv x 4 B = 16 kv) at all cp steps, the final casts of dQ (6 q) and dK/dV (12 kv);
    - ``_partial_update`` on the load-balanced half steps (on average (cp-1)/2 per rank for dQ and for dK/dV): the
      half is added in place (5 q, 10 kv) and the whole fp32 buffer is rebuilt by torch.cat (8 q, 16 kv) instead of
      a full add (10 q, 20 kv): +3 q and +6 kv each.
    """
    if cp <= 1:
        return 0.0
    q = model.q_dim
    kv = cp_kv_width(model, setup)
    if setup is None or setup.cp_ring == "p2p":
        return (cp - 1) * (fwd_passes * 38.0 * q + 10.0 * q + 20.0 * kv) / tp
    fwd = fwd_passes * ((cp - 1) * (38.0 * q + 8.0 * kv) + 12.0 * q + 8.0 * kv)
    bwd = (4.0 * q + 8.0 * kv) + 8.0 * cp * kv + cp * (10.0 * q + 36.0 * kv) + 6.0 * q + 12.0 * kv
    bwd += (cp - 1) / 2 * (3.0 * q + 6.0 * kv)
    return (fwd + bwd) / tp


def tp_collective_counts(setup: TrainSetup) -> tuple[int, int, int, int]:
    """(all-gathers, reduce-scatters, all-gathers fused with a GEMM, reduce-scatters fused) of sequence parallelism
    per block and micro-batch.

    Forward: an all-gather before attention and before the MLP, a reduce-scatter after each (2 + 2); the backward
    mirrors them (2 + 2: the all-gather of the gradient of each forward reduce-scatter, the reduce-scatter of the
    gradient of each forward all-gather); full AC reruns the forward's 2 + 2. Selective op-level AC (torchtitan's
    policy) saves every other matmul output and the reduce-scatters' outputs, not the all-gathers' (torchtitan
    parallelize_llama ``_save_list``): the recompute reruns the 2 all-gathers that feed the recomputed matmuls. An
    all-gather + reduce-scatter pair moves an all-reduce's bytes. With ``tp_comm_overlap`` the forward and recompute
    collectives are fused with their GEMMs, the backward's only with ``tp_overlap_backward``.
    """
    fwd_passes = 2 if setup.activation_checkpointing else 1
    sac = 1 if (setup.selective_ac and not setup.activation_checkpointing) else 0
    ag, rs = 2 * fwd_passes + 2 + 2 * sac, 2 * fwd_passes + 2
    ag_cov = rs_cov = 0
    if setup.tp_comm_overlap:
        bwd = 2 if setup.tp_overlap_backward else 0
        ag_cov, rs_cov = 2 * fwd_passes + 2 * sac + bwd, 2 * fwd_passes + bwd
    return ag, rs, ag_cov, rs_cov


def tp_all_gather_bytes_per_element(setup: TrainSetup) -> float:
    """Bytes per element a sequence-parallel all-gather moves: 1 with FP8 training, 2 (bf16) otherwise.

    torchtitan's Float8 TP (torchao.float8.float8_tensor_parallel, applied whenever Float8Linear's tensorwise
    scaling is on: torchtitan docs/float8.md "we support float8 all-gather ... for TP (by default for
    Float8Linear)"): ``PrepareFloat8ModuleInput`` casts the sequence-sharded block input to float8 *before* its
    Shard(1) -> Replicate redistribution, so the forward (and recompute) all-gathers move e4m3; Float8Rowwise/
    ColwiseParallel's ``_prepare_output_fn`` puts ``_NoopFwToFloat8BwDynamic`` after the output redistribution, so in
    the backward the incoming gradient is cast to e5m2 before the all-gather that mirrors the forward reduce-scatter.
    The reduce-scatters carry partial sums of matmul outputs and stay bf16. Transformer Engine's FP8 sequence
    parallelism also gathers the FP8 input (an assumption for TE; no FP8 Megatron row is in the table).
    """
    return 1.0 if setup.fp8 else 2.0


def tp_layout_copy_bytes(model: ModelSpec, layout: ParallelLayout, setup: TrainSetup) -> float:
    """HBM bytes per block and micro-batch that a batch-first ("bsh") layout adds around the sequence-parallel
    collectives: torch's functional all_gather_tensor(gather_dim=1) gathers on dim 0 and then
    torch.cat(torch.chunk(out, tp, dim=0), dim=1), and reduce_scatter_tensor(scatter_dim=1) first does
    torch.cat(torch.chunk(x, tp, dim=1)) (torch/distributed/_functional_collectives.py; DTensor's Shard(1) <->
    Replicate redistributions in torchtitan's sequence parallelism go through them): a read and a write of the whole
    gathered tensor, mb x T/cp x h elements, per collective (the all-gathers' at their wire dtype,
    ``tp_all_gather_bytes_per_element``; the reduce-scatters' bf16). Megatron keeps activations sequence-first ("sbh")
    so its collectives run on dim 0 without a copy. Collectives fused with their GEMM (torch AsyncTP) keep one: the
    fused all-gather-matmul / matmul-reduce-scatter move the sequence dim to the front and back (movedim + flatten in
    torch/distributed/_symmetric_memory ``_fused_all_gather_matmul_impl``), priced as the same copy."""
    if layout.tp <= 1 or setup.activation_layout != "bsh":
        return 0.0
    ag, rs, _, _ = tp_collective_counts(setup)
    elements = setup.micro_batch_size * setup.seq_len / layout.cp * model.hidden_size
    if setup.micro_batch_size == 1:
        # all_gather_single views instead of chunk + cat when every dim before gather_dim is 1 (a micro-batch of one
        # sequence); reduce_scatter_single always narrows and cats. Timed on one H200 (torch 2.11, 8B at 64K-256K,
        # TP 2/4/8, micro-batch 1): the cat kernels took 0.38x the all-gather + reduce-scatter count, 0.76x this one.
        ag = 0
    return 2 * elements * (ag * tp_all_gather_bytes_per_element(setup) + rs * 2.0)


def main_grad_bytes(weights: float) -> float:
    """Extra HBM bytes per micro-batch when the weight-gradient GEMMs of ``weights`` weight elements accumulate into
    fp32 main grads (Megatron's gradient_accumulation_fusion: a GEMM with beta = 1 and an fp32 C/D): read 4 B and
    write 4 B per element instead of writing a 2 B bf16 gradient, 6 B more. A tile's epilogue (read C, write D) runs
    after that tile's main loop in cuBLAS's cooperative Hopper kernels, so the traffic is priced at the HBM rate on
    top of the GEMM's FLOPs (an upper estimate: ping-pong kernels hide part of it); with K = one micro-batch's
    tokens (4096 in Megatron's table) it adds ~1/5 to the weight-gradient GEMM's time."""
    return 6.0 * weights


def compute_breakdown(
    model: ModelSpec, layout: ParallelLayout, setup: TrainSetup, profile: HardwareProfile, tokens_step: float
) -> ComputeBreakdown:
    """GEMMs at the achievable matmul rate, flash attention at its rate on the causal FLOPs it executes, memory-bound
    kernels (norms, activations, RoPE, residuals, loss, optimizer) at HBM bandwidth. Sources: docs/cost_model.md §4.

    Per GPU of the slowest pipeline stage: a stage holds ceil(L/pp) blocks, and the last one also the LM head and the
    loss (the first one's embedding lookup is free), so with PP the step runs at the pace of the heavier stage.
    TP (with sequence parallelism) divides every term; DP and CP divide the tokens.
    """
    n_mm = model.num_matmul_params()
    head_mm = model.vocab_size * model.hidden_size  # the LM head matmul (tied or not, it is a GEMM)
    layer_mm = (n_mm - head_mm) / model.num_layers
    layers = math.ceil(model.num_layers / layout.pp)
    tokens_gpu = tokens_step / (layout.dp * layout.cp)  # tokens through this GPU's stage per step
    tp = layout.tp
    # Recompute: full AC reruns every block forward (2N per token); selective op-level AC reruns every other matmul
    # (torchtitan op SAC saves every second mm output): +1N. The head is outside the checkpointed blocks.
    if setup.activation_checkpointing:
        extra_mm, attn_fwd_again, elem_passes, note = 2.0, True, 4.0, "full AC: +2N GEMM, attention fwd again"
    elif setup.selective_ac:
        extra_mm, attn_fwd_again, elem_passes, note = 1.0, False, 4.0, "selective AC: +1N GEMM"
    else:
        extra_mm, attn_fwd_again, elem_passes, note = 0.0, False, 3.0, ""
    gemm_rate = profile.matmul_flops_fp8 if setup.fp8 else profile.matmul_flops
    body_flops = (6.0 + extra_mm) * layers * layer_mm * tokens_gpu
    head_flops = 6.0 * head_mm * tokens_gpu
    # Each GEMM call also pays a fixed ~6 us (prologue, pipeline fill, the last partial wave, epilogue) beyond its
    # FLOPs at the large-GEMM rate: XLA's measured H100 (sm_90) bf16 matmul table (openxla
    # xla/service/gpu/model/matmul_interpolator_data.h) fits t = FLOPs / 783 TF + 5-7 us for K >= 1024 (2048^3: 632 TF,
    # 2048x1024x2048: 523 TF, 4096^3: 783 TF). Calls per block and micro-batch: 4 linear groups (QKV, out, up/gate,
    # down) x (forward, dgrad, wgrad, + 1 forward with full AC, + 1/2 with selective AC); the head 3 per micro-batch.
    m_steps = max(1, round(tokens_gpu / (setup.micro_batch_size * setup.seq_len / layout.cp)))
    passes = 3.0 + extra_mm / 2.0
    body_calls = 4 * passes * layers * m_steps
    head_calls = 3 * m_steps
    last_gemm = (body_flops + head_flops) / (tp * gemm_rate) + (body_calls + head_calls) * GEMM_CALL_OVERHEAD_S
    first_gemm = body_flops / (tp * gemm_rate) + body_calls * GEMM_CALL_OVERHEAD_S if layout.pp > 1 else last_gemm
    # Flash attention forward: 4·H·Q·T per token and layer for QK^T and PV over the full score matrix, half of it for
    # a causal kernel; the backward recomputes the scores and runs 2.5x the forward (FlashAttention-2 §3.1.2; its
    # benchmarks count fwd+bwd as 3.5 forwards, the convention of ``attention_flops``); full AC runs one more forward.
    # The rate is ``attention_flops_at`` the sequence length, with context parallelism too (``cp_ring_step_efficiency``).
    attn_fwd = 0.5 * 4.0 * layers * model.num_heads * model.head_dim * setup.seq_len * tokens_gpu
    attn_rate = profile.attention_flops_at(setup.seq_len, setup.attention_kernel)
    attention = attn_fwd * (3.5 + (1.0 if attn_fwd_again else 0.0)) / (tp * attn_rate)
    if layout.cp > 1:
        # The cp-1 off-diagonal ring steps at the measured fraction of the rate for their half-chunk length.
        eff = cp_ring_step_efficiency(setup.seq_len / (2 * layout.cp))
        attention *= 1.0 / layout.cp + (layout.cp - 1) / layout.cp / eff
    bw = profile.stream_bytes_per_s
    per_layer_bytes = elementwise_bytes_per_token_layer(model, setup.fused_elementwise)
    elem = elem_passes * layers * per_layer_bytes * tokens_gpu / (tp * bw)
    if setup.fp8:
        # Dynamic-scaling FP8 (torchao Float8Linear, TE): every GEMM operand is cast on the fly - read bf16 for the
        # amax (2 B), read again and write FP8 (2 + 1 B) = 5 B per element. Per token and block: the inputs of the
        # four linear groups forward (QKV h, out q, gate/up h, down f) and their output gradients backward (q + 2k,
        # h, 2f, h); weights once forward and once (transposed) backward per micro-batch, on the gathered copy.
        q, k, h = model.q_dim, model.kv_dim, model.hidden_size
        f = model.expert_size * model.experts_per_token if model.is_moe else model.intermediate_size
        act = 5.0 * ((2 * h + q + f) + (q + 2 * k + 2 * h + 2 * f))
        weights = 10.0 * layers * layer_mm * m_steps
        elem += (layers * act * tokens_gpu + weights) / (tp * bw)
    # Loss (vocab-parallel), HBM bytes per vocab entry and token. Fused (llm.c's classifier, torch.compile, TE/Megatron
    # --cross-entropy-loss-fusion): 16 B, which with the fused elementwise kernels matches this repo's H200 6A profile
    # (inductor Triton kernels 34.1 ms vs 32 ms predicted). Unfused, counted from eager PyTorch's F.cross_entropy on
    # logits.float(): cast 2+4, log_softmax 3x4 (max, sum, write), nll backward 4 (dense grad), log_softmax backward
    # 3x4, cast back 4+2 = 40 B (Megatron's unfused vocab-parallel CE, the default, makes about as many fp32 passes).
    fused_loss = setup.fused_elementwise if setup.fused_loss is None else setup.fused_loss
    loss = (16.0 if fused_loss else 40.0) * model.vocab_size * tokens_gpu / (tp * bw)
    fwd_passes = 2 if setup.activation_checkpointing else 1
    cp_merge = layers * cp_merge_bytes(model, layout.cp, tp, fwd_passes, setup) * tokens_gpu / bw
    tp_copy = layers * m_steps * tp_layout_copy_bytes(model, layout, setup) / bw
    body_grad = head_grad = 0.0
    if setup.fp32_grad_accumulation:
        body_grad = m_steps * main_grad_bytes(layers * layer_mm / tp) / bw
        head_grad = m_steps * main_grad_bytes(head_mm / tp) / bw
    # The embedding's backward (not a GEMM) materializes a dense vocab x h gradient per micro-batch: torch's
    # embedding_dense_backward zero-fills it (2 B per element; vocab-parallel over TP); with fp32 main grads it is then
    # added into them (read 2 + 4, write 4: 10 B more). First pipeline stage only.
    emb_grad = m_steps * (2.0 + (10.0 if setup.fp32_grad_accumulation else 0.0)) * model.embedding_params() / tp / bw
    first = first_gemm + attention + elem + cp_merge + tp_copy + body_grad + emb_grad
    last = last_gemm + attention + elem + loss + cp_merge + tp_copy + body_grad + head_grad
    if layout.pp == 1:
        last += emb_grad
    main_grad = body_grad + head_grad + (emb_grad if layout.pp == 1 else 0.0)
    if first > last:  # (only with a tiny vocab) report the first stage
        last_gemm, loss, main_grad = first_gemm, 0.0, body_grad + emb_grad
    # AdamW on the local (ZeRO-sharded) fp32 states: read param, grad, m, v (16 B), write param, m, v, bf16 copy (14 B).
    local = (layers * model.layer_params() + model.embedding_params() + model.lm_head_params()) / tp
    if layout.pp == 1:
        local = model.num_params() / tp
    if setup.zero >= 1:
        local /= layout.dp * layout.cp
    # (With optimizer=muon the blocks' matrices keep one momentum buffer instead of two moments: the AdamW traffic
    # above still counts every parameter, a slight over-estimate; Newton-Schulz is added on top.)
    optimizer = 30.0 * local / bw + muon_seconds(model, layout, setup, profile)
    if setup.fp32_grad_accumulation:  # the fp32 main-grad buffer (full, not sharded by ZeRO-1/2) is zeroed every step
        stage = (layers * model.layer_params() + model.embedding_params() + model.lm_head_params()) / tp
        optimizer += 4.0 * (model.num_params() / tp if layout.pp == 1 else stage) / bw
    return ComputeBreakdown(last_gemm, attention, elem, loss, optimizer, note, cp_merge, tp_copy, main_grad)


def predict_train_step(
    model: ModelSpec,
    layout: ParallelLayout,
    setup: TrainSetup,
    profile: HardwareProfile,
    mfu: float | None = None,
    overhead_gib: float = 0.0,
) -> StepPrediction:
    """Predict one optimizer step of ``layout`` (all sizes per GPU unless named otherwise).

    ``mfu=None`` (default): kernel-level compute (``compute_breakdown``) plus each exposed communication and the
    bubble. ``mfu=x``: the whole forward+backward runs at x of the bf16 peak (an end-to-end efficiency you measured;
    the communication and bubble terms are still added, so x should be a compute-only efficiency).
    """
    dp, tp, pp, ep, cp = layout.dp, layout.tp, layout.pp, layout.ep, layout.cp
    m = setup.num_microbatches(layout)
    s_local, mb, h = setup.seq_len / cp, setup.micro_batch_size, model.hidden_size
    tokens_step = float(m * mb * dp * setup.seq_len)
    model_flops = model.flops_per_token(setup.seq_len) * tokens_step
    if mfu is not None:
        hw_flops = model_flops * (4 / 3 if setup.activation_checkpointing else 1.0)  # full AC reruns the forward
        compute = hw_flops / (layout.gpus * mfu * profile.peak_flops)
        breakdown = None
        optimizer = muon_seconds(model, layout, setup, profile)  # an end-to-end mfu covers AdamW, not Newton-Schulz
    else:
        breakdown = compute_breakdown(model, layout, setup, profile, tokens_step)
        compute = breakdown.fwd_bwd_s
        optimizer = breakdown.optimizer_s
    mem = train_memory(model, layout, setup, overhead_gib)
    usable = profile.hardware.hbm_gib
    pred = StepPrediction(
        layout=layout,
        setup=setup,
        memory=mem,
        fits=mem.total <= usable * GIB,
        usable_gib=usable,
        num_microbatches=m,
        tokens_per_step=tokens_step,
        model_flops_per_step=model_flops,
        compute_s=compute,
        bubble_s=0.0,
        mfu_assumed=mfu or 0.0,
        breakdown=breakdown,
        optimizer_s=optimizer,
    )
    layers = math.ceil(model.num_layers / pp)
    act_bytes = mb * s_local * h * 2  # one micro-batch's hidden states in bf16
    fwd_passes = 2 if setup.activation_checkpointing else 1
    per_layer_mb = compute / (layers * m) if layers * m else 0.0  # one block, one micro-batch, fwd+bwd
    if breakdown is not None:
        attn_per_layer_mb = breakdown.attention_s / (layers * m)
        gemm_per_layer_mb = breakdown.gemm_s / (layers * m)
    else:
        attn_flops = 12.0 * model.num_layers * model.num_heads * model.head_dim * setup.seq_len * tokens_step
        attn_per_layer_mb = attn_flops / (layout.gpus * mfu * profile.peak_flops) / (layers * m) if mfu else 0.0
        gemm_per_layer_mb = per_layer_mb - attn_per_layer_mb

    if tp > 1:  # 2 all-reduces per block forward + 2 backward (Megatron; with SP: AG + RS of the same volume)
        f = _group_fabric(profile, 1, tp)
        n_ag, n_rs, ag_cov, rs_cov = tp_collective_counts(setup)
        n = layers * m * (n_ag + n_rs) // 2  # all-reduce equivalents (an all-gather + reduce-scatter pair)
        t, algo = comm.all_reduce_time(act_bytes, tp, f)
        op = f"all-reduce ({algo})"
        t_ag = t_rs = t / 2
        ag_elem = tp_all_gather_bytes_per_element(setup)
        if ag_elem < 2.0:  # FP8 all-gathers (tp_all_gather_bytes_per_element); reduce-scatters stay bf16
            t_ag = comm.all_gather_time(act_bytes * ag_elem / 2, tp, f)
            t_rs = comm.reduce_scatter_time(act_bytes, tp, f)
            op = "fp8 all-gathers + reduce-scatters"
        total = layers * m * (n_ag * t_ag + n_rs * t_rs)
        if setup.tp_comm_overlap:
            # Decomposed overlap (Wang et al. 2023, "Overlap Communication with Dependent Computation via
            # Decomposition", ASPLOS; TE userbuffers, torch AsyncTP): a collective is split into tp chunks, each
            # moved while the GEMM of another runs. An all-gather starts on the local chunk (nothing exposed); a
            # reduce-scatter sends its last chunk after the last GEMM piece: 1/tp of each fused reduce-scatter stays
            # exposed. Which passes are covered depends on the framework: TE (Megatron --tp-comm-overlap) overlaps
            # forward and backward; torch AsyncTP fuses only forward (and recompute) patterns - in the backward graph
            # the reduce-scatters take sums of matmuls, not one matmul (pytorch/pytorch#149946), and its authors
            # report ~20% forward but ~8% end-to-end speedup on Llama 3 70B (PyTorch dev-discuss, "Introducing Async
            # Tensor Parallelism in PyTorch", 2024).
            covered = layers * m * (ag_cov * t_ag + rs_cov * t_rs)
            tail = layers * m * rs_cov * t_rs / tp
            window = gemm_per_layer_mb * layers * m * (covered / total)
            exposed = (total - covered) + tail + max(0.0, covered - tail - window)
            note = "overlapped with the block's GEMMs (tp_comm_overlap), 1/tp of each reduce-scatter exposed" + (
                "" if setup.tp_overlap_backward else "; backward collectives exposed (AsyncTP: forward only)"
            )
        else:
            exposed = total
            note = (
                f"2/block fwd + 2 bwd{' + 2 recompute' if fwd_passes == 2 else ''}"
                f"{' + 1 (selective AC reruns the all-gathers)' if (n_ag + n_rs) % 4 else ''}, not overlapped"
            )
        pred.comm.append(
            CommTerm(
                "tp",
                op,
                f.name,
                n,
                act_bytes,
                layers
                * m
                * (
                    n_ag * comm.all_gather_bytes(act_bytes * ag_elem / 2, tp)
                    + n_rs * comm.reduce_scatter_bytes(act_bytes, tp)
                ),
                total,
                exposed,
                note,
                0.0,  # the decomposed transfers are peer copies (copy engines), not NCCL's SM-resident kernels
            )
        )
    if cp > 1:
        # Ring attention (load-balanced, 2·cp chunks), per layer and micro-batch; the attention of one layer and
        # micro-batch is fwd_passes + 2 forward-equivalents (the backward two), a ring step 1/cp of each.
        f = _group_fabric(profile, tp, cp)
        kv_local = max(float(model.head_dim), cp_kv_width(model, setup) / tp)
        chunk = 2 * mb * s_local * kv_local * 2  # this rank's K and V in bf16
        unit = attn_per_layer_mb / (fwd_passes + 2)
        if setup.cp_ring == "torch":
            # torch's context_parallel (default rotate method ALL_GATHER): K/V are all-gathered once per forward pass
            # and once in the backward, issued before the local (diagonal) step and waited after it, so each gather
            # hides behind that step only; dK/dV (fp32, 2 x the bytes) go to the next rank by an all-to-all after
            # every one of the cp backward steps, each hidden behind the next step's kernel, and the last one is
            # waited at the end with nothing left to hide behind (_templated_ring_attention[_backward]).
            t_ag = comm.all_gather_time(cp * chunk, cp, f)
            t_dkv = comm.p2p_time(2 * chunk, f)
            bwd_step = 2 * unit / cp
            n = layers * m * (fwd_passes + 1 + cp)
            total = layers * m * ((fwd_passes + 1) * t_ag + cp * t_dkv)
            exposed = (
                layers
                * m
                * (
                    fwd_passes * max(0.0, t_ag - unit / cp)
                    + max(0.0, t_ag - bwd_step)
                    + (cp - 1) * max(0.0, t_dkv - bwd_step)
                    + t_dkv
                )
            )
            op = "K/V all-gather + dK/dV all-to-all"
            note = "torch context_parallel: each gather hides behind the local step, the last dK/dV send is exposed"
            wire = layers * m * ((fwd_passes + 1) * comm.all_gather_bytes(cp * chunk, cp) + cp * 2 * chunk)
        else:
            # One pass of the local K/V per ring step: cp-1 forward (per pass), cp-1 of K/V plus cp-1 of dK/dV
            # backward. Pass i overlaps only the attention block computed with the chunk already held, 1/cp of
            # this layer's attention: exposed per pass is max(0, pass - attention/cp) (Liu et al. 2023).
            passes = (cp - 1) * (fwd_passes + 2)
            n = layers * m * passes
            t_pass = comm.p2p_time(chunk, f)
            total = n * t_pass
            exposed = n * max(0.0, t_pass - unit / cp)
            op, note, wire = "ring K/V pass", "each pass overlaps 1/cp of the layer's attention", n * chunk
        pred.comm.append(CommTerm("cp", op, f.name, n, chunk, wire, total, exposed, note, _contention(profile, f)))
    if ep > 1 and model.is_moe:  # dispatch + combine all-to-all per MoE layer, forward and backward
        f = _group_fabric(profile, tp * cp, ep)
        size = mb * s_local / tp * model.experts_per_token * h * 2
        n = layers * m * (2 * fwd_passes + 2)
        t = n * comm.all_to_all_time(size, ep, f)
        pred.comm.append(
            CommTerm(
                "ep",
                "all-to-all",
                f.name,
                n,
                size,
                n * comm.all_to_all_bytes(size, ep),
                t,
                t,
                "2/MoE layer fwd + 2 bwd, not overlapped",
            )
        )
    # The pipeline bubble idles each stage for (p-1)/m (schedule-dependent) of its per-micro-batch time, which
    # includes that micro-batch's exposed TP/CP/EP communication.
    # Compute slowed by the TP/CP/EP communication hidden inside each micro-batch: part of the per-micro-batch time.
    pred.overlap_s = sum(overlap_penalty(c.time_s - c.exposed_s, c.contention) for c in pred.comm)
    in_mb = compute + pred.comm_exposed_s + pred.overlap_s
    pred.bubble_s = in_mb * bubble_fraction(setup.pp_schedule, pp, m, setup.virtual_stages)
    if pp > 1:  # activation forward + its gradient backward, per micro-batch per stage boundary
        # One GPU talks to one peer: a boundary that leaves the node is one NIC (no multi-NIC ring aggregation);
        # the slowest stage boundary is on the critical path.
        f = profile.fabric_for(tp * cp * dp * pp)
        size = act_bytes / tp
        chunks = setup.virtual_stages if setup.pp_schedule == "interleaved" else 1
        n = 2 * m * chunks
        t = n * comm.p2p_time(size, f)
        pred.comm.append(
            CommTerm(
                "pp",
                "send/recv",
                f.name,
                n,
                size,
                n * size,
                t,
                t,
                "p2p between dependent micro-batches, on the critical path",
            )
        )
    shard = dp * cp
    if shard > 1:
        f = _group_fabric(profile, tp, cp * dp)
        (d_first, e_first), (d_last, e_last) = stage_params(model, pp)
        dense = max(d_first, d_last) / tp
        expert = max(e_first, e_last) / (tp * ep)
        g = setup.grad_reduce_bytes
        expert_shard = max(1, shard // ep)
        # ZeRO-3 gathers per micro-batch, except under PP where the stage stays unsharded from its first forward to
        # its last backward (torchtitan reshard_after_forward = not pp_enabled) and grads reduce once per step.
        # With full AC the backward's gather serves the recompute too (FSDP2 regathers once per backward).
        per_step = 1 if pp > 1 else m
        terms: list[tuple[str, float, float, int, float]] = []  # (op, time/call, wire bytes/call, calls, message)
        k = 1
        for params, n_ranks in ((dense, shard), (expert, expert_shard)):
            if params <= 0 or n_ranks <= 1:
                continue
            # Each collective runs as k NCCL calls, each paying its own base latency and ring steps (alpha): ZeRO-3
            # (FSDP2) one per block, ZeRO 0-2 one per gradient bucket of max(40M, 1M x DP) parameters (Megatron
            # DistributedDataParallel's default bucket_size).
            k = layers if setup.zero == 3 else max(1, math.ceil(params / max(40e6, 1e6 * n_ranks)))

            def pieces(fn: Any, size: float, n_r: int = n_ranks, k: int = k) -> float:
                return k * fn(size / k, n_r, f)

            if setup.zero == 0:
                t1, algo = comm.all_reduce_time(params * g / k, n_ranks, f)
                t = k * t1
                terms.append(
                    (f"grad all-reduce ({algo})", t, comm.ring_all_reduce_bytes(params * g, n_ranks), 1, params * g)
                )
            elif setup.zero in (1, 2):
                terms.append(
                    (
                        "grad reduce-scatter",
                        pieces(comm.reduce_scatter_time, params * g),
                        comm.reduce_scatter_bytes(params * g, n_ranks),
                        1,
                        params * g,
                    )
                )
                terms.append(
                    (
                        "param all-gather",
                        pieces(comm.all_gather_time, params * 2),
                        comm.all_gather_bytes(params * 2, n_ranks),
                        1,
                        params * 2,
                    )
                )
            else:
                terms.append(
                    (
                        "param all-gather",
                        pieces(comm.all_gather_time, params * 2),
                        comm.all_gather_bytes(params * 2, n_ranks),
                        per_step,
                        params * 2,
                    )
                )
                if pp == 1:
                    terms.append(
                        (
                            "param all-gather (bwd)",
                            pieces(comm.all_gather_time, params * 2),
                            comm.all_gather_bytes(params * 2, n_ranks),
                            m,
                            params * 2,
                        )
                    )
                terms.append(
                    (
                        "grad reduce-scatter",
                        pieces(comm.reduce_scatter_time, params * g),
                        comm.reduce_scatter_bytes(params * g, n_ranks),
                        per_step,
                        params * g,
                    )
                )
        total = sum(t * n for _, t, _, n, _ in terms)
        # Overlap windows: ZeRO-3 - the whole forward+backward; ZeRO 0-2 - grads reduce during the last micro-batch's
        # backward (2/3 of its compute), params gather during the first micro-batch's forward (1/3; Megatron
        # --overlap-param-gather, DDP buckets).
        # ZeRO 0-2 keep the two windows apart (the reduce-scatter has to finish before the optimizer step, the
        # all-gather starts after it); each collective runs in pieces (blocks / buckets), and the piece launched
        # after the last backward block (the last reduce-scatter) and the one the first forward block waits for (the
        # first all-gather) stay exposed.
        if setup.zero == 3:
            exposed_total = max(0.0, total - compute)
            if terms:  # the first block's gather and the last block's reduce-scatter stay exposed
                exposed_total += (terms[0][1] + terms[-1][1]) / max(1, layers)
        else:  # k: the buckets of the last parameter group priced (dense, or experts when present)
            t_rs = sum(t * n for op, t, _, n, _ in terms if "gather" not in op)  # reduce-scatter / all-reduce
            t_ag = total - t_rs
            last = 1.0 / max(1, k)
            exposed_total = max(t_rs - compute / m * 2 / 3, t_rs * last) + max(t_ag - compute / m / 3, t_ag * last)
        for op, t, wire, n, msg in terms:
            share = (t * n / total) if total else 0.0
            pred.comm.append(
                CommTerm(
                    "dp",
                    op,
                    f.name,
                    n,
                    msg,
                    wire * n,
                    t * n,
                    exposed_total * share,
                    f"ZeRO-{setup.zero} over {shard} ranks, overlapped with "
                    f"{'forward+backward' if setup.zero == 3 else 'the first forward / last backward'}",
                    _contention(profile, f),
                )
            )
        pred.overlap_s += overlap_penalty(total - exposed_total, _contention(profile, f))
    return pred
