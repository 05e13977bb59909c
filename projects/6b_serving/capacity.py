"""6B capacity mode: `phase6 serve-bench capacity.search=rate|concurrency` -- the highest load at which at least
slo.attainment of the requests meet the SLO, on one server start.

    phase6 serve-bench experiment=capacity_smoke_vllm                 # CPU: a real vLLM, tiny model, rate search
    phase6 serve-bench experiment=gpu_h200_vllm capacity.search=rate capacity.time_budget_s=170   # one H200
    phase6 serve-bench serve=vllm_qwen2.5_72b serve.tp=4 capacity.search=concurrency             # closed loop

Top to bottom: model -> tokenizer -> request list (one seeded list; every probe sends its prefix) -> server start
(once; it loads while the simulator predicts) -> the fleet simulator's attainment at every load and its capacity,
written to prediction.json BEFORE the first probe, whose load it picks -> probes chosen by the search of
phase6.serving.capacity (each: /metrics before, the client run, /metrics after, one row) -> capacity with its
confidence interval, the SLO broken first with the knee's queue-time vs ITL evidence, $ per 1M output tokens at
capacity, plots/capacity.png -> results.json (rows = probes; top-level ``capacity``, ``slo_broken_first``, ``knee``,
``prediction``). Definitions: phase6.serving.capacity (search, interval), phase6.serving.stats (row columns).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from phase6.config import load_object
from phase6.config.serve import ServeBenchRunConfig
from phase6.runrecord import RunRecord, dumps
from phase6.serving import server as servers
from phase6.serving import telemetry
from phase6.serving.capacity import (
    CapacitySearch,
    attainment_counts,
    capacity_estimate,
    plot_capacity,
    probe_point,
    slo_broken_first,
)
from phase6.serving.client import request_body, run_benchmark
from phase6.serving.stats import summarize
from phase6.serving.workload import BenchWorkload, build_schedule, build_workload
from phase6.timing import wall

_SB = "projects/6b_serving/serve_bench.py"
KNEE_KEYS = (
    "load",
    "attainment",
    "ttft_attainment",
    "tpot_attainment",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "server_queue_time_mean_ms",
    "queue_p99_ms",
    "itl_p99_ms",
    "tpot_p99_ms",
    "server_running_mean",
    "server_waiting_max",
)
"""The knee's evidence: queueing (server queue time, client queue, TTFT) beside batch fill (ITL / TPOT p99, running)."""


class Probes:
    """The load knob of the search: requests per probe, the request list, the send schedule, the closed-loop cap."""

    def __init__(self, cfg: ServeBenchRunConfig, tok: Any) -> None:
        self.cfg, self.tok = cfg, tok
        self.rate = cfg.capacity.search == "rate"
        self._wl: BenchWorkload | None = None

    def num_requests(self, load: float) -> int:
        c, ld = self.cfg.capacity, self.cfg.load
        if c.requests_per_probe is not None:
            return c.requests_per_probe
        if ld.num_requests is not None:
            return ld.num_requests
        return ld.min_requests if self.rate else max(ld.min_requests, ld.requests_per_slot * int(load))

    def workload(self, n: int) -> BenchWorkload:
        """The seeded list with at least ``n`` measured requests (built once; rebuilt larger only when a closed-loop
        probe needs more, so probes up to the first build share one list)."""
        if self._wl is None or len(self._wl.requests) < n:
            ld = self.cfg.load  # the list only: the probe sets arrival, rate and concurrency
            load = dataclasses.replace(
                ld, arrival="concurrency", concurrency=1, num_requests=n, request_rate=None, warmup_requests=ld.warmup()
            )
            if self.cfg.capacity.arrival == "trace" and self.rate:
                load = dataclasses.replace(load, arrival="trace")
            self._wl = build_workload(load, self.tok, self.cfg.run.seed, self.cfg.serve.max_model_len)
        return self._wl

    def schedule(self, load: float, n: int) -> np.ndarray:
        if not self.rate:
            return np.zeros(n)
        c = self.cfg.capacity
        if c.arrival == "trace":  # the trace's own shape, its mean rate scaled to the probed one
            t = np.asarray([r.trace_time_s or 0.0 for r in self.workload(n).requests[:n]], dtype=float)
            t = t - t.min()
            if n < 2 or t[-1] <= 0:
                raise ValueError("capacity.arrival=trace: the trace's first requests share one timestamp")
            return t * ((n - 1) / t[-1]) / load
        return build_schedule(c.arrival, n, self.cfg.run.seed, load, self.cfg.load.burstiness)

    def concurrency(self, load: float) -> int | None:
        return None if self.rate else int(load)


