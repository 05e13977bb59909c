"""Muon vs AdamW at equal tokens: val-loss curves of `phase6 pretrain` runs, paired by seed -> table + plot.

    python scripts/repro/muon_compare.py outputs/pretrain/<sweep>/* --out compare.json --plot docs/muon_vs_adamw.png

Each run directory gives its recipe (optim.algorithm in config.yaml), seed (run.seed), val/loss against
data/tokens_seen (metrics.jsonl) and its measured tokens/s (results.json). Reported, over the seeds that both
recipes ran:
- tokens Muon needs to reach AdamW's final val loss (linear interpolation between Muon's val points), as a
  fraction of AdamW's token budget, per seed;
- the val-loss gap Muon - AdamW at every val point (equal tokens), mean and standard deviation over the seeds.

Reproduces: docs/benchmarks.md § 6A Muon vs AdamW
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml


def load_run(run_dir: Path) -> dict[str, Any]:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    tokens_per_step = cfg["train"]["global_batch_tokens"]
    val: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("val/loss") is not None:
            val[rec["step"] * tokens_per_step] = rec["val/loss"]  # a resumed run's last value wins
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
    return {
        "dir": str(run_dir),
        "recipe": cfg["optim"].get("algorithm", "adamw"),
        "seed": cfg["run"]["seed"],
        "val": sorted(val.items()),
        "tokens_per_s": results.get("measured", {}).get("perf/tokens_per_s"),
    }


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """First token count at which the (linearly interpolated) val curve is <= target; None if it never is."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:], strict=False):
        if l1 <= target:
            return t1 if l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(r["recipe"], r["seed"]): r for r in runs}
    seeds = sorted({s for (_, s) in by if ("adamw", s) in by and ("muon", s) in by})
    if not seeds:
        raise SystemExit("no seed has both an adamw and a muon run")
    per_seed, gaps = [], {}
    for s in seeds:
        a, m = by[("adamw", s)]["val"], by[("muon", s)]["val"]
        budget, a_final = a[-1]
        reach = tokens_to_reach(m, a_final)
        per_seed.append(
            {
                "seed": s,
                "adamw_final": a_final,
                "muon_final": m[-1][1],
                "muon_tokens_to_adamw_final": reach,
                "fraction_of_budget": reach / budget if reach is not None else None,
            }
        )
        m_at = dict(m)
        for t, la in a:
            if t in m_at:
                gaps.setdefault(t, []).append(m_at[t] - la)
    fr = [p["fraction_of_budget"] for p in per_seed if p["fraction_of_budget"] is not None]
    gap_rows = [
        {
            "tokens": t,
            "gap_mean": statistics.mean(g),
            "gap_sd": statistics.stdev(g) if len(g) > 1 else 0.0,
            "n": len(g),
        }
        for t, g in sorted(gaps.items())
    ]
    tps = {
        rec: statistics.mean([r["tokens_per_s"] for r in runs if r["recipe"] == rec and r["tokens_per_s"]] or [0])
        for rec in ("adamw", "muon")
    }
    return {
        "seeds": seeds,
        "per_seed": per_seed,
        "fraction_mean": statistics.mean(fr) if fr else None,
        "fraction_range": [min(fr), max(fr)] if fr else None,
        "final_gap": gap_rows[-1] if gap_rows else None,
        "gaps": gap_rows,
        "tokens_per_s": tps,
        "runs": runs,
    }


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for recipe, color in (("adamw", "tab:blue"), ("muon", "tab:red")):
        curves = [r["val"] for r in runs if r["recipe"] == recipe and r["seed"] in summary["seeds"]]
        for i, c in enumerate(curves):
            t, v = zip(*[(t / 1e6, v) for t, v in c if t > 0], strict=True)
            ax.plot(t, v, color=color, alpha=0.8, lw=1, label=f"{recipe} ({len(curves)} seeds)" if i == 0 else None)
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("val loss (nats/token, held-out enwiki)")
    ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    frac = summary.get("fraction_mean")
    title = "GPT-2 124M, Muon vs AdamW at equal tokens"
    if frac:
        title += f"\nMuon reaches AdamW's final val loss at {frac:.2f}x the tokens"
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args()
    runs = [load_run(d) for d in args.runs if (d / "metrics.jsonl").exists()]
    summary = compare(runs)
    for row in summary["per_seed"]:
        print(json.dumps(row))
    print(
        f"Muon tokens to AdamW's final val loss / budget: mean {summary['fraction_mean']}, range "
        f"{summary['fraction_range']}; final gap {summary['final_gap']}; tokens/s {summary['tokens_per_s']}"
    )
    for g in summary["gaps"]:
        print(f"  {g['tokens']:>10,d} tokens: muon - adamw = {g['gap_mean']:+.4f} +- {g['gap_sd']:.4f} (n={g['n']})")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    if args.plot:
        plot(runs, summary, args.plot)


if __name__ == "__main__":
    main()
