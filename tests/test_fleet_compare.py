"""`phase6 fleet` simulated vs measured: it reads what `phase6 serve-bench` writes, replays the run's own requests,
and its C=1 calibration predicts C=16/64.

Run dirs here are written by serve-bench's own code (``RequestResult.to_json`` -> requests.jsonl,
``phase6.serving.stats.summarize`` -> the row, ``RunRecord`` + ``ServeBenchRunConfig`` -> config.yaml/results.json),
and tests/data/serve_bench_sweep_h200 is a trimmed copy of a real H200 sweep (torch-tp, Qwen2.5-14B shapes, TP=1):
if either side renames a field, these fail.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig, LoggerConfig, RunConfig
from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.config.serve import LengthDist, LoadConfig, ServeBenchRunConfig, ServeConfig
from phase6.fleet.compare import (
    calibrate,
    check_serve_bench,
    compare_serve_bench,
    engine_limits,
    engine_profile,
    fit_prefill,
    load_serve_bench,
    planned_run,
    predict_serve_bench,
    replica_config,
    ttft_line,
)
from phase6.fleet.run import FleetSetup, build_setup
from phase6.fleet.sim import EngineLimits, SimResult, Topology
from phase6.fleet.steptime import build_step_model, kv_capacity_blocks
from phase6.fleet.workload import Workload
from phase6.runrecord import RunRecord, dumps
from phase6.serving.client import RequestResult, RunOutcome
from phase6.serving.stats import summarize

REPO = CONFIG_DIR.parent
HW = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text()))
REAL = Path(__file__).parent / "data" / "serve_bench_sweep_h200"
ENGINE_ARGS = {"dummy-weights": True, "cuda-graphs": True, "max-batch": 64, "max-prefill-tokens": 16384}
TEMPLATE_TOKENS = 11  # chat template tokens the server counts on top of the client's prompt (877 vs 866 in REAL)


def write_serve_bench_run(run_dir: Path, w: Workload, res: SimResult, c: int) -> None:
    """A torch-tp serve-bench run dir for ``res`` (one closed-loop run of ``w`` at concurrency ``c``), written by
    the serve-bench code paths: per-request records, the summarized row, the run record with its config."""
    results = []
    for i in range(len(w)):
        ttft = float(res.first_token_s[i] - res.arrival_s[i])
        e2e = float(res.finish_s[i] - res.arrival_s[i])
        n_out = int(w.output_tokens[i])
        times = np.linspace(ttft, e2e, n_out).tolist()  # one chunk per token, evenly spaced after the first
        results.append(
            RequestResult(
                index=i,
                scheduled_s=0.0,
                prompt_len=int(w.input_tokens[i]) - TEMPLATE_TOKENS,
                requested_output_len=n_out,
                ok=True,
                status=200,
                dispatch_s=0.0,
                send_s=float(res.arrival_s[i]),
                end_s=float(res.finish_s[i]),
                chunk_times_s=times,
                chunk_tokens=[1] * n_out,
                output_tokens=n_out,
                tokens_source="usage",
                chunk_tokens_source="usage",
                prompt_tokens=int(w.input_tokens[i]),
                finish_reason="length",
            )
        )
    outcome = RunOutcome(results, duration_s=res.makespan_s, first_dispatch_s=0.0)
    cfg = ServeBenchRunConfig(
        run=RunConfig(dir=str(run_dir), name="t", seed=0),
        logger=LoggerConfig(wandb=False, console=False),
        hardware=HW,
        serve=ServeConfig(engine="torch-tp", model="outputs/models/llama3.1-8b", tp=1, engine_args=dict(ENGINE_ARGS)),
        load=LoadConfig(
            name="synthetic_h200",
            dataset="synthetic",
            path=None,
            concurrency=c,
            num_requests=len(w),
            prompt_dist=LengthDist("uniform", 550, 0, 100, 1000),
            output_dist=LengthDist("uniform", 96, 0, 64, 128),
        ),
    )
    row, details = summarize(
        outcome,
        engine="torch-tp",
        tp=1,
        concurrency=c,
        request_rate=None,
        num_gpus=1,
        usd_per_gpu_hour=HW.usd_per_gpu_hour,
        slo=cfg.slo,
    )
    rec = RunRecord(cfg, job="serve_bench")
    with (rec.dir / "requests.jsonl").open("w") as f:
        for r in outcome.results:
            f.write(dumps(r.to_json()) + "\n")
    rec.finish([row], extra={"details": details})


PLANTED = {"step_overhead_ms": 3.0, "prefill_overhead_ms": 40.0, "prefill_mfu": 0.35}
TORCH_TP = {"profile": "torch-tp", "max_model_len": 4096, "cuda_graphs": True}  # what the recorded run says


def planted_sweep(
    tmp_path: Path, profile: dict[str, object] = TORCH_TP, planted: dict[str, float] = PLANTED
) -> tuple[Path, FleetRunConfig, FleetSetup, EngineConfig]:
    """A 'measured' sweep C=1/16/64 made by the simulator with step overhead 3 ms, prefill overhead 40 ms and prefill
    MFU 0.35, requests of the 6B H200 load (prompts 100-1000, outputs 64-128), under the recorded torch-tp limits
    (64 seqs, 16384) and, by default, the torch-tp engine profile its config.yaml implies (cuda-graphs, 4096)."""
    cfg = FleetRunConfig(hardware=HW, model="llama3.1-8b", engine=EngineConfig(tp=1))
    setup = build_setup(cfg)
    true_eng = dataclasses.replace(cfg.engine, **planted, max_num_seqs=64, max_num_batched_tokens=16384, **profile)
    limits = EngineLimits(64, 16384, kv_capacity_blocks(setup.spec, HW, true_eng))
    true = dataclasses.replace(setup, model=build_step_model(setup.spec, HW, true_eng), engine=true_eng, limits=limits)
    rng = np.random.default_rng(0)
    for member, c in enumerate((1, 16, 64)):
        n = max(40, 10 * c)
        w = Workload(np.zeros(n), rng.integers(100, 1001, n), rng.integers(64, 129, n), np.arange(n), None, "planted")
        res = true.run(w, Topology(colocated=1), "round_robin", closed=c)
        write_serve_bench_run(tmp_path / "sweep" / str(member), w, res, c)
    return tmp_path / "sweep", cfg, setup, true_eng


def test_replay_reproduces_the_run_exactly(tmp_path: Path) -> None:
    """With the true engine and no calibration the replay is the same simulation: zero error. It must use the
    server's prompt counts (not the client's), the send order and the recorded limits (64 seqs, 16384 tokens)."""
    sweep, cfg, setup, true_eng = planted_sweep(tmp_path)
    runs, skipped = load_serve_bench(sweep)
    assert [r.concurrency for r in runs] == [1, 16, 64] and skipped == []
    assert engine_limits(runs[0], cfg.engine)[:2] == (64, 16384)
    exact = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **PLANTED))
    out, _ = compare_serve_bench(sweep, exact, setup, calibrate_rows=False)
    assert [o["concurrency"] for o in out] == [1, 16, 64]
    for o in out:
        assert abs(o["ttft_err_pct"]) < 1e-6 and abs(o["tpot_err_pct"]) < 1e-6, o
        assert o["throughput_tok_s_sim"] == pytest.approx(o["throughput_tok_s_measured"], rel=1e-9)
        assert o["engine_limits"] == "torch-tp max-batch=64, torch-tp max-prefill-tokens=16384"
        assert o["engine_profile"].startswith("torch-tp (prompts padded to the step's longest, max-model-len 4096")
    # the same requests at their mean lengths are a different experiment (lockstep closed loop)
    mean, _ = compare_serve_bench(sweep, exact, setup, calibrate_rows=False, lengths="mean")
    assert max(abs(o["ttft_err_pct"]) for o in mean) > 5


def test_calibration_on_c1_predicts_c16_c64(tmp_path: Path) -> None:
    """Fitting on the C=1 run alone recovers the planted 3 ms / 40 ms / 0.35 (TPOT p50; TTFT vs prompt length over
    its requests), and then C=16 and C=64 are predicted to 0.01 % (the planner defaults are off by > 20 %)."""
    sweep, cfg, setup, _ = planted_sweep(tmp_path)
    runs, _ = load_serve_bench(sweep)
    engine, limits, _, _ = replica_config(runs[0], cfg, setup)
    assert (engine.profile, engine.max_num_seqs, engine.max_num_batched_tokens) == ("torch-tp", 64, 16384)
    fit = calibrate(setup, runs[0], engine, limits)
    for k, v in PLANTED.items():
        assert getattr(fit, k) == pytest.approx(v, rel=1e-4), k
    out, _ = compare_serve_bench(sweep, cfg, setup)
    # C=16 is the second calibration run (torch-tp new-prefill-shape cost; the planted engine has none: 0 ms)
    assert [o["role"] for o in out] == ["calibration (fitted here)", "calibration (new-shape cost)", "prediction"]
    assert "; new-shape cost 0.0 ms (" in out[2]["calibration"]
    assert out[2]["calibration"].startswith(
        "fitted at C=1 on the torch-tp (prompts padded to the step's longest, max-model-len 4096, CUDA-graph decode "
        "buckets) replica: step overhead 3.00 ms, prefill overhead 40.0 ms, "
        "prefill_mfu 0.350 (TTFT fit mean |error| 0.0 ms over 40 requests"
    )
    for o in out:
        assert abs(o["ttft_err_pct"]) < 0.01 and abs(o["tpot_err_pct"]) < 0.01 and o["within_20pct"], o
    raw, _ = compare_serve_bench(sweep, cfg, setup, calibrate_rows=False)
    assert any(not o["within_20pct"] for o in raw)  # planner defaults miss: the calibration is what predicts
    with pytest.raises(ValueError, match=r"/1: the calibration needs the concurrency-1 run .* got concurrency 16"):
        calibrate(setup, runs[1], cfg.engine, limits)
    shutil.rmtree(sweep / "0")  # no C=1 run left: the config check fails early, naming the key
    with pytest.raises(
        ValueError,
        match=r"^analysis.compare_calibrate: .* no concurrency-1 run for TP=1 \(only "
        r"\[16, 64\]\)",
    ):
        check_serve_bench(sweep, cfg)
    check_serve_bench(
        sweep, dataclasses.replace(cfg, analysis=dataclasses.replace(cfg.analysis, compare_calibrate=False))
    )


PLANTED_VLLM = {"step_overhead_ms": 3.0, "request_overhead_ms": 40.0, "prefill_overhead_ms": 0.0, "prefill_mfu": 0.35}


def test_vllm_calibration_charges_the_ttft_intercept_per_request(tmp_path: Path) -> None:
    """On a vllm replica the C=1 TTFT intercept is fitted as request_overhead_ms (once per request, outside the
    steps), recovering the planted 40 ms, and C=16/64 are then predicted exactly. Charging the same 40 ms to every
    step that carries a prefill chunk instead (prefill_overhead_ms) fits C=1 as well but makes loaded decodes wait
    for it: TPOT at C=64 comes out far too high."""
    sweep, cfg, setup, _ = planted_sweep(tmp_path, profile={}, planted=PLANTED_VLLM)
    runs, _ = load_serve_bench(sweep)
    engine, limits, _, _ = replica_config(runs[0], cfg, setup, "vllm")
    fit = calibrate(setup, runs[0], engine, limits)
    for k, v in PLANTED_VLLM.items():
        assert getattr(fit, k) == pytest.approx(v, rel=1e-4, abs=1e-9), k
    out, _ = compare_serve_bench(sweep, cfg, setup, profile="vllm")
    assert "request overhead 40.0 ms (per request, outside the steps)" in out[0]["calibration"]
    for o in out:
        assert abs(o["ttft_err_pct"]) < 0.01 and abs(o["tpot_err_pct"]) < 0.01 and o["within_20pct"], o
    per_step = dataclasses.replace(
        cfg.engine, **{**PLANTED_VLLM, "request_overhead_ms": 0.0, "prefill_overhead_ms": 40.0}
    )
    wrong, _ = compare_serve_bench(sweep, dataclasses.replace(cfg, engine=per_step), setup, False, profile="vllm")
    assert abs(wrong[0]["ttft_err_pct"]) < 1  # C=1: the same TTFT either way
    assert wrong[2]["tpot_err_pct"] > 20  # C=64: every step with a prompt chunk pays 40 ms


def test_prefill_fit_is_robust_to_a_stray_request(tmp_path: Path) -> None:
    """One C=1 request 1 s late (a hiccup, like the real TP=1 run's 1158 ms request) barely moves the
    least-absolute-deviation fit; a least-squares line would take ~50 ms of intercept from it."""
    sweep, cfg, setup, _ = planted_sweep(tmp_path)
    run = load_serve_bench(sweep / "0")[0][0]
    eng, limits, _, _ = replica_config(run, cfg, setup)
    eng = dataclasses.replace(eng, step_overhead_ms=3.0)
    clean = fit_prefill(setup, run, eng, limits)
    assert clean[0] == pytest.approx(0.35, rel=1e-4) and clean[1] == pytest.approx(40.0, rel=1e-4) and clean[2] < 1e-3
    run.ttft_ms[5] += 1000.0
    mfu, overhead, mad = fit_prefill(setup, run, eng, limits)
    assert mfu == pytest.approx(0.35, rel=0.05) and overhead == pytest.approx(40.0, abs=2.0)
    assert mad == pytest.approx(1000.0 / len(run.ttft_ms), rel=0.1)  # the stray request is the whole residual
    # the Theil-Sen line reported beside the fit: exact on a line, and also unmoved by the stray request
    on_line = dataclasses.replace(run, ttft_ms=100.0 + 0.05 * run.input_tokens)
    assert ttft_line(on_line) == pytest.approx((100.0, 50.0), rel=1e-9)
    on_line.ttft_ms[5] += 1000.0
    assert ttft_line(on_line) == pytest.approx((100.0, 50.0), rel=1e-9)


def test_real_h200_sweep_schema(tmp_path: Path) -> None:
    """A trimmed real serve-bench sweep: lengths equal serve-bench's own totals, an unfinished member is skipped by
    name, limits come from the recorded torch-tp args, and the comparison runs end to end."""
    runs, skipped = load_serve_bench(REAL / "0" / "results.json")
    (run,) = runs
    res = json.loads((REAL / "0" / "results.json").read_text())
    assert run.input_tokens.sum() == res["details"]["input_tokens"] == 11886  # server-counted prompts
    assert run.output_tokens.sum() == res["details"]["output_tokens"] == 1861
    assert run.input_tokens[0] == 877 and run.prompt_from_client == 0
    runs, skipped = load_serve_bench(REAL)
    assert len(runs) == 1 and len(skipped) == 1 and "serve_bench_sweep_h200/1: no results.json" in skipped[0]
    cfg = FleetRunConfig(hardware=HW, model=str(REAL / "qwen2.5-14b_config.json"), engine=EngineConfig(tp=1))
    assert engine_limits(run, cfg.engine)[:2] == (64, 16384)
    (o,), _ = compare_serve_bench(REAL, cfg, build_setup(cfg))
    assert o["tp"] == 1 and o["concurrency"] == 1 and o["requests"] == 20 and o["role"] == "calibration (fitted here)"
    assert o["ttft_p50_ms_measured"] == pytest.approx(165.57, abs=0.01)
    assert abs(o["tpot_err_pct"]) < 1 and abs(o["ttft_err_pct"]) < 20  # fitted on this run's p50s


def test_bad_records_name_the_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(REAL / "0", run)
    lines = (run / "requests.jsonl").read_text().splitlines()
    (run / "requests.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(
        ValueError, match=r"requests.jsonl: 19 completed requests, but results.json says completed = 20"
    ):
        load_serve_bench(run)
    rec = json.loads(lines[3])
    del rec["ttft_s"]
    (run / "requests.jsonl").write_text("\n".join([*lines[:3], json.dumps(rec), *lines[4:]]) + "\n")
    with pytest.raises(ValueError, match=r"requests.jsonl:4: a completed request needs a number ttft_s >= 0, got None"):
        load_serve_bench(run)
    (run / "requests.jsonl").unlink()
    with pytest.raises(ValueError, match=r"run/requests.jsonl: not found"):
        load_serve_bench(run)
    res = json.loads((REAL / "0" / "results.json").read_text())
    del res["rows"][0]["ttft_p50_ms"]
    (run / "results.json").write_text(json.dumps(res))
    with pytest.raises(ValueError, match=r"results.json: rows\[0\] lacks numeric ttft_p50_ms"):
        load_serve_bench(run)


def test_cli_on_real_sweep_and_hardware_mismatch(tmp_path: Path) -> None:
    model = str(REAL / "qwen2.5-14b_config.json")
    base = [
        sys.executable,
        "-m",
        "phase6",
        "fleet",
        "experiment=compare",
        f"analysis.compare_with={REAL}",
        f"model={model}",
        "logger=none",
    ]
    proc = subprocess.run(
        [*base, "hardware=h200", f"run.dir={tmp_path / 'ok'}"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| 1 | 1 | 20 | 165.6 |" in proc.stdout and "skipped:" in proc.stdout
    table = json.loads((tmp_path / "ok" / "results.json").read_text())["tables"]["Simulated vs measured (serve-bench)"]
    assert len(table) == 1 and table[0]["engine"] == "torch-tp"
    proc = subprocess.run(
        [*base, "hardware=h100_sxm", f"run.dir={tmp_path / 'bad'}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"phase6: error: hardware: the fleet simulates h100_sxm but {REAL / '0'} was measured on h200 (its "
        "config.yaml); pass hardware=h200"
    ]


def test_prefill_steps_script_recovers_a_step(tmp_path: Path) -> None:
    """scripts/repro/prefill_steps.py: two prompts whose first tokens arrive together are one prefill step; the gap of a
    request decoding across it is the step's duration (the numbers behind docs/benchmarks.md's explanation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prefill_steps", REPO / "scripts" / "repro" / "prefill_steps.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def rec(i: int, send: float, chunks: list[float], prompt: int) -> str:
        return json.dumps(
            {
                "index": i,
                "ok": True,
                "send_s": send,
                "ttft_s": chunks[0],
                "chunk_times_s": chunks,
                "prompt_tokens": prompt,
            }
        )

    run = tmp_path / "run"
    run.mkdir()
    decoder = [0.050, 0.060, 0.070, 0.220, 0.230]  # a 150 ms gap ends at t = 0.220
    (run / "requests.jsonl").write_text(
        "\n".join(
            [
                rec(0, 0.0, decoder, 400),
                rec(1, 0.075, [0.145, 0.155], 300),  # first token at 0.220
                rec(2, 0.080, [0.1405, 0.1505], 500),  # first token at 0.2205: the same step
            ]
        )
        + "\n"
    )
    steps, ttft = mod.prefill_steps(run)
    assert steps.tolist() == [[2.0, 800.0, 1000.0, pytest.approx(150.0)]]  # request 0's own prefill has no witness
    assert ttft[:, 0].tolist() == [400, 300, 500]


def test_torch_tp_limits_default_to_the_server_defaults(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(REAL / "0", run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    del cfg["serve"]["engine_args"]["max-prefill-tokens"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (measured,), _ = load_serve_bench(run)
    seqs, budget, src = engine_limits(measured, EngineConfig(tp=1))
    assert (seqs, budget) == (64, 8192)  # phase6.serving.tp_server ServerArgs.max_prefill_tokens
    assert src == "torch-tp max-batch=64, torch-tp max-prefill-tokens=8192 (default)"
    cfg["serve"]["engine"] = "sglang"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (measured,), _ = load_serve_bench(run)
    assert engine_limits(measured, EngineConfig(tp=1, max_num_seqs=32, max_num_batched_tokens=4096)) == (
        32,
        4096,
        "engine.max_num_seqs=32, engine.max_num_batched_tokens=4096",
    )


def test_calibration_bootstrap_script(tmp_path: Path) -> None:
    """scripts/repro/fleet_calibration_bootstrap.py: refits on resampled C=1 requests of a planted (noise-free) sweep give
    the planted parameters and exact predictions every time, so its intervals measure the measured sample only."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("boot", REPO / "scripts" / "repro" / "fleet_calibration_bootstrap.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sweep, _, _, _ = planted_sweep(tmp_path)
    rows = {r["quantity"]: r for r in mod.bootstrap(sweep, "llama3.1-8b", "h200", n=2)}
    assert set(rows) == {
        "step_overhead_ms",
        "prefill_overhead_ms",
        "prefill_mfu",
        "C=16 ttft_err_pct",
        "C=16 tpot_err_pct",
        "C=64 ttft_err_pct",
        "C=64 tpot_err_pct",
    }
    for k, v in PLANTED.items():
        assert rows[k]["p5"] == pytest.approx(v, rel=1e-4) and rows[k]["p95"] == pytest.approx(v, rel=1e-4), k
    for k in ("C=16 ttft_err_pct", "C=64 tpot_err_pct"):
        assert abs(rows[k]["p5"]) < 0.01 and abs(rows[k]["p95"]) < 0.01, rows[k]


def test_engine_profile_follows_the_measured_engine(tmp_path: Path) -> None:
    """compare_profile=auto replays a torch-tp run with the torch-tp mechanics and the run's own flags; vllm (the
    generic replica) on the same planted torch-tp sweep is no longer exact: padding and buckets are what differ."""
    sweep, cfg, setup, _ = planted_sweep(tmp_path)
    runs, _ = load_serve_bench(sweep)
    prof, desc = engine_profile(runs[0])
    assert prof == TORCH_TP and desc.startswith("torch-tp")
    assert engine_profile(runs[0], "vllm")[0] == {"profile": "vllm"}
    run = dataclasses.replace(runs[0], config={**runs[0].config, "serve": {"engine": "torch-tp", "engine_args": {}}})
    assert engine_profile(run)[0] == {"profile": "torch-tp", "max_model_len": 4096, "cuda_graphs": False}  # defaults
    run = dataclasses.replace(runs[0], config={"serve": {"engine": "vllm"}}, row={**runs[0].row, "engine": "vllm"})
    assert engine_profile(run)[0] == {"profile": "vllm"}
    exact = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **PLANTED))
    generic, _ = compare_serve_bench(sweep, exact, setup, calibrate_rows=False, profile="vllm")
    assert generic[0]["engine_profile"].startswith("vllm") and abs(generic[2]["ttft_err_pct"]) > 1
    # a sweep made by the generic replica is reproduced exactly by compare_profile=vllm (the earlier behaviour)
    sweep2, _, _, _ = planted_sweep(tmp_path / "v", profile={})
    out, _ = compare_serve_bench(sweep2, exact, setup, calibrate_rows=False, profile="vllm")
    assert all(abs(o["ttft_err_pct"]) < 1e-6 and abs(o["tpot_err_pct"]) < 1e-6 for o in out)


def test_predictions_equal_the_later_comparison(tmp_path: Path) -> None:
    """predict_serve_bench (scripts/repro/fleet_predict.py) on planned runs, calibrated on the C=1 run, prints exactly the
    simulated columns compare_serve_bench prints once those runs are measured (blind tests are reproducible)."""
    sweep, cfg, setup, _ = planted_sweep(tmp_path)
    runs, _ = load_serve_bench(sweep)
    serve = runs[1].config["serve"]
    planned = [
        planned_run(f"C={r.concurrency}", serve, 1, r.concurrency, r.input_tokens, r.output_tokens) for r in runs[1:]
    ]
    pred = predict_serve_bench(sweep, planned, cfg, setup)
    out, _ = compare_serve_bench(sweep, cfg, setup)
    for p, o in zip(pred, out[1:], strict=True):
        assert (p["concurrency"], p["ttft_p50_ms_sim"], p["tpot_p50_ms_sim"]) == (
            o["concurrency"],
            o["ttft_p50_ms_sim"],
            o["tpot_p50_ms_sim"],
        )
        assert p["throughput_tok_s_sim"] == o["throughput_tok_s_sim"]


def test_vllm_steps_script_reads_steps_and_token_gaps(tmp_path: Path) -> None:
    """scripts/repro/fleet_vllm_steps.py through phase6.fleet.steps / tokens: chunks within 2 ms are one step (first tokens = its prompts, the rest its decode
    rows at context prompt + token index); the simulated per-token gaps of a replay add up, request by request, to
    E2E - TTFT (every token gap counted once)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fleet_vllm_steps", REPO / "scripts" / "repro" / "fleet_vllm_steps.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = tmp_path / "run"
    run.mkdir()
    recs = [  # request 0 decodes through steps ending at 0.100 / 0.110 / 0.150; request 1's prompt finishes at 0.150
        {"index": 0, "ok": True, "send_s": 0.0, "prompt_tokens": 500, "chunk_times_s": [0.090, 0.100, 0.110, 0.1505]},
        {"index": 1, "ok": True, "send_s": 0.105, "prompt_tokens": 700, "chunk_times_s": [0.0451, 0.055]},
    ]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps = mod.run_steps(run)[1:]  # as the script reads them (phase6.fleet.steps), the first has no duration
    assert [(s.prompts, s.decode_rows, s.decode_ctx) for s in steps] == [
        ([], 1, 501),
        ([], 1, 502),
        ([700], 1, 503),
        ([], 1, 701),
    ]
    assert [round(1e3 * s.duration_s, 3) for s in steps] == [10.0, 10.0, 40.1, 9.9]
    assert sorted(np.round(mod.measured_itl_ms(run), 3).tolist()) == [9.9, 10.0, 10.0, 40.5]
    sweep, cfg, setup, _ = planted_sweep(tmp_path, profile={}, planted=PLANTED_VLLM)
    c64 = load_serve_bench(sweep)[0][2]
    engine, limits, _, _ = replica_config(c64, cfg, setup, "vllm")
    res = mod.cmp.replay(setup, c64, dataclasses.replace(engine, **PLANTED_VLLM), limits)
    gaps = mod.sim_itl_ms(res)
    assert len(gaps) == int((res.output_tokens - 1).sum())
    assert gaps.sum() == pytest.approx(1e3 * float((res.finish_s - res.first_token_s).sum()), rel=1e-9)
