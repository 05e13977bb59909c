"""One markdown table from the ``projects/6d_grpo/bench.py --part step`` JSONs of scripts/repro/h200_grpo_step.sh.

Reproduces docs/benchmarks.md, "6D at the roofline: the GRPO step before / after / TRL stock (issue 31)".

    python scripts/repro/grpo_step_summary.py DIR_WITH_JSONS

Per run: seconds per phase (mean of the timed steps) with its % of bound in brackets, the step, peak memory. A run
whose JSON has no bounds (the 'before' tree predates them) is held against the bounds of a run that has them, same
prompts (seed 0) and shape: its tokens per step are the same up to the sampled completion lengths; marked with *.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from phase6.posttrain.grpo_timing import Ceilings, ModelShape, phase_bounds  # noqa: E402

PHASES = ("rollout", "weight_sync", "ref_logprobs", "policy_update", "other", "step")


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        raise SystemExit("usage: grpo_step_summary.py DIR_WITH_JSONS")
    runs = {}

    def rank(f: Path) -> tuple[int, str]:  # before, after, after + lever variants, stock
        n = f.stem
        return (0 if "before" in n else 3 if "stock" in n else 1 if n.endswith("_after") else 2, n)

    for f in sorted(Path(sys.argv[1]).glob("*.json"), key=rank):
        try:
            runs[f.stem] = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"{f.name}: unreadable ({e})")
    if not runs:
        print("no step JSON came back (every part failed or was skipped: see parts.txt and the logs)")
        return
    donor = next((r["step_extras"] for r in runs.values() if r.get("step_extras", {}).get("bounds")), None)
    if donor:
        c = donor["ceilings"]
        print(f"ceilings: bf16 8192^3 matmul {c['matmul_tflops']} TFLOP/s, device copy {c['copy_tb_per_s']} TB/s")
    table_lines = ["| run | " + " | ".join(f"{p} s (% bound)" for p in PHASES) + " | peak GiB | timed steps |"]
    table_lines.append("|---|" + "---|" * (len(PHASES) + 2))
    main_run: tuple[str, dict, dict] | None = None
    for name, r in runs.items():
        table = {row["phase"]: row for row in r.get("step", [])}
        extras = r.get("step_extras", {})
        bounds, star = extras.get("bounds"), ""
        if not bounds and donor:
            shape = r.get("shape", {})
            steps = shape.get("prompts", 64) * shape.get("group", 8) // shape.get("micro_batch_size", 16)
            bounds = phase_bounds(
                donor["tokens_per_step"],
                ModelShape(**donor["model_shape"]),
                Ceilings(donor["ceilings"]["matmul_tflops"] * 1e12, donor["ceilings"]["copy_tb_per_s"] * 1e12),
                ref_forward=True,
                sync_bytes=donor["bounds"].get("weight_sync", {}).get("bytes", 0.0) / 2,
                micro_steps=steps,
            )
            star = "*"
        if name.endswith("_after") and bounds:
            main_run = (name, table, bounds)
        cells = []
        for p in PHASES:
            row = table.get(p)
            if not row:
                cells.append("–")
                continue
            s = row["mean_s_per_step"]
            b = (bounds or {}).get(p)
            cells.append(f"{s:.2f} ({100 * b['bound_s'] / s:.0f}{star})" if b and s else f"{s:.2f}")
        peak = table.get("peak GPU memory (GiB, torch allocator)", {}).get("gib")
        timed = len(r.get("step_rows", [])) - 1
        table_lines.append(f"| {name} | " + " | ".join(cells) + f" | {peak if peak is not None else '–'} | {timed} |")
    lp = next(
        (r["step_extras"].get("liger_parity") for r in runs.values() if "liger_parity" in r.get("step_extras", {})),
        None,
    )
    if lp and "error" in lp:
        print(f"\nliger parity: error {lp['error']} (runs continued with --liger off)")
    elif lp:
        print(
            f"\nliger parity (bf16 vs fp32 of the same model, mean |d logp|): transformers {lp['logp_mean_abs_err_hf_bf16']:.2e}, "
            f"liger {lp['logp_mean_abs_err_liger_bf16']:.2e}; grad rel err {lp['grad_rel_err_hf_bf16']:.2e} vs "
            f"{lp['grad_rel_err_liger_bf16']:.2e}; pass {lp['pass']}"
        )
    for name, r in runs.items():
        extras = r.get("step_extras", {})
        if extras.get("levers"):
            print(f"{name}: levers {json.dumps(extras['levers'])}")
        if extras.get("lever_parity"):
            print(f"{name}: layout parity (bf16, vs the plain padded pass) {json.dumps(extras['lever_parity'])}")
    for name, r in runs.items():
        for row in r.get("step", []):
            if row["phase"].startswith("logp mismatch"):
                print(f"{name}: {row['phase']}: mean {row['mean']:.4f}, max {row['max']:.3f}, {row['tokens']} tokens")
        sp = r.get("step_extras", {}).get("sampler_parity")
        if sp:
            print(f"{name}: fused sampler parity {json.dumps(sp)}")
    # the tables last (the output tail is what gets read): every run, then the new default run phase by phase
    print()
    print("\n".join(table_lines))
    if main_run:
        name, table, bounds = main_run
        print(f"\n{name} (new defaults), mean of its timed steps:\n")
        print("| phase | s | bound s | % of bound |\n|---|---|---|---|")
        for p in PHASES:
            row, b = table.get(p), bounds.get(p)
            if not row:
                continue
            sec = row["mean_s_per_step"]
            pct = f"{100 * b['bound_s'] / sec:.0f}" if b and sec else "–"
            print(f"| {p} | {sec:.2f} | {b['bound_s']:.2f} | {pct} |" if b else f"| {p} | {sec:.2f} | – | – |")


if __name__ == "__main__":
    main()
