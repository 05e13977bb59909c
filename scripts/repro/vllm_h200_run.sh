#!/usr/bin/env bash
# Issue 19 on the lent H200: every measurement of one device call, run from the carried folder.
# Reproduces: docs/benchmarks.md § vLLM on the lent H200 (issue 19)
#
#   bash scripts/repro/vllm_h200_run.sh tp      CARRY   # call 1: stage piece 00; torch-tp rows; 6D hf_loop + naive rows
#   bash scripts/repro/vllm_h200_run.sh serve   CARRY   # call 2: piece 01 -> vLLM in /tmp/site; vLLM server: phase6
#                                                 #         serve-bench C=1/16/64, then `vllm bench serve` C=1/16/64
#   bash scripts/repro/vllm_h200_run.sh rollout CARRY   # call 3: 6D vLLM LLM.generate row (no carry; /tmp from call 2)
#
# The 6D GRPO step (second session, same recipe; setup.tar.xz also holds stepwhl/: trl 1.16.0, datasets 5.2.0, dill,
# multiprocess, which the image lacks):
#   bash scripts/repro/vllm_h200_run.sh step_hf   CARRY # call 1: stage piece 00; GRPO step, HF engine (decode loop)
#   bash scripts/repro/vllm_h200_run.sh step_vllm CARRY # call 2: piece 01 -> vLLM; GRPO step, colocated vLLM engine
#   bash scripts/repro/vllm_h200_run.sh ttft      CARRY # call 3: one vLLM server, phase6's client and `vllm bench serve`
#                                                 #         alternating at C=1, /metrics scraped around each run
#
# CARRY (a folder under the repo, named in the call's `carry`) holds the vLLM pieces + manifest.json
# (scripts/vllm_carry.py pack) and, in call 1, setup.tar.xz: this branch's changed files (overlay/), the model
# directory (models/qwen2.5-14b-fullvocab: config.json + tokenizer), the request lists for `vllm bench serve`
# (vreq/, projects/6b_serving/export_requests.py) and phase6's Hydra wheels (p6whl/). Calls go back to back: the
# machine keeps /tmp only while warm (30 s after a call). Everything lands under $OUT (at most 8 files).
set -uo pipefail
step=$1
carry=$(realpath "$2")
W=/tmp/i19
OUT=${OUT:-$W/out}
mkdir -p "$W/runs" "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
M=$W/models/qwen2.5-14b-fullvocab
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }

# The vLLM server every serving call measures (dummy Qwen2.5-14B weights, TP=1); waits up to $1 s for /health and
# sets srv (its pid) and ready (1 once it answers).
start_vllm() {
    python3 -m vllm.entrypoints.cli.main serve "$M" --host 127.0.0.1 --port 8000 \
        --served-model-name qwen2.5-14b-dummy --tensor-parallel-size 1 --dtype bfloat16 --max-model-len 4096 \
        --load-format dummy --gpu-memory-utilization 0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 \
        --no-enable-prefix-caching --seed 0 > "$OUT/vllm_server.log" 2>&1 &
    srv=$!
    ready=0
    for _ in $(seq 1 "$1"); do
        if ! kill -0 $srv 2>/dev/null; then break; fi
        if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; then
            ready=1
            break
        fi
        sleep 1
    done
}

if [ -f "$carry/setup.tar.xz" ] && [ ! -d "$W/repo" ]; then
    mkdir -p "$W/repo"
    tar --exclude=./.dev --exclude=./.venv --exclude=./.venv-vllm --exclude=./.git -cf - . | tar -xf - -C "$W/repo"
    tar -xJf "$carry/setup.tar.xz" -C "$W"
    cp -r "$W/overlay/." "$W/repo/"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site_p6" "$W"/p6whl/*.whl
    if [ -d "$W/stepwhl" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site_step" \
            "$W"/stepwhl/*.whl
    fi
fi
if [ ! -d "$W/repo" ]; then
    echo "vllm_h200_run: $W/repo missing: a fresh machine (call 1 did not run on this one); start again at call 1"
    exit 4
fi
cd "$W/repo" || exit 4
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; uname -r; python3 -V; } \
    > "$OUT/env_$step.txt" 2>&1
