"""Simulator predictions for serve-bench runs not measured yet (blind tests of `phase6 fleet experiment=compare`).

    python scripts/repro/fleet_predict.py outputs/gpu/tp1 --model outputs/models/qwen2.5-14b --hardware h200 -- \\
        experiment=gpu_h200_tp serve.tp=1 load.concurrency=32,48

The arguments after ``--`` are the serve-bench overrides of the planned run (a sweep: every member is predicted).
For each member this composes serve-bench's config, builds the exact requests serve-bench will send
(``phase6.serving.workload.build_workload`` with the served model's tokenizer and the run's seed; prompt tokens
counted as the server counts them: the client's count + the chat-template tokens the server added in the
calibration run), calibrates on the concurrency-1 run
under the first argument (as the compare does) and replays those requests: the numbers a later

    phase6 fleet experiment=compare analysis.compare_with=<sweep holding that C=1 run and the new runs> ...

prints in its ``_sim`` columns, as long as the server reports the same token counts. ``--check`` first rebuilds the
calibration run's own requests and asserts they equal its requests.jsonl (prompt and output tokens, in order).
Both engine profiles are printed (auto = the measured engine's own mechanics, the compare's default; vllm = the
generic chunked-prefill replica).

    python scripts/repro/fleet_predict.py none --template-tokens 11 --model M --hardware h200 -- experiment=gpu_h200_vllm ...

``none``: an engine never measured yet (no concurrency-1 run to calibrate on): the planner's own efficiencies
(configs/fleet.yaml ``engine.*``: prefill MFU 0.5, decode HBM efficiency 0.7, no step or prefill overhead) on the
vllm profile; ``--template-tokens`` = the tokens the server's chat template adds to each prompt.

Reproduces: docs/benchmarks.md § Blind test 2: predictions written before the run
Reproduces: docs/benchmarks.md § Blind test 3: prediction
Reproduces: docs/benchmarks.md § Blind test 4: prediction
Reproduces: docs/benchmarks.md § Fleet simulator: vLLM rows predicted before they were measured
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def template_tokens(calibration: str) -> int:
    """Tokens the server adds to the client's prompt count (chat template), read from the calibration run's
    requests.jsonl (server usage ``prompt_tokens`` - client ``prompt_len``; must be one value)."""
    offsets = set()
    for f in sorted(Path(calibration).glob("**/requests.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r and r.get("ok") and isinstance(r.get("prompt_tokens"), int) and isinstance(r.get("prompt_len"), int):
                offsets.add(r["prompt_tokens"] - r["prompt_len"])
    if len(offsets) != 1:
        raise SystemExit(f"fleet_predict: {calibration}: server - client prompt tokens is not one value: {offsets}")
    return offsets.pop()


def planned_requests(overrides: list[str], offset: int) -> list[tuple[Any, list[int], list[int]]]:
    """(serve-bench config, server-counted prompt tokens = client count + ``offset``, output tokens) of every member
    of the planned sweep."""
    from transformers import AutoTokenizer

    from phase6.launch import preflight
    from phase6.serving.workload import build_workload

    out = []
    for cfg in preflight("serve_bench", overrides, multirun=True):
        if cfg.serve.random_model:
            raise SystemExit("fleet_predict: serve.random_model builds its model at run time; pass a model dir")
        if cfg.load.concurrency is None or not cfg.load.fix_output_len:
            raise SystemExit("fleet_predict: needs a closed-loop run (load.concurrency) with fixed output lengths")
        tok = AutoTokenizer.from_pretrained(cfg.serve.tokenizer or cfg.serve.model, trust_remote_code=False)
        wl = build_workload(cfg.load, tok, cfg.run.seed, cfg.serve.max_model_len)
        out.append((cfg, [r.prompt_len + offset for r in wl.requests], [r.output_len for r in wl.requests]))
    return out


def predict_uncalibrated(planned: list[Any], cfg: Any, setup: Any) -> tuple[list[dict[str, Any]], str]:
    """Each planned run replayed on the generic vllm replica with the fleet config's own efficiencies (no fit): the
    ``_sim`` columns ``phase6 fleet experiment=compare analysis.compare_calibrate=false analysis.compare_profile=vllm``
    prints once those runs are measured. Returns (rows, replica description)."""
    from phase6.fleet.compare import replay, replica_config, sim_columns

    rows, desc = [], ""
    for run in planned:
        engine, limits, limits_src, prof = replica_config(run, cfg, setup, "vllm")
        desc = f"{prof}; limits {limits_src}"
        rows.append(sim_columns(run, run.row["tp"], replay(setup, run, engine, limits)))
    return rows, desc


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="fleet_predict.py")
    p.add_argument("calibration", help="serve-bench run or sweep dir holding the concurrency-1 run of each TP")
    p.add_argument("--model", required=True)
    p.add_argument("--hardware", required=True)
    p.add_argument("--check", action="store_true", help="verify the request rebuild on the C=1 run first")
    p.add_argument("--template-tokens", type=int, default=None, help="chat-template tokens per prompt (with none)")
    a = p.parse_args(argv[:i])
    overrides = argv[i + 1 :]
    uncalibrated = a.calibration == "none"
    if uncalibrated and (a.template_tokens is None or a.check):
        p.error("calibration 'none' needs --template-tokens and cannot --check")
    offset = a.template_tokens if uncalibrated else template_tokens(a.calibration)

    from phase6.fleet.compare import load_serve_bench, planned_run, predict_serve_bench
    from phase6.fleet.run import build_setup
    from phase6.launch import load_config
    from phase6.runrecord import markdown_table

    if a.check:
        runs = [r for r in load_serve_bench(a.calibration)[0] if r.concurrency == 1]
        for run in runs:
            rec = run.config.get("load") or {}
            ov = [o for o in overrides if not o.startswith("load.concurrency=")]
            ov += ["load.concurrency=1", f"serve.tp={run.row.get('tp', 1)}", f"run.seed={run.config['run']['seed']}"]
            (_, prompts, outputs), *_ = planned_requests(ov, offset)
            same = prompts == run.input_tokens.tolist() and outputs == run.output_tokens.tolist()
            print(
                f"check {run.run_dir}: rebuilt {len(prompts)} requests (prompt mean {sum(prompts) / len(prompts):.1f}) "
                f"{'== its requests.jsonl' if same else '!= its requests.jsonl'} ({rec.get('name')})"
            )
            if not same:
                return 1
    fleet = load_config("fleet", ["experiment=compare", f"model={a.model}", f"hardware={a.hardware}"])
    setup = build_setup(fleet)
    planned = [
        planned_run(
            f"C={cfg.load.concurrency}",
            dataclasses.asdict(cfg.serve),
            cfg.serve.tp,
            int(cfg.load.concurrency),
            prompts,
            outputs,
        )
        for cfg, prompts, outputs in planned_requests(overrides, offset)
    ]
    keys = ("tp", "concurrency", "requests", "mean_input_tokens", "mean_output_tokens", "ttft_p50_ms_sim")
    keys += ("tpot_p50_ms_sim", "throughput_tok_s_sim", "makespan_s_sim")
    if uncalibrated:
        rows, desc = predict_uncalibrated(planned, fleet, setup)
        print(f"engine profile vllm, uncalibrated: {desc}")
        print(
            f"planner efficiencies: prefill_mfu {fleet.engine.prefill_mfu}, decode_hbm_efficiency "
            f"{fleet.engine.decode_hbm_efficiency}, step overhead {fleet.engine.resolved_step_overhead_ms} ms, per decode "
            f"row {fleet.engine.resolved_decode_seq_ms} ms, per request {fleet.engine.resolved_request_overhead_ms} ms, "
            f"prefill overhead {fleet.engine.prefill_overhead_ms} ms"
        )
        print(markdown_table([{k: r[k] for k in keys} for r in rows]), end="")
        return 0
    for profile in ("auto", "vllm"):
        rows = predict_serve_bench(a.calibration, planned, fleet, setup, profile)
        print(f"\nengine profile {profile}: {rows[0]['engine_profile']}")
        print(markdown_table([{k: r[k] for k in keys} for r in rows]), end="")
        print(f"calibration: {rows[0]['calibration']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
