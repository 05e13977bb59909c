"""6B: `phase6 serve-bench` -- one row of the serving scaling table per run, a Hydra sweep for the whole table.

    phase6 serve-bench experiment=smoke                               # CPU: transformers serve + tiny model
    phase6 serve-bench serve=vllm_llama3.1_70b --tp 4 load.concurrency=16
    phase6 serve-bench -m serve.tp=2,4 load.concurrency=1,16,64       # server restarted only when TP changes
    phase6 serve-bench -m serve=vllm_qwen2.5_72b,sglang_qwen2.5_72b load=poisson load.request_rate=2,4,8
    phase6 serve-bench serve=endpoint serve.endpoint=http://127.0.0.1:8000 serve.tp=4   # a running server

Top to bottom: resolve the model -> tokenizer -> request list and schedule (seeded, identical for every engine and
row) -> ready server (cached across sweep members) -> warmup + measured run with telemetry -> row, per-request
records, plots, planner prediction, cost vs API prices -> results.json/results.md. Definitions of every column
are in src/phase6/serving/stats.py and client.py; the write-up template is projects/6b_serving/WRITEUP.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from phase6 import metrics as M
from phase6.config.serve import ServeBenchRunConfig
from phase6.cost import api_comparison, run_cost, usd_per_1m_tokens
from phase6.runrecord import RunRecord, dumps, read_results
from phase6.serving import server as servers
from phase6.serving import telemetry
from phase6.serving.client import request_body, run_benchmark
from phase6.serving.plots import plot_latency_cdfs, plot_timeseries, plot_vs_load
from phase6.serving.stats import server_side_latency, summarize
from phase6.serving.workload import BenchWorkload, build_workload
from phase6.timing import wall


def resolve_model(cfg: ServeBenchRunConfig, rec: RunRecord) -> str:
    """The model path/id the server gets; builds the random model unless a pinned server already serves it."""
    if not cfg.serve.random_model:
        return cfg.serve.model
    cached = servers.cached(cfg.serve)
    if cached is not None and cached.model:
        return cached.model
    from phase6.serving.tiny import build_random_chat_model

    return str(build_random_chat_model(rec.dir / "random_model", cfg.serve.random_model, seed=cfg.run.seed))


def load_tokenizer(name: str) -> Any:
    """The served model's tokenizer (lengths are counted with it); remote code only where the user configured it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"serve.tokenizer: cannot load tokenizer {name!r} ({str(e).splitlines()[0]})") from e


def predict(cfg: ServeBenchRunConfig, wl: BenchWorkload, details: dict[str, Any], model: str) -> dict[str, Any] | None:
    """The planner's numbers for this row (phase6.plan.serve), or None with no planner model.

    batch = the concurrency (closed loop) or the measured mean in-flight requests (open loop, Little's law);
    context = mean prompt + half the mean output (the average KV length during decode).
    """
    from phase6.plan.model import ModelSpec, load_hf_config
    from phase6.plan.model import resolve_model as plan_resolve
    from phase6.plan.serve import ServeCostModel

    spec_name = cfg.serve.plan_model
    if spec_name is None and (Path(model) / "config.json").is_file():
        spec_name = str(Path(model) / "config.json")
    if spec_name is None:
        return None
    if spec_name.endswith(".json") or Path(spec_name).is_dir():
        spec = ModelSpec.from_hf_config(load_hf_config(spec_name), name=Path(model).name, source=spec_name)
    else:
        spec = plan_resolve(spec_name)
    batch = cfg.load.concurrency or max(1, round(details["mean_in_flight"]))
    prompt = max(1, round(wl.info["prompt_len_mean"]))
    context = max(1, round(wl.info["prompt_len_mean"] + wl.info["output_len_mean"] / 2))
    m = ServeCostModel(spec, cfg.hardware, tp=cfg.serve.tp)
    decode_s = m.decode_step_s(batch, context)
    ttft_s = m.prefill_s(prompt, 1) + decode_s
    mem = m.memory(cfg.serve.max_model_len or context)
    return {
        "ttft_p50_ms": 1e3 * ttft_s,
        "tpot_p50_ms": 1e3 * decode_s,
        "throughput_tok_s": batch / decode_s,
        "breakdown": {  # where one decode step goes (the write-up's "why TP stops scaling")
            "decode_compute_ms": 1e3 * m.compute_s(batch, batch * context),
            "decode_weights_ms": 1e3 * m.weights_read_bytes(batch) / m.bytes_per_s,
            "decode_kv_ms": 1e3 * m.kv_bytes_per_token * batch * context / m.bytes_per_s,
            "decode_allreduce_ms": 1e3 * m.allreduce_s(batch),
            "weights_gib_per_gpu": mem.weights_bytes / 2**30,
            "max_concurrent_seqs": mem.max_concurrent_seqs,
            "fits": mem.fits,
            "batch": batch,
            "context": context,
        },
        "formulas": {
            "model": f"{spec.name} ({spec_name}), TP={cfg.serve.tp}, batch={batch}, context={context}",
            "ttft_p50_ms": "prefill of one mean prompt + one decode step of the running batch (phase6.plan.serve)",
            "tpot_p50_ms": "decode step at batch and context = max(compute, HBM) + TP all-reduce",
            "throughput_tok_s": "batch / decode step (upper bound: ignores prefill steps)",
        },
    }


