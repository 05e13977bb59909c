#!/usr/bin/env bash
# SGLang, meta-llama/Llama-3.1-70B-Instruct, tensor parallel 2, on 127.0.0.1:${PORT:-30000}. Benchmark it with:
#   phase6 serve-bench serve=endpoint serve.engine=sglang serve.endpoint=http://127.0.0.1:${PORT:-30000} \
#       serve.model=meta-llama/Llama-3.1-70B-Instruct serve.tp=2 load.concurrency=16
# or let serve-bench launch the same command itself: phase6 serve-bench serve=sglang_llama3.1_70b --tp 2
# TP=2: 141 GB of bf16 weights = 70 GB per GPU. Fits a 141 GB H200 with room for KV cache; on an 80 GB H100
# it does not (no KV left): run with QUANT=fp8 (weights 8-bit, ~35 GB per GPU) and say so next to the numbers.
# Radix (prefix) cache off and metrics on (/metrics is what serve-bench samples for running/queued requests).
set -euo pipefail
exec python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct \
    --host 127.0.0.1 --port "${PORT:-30000}" \
    --tp-size 2 --dtype bfloat16 --context-length 4096 \
    --mem-fraction-static 0.88 --max-running-requests 256 --disable-radix-cache --enable-metrics --random-seed 0 \
    ${QUANT:+--quantization "$QUANT"} "$@"
