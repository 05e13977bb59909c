#!/usr/bin/env bash
# Issue 29 on the lent H200, one call: SGLang 0.5.16 (carried) serving the Qwen2.5-14B architecture (dummy weights,
# TP=1) through phase6's own launcher, C=1/16/64 rows on the vLLM/torch-tp request lists, then SGLang's own client
# (`python -m sglang.bench_serving`) on one server. Reproduces docs/benchmarks.md "SGLang on the lent H200 (issue 29)".
#
#   BUDGET=530 bash scripts/repro/h200_sglang.sh $PWD/.device/i29     # from the checkout; 2026-12-02: wall 520 s
# (or from a branch archive: mkdir -p /tmp/i29/repo && tar -xJf .device/i29/repo.tar.xz -C /tmp/i29/repo && bash
#  /tmp/i29/repo/scripts/repro/h200_sglang.sh $PWD/.device/i29)
#
# CARRY (built on the CPU box, see projects/6b_serving/README.md "SGLang on the lent H200"):
#   site.tar.xz.00 + manifest.json  scripts/vllm_carry.py --set sglang pack: SGLang, sglang-kernel (sm90 only, no
#                                   FA3), flashinfer, the server's import closure, Hydra for phase6's CLI
#   extra.tar.xz (optional)         a small --target tree of wheels added to the set after the piece was packed
#   setup.tar.xz                    models/qwen2.5-14b-fullvocab (config.json + tokenizer), req/ (export_requests.py
#                                   --sglang: c{C}.jsonl, sglang_c{C}.jsonl, index.json)
#   repo.tar.xz                     git archive of the branch (this script's checkout)
# Phases, each under its own `timeout`, the whole call < 420 s (BUDGET 390 s + kill grace, the tar, the summary):
#   A. import check (versions; transformers must be the carried 5.12.1), alongside a bad engine flag through
#      `phase6 serve-bench` (expect one line naming SGLang's own argparse error, exit 2, the run dir marked failed)
#   B. `phase6 serve-bench -m experiment=gpu_h200_sglang load.concurrency=1,16,64`: phase6 launches SGLang
#      (readiness, version, /metrics, usage vs sglang:generation_tokens_total), stops it; process table after
#   C. if >= 150 s are left: one SGLang server started like B's (its logged command), `sglang.bench_serving` C=1/16/64
#      at C=1 and phase6's client at C=1 on that same server (endpoint mode), then bench C=16/64 as time allows;
#      stopped, ps after
# $OUT gets two files: sglang_runs.tar.xz (run dirs, server logs, ps snapshots) and h200_sglang.log; the markdown
# summary (scripts/repro/h200_sglang_summary.py) is printed last.
set -uo pipefail
carry=$(realpath "$1")
W=${W:-/tmp/i29}
R=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$W/out}
RUNS=$W/runs
LOG=$OUT/h200_sglang.log
mkdir -p "$RUNS" "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$SITE:$R/src
M=$W/models/qwen2.5-14b-fullvocab
t0=$(date +%s)
BUDGET=${BUDGET:-390}  # phases are cut to this; B's kill grace, a leftover stop, the tar and the summary add <= ~30 s
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((BUDGET - $(date +%s) + t0)); }
snap() { # the process table's SGLang/phase6 processes (none should outlive a stopped server)
    ps -eo pid,ppid,pgid,stat,etimes,args | grep -E "sglang|phase6|tp_server" | grep -vE "grep|h200_sglang" \
        > "$RUNS/ps_$1.txt"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | sed "s/^/gpu-app: /" \
        >> "$RUNS/ps_$1.txt" 2>&1
    nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$RUNS/ps_$1.txt" 2>&1
    el "ps $1: $(grep -cvE 'MiB' "$RUNS/ps_$1.txt") sglang/phase6 processes; GPU $(tail -1 "$RUNS/ps_$1.txt")"
}
hget() { # GET $1 -> stdout (exit 1 unless 200); no curl needed on the image
    python3 -c "import sys, urllib.request as u; sys.stdout.buffer.write(u.urlopen(sys.argv[1], timeout=5).read())" "$1" \
        2>/dev/null
}
finish() {
    tar --exclude='*.png' -cJf "$OUT/sglang_runs.tar.xz" -C "$W" runs 2>/dev/null
    el "done"
    python3 "$R/scripts/repro/h200_sglang_summary.py" "$RUNS"
}