def server_counter_record(run_dir: Path, scrapes: dict[str, Any], outcome: Any) -> dict[str, Any]:
    """/metrics before/after the measured run: parsed counters, their deltas, the raw expositions (files), and the
    client's usage tokens of every sent request beside the server's generation-token delta (equal when every token
    the server generated reached the client's usage count)."""
    if scrapes.get("before") is None:
        return {"status": scrapes.get("status", "unavailable: not scraped")}
    before = telemetry.parse_prometheus(scrapes["before"])
    after = telemetry.parse_prometheus(scrapes.get("after") or "")
    (run_dir / "metrics_before.prom").write_text(scrapes["before"])
    if scrapes.get("after"):
        (run_dir / "metrics_after.prom").write_text(scrapes["after"])
    sent = [r for r in outcome.results if r.sent]
    return {
        "status": "ok" if after else "unavailable: no scrape after the run (server gone?)",
        "before": before,
        "after": after,
        "delta": telemetry.counter_deltas(before, after),
        "client_usage_output_tokens_sent": sum(r.output_tokens for r in sent if r.tokens_source == "usage"),
        "files": ["metrics_before.prom", "metrics_after.prom"] if scrapes.get("after") else ["metrics_before.prom"],
    }


def sweep_plot(rec: RunRecord) -> Path | None:
    """In a Hydra sweep: throughput/latency vs load over the members finished so far, in <sweep dir>/plots."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except ValueError:
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep = Path(hc.sweep.dir)
    rows = []
    for d in sorted(p for p in sweep.iterdir() if (p / "results.json").is_file()):
        res = read_results(d)
        if res.get("job") == "serve_bench":
            rows += res.get("rows", [])
    return plot_vs_load(rows, sweep / "plots" / "serve_vs_load.png") if rows else None


def preflight(cfg: ServeBenchRunConfig) -> None:
    """What the user gave that can be wrong, checked before a model is built or a server started: the trace file
    (every row parsed) and a dead ``serve.endpoint``."""
    from phase6.serving.traces import iter_azure, iter_mooncake
    from phase6.serving.workload import HF_PREFIX, resolve_path

    load = cfg.load
    if load.dataset != "synthetic" and load.path is not None and not load.path.startswith(HF_PREFIX):
        path = resolve_path(load.path)
        if load.dataset in ("mooncake", "azure"):
            for _ in (iter_mooncake if load.dataset == "mooncake" else iter_azure)(path):
                pass
    if cfg.serve.endpoint is not None:
        servers.check_endpoint(cfg.serve.endpoint)


def main(cfg: ServeBenchRunConfig) -> dict[str, Any]:
    if cfg.capacity.search is not None:  # capacity mode: many probes on one server start
        from phase6.config import load_object

        return load_object("projects/6b_serving/capacity.py:main")(cfg)
    preflight(cfg)
    rec = RunRecord(cfg, job="serve_bench")
    model = resolve_model(cfg, rec)
    srv, reused = servers.acquire(cfg.serve, model, rec.dir / "server.log", wait=False)  # loads while we tokenize
    try:
        tok = load_tokenizer(cfg.serve.tokenizer or model)
        wl = build_workload(cfg.load, tok, cfg.run.seed, cfg.serve.max_model_len)
    except BaseException:
        servers.release(srv, cfg.serve)
        raise
    rec.print(
        f"workload: {wl.info['num_requests']} requests ({cfg.load.dataset}, {cfg.load.arrival}), "
        f"prompt mean {wl.info['prompt_len_mean']:.0f} / output mean {wl.info['output_len_mean']:.0f} tokens, "
        f"{wl.info['num_warmup']} warmup"
    )
    srv.wait_ready(cfg.serve.ready_timeout_s)
    rec.print(
        f"server: {cfg.serve.engine} {srv.version} at {srv.base_url} "
        f"({'reused' if reused else f'ready in {srv.startup_s:.1f} s'}), model id {srv.model_id}"
    )
    name = cfg.serve.served_model_name or srv.model_id
    body = dict(
        engine=cfg.serve.engine,
        api=cfg.load.api,
        model=name,
        fix_output_len=cfg.load.fix_output_len,
        temperature=cfg.load.temperature,
        extra_body=cfg.load.extra_body,
    )
    sampler = telemetry.Sampler(
        rec.dir / "telemetry.jsonl",
        srv.base_url + "/metrics",
        cfg.telemetry.metrics_interval_s,
        cfg.telemetry.nvml_interval_s,
    )
    starts: list[float] = []
    # exact counter deltas of the measured run: /metrics right after the warmup and once the run's counts settled
    metrics_url = srv.base_url + "/metrics"
    scrapes: dict[str, Any] = {}

    def scrape_before() -> None:
        scrapes["before"], scrapes["status"] = telemetry.scrape(metrics_url)

    try:
        sampler.start()
        outcome = run_benchmark(
            srv.base_url,
            cfg.load.api,
            [request_body(r, **body) for r in wl.requests],
            wl.schedule.tolist(),
            cfg.load.concurrency,
            warmup=[request_body(r, **body) for r in wl.warmup],
            connect_timeout_s=cfg.load.connect_timeout_s,
            read_timeout_s=cfg.load.read_timeout_s,
            request_timeout_s=cfg.load.request_timeout_s,
            abort_check=srv.exited,
            tokenizer=tok,
            requests=wl.requests,
            before_start=scrape_before,
            on_start=starts.append,
            on_progress=lambda done, sent, n: rec.print(f"  {done}/{n} finished, {sent} sent"),
        )
        if scrapes.get("before") is not None and srv.exited() is None:
            scrapes["after"] = telemetry.counters_settled(metrics_url)
    finally:
        sampler.stop()
        servers.release(srv, cfg.serve)

    row, details = summarize(
        outcome,
        engine=cfg.serve.engine,
        tp=cfg.serve.tp,
        concurrency=cfg.load.concurrency,
        request_rate=cfg.load.request_rate,
        num_gpus=cfg.serve.tp,
        usd_per_gpu_hour=cfg.hardware.usd_per_gpu_hour,
        slo=cfg.slo,
    )
    row.update(
        {
            "model": f"random:{cfg.serve.random_model}" if cfg.serve.random_model else cfg.serve.model,
            "load": cfg.load.name,
        }
    )
    server_counters = server_counter_record(rec.dir, scrapes, outcome)
    details["server_generation_tokens_delta"] = server_counters.get("delta", {}).get("generation_tokens_total")
    details.update(server_side_latency(server_counters.get("delta", {}), details))  # the server's TPOT/ITL beside ours
    for w in details["server_client_warnings"]:
        rec.print(f"serve-bench: WARNING {w}")
    t0 = starts[0] if starts else wall()
    tele = telemetry.summarize(
        sampler.out, t0 + outcome.first_dispatch_s, t0 + outcome.first_dispatch_s + outcome.duration_s
    )
    gpu = tele.get("gpu") or {}
    details.update(
        {
            "server_crashed": srv.exited() is not None,
            "server_running_mean": tele.get("server_running_mean"),
            "server_waiting_max": tele.get("server_waiting_max"),
            "server_kv_cache_usage_max": tele.get("server_kv_cache_usage_max"),
            "server_queue_time_mean_ms": tele.get("server_queue_time_mean_ms"),
            "gpu_util_mean_pct": (sum(g["util_mean_pct"] for g in gpu.values()) / len(gpu)) if gpu else None,
            "gpu_mem_max_gib": max((g["mem_max_gib"] for g in gpu.values()), default=None),
            "nvml": tele["nvml"],
            "server_metrics": tele["metrics"],
        }
    )

    with (rec.dir / "requests.jsonl").open("w") as f:
        for r in outcome.results:
            f.write(dumps(r.to_json()) + "\n")
    if cfg.telemetry.plots:
        title = f"{cfg.serve.engine} TP{cfg.serve.tp} {cfg.load.name}"
        plot_latency_cdfs(outcome, rec.plots_dir / "latency_cdf.png", title)
        plot_timeseries(outcome, t0, sampler.out, rec.plots_dir / "timeseries.png")

    predicted = None
    if cfg.predict:
        try:
            predicted = predict(cfg, wl, details, model)
        except ValueError as e:  # no planner spec for this model: say so in the results
            rec.print(f"prediction unavailable: {e}")
    measured = {k: row[k] for k in ("ttft_p50_ms", "tpot_p50_ms", "throughput_tok_s")}
    cost = run_cost(cfg.hardware, cfg.serve.tp, max(outcome.duration_s, 1e-9), details["output_tokens"])
    # as `phase6 cost`: input priced at the all-token rate, all GPU time charged to output tokens
    comparison = api_comparison(
        usd_per_1m_tokens(cfg.serve.tp, row["total_tok_s"], cfg.hardware.usd_per_gpu_hour),
        row["usd_per_1m_output_tokens"],
        cfg.prices.api,
    )
    rec.log(
        {
            M.SERVE_TTFT_MS_P50: row["ttft_p50_ms"],
            M.SERVE_TTFT_MS_P99: row["ttft_p99_ms"],
            M.SERVE_ITL_MS_P50: row["itl_p50_ms"],
            M.SERVE_ITL_MS_P99: row["itl_p99_ms"],
            M.SERVE_TPOT_MS_P50: row["tpot_p50_ms"],
            M.SERVE_TPOT_MS_P99: row["tpot_p99_ms"],
            M.SERVE_THROUGHPUT_TOK_S: row["throughput_tok_s"],
            M.SERVE_GOODPUT_REQ_S: row["goodput_req_s"],
            M.COST_GPU_HOURS: cost["gpu_hours"],
            M.COST_USD: cost["usd"],
        },
        step=0,
    )
    failures = [{"index": r.index, "error": r.error} for r in outcome.results if r.sent and not r.ok][:20]
    notes = {
        "Definitions": (
            "TTFT: send -> first non-empty content chunk (client queue time excluded, reported as queue_*). "
            "ITL: per-token gaps, a chunk of k tokens after gap g counts k samples of g/k; chunk_gap_* are raw "
            "chunk gaps. TPOT: (E2E - TTFT)/(output tokens - 1) per request. Throughput: server-reported output "
            "tokens of completed requests / (first dispatch -> last request end). "
            f"Goodput: completed requests meeting {cfg.slo.describe()} per second; failed requests are not good. "
            f"GPU-h per 1M output tokens = {cfg.serve.tp} GPUs x 1e6 / (3600 x output tok/s); "
            f"$ = that x ${cfg.hardware.usd_per_gpu_hour}/GPU-h ({cfg.hardware.source}, {cfg.hardware.date}). "
            "API comparison: our $/1M output tokens charges all GPU time to output tokens."
        ),
        "Untimed tokens": (
            f"{row['untimed_requests']} answers arrived whole in one socket read (no TPOT: left out of the TPOT "
            f"percentiles) and {row['untimed_tokens']} tokens came several SSE events to a read (no ITL sample); "
            "the client could not time them. Server-side means from /metrics: TPOT "
            f"{details.get('server_tpot_mean_ms')} ms, ITL {details.get('server_itl_mean_ms')} ms"
            + (f"; WARNING {'; '.join(details['server_client_warnings'])}" if details["server_client_warnings"] else "")
        ),
        "Accounting": (
            f"planned {details['planned']} = completed {row['completed']} + failed {row['failed']} "
            f"(sent {details['sent']}, not sent {details['not_sent']}); errors: "
            f"{json.dumps(details['errors'])}"
            + (f"; run aborted: {outcome.abort_reason}" if outcome.abort_reason else "")
        ),
    }
    rec.finish(
        [row],
        predicted=predicted,
        measured=measured if predicted else None,
        cost=cost,
        extra={
            "details": details,
            "server": {**srv.info(), "reused": reused},
            "server_metrics": server_counters,
            "workload": wl.info,
            "telemetry": tele,
            "slo": {"ttft_ms": cfg.slo.ttft_ms, "tpot_ms": cfg.slo.tpot_ms, "e2e_ms": cfg.slo.e2e_ms},
            "warmup_failed": outcome.warmup_failed,
            "client": {"pid": os.getpid()},
        },
        tables={
            "Details": [
                {"quantity": k, "value": v if not isinstance(v, dict) else json.dumps(v)} for k, v in details.items()
            ],
            "API price comparison": comparison,
            "First failures": failures,
        },
        notes=notes,
    )
    sweep_plot(rec)
    if row["completed"] == 0:  # recorded, not raised: the other members of a sweep still run
        print(f"serve-bench: WARNING no request completed ({json.dumps(details['errors'])})", flush=True)
    return {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