def template_tokens(tok: Any, api: str) -> int:
    """Tokens the server adds to the client's prompt count: the chat template (chat API) or special tokens."""
    probe = "hello world"
    plain = len(tok.encode(probe, add_special_tokens=False))
    if api == "chat" and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": probe}], add_generation_prompt=True, tokenize=False)
        return len(tok.encode(text, add_special_tokens=False)) - plain
    return len(tok.encode(probe, add_special_tokens=True)) - plain


def predict(cfg: ServeBenchRunConfig, probes: Probes, model: str) -> tuple[dict[str, Any], Any]:
    """The fleet simulator's capacity for this server and these probes (uncalibrated: the engine profile's own
    defaults, docs/fleet.md), by the same search at 1 % resolution on simulated probes of the exact requests and
    schedules serve-bench will send. Returns (the prediction, ``sim(load)`` for the measured probes' simulated
    attainment). Raises ValueError when the simulator has no model for it."""
    from phase6.fleet.analysis import summarize as sim_summary
    from phase6.fleet.compare import planned_run, replica_config
    from phase6.fleet.run import build_setup, capacity_guess, unloaded_latency
    from phase6.fleet.sim import Topology
    from phase6.fleet.steptime import build_step_model
    from phase6.fleet.workload import Workload
    from phase6.launch import load_config

    plan = cfg.serve.plan_model
    if plan is None and (Path(model) / "config.json").is_file():
        plan = str(Path(model) / "config.json")
    if plan is None:
        raise ValueError(f"no planner model for {model!r} (set serve.plan_model)")
    fleet = load_config(
        "fleet", ["experiment=compare", f"model={plan}", f"hardware={cfg.hardware.name}", f"engine.tp={cfg.serve.tp}"]
    )
    setup = build_setup(fleet)
    offset = template_tokens(probes.tok, cfg.load.api)
    c = cfg.capacity
    n0 = probes.num_requests(max(1.0, c.start or 1.0))
    wl = probes.workload(n0)
    pr = [r.prompt_len + offset for r in wl.requests]
    run = planned_run(
        "capacity", dataclasses.asdict(cfg.serve), cfg.serve.tp, 1, pr, [r.output_len for r in wl.requests]
    )
    engine, limits, limits_src, prof = replica_config(run, fleet, setup, "auto")
    s = dataclasses.replace(
        setup, model=build_step_model(setup.spec, setup.hardware, engine), engine=engine, limits=limits
    )
    target = cfg.slo.attainment

    def sim(load: float) -> dict[str, Any]:
        n = probes.num_requests(load)
        reqs = probes.workload(n).requests[:n]
        sched = probes.schedule(load, n)
        w = Workload(
            sched - sched[0],
            np.asarray([r.prompt_len + offset for r in reqs], dtype=np.int64),
            np.asarray([r.output_len for r in reqs], dtype=np.int64),
            np.arange(n, dtype=np.int64),
            None,
            f"capacity probe {load:g}",
        )
        res = s.run(w, Topology(colocated=1), "round_robin", closed=probes.concurrency(load))
        counts = attainment_counts(cfg.slo, n, res.ttft_s, res.tpot_s, res.e2e_s)
        row = sim_summary(res, cfg.slo, cfg.hardware)
        return {
            **probe_point(load, n, counts, target, c.confidence),
            "goodput_req_s": row["goodput_req_s"],
            "throughput_tok_s": row["throughput_tok_s"],
            "ttft_p99_ms": row["ttft_p99_ms"],
            "tpot_p99_ms": row["tpot_p99_ms"],
        }

    mean_in = max(1, round(float(np.mean(pr))))
    mean_out = max(1, round(float(np.mean([r.output_len for r in wl.requests]))))
    guess = capacity_guess(s, 1, mean_in, mean_out)  # req/s, roofline; only the simulated search's first probe
    if not probes.rate:  # closed loop: Little's law with the unloaded request lifetime
        ttft0, tpot0 = unloaded_latency(s, mean_in, mean_out)
        guess = max(1.0, guess * (ttft0 + tpot0 * (mean_out - 1)))
    search = CapacitySearch(
        min(max(guess, c.min_load), c.max_load), c.min_load, c.max_load, 2.0, 0.01, 40, integer=not probes.rate
    )
    points: list[dict[str, Any]] = []
    while True:
        load, why = search.next([(p["load"], p["passed"]) for p in points])
        if load is None:
            break
        points.append(sim(load))
    est = capacity_estimate(points, target, c.confidence)
    first, cross = slo_broken_first(points, cfg.slo, target)
    value = est["value"]
    pick = value if value is not None else (est["highest_passing_load"] or c.min_load)
    return {
        "capacity": value,
        "capacity_missing_reason": est["value_missing_reason"],
        "slo_broken_first": first,
        "slo_crossings": cross,
        "first_probe": pick,
        "search_stop": why,
        "probes": sorted(points, key=lambda p: p["load"]),
        "engine_profile": prof,
        "engine_limits": limits_src,
        "engine": {
            k: getattr(engine, k)
            for k in (
                "prefill_mfu",
                "decode_hbm_efficiency",
                "resolved_step_overhead_ms",
                "resolved_request_overhead_ms",
            )
        },
        "template_tokens": offset,
        "method": (
            "phase6 fleet simulator, one replica, uncalibrated (configs/fleet.yaml engine defaults of the engine's "
            "profile), replaying each probe's exact requests (server prompt tokens = client count + template tokens) "
            "and send schedule; capacity = crossing of the simulated attainment, search to 1 % resolution"
        ),
    }, sim


