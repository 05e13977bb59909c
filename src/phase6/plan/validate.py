"""`phase6 plan validate`: the planner against published training runs (published_runs.yaml next to this file).

    phase6 plan validate                      # print the table, write <run dir>/results.{json,md}
    phase6 plan validate --out DIR --json     # choose the run dir; print one JSON object

For every published run: the predicted tokens/s per GPU of the published layout with its published settings, the
ratio predicted / published, and the rank of the published layout among every legal layout of the same GPUs (same
settings), using the recommender's order (step time, then the simpler layout within ``TIE_TOLERANCE``). Cases marked
``held_out`` are reported separately. tests/test_plan_validate.py holds the error bounds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from phase6.config import HardwareConfig
from phase6.config.plan import EfficiencyConfig
from phase6.plan.memory import ParallelLayout, TrainSetup
from phase6.plan.model import ModelSpec, load_preset
from phase6.plan.profile import HardwareProfile, build_profile
from phase6.plan.recommend import TIE_TOLERANCE, layouts, order_layouts
from phase6.plan.train import StepPrediction, predict_train_step

ROOT = Path(__file__).resolve().parents[3]
CASES_PATH = Path(__file__).with_name("published_runs.yaml")
HARDWARE_DIR = ROOT / "configs" / "hardware"
SETUP_FIELDS = {f.name for f in fields(TrainSetup)}
RUNTIME_OVERHEAD_GIB = EfficiencyConfig().runtime_overhead_gib  # the planner's default, as `phase6 plan` uses it


@dataclass
class Case:
    id: str
    source: str
    date: str
    model: dict[str, Any] | str
    hardware: str
    gpus: int
    layout: dict[str, int]
    setup: dict[str, Any]
    published: dict[str, float]
    approximated: str
    held_out: bool = False
    hardware_overrides: dict[str, Any] = field(default_factory=dict)
    fits: list[str] = field(default_factory=list)
    """Model constants fitted on this row's published number (named in the table's source column); a held-out row
    that fits one stays held out and says so."""
    fixed: dict[str, int] = field(default_factory=dict)
    """Layout sizes the published experiment holds constant by design, as its source states them (e.g. Megatron's
    weak-scaling table keeps DP = 48 in every row; torchtitan's "2D (FSDP + TP)" table runs no PP and no CP). A
    diagnostic only: the headline is the rank with nothing fixed (``rank_free``), the planner's own choice for the
    model, sequence, batch and GPUs; ``rank`` (these sizes kept) says whether the published layout is beaten inside
    its own design, and ``rank_dp_fixed`` keeps only a fixed DP (Megatron's weak-scaling DP = 48)."""
    fixed_why: str = ""
    """The sentence of the source that fixes them (required with ``fixed``)."""


def load_cases(path: str | Path = CASES_PATH) -> list[Case]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"plan validate: no such file {str(p)!r}")
    data = yaml.safe_load(p.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ValueError(f"{p}: expected a mapping with a 'cases' list")
    known = {f.name for f in fields(Case)}
    out = []
    for i, raw in enumerate(data["cases"]):
        where = f"{p}: cases[{i}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected a mapping")
        extra = set(raw) - known
        optional = ("held_out", "hardware_overrides", "fits", "fixed", "fixed_why")
        missing = {f.name for f in fields(Case) if f.name not in optional} - set(raw)
        if extra or missing:
            raise ValueError(f"{where}: unknown keys {sorted(extra)} / missing keys {sorted(missing)}")
        bad = set(raw["setup"]) - SETUP_FIELDS
        if bad:
            raise ValueError(f"{where} ({raw['id']}): setup has unknown TrainSetup fields {sorted(bad)}")
        if not {"tokens_per_s_per_gpu", "tflops_per_gpu"} & set(raw["published"]):
            raise ValueError(f"{where} ({raw['id']}): published needs tokens_per_s_per_gpu or tflops_per_gpu")
        fixed = raw.get("fixed") or {}
        if not isinstance(fixed, dict) or set(fixed) - {"dp", "tp", "pp", "cp", "ep"}:
            raise ValueError(f"{where} ({raw['id']}): fixed must map dp/tp/pp/cp/ep to sizes, got {fixed!r}")
        if fixed and not raw.get("fixed_why"):
            raise ValueError(f"{where} ({raw['id']}): fixed needs fixed_why (the source's words that fix them)")
        if any(int(v) != int(raw["layout"].get(k, 1)) for k, v in fixed.items()):
            raise ValueError(f"{where} ({raw['id']}): fixed {fixed} contradicts the published layout {raw['layout']}")
        out.append(Case(**raw))
    return out


def case_model(case: Case) -> ModelSpec:
    if isinstance(case.model, str):
        return ModelSpec.from_fields(load_preset(case.model), name=case.model, source=f"{case.id}: model")
    return ModelSpec.from_hf_config(dict(case.model), name=case.id, source=f"{case.id}: model")


def case_hardware(case: Case) -> HardwareConfig:
    path = HARDWARE_DIR / f"{case.hardware}.yaml"
    if not path.is_file():
        raise ValueError(f"{case.id}: unknown hardware {case.hardware!r} (no {path})")
    return HardwareConfig(**{**yaml.safe_load(path.read_text()), **case.hardware_overrides})


@dataclass
class CaseResult:
    case: Case
    published_tps: float
    predicted: StepPrediction
    rank: int
    num_candidates: int
    best: ParallelLayout | None
    best_time_s: float
    within_tie: bool
    peak_flops: float
    rank_free: int = 0
    """Rank among every legal layout of the GPUs (the row's ``fixed`` sizes ignored): the headline."""
    within_tie_free: bool = False
    rank_dp_fixed: int = 0
    """Rank among the layouts that keep only the row's fixed DP (no fixed DP: the same as ``rank_free``)."""
    within_tie_dp_fixed: bool = False
    best_free: ParallelLayout | None = None
    best_free_time_s: float = 0.0

    @property
    def predicted_tps(self) -> float:
        return self.predicted.tokens_per_s / self.predicted.layout.gpus

    @property
    def ratio(self) -> float:
        return self.predicted_tps / self.published_tps

    def row(self) -> dict[str, Any]:
        p = self.predicted
        return {
            "id": self.case.id,
            "held_out": self.case.held_out,
            "gpus": self.case.gpus,
            "published_layout": fmt_layout(p.layout),
            "published_tok_s_gpu": round(self.published_tps, 1),
            "predicted_tok_s_gpu": round(self.predicted_tps, 1),
            "ratio": round(self.ratio, 3),
            "predicted_mfu_pct": round(100 * p.mfu(self.peak_flops), 1),
            "fits": p.fits,
            "memory_gib": round(p.memory.total / 2**30, 1),
            "rank_free": self.rank_free,
            "planner_top_free": fmt_layout(self.best_free) if self.best_free else "-",
            "within_tie_free": self.within_tie_free,
            "published_vs_top_free_pct": round(100 * (p.step_time_s / self.best_free_time_s - 1), 1)
            if self.best_free_time_s
            else None,
            "asked": _fmt_fixed(self.case.fixed),
            "rank": self.rank,
            "of": self.num_candidates,
            "planner_top": fmt_layout(self.best) if self.best else "-",
            "published_vs_top_pct": round(100 * (p.step_time_s / self.best_time_s - 1), 1) if self.best else None,
            "within_tie": self.within_tie,
            "rank_dp_fixed": self.rank_dp_fixed,
            "within_tie_dp_fixed": self.within_tie_dp_fixed,
            "dominant": p.dominant(),
            "source": source_label(self.case),
        }


def source_label(case: Case) -> str:
    """Where the published number comes from (its file / table) and the constants fitted on it, if any."""
    where = case.source.split(":")[0].strip().replace("|", "/")
    if len(where) > 70:
        where = where[:67] + "..."
    return where + (f"; FITS {', '.join(case.fits)}" if case.fits else "")


def _fmt_fixed(fixed: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in fixed.items()) if fixed else "-"


def fmt_layout(lay: ParallelLayout) -> str:
    """dp8·tp4·cp2: DP always, every other size above 1."""
    bits = [f"{k}{getattr(lay, k)}" for k in ("dp", "tp", "pp", "cp", "ep") if getattr(lay, k) > 1 or k == "dp"]
    return "·".join(bits)


def case_predictions(
    case: Case, profile: HardwareProfile, adjust: Callable[[StepPrediction], None] | None = None
) -> tuple[StepPrediction, list[StepPrediction]]:
    """The published layout's prediction and the candidates it is ranked among: every layout of the case's GPUs and
    setup that fits, with the published one always in (it ran, so it fits in reality; a row says so when the
    planner disagrees), on ``profile`` (the case's hardware, or a what-if's); ``adjust`` edits each prediction in
    place before the fit check (scripts/repro/plan_validate_misses.py scales terms with it)."""
    spec = case_model(case)
    setup = TrainSetup(**case.setup)
    lay = ParallelLayout(**{k: int(v) for k, v in case.layout.items()})
    if lay.gpus != case.gpus:
        raise ValueError(f"{case.id}: layout {lay} is {lay.gpus} GPUs, not {case.gpus}")

    def predict(cand: ParallelLayout) -> StepPrediction:
        q = predict_train_step(spec, cand, setup, profile, overhead_gib=RUNTIME_OVERHEAD_GIB)
        if adjust is not None:
            adjust(q)
        return q

    pred = predict(lay)
    preds: list[StepPrediction] = []
    for cand in layouts(spec, case.gpus, "train", {}, setup.seq_len, profile.gpus_per_node):
        q = pred if cand == lay else predict(cand)
        if q.fits:
            preds.append(q)
    if pred not in preds:
        preds.append(pred)
    return pred, preds


def run_case(case: Case) -> CaseResult:
    spec = case_model(case)
    setup = TrainSetup(**case.setup)
    profile = build_profile(case_hardware(case))
    pred, preds = case_predictions(case, profile)
    pub = case.published
    if "tokens_per_s_per_gpu" in pub:
        published_tps = float(pub["tokens_per_s_per_gpu"])
    else:  # Megatron reports model TFLOP/s per GPU with the same 6N + 12LHQT count (no recompute)
        published_tps = float(pub["tflops_per_gpu"]) * 1e12 / spec.flops_per_token(setup.seq_len)

    def ranked(group: list[StepPrediction]) -> tuple[int, int, StepPrediction, bool]:
        ordered = order_layouts(group, lambda q: q.step_time_s, lambda q: q.layout)
        rank = next(i for i, q in enumerate(ordered, 1) if q is pred)
        fastest = min(q.step_time_s for q in group)
        return rank, len(ordered), ordered[0], pred.step_time_s <= fastest * (1 + TIE_TOLERANCE)

    asked = [q for q in preds if all(getattr(q.layout, k) == int(v) for k, v in case.fixed.items())]
    rank, num, top, tie = ranked(asked)
    rank_free, _, top_free, tie_free = ranked(preds)
    dp_only = [q for q in preds if "dp" not in case.fixed or q.layout.dp == int(case.fixed["dp"])]
    rank_dp, _, _, tie_dp = ranked(dp_only)
    return CaseResult(
        case=case,
        published_tps=published_tps,
        predicted=pred,
        rank=rank,
        num_candidates=num,
        best=top.layout,
        best_time_s=top.step_time_s,
        within_tie=tie,
        peak_flops=profile.peak_flops,
        rank_free=rank_free,
        within_tie_free=tie_free,
        best_free=top_free.layout,
        best_free_time_s=top_free.step_time_s,
        rank_dp_fixed=rank_dp,
        within_tie_dp_fixed=tie_dp,
    )


def summary(results: list[CaseResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, group in (
        ("calibration", [r for r in results if not r.case.held_out]),
        ("held_out", [r for r in results if r.case.held_out]),
    ):
        if not group:
            continue
        errs = [abs(r.ratio - 1) for r in group]
        out[name] = {  # the headline first: the planner's own choice, nothing fixed
            "cases": len(group),
            "first_or_tied_nothing_fixed": sum(1 for r in group if r.rank_free == 1 or r.within_tie_free),
            "mean_abs_error_pct": round(100 * statistics.mean(errs), 1),
            "max_abs_error_pct": round(100 * max(errs), 1),
            "diagnostic_first_or_tied_given_fixed_sizes": sum(1 for r in group if r.rank == 1 or r.within_tie),
            "diagnostic_first_or_tied_dp_fixed_only": sum(
                1 for r in group if r.rank_dp_fixed == 1 or r.within_tie_dp_fixed
            ),
            "rows_with_fixed_sizes": sum(1 for r in group if r.case.fixed),
            "rows_that_fit_a_constant": sum(1 for r in group if r.case.fits),
        }
    out["tie_tolerance_pct"] = 100 * TIE_TOLERANCE
    return out


def validate(path: str | Path = CASES_PATH) -> tuple[list[CaseResult], dict[str, Any]]:
    results = [run_case(c) for c in load_cases(path)]
    return results, summary(results)


def render(results: list[CaseResult], summ: dict[str, Any]) -> str:
    cols = (
        "id",
        "published_layout",
        "published_tok_s_gpu",
        "predicted_tok_s_gpu",
        "ratio",
        "predicted_mfu_pct",
        "rank_free",
        "planner_top_free",
        "published_vs_top_free_pct",
        "asked",
        "rank",
        "of",
        "dominant",
        "source",
    )
    lines = []
    for title, held in (("calibration cases", False), ("held-out cases", True)):
        rows = [r.row() for r in results if r.case.held_out == held]
        if not rows:
            continue
        lines += [f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
        lines.append("")
    lines += headline(summ)
    for k, v in summ.items():
        lines.append(f"- {k}: {v}")
    lines.append(
        f"- rank_free: position of the published layout among every fitting layout of the same GPUs and settings "
        f"(nothing fixed), ordered by step time with layouts within {100 * TIE_TOLERANCE:.0f}% of the fastest "
        "ordered simplest first (fewer model-parallel dims, then smaller PP); planner_top_free: the planner's #1. "
        "Diagnostic only: asked = the layout sizes the published experiment fixed by design (published_runs.yaml "
        "fixed / fixed_why); rank / of = the same ranking among the layouts that keep them"
    )
    return "\n".join(lines)


def headline(summ: dict[str, Any]) -> list[str]:
    """The honest count first (nothing fixed: does the planner prescribe what practice ran?), the diagnostics after."""
    out = []
    for name in ("held_out", "calibration"):
        g = summ.get(name)
        if not g:
            continue
        n = g["cases"]
        out += [
            f"{name}: first or tied (nothing fixed): {g['first_or_tied_nothing_fixed']} of {n}; "
            f"mean error {g['mean_abs_error_pct']}%, max {g['max_abs_error_pct']}%",
            f"  diagnostic, given the sizes the published experiment fixed: "
            f"{g['diagnostic_first_or_tied_given_fixed_sizes']} of {n}",
            f"  diagnostic, only a fixed DP kept (Megatron's weak-scaling DP = 48): "
            f"{g['diagnostic_first_or_tied_dp_fixed_only']} of {n}",
        ]
    return out + [""]


def cli_main(argv: list[str]) -> Path:
    ap = argparse.ArgumentParser(prog="phase6 plan validate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=str(CASES_PATH), help="published-runs YAML (default: the shipped table)")
    ap.add_argument("--out", default="", help="run dir (default outputs/plan_validate/<time>)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    out = Path(a.out or Path("outputs/plan_validate") / time.strftime("%Y%m%d-%H%M%S"))
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"plan validate: --out {str(out)!r} exists and is not empty (a run never overwrites another)")
    results, summ = validate(a.cases)  # everything computed before the run dir is created
    out.mkdir(parents=True, exist_ok=True)
    payload = {"job": "plan_validate", "cases_file": str(a.cases), "summary": summ, "rows": [r.row() for r in results]}
    payload["cases"] = [r.case.__dict__ for r in results]
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(out / "results.json")
    text = render(results, summ)
    (out / "results.md").write_text("# phase6 plan validate\n\n" + text + "\n")
    if a.json:
        print(json.dumps(payload, default=str))
    else:
        print(text)
    print(f"run dir: {out}", file=sys.stderr if a.json else sys.stdout, flush=True)
    if any(math.isnan(r.ratio) for r in results):
        raise ValueError("plan validate: a prediction is NaN")
    return out


if __name__ == "__main__":
    cli_main(sys.argv[1:])
