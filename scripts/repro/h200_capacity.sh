#!/usr/bin/env bash
# Issue 33 on the lent H200: serve-bench capacity mode against ONE vLLM 0.26 server that phase6 starts (Qwen2.5-14B
# architecture, dummy weights, TP=1, the 2026-12-01 vLLM flags), Poisson rate search at the README's SLO (TTFT <= 2 s
# AND TPOT <= 100 ms, 90 % of requests), the fleet simulator's prediction as the first probe.
# Reproduces docs/benchmarks.md "6B capacity at an SLO: vLLM on one H200 (issue 33)".
#
# Runs after the vLLM carry made vLLM importable from /tmp/site (call F2, after piece 01; Hydra is there too):
#   mkdir -p /tmp/i33 && tar -xJf .device/i33/repo.tar.xz -C /tmp/i33 && bash /tmp/i33/scripts/repro/h200_capacity.sh $PWD/.device/i33
#
# CARRY (.device/i33): repo.tar.xz (this branch, git archive), models/qwen2.5-14b-fullvocab (config.json + tokenizer,
# scripts/make_dummy_model.py --full-vocab), whl/simpy-*.whl (the simulator's event loop; the image lacks SimPy).
# Budget: <= 420 s wall: capacity.time_budget_s=330 from the run's start (vLLM cold start ~190-230 s included; no
# probe starts that could not end inside it), then results + teardown; a hard `timeout 395` around it all.
# $OUT: capacity.tar.xz (the run dir: results.json, prediction.json, requests.jsonl, server.log, telemetry.jsonl,
# plots) and capacity.log; the table is printed last.
# CAPACITY_EXTRA (optional): more serve-bench overrides, e.g. a CPU dry run of this script with `python3` -> the vLLM
# venv and CAPACITY_EXTRA="hardware=cpu serve=vllm_tiny serve.plan_model=null load=smoke_vllm ...".
set -uo pipefail
carry=$(realpath "$1")
R=$(cd "$(dirname "$0")/../.." && pwd)
W=/tmp/i33w
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
t0=$(date +%s)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" "$carry"/whl/*.whl
export PYTHONPATH=/tmp/site:$W/site:$R/src
PHASE6_VLLM_PYTHON=$(command -v python3)
export PHASE6_VLLM_PYTHON
if ! python3 -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('vllm', 'hydra', 'simpy')))"; then
    echo "h200_capacity: vLLM/Hydra not importable from /tmp/site (unpack the vLLM carry's pieces first)"
    exit 3
fi
M=$W/qwen2.5-14b-fullvocab
rm -rf "$M" "$W/run"
cp -r "$carry/models/qwen2.5-14b-fullvocab" "$M"
cd "$R" || exit 4
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } 2>&1 | tee "$OUT/capacity.log"
timeout -k 10 395 python3 -m phase6 serve-bench experiment=capacity_h200_vllm serve.model="$M" \
    serve.plan_model="$M/config.json" run.dir="$W/run" ${CAPACITY_EXTRA:-} >> "$OUT/capacity.log" 2>&1
rc=$?
echo "serve-bench rc=$rc after $(($(date +%s) - t0)) s" | tee -a "$OUT/capacity.log"
tar --exclude=run/random_model -cJf "$OUT/capacity.tar.xz" -C "$W" run 2>/dev/null
grep -a -E '^(prediction: |server: |probe [0-9]+: |capacity: )' "$OUT/capacity.log" | tail -12
python3 - "$W/run" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
if not (d / "results.json").is_file():
    print("no results.json"); sys.exit(0)
res = json.loads((d / "results.json").read_text())
if res.get("status") != "complete":
    print("FAILED:", res.get("error")); sys.exit(0)
f = lambda v, p=3: "-" if v is None else (f"{v:.{p}g}" if isinstance(v, float) else str(v))
print("| probe | req/s | attain [95% CI] | TTFT att | TPOT att | sim att | goodput req/s | out tok/s | TTFT p99 ms | queue mean ms | ITL p99 ms | TPOT p99 ms | $/1M out |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in res["rows"]:
    print(f"| {p['probe']} | {f(p['load'], 4)} | {f(p['attainment'])} [{f(p['attainment_ci_low'])}, {f(p['attainment_ci_high'])}] | "
          f"{f(p.get('ttft_attainment'))} | {f(p.get('tpot_attainment'))} | {f(p.get('attainment_sim'))} | {f(p['goodput_req_s'])} | "
          f"{f(p['throughput_tok_s'], 4)} | {f(p['ttft_p99_ms'], 4)} | {f(p.get('server_queue_time_mean_ms'))} | {f(p['itl_p99_ms'])} | "
          f"{f(p['tpot_p99_ms'])} | {f(p['usd_per_1m_output_tokens'])} |")
c = res["capacity"]
print(f"capacity {f(c['value'], 4)} req/s, CI {[f(x, 4) for x in c['ci']]}, bracket [{f(c['highest_passing_load'], 4)}, "
      f"{f(c['lowest_failing_load'], 4)}], predicted {f(c['predicted'], 4)} ({f(c['predicted_error_pct'])} %), "
      f"slo_broken_first {res['slo_broken_first']}, at capacity {json.dumps(c['at_capacity'])}, stop: {c['stop_reason']}")
PY
