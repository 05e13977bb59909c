"""The planner's per-rank compute terms beside one GPU's measured kernels, per TP/CP layout (issue 30).

Reads the JSON of scripts/repro/h200_layout_compute.py (one rank of each layout, torch's TP and CP code over a fake
process group, timed on one H200) and prices the same work with `phase6.plan.train.compute_breakdown` on the H200's
datasheet profile (configs/hardware/h200.yaml), as the rows it stands for are priced: torchtitan's batch-first layout,
repeat_kv, torch's ring, SDPA's flash kernel (fa2), the row's recompute. The device ran eager blocks without RoPE,
so the prediction uses ``fused_elementwise: false`` and no RoPE bytes (``learned_positions`` only removes RoPE from
the elementwise count; the blocks' matmul shapes are unchanged). The blocks are counted alone: a one-entry vocabulary
removes the LM head, the loss and the embedding from the prediction, and the optimizer is not in either.

Reproduces: docs/benchmarks.md § plan: per-rank compute of TP and CP layouts, one H200

    PYTHONPATH=src python scripts/repro/plan_layout_compute.py docs/results/i30_layout_compute_2026-12-02/run*.json

Per case, per block (ms): GEMM, attention, the memory-bound rest, the step; predicted beside measured. Measured kinds
come from one profiled step's kernels: GEMM (cuBLAS/CUTLASS), attention (flash forward/backward), and the rest
(torch.cat copies of TP's batch-first collectives and of the ring, CP's merges, norms, SwiGLU, residuals, repeat_kv,
casts), compared with the planner's elementwise + TP layout copies + CP merges. Then, per layout pair, the
difference that decides the 8K rows' pick: the CP layout's per-rank compute minus the TP layout's, predicted and
measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import yaml

from phase6.config import HardwareConfig
from phase6.plan.memory import ParallelLayout, TrainSetup
from phase6.plan.model import resolve_model
from phase6.plan.profile import build_profile
from phase6.plan.train import CP_RING_STEP_EFFICIENCY_CURVE, compute_breakdown, cp_ring_step_efficiency
from phase6.plan.validate import HARDWARE_DIR


def predicted(rec: dict) -> dict[str, float]:
    """The planner's per-block terms (seconds) for one rank of the case's layout on the H200 datasheet profile."""
    spec = resolve_model(rec["model"])
    spec = dataclasses.replace(spec, num_layers=rec["layers"], vocab_size=1, learned_positions=True)
    layout = ParallelLayout(dp=1, tp=rec["tp"], cp=rec["cp"])
    setup = TrainSetup(
        seq_len=rec["seq"],
        global_batch_tokens=rec["micro_batch"] * rec["seq"],
        micro_batch_size=rec["micro_batch"],
        activation_checkpointing=rec["ac"] == "full",
        selective_ac=rec["ac"] == "selective",
        fused_elementwise=False,
        attention_kernel="fa2",
        activation_layout="bsh",
        cp_ring="torch",
        repeat_kv=True,
    )
    hw = HardwareConfig(**yaml.safe_load((HARDWARE_DIR / "h200.yaml").read_text()))
    c = compute_breakdown(spec, layout, setup, build_profile(hw), rec["micro_batch"] * rec["seq"])
    n = rec["layers"]
    rest = c.elementwise_s + c.tp_copy_s + c.cp_merge_s
    return {
        "gemm": c.gemm_s / n,
        "attention": c.attention_s / n,
        "rest": rest / n,
        "tp_copy": c.tp_copy_s / n,
        "cp_merge": c.cp_merge_s / n,
        "elementwise": c.elementwise_s / n,
        "step": (c.gemm_s + c.attention_s + rest) / n,
    }


def measured(rec: dict) -> dict[str, float]:
    k, n = rec["kernel_s"], rec["layers"]
    return {
        "gemm": k.get("gemm", 0.0) / n,
        "attention": k.get("attention", 0.0) / n,
        "rest": (k.get("cat", 0.0) + k.get("other", 0.0)) / n,
        "cat": k.get("cat", 0.0) / n,
        "step": rec["step_s"] / n,
    }


def label(r: dict) -> str:
    lay = f"tp{r['tp']}" + (f"·cp{r['cp']} r{r['rank']}" if r["cp"] > 1 else "")
    return f"{r['model'].removeprefix('llama3.1-')} {r['seq'] // 1024}K mb{r['micro_batch']} {r['ac']} {lay}"


def rows(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        if r.get("status") != "ok":
            out.append({"case": label(r), "status": r.get("status"), "error": r.get("error", "")})
            continue
        p, m = predicted(r), measured(r)
        out.append({"case": label(r), "status": "ok", "predicted_ms": _ms(p), "measured_ms": _ms(m), "key": _key(r)})
    return out


def _ms(d: dict[str, float]) -> dict[str, float]:
    return {k: round(1e3 * v, 2) for k, v in d.items()}


def _key(r: dict) -> tuple:
    return (r["model"], r["seq"], r["micro_batch"], r["ac"], r["tp"] * r["cp"])


def cp_groups(records: list[dict]):
    """(TP record, CP degree, that CP layout's ranks) for every CP layout measured beside TP of the same degree
    (same model, sequence, batch and recompute; ok records only)."""
    ok = [r for r in records if r.get("status") == "ok"]
    for tp_rec in (r for r in ok if r["cp"] == 1):
        cps = [r for r in ok if r["cp"] > 1 and _key(r) == _key(tp_rec)]
        for cp_deg in sorted({r["cp"] for r in cps}):
            yield tp_rec, cp_deg, [r for r in cps if r["cp"] == cp_deg]


def pairs(records: list[dict]) -> list[dict]:
    """Per (model, seq, batch, AC, degree): each CP layout's slowest measured rank against the TP layout of the same
    degree, per block: (CP - TP) predicted and measured."""
    out = []
    for tp_rec, _, ranks in cp_groups(records):
        slow = max(ranks, key=lambda r: r["step_s"])
        dp_, dm = predicted(slow)["step"] - predicted(tp_rec)["step"], (slow["step_s"] - tp_rec["step_s"])
        dm /= slow["layers"]
        busy = lambda r: sum(r["kernel_s"].values()) / r["layers"]  # noqa: E731
        out.append(
            {
                "pair": f"{label(slow)} vs tp{tp_rec['tp']}",
                "ranks_measured": len(ranks),
                "predicted_ms": round(1e3 * dp_, 2),
                "measured_ms": round(1e3 * dm, 2),
                "measured_kernels_ms": round(1e3 * (busy(slow) - busy(tp_rec)), 2),
                "predicted_pct_of_tp": round(100 * dp_ / predicted(tp_rec)["step"], 1),
                "measured_pct_of_tp": round(100 * dm / (tp_rec["step_s"] / tp_rec["layers"]), 1),
            }
        )
    return out


def ring_ratios(records: list[dict]) -> list[dict]:
    """Per CP layout: its slowest rank's flash-kernel time over the same-degree TP layout's (same model, sequence,
    batch and recompute). The planner prices that ratio as 1/cp + (cp-1)/(cp * eff), eff = ``cp_ring_step_efficiency`` at the
    half-chunk length T/(2cp)."""
    out = []
    for t, cp_deg, ranks in cp_groups(records):
        slow = max(ranks, key=lambda r: r["kernel_s"]["attention"])
        ratio = slow["kernel_s"]["attention"] / t["kernel_s"]["attention"]
        half = t["seq"] // (2 * cp_deg)  # the ring's half-chunk length (load-balanced head-tail chunks)
        out.append({"case": f"{label(slow)} vs tp{t['tp']}", "cp": cp_deg, "half": half, "ratio": ratio})
    return out


def fit_ring_efficiency(ratios: list[dict]) -> tuple[float, list[float]]:
    """Least squares in log(measured / priced) over the ring ratios: (efficiency, residuals). A 1-D golden-section
    search on [0.5, 1.5]."""
    import math

    def loss(e: float) -> float:
        return sum(math.log(r["ratio"] / (1 / r["cp"] + (r["cp"] - 1) / (r["cp"] * e))) ** 2 for r in ratios)

    lo, hi, g = 0.5, 1.5, (5**0.5 - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    e = (lo + hi) / 2
    return e, [r["ratio"] / (1 / r["cp"] + (r["cp"] - 1) / (r["cp"] * e)) - 1 for r in ratios]


def fit_ring_efficiency_curve(ratios: list[dict]) -> tuple[tuple[tuple[int, float], ...], list[float]]:
    """The efficiency fitted per half-chunk length (``fit_ring_efficiency`` on each length's layouts): the points of
    ``CP_RING_STEP_EFFICIENCY_CURVE``, rounded to 3 decimals, and every layout's residual against the curve as the
    planner reads it (log-linear between points, flat outside)."""
    from phase6.plan.train import cp_ring_step_efficiency

    points = []
    for half in sorted({r["half"] for r in ratios}):
        eff, _ = fit_ring_efficiency([r for r in ratios if r["half"] == half])
        points.append((half, round(eff, 3)))
    curve = tuple(points)
    res = []
    for r in ratios:
        e = cp_ring_step_efficiency(r["half"], curve)
        res.append(r["ratio"] / (1 / r["cp"] + (r["cp"] - 1) / (r["cp"] * e)) - 1)
    return curve, res


def render(data: dict) -> str:
    meta = data["meta"]
    lines = [
        f"{meta.get('device')} · torch {meta.get('torch')} · {meta.get('date_utc')} UTC · median of {meta.get('iters')}",
        "",
        "| case (one rank) | GEMM pred / meas | attention pred / meas | rest pred / meas (of which cat meas) | "
        "step pred / meas | meas / pred |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows(data["records"]):
        if r["status"] != "ok":
            lines.append(f"| {r['case']} | {r['status']}: {r['error'][:80]} | | | | |")
            continue
        p, m = r["predicted_ms"], r["measured_ms"]
        lines.append(
            f"| {r['case']} | {p['gemm']:.1f} / {m['gemm']:.1f} | {p['attention']:.1f} / {m['attention']:.1f} | "
            f"{p['rest']:.1f} / {m['rest']:.1f} ({m['cat']:.1f}) | {p['step']:.1f} / {m['step']:.1f} | "
            f"{m['step'] / p['step']:.3f} |"
        )
    lines += [
        "",
        "| CP layout (slowest rank) vs TP of the same degree | CP - TP predicted ms/block | measured step | "
        "measured kernels | predicted % of TP | measured step % |",
        "|---|---|---|---|---|---|",
    ]
    for p in pairs(data["records"]):
        lines.append(
            f"| {p['pair']} | {p['predicted_ms']:+.2f} | {p['measured_ms']:+.2f} | {p['measured_kernels_ms']:+.2f} | "
            f"{p['predicted_pct_of_tp']:+.1f} | {p['measured_pct_of_tp']:+.1f} |"
        )
    ratios = ring_ratios(data["records"])
    if ratios:
        lines += [
            "",
            "Ring attention: flash-kernel time CP / TP of the same degree, priced with train.py's "
            f"CP_RING_STEP_EFFICIENCY_CURVE {CP_RING_STEP_EFFICIENCY_CURVE}",
            "",
            "| CP layout (slowest rank) vs TP | half chunk | measured ratio | priced | residual |",
            "|---|---|---|---|---|",
        ]
        for r in ratios:
            e = cp_ring_step_efficiency(r["half"])
            priced = 1 / r["cp"] + (r["cp"] - 1) / (r["cp"] * e)
            lines.append(
                f"| {r['case']} | {r['half']} | {r['ratio']:.3f} | {priced:.3f} | {100 * (r['ratio'] / priced - 1):+.1f}% |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json_paths", nargs="+", help="layout_compute.json files of scripts/repro/h200_layout_compute.py")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    a = ap.parse_args(argv)
    runs = []
    for path in map(Path, a.json_paths):
        try:
            data = json.loads(path.read_text())
            data["records"], data["meta"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"plan_layout_compute: {path}: not a layout_compute.json ({type(e).__name__})", file=sys.stderr)
            return 2
        runs.append(data)
    # a CP layout is compared with the TP layout of the same run only (one machine, one warm-up, one clock)
    ratios = [r for d in runs for r in ring_ratios(d["records"])]
    curve, res = fit_ring_efficiency_curve(ratios) if ratios else ((), [])
    if a.json:
        out = [{"meta": d["meta"], "rows": rows(d["records"]), "pairs": pairs(d["records"])} for d in runs]
        print(json.dumps({"runs": out, "ring_ratios": ratios, "ring_step_efficiency_curve_fit": curve}))
        return 0
    print("\n\n".join(render(d) for d in runs))
    if ratios:
        print(
            f"\nAll runs: the ring-step efficiency fitted per half-chunk length over {len(ratios)} CP layouts: "
            f"{curve} (train.py uses {CP_RING_STEP_EFFICIENCY_CURVE}); residuals "
            f"{min(res):+.1%} to {max(res):+.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
