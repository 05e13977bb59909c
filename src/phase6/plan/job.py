"""`phase6 plan`: print the ranked layouts (rich table), one JSON object (``--json``) or the derivation (``--explain``).

    phase6 plan model=llama3.1-70b hardware=h100_sxm gpus=8 workload=serve --json
    phase6 plan model=llama3.1-8b hardware=h100_sxm gpus=16 workload=train --explain
    phase6 plan calibrate --nproc-per-node 2 --out outputs/calib/h200x2.json        (see phase6.plan.calibrate)

JSON keys (an interface; users script them): params, weights_bytes, kv_cache_bytes_per_token, candidates[{dp, tp,
pp, ep, cp, memory_gib_per_gpu, fits, decode_ms_per_token | step_time_s, reason, ...}], plus rejected, assumptions,
and serve_table (serving) or comm / cost of the best layout (training).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from phase6 import metrics
from phase6.config.plan import PlanRunConfig
from phase6.cost import gpu_hours, usd
from phase6.plan import comm, practice
from phase6.plan.memory import GIB
from phase6.plan.model import ModelSpec, resolve_model
from phase6.plan.profile import HardwareProfile, build_profile
from phase6.plan.recommend import (
    TIE_TOLERANCE,
    Recommendation,
    rank_batch,
    recommend_serve,
    recommend_train,
    serve_context,
    serve_table,
)
from phase6.plan.serve import ServeCostModel
from phase6.plan.train import StepPrediction


def assumptions(cfg: PlanRunConfig, spec: ModelSpec, profile: HardwareProfile) -> dict[str, Any]:
    e = cfg.plan.efficiency
    mfu, src = (e.mfu, "plan.efficiency.mfu (compute-only efficiency)") if e.mfu else (None, profile.kernel_source())
    out: dict[str, Any] = {
        "hardware": profile.hardware.name,
        "hardware_source": f"{profile.hardware.source} ({profile.hardware.date})",
        "numbers_from": profile.source,
        "peak_bf16_tflops": profile.hardware.peak_bf16_tflops,
        "hbm_gib": profile.hardware.hbm_gib,
        "hbm_tbps": profile.hardware.hbm_tbps,
        "intra_node": {
            "fabric": profile.intra.name,
            "bandwidth_gbps": profile.intra.bandwidth_gbps,
            "latency_us": profile.intra.latency_us,
            "hop_latency_us": profile.intra.hop_latency_us,
        },
        "inter_node": {
            "fabric": profile.inter.name,
            "bandwidth_gbps": profile.inter.bandwidth_gbps,
            "latency_us": profile.inter.latency_us,
            "hop_latency_us": profile.inter.hop_latency_us,
        },
        "gpus_per_node": profile.gpus_per_node,
        "flops_formula": metrics.FLOPS_FORMULA,
    }
    if profile.matmul_tflops:
        out["measured_matmul_tflops"] = profile.matmul_tflops
    if cfg.workload == "train":
        out.update(
            compute_efficiency=mfu,
            compute_model=src,
            tie_tolerance=TIE_TOLERANCE,
            activation_checkpointing=cfg.plan.activation_checkpointing,
            fp8=cfg.plan.fp8,
            fused_elementwise=cfg.plan.fused_elementwise,
            tp_comm_overlap=cfg.plan.tp_comm_overlap,
            seq_len=cfg.plan.seq_len,
            global_batch_tokens=cfg.plan.global_batch_tokens,
            micro_batch_size=cfg.plan.micro_batch_size,
            pp_schedule=cfg.plan.pp_schedule,
            grad_reduce_bytes=cfg.plan.grad_reduce_bytes,
            overlap="TP/EP/PP comm exposed (TP hidden behind GEMMs with tp_comm_overlap); DP grads overlap the last "
            "backward, params the first forward (ZeRO-3: all compute); each CP K/V pass overlaps 1/cp of the layer's "
            "attention",
        )
    else:
        out.update(
            prefill_mfu=e.prefill_mfu,
            decode_hbm_efficiency=e.decode_hbm_efficiency,
            gpu_memory_utilization=e.gpu_memory_utilization,
            runtime_overhead_gib=e.runtime_overhead_gib,
            context_len=serve_context(cfg.plan, spec),
            prompt_len=cfg.plan.prompt_len,
            rank_batch=rank_batch(cfg.plan),
            weight_bytes=cfg.plan.weight_bytes,
            kv_bytes=cfg.plan.kv_bytes,
            max_num_batched_tokens=e.max_num_batched_tokens,
            overlap="none: decode step = max(compute, HBM) + 2 all-reduces per layer on the critical path",
        )
    return out


def build_result(cfg: PlanRunConfig) -> tuple[dict[str, Any], Recommendation, ModelSpec, HardwareProfile]:
    """The JSON object of `phase6 plan` (and what results.json stores)."""
    spec = resolve_model(cfg.model, cfg.plan.hf_config)
    profile = build_profile(cfg.hardware, cfg.plan.profile)
    rec = (recommend_serve if cfg.workload == "serve" else recommend_train)(spec, cfg.gpus, cfg.plan, profile)
    result: dict[str, Any] = {
        "model": spec.name,
        "workload": cfg.workload,
        "gpus": cfg.gpus,
        "hardware": profile.hardware.name,
        "params": spec.num_params(),
        "active_params": spec.num_active_params(),
        "weights_bytes": spec.num_params() * cfg.plan.weight_bytes,
        "kv_cache_bytes_per_token": spec.kv_cache_bytes_per_token(cfg.plan.kv_bytes),
        "flops_per_token": spec.flops_per_token(cfg.plan.seq_len),
        "candidates": [c.as_dict() for c in rec.candidates],
        "rejected": [c.as_dict() for c in rec.rejected],
        "num_legal_layouts": rec.num_legal,
        "assumptions": assumptions(cfg, spec, profile),
        "model_spec": spec.to_dict(),
    }
    if cfg.workload == "serve":
        result["serve_table"] = serve_table(spec, cfg.gpus, cfg.plan, profile)
    elif rec.candidates:
        best: StepPrediction = rec.candidates[0].detail
        tokens = cfg.plan.train_tokens or 20.0 * spec.num_params()
        seconds = tokens / best.tokens_per_s
        gh = gpu_hours(cfg.gpus, seconds)
        result["best"] = {
            "memory_gib": best.memory.gib(),
            "comm": [c.as_dict() for c in best.comm],
            "compute_s": best.compute_s,
            "bubble_s": best.bubble_s,
            "step_time_s": best.step_time_s,
            "tokens_per_s": best.tokens_per_s,
        }
        result["practice"] = practice.summary(practice.compare(best, spec, cfg.gpus, cfg.plan, profile))
        result["cost"] = {
            "train_tokens": tokens,
            "hours": seconds / 3600,
            "gpu_hours": gh,
            "usd": usd(gh, profile.hardware.usd_per_gpu_hour),
            "usd_per_gpu_hour": profile.hardware.usd_per_gpu_hour,
            "tokens_source": "plan.train_tokens" if cfg.plan.train_tokens else "20 tokens/param (Chinchilla)",
        }
    return result, rec, spec, profile


def _fmt_bytes(b: float) -> str:
    return f"{b / GIB:,.2f} GiB" if b >= GIB else f"{b / 2**20:,.2f} MiB"


def explain(
    cfg: PlanRunConfig, result: dict[str, Any], rec: Recommendation, spec: ModelSpec, profile: HardwareProfile
) -> str:
    """The derivation of the top candidate, with every number (formulas: docs/cost_model.md)."""
    L, h, a, kv, d = spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
    lines = [
        f"# phase6 plan: {spec.name} on {cfg.gpus} x {profile.hardware.name} ({cfg.workload})",
        f"numbers from: {profile.source}",
        "",
        "## Model",
        f"L={L} layers, h={h}, heads={a}, kv_heads={kv}, head_dim={d}, ffn={spec.intermediate_size}, "
        f"V={spec.vocab_size}" + (f", experts={spec.num_experts} top-{spec.experts_per_token}" if spec.is_moe else ""),
        f"params N = L*(attn {spec.attention_params_per_layer():,} + norms {spec.norm_params_per_layer():,} + "
        f"mlp {spec.dense_mlp_params_per_layer() + spec.expert_params_per_layer():,}) + embeddings "
        f"{spec.embedding_params() + spec.position_params():,} + head {spec.lm_head_params():,} = {spec.num_params():,}",
    ]
    if spec.is_moe:
        lines.append(f"active params per token = {spec.num_active_params():,}")
    lines.append(
        f"KV cache/token = 2 * L * kv_heads * head_dim * {cfg.plan.kv_bytes:g} B = 2*{L}*{kv}*{d}*"
        f"{cfg.plan.kv_bytes:g} = {spec.kv_cache_bytes_per_token(cfg.plan.kv_bytes):,.0f} B"
    )
    lines.append(f"weights = N * {cfg.plan.weight_bytes:g} B = {_fmt_bytes(result['weights_bytes'])}")
    if cfg.workload == "train":
        T = cfg.plan.seq_len
        lines.append(
            f"FLOPs/token = 6N + 12*L*H*Q*T = 6*{spec.num_matmul_params():,} + 12*{L}*{a}*{d}*{T} = "
            f"{spec.flops_per_token(T) / 1e9:,.2f} GFLOP (N = matmul params)"
        )
    lines.append("")
    if not rec.candidates:
        lines.append("## No layout fits")
        for c in rec.rejected:
            lines.append(f"- {c.layout}: {c.memory_gib_per_gpu:,.1f} GiB/GPU; {c.reason}")
        if cfg.workload == "train":
            _, rule = practice.practice_layout(spec, cfg.gpus, cfg.plan, profile)
            mst, mback = practice.memory_status()
            lines += [
                "",
                "## Practice layout beside the #1",
                f"practice rule: {rule}",
                f"deciding term: memory, validation: {mst} ({mback})",
            ]
        return "\n".join(lines)
    top = rec.candidates[0]
    lines.append(f"## Best layout: {top.layout}")
    if cfg.workload == "train":
        p: StepPrediction = top.detail
        mem = p.memory.gib()
        s = p.setup
        lines += [
            f"micro-batches m = global {s.global_batch_tokens:,} tok / ({T} * dp {p.layout.dp} * mb {s.micro_batch_size})"
            f" = {p.num_microbatches}"
            + (" (micro-batch searched: the fastest that fits)" if cfg.plan.micro_batch_size is None else ""),
            f"  note: plan.micro_batch_size = sequences per micro-batch per data-parallel replica (what torchtitan calls "
            f"local_batch_size / pp microbatches, Megatron --micro-batch-size); torchtitan's 'local batch' is per "
            f"replica per step = micro_batch_size x m = {s.micro_batch_size * p.num_microbatches}",
            f"memory/GPU (ZeRO-{s.zero} over dp*cp={p.layout.dp * p.layout.cp}, TP {p.layout.tp}, PP {p.layout.pp}, "
            f"AC {s.ac_mode}):",
            *[f"  {k:12s} {v:10.2f} GiB" for k, v in mem.items()],
            f"  (16 B/param = 2 param + 2 grad + 12 Adam fp32; ZeRO-1 shards 12, ZeRO-2 14, ZeRO-3 16; usable "
            f"{p.usable_gib:.1f} GiB)",
        ]
        if p.breakdown is not None:
            b = p.breakdown
            lines += [
                f"compute per GPU (kernel level: {profile.kernel_source()}):",
                f"  GEMM      {(6 + (2 if s.activation_checkpointing else 1 if s.selective_ac else 0))}N x tokens / "
                f"(GPUs x {'FP8' if s.fp8 else 'bf16'} matmul rate) + 6 us per GEMM call = {b.gemm_s * 1e3:,.1f} ms"
                + (f" ({b.recompute_note})" if b.recompute_note else ""),
                f"  attention 4*L*H*Q*T/2 (causal fwd) x {'4.5' if s.activation_checkpointing else '3.5'} (bwd = 2.5 "
                f"fwd{', + recompute' if s.activation_checkpointing else ''}) x tokens / (GPUs x {s.attention_kernel} "
                f"flash rate at T/cp = {profile.attention_flops_at(s.seq_len / p.layout.cp, s.attention_kernel) / 1e12:.0f}"
                f" TF) = {b.attention_s * 1e3:,.1f} ms",
                f"  norms/activations/RoPE/residuals ({'fused' if s.fused_elementwise else 'eager'}) at HBM = "
                f"{b.elementwise_s * 1e3:,.1f} ms",
                *([f"  CP ring output merges (fp32) at HBM = {b.cp_merge_s * 1e3:,.1f} ms"] if b.cp_merge_s else []),
                *(
                    [f"  TP collectives' chunk+cat copies (batch-first layout) at HBM = {b.tp_copy_s * 1e3:,.1f} ms"]
                    if b.tp_copy_s
                    else []
                ),
                f"  gradient buffers (embedding's dense grad{', fp32 main-grad read/write' if s.fp32_grad_accumulation else ''})"
                f" at HBM = {b.main_grad_s * 1e3:,.1f} ms",
                f"  loss (cross-entropy, {16 if (s.fused_elementwise if s.fused_loss is None else s.fused_loss) else 40} B"
                f"/vocab entry) = {b.loss_s * 1e3:,.1f} ms; optimizer (AdamW, 30 B/local param) = "
                f"{b.optimizer_s * 1e3:,.1f} ms",
                f"  = {p.compute_s * 1e3:,.1f} ms forward+backward + {p.optimizer_s * 1e3:,.1f} ms optimizer",
            ]
        else:
            lines.append(
                f"compute = {p.model_flops_per_step:.3e} model FLOPs"
                f"{' x 4/3 recompute' if s.activation_checkpointing else ''} / ({p.layout.gpus} GPUs * efficiency "
                f"{p.mfu_assumed:.2f} * {profile.hardware.peak_bf16_tflops} TF) = {p.compute_s * 1e3:,.1f} ms"
            )
        if p.bubble_s:
            lines.append(
                f"bubble ({top.extra.get('pp_schedule', s.pp_schedule)}) = compute * {p.bubble_s / p.compute_s:.3f} = "
                f"{p.bubble_s * 1e3:,.1f} ms"
            )
        lines.append("communication per step per GPU:")
        for c in p.comm:
            lines.append(
                f"  {c.dim:3s} {c.op:28s} on {c.fabric:18s} {c.count:6d} x {_fmt_bytes(c.message_bytes):>12s}"
                f" -> wire {_fmt_bytes(c.wire_bytes):>12s}, {c.time_s * 1e3:9.2f} ms, exposed "
                f"{c.exposed_s * 1e3:9.2f} ms ({c.note})"
            )
        if p.overlap_s:
            lines.append(
                f"overlap slowdown: compute beside hidden NCCL traffic runs 18.9% x (fabric busbw / NVLink busbw) "
                f"slower (SMs and HBM taken; arXiv 2507.03114; TP overlap's peer copies not charged) = "
                f"{p.overlap_s * 1e3:,.1f} ms"
            )
        lines += [
            f"step = compute + bubble + exposed comm + optimizer + overlap slowdown = {p.step_time_s * 1e3:,.1f} ms -> "
            f"{p.tokens_per_s:,.0f} tok/s, MFU {100 * p.mfu(profile.peak_flops):.1f}%"
        ]
        cmp = practice.compare(p, spec, cfg.gpus, cfg.plan, profile)
        lines += ["", *cmp.lines(p), ""]
        lines.append(
            f"why this layout: fastest predicted step, except that layouts within {100 * TIE_TOLERANCE:.0f}% of the "
            "fastest count as ties (the model's error on published runs is larger, `phase6 plan validate`) and the "
            "simpler one wins: fewer model-parallel dimensions (tp/pp/cp/ep > 1), then smaller PP"
        )
        if "cost" in result:
            c = result["cost"]
            lines.append(
                f"budget {c['train_tokens']:.3g} tokens ({c['tokens_source']}): {c['hours']:,.1f} h, "
                f"{c['gpu_hours']:,.0f} GPU-h, ${c['usd']:,.0f} at ${c['usd_per_gpu_hour']}/GPU-h"
            )
    else:
        lay = top.layout
        m = ServeCostModel(
            spec,
            profile,
            tp=lay.tp,
            pp=lay.pp,
            ep=lay.ep,
            efficiency=cfg.plan.efficiency,
            weight_bytes=cfg.plan.weight_bytes,
            kv_bytes=cfg.plan.kv_bytes,
        )
        ctx = serve_context(cfg.plan, spec)
        mem = m.memory(ctx)
        b = top.extra["batch"]
        e = cfg.plan.efficiency
        f = m.fabric
        ar_t, algo = comm.all_reduce_time(b * h * 2.0, lay.tp, f) if lay.tp > 1 else (0.0, "-")
        lines += [
            f"weights/GPU = {_fmt_bytes(mem.weights_bytes)} (N*{cfg.plan.weight_bytes:g} B / tp {lay.tp} / pp {lay.pp})",
            f"usable = {e.gpu_memory_utilization} * {profile.hardware.hbm_gib} GiB = {_fmt_bytes(mem.usable_bytes)}; "
            f"overhead {_fmt_bytes(mem.overhead_bytes)} = runtime {e.runtime_overhead_gib} GiB + activations of a "
            f"{min(ctx, e.max_num_batched_tokens)}-token forward (min(context_len, max_num_batched_tokens))",
            f"KV/token/GPU = {mem.kv_bytes_per_token:,.0f} B -> capacity {mem.kv_capacity_tokens:,.0f} tokens = "
            f"{mem.max_concurrent_seqs} seqs x {ctx}",
            f"decode step at batch {b}, context {ctx}:",
            f"  weights read {_fmt_bytes(m.weights_read_bytes(b))} + KV read {_fmt_bytes(m.kv_bytes_per_token * b * ctx)}"
            f" over {lay.tp} x {profile.hardware.hbm_tbps} TB/s x {e.decode_hbm_efficiency} = "
            f"{m.memory_s(b, b * ctx) * 1e3:.2f} ms",
            f"  compute {b} x (2N + 4*L*H*Q*ctx) / ({lay.tp} x {profile.hardware.peak_bf16_tflops} TF x "
            f"{e.prefill_mfu}) = {m.compute_s(b, b * ctx) * 1e3:.3f} ms",
            f"  all-reduce: 2 per layer x {L} layers x ({algo}) {_fmt_bytes(b * h * 2.0)} on {f.name} "
            f"({f.latency_us} us + hops + bytes/{f.bandwidth_gbps} GB/s = {ar_t * 1e6:.1f} us) = "
            f"{m.allreduce_s(b) * 1e3:.2f} ms",
            f"  decode = max(memory, compute) + all-reduce = {top.time_value:.2f} ms/token -> "
            f"{top.extra['tokens_per_s']:,.0f} tok/s over {lay.dp} replica(s)",
            f"prefill {cfg.plan.prompt_len} tokens = {top.extra['prefill_ms']:.1f} ms (compute-bound)",
        ]
        if lay.tp > 1:
            lines.append(
                f"tree beats ring below {comm.tree_ring_crossover_bytes(lay.tp, f) / 2**20:.2f} MiB on "
                f"{lay.tp} ranks ({f.name})"
            )
    if cfg.workload != "train":
        lines += ["", *practice.serve_lines(rec, spec, cfg.gpus, cfg.plan, profile)]
    lines += ["", "## Ranked"]
    for i, c in enumerate(rec.candidates, 1):
        lines.append(
            f"{i}. {c.layout}: {c.time_key}={c.time_value:.4g}, {c.memory_gib_per_gpu:.1f} GiB/GPU; {c.reason}"
        )
    if rec.rejected:
        lines.append("## Rejected (do not fit)")
        lines += [f"- {c.layout}: {c.reason}" for c in rec.rejected]
    return "\n".join(lines)


def print_table(result: dict[str, Any], rec: Recommendation) -> None:
    """The ranked layouts (and the serving TP x batch grid) as plain text fitted to the terminal width
    (phase6.terminal.format_rows: transposed or in column blocks when a table is wider than the terminal)."""
    from phase6.terminal import format_rows

    key = "decode_ms_per_token" if result["workload"] == "serve" else "step_time_s"
    title = (
        f"{result['model']} on {result['gpus']} x {result['hardware']} ({result['workload']}): "
        f"{result['params'] / 1e9:.2f}B params, weights {result['weights_bytes'] / GIB:.1f} GiB, "
        f"KV {result['kv_cache_bytes_per_token']:,.0f} B/token"
    )
    rows = [
        {
            "#": str(i),
            "dp": c.layout.dp,
            "tp": c.layout.tp,
            "pp": c.layout.pp,
            "ep": c.layout.ep,
            "cp": c.layout.cp,
            **({"schedule": c.extra["pp_schedule"]} if "pp_schedule" in c.extra else {}),
            **(
                {"mb x m": f"{c.extra['micro_batch_size']} x {c.extra['num_microbatches']}"}
                if "micro_batch_size" in c.extra
                else {}
            ),
            "GiB/GPU": f"{c.memory_gib_per_gpu:.1f}",
            key: f"{c.time_value:.4g}",
            "tok/s": f"{c.extra.get('tokens_per_s', 0):,.0f}",
            "reason": c.reason,
        }
        for i, c in enumerate(rec.candidates, 1)
    ]
    if rows:
        print(format_rows(rows, title), flush=True)
    else:
        print(f"{title}\nno layout fits; closest:", flush=True)
        for c in rec.rejected:
            print(f"  {c.layout}: {c.memory_gib_per_gpu:.1f} GiB/GPU; {c.reason}", flush=True)
    if result.get("serve_table"):
        cols = (
            "tp",
            "batch",
            "fits",
            "weights_gib_per_gpu",
            "max_concurrent_seqs",
            "prefill_ms",
            "decode_ms",
            "allreduce_pct",
            "bound",
            "tokens_per_s",
        )
        serve_rows = [
            {k: f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in cols} for r in result["serve_table"]
        ]
        title = "serving: TP x batch (decode per token, prefill of plan.prompt_len per sequence batch)"
        print("\n" + format_rows(serve_rows, title), flush=True)


def main(cfg: PlanRunConfig) -> dict[str, Any]:
    from phase6.runrecord import RunRecord

    result, rec, spec, profile = build_result(cfg)
    text = explain(cfg, result, rec, spec, profile) if cfg.plan.output == "explain" else ""
    json_mode = cfg.plan.output == "json"
    # --json: stdout carries exactly one JSON object; the run record's own lines go to stderr.
    sink = contextlib.redirect_stdout(sys.stderr) if json_mode else contextlib.nullcontext()
    with sink:
        cfg.logger.console = False  # this job renders its own tables; the record only writes files
        run = RunRecord(cfg, job="plan")
        rows = [c.as_dict() for c in rec.candidates]
        if cfg.plan.output == "table":
            print_table(result, rec)
        elif text:
            print(text)
        tables = {"rejected (do not fit)": result["rejected"]}
        if "serve_table" in result:
            tables["serving: TP x batch"] = result["serve_table"]
        if "best" in result:
            tables["communication of the best layout"] = result["best"]["comm"]
        run.finish(
            rows,
            cost=result.get("cost"),
            tables=tables,
            extra={"plan": {k: v for k, v in result.items() if k not in ("candidates",)}},
            notes={"derivation": text or explain(cfg, result, rec, spec, profile)},
        )
    if json_mode:
        print(json.dumps(result, default=str), flush=True)
    return result
