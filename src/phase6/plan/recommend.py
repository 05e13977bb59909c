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
from phase6.plan.memory import GIB, ParallelLayout, TrainSetup, microbatch_count
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile
from phase6.plan.serve import ServeCostModel
from phase6.plan.train import StepPrediction, predict_train_step

# Layouts whose predicted step times are within this fraction of the fastest are ties, and the simpler one wins
# (fewer model-parallel dimensions, then smaller PP, then fewer model-parallel ranks): the model's own error on
# published runs (plan validate, docs/cost_model.md §8) is larger than such gaps, and the simpler layout is cheaper to
# run and debug. Published layouts sat 2-8% behind the old top pick (issue 21).
TIE_TOLERANCE = 0.05


def simplicity(lay: ParallelLayout) -> tuple[int, int, int]:
    """Sort key: (model-parallel dims in use, PP, model-parallel ranks); smaller is simpler."""
    dims = sum(1 for v in (lay.tp, lay.pp, lay.cp, lay.ep) if v > 1)
    return dims, lay.pp, lay.tp * lay.pp * lay.cp * lay.ep


def order_layouts(items: list[Any], time_of: Any, layout_of: Any, tol: float = TIE_TOLERANCE) -> list[Any]:
    """Fastest first, except that everything within ``tol`` of the fastest is ordered simplest first."""
    if not items:
        return []
    fastest = min(time_of(x) for x in items)
    ties = [x for x in items if time_of(x) <= fastest * (1 + tol)]
    rest = [x for x in items if time_of(x) > fastest * (1 + tol)]
    ties.sort(key=lambda x: (*simplicity(layout_of(x)), time_of(x)))
    rest.sort(key=time_of)
    return ties + rest


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_ok(model: ModelSpec, tp: int) -> bool:
    """TP shards whole heads: it divides the query heads, and the KV heads shard or replicate evenly."""
    kv = model.num_kv_heads
    return model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def layouts(
    model: ModelSpec,
    gpus: int,
    workload: str,
    fixed: dict[str, int | None],
    seq_len: int = 0,
    gpus_per_node: int | None = None,
) -> list[ParallelLayout]:
    """Every legal layout for ``gpus`` honouring the fixed sizes; ValueError (one line) when there is none.

    With ``gpus_per_node``, an enumerated TP stays inside a node (Narayanan et al. 2021 takeaway 1: tensor parallelism
    up to the GPUs of a server, pipeline parallelism across servers); a TP you fix yourself is taken as given.
    """
    if workload == "serve" and (fixed.get("cp") or 1) > 1:
        raise ValueError(
            f"plan.cp: context parallelism is a training layout; serving splits a model with tp/pp only "
            f"(got cp={fixed['cp']} with workload=serve)"
        )
    out: list[ParallelLayout] = []
    for tp, pp, cp in itertools.product(divisors(gpus), repeat=3):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if workload == "serve" and cp != 1:
            continue
        if not tp_ok(model, tp) or pp > model.num_layers:
            continue
        if gpus_per_node and tp > gpus_per_node and fixed.get("tp") is None:
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
        why = [f"tp must divide the {model.num_heads} attention heads (and {model.num_kv_heads} KV heads)"]
        why.append(f"pp <= {model.num_layers} layers")
        if (fixed.get("cp") or 1) > 1:
            why.append(f"cp must split seq_len {seq_len} into 2*cp equal chunks")
        if model.is_moe and fixed.get("ep"):
            why.append(f"ep must divide the {model.num_experts} experts and dp*cp")
        raise ValueError(f"gpus: no legal layout of {gpus} GPUs for {model.name} with {asked} ({'; '.join(why)})")
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
# Pipeline schedules `plan.pp_schedule=auto` (the default) tries for every layout with PP > 1: 1F1B, interleaved 1F1B
# with 2, 4 and 8 model chunks per rank (Narayanan et al. 2021; Megatron --num-layers-per-virtual-pipeline-stage,
# torchtitan Interleaved1F1B), and ZB-H1 (Qi et al. 2023, torchtitan ZBVZeroBubble's ancestor), whose bubble
# (p-1)/(3m) the planner models. GPipe is never faster than 1F1B at more memory, so it is only used when asked for.
SEARCHED_SCHEDULES: tuple[tuple[str, int], ...] = (
    ("1f1b", 1),
    ("interleaved", 2),
    ("interleaved", 4),
    ("interleaved", 8),
    ("zero_bubble", 1),
)


