"""Training step time for one parallel layout: compute at an MFU, pipeline bubble, and exposed communication.

    step = compute + bubble + TP + PP + EP (exposed) + max(0, DP - overlap window) + max(0, CP - attention compute)

Rank order is Megatron's ``tp-cp-ep-dp-pp`` (TP innermost): a group stays on NVLink when its span (stride x size)
fits in a node, otherwise it runs at the inter-node NIC rate. Overlap assumptions (also in docs/cost_model.md):
- TP, EP and PP communication sit on the critical path (no async-TP, no all-to-all/compute overlap, p2p between
  dependent micro-batches);
- DP gradient sync (ZeRO 0-2) overlaps the backward of the last micro-batch (DDP buckets / FSDP prefetch), ZeRO-3's
  parameter all-gathers and gradient reduce-scatters overlap the whole forward+backward;
- CP's ring pass of K/V overlaps the attention compute of the same layer (ring attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from phase6.plan import comm
from phase6.plan.memory import GIB, ParallelLayout, TrainMemory, TrainSetup, stage_params, train_memory
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile


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

    @property
    def comm_exposed_s(self) -> float:
        return sum(c.exposed_s for c in self.comm)

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.bubble_s + self.comm_exposed_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    def mfu(self, peak_flops: float) -> float:
        """Model FLOPs utilisation (6N + 12LHQT, recompute not counted) of the predicted step."""
        return self.model_flops_per_step / (self.step_time_s * self.layout.gpus * peak_flops)

    def dominant(self) -> str:
        parts = {"compute": self.compute_s, "pipeline bubble": self.bubble_s}
        for c in self.comm:
            parts[f"{c.dim} {c.op}"] = parts.get(f"{c.dim} {c.op}", 0.0) + c.exposed_s
        return max(parts, key=lambda k: parts[k])

    def reason(self) -> str:
        step = self.step_time_s
        bits = [
            f"{'fits' if self.fits else 'does NOT fit'} at {self.memory.total / GIB:.1f}/{self.usable_gib:.0f} GiB "
            f"(ZeRO-{self.setup.zero}, AC {'full' if self.setup.activation_checkpointing else 'off'})",
            f"compute {100 * self.compute_s / step:.0f}% of step",
        ]
        if self.bubble_s:
            bits.append(
                f"{self.setup.pp_schedule} bubble {100 * self.bubble_s / step:.0f}% (m={self.num_microbatches})"
            )
        for c in self.comm:
            share = 100 * c.exposed_s / step
            hidden = " hidden" if c.exposed_s < 0.05 * c.time_s else ""
            bits.append(f"{c.dim} {c.op} on {c.fabric}{hidden} {share:.0f}%")
        return f"dominated by {self.dominant()}; " + ", ".join(bits)


def _group_fabric(profile: HardwareProfile, stride: int, size: int) -> comm.Fabric:
    return profile.fabric_for(stride * size)


def predict_train_step(
    model: ModelSpec,
    layout: ParallelLayout,
    setup: TrainSetup,
    profile: HardwareProfile,
    mfu: float,
    overhead_gib: float = 0.0,
) -> StepPrediction:
    """Predict one optimizer step of ``layout`` (all sizes per GPU unless named otherwise)."""
    dp, tp, pp, ep, cp = layout.dp, layout.tp, layout.pp, layout.ep, layout.cp
    m = setup.num_microbatches(layout)
    s_local, mb, h = setup.seq_len / cp, setup.micro_batch, model.hidden_size
    tokens_step = float(m * mb * dp * setup.seq_len)
    model_flops = model.flops_per_token(setup.seq_len) * tokens_step
    hw_flops = model_flops * (4 / 3 if setup.activation_checkpointing else 1.0)  # full AC reruns the forward (2N of 6N)
    compute = hw_flops / (layout.gpus * mfu * profile.peak_flops)
    bubble = compute * bubble_fraction(setup.pp_schedule, pp, m, setup.virtual_stages)
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
        bubble_s=bubble,
        mfu_assumed=mfu,
    )
    layers = math.ceil(model.num_layers / pp)
    act_bytes = mb * s_local * h * 2  # one micro-batch's hidden states in bf16
    fwd_passes = 2 if setup.activation_checkpointing else 1

    if tp > 1:  # 2 all-reduces per block forward + 2 backward (Megatron; with SP: AG + RS of the same volume)
        f = _group_fabric(profile, 1, tp)
        n = layers * m * (2 * fwd_passes + 2)
        t, algo = comm.all_reduce_time(act_bytes, tp, f)
        pred.comm.append(
            CommTerm(
                "tp",
                f"all-reduce ({algo})",
                f.name,
                n,
                act_bytes,
                n * comm.ring_all_reduce_bytes(act_bytes, tp),
                n * t,
                n * t,
                f"2/block fwd + 2 bwd{' + 2 recompute' if fwd_passes == 2 else ''}, not overlapped",
            )
        )
    if cp > 1:  # ring attention: cp-1 K/V chunk passes per layer forward; K/V + dK/dV backward
        f = _group_fabric(profile, tp, cp)
        kv_heads_local = max(1.0, model.num_kv_heads / tp)
        chunk = 2 * mb * s_local * kv_heads_local * model.head_dim * 2
        passes = (cp - 1) * (fwd_passes + 2)
        n = layers * m * passes
        t = n * comm.p2p_time(chunk, f)
        attn_flops = 12.0 * model.num_layers * model.num_heads * model.head_dim * setup.seq_len * tokens_step
        attn_compute = attn_flops / (layout.gpus * mfu * profile.peak_flops)
        pred.comm.append(
            CommTerm(
                "cp",
                "ring K/V pass",
                f.name,
                n,
                chunk,
                n * chunk,
                t,
                max(0.0, t - attn_compute),
                "overlaps the same layer's attention compute",
            )
        )
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
    if pp > 1:  # activation forward + its gradient backward, per micro-batch per stage boundary
        f = _group_fabric(profile, tp * cp * dp, pp)  # the slowest stage boundary is on the critical path
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
        terms: list[tuple[str, float, float, int, float]] = []  # (op, time/call, wire bytes/call, calls, message)
        for params, n_ranks in ((dense, shard), (expert, expert_shard)):
            if params <= 0 or n_ranks <= 1:
                continue
            if setup.zero == 0:
                t, algo = comm.all_reduce_time(params * g, n_ranks, f)
                terms.append(
                    (f"grad all-reduce ({algo})", t, comm.ring_all_reduce_bytes(params * g, n_ranks), 1, params * g)
                )
            elif setup.zero in (1, 2):
                terms.append(
                    (
                        "grad reduce-scatter",
                        comm.reduce_scatter_time(params * g, n_ranks, f),
                        comm.reduce_scatter_bytes(params * g, n_ranks),
                        1,
                        params * g,
                    )
                )
                terms.append(
                    (
                        "param all-gather",
                        comm.all_gather_time(params * 2, n_ranks, f),
                        comm.all_gather_bytes(params * 2, n_ranks),
                        1,
                        params * 2,
                    )
                )
            else:  # FSDP2 default: gather per micro-batch forward and backward, reduce-scatter every micro-batch
                terms.append(
                    (
                        "param all-gather",
                        comm.all_gather_time(params * 2, n_ranks, f) * fwd_passes,
                        comm.all_gather_bytes(params * 2, n_ranks) * fwd_passes,
                        m,
                        params * 2,
                    )
                )
                terms.append(
                    (
                        "param all-gather (bwd)",
                        comm.all_gather_time(params * 2, n_ranks, f),
                        comm.all_gather_bytes(params * 2, n_ranks),
                        m,
                        params * 2,
                    )
                )
                terms.append(
                    (
                        "grad reduce-scatter",
                        comm.reduce_scatter_time(params * g, n_ranks, f),
                        comm.reduce_scatter_bytes(params * g, n_ranks),
                        m,
                        params * g,
                    )
                )
        total = sum(t * n for _, t, _, n, _ in terms)
        # Overlap window: the last micro-batch's backward (2/3 of its compute) for ZeRO 0-2; everything for ZeRO-3.
        window = compute if setup.zero == 3 else compute / m * 2 / 3
        exposed_total = max(0.0, total - window)
        if setup.zero == 3:  # the first block's gather cannot hide behind anything
            exposed_total += terms[0][1] / max(1, layers) if terms else 0.0
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
                    f"{'forward+backward' if setup.zero == 3 else 'the last backward'}",
                )
            )
    return pred