main() {
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; uname -r; python3 -V; } \
    > "$RUNS/env.txt" 2>&1
cat "$RUNS/env.txt"
python3 "$R/scripts/vllm_carry.py" unpack "$carry" "$W/stage" --site "$SITE"
el "unpack rc=$?"
if [ -f "$carry/extra.tar.xz" ]; then # wheels added to the set after the piece was packed (same --target layout)
    tar -xJf "$carry/extra.tar.xz" -C "$SITE" && el "extra.tar.xz extracted into $SITE"
fi
tar -xJf "$carry/setup.tar.xz" -C "$W" && el "setup: $(ls "$W"/models "$W"/req | tr '\n' ' ')"

# --- A: imports, versions, attention backends on offer; a bad flag -----------------------------------------------
# A runs beside the bad flag (both only import and parse; 16 cores): ~25 s saved
timeout 60 python3 - > "$RUNS/imports.txt" 2>&1 <<'PY' &
import importlib, time
from importlib import metadata
t = time.time()
for m in ("torch", "sgl_kernel", "flashinfer", "xgrammar", "hydra", "sglang.launch_server",
          "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
          "sglang.srt.managers.detokenizer_manager", "sglang.srt.model_executor.model_runner",
          "sglang.srt.models.qwen2", "sglang.srt.layers.attention.triton_backend", "sglang.bench_serving"):
    try:
        importlib.import_module(m)
        print("import ok", m)
    except Exception as e:  # report every failure, keep going: the follow-up needs the whole list
        print("import FAILED", m, type(e).__name__, str(e)[:300])
for p in ("sglang", "sglang-kernel", "flashinfer-python", "torch", "transformers", "tokenizers", "triton", "xgrammar"):
    try:
        print("version", p, metadata.version(p))
    except metadata.PackageNotFoundError:
        print("version", p, "missing")
try:
    importlib.import_module("sgl_kernel.flash_attn")
    print("fa3 python module imports (flash_ops.so trimmed: the fa3 backend would fail at first use)")
except Exception as e:
    print("fa3 module:", type(e).__name__, str(e)[:200])
import transformers
print("transformers from", transformers.__file__)
print(f"imports took {time.time() - t:.1f} s")
PY
apid=$!
timeout 60 python3 -m phase6 serve-bench experiment=gpu_h200_sglang serve.model="$M" \
    serve.plan_model="$M/config.json" load.concurrency=1 run.dir="$RUNS/badflag" +serve.engine_args.no-such-flag=1 \
    > "$RUNS/badflag.out" 2> "$RUNS/badflag.err"
rc=$?
el "bad flag: rc=$rc, stderr $(wc -l < "$RUNS/badflag.err") lines, traceback: $(grep -c Traceback "$RUNS/badflag.err"), run dir left: $(ls "$RUNS/badflag" 2>/dev/null | tr '\n' ' ')"
tail -3 "$RUNS/badflag.err"
wait $apid
el "imports rc=$?"
grep -E "^(import FAILED|version|transformers from|imports took|fa3)" "$RUNS/imports.txt" | cut -c1-220
echo "$(grep -c "^import ok" "$RUNS/imports.txt") modules import ok"
snap badflag

# --- B: phase6 launches SGLang; C=1/16/64 ---------------------------------------------------------------------------
tb=$(($(left) - 10))  # SGLang's first start JIT-compiles its ops (predicted 90-240 s): B gets what is left
ps -eo pid= | tr -d ' ' > "$RUNS/pids_before_b.txt"
el "phase6 serve-bench engine=sglang (timeout $tb s)"
timeout -k 20 $tb python3 -m phase6 serve-bench -m experiment=gpu_h200_sglang serve.model="$M" \
    serve.plan_model="$M/config.json" load.concurrency=1,16,64 run.dir="$RUNS/sglang" > "$RUNS/p6_sglang.log" 2>&1
el "phase6 sglang rc=$?"
grep -E "^\||rror" "$RUNS/p6_sglang.log" | tail -12
sleep 2
snap after_serve_bench
slog=$(find "$RUNS/sglang" -name server.log | head -1)
# a server phase6 did not stop (its client killed by the timeout): SGLang processes that appeared during B (SGLang
# renames its children, e.g. sglang::scheduler, so match on the name, among the pids new since B began)
for pid in $(ps -eo pid=,args= | awk '/sglang/ && !/awk|h200_sglang/ {print $1}'); do
    grep -qx "$pid" "$RUNS/pids_before_b.txt" && continue
    pg=$(ps -o pgid= -p "$pid" | tr -d ' ')
    [ -n "$pg" ] && [ "$pg" != "$(ps -o pgid= -p $$ | tr -d ' ')" ] || continue
    el "leftover SGLang process $pid (pgid $pg): stopping its group"
    kill -TERM -- -"$pg" 2>/dev/null
    sleep 5
    kill -KILL -- -"$pg" 2>/dev/null
