#!/usr/bin/env bash
# vLLM, meta-llama/Llama-3.1-70B-Instruct, tensor parallel 2, on 127.0.0.1:${PORT:-8000}. Benchmark it with:
#   phase6 serve-bench serve=endpoint serve.engine=vllm serve.endpoint=http://127.0.0.1:${PORT:-8000} \
#       serve.model=meta-llama/Llama-3.1-70B-Instruct serve.tp=2 load.concurrency=16
# or let serve-bench launch the same command itself: phase6 serve-bench serve=vllm_llama3.1_70b --tp 2
# TP=2: 141 GB of bf16 weights = 70 GB per GPU. Fits a 141 GB H200 with room for KV cache; on an 80 GB H100
# it does not (no KV left): run with QUANT=fp8 (weights 8-bit, ~35 GB per GPU) and say so next to the numbers.
# Prefix caching off: ShareGPT prompts rarely repeat, and cache hits would differ between rows of the TP table.
set -euo pipefail
exec vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --host 127.0.0.1 --port "${PORT:-8000}" \
    --tensor-parallel-size 2 --dtype bfloat16 --max-model-len 4096 \
    --gpu-memory-utilization 0.90 --max-num-seqs 256 --no-enable-prefix-caching --seed 0 \
    ${QUANT:+--quantization "$QUANT"} "$@"
