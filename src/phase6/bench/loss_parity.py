"""`phase6 bench loss-parity RUN_DIR...`: does a numerics lever (FP8 GEMMs, a bf16 residual stream) train to the same
loss as the default? It reads finished `phase6 pretrain` runs (sweep members or single runs), groups them by their
numerics (model.float8, model.float8_lm_head, model.residual_dtype), and compares each group's val-loss curve with
the default group's.

The default group should hold several seeds (`run.seed=0,1,2`): their spread is the noise floor. A lever passes
when, at the final evaluation and at the curve's minimum, its mean val loss lies within

    tolerance = max(--tol, max - min of the default seeds' values)

of the default seeds' mean. --tol (default 0.02 nats) is the floor: two seeds can agree by chance closer than the
noise of a longer run. Shown beside the verdict (not part of it): paired_max_abs_delta, the largest |val loss
difference| at any evaluation between a lever run and the default run of the same seed (same init and data order). Runs must share the data, steps and evaluation cadence (checked: the val steps must match).

    phase6 pretrain -m experiment=loss_parity_gpu run.seed=0,1,2
    phase6 pretrain -m experiment=loss_parity_gpu model.float8=tensorwise,rowwise
    phase6 bench loss-parity outputs/pretrain/parity/*/[0-9]* --out parity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phase6 import metrics
from phase6.runrecord import markdown_table, read_metrics

NUMERICS = ("float8", "float8_lm_head", "residual_dtype")
DEFAULT_NUMERICS = {"float8": "none", "float8_lm_head": False, "residual_dtype": "fp32"}


@dataclass
class Curve:
    run_dir: Path
    numerics: dict[str, Any]
    seed: int
    val: dict[int, float]
    """step -> val loss"""

    @property
    def label(self) -> str:
        changed = [f"{k}={v}" for k, v in self.numerics.items() if v != DEFAULT_NUMERICS[k]]
        return " ".join(changed) or "default"

    @property
    def final(self) -> float:
        return self.val[max(self.val)]

    @property
    def minimum(self) -> float:
        return min(self.val.values())


def load_curve(run_dir: str | Path) -> Curve:
    """One run's numerics (from its config.yaml) and its val-loss curve (from metrics.jsonl)."""
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        raise ValueError(f"{cfg_file}: missing (not a phase6 run directory)")
    cfg = yaml.safe_load(cfg_file.read_text())
    if cfg.get("job") != "pretrain":
        raise ValueError(f"{cfg_file}: job is {cfg.get('job')!r}, not pretrain")
    model = cfg.get("model", {})
    numerics = {k: model.get(k, DEFAULT_NUMERICS[k]) for k in NUMERICS}
    val = {int(r["step"]): float(r[metrics.VAL_LOSS]) for r in read_metrics(run_dir) if metrics.VAL_LOSS in r}
    if not val:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no {metrics.VAL_LOSS} rows (run with train.val_every > 0)")
    return Curve(run_dir, numerics, int(cfg.get("run", {}).get("seed", 0)), val)


def compare(curves: list[Curve], tol: float = 0.02) -> list[dict[str, Any]]:
    """One row per numerics group: mean final / minimum val loss, delta to the default group, verdict."""
    groups: dict[str, list[Curve]] = {}
    for c in curves:
        groups.setdefault(c.label, []).append(c)
    if "default" not in groups:
        raise ValueError("no run with the default numerics (model.float8=none, residual_dtype=fp32) to compare to")
    steps = {tuple(sorted(c.val)) for c in curves}
    if len(steps) > 1:
        raise ValueError(f"runs evaluated at different steps ({sorted(steps)[:2]}...): compare like with like")
    base = groups["default"]
    base_final = [c.final for c in base]
    base_min = [c.minimum for c in base]
    tol_final = max(tol, max(base_final) - min(base_final))
    tol_min = max(tol, max(base_min) - min(base_min))
    rows = []
    base_by_seed = {c.seed: c for c in base}
    for label, group in sorted(groups.items(), key=lambda kv: kv[0] != "default"):
        # paired: the same seed (same init, same data order) with and without the lever; what is left is the lever's
        # numerics plus kernel nondeterminism, without the seed-to-seed spread
        paired = [abs(c.val[s] - base_by_seed[c.seed].val[s]) for c in group if c.seed in base_by_seed for s in c.val]
        final = statistics.mean(c.final for c in group)
        minimum = statistics.mean(c.minimum for c in group)
        d_final = final - statistics.mean(base_final)
        d_min = minimum - statistics.mean(base_min)
        rows.append(
            {
                "numerics": label,
                "runs": len(group),
                "seeds": ",".join(str(c.seed) for c in group),
                "final_val_loss": round(final, 4),
                "min_val_loss": round(minimum, 4),
                "delta_final": round(d_final, 4),
                "delta_min": round(d_min, 4),
                "tolerance": f"{tol_final:.4f} / {tol_min:.4f}",
                "paired_max_abs_delta": round(max(paired), 4) if paired and label != "default" else None,
                "equal_loss": "reference"
                if label == "default"
                else ("yes" if abs(d_final) <= tol_final and abs(d_min) <= tol_min else "NO"),
            }
        )
    return rows


def curves_table(curves: list[Curve]) -> list[dict[str, Any]]:
    """Val loss per evaluation step, one row per run (what the verdict rests on)."""
    return [
        {"run": f"{c.label} (seed {c.seed})", **{f"step {s}": round(v, 4) for s, v in sorted(c.val.items())}}
        for c in sorted(curves, key=lambda c: (c.label != "default", c.label, c.seed))
    ]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="phase6 bench loss-parity", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", help="finished phase6 pretrain run directories")
    p.add_argument("--tol", type=float, default=0.02, help="floor of the tolerance in nats (default 0.02)")
    p.add_argument("--out", default=None, help="write both tables as JSON here")
    args = p.parse_args(argv)
    # a sweep member that crashed or was killed has no results.json: name it and leave it out (its curve stops
    # early, so it cannot be compared step for step), rather than failing the verdict of the runs that finished
    finished = [d for d in args.run_dirs if (Path(d) / "results.json").is_file()]
    for d in sorted(set(args.run_dirs) - set(finished)):
        print(f"left out: {d} (no results.json: the run did not finish)")
    if not finished:
        raise ValueError("no finished run among the given directories (none has results.json)")
    curves = [load_curve(d) for d in finished]
    rows = compare(curves, args.tol)
    detail = curves_table(curves)
    print("val loss per evaluation\n" + markdown_table(detail))
    print(f"\nequal-loss verdict (tolerance = max({args.tol}, spread of the default seeds); final / minimum)")
    print(markdown_table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"verdict": rows, "curves": detail}, indent=2))