done
[ -n "$slog" ] && { grep -iE "attention backend|cuda graph|max_total_num_tokens|KV Cache|ready to roll|took" "$slog" | head -12; }

# --- C: one server, sglang.bench_serving C=1, phase6 client C=1, bench C=16/64 ---------------------------------
if [ "$(left)" -gt 150 ] && [ -n "$slog" ]; then
    cmd=$(head -1 "$slog" | sed 's/^\$ //')
    read -r -a argv <<< "$cmd"
    # same command as phase6's launch, fixed port
    for i in "${!argv[@]}"; do [ "${argv[$i]}" = "--port" ] && argv[$((i + 1))]=30000; done
    printf '%s ' "${argv[@]}" > "$RUNS/server_c.cmd"
    setsid "${argv[@]}" > "$RUNS/server_c.log" 2>&1 &
    spid=$!
    el "server C started (pid $spid): $(cat "$RUNS/server_c.cmd")"
    ready=0
    while [ "$(left)" -gt 60 ]; do  # by the clock: a probe can take its 5 s timeout
        kill -0 $spid 2>/dev/null || break
        if hget http://127.0.0.1:30000/health_generate > /dev/null; then ready=1; break; fi
        sleep 1
    done
    el "server C ready=$ready"
    [ $ready = 1 ] || grep -iE "error|exception" "$RUNS/server_c.log" | tail -2 | cut -c1-240
    if [ $ready = 1 ]; then
        hget http://127.0.0.1:30000/server_info > "$RUNS/server_info.json"
        hget http://127.0.0.1:30000/get_server_info > "$RUNS/get_server_info.json"
        hget http://127.0.0.1:30000/get_model_info > "$RUNS/get_model_info.json"
        hget http://127.0.0.1:30000/metrics > "$RUNS/metrics_sample.prom"
        mkdir -p "$RUNS/sbench"
        # C=1 by both clients first (the same-server comparison), then SGLang's client at C=16/64 as time allows
        for c in 1 p6 16 64; do
            if [ $c = p6 ]; then
                [ "$(left)" -lt 50 ] && { el "no time for phase6's client on server C"; break; }
                timeout $(($(left) - 20)) python3 -m phase6 serve-bench experiment=gpu_h200_sglang \
                    serve.endpoint=http://127.0.0.1:30000 serve.model="$M" serve.plan_model="$M/config.json" \
                    load.concurrency=1 run.dir="$RUNS/p6_same_server_c1" > "$RUNS/p6_same_server.log" 2>&1
                el "phase6 client C=1 on server C rc=$?"
                continue
            fi
            [ "$(left)" -lt 40 ] && { el "no time for bench C=$c"; break; }
            n=$(python3 -c "import json; print([e['requests'] for e in json.load(open('$W/req/index.json')) if e['concurrency'] == $c][0])")
            hget http://127.0.0.1:30000/metrics > "$RUNS/sbench/c$c.before.prom"
            timeout $(($(left) - 20)) python3 -m sglang.bench_serving --backend sglang-oai-chat \
                --base-url http://127.0.0.1:30000 --model "$M" --tokenizer "$M" --dataset-name custom \
                --dataset-path "$W/req/sglang_c$c.jsonl" --num-prompts "$n" --max-concurrency $c \
                --request-rate inf --temperature 0 --warmup-requests $c --seed 1337 \
                --output-file "$RUNS/sbench/c$c.jsonl" --output-details --disable-tqdm \
                >> "$RUNS/sbench.log" 2>&1
            el "sglang.bench_serving C=$c rc=$?"
            hget http://127.0.0.1:30000/metrics > "$RUNS/sbench/c$c.after.prom"
        done
    fi
    kill -TERM -- -$spid 2>/dev/null
    for _ in $(seq 1 20); do kill -0 -- -$spid 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- -$spid 2>/dev/null
    sleep 1
    snap after_server_c
else
    el "phase C skipped ($(left) s left)"
fi
finish
}

main 2>&1 | tee "$LOG"
