"""How much of a sim-vs-measured error is the C=1 calibration's sample: refit on bootstrap resamples of it.

    python scripts/repro/fleet_calibration_bootstrap.py outputs/gpu/tp1 --model outputs/models/qwen2.5-14b --hardware h200

`phase6 fleet experiment=compare` fits the step overhead, prefill MFU and prefill overhead on each TP's C=1 run
(phase6.fleet.compare.calibrate) from a few dozen requests, then predicts the higher concurrencies. This refits on
``-n`` resamples (with replacement) of those C=1 requests (their prompt/output lengths, TTFTs and TPOTs: the
step overhead is fitted to the resample's TPOT p50) and re-predicts every other run of the same TP, printing the 5/50/95th percentiles of the
fitted parameters and of each prediction's TTFT/TPOT p50 error. A cell whose interval straddles +-20 % is not
decided by the data at hand. Seeded (``--seed``); seconds per resample on a CPU.

Reproduces: docs/benchmarks.md § Fleet simulated vs measured: 6B torch-tp runs on one H200
Reproduces: docs/benchmarks.md § Fleet simulator vs the measured vLLM rows, per-profile engine costs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.fleet.compare import (
    MeasuredRun,
    calibrate,
    load_serve_bench,
    p50_ms,
    per_request_intercept,
    replay,
    replica_config,
    with_fit,
)
from phase6.fleet.run import FleetSetup, build_setup
from phase6.fleet.sim import EngineLimits


def _engine_for(run: MeasuredRun, cfg: FleetRunConfig, setup: FleetSetup) -> tuple[EngineConfig, EngineLimits]:
    """The replica the comparison simulates for ``run`` (phase6.fleet.compare.replica_config): its recorded batch
    limits and engine profile, KV capacity at the config's TP."""
    eng, lim, _, _ = replica_config(run, cfg, setup)
    return eng, lim


def request_tpot_ms(run: MeasuredRun) -> np.ndarray:
    """Per-request TPOT (ms; NaN for one-token answers) of the run's completed requests, aligned with its
    ``input_tokens`` (send order), from its requests.jsonl."""
    recs = [json.loads(line) for line in (run.run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    tpot = [(r["index"], r.get("tpot_s")) for r in recs if r["ok"]]
    return np.asarray([1e3 * t if isinstance(t, (int, float)) else np.nan for _, t in sorted(tpot)], dtype=float)


def bootstrap(path: str | Path, model: str, hardware: str, n: int, seed: int = 0) -> list[dict[str, float | int | str]]:
    """One row per (TP, quantity): the 5th/50th/95th percentile over ``n`` refits on resampled C=1 requests."""
    hw = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / f"{hardware}.yaml").read_text()))
    runs, _ = load_serve_bench(path)
    rows: list[dict[str, float | int | str]] = []
    for tp in sorted({int(r.row.get("tp") or 1) for r in runs}):
        cfg = FleetRunConfig(hardware=hw, model=model, engine=EngineConfig(tp=tp))
        setup = build_setup(cfg)
        mine = sorted((r for r in runs if int(r.row.get("tp") or 1) == tp), key=lambda r: r.concurrency)
        if mine[0].concurrency != 1:
            raise ValueError(f"{path}: TP={tp} has no concurrency-1 run to calibrate on")
        c1 = mine[0]
        eng1, lim1 = _engine_for(c1, cfg, setup)
        tpot_ms = request_tpot_ms(c1)
        assert len(tpot_ms) == len(c1.input_tokens)
        rng = np.random.default_rng(seed)
        samples: dict[str, list[float]] = {}
        for _ in range(n):
            i = rng.integers(0, len(c1.input_tokens), len(c1.input_tokens))
            resampled = dataclasses.replace(
                c1,
                row={**c1.row, "tpot_p50_ms": float(np.nanmedian(tpot_ms[i]))},
                input_tokens=c1.input_tokens[i],
                output_tokens=c1.output_tokens[i],
                ttft_ms=c1.ttft_ms[i],
            )
            fit = calibrate(setup, resampled, eng1, lim1)
            intercept = "request_overhead_ms" if per_request_intercept(eng1) else "prefill_overhead_ms"
            for k in ("step_overhead_ms", intercept, "prefill_mfu"):
                samples.setdefault(k, []).append(getattr(fit, k))
            for run in mine[1:]:
                eng, lim = _engine_for(run, cfg, setup)
                eng = with_fit(eng, fit)
                ttft, tpot = p50_ms(replay(setup, run, eng, lim))
                samples.setdefault(f"C={run.concurrency} ttft_err_pct", []).append(
                    100 * (ttft / float(run.row["ttft_p50_ms"]) - 1)
                )
                samples.setdefault(f"C={run.concurrency} tpot_err_pct", []).append(
                    100 * (tpot / float(run.row["tpot_p50_ms"]) - 1)
                )
        for k, v in samples.items():
            p5, p50, p95 = np.percentile(v, [5, 50, 95])
            rows.append(
                {"tp": tp, "quantity": k, "p5": float(p5), "p50": float(p50), "p95": float(p95), "resamples": n}
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", help="serve-bench sweep dir (or run dir) as for analysis.compare_with")
    ap.add_argument("--model", required=True, help="planner preset or HF config.json / model dir (as model=)")
    ap.add_argument("--hardware", default="h200", help="configs/hardware/<name>.yaml the runs were measured on")
    ap.add_argument("-n", type=int, default=200, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rows = bootstrap(a.path, a.model, a.hardware, a.n, a.seed)
    print(f"C=1 calibration bootstrap ({a.n} resamples of the C=1 requests), {a.path}:")
    print("| tp | quantity | p5 | p50 | p95 |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tp']} | {r['quantity']} | {r['p5']:.3g} | {r['p50']:.3g} | {r['p95']:.3g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
