#!/usr/bin/env bash
# Issue 29 follow-up on the lent H200: phase6's client and `python -m sglang.bench_serving` ALTERNATING on one warmed
# SGLang 0.5.16 server (Qwen2.5-14B architecture, dummy weights, experiment=gpu_h200_sglang's command line), to
# separate the C=1 TTFT gap of the first call into server warm-up and client; then both clients at C=64 on that same
# server (the first call's C=64 bench_serving was cut by its budget).
# Reproduces: docs/benchmarks.md § SGLang's client beside phase6's, alternating on one server (issue 29)
#
#   BUDGET=330 bash scripts/repro/h200_sglang_clients.sh $PWD/.device/i29      # from the checkout, carry .device/i29
#
# CARRY: the same as scripts/repro/h200_sglang.sh (site.tar.xz.00 + manifest.json, setup.tar.xz).
# Order on one server: phase6 C=1 (the fresh server's first 21 requests), then bench C=1, phase6 C=1, bench C=1,
# phase6 C=1, then bench C=64 and phase6 C=64, each as the budget allows. Every run has the server's /metrics
# scraped before and after (SGLang's own TTFT histogram: the server's share of TTFT, whichever client sent it).
# $OUT gets sglang_clients.tar.xz and h200_sglang_clients.log; the summary (h200_sglang_summary.py) is printed last.
set -uo pipefail
carry=$(realpath "$1")
W=${W:-/tmp/i29c}
R=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$W/out}
RUNS=$W/runs
LOG=$OUT/h200_sglang_clients.log
mkdir -p "$RUNS/sbench" "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$SITE:$R/src
M=$W/models/qwen2.5-14b-fullvocab
URL=http://127.0.0.1:30000
t0=$(date +%s)
BUDGET=${BUDGET:-330}
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((BUDGET - $(date +%s) + t0)); }
hget() {
    python3 -c "import sys, urllib.request as u; sys.stdout.buffer.write(u.urlopen(sys.argv[1], timeout=5).read())" "$1" \
        2>/dev/null
}
p6() { # phase6's client, C=$1, run dir $2
    [ "$(left)" -lt "$3" ] && { el "no time for phase6 C=$1 ($2)"; return 1; }
    timeout $(($(left) - 10)) python3 -m phase6 serve-bench experiment=gpu_h200_sglang serve.endpoint=$URL \
        serve.model="$M" serve.plan_model="$M/config.json" load.concurrency="$1" run.dir="$RUNS/$2" \
        > "$RUNS/$2.log" 2>&1
    el "phase6 C=$1 $2 rc=$?"
}
sb() { # SGLang's client, C=$1, name $2
    [ "$(left)" -lt "$3" ] && { el "no time for bench C=$1 ($2)"; return 1; }
    n=$(python3 -c "import json; print([e['requests'] for e in json.load(open('$W/req/index.json')) if e['concurrency'] == $1][0])")
    hget $URL/metrics > "$RUNS/sbench/$2.before.prom"
    timeout $(($(left) - 10)) python3 -m sglang.bench_serving --backend sglang-oai-chat --base-url $URL --model "$M" \
        --tokenizer "$M" --dataset-name custom --dataset-path "$W/req/sglang_c$1.jsonl" --num-prompts "$n" \
        --max-concurrency "$1" --request-rate inf --temperature 0 --warmup-requests "$1" --seed 1337 \
        --output-file "$RUNS/sbench/$2.jsonl" --output-details --disable-tqdm >> "$RUNS/sbench.log" 2>&1
    el "sglang.bench_serving C=$1 $2 rc=$?"
    hget $URL/metrics > "$RUNS/sbench/$2.after.prom"
}

main() {
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 "$R/scripts/vllm_carry.py" unpack "$carry" "$W/stage" --site "$SITE"
el "unpack rc=$?"
tar -xJf "$carry/setup.tar.xz" -C "$W" && el "setup ok"
cmd=$(python3 - "$M" <<'PY'
import shlex, sys
from phase6.launch import load_config
from phase6.serving.server import build_command
cfg = load_config("serve_bench", ["experiment=gpu_h200_sglang", f"serve.model={sys.argv[1]}"]).serve
cfg.launcher = [sys.executable, "-m", "sglang.launch_server"]
print(shlex.join(build_command(cfg, sys.argv[1], 30000)))
PY
)
echo "$cmd" > "$RUNS/server.cmd"
read -r -a argv <<< "$cmd"
setsid "${argv[@]}" > "$RUNS/server.log" 2>&1 &
spid=$!
el "server started (pid $spid): $cmd"
ready=0
while [ "$(left)" -gt 60 ]; do
    kill -0 $spid 2>/dev/null || break
    if hget $URL/health_generate > /dev/null; then ready=1; break; fi
    sleep 1
done
el "server ready=$ready"
if [ $ready = 1 ]; then
    p6 1 p6_c1_0_fresh 40 && sb 1 c1_1 40 && p6 1 p6_c1_2 40 && sb 1 c1_3 40 && p6 1 p6_c1_4 40
    sb 64 c64_5 70 && p6 64 p6_c64_6 60
else
    grep -iE "error|exception" "$RUNS/server.log" | tail -3 | cut -c1-240
fi
kill -TERM -- -$spid 2>/dev/null
for _ in $(seq 1 20); do kill -0 -- -$spid 2>/dev/null || break; sleep 0.5; done
kill -KILL -- -$spid 2>/dev/null
sleep 1
el "left after stop: $(ps -eo args | grep -c '[s]glang') sglang processes, GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
tar -cJf "$OUT/sglang_clients.tar.xz" -C "$W" runs 2>/dev/null
python3 "$R/scripts/repro/h200_sglang_summary.py" "$RUNS"
}

main 2>&1 | tee "$LOG"
