"""The layout practice would run, beside the planner's #1, and how far the term that separates them was validated.

Practice (what the published runs in plan/published_runs.yaml do, Narayanan et al. 2021's takeaways):
- the recompute the published runs use: below 2B parameters none (llm.c GPT-2), below 30B selective op-level AC
  (torchtitan Llama-3.1-8B), from 30B full AC (torchtitan Llama-3.1-70B/405B); the next heavier mode when that does not
  fit;
- ZeRO-3 / FSDP over the data-parallel ranks (torchtitan's default);
- TP within the node: none while the model fits without it, the node's size from 30B parameters (torchtitan 70B/405B,
  Megatron GPT >= 32B use TP 8), else the smallest power of two that fits;
- PP across nodes only when the model does not fit with TP = the node (interleaved, 2 chunks per rank, torchtitan's
  default, when legal);
- CP only when the sequence demands it: when nothing above fits;
- DP outermost: whatever GPUs are left.
``compare`` names the step-time term (or memory) that separates the #1 from that layout and its validation status:
measured on a GPU / fitted on published runs / datasheet only. A pick resting on a datasheet-only term says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phase6.config.plan import PlanConfig
from phase6.plan.memory import GIB, ParallelLayout, TrainSetup, memory_calibration, microbatch_count
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile
from phase6.plan.recommend import TIE_TOLERANCE, micro_batches, tp_ok, train_setup
from phase6.plan.train import StepPrediction, predict_train_step

MEASURED, FITTED, DATASHEET = "measured on a GPU", "fitted on published runs", "datasheet only"

# term -> (status, what backs it). Only terms with a comparison against a measurement are "measured"/"fitted".
TERM_STATUS: dict[str, tuple[str, str]] = {
    "GEMM": (
        MEASURED,
        "sustained GEMM rate: this repo's H200 6A profile (717-738 TF vs 700 used); call overhead XLA's H100 table",
    ),
    "attention": (
        MEASURED,
        "flash-attention rate: one H200 point (T=1024, 253 TF) in this repo's 6A profile; the curve over lengths from the kernels' published benchmarks",
    ),
    "ring attention (CP)": (
        MEASURED,
        "ring steps at a measured fraction of the unsplit kernel's rate by half-chunk length (0.71 at 512 tokens, "
        "0.90 at 1K, 0.95 at 2K, 0.935 at 16K): torch's ring on one H200 (fake process group) against TP of the same "
        "degree, flash-kernel time 1.02-1.36x at 8K-256K, CP 2/4/8",
    ),
    "memory-bound kernels": (MEASURED, "HBM_EFFICIENCY 0.77 from this repo's H200 6A profile"),
    "loss": (MEASURED, "fused cross-entropy bytes matched this repo's H200 6A profile (34.1 vs 32 ms)"),
    "CP output merges": (DATASHEET, "bytes counted from torch's ring-attention merge at the HBM rate; never measured"),
    "TP layout copies": (
        DATASHEET,
        "chunk+cat bytes counted from torch's functional collectives (batch-first layouts) at the measured HBM rate; "
        "never timed",
    ),
    "gradient buffers": (
        DATASHEET,
        "fp32 main-grad read/write and the embedding's dense gradient, bytes counted at the measured HBM rate; never "
        "timed",
    ),
    "optimizer step": (
        MEASURED,
        "AdamW bytes at the measured HBM efficiency; Muon's Newton-Schulz rate measured on one H200",
    ),
    "pipeline bubble": (
        FITTED,
        "schedule formulas (Narayanan 2021, Qi 2023) checked on torchtitan 405B 1F1B vs interleaved: published 1.28x, predicted 1.30x",
    ),
    "tp communication": (
        DATASHEET,
        "NVLink NCCL busbw (nccl-tests), FP8 all-gather bytes read from torchao's Float8 TP code; exposure checked "
        "only indirectly on AsyncTP-vs-vanilla published rows",
    ),
    "cp communication": (DATASHEET, "NVLink/NIC busbw; ring pass overlap assumed"),
    "pp communication": (DATASHEET, "NIC line rate x NCCL fraction"),
    "ep communication": (DATASHEET, "all-to-all at NIC/NVLink busbw"),
    "dp communication": (
        DATASHEET,
        "NIC busbw; overlap windows as Megatron/FSDP2 document them; never measured across nodes here",
    ),
    "overlap slowdown": (DATASHEET, "18.9% compute slowdown measured by arXiv 2507.03114 on other clusters, not here"),
    "decode HBM reads": (
        MEASURED,
        "decode_hbm_efficiency 0.7 vs this repo's H200 vLLM decode (27.5 GiB at 3.39 TB/s = 0.71 of HBM, "
        "docs/benchmarks.md 6B)",
    ),
    "decode compute": (DATASHEET, "prefill_mfu 0.5 of the bf16 peak"),
    "serving TP all-reduce": (DATASHEET, "NVLink latency + busbw (nccl-tests), never timed at decode sizes here"),
}


def memory_status() -> tuple[str, str]:
    cal = memory_calibration()
    if cal:
        acts = ", ".join(f"{k} x{v}" for k, v in cal["activations"].items())
        return MEASURED, (
            f"{cal.get('cases', '?')} per-GPU shard cases, {cal['source']}: activations {acts}, ZeRO-3 buffers "
            f"x{cal['zero3_transient']}, allocator reserve {cal['reserve_fraction']} x the step's dynamic bytes; not "
            "measured: NCCL buffers, the optimizer step, the PP stage's resident copy, fragmentation over many steps"
        )
    return DATASHEET, (
        "formula only (ZeRO bytes, Korthikanti activations): never measured on a GPU until "
        "scripts/repro/h200_plan_memory.py's table is fitted (scripts/repro/plan_memory_fit.py)"
    )


def terms(p: StepPrediction) -> dict[str, float]:
    """Seconds per step of each term of ``p`` (the parts of ``step_time_s``)."""
    out: dict[str, float] = {}
    b = p.breakdown
    if b is not None:
        out["GEMM"] = b.gemm_s
        out["ring attention (CP)" if p.layout.cp > 1 else "attention"] = b.attention_s
        out["memory-bound kernels"] = b.elementwise_s
        out["loss"] = b.loss_s
        out["CP output merges"] = b.cp_merge_s
        out["TP layout copies"] = b.tp_copy_s
        out["gradient buffers"] = b.main_grad_s
    else:
        out["GEMM"] = p.compute_s
    out["optimizer step"] = p.optimizer_s
    out["pipeline bubble"] = p.bubble_s
    for c in p.comm:
        key = f"{c.dim} communication"
        out[key] = out.get(key, 0.0) + c.exposed_s
    out["overlap slowdown"] = p.overlap_s
    return out


def _setup(plan: PlanConfig, ac: str, pp: int, model: ModelSpec, lay: ParallelLayout, mb: int) -> TrainSetup:
    m = microbatch_count(plan.global_batch_tokens, plan.seq_len, lay.dp, mb)
    interleave = pp > 1 and model.num_layers >= 2 * pp and m % pp == 0
    zero = 0 if plan.optimizer == "muon" else (plan.zero if plan.zero is not None else 3)
    return train_setup(plan, zero, ac, "interleaved" if interleave else "1f1b", 2, mb)


def practice_micro_batches(plan: PlanConfig, lay: ParallelLayout) -> list[int]:
    """The practice micro-batches to try, largest first: the plan's when set; searched, the replica's whole share in
    one micro-batch down to one sequence (torchtitan runs its local batch as one micro-batch and accumulates only when
    memory demands it), keeping at least PP micro-batches under a pipeline (torchtitan's n_microbatches = PP)."""
    sizes = micro_batches(plan, lay)
    if plan.micro_batch_size is None and lay.pp > 1:
        sizes = [b for b in sizes if microbatch_count(plan.global_batch_tokens, plan.seq_len, lay.dp, b) >= lay.pp]
        sizes = sizes or [1]
    return sorted(sizes, reverse=True)


def practice_ac(model: ModelSpec) -> list[str]:
    n = model.num_params()
    if n < 2e9:
        return ["none", "selective", "full"]
    if n < 30e9:
        return ["selective", "full"]
    return ["full"]


def practice_layout(
    model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile
) -> tuple[StepPrediction | None, str]:
    """The practice layout's prediction (None when even that does not fit) and the rule that chose it."""
    node = profile.gpus_per_node or 8
    tps = [t for t in (1, 2, 4, 8, 16) if t <= min(node, gpus) and tp_ok(model, t)]
    if model.num_params() >= 30e9 and gpus >= node and node in tps:
        tps = [node]
    if plan.optimizer == "muon":  # whole matrices on every GPU (config/plan.py)
        tps = [1]
    pps = [1] + [p for p in (2, 4, 8, 16, 32, 64) if p <= model.num_layers]
    cps = [1, 2, 4, 8, 16, 32]
    tried = None
    for cp in cps:
        for pp in pps:
            for tp in tps:
                if pp > 1 and tp != tps[-1]:
                    continue  # PP only once TP fills the node
                if gpus % (tp * pp * cp) or (cp > 1 and plan.seq_len % (2 * cp)):
                    continue
                lay = ParallelLayout(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp)
                for ac, mb in ((a, b) for a in practice_ac(model) for b in practice_micro_batches(plan, lay)):
                    p = predict_train_step(
                        model,
                        lay,
                        _setup(plan, ac, pp, model, lay, mb),
                        profile,
                        plan.efficiency.mfu,
                        plan.efficiency.runtime_overhead_gib,
                    )
                    tried = p if tried is None or p.memory.total < tried.memory.total else tried
                    if p.fits:
                        ladder = practice_ac(model)
                        size = "<2B" if model.num_params() < 2e9 else "<30B" if model.num_params() < 30e9 else ">=30B"
                        acwhy = f"{size}: {ladder[0]} in the published runs" + (
                            f"; {ladder[0]} does not fit here" if ac != ladder[0] else ""
                        )
                        why = (
                            f"AC {ac} ({acwhy}), ZeRO-{p.setup.zero}, TP {tp} "
                            f"{'= the node (>=30B)' if tp == node and size == '>=30B' else 'within the node'}, "
                            f"PP {pp}{' across nodes, ' + p.setup.pp_schedule if pp > 1 else ''}, CP {cp}"
                            f"{' (the sequence demands it: nothing without CP fits)' if cp > 1 else ''}, "
                            f"DP {lay.dp} outermost"
                            + (
                                f", micro-batch {mb} x {p.num_microbatches} (the replica's batch in as few "
                                "micro-batches as fit)"
                                if plan.micro_batch_size is None
                                else ""
                            )
                        )
                        return p, why
    return None, "nothing in the practice ladder fits" + (
        f" (closest {tried.layout} at {tried.memory.total / GIB:.1f} GiB)" if tried else ""
    )


@dataclass
class Comparison:
    practice: StepPrediction | None
    rule: str
    same: bool
    gap: float
    """practice step / #1 step - 1."""
    term: str
    delta_s: float
    status: str
    backing: str
    memory_note: str = ""

    def lines(self, top: StepPrediction) -> list[str]:
        out = ["## Practice layout beside the #1", f"practice rule: {self.rule}"]
        if self.practice is None:
            out.append("no practice layout fits; the #1 is the only way the planner sees")
            return out
        p = self.practice
        sched = lambda q: (  # noqa: E731
            ""
            if q.layout.pp == 1
            else f", {q.setup.pp_schedule}{' v=' + str(q.setup.virtual_stages) if q.setup.pp_schedule == 'interleaved' else ''}"
        )
        out.append(
            f"practice: {p.layout} (AC {p.setup.ac_mode}, ZeRO-{p.setup.zero}{sched(p)}): {p.step_time_s:.3f} s/step, "
            f"{p.memory.total / GIB:.1f} GiB/GPU, {'fits' if p.fits else 'does NOT fit'}"
        )
        out.append(
            f"#1:       {top.layout} (AC {top.setup.ac_mode}, ZeRO-{top.setup.zero}{sched(top)}): "
            f"{top.step_time_s:.3f} s/step, {top.memory.total / GIB:.1f} GiB/GPU"
        )
        if self.same:
            tt = terms(top)
            big = max(tt, key=lambda k: tt[k])
            st, back = TERM_STATUS.get(big, (DATASHEET, "not listed"))
            out.append(
                f"the #1 is the practice layout; its largest term: {big} ({1e3 * tt[big]:,.0f} ms/step), "
                f"validation: {st} ({back})"
            )
        elif self.gap <= TIE_TOLERANCE:
            out.append(
                f"practice is within the {100 * TIE_TOLERANCE:.0f}% tie tolerance ({100 * self.gap:+.1f}%): either is "
                "defensible; the model cannot separate them; the term that differs most: "
                f"{self.term} ({1e3 * self.delta_s:+,.0f} ms/step in the #1's favour), validation: {self.status} "
                f"({self.backing})"
            )
        else:
            out.append(
                f"the #1 is {100 * self.gap:.1f}% faster; deciding term: {self.term} ({1e3 * self.delta_s:+,.0f} ms/step "
                f"in the #1's favour), validation: {self.status} ({self.backing})"
            )
        if not self.same and self.gap > TIE_TOLERANCE and self.status == DATASHEET:
            out.append(
                f"WARNING: this pick rests on {self.term}, a term never validated against a measurement; run the "
                "practice layout unless you can measure it"
            )
        if self.memory_note:
            out.append(self.memory_note)
        return out


def compare(top: StepPrediction, model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> Comparison:
    prac, rule = practice_layout(model, gpus, plan, profile)
    if prac is None:
        st, back = memory_status()
        return Comparison(None, rule, False, 0.0, "memory", 0.0, st, back)
    same = prac.layout == top.layout and prac.setup.ac_mode == top.setup.ac_mode
    gap = prac.step_time_s / top.step_time_s - 1
    tp_, tt = terms(prac), terms(top)
    deltas = {k: tp_.get(k, 0.0) - tt.get(k, 0.0) for k in set(tp_) | set(tt)}
    # a CP layout on one side: its attention is the ring's
    if "ring attention (CP)" in deltas and "attention" in deltas:
        deltas["ring attention (CP)"] += deltas.pop("attention")
    term = max(deltas, key=lambda k: deltas[k])
    st, back = TERM_STATUS.get(term, (DATASHEET, "not listed"))
    c = Comparison(prac, rule, same, gap, term, deltas[term], st, back)
    if gap > TIE_TOLERANCE and top.memory.total > 0.9 * top.usable_gib * GIB:
        mst, mback = memory_status()  # a pick at the memory edge also rests on the memory formula
        c.memory_note = (
            f"the #1 uses {top.memory.total / GIB:.1f} of {top.usable_gib:.0f} GiB: its fit is {mst} ({mback})"
        )
    return c


def summary(c: Comparison) -> dict[str, Any]:
    return {
        "practice_layout": str(c.practice.layout) if c.practice else None,
        "practice_rule": c.rule,
        "practice_step_time_s": c.practice.step_time_s if c.practice else None,
        "top_faster_by_pct": 100 * c.gap,
        "deciding_term": c.term,
        "deciding_term_status": c.status,
        "deciding_term_backing": c.backing,
    }


def serve_lines(rec: Any, model: ModelSpec, gpus: int, plan: PlanConfig, profile: HardwareProfile) -> list[str]:
    """Serving: the practice layout (the smallest TP within a node that holds the weights and the ranking batch's KV,
    replicas outermost; vLLM's usual deployment) beside the #1 (ranked by decode latency), and the deciding term."""
    from phase6.plan.recommend import rank_batch, serve_context
    from phase6.plan.serve import ServeCostModel

    top = rec.candidates[0]
    node = profile.gpus_per_node or 8
    batch, ctx = rank_batch(plan), serve_context(plan, model)
    out = [
        "## Practice layout beside the #1",
        "practice rule: the smallest TP within the node whose KV cache holds the "
        f"ranking batch ({batch} x {ctx} tokens), PP only across nodes, replicas (DP) outermost",
    ]

    def cost(tp: int, pp: int) -> tuple[float, float, float, float] | None:
        m = ServeCostModel(
            model,
            profile,
            tp=tp,
            pp=pp,
            efficiency=plan.efficiency,
            weight_bytes=plan.weight_bytes,
            kv_bytes=plan.kv_bytes,
        )
        mem = m.memory(ctx)
        if mem.max_concurrent_seqs < 1:
            return None
        b = max(1, min(batch, mem.max_concurrent_seqs))
        return m.decode_step_s(b, ctx), m.memory_s(b, b * ctx), m.compute_s(b, b * ctx), m.allreduce_s(b)

    prac = None
    for pp in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8, 16):
            if tp > node or gpus % (tp * pp) or not tp_ok(model, tp) or (pp > 1 and tp != node):
                continue
            c = cost(tp, pp)
            if c is not None and c[1] > 0:
                m = ServeCostModel(
                    model,
                    profile,
                    tp=tp,
                    pp=pp,
                    efficiency=plan.efficiency,
                    weight_bytes=plan.weight_bytes,
                    kv_bytes=plan.kv_bytes,
                )
                if m.memory(ctx).max_concurrent_seqs >= batch or tp == node:
                    prac = (ParallelLayout(dp=gpus // (tp * pp), tp=tp, pp=pp), c)
                    break
        if prac:
            break
    if prac is None:
        out.append("no practice layout holds one sequence; the #1 is the only way the planner sees")
        return out
    lay, (dec, mem_s, comp_s, ar) = prac
    tcost = cost(top.layout.tp, top.layout.pp)
    out.append(f"practice: {lay}: decode {1e3 * dec:.2f} ms/token")
    out.append(f"#1:       {top.layout}: decode {top.time_value:.2f} ms/token")
    if lay.tp == top.layout.tp and lay.pp == top.layout.pp:
        parts = {"decode HBM reads": mem_s, "decode compute": comp_s, "serving TP all-reduce": ar}
        big = max(parts, key=lambda k: parts[k])
        st, back = TERM_STATUS[big]
        out.append(
            f"the #1 is the practice layout; its largest term: {big} ({1e3 * parts[big]:.2f} ms/token), "
            f"validation: {st} ({back})"
        )
        return out
    gap = dec / (top.time_value / 1e3) - 1
    if tcost is None:
        out.append(
            f"practice is within the {100 * TIE_TOLERANCE:.0f}% tie tolerance ({100 * gap:+.1f}%); the #1's terms "
            "are not priced separately here"
        )
        return out
    d = {
        "decode HBM reads": mem_s - tcost[1],
        "decode compute": comp_s - tcost[2],
        "serving TP all-reduce": ar - tcost[3],
    }
    term = max(d, key=lambda k: d[k])
    st, back = TERM_STATUS[term]
    if gap <= TIE_TOLERANCE:
        out.append(
            f"practice is within the {100 * TIE_TOLERANCE:.0f}% tie tolerance ({100 * gap:+.1f}%); the term that "
            f"differs most: {term} ({1e3 * d[term]:+.2f} ms/token), validation: {st} ({back})"
        )
        return out
    out.append(
        f"the #1's decode is {100 * gap:.1f}% faster per token (latency; the practice layout's {lay.dp} replicas may "
        f"give more tokens/s); deciding term: {term} ({1e3 * d[term]:+.2f} ms/token), validation: {st} ({back})"
    )
    if st == DATASHEET:
        out.append(f"WARNING: this pick rests on {term}, a term never validated against a measurement")
    return out
