"""What a measured vLLM serve-bench sweep says about the fleet simulator's vllm profile, step by step.

    python scripts/repro/fleet_vllm_steps.py <vLLM sweep dir> <model dir or config.json> [hardware]

vLLM streams every running request's token at the end of each engine step, so the client's chunk times cluster by
step (within 2 ms), as on phase6's torch-tp server: ``phase6.fleet.steps.run_steps`` recovers the steps (duration,
prompts finished, decode rows and their context). Three checks, each against the planner roofline with no step overhead:

1. decode-only steps (no first token in the cluster or its neighbours) per decode-row count: measured p50, roofline
   p50 and their difference; the per-row cost (``engine.decode_seq_ms``) is the least-squares slope of those
   differences over rows (medians of the 1 / 16 / 64-row groups, the full batch of each run);
2. isolated prefills (a cluster with one first token and no first token in the two clusters before or the one
   after): on vLLM 0.26 the prompt's long step is sometimes the cluster of its first token and sometimes the one
   before, so the two clusters' durations are summed and compared with the model's mixed step (the prompt + the
   earlier cluster's decode rows) plus one decode-only step (the later cluster's rows), with ``mixed_step`` serial and
   overlap, at the prefill MFU of the C=1 fit;
3. the calibrated replay of every run (as ``phase6 fleet experiment=compare`` does) with serial and with overlap
   mixed steps: TPOT p50 and the per-token gap (ITL) percentiles beside the measured ones.

Reproduces: docs/benchmarks.md § Fleet simulator vs the measured vLLM rows, per-profile engine costs
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.fleet import compare as cmp
from phase6.fleet.run import build_setup
from phase6.fleet.sim import SimResult
from phase6.fleet.steps import run_steps
from phase6.fleet.steptime import planner_model, prefill_pairs
from phase6.fleet.tokens import request_gaps

ITL_Q = (25, 50, 75, 90, 99)


def measured_itl_ms(run_dir: Path) -> np.ndarray:
    gaps = []
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("ok") and len(r.get("chunk_times_s") or ()) > 1:
            gaps.append(np.diff(r["chunk_times_s"]))
    return 1e3 * np.concatenate(gaps)


def sim_itl_ms(res: SimResult) -> np.ndarray:
    """Every token gap of a one-replica replay (``phase6.fleet.tokens``: from the replica's decode-step log)."""
    (log,) = res.logs.values()
    times = zip(res.first_token_s, res.join_s, res.finish_s, strict=True)
    return 1e3 * np.concatenate([request_gaps(log, f, j, fin) for f, j, fin in times if np.isfinite(j) and fin > f])


def main(sweep: str, model: str, hardware: str = "h200") -> None:
    hw = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / f"{hardware}.yaml").read_text()))
    cfg = FleetRunConfig(hardware=hw, model=model, engine=EngineConfig(tp=1))
    setup = build_setup(cfg)
    runs = sorted(cmp.load_serve_bench(sweep)[0], key=lambda r: r.concurrency)
    c1 = runs[0]
    engine, limits, _, desc = cmp.replica_config(c1, cfg, setup, "vllm")
    fit, fdesc = cmp.calibration(setup, c1, engine, limits, "requests", desc)
    print(f"C=1 calibration: {fdesc}\n")

    print("1. decode-only steps vs the roofline (no step overhead, no per-row cost)")
    print(
        "| C | rows | steps | measured p50 ms | roofline p50 ms | measured - roofline ms |\n|---|---|---|---|---|---|"
    )
    bare = dataclasses.replace(fit, step_overhead_ms=0.0, decode_seq_ms=0.0, mixed_step="serial")
    m0 = planner_model(setup.spec, hw, bare)
    pts = []
    for run in runs:
        cl = run_steps(run.run_dir)[1:]  # the first step has no duration
        c = run.concurrency
        sel = [
            s
            for i, s in enumerate(cl)
            if 0 < i < len(cl) - 1 and s.decode_rows == c and not (s.prompts or cl[i - 1].prompts or cl[i + 1].prompts)
        ]
        meas = np.array([1e3 * s.duration_s for s in sel])
        model = np.array([1e3 * m0.step_s(0, 0, s.decode_rows, s.decode_ctx) for s in sel])
        d = float(np.median(meas - model))
        pts.append((c, d))
        print(f"| {c} | {c} | {len(sel)} | {np.median(meas):.2f} | {np.median(model):.2f} | {d:+.2f} |")
    x, y = np.array(pts, dtype=float).T
    slope, icpt = np.polyfit(x, y, 1)
    print(f"least squares over the rows: {slope:.4f} ms per decode row, {icpt:+.2f} ms at 0 rows\n")

    print("2. isolated prefills: the two clusters around the first token, summed (ms)")
    print("| C | prefills | measured mean | serial mean (error) | overlap mean (error) |\n|---|---|---|---|---|")
    models = {k: planner_model(setup.spec, hw, dataclasses.replace(fit, mixed_step=k)) for k in ("serial", "overlap")}
    for run in runs[1:]:
        cl = run_steps(run.run_dir)[1:]  # the first step has no duration
        meas, pred = [], {k: [] for k in models}
        for i in range(2, len(cl) - 1):
            s, pv = cl[i], cl[i - 1]
            if len(s.prompts) != 1 or pv.prompts or cl[i - 2].prompts or cl[i + 1].prompts:
                continue
            if not (s.decode_rows and pv.decode_rows):
                continue
            p = s.prompts[0]
            meas.append(1e3 * (s.duration_s + pv.duration_s))
            for k, m in models.items():
                mixed = m.step_s(p, prefill_pairs(0, p), pv.decode_rows, pv.decode_ctx)
                pred[k].append(1e3 * (mixed + m.step_s(0, 0, s.decode_rows, s.decode_ctx)))
        mm = float(np.mean(meas))
        cells = " | ".join(f"{np.mean(v):.2f} ({100 * (np.mean(v) / mm - 1):+.1f} %)" for v in pred.values())
        print(f"| {run.concurrency} | {len(meas)} | {mm:.2f} | {cells} |")

    print("\n3. calibrated replays: TPOT p50 and per-token gap percentiles (ms)")
    qs = " / ".join(f"p{q}" for q in ITL_Q)
    print(f"| C | source | TPOT p50 | ITL {qs} | ITL mean |\n|---|---|---|---|---|")
    for run in runs:
        itl = measured_itl_ms(run.run_dir)
        row = " / ".join(f"{v:.1f}" for v in np.percentile(itl, ITL_Q))
        print(f"| {run.concurrency} | measured | {run.row['tpot_p50_ms']:.2f} | {row} | {itl.mean():.2f} |")
        for k in ("serial", "overlap"):
            eng, lim, _, _ = cmp.replica_config(run, cfg, setup, "vllm")
            res = cmp.replay(setup, run, cmp.with_fit(dataclasses.replace(eng, mixed_step=k), fit), lim)
            itl = sim_itl_ms(res)
            row = " / ".join(f"{v:.1f}" for v in np.percentile(itl, ITL_Q))
            print(f"| {run.concurrency} | sim, {k} | {cmp.p50_ms(res)[1]:.2f} | {row} | {itl.mean():.2f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(*sys.argv[1:4])
