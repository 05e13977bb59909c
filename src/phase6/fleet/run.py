"""`phase6 fleet`: simulate serving policies x routers x load on a trace; goodput, hit rate, replicas, cost, PD grid.

    phase6 fleet                                                     # synthetic mix, Llama-3.1-70B TP4 on H100
    phase6 fleet workload=mooncake load.rates=[2,4,8] fleet.replicas=16
    phase6 fleet workload=azure analysis.target_rate=20              # + fewest replicas for 20 req/s within SLO
    phase6 fleet experiment=pd_grid                                  # the 'when PD disaggregation pays' table
    phase6 fleet -m slo.tpot_ms=50,100,200                           # a Hydra sweep over SLOs
    phase6 fleet experiment=compare analysis.compare_with=<serve-bench run or sweep dir> model=... hardware=...

Writes the run record (config.yaml, env.json, metrics.jsonl, results.json/.md, plots/) and prints the run dir last.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from phase6.config import CONFIG_DIR
from phase6.config.fleet import FleetRunConfig, FleetWorkloadConfig, parse_policy
from phase6.config.slo import SLOConfig
from phase6.cost import run_cost
from phase6.figures import save_figure
from phase6.fleet.analysis import RateSearch, max_rate_within_slo, meets, min_replicas, pd_reason, summarize
from phase6.fleet.engines import TorchTPStepTime
from phase6.fleet.sessions import concentration_warning
from phase6.fleet.setup import FleetSetup, host_tiers, pd_pools  # noqa: F401 (re-export)
from phase6.fleet.sim import EngineLimits, Topology
from phase6.fleet.steptime import build_step_model, kv_capacity_blocks
from phase6.fleet.workload import (
    RequestClass,
    Workload,
    fixed_lengths,
    load_azure,
    load_mooncake,
    synthetic,
)
from phase6.metrics import (
    SERVE_GOODPUT_REQ_S,
    SERVE_THROUGHPUT_TOK_S,
    SERVE_TPOT_MS_P50,
    SERVE_TPOT_MS_P99,
    SERVE_TTFT_MS_P50,
    SERVE_TTFT_MS_P99,
)
from phase6.plan.model import ModelSpec, resolve_model

# Fleet metric keys (metrics.jsonl / W&B); the serve/* ones are phase6.metrics' names for the same quantities.
FLEET_RATE = "fleet/rate_req_s"
FLEET_SLO_ATTAINMENT = "fleet/slo_attainment"
FLEET_PREFIX_HIT_RATE = "fleet/prefix_hit_rate"
FLEET_USD_PER_1M_OUT = "fleet/usd_per_1m_output_tokens"
FLEET_SIM_REQ_PER_S = "fleet/sim_requests_per_s"

ROW_KEYS = (
    "offered_rate",
    "num_gpus",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "slo_attainment",
    "goodput_req_s",
    "throughput_tok_s",
    "prefix_hit_rate",
    "usd_per_1m_output_tokens",
    "usd_per_1m_tokens",
)
"""Columns of the main results table; every other summary column goes to the 'Details' table."""


def model_spec(model: str) -> ModelSpec:
    """A planner preset name, or a path to an HF config.json (or its directory), e.g. 6B's dummy model dir."""
    if model.endswith(".json") or "/" in model:
        return resolve_model({}, hf_config=model)
    return resolve_model(model)


def build_setup(cfg: FleetRunConfig) -> FleetSetup:
    spec = model_spec(cfg.model)
    eng = cfg.engine
    limits = EngineLimits(
        eng.max_num_seqs,
        eng.max_num_batched_tokens,
        kv_capacity_blocks(spec, cfg.hardware, eng),
        eng.chunked_prefill,
        eng.kv_alloc == "incremental",
    )
    return FleetSetup(
        spec,
        build_step_model(spec, cfg.hardware, eng),
        limits,
        cfg.hardware,
        eng,
        cfg.fleet.kv_link,
        cfg.fleet.sim_engine,
        seed=cfg.run.seed,
    )


