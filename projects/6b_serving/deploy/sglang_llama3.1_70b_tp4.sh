#!/usr/bin/env bash
# SGLang, meta-llama/Llama-3.1-70B-Instruct, tensor parallel 4, on 127.0.0.1:${PORT:-30000}. Benchmark it with:
#   phase6 serve-bench serve=endpoint serve.engine=sglang serve.endpoint=http://127.0.0.1:${PORT:-30000} \
#       serve.model=meta-llama/Llama-3.1-70B-Instruct serve.tp=4 load.concurrency=16
# or let serve-bench launch the same command itself: phase6 serve-bench serve=sglang_llama3.1_70b --tp 4
# TP=4: 141 GB of bf16 weights = 35 GB per GPU; fits 80 GB H100s with ~37 GB per GPU for KV cache at 0.90 utilisation.
# Radix (prefix) cache off and metrics on (/metrics is what serve-bench samples for running/queued requests).
set -euo pipefail
exec python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct \
    --host 127.0.0.1 --port "${PORT:-30000}" \
    --tp-size 4 --dtype bfloat16 --context-length 4096 \
    --mem-fraction-static 0.88 --max-running-requests 256 --disable-radix-cache --enable-metrics --random-seed 0 \
    ${QUANT:+--quantization "$QUANT"} "$@"
