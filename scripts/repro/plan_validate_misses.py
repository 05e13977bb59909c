"""The held-out rows `phase6 plan validate` still misses (nothing fixed), term by term, and what would flip each.

Reproduces: docs/benchmarks.md § Fifth round (2026-12-02, branch i30h)
(issue 30; the reasoning in docs/cost_model.md §9 "Fifth round"; CPU only, no GPU, a few seconds):

    PYTHONPATH=src python scripts/repro/plan_validate_misses.py            # the table and the what-ifs
    PYTHONPATH=src python scripts/repro/plan_validate_misses.py --json     # one JSON object

For every held-out row whose published layout is neither first nor within the tie tolerance: the published layout's
predicted step beside the planner's #1, the step-time terms that differ most between them, and the change to one of
the two that would make them tie (published <= #1 x (1 + TIE_TOLERANCE)). Then the what-ifs that the fifth round
examined, each recomputed through the planner (nothing here is a new constant of the model; a what-if changes one
input and reports the rank it would give):
- ``ib_busbw_x``: the inter-node bus bandwidth scaled (405B: FSDP64·TP8's traffic crosses 64 nodes on one NIC each);
- ``tp_traffic_x2``: every TP collective twice as long (the CP rows: is TP's [s, h] traffic what keeps TP ahead?);
- ``dp_hidden``: the data-parallel traffic of every layout fully hidden (Megatron 16B / 32B);
- ``nvlink_busbw``: NCCL's NVLink bus bandwidth at an NVLS-like 480 GB/s (the 8K row: TP8 moves the most NVLink bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from phase6.plan.practice import terms as practice_terms
from phase6.plan.profile import build_profile
from phase6.plan.recommend import TIE_TOLERANCE, order_layouts
from phase6.plan.train import StepPrediction
from phase6.plan.validate import Case, case_hardware, case_predictions, fmt_layout, load_cases


def terms(q: StepPrediction) -> dict[str, float]:
    """The planner's own step-time terms (``phase6.plan.practice.terms``, they sum to the step time), with attention
    under one key whether it runs as ring attention (CP) or not, so a CP layout and a TP one compare term by term."""
    out = practice_terms(q)
    out["attention"] = out.get("attention", 0.0) + out.pop("ring attention (CP)", 0.0)
    return out


def ranked(case: Case, hw_over: dict[str, Any] | None = None, tp_scale: float = 1.0, dp_hidden: bool = False):
    """(published prediction, ordered fitting predictions) for one case, as `phase6 plan validate` ranks them
    (``case_predictions``), optionally under a what-if."""
    hw = case_hardware(case)
    if hw_over:
        hw = dataclasses.replace(hw, **hw_over) if dataclasses.is_dataclass(hw) else hw.model_copy(update=hw_over)

    def adjust(q: StepPrediction) -> None:
        for c in q.comm:
            if c.dim == "tp" and tp_scale != 1.0:
                c.time_s *= tp_scale
                c.exposed_s *= tp_scale
            if c.dim == "dp" and dp_hidden:
                c.exposed_s = 0.0

    pub, preds = case_predictions(case, build_profile(hw), adjust)
    return pub, order_layouts(preds, lambda q: q.step_time_s, lambda q: q.layout)


def verdict(pub: StepPrediction, ordered: list[StepPrediction]) -> dict[str, Any]:
    top = ordered[0]
    rank = next(i for i, q in enumerate(ordered, 1) if q is pub)
    tie = pub.step_time_s <= top.step_time_s * (1 + TIE_TOLERANCE)
    return {
        "rank": rank,
        "first_or_tied": rank == 1 or tie,
        "top": fmt_layout(top.layout),
        "gap_pct": round(100 * (pub.step_time_s / top.step_time_s - 1), 1),
    }


def miss_row(case: Case) -> dict[str, Any] | None:
    pub, ordered = ranked(case)
    v = verdict(pub, ordered)
    if v["first_or_tied"]:
        return None
    top = ordered[0]
    tp_, tt = terms(pub), terms(top)
    diff = sorted(((k, tp_.get(k, 0.0) - tt.get(k, 0.0)) for k in set(tp_) | set(tt)), key=lambda kv: -abs(kv[1]))
    need = pub.step_time_s - top.step_time_s * (1 + TIE_TOLERANCE)  # seconds off the published layout for a tie
    return {
        "id": case.id,
        "published": fmt_layout(pub.layout),
        "published_step_s": round(pub.step_time_s, 3),
        "top": v["top"],
        "top_step_s": round(top.step_time_s, 3),
        "gap_pct": v["gap_pct"],
        "tie_needs_published_minus_s": round(need, 3),
        "tie_needs_pct_of_published_step": round(100 * need / pub.step_time_s, 1),
        "or_top_plus_s": round(need / (1 + TIE_TOLERANCE), 3),
        "largest_term_differences_s": {k: round(d, 3) for k, d in diff[:5]},
    }


WHAT_IFS: list[tuple[str, str, dict[str, Any]]] = [
    ("405b-512xh100-3d", "ib_busbw_x0.5", {"hw_over": {"internode_busbw_gbps": 24.0}}),
    ("405b-512xh100-3d", "ib_busbw_x0.33", {"hw_over": {"internode_busbw_gbps": 16.0}}),
    ("405b-512xh100-3d", "ib_busbw_x0.25", {"hw_over": {"internode_busbw_gbps": 12.0}}),
    ("cp2-64k", "tp_traffic_x2", {"tp_scale": 2.0}),
    ("cp4-128k", "tp_traffic_x2", {"tp_scale": 2.0}),
    ("cp8-256k", "tp_traffic_x2", {"tp_scale": 2.0}),
    ("megatron-gpt-16b", "dp_hidden", {"dp_hidden": True}),
    ("megatron-gpt-32b", "dp_hidden", {"dp_hidden": True}),
    ("8b-64xh100-tp8-bf16-2025", "nvlink_busbw_480", {"hw_over": {"nvlink_busbw_gbps": 480.0}}),
    ("70b-256xh100-tp8-bf16-2025", "nvlink_busbw_480", {"hw_over": {"nvlink_busbw_gbps": 480.0}}),
]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    cases = [c for c in load_cases() if c.held_out]
    misses = [r for r in (miss_row(c) for c in cases) if r]
    what_ifs = []
    for key, name, kw in WHAT_IFS:
        for c in cases:
            if key in c.id:
                pub, ordered = ranked(c, **kw)
                what_ifs.append({"id": c.id, "what_if": name, **verdict(pub, ordered)})
    if a.json:
        print(json.dumps({"misses": misses, "what_ifs": what_ifs}))
        return 0
    print(
        "| row | published | step s | planner #1 | step s | gap % | tie needs (s off published / % of it) | "
        "largest term differences, published - #1 (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in misses:
        d = ", ".join(f"{k} {v:+.3f}" for k, v in r["largest_term_differences_s"].items())
        print(
            f"| {r['id']} | {r['published']} | {r['published_step_s']} | {r['top']} | {r['top_step_s']} | "
            f"{r['gap_pct']} | {r['tie_needs_published_minus_s']} / {r['tie_needs_pct_of_published_step']}% | {d} |"
        )
    print()
    print("| row | what-if | rank | planner #1 | gap % | first or tied |")
    print("|---|---|---|---|---|---|")
    for w in what_ifs:
        print(f"| {w['id']} | {w['what_if']} | {w['rank']} | {w['top']} | {w['gap_pct']} | {w['first_or_tied']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