def load_workload(wc: FleetWorkloadConfig, seed: int) -> tuple[Workload, int]:
    """The configured workload (repeated, long requests dropped); returns (workload, requests dropped)."""
    if wc.kind == "mooncake":
        assert wc.path is not None
        w = load_mooncake(wc.path, wc.limit)
    elif wc.kind == "azure":
        assert wc.path is not None
        w = load_azure(wc.path, wc.limit)
    else:
        classes = [RequestClass(c.weight, c.input_min, c.input_max, c.output_min, c.output_max) for c in wc.classes]
        w = synthetic(
            wc.limit or wc.num_requests,
            wc.rate,
            classes,
            seed,
            burstiness=wc.burstiness,
            prefix_groups=wc.prefix_groups,
            prefix_tokens=wc.prefix_tokens,
            zipf_alpha=wc.zipf_alpha,
            turns=wc.turns,
            think_time_s=wc.think_time_s,
        )
    w = w.repeated(wc.repeat)
    dropped = 0
    if wc.max_tokens is not None:
        w, dropped = w.filtered(wc.max_tokens)
        if len(w) < 2:
            raise ValueError(f"workload.max_tokens: {wc.max_tokens} leaves {len(w)} requests of {w.source}")
    return w, dropped


def papers_data() -> Path:
    """The shared traces the papers table needs ($PHASE6_SHARED_DATA, else ../shared/data); ValueError if absent."""
    env = os.environ.get("PHASE6_SHARED_DATA")
    root = Path(env) if env else CONFIG_DIR.parent.parent / "shared" / "data"
    need = [
        root / "mooncake-traces" / "synthetic_trace.jsonl",
        root / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv",
    ]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise ValueError(f"analysis.papers: trace(s) not found: {', '.join(missing)} (set PHASE6_SHARED_DATA)")
    return root


def topology_for(policy: str, replicas: int) -> Topology:
    kind, p, d = parse_policy(policy)
    return Topology(colocated=replicas) if kind == "colocated" else Topology(prefill=p, decode=d)


def scaled_topology(policy: str, total: int) -> Topology:
    """``policy`` at ``total`` replicas: colocated N, or pd:P:D's prefill share kept (each side >= 1)."""
    kind, p, d = parse_policy(policy)
    if kind == "colocated":
        return Topology(colocated=total)
    pre = min(max(1, round(total * p / (p + d))), total - 1)
    return Topology(prefill=pre, decode=total - pre)


def unloaded_latency(setup: FleetSetup, input_tokens: int, output_tokens: int) -> tuple[float, float]:
    """(TTFT, TPOT) in seconds of one request alone on a colocated replica (the SLO-scale unit of the PD grid)."""
    w = Workload(
        np.zeros(1),
        np.asarray([input_tokens]),
        np.asarray([output_tokens]),
        np.zeros(1, dtype=np.int64),
        None,
        "single",
    )
    r = setup.run(w, Topology(colocated=1), "round_robin")
    return float(r.ttft_s[0]), float(r.tpot_s[0])


LIFETIMES = 10
"""A steady-state probe lasts this many unloaded request lifetimes (E2E) of arrivals (and >= min requests)."""
MAX_PROBE_REQUESTS = 60_000
"""Cap on one probe's requests (a probe at a very high rate would otherwise need millions)."""