def main(cfg: ServeBenchRunConfig) -> dict[str, Any]:
    sb = {k: load_object(f"{_SB}:{k}") for k in ("preflight", "resolve_model", "load_tokenizer")}
    sb["preflight"](cfg)
    c = cfg.capacity
    unit = "req/s" if c.search == "rate" else "concurrency"
    rec = RunRecord(cfg, job="serve_bench")
    model = sb["resolve_model"](cfg, rec)
    srv, reused = servers.acquire(cfg.serve, model, rec.dir / "server.log", wait=False)  # loads while we predict
    try:
        tok = sb["load_tokenizer"](cfg.serve.tokenizer or model)
        probes = Probes(cfg, tok)
        prediction: dict[str, Any] | None = None
        sim = None
        try:
            if cfg.predict:
                prediction, sim = predict(cfg, probes, model)
        except ValueError as e:
            if c.start is None:
                raise ValueError(f"capacity.start: no fleet prediction to start from ({e}); set capacity.start") from e
            prediction = {"capacity": None, "capacity_missing_reason": f"unavailable: {e}"}
        if prediction is None and c.start is None:
            raise ValueError("capacity.start: predict=false leaves no first probe; set capacity.start")
        start = c.start if c.start is not None else prediction["first_probe"]  # type: ignore[index]
        pred_doc = {"written_before_first_probe_utc": _utc(), "first_probe": start, **(prediction or {})}
        (rec.dir / "prediction.json").write_text(json.dumps(json.loads(dumps(pred_doc)), indent=2))
        rec.print(
            f"prediction: capacity {_fmt(pred_doc.get('capacity'))} {unit} "
            f"(breaks first: {pred_doc.get('slo_broken_first', '-')}); first probe {start:g} -> prediction.json"
        )
        srv.wait_ready(cfg.serve.ready_timeout_s)
    except BaseException:
        servers.release(srv, cfg.serve)
        raise
    rec.print(f"server: {cfg.serve.engine} {srv.version} at {srv.base_url} (ready in {srv.startup_s:.1f} s)")
    body = dict(
        engine=cfg.serve.engine,
        api=cfg.load.api,
        model=cfg.serve.served_model_name or srv.model_id,
        fix_output_len=cfg.load.fix_output_len,
        temperature=cfg.load.temperature,
        extra_body=cfg.load.extra_body,
    )
    search = CapacitySearch(
        start, c.min_load, c.max_load, c.growth, c.resolution, c.max_probes, integer=c.search == "concurrency"
    )
    sampler = telemetry.Sampler(
        rec.dir / "telemetry.jsonl",
        srv.base_url + "/metrics",
        cfg.telemetry.metrics_interval_s,
        cfg.telemetry.nvml_interval_s,
    )
    metrics_url = srv.base_url + "/metrics"
    points: list[dict[str, Any]] = []
    stop, longest = "", 0.0
    try:
        sampler.start()
        with (rec.dir / "requests.jsonl").open("w") as req_f:
            while True:
                load, stop = search.next([(p["load"], p["passed"]) for p in points])
                if load is None:
                    break
                n = probes.num_requests(load)
                est = max(longest, n / load if probes.rate else 0.0)
                if c.time_budget_s is not None and wall() - rec.t0 + est > c.time_budget_s:
                    used = wall() - rec.t0
                    stop = f"time budget: {used:.0f} s used + ~{est:.0f} s for the next probe > {c.time_budget_s:g} s"
                    break
                if srv.exited() is not None:
                    stop = f"server exited ({srv.exited()})"
                    break
                t_probe = wall()
                try:
                    point = run_probe(cfg, srv, probes, load, n, len(points), body, metrics_url, sampler.out, req_f)
                except Exception as e:  # recorded, not raised: the probes so far still give a bracket
                    stop = f"probe at {load:g} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    break
                longest = max(longest, wall() - t_probe)
                point["attainment_sim"] = sim(load)["attainment"] if sim is not None else None
                points.append(point)
                rec.print(
                    f"probe {len(points)}: {unit} {load:g}: attainment {point['attainment']:.3f} "
                    f"[{point['attainment_ci_low']:.3f}, {point['attainment_ci_high']:.3f}] "
                    f"({'pass' if point['passed'] else 'fail'}), TTFT p99 {point['ttft_p99_ms']:.0f} ms, "
                    f"ITL p99 {point['itl_p99_ms']:.1f} ms, goodput {point['goodput_req_s']:.2f} req/s"
                )
    finally:
        sampler.stop()
        servers.release(srv, cfg.serve)
    return finish(cfg, rec, points, prediction, start, stop, srv.info(), unit)


