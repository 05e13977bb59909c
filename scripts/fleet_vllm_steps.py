"""What a measured vLLM serve-bench sweep says about the fleet simulator's vllm profile, step by step.

    python scripts/fleet_vllm_steps.py <vLLM sweep dir> <model dir or config.json> [hardware]

vLLM streams every running request's token at the end of each engine step, so the client's chunk times cluster by
step (within 2 ms; ``phase6.fleet.steps`` does the same for torch-tp): a cluster is one step, the gap from the
previous cluster its duration, the first tokens in it the prompts it finished and the other chunks its decode rows
(request at token j: context prompt + j). Three checks, each against the planner roofline with no step overhead:

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
from phase6.fleet.steptime import planner_model, prefill_pairs

TOL_S = 0.002
ITL_Q = (25, 50, 75, 90, 99)


def clusters(run_dir: Path) -> list[dict]:
    """The run's steps: end time, duration (ms), prompts whose first token it emitted, decode rows, context sum."""
    ev = []
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("ok") and r.get("chunk_times_s"):
            ev += [(r["send_s"] + t, j, r["prompt_tokens"]) for j, t in enumerate(r["chunk_times_s"])]
    ev.sort()
    out: list[dict] = []
    last = -np.inf
    for t, j, p in ev:
        if t - last > TOL_S:
            out.append({"t": t, "prompts": [], "rows": 0, "ctx": 0})
        s = out[-1]
        if j == 0:
            s["prompts"].append(p)
        else:
            s["rows"] += 1
            s["ctx"] += p + j
        last = t
    for a, b in zip(out, out[1:], strict=False):
        b["dur"] = 1e3 * (b["t"] - a["t"])
    return out[1:]


def measured_itl_ms(run_dir: Path) -> np.ndarray:
    gaps = []
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("ok") and len(r.get("chunk_times_s") or ()) > 1:
            gaps.append(np.diff(r["chunk_times_s"]))
    return 1e3 * np.concatenate(gaps)


def sim_itl_ms(res: SimResult) -> np.ndarray:
    """Every token gap of a one-replica replay: the gap to token 2, then each logged decode event's steps."""
    (log,) = res.logs.values()
    start, end, k = np.asarray(log.start), np.asarray(log.end), np.asarray(log.k)
    prev_end = np.concatenate([[np.nan], end[:-1]])
    step = (end - start) / k
    gaps = []
    for i in range(len(res.arrival_s)):
        f, j, fin = res.first_token_s[i], res.join_s[i], res.finish_s[i]
        if not np.isfinite(j) or fin <= f:
            continue
        sel = (start >= j - 1e-12) & (end <= fin + 1e-12)
        idx = np.flatnonzero(sel)
        if not len(idx):
            continue
        first = start[idx[0]] + step[idx[0]] - f  # to token 2: the end of its first decode step
        g = [first, *np.repeat(step[idx[0]], k[idx[0]] - 1)]
        for e in idx[1:]:
            lead = max(0.0, start[e] - prev_end[e]) if np.isfinite(prev_end[e]) else 0.0
            g += [step[e] + lead, *np.repeat(step[e], k[e] - 1)]
        gaps.append(np.asarray(g))
    return 1e3 * np.concatenate(gaps)


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
        cl = clusters(run.run_dir)
        c = run.concurrency
        sel = [
            s
            for i, s in enumerate(cl)
            if 0 < i < len(cl) - 1
            and s["rows"] == c
            and not (s["prompts"] or cl[i - 1]["prompts"] or cl[i + 1]["prompts"])
        ]
        meas = np.array([s["dur"] for s in sel])
        model = np.array([1e3 * m0.step_s(0, 0, s["rows"], s["ctx"]) for s in sel])
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
        cl = clusters(run.run_dir)
        meas, pred = [], {k: [] for k in models}
        for i in range(2, len(cl) - 1):
            s, pv = cl[i], cl[i - 1]
            if len(s["prompts"]) != 1 or pv["prompts"] or cl[i - 2]["prompts"] or cl[i + 1]["prompts"]:
                continue
            if not (s["rows"] and pv["rows"]):
                continue
            p = s["prompts"][0]
            meas.append(s["dur"] + pv["dur"])
            for k, m in models.items():
                mixed = m.step_s(p, prefill_pairs(0, p), pv["rows"], pv["ctx"])
                pred[k].append(1e3 * (mixed + m.step_s(0, 0, s["rows"], s["ctx"])))
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