def search_rate(
    setup: FleetSetup,
    inp: int,
    out: int,
    e2e0: float,
    topo: Topology,
    slo: SLOConfig,
    start: float,
    steps: int,
    min_requests: int,
    seed: int,
    router: str = "least_loaded",
) -> RateSearch:
    """Max rate within ``slo`` for Poisson arrivals of identical requests, measured in steady state.

    Each probe at rate r simulates max(min_requests, r * LIFETIMES * e2e0) requests (capped) and scores only those
    arriving in [2 e2e0, last arrival - e2e0]: a short trace would be absorbed by the batch before any queue forms
    and overstate the rate (1,500 requests at 900 req/s arrive within one 5 s request lifetime).
    """

    def run_at(rate: float) -> dict[str, Any]:
        n = int(min(MAX_PROBE_REQUESTS, max(min_requests, math.ceil(rate * LIFETIMES * e2e0))))
        w = fixed_lengths(n, rate, inp, out, seed)
        res = setup.run(w, topo, router)
        last = float(w.arrival_s[-1])
        window = (2 * e2e0, last - e2e0) if last > 4 * e2e0 else (last / 4, 3 * last / 4)
        return summarize(res, slo, setup.hardware, window=window)

    return max_rate_within_slo(run_at, slo, start, steps)