def run_probe(
    cfg: ServeBenchRunConfig,
    srv: Any,
    probes: Probes,
    load: float,
    n: int,
    index: int,
    body: dict[str, Any],
    metrics_url: str,
    telemetry_path: Path,
    req_f: Any,
) -> dict[str, Any]:
    """One measured probe: the list's first ``n`` requests at ``load``, its row and its search columns."""
    wl = probes.workload(n)
    reqs = wl.requests[:n]
    conc = probes.concurrency(load)
    scrapes: dict[str, Any] = {}
    starts: list[float] = []

    def before() -> None:
        scrapes["before"], _ = telemetry.scrape(metrics_url)

    outcome = run_benchmark(
        srv.base_url,
        cfg.load.api,
        [request_body(r, **body) for r in reqs],
        probes.schedule(load, n).tolist(),
        conc,
        warmup=[request_body(r, **body) for r in wl.warmup] if index == 0 else None,
        connect_timeout_s=cfg.load.connect_timeout_s,
        read_timeout_s=cfg.load.read_timeout_s,
        request_timeout_s=cfg.load.request_timeout_s,
        abort_check=srv.exited,
        tokenizer=probes.tok,
        requests=reqs,
        before_start=before,
        on_start=starts.append,
    )
    after = telemetry.counters_settled(metrics_url) if scrapes.get("before") and srv.exited() is None else None
    row, details = summarize(
        outcome,
        engine=cfg.serve.engine,
        tp=cfg.serve.tp,
        concurrency=conc,
        request_rate=None if conc is not None else load,
        num_gpus=cfg.serve.tp,
        usd_per_gpu_hour=cfg.hardware.usd_per_gpu_hour,
        slo=cfg.slo,
    )
    ok = [r for r in outcome.results if r.ok]
    counts = attainment_counts(
        cfg.slo, outcome.planned, [r.ttft_s for r in ok], [r.tpot_s for r in ok], [r.e2e_s for r in ok]
    )
    point = probe_point(load, outcome.planned, counts, cfg.slo.attainment, cfg.capacity.confidence)
    t0 = (starts[0] if starts else wall()) + outcome.first_dispatch_s
    tele = telemetry.summarize(telemetry_path, t0, t0 + outcome.duration_s)
    queue_ms: float | None = None
    if scrapes.get("before") and after:
        d = telemetry.counter_deltas(telemetry.parse_prometheus(scrapes["before"]), telemetry.parse_prometheus(after))
        if d.get("queue_time_s_count"):
            queue_ms = 1e3 * d["queue_time_s_sum"] / d["queue_time_s_count"]
    for r in outcome.results:
        req_f.write(dumps({"probe": index, "load": load, **r.to_json()}) + "\n")
    point.update(
        {
            "probe": index,
            **{k: row[k] for k in row if k not in ("concurrency", "request_rate")},
            "concurrency": conc,
            "request_rate": None if conc is not None else load,
            "goodput_tok_s": details["goodput_tok_s"],
            "e2e_p99_ms": details["e2e_p99_ms"],
            "queue_p99_ms": details["queue_p99_ms"],
            "server_queue_time_mean_ms": queue_ms,
            "server_running_mean": tele.get("server_running_mean"),
            "server_waiting_max": tele.get("server_waiting_max"),
            "server_kv_cache_usage_max": tele.get("server_kv_cache_usage_max"),
            "offered_rate_req_s": details["offered_rate_req_s"],
            "mean_in_flight": details["mean_in_flight"],
            "duration_s": details["duration_s"],
            "errors": details["errors"],
            "abort_reason": details["abort_reason"],
            "request_list_sha256": wl.info["request_list_sha256"],
        }
    )
    return point