def micro_batches(plan: PlanConfig, lay: ParallelLayout) -> list[int]:
    """Micro-batch sizes to try for ``lay`` (ascending): ``plan.micro_batch_size`` when set; when None every power
    of two that divides the replica's sequences per step, and that whole share (one micro-batch per step). A share
    that is not a whole number of sequences keeps one sequence per micro-batch."""
    if plan.micro_batch_size is not None:
        return [plan.micro_batch_size]
    seqs = plan.global_batch_tokens // plan.seq_len
    if seqs % lay.dp:
        return [1]
    share = seqs // lay.dp
    return sorted({b for b in (2**i for i in range(share.bit_length())) if share % b == 0} | {share})


def schedules(model: ModelSpec, lay: ParallelLayout, plan: PlanConfig, mb: int | None = None) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try for ``lay``: the configured one, or with ``auto`` every searched schedule
    that is legal here: interleaving needs at least one layer per model chunk (layers >= pp * v) and a micro-batch
    count that is a multiple of pp (Megatron's condition), computed for ``plan``'s batch at micro-batch ``mb``
    (default: ``plan.micro_batch_size``, or 1 when that is searched)."""
    if lay.pp == 1:
        return [("1f1b", 1)]
    if plan.pp_schedule != "auto":
        return [(plan.pp_schedule, plan.virtual_stages)]
    m = microbatch_count(plan.global_batch_tokens, plan.seq_len, lay.dp, mb or plan.micro_batch_size or 1)
    out = []
    for name, v in SEARCHED_SCHEDULES:
        if name == "interleaved" and (model.num_layers < lay.pp * v or m % lay.pp):
            continue
        out.append((name, v))
    return out


def schedule_label(setup: TrainSetup, pp: int) -> str:
    """The schedule a candidate was ranked with: "-" without PP, "interleaved v=4", "1f1b", ..."""
    if pp == 1:
        return "-"
    return f"interleaved v={setup.virtual_stages}" if setup.pp_schedule == "interleaved" else setup.pp_schedule


def train_setup(
    plan: PlanConfig, zero: int, ac: str, pp_schedule: str, virtual_stages: int, mb: int | None = None
) -> TrainSetup:
    """One candidate's TrainSetup: the plan's batch, precision and framework setup with this ZeRO stage,
    recompute (``none`` / ``selective`` / ``full``), pipeline schedule and micro-batch ``mb`` (default: the plan's;
    practice.py builds the practice layout's through it too)."""
    mb = mb if mb is not None else plan.micro_batch_size
    if mb is None:
        raise ValueError("train_setup: plan.micro_batch_size is searched (None): pass the candidate's mb")
    return TrainSetup(
        seq_len=plan.seq_len,
        global_batch_tokens=plan.global_batch_tokens,
        micro_batch_size=mb,
        zero=zero,
        activation_checkpointing=ac == "full",
        selective_ac=ac == "selective",
        pp_schedule=pp_schedule,
        virtual_stages=virtual_stages,
        grad_reduce_bytes=plan.grad_reduce_bytes,
        fp8=plan.fp8,
        fused_elementwise=plan.fused_elementwise,
        tp_comm_overlap=plan.tp_comm_overlap,
        activation_layout=plan.activation_layout,
        cp_ring=plan.cp_ring,
        repeat_kv=plan.repeat_kv,
        fp32_grad_accumulation=plan.fp32_grad_accumulation,
        optimizer=plan.optimizer,
    )


def train_candidates(
    model: ModelSpec, lay: ParallelLayout, plan: PlanConfig, profile: HardwareProfile, mfu: float
) -> list[StepPrediction]:
    zeros = [plan.zero] if plan.zero is not None else ([0] if plan.optimizer == "muon" else [0, 1, 2, 3])
    acs = {
        "none": ["none"],
        "selective": ["selective"],
        "full": ["full"],
        "auto": ["none", "selective", "full"],
    }[plan.activation_checkpointing]
    out = []
    for mb in micro_batches(plan, lay):
        for zero, ac, (sched, v) in itertools.product(zeros, acs, schedules(model, lay, plan, mb)):
            setup = train_setup(plan, zero, ac, sched, v if sched == "interleaved" else plan.virtual_stages, mb)
            out.append(predict_train_step(model, lay, setup, profile, mfu, plan.efficiency.runtime_overhead_gib))
    return out


def recommend_train(model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> Recommendation:
    mfu = plan.efficiency.mfu  # None: kernel-level compute model (phase6.plan.train.compute_breakdown)
    fixed = {k: getattr(plan, k) for k in ("dp", "tp", "pp", "ep", "cp")}
    if plan.optimizer == "muon":  # whole matrices on every GPU (config/plan.py refuses an explicit tp/ep > 1)
        fixed = {**fixed, "tp": 1, "ep": 1}
    legal = layouts(model, gpus, "train", fixed, plan.seq_len, profile.gpus_per_node)
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
                "activation_checkpointing": best.setup.ac_mode,
                "pp_schedule": schedule_label(best.setup, lay.pp),
                "micro_batch_size": best.setup.micro_batch_size,
                "num_microbatches": best.num_microbatches,
            },
            best,
        )
        (fit if best.fits else nofit).append(cand)
    fit = order_layouts(fit, lambda c: c.time_value, lambda c: c.layout)
    if fit:
        fastest = min(c.time_value for c in fit)
        for c in fit:
            gap = c.time_value / fastest - 1
            if gap <= TIE_TOLERANCE:
                c.extra["tie"] = True
                c.reason += (
                    f"; within {100 * TIE_TOLERANCE:.0f}% of the fastest ({100 * gap:+.1f}%): a tie, simpler layouts "
                    "first"
                )
    nofit.sort(key=lambda c: c.memory_gib_per_gpu)
    return Recommendation(fit[: plan.top_k], nofit[: plan.top_k], len(legal))


# ---- serving -------------------------------------------------------------------------------------------------------
def rank_batch(plan: PlanConfig) -> int:
    """Per-replica batch at which serving layouts are ranked: the middle of plan.batch_sizes (16 by default)."""
    sizes = sorted(plan.batch_sizes)
    return sizes[len(sizes) // 2]


def serve_context(plan: PlanConfig, model: ModelSpec) -> int:
    """plan.context_len, or min(8192, max_position_embeddings) when it is left null."""
    return plan.context_len or min(8192, model.max_position_embeddings)


def recommend_serve(model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> Recommendation:
    fixed = {k: getattr(plan, k) for k in ("dp", "tp", "pp", "ep", "cp")}
    legal = layouts(model, gpus, "serve", fixed, 0, profile.gpus_per_node)
    batch = rank_batch(plan)
    ctx = serve_context(plan, model)
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
        mem = m.memory(ctx)
        b = max(1, min(batch, mem.max_concurrent_seqs))
        decode = m.decode_step_s(b, ctx)
        ar = m.allreduce_s(b)
        used = mem.total_bytes(b) / GIB
        fab = m.fabric.name
        if mem.fits:
            reason = (
                f"{mem.weights_bytes / GIB:.1f} GiB weights/GPU leave KV for {mem.max_concurrent_seqs} seqs x "
                f"{ctx} tok; decode at batch {b}{' (KV-limited)' if b < batch else ''} = "
                f"{1e3 * decode:.2f} ms/token, "
                f"{'HBM-bound' if m.memory_s(b, b * ctx) > m.compute_s(b, b * ctx) else 'compute-bound'}"
                f"{f', TP all-reduces on {fab} {100 * ar / decode:.0f}%' if lay.tp > 1 else ''}"
                f"{f', PP adds {lay.pp - 1} hops, no latency gain' if lay.pp > 1 else ''}; "
                f"{lay.dp} replica(s) -> {lay.dp * b / decode:,.0f} tok/s, "
                f"prefill {plan.prompt_len} tok {1e3 * m.prefill_s(plan.prompt_len):.0f} ms"
            )
        else:
            reason = (
                f"does not fit: {mem.weights_bytes / GIB:.1f} GiB weights + {mem.overhead_bytes / GIB:.1f}"
                f" GiB overhead leave no room for one {ctx}-token sequence in "
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
    ctx = serve_context(plan, model)
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
        mem = m.memory(ctx)
        for b in plan.batch_sizes:
            d = m.decode_step_s(b, ctx)
            ar = m.allreduce_s(b)
            rows.append(
                {
                    "tp": tp,
                    "batch": b,
                    "context": ctx,
                    "weights_gib_per_gpu": mem.weights_bytes / GIB,
                    "max_concurrent_seqs": mem.max_concurrent_seqs,
                    "fits": mem.max_concurrent_seqs >= b,
                    "prefill_ms": 1e3 * m.prefill_s(plan.prompt_len, b),
                    "decode_ms": 1e3 * d,
                    "allreduce_ms": 1e3 * ar,
                    "allreduce_pct": 100 * ar / d,
                    "bound": "compute" if m.compute_s(b, b * ctx) > m.memory_s(b, b * ctx) else "memory",
                    "tokens_per_s": b / d,
                }
            )
    return rows