def capacity_guess(setup: FleetSetup, replicas: int, inp: int, out: int) -> float:
    """Roofline guess of a colocated fleet's saturation rate (req/s): the smaller of full-batch decode throughput
    and full-budget prefill throughput. Only the first probe of a rate search; results do not depend on it."""
    lim = setup.limits
    m = setup.model.base if isinstance(setup.model, TorchTPStepTime) else setup.model  # unpadded: a first guess
    batch = max(1, min(lim.max_num_seqs, lim.kv_blocks // -(-(inp + out) // 512)))
    decode = batch / (out * m.decode_run_s(batch, batch * (inp + out // 2), 1))
    per_step = max(1, lim.max_num_batched_tokens // inp)  # prompts one prefill step holds
    prefill = per_step / m.step_s(per_step * inp, per_step * inp * (inp + 1) / 2, 0, 0)
    return replicas * min(decode, prefill)


def pd_grid(setup: FleetSetup, cfg: FleetRunConfig, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """'When PD disaggregation pays': prompt/output ratio x SLO scale -> max rate within SLO, colocated vs best P:D."""
    a = cfg.analysis
    n = a.pd_replicas
    rows = []
    for ratio in a.pd_ratios:
        out = a.pd_output_tokens
        inp = max(1, round(ratio * out))
        ttft0, tpot0 = unloaded_latency(setup, inp, out)
        e2e0 = ttft0 + (out - 1) * tpot0
        start = 0.5 * capacity_guess(setup, n, inp, out)
        for scale in a.pd_slo_scales:
            slo = SLOConfig(ttft_ms=scale * ttft0 * 1e3, tpot_ms=scale * tpot0 * 1e3, attainment=cfg.slo.attainment)
            args = (slo, start, a.rate_search_steps, a.pd_requests, cfg.run.seed)
            colo = search_rate(setup, inp, out, e2e0, Topology(colocated=n), *args)
            best: tuple[RateSearch, str] | None = None
            for p in range(1, n):
                s = search_rate(setup, inp, out, e2e0, Topology(prefill=p, decode=n - p), *args)
                if best is None or s.rate > best[0].rate:
                    best = (s, f"{p}:{n - p}")
            assert best is not None
            winner, reason = pd_reason(colo, best[0], best[1], slo)
            gain = best[0].rate / colo.rate if colo.rate > 0 else math.inf
            rows.append(
                {
                    "prompt_over_output": ratio,
                    "input_tokens": inp,
                    "output_tokens": out,
                    "slo_scale": scale,
                    "ttft_slo_ms": slo.ttft_ms,
                    "tpot_slo_ms": slo.tpot_ms,
                    "colocated_max_rate": colo.rate,
                    "best_pd": best[1],
                    "pd_max_rate": best[0].rate,
                    "pd_over_colocated": gain,
                    "winner": winner,
                    "reason": reason,
                }
            )
            log(
                f"pd grid ratio {ratio} slo x{scale}: colocated {colo.rate:.3g} req/s, pd {best[1]} "
                f"{best[0].rate:.3g} req/s -> {winner}"
            )
    return rows


def _plots(rec: Any, rows: list[dict[str, Any]], x: str, grid: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(f"{r['policy']} / {r['router']}", []).append(r)
    for key, ylabel, fname in (
        ("goodput_req_s", "goodput (req/s within SLO)", "goodput_vs_load.png"),
        ("slo_attainment", "SLO attainment", "attainment_vs_load.png"),
        ("prefix_hit_rate", "prefix-cache hit rate (tokens)", "prefix_hit_rate.png"),
        ("ttft_p99_ms", "TTFT p99 (ms)", "ttft_p99_vs_load.png"),
        ("tpot_p99_ms", "TPOT p99 (ms)", "tpot_p99_vs_load.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, rs in series.items():
            ax.plot([r[x] for r in rs], [r[key] for r in rs], marker="o", label=name)
        ax.set_xlabel("offered rate (req/s)" if x == "rate" else "concurrency")
        ax.set_ylabel(ylabel)
        if key.endswith("_ms"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, rec.plots_dir / fname, dpi=120)
    if grid:
        ratios = sorted({g["prompt_over_output"] for g in grid})
        scales = sorted({g["slo_scale"] for g in grid})
        m = np.full((len(ratios), len(scales)), np.nan)
        for g in grid:
            v = g["pd_over_colocated"]
            m[ratios.index(g["prompt_over_output"]), scales.index(g["slo_scale"])] = v if math.isfinite(v) else np.nan
        fig, ax = plt.subplots(figsize=(6, 4))
        im = ax.imshow(np.log2(m), cmap="RdBu_r", vmin=-2, vmax=2, origin="lower")
        ax.set_xticks(range(len(scales)), [f"x{s:g}" for s in scales])
        ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
        ax.set_xlabel("SLO scale (x unloaded TTFT, TPOT)")
        ax.set_ylabel("prompt / output tokens")
        for i in range(len(ratios)):
            for j in range(len(scales)):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=8)
        fig.colorbar(im, label="log2(PD max rate / colocated max rate)")
        ax.set_title("when PD disaggregation pays")
        save_figure(fig, rec.plots_dir / "pd_grid.png", dpi=120)


def main(cfg: FleetRunConfig) -> dict[str, Any]:
    from phase6.runrecord import RunRecord, markdown_table

    # input problems (trace rows, model preset, memory fit) raise ValueError before any simulation and before the
    # run record exists: the launcher turns them into one line and exit 2
    setup = build_setup(cfg)
    w, dropped = load_workload(cfg.workload, cfg.run.seed)
    if cfg.analysis.compare_with:
        from phase6.fleet.compare import check_serve_bench

        check_serve_bench(cfg.analysis.compare_with, cfg)
    shared = papers_data() if cfg.analysis.papers else None
    rec = RunRecord(cfg, job="fleet")
    rec.print(
        f"workload {w.source}: {len(w)} requests over {w.duration_s:.1f} s ({w.rate:.3g} req/s), mean input "
        f"{w.input_tokens.mean():.0f} / output {w.output_tokens.mean():.0f} tokens, dropped {dropped}; "
        f"KV {setup.limits.kv_blocks} blocks of 512 tokens per replica"
    )
    closed = cfg.load.mode == "closed"
    loads: list[float] = [float(c) for c in cfg.load.concurrency] if closed else list(cfg.load.rates)
    x = "concurrency" if closed else "rate"
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    for policy in cfg.fleet.policies:
        topo = topology_for(policy, cfg.fleet.replicas)
        for router in cfg.fleet.routers:
            for load in loads:
                wl = w if closed else w.at_rate(load)
                res = setup.run(wl, topo, router, closed=int(load) if closed else None)
                row = {"policy": topo.name, "router": router, x: load, **summarize(res, cfg.slo, cfg.hardware)}
                rows.append(row)
                warn = concentration_warning(router, topo.name, res.replica, topo.prefill or topo.colocated)
                if warn:
                    warnings.append(f"{x} {load:g}: {warn}")
                    rec.print(warnings[-1])
                rec.log(
                    {
                        FLEET_RATE: row["offered_rate"],
                        SERVE_GOODPUT_REQ_S: row["goodput_req_s"],
                        FLEET_SLO_ATTAINMENT: row["slo_attainment"],
                        SERVE_TTFT_MS_P50: row["ttft_p50_ms"],
                        SERVE_TTFT_MS_P99: row["ttft_p99_ms"],
                        SERVE_TPOT_MS_P50: row["tpot_p50_ms"],
                        SERVE_TPOT_MS_P99: row["tpot_p99_ms"],
                        SERVE_THROUGHPUT_TOK_S: row["throughput_tok_s"],
                        FLEET_PREFIX_HIT_RATE: row["prefix_hit_rate"],
                        FLEET_USD_PER_1M_OUT: row["usd_per_1m_output_tokens"],
                        FLEET_SIM_REQ_PER_S: len(wl) / max(res.wall_s, 1e-9),
                    },
                    step=len(rows),
                )

    tables: dict[str, list[dict[str, Any]]] = {}
    # Highest swept load each policy/router serves within the SLO, with its cost.
    best_rows = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for router in cfg.fleet.routers:
            ok = [r for r in rows if r["policy"] == policy and r["router"] == router and meets(r, cfg.slo)]
            top = max(ok, key=lambda r: r[x]) if ok else None
            best_rows.append(
                {
                    "policy": policy,
                    "router": router,
                    f"max_{x}_within_slo": top[x] if top else 0.0,
                    "goodput_req_s": top["goodput_req_s"] if top else 0.0,
                    "prefix_hit_rate": top["prefix_hit_rate"] if top else math.nan,
                    "num_gpus": top["num_gpus"] if top else math.nan,
                    "usd_per_1m_good_output_tokens": top["usd_per_1m_good_output_tokens"] if top else math.inf,
                }
            )
    tables[
        f"Highest swept {x} within SLO (TTFT <= {cfg.slo.ttft_ms:g} ms and TPOT <= {cfg.slo.tpot_ms:g} ms for "
        f">= {cfg.slo.attainment:.0%} of requests)"
    ] = best_rows

    a = cfg.analysis
    if a.target_rate is not None:
        need_rows = []
        wt = w.at_rate(a.target_rate)
        for policy in cfg.fleet.policies:
            for router in cfg.fleet.routers:
                lo = 1 if parse_policy(policy)[0] == "colocated" else 2

                def run_with(total: int, policy: str = policy, router: str = router) -> dict[str, Any]:
                    return summarize(setup.run(wt, scaled_topology(policy, total), router), cfg.slo, cfg.hardware)

                n, row = min_replicas(run_with, cfg.slo, lo, a.max_replicas)
                topo = scaled_topology(policy, n) if n else None
                need_rows.append(
                    {
                        "policy": policy,
                        "router": router,
                        "rate": a.target_rate,
                        "replicas_needed": n if n else f"> {a.max_replicas}",
                        "layout": topo.name if topo else "–",
                        "gpus": n * cfg.engine.tp if n else math.nan,
                        "slo_attainment": row["slo_attainment"] if row else math.nan,
                        "usd_per_1m_output_tokens": row["usd_per_1m_output_tokens"] if n and row else math.nan,
                    }
                )
                rec.print(
                    f"replicas needed for {a.target_rate:g} req/s, {policy} / {router}: {need_rows[-1]['replicas_needed']}"
                )
        tables[f"Replicas needed for {a.target_rate:g} req/s within SLO"] = need_rows

    compare_notes = ""
    grid: list[dict[str, Any]] = []
    if a.pd_table:
        grid = pd_grid(setup, cfg, rec.print)
        tables["When PD disaggregation pays (max rate within SLO, same GPUs)"] = grid

    if a.papers:
        from phase6.fleet.papers import run_papers

        assert shared is not None
        tables["Published claims vs simulated (phase6.fleet.papers)"] = run_papers(shared, a.papers_requests, rec.print)

    if a.compare_with:
        from phase6.fleet.compare import compare_serve_bench

        cmp_rows, cmp_skipped = compare_serve_bench(
            a.compare_with, cfg, setup, a.compare_calibrate, a.compare_lengths, a.compare_profile
        )
        tables["Simulated vs measured (serve-bench)"] = cmp_rows
        shown = (
            "tp",
            "concurrency",
            "requests",
            "ttft_p50_ms_measured",
            "ttft_p50_ms_sim",
            "ttft_err_pct",
            "tpot_p50_ms_measured",
            "tpot_p50_ms_sim",
            "tpot_err_pct",
            "throughput_tok_s_measured",
            "throughput_tok_s_sim",
            "within_20pct",
            "role",
        )
        # plain print: a console that wraps at its width would break the table's lines
        print(
            f"simulated vs measured ({a.compare_with}):\n"
            + markdown_table([{k: r[k] for k in shown} for r in cmp_rows])
            + "".join(f"TP={r['tp']} {r['calibration']}\n" for r in cmp_rows if r["role"].startswith("calibration")),
            flush=True,
        )
        for why in cmp_skipped:
            rec.print(f"skipped: {why}")
        if cmp_skipped:
            compare_notes = "Skipped: " + "; ".join(cmp_skipped)

    if cfg.plots and rows:
        _plots(rec, rows, x, grid)
    head = ("policy", "router", x)
    if rows:
        tables["Details"] = [{k: v for k, v in r.items() if k in head or k not in ROW_KEYS} for r in rows]

    cost = None
    served = [r for r in rows if meets(r, cfg.slo)]
    if served:
        b = min(served, key=lambda r: r["usd_per_1m_good_output_tokens"])
        cost = run_cost(cfg.hardware, int(b["num_gpus"]), b["duration_s"], b["throughput_tok_s"] * b["duration_s"])
        cost.update(
            {
                "policy": b["policy"],
                "router": b["router"],
                x: b[x],
                "note": "cheapest row within SLO; tokens = output tokens of the simulated run",
            }
        )
    notes = {
        **({"Simulated vs measured": compare_notes} if compare_notes else {}),
        **({"Warnings": "; ".join(dict.fromkeys(w.split(": ", 1)[1] for w in warnings))} if warnings else {}),
        "Definitions": (
            f"TTFT = first token - arrival; TPOT = (E2E - TTFT)/(output - 1); good = TTFT <= {cfg.slo.ttft_ms:g} ms "
            f"and TPOT <= {cfg.slo.tpot_ms:g} ms; goodput = good requests / (first arrival -> last completion); "
            "prefix hit rate = prompt tokens served from cache / all prompt tokens; $ per 1M output tokens = "
            "num_gpus * 1e6 / (3600 * output tok/s) * $/GPU-h (phase6.cost). Step times: "
            f"{cfg.engine.step_time} (model {cfg.model}, tp {cfg.engine.tp}, {cfg.hardware.name}). PD: TTFT ends at "
            "the prefill replica's first token; the KV transfer delays token 2 (counted in TPOT)."
        ),
    }
    rec.finish(
        [{k: r[k] for k in (*head, *ROW_KEYS)} for r in rows],
        cost=cost,
        tables=tables,
        notes=notes,
        extra={
            "workload": {
                "source": w.source,
                "requests": len(w),
                "dropped": dropped,
                "mean_input_tokens": float(w.input_tokens.mean()),
                "mean_output_tokens": float(w.output_tokens.mean()),
                "native_rate_req_s": w.rate,
            },
            "kv_blocks_per_replica": setup.limits.kv_blocks,
        },
    )
    return {"rows": rows, "tables": tables}