def knee_why(first: str, lo: dict[str, Any] | None, hi: dict[str, Any] | None, unit: str) -> str:
    """The knee's evidence in one sentence, from the pass to the fail: queue time and TTFT beside ITL/TPOT p99, and
    which of them moved (queueing = the server's mean queue time rose by at least half of TTFT p50's rise)."""
    if lo is None or hi is None:
        return f"no knee inside the probed range (slo_broken_first={first})"

    def ch(k: str) -> str:
        return f"{_fmt(lo.get(k))} -> {_fmt(hi.get(k))}"

    def rise(k: str) -> float | None:
        a, b = lo.get(k), hi.get(k)
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (math.isnan(a) or math.isnan(b))
        return b - a if ok else None

    facts = (
        f"from {unit} {lo['load']:g} (pass) to {hi['load']:g} (fail): TTFT attainment {ch('ttft_attainment')}, TPOT "
        f"attainment {ch('tpot_attainment')}; server queue time mean {ch('server_queue_time_mean_ms')} ms, client "
        f"queue p99 {ch('queue_p99_ms')} ms, TTFT p50 {ch('ttft_p50_ms')} / p99 {ch('ttft_p99_ms')} ms; ITL p99 "
        f"{ch('itl_p99_ms')} ms, TPOT p99 {ch('tpot_p99_ms')} ms, server running mean {ch('server_running_mean')}."
    )
    dq, dt, di = rise("server_queue_time_mean_ms"), rise("ttft_p50_ms"), rise("itl_p99_ms")
    if first.startswith("TTFT"):
        if dq is not None and dt is not None and dt > 0 and dq >= 0.5 * dt:
            return facts + " TTFT broke first and the server's waiting queue carries its rise: queueing."
        return facts + (
            " TTFT broke first without the server's waiting queue growing"
            + (f" ({dq:+.3g} ms of TTFT p50's {dt:+.3g} ms)" if dq is not None and dt is not None else "")
            + ": the time goes after admission (prefill in a full batch, the API server), not to queueing."
        )
    if first.startswith("TPOT"):
        return facts + (
            " TPOT broke first with ITL p99 rising: each step grows with the batch and its prefill chunks (batch fill)."
            if di is not None and di > 0
            else " TPOT broke first while ITL p99 did not rise: the per-request mean moved, not the tail gap."
        )
    return facts