if [ -f "$carry/manifest.json" ]; then
    python3 scripts/vllm_carry.py unpack "$carry" "$W/stage" --site /tmp/site
    el "unpack rc=$?"
fi

case $step in
tp)
    export PYTHONPATH=$W/site_p6:$W/repo/src
    el "torch-tp sweep"
    timeout 330 python3 -m phase6 serve-bench -m experiment=gpu_h200_tp serve.model="$M" \
        serve.plan_model="$M/config.json" load.concurrency=1,16,64 run.dir="$W/runs/tp1" > "$OUT/tp.log" 2>&1
    el "torch-tp rc=$?"
    tar --exclude='*.png' -cJf "$OUT/tp_runs.tar.xz" -C "$W/runs" tp1
    el "6D hf rows"
    timeout 200 python3 projects/6d_grpo/bench.py --part throughput --variants hf_loop,naive --ablations '' \
        --out "$OUT/rollout_hf.json" > "$OUT/rollout_hf.log" 2>&1
    el "6D hf rc=$?"
    ;;
serve)
    export PYTHONPATH=/tmp/site:$W/repo/src
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -3
    el "vllm serve start"
    start_vllm 420
    el "vllm ready=$ready"
    if [ $ready = 1 ]; then
        timeout 200 python3 -m phase6 serve-bench -m experiment=gpu_h200_vllm serve.endpoint=http://127.0.0.1:8000 \
            serve.model="$M" serve.plan_model="$M/config.json" load.concurrency=1,16,64 run.dir="$W/runs/vllm" \
            > "$OUT/p6_vllm.log" 2>&1
        el "phase6 client rc=$?"
        mkdir -p "$W/runs/vbench"
        for c in 1 16 64; do
            n=$(python3 -c "import json; print([e['requests'] for e in json.load(open('$W/vreq/index.json')) if e['concurrency'] == $c][0])")
            timeout 120 python3 -m vllm.entrypoints.cli.main bench serve --backend openai-chat \
                --base-url http://127.0.0.1:8000 --endpoint /v1/chat/completions --model qwen2.5-14b-dummy \
                --tokenizer "$M" --dataset-name custom --dataset-path "$W/vreq/c$c.jsonl" --custom-output-len -1 \
                --skip-chat-template --disable-shuffle --num-prompts "$n" --max-concurrency $c --request-rate inf \
                --ignore-eos --temperature 0 --num-warmups $c --percentile-metrics ttft,tpot,itl,e2el \
                --metric-percentiles 50,99 --save-result --save-detailed --result-dir "$W/runs/vbench" \
                --result-filename "c$c.json" >> "$OUT/vbench.log" 2>&1
            el "vllm bench C=$c rc=$?"
        done
    fi
    kill $srv 2>/dev/null
    wait $srv 2>/dev/null
    tar --exclude='*.png' -cJf "$OUT/vllm_runs.tar.xz" -C "$W/runs" vllm vbench 2>/dev/null
    el "done"
    ;;
rollout)
    export PYTHONPATH=/tmp/site:$W/repo/src
    el "6D vllm row"
    timeout 330 python3 projects/6d_grpo/bench.py --part throughput --variants vllm --ablations '' \
        --out "$OUT/rollout_vllm.json" > "$OUT/rollout_vllm.log" 2>&1
    el "6D vllm rc=$?"
    if [ $(($(date +%s) - t0)) -lt 300 ]; then
        timeout $((540 - $(date +%s) + t0)) python3 projects/6d_grpo/bench.py --part throughput --variants vllm \
            --ablations '' --logprobs --out "$OUT/rollout_vllm_lp.json" > "$OUT/rollout_vllm_lp.log" 2>&1
        el "6D vllm logprobs rc=$?"
    fi
    ;;
