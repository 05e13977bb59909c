"""Simulated vs measured: replay each closed-loop row of a `phase6 serve-bench` results.json in the simulator.

Protocol (issue 8, validation): for every measured row (engine, tp, concurrency C) simulate one colocated replica of
the same TP with C closed-loop clients and the row's request count, then compare TTFT p50, TPOT p50 and output
throughput; a row passes when both latencies are within 20 %. Request lengths: the configured workload's requests
(``analysis.compare_lengths=workload``; mirror 6B's length distribution, the table shows both means), or every
request at the row's means (``mean``: identical requests make a closed loop run in lockstep, all C clients
finishing and re-arriving together, which inflates TTFT).

Calibration (``calibrate=True``, default): two planner parameters are fitted on the *lowest-concurrency* row only
and then held for every other row, so C=16/64 are predictions, not fits:
  step_overhead_ms = TPOT@C1 - (memory + all-reduce time of a batch-1 decode step at the mean context)   (>= 0)
  prefill_mfu      scaled so the compute part of a one-prompt prefill step equals TTFT@C1 - all-reduce - overhead
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.fleet.sim import Topology
from phase6.fleet.steptime import planner_model, read_serve_bench_rows
from phase6.fleet.workload import Workload
from phase6.plan.model import ModelSpec

TOLERANCE = 0.20
"""Relative error a simulated TTFT/TPOT p50 may have against the measurement (issue 8)."""


def _row_lengths(row: dict[str, Any], where: str) -> tuple[int, int, int]:
    """(mean prompt tokens, mean output tokens, completed requests) of a serve-bench row."""
    done = row.get("completed")
    if not isinstance(done, (int, float)) or done < 1:
        raise ValueError(f"{where}: needs 'completed' >= 1, got {done!r}")
    inp, out = row.get("input_tokens"), row.get("mean_output_tokens")
    if not isinstance(inp, (int, float)) or not isinstance(out, (int, float)) or not math.isfinite(out):
        raise ValueError(f"{where}: needs numeric 'input_tokens' and 'mean_output_tokens'")
    return max(1, round(inp / done)), max(2, round(out)), int(done)


def check_serve_bench(path: str | Path) -> None:
    """Fail early (one line) if a serve-bench table cannot be replayed."""
    for r in read_serve_bench_rows(path):
        _row_lengths(r, f"{path}: row concurrency={r['concurrency']}")


def calibrate(spec: ModelSpec, cfg: FleetRunConfig, engine: EngineConfig, row: dict[str, Any],
              inp: int, out: int) -> EngineConfig:
    """Fit step_overhead_ms (from TPOT p50) and prefill_mfu (from TTFT p50) on one low-concurrency row."""
    base = dataclasses.replace(engine, step_overhead_ms=0.0)
    m = planner_model(spec, cfg.hardware, base)
    ctx = inp + out // 2
    decode_wo_overhead = m.step_s(0, 0.0, 1, ctx)
    overhead_s = max(0.0, float(row["tpot_p50_ms"]) / 1e3 - decode_wo_overhead)
    pairs = inp * (inp + 1) / 2
    compute = m.compute_s(inp, pairs)
    target = float(row["ttft_p50_ms"]) / 1e3 - m.allreduce_s(inp) - overhead_s
    mfu = base.prefill_mfu
    if target > m.memory_s(inp, 0) and target > 0:  # compute-bound prefill: compute time scales as 1 / mfu
        mfu = min(1.0, max(1e-3, base.prefill_mfu * compute / target))
    return dataclasses.replace(engine, step_overhead_ms=overhead_s * 1e3, prefill_mfu=mfu)


def compare_serve_bench(path: str | Path, cfg: FleetRunConfig, setup: Any, calibrate_rows: bool = True,
                        workload: Workload | None = None) -> list[dict[str, Any]]:
    """One row per measured closed-loop row: measured vs simulated TTFT/TPOT p50 and throughput, errors, pass."""
    from phase6.fleet.run import FleetSetup  # local: run imports this module lazily too

    assert isinstance(setup, FleetSetup)
    rows = read_serve_bench_rows(path)
    rows.sort(key=lambda r: (r.get("tp") or cfg.engine.tp, r["concurrency"]))
    out_rows: list[dict[str, Any]] = []
    calibrated: dict[int, tuple[int, EngineConfig]] = {}  # tp -> (concurrency fitted on, engine)
    for r in rows:
        where = f"{path}: row concurrency={r['concurrency']}"
        tp = int(r.get("tp") or cfg.engine.tp)
        inp, out, n = _row_lengths(r, where)
        engine = dataclasses.replace(cfg.engine, tp=tp, step_time="planner", table_path=None)
        if calibrate_rows:
            if tp not in calibrated:  # the lowest concurrency of this TP (rows are sorted)
                calibrated[tp] = (int(r["concurrency"]), calibrate(setup.spec, cfg, engine, r, inp, out))
            engine = calibrated[tp][1]
        s = dataclasses.replace(setup, model=planner_model(setup.spec, cfg.hardware, engine), engine=engine)
        c = int(r["concurrency"])
        if workload is None:  # every request at the row's means
            w = Workload(np.zeros(n), np.full(n, inp, dtype=np.int64), np.full(n, out, dtype=np.int64),
                         np.arange(n, dtype=np.int64), None, f"{path} (C={c})")
        else:  # the configured workload's first n requests (timestamps unused: closed loop)
            w = workload.repeated(-(-n // len(workload))).head(n)
        res = s.run(w, Topology(colocated=1), "round_robin", closed=c)
        sim_ttft = float(np.median(res.ttft_s)) * 1e3
        sim_tpot = float(np.median(res.tpot_s)) * 1e3
        sim_tok_s = float(res.output_tokens.sum()) / res.makespan_s
        e_ttft = sim_ttft / float(r["ttft_p50_ms"]) - 1
        e_tpot = sim_tpot / float(r["tpot_p50_ms"]) - 1
        meas_tok = r.get("throughput_tok_s")
        out_rows.append({
            "engine": r.get("engine"), "tp": tp, "concurrency": c, "input_tokens": inp, "output_tokens": out,
            "sim_mean_input_tokens": float(w.input_tokens.mean()),
            "sim_mean_output_tokens": float(w.output_tokens.mean()), "requests": n, "ttft_p50_ms_measured": float(r["ttft_p50_ms"]), "ttft_p50_ms_sim": sim_ttft,
            "ttft_err_pct": 100 * e_ttft, "tpot_p50_ms_measured": float(r["tpot_p50_ms"]), "tpot_p50_ms_sim": sim_tpot,
            "tpot_err_pct": 100 * e_tpot, "throughput_tok_s_measured": meas_tok, "throughput_tok_s_sim": sim_tok_s,
            "within_20pct": abs(e_ttft) <= TOLERANCE and abs(e_tpot) <= TOLERANCE,
            "calibration": (f"fitted at C={calibrated[tp][0]}: step overhead {engine.step_overhead_ms:.2f} ms, "
                            f"prefill_mfu {engine.prefill_mfu:.3f}") if calibrate_rows else "none (planner defaults)",
        })
    return out_rows