def finish(
    cfg: ServeBenchRunConfig,
    rec: RunRecord,
    points: list[dict[str, Any]],
    prediction: dict[str, Any] | None,
    start: float,
    stop: str,
    server_info: dict[str, Any],
    unit: str,
) -> dict[str, Any]:
    """Capacity, SLO broken first, knee, cost at capacity, plot -> results.json / results.md."""
    c, slo, target = cfg.capacity, cfg.slo, cfg.slo.attainment
    if not points:
        raise RuntimeError(f"capacity search measured no probe: {stop}")
    est = capacity_estimate(points, target, c.confidence)
    first, cross = slo_broken_first(points, slo, target)
    by_load = {p["load"]: p for p in points}
    lo_row = by_load.get(est["highest_passing_load"])
    hi_row = by_load.get(est["lowest_failing_load"])
    at_cap = (
        {
            k: lo_row[k]
            for k in (
                "usd_per_1m_output_tokens",
                "gpu_hours_per_1m_output_tokens",
                "goodput_req_s",
                "goodput_tok_s",
                "throughput_tok_s",
            )
        }
        if lo_row
        else {"missing_reason": f"no probe met the SLO ({est['value_missing_reason']})"}
    )
    pred_cap = (prediction or {}).get("capacity")
    capacity = {
        "search": c.search,
        "unit": unit,
        **est,
        "attainment_target": target,
        "slo": slo.describe(),
        "probes": len(points),
        "stop_reason": stop,
        "first_probe": start,
        "at_capacity": at_cap,
        "goodput_peak": {k: max(points, key=lambda p: p["goodput_req_s"])[k] for k in ("load", "goodput_req_s")},
        "predicted": pred_cap,
        "predicted_missing_reason": None
        if pred_cap is not None
        else (prediction or {}).get("capacity_missing_reason", "no prediction (predict=false)"),
        "predicted_error_pct": (
            100 * (pred_cap - est["value"]) / est["value"] if pred_cap is not None and est["value"] else None
        ),
    }
    knee = {
        "rows": [{k: r.get(k) for k in KNEE_KEYS} for r in (lo_row, hi_row) if r is not None],
        "slo_crossings": cross,
        "why": knee_why(first, lo_row, hi_row, unit),
    }
    rec.print(f"capacity: {_fmt(est['value'])} {unit}, CI {est['ci']} ({stop}); SLO broken first: {first}")
    if cfg.telemetry.plots:
        plot_capacity(
            points,
            rec.plots_dir / "capacity.png",
            unit=unit,
            target=target,
            capacity=est,
            predicted=pred_cap,
            sim_points=(prediction or {}).get("probes"),
            title=f"{cfg.serve.engine} TP{cfg.serve.tp}: {slo.describe()}, attainment >= {target:g}",
        )
    rows = sorted(points, key=lambda p: p["probe"])
    probe_cols = (
        "probe",
        "load",
        "planned",
        "attainment",
        "attainment_ci_low",
        "attainment_ci_high",
        "passed",
        "ttft_attainment",
        "tpot_attainment",
        "attainment_sim",
        "goodput_req_s",
        "throughput_tok_s",
        "ttft_p99_ms",
        "server_queue_time_mean_ms",
        "itl_p99_ms",
        "tpot_p99_ms",
        "usd_per_1m_output_tokens",
    )
    rec.finish(
        rows,
        extra={
            "capacity": capacity,
            "slo_broken_first": first,
            "knee": knee,
            "prediction": prediction,
            "server": server_info,
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms, "attainment": target},
        },
        tables={
            "Probes": [{k: r.get(k) for k in probe_cols} for r in rows],
            "Capacity": [{k: v for k, v in capacity.items() if not isinstance(v, (dict, list))}],
            "Knee": knee["rows"],
        },
        notes={"Method": est["method"], "SLO broken first": f"{first}: {knee['why']}"},
    )
    return {"capacity": est["value"], "slo_broken_first": first, "probes": len(points)}


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _utc() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
