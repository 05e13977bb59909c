"""Enumerate the legal (dp, tp, pp, ep, cp) factorizations of a GPU count, keep those that fit, rank by time.

Legal means: dp·tp·pp·cp = GPUs; TP divides the attention heads and the KV heads divide TP or TP divides them;
PP <= layers; CP splits the sequence into 2·cp equal chunks (load-balanced ring attention); EP divides the experts
and dp·cp (EP is carved out of the data-parallel ranks; dense models have ep = 1). Serving uses cp = 1 and
ep in {1, tp} (experts spread over the TP group). Fixed sizes (plan.tp=4, ...) restrict the enumeration.
Candidates that do not fit in memory are never proposed; they are listed under ``rejected`` with the reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from phase6.config.plan import EfficiencyConfig, PlanConfig
from phase6.plan.memory import GIB, ParallelLayout, TrainSetup
from phase6.plan.model import ModelSpec
from phase6.plan.pretrain import mfu_prior
from phase6.plan.profile import HardwareProfile
from phase6.plan.serve import ServeCostModel
from phase6.plan.train import StepPrediction, predict_train_step


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_ok(model: ModelSpec, tp: int) -> bool:
    """TP shards whole heads: it divides the query heads, and the KV heads shard or replicate evenly."""
    kv = model.num_kv_heads
    return model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def layouts(
    model: ModelSpec, gpus: int, workload: str, fixed: dict[str, int | None], seq_len: int = 0
) -> list[ParallelLayout]:
    """Every legal layout for ``gpus`` honouring the fixed sizes; ValueError (one line) when there is none."""
    out: list[ParallelLayout] = []
    for tp, pp, cp in itertools.product(divisors(gpus), repeat=3):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if workload == "serve" and cp != 1:
            continue
        if not tp_ok(model, tp) or pp > model.num_layers:
            continue
        if cp > 1 and (seq_len % (2 * cp) or workload != "train"):
            continue
        if workload == "serve":
            eps = [1, tp] if (model.is_moe and tp > 1 and model.num_experts % tp == 0) else [1]
        else:
            eps = [e for e in divisors(dp * cp) if model.num_experts % e == 0] if model.is_moe else [1]
        for ep in eps:
            lay = ParallelLayout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp)
            if all(v is None or getattr(lay, k) == v for k, v in fixed.items()):
                out.append(lay)
    if not out:
        asked = ", ".join(f"{k}={v}" for k, v in fixed.items() if v is not None) or "no fixed sizes"
        raise ValueError(
            f"gpus: no legal layout of {gpus} GPUs for {model.name} with {asked} "
            f"(tp must divide {model.num_heads} heads, pp <= {model.num_layers} layers)"
        )
    return sorted(set(out), key=lambda x: (x.tp, x.pp, x.cp, x.ep, x.dp))


@dataclass
class Candidate:
    layout: ParallelLayout
    fits: bool
    memory_gib_per_gpu: float
    time_key: str
    time_value: float
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)
    detail: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.layout.as_dict(),
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "fits": self.fits,
            self.time_key: self.time_value,
            **self.extra,
            "reason": self.reason,
        }


@dataclass
class Recommendation:
    candidates: list[Candidate]
    """Fitting layouts, best first (at most top_k)."""
    rejected: list[Candidate]
    """Layouts that do not fit, least memory first (at most top_k)."""
    num_legal: int


# ---- training ------------------------------------------------------------------------------------------------------
def train_candidates(
    model: ModelSpec, lay: ParallelLayout, plan: PlanConfig, profile: HardwareProfile, mfu: float
) -> list[StepPrediction]:
    zeros = [plan.zero] if plan.zero is not None else [0, 1, 2, 3]
    acs = {"none": [False], "full": [True], "auto": [False, True]}[plan.activation_checkpointing]
    out = []
    for zero, ac in itertools.product(zeros, acs):
        setup = TrainSetup(
            seq_len=plan.seq_len,
            global_batch_tokens=plan.global_batch_tokens,
            micro_batch=plan.micro_batch,
            zero=zero,
            activation_checkpointing=ac,
            pp_schedule=plan.pp_schedule,
            virtual_stages=plan.virtual_stages,
            grad_reduce_bytes=plan.grad_reduce_bytes,
        )
        out.append(predict_train_step(model, lay, setup, profile, mfu, plan.efficiency.runtime_overhead_gib))
    return out


def recommend_train(model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> Recommendation:
    mfu = plan.efficiency.mfu or mfu_prior(model.num_params())[0]
    fixed = {k: getattr(plan, k) for k in ("dp", "tp", "pp", "ep", "cp")}
    legal = layouts(model, gpus, "train", fixed, plan.seq_len)
    fit: list[Candidate] = []
    nofit: list[Candidate] = []
    for lay in legal:
        preds = train_candidates(model, lay, plan, profile, mfu)
        ok = [p for p in preds if p.fits]
        # Best fitting variant by step time (ties: less memory); otherwise the variant needing least memory.
        best = (
            min(ok, key=lambda p: (p.step_time_s, p.memory.total)) if ok else min(preds, key=lambda p: p.memory.total)
        )
        cand = Candidate(
            lay,
            best.fits,
            best.memory.total / GIB,
            "step_time_s",
            best.step_time_s,
            best.reason(),
            {
                "tokens_per_s": best.tokens_per_s,
                "mfu_pct": 100 * best.mfu(profile.peak_flops),
                "zero": best.setup.zero,
                "activation_checkpointing": best.setup.activation_checkpointing,
                "num_microbatches": best.num_microbatches,
            },
            best,
        )
        (fit if best.fits else nofit).append(cand)
    fit.sort(key=lambda c: (c.time_value, c.memory_gib_per_gpu))
    nofit.sort(key=lambda c: c.memory_gib_per_gpu)
    return Recommendation(fit[: plan.top_k], nofit[: plan.top_k], len(legal))


# ---- serving -------------------------------------------------------------------------------------------------------
def rank_batch(plan: PlanConfig) -> int:
    """Per-replica batch at which serving layouts are ranked: the middle of plan.batch_sizes (16 by default)."""
    sizes = sorted(plan.batch_sizes)
    return sizes[len(sizes) // 2]


def recommend_serve(model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> Recommendation:
    fixed = {k: getattr(plan, k) for k in ("dp", "tp", "pp", "ep", "cp")}
    legal = layouts(model, gpus, "serve", fixed)
    batch = rank_batch(plan)
    fit: list[Candidate] = []
    nofit: list[Candidate] = []
    for lay in legal:
        m = ServeCostModel(
            model,
            profile,
            tp=lay.tp,
            pp=lay.pp,
            ep=lay.ep,
            efficiency=plan.efficiency,
            weight_bytes=plan.weight_bytes,
            kv_bytes=plan.kv_bytes,
        )
        mem = m.memory(plan.context_len)
        b = max(1, min(batch, mem.max_concurrent_seqs))
        decode = m.decode_step_s(b, plan.context_len)
        ar = m.allreduce_s(b)
        used = mem.total_bytes(b) / GIB
        fab = m.fabric.name
        if mem.fits:
            reason = (
                f"{mem.weights_bytes / GIB:.1f} GiB weights/GPU leave KV for {mem.max_concurrent_seqs} seqs x "
                f"{plan.context_len} tok; decode at batch {b}{' (KV-limited)' if b < batch else ''} = "
                f"{1e3 * decode:.2f} ms/token, "
                f"{'HBM-bound' if m.memory_s(b, b * plan.context_len) > m.compute_s(b, b * plan.context_len) else 'compute-bound'}"
                f"{f', TP all-reduces on {fab} {100 * ar / decode:.0f}%' if lay.tp > 1 else ''}"
                f"{f', PP adds {lay.pp - 1} hops, no latency gain' if lay.pp > 1 else ''}; "
                f"{lay.dp} replica(s) -> {lay.dp * b / decode:,.0f} tok/s, "
                f"prefill {plan.prompt_len} tok {1e3 * m.prefill_s(plan.prompt_len):.0f} ms"
            )
        else:
            reason = (
                f"does not fit: {mem.weights_bytes / GIB:.1f} GiB weights + {plan.efficiency.runtime_overhead_gib}"
                f" GiB overhead leave no room for one {plan.context_len}-token sequence in "
                f"{mem.usable_bytes / GIB:.1f} GiB usable"
            )
        cand = Candidate(
            lay,
            mem.fits,
            used,
            "decode_ms_per_token",
            1e3 * decode,
            reason,
            {
                "batch": b,
                "prefill_ms": 1e3 * m.prefill_s(plan.prompt_len),
                "max_concurrent_seqs": mem.max_concurrent_seqs,
                "tokens_per_s": lay.dp * b / decode,
                "allreduce_ms": 1e3 * ar,
            },
        )
        (fit if mem.fits else nofit).append(cand)
    fit.sort(key=lambda c: (c.time_value, -c.extra["tokens_per_s"]))
    nofit.sort(key=lambda c: c.memory_gib_per_gpu)
    return Recommendation(fit[: plan.top_k], nofit[: plan.top_k], len(legal))


def serve_table(
    model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile, efficiency: EfficiencyConfig | None = None
) -> list[dict[str, Any]]:
    """Rows of TP x batch: prefill / decode ms, all-reduce share, tok/s, memory; batches over KV capacity flagged."""
    rows = []
    for tp in plan.tp_sizes:
        if tp > gpus or not tp_ok(model, tp):
            continue
        m = ServeCostModel(
            model,
            profile,
            tp=tp,
            efficiency=efficiency or plan.efficiency,
            weight_bytes=plan.weight_bytes,
            kv_bytes=plan.kv_bytes,
        )
        mem = m.memory(plan.context_len)
        for b in plan.batch_sizes:
            d = m.decode_step_s(b, plan.context_len)
            ar = m.allreduce_s(b)
            rows.append(
                {
                    "tp": tp,
                    "batch": b,
                    "context": plan.context_len,
                    "weights_gib_per_gpu": mem.weights_bytes / GIB,
                    "max_concurrent_seqs": mem.max_concurrent_seqs,
                    "fits": mem.max_concurrent_seqs >= b,
                    "prefill_ms": 1e3 * m.prefill_s(plan.prompt_len, b),
                    "decode_ms": 1e3 * d,
                    "allreduce_ms": 1e3 * ar,
                    "allreduce_pct": 100 * ar / d,
                    "bound": "compute"
                    if m.compute_s(b, b * plan.context_len) > m.memory_s(b, b * plan.context_len)
                    else "memory",
                    "tokens_per_s": b / d,
                }
            )
    return rows