step_hf)
    export PYTHONPATH=$W/site_step:$W/repo/src
    python3 -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" 2>&1 | tail -3
    el "6D GRPO step, HF engine"
    timeout 420 python3 projects/6d_grpo/bench.py --part step --out "$OUT/step_hf.json" > "$OUT/step_hf.log" 2>&1
    el "6D step hf rc=$?"
    ;;
step_vllm)
    export PYTHONPATH=/tmp/site:$W/site_step:$W/repo/src
    el "6D GRPO step, vLLM colocate"
    timeout 500 python3 projects/6d_grpo/bench.py --part step --step-engine vllm --out "$OUT/step_vllm.json" \
        > "$OUT/step_vllm.log" 2>&1
    el "6D step vllm rc=$?"
    ;;
ttft)
    # The C=1 TTFT offset between the clients (docs/benchmarks.md): both on ONE server, alternating, the server's
    # own histograms (/metrics) scraped before and after every run.
    export PYTHONPATH=/tmp/site:$W/repo/src
    T=$W/runs/ttft
    mkdir -p "$T"
    scrape() { python3 -c "import urllib.request as u, sys; open(sys.argv[1], 'wb').write(u.urlopen('http://127.0.0.1:8000/metrics', timeout=10).read())" "$1"; }
    el "vllm serve start"
    start_vllm 300
    el "vllm ready=$ready"
    n=$(python3 -c "import json; print([e['requests'] for e in json.load(open('$W/vreq/index.json')) if e['concurrency'] == 1][0])")
    p6() {
        scrape "$T/$1.before.prom"
        timeout 90 python3 -m phase6 serve-bench experiment=gpu_h200_vllm serve.endpoint=http://127.0.0.1:8000 \
            serve.model="$M" serve.plan_model="$M/config.json" load.concurrency=1 run.dir="$T/$1" "${@:2}" \
            >> "$OUT/ttft.log" 2>&1
        el "phase6 $1 rc=$?"
        scrape "$T/$1.after.prom"
    }
    vb() {
        scrape "$T/$1.before.prom"
        timeout 90 python3 -m vllm.entrypoints.cli.main bench serve --backend openai-chat \
            --base-url http://127.0.0.1:8000 --endpoint /v1/chat/completions --model qwen2.5-14b-dummy \
            --tokenizer "$M" --dataset-name custom --dataset-path "$W/vreq/c1.jsonl" --custom-output-len -1 \
            --skip-chat-template --disable-shuffle --num-prompts "$n" --max-concurrency 1 --request-rate inf \
            --ignore-eos --temperature 0 --num-warmups 1 --percentile-metrics ttft,tpot,itl,e2el \
            --metric-percentiles 50,99 --save-result --save-detailed --result-dir "$T" \
            --result-filename "$1.json" >> "$OUT/ttft.log" 2>&1
        el "vllm bench $1 rc=$?"
        scrape "$T/$1.after.prom"
    }
    if [ $ready = 1 ]; then
        p6 p6_a
        vb vb_a
        # phase6's body with vllm bench's stream_options (no per-chunk usage): does continuous_usage_stats cost TTFT?
        p6 p6nc_a '+load.extra_body.stream_options={include_usage: true}'
        vb vb_b
        p6 p6_b
        if [ $(($(date +%s) - t0)) -lt 420 ]; then
            p6 p6nc_b '+load.extra_body.stream_options={include_usage: true}'
        fi
    fi
    kill $srv 2>/dev/null
    wait $srv 2>/dev/null
    tar --exclude='*.png' -cJf "$OUT/ttft_runs.tar.xz" -C "$W/runs" ttft 2>/dev/null
    el "done"
    ;;
*)
    echo "vllm_h200_run: unknown step $step (tp | serve | rollout | step_hf | step_vllm | ttft)"
    exit 2
    ;;
esac
grep -hE "^\||rc=" "$OUT"/*.log 2>/dev/null | tail -40
