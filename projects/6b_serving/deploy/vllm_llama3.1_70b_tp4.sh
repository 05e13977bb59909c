#!/usr/bin/env bash
# vLLM, meta-llama/Llama-3.1-70B-Instruct, tensor parallel 4, on 127.0.0.1:${PORT:-8000}. Benchmark it with:
#   phase6 serve-bench serve=endpoint serve.engine=vllm serve.endpoint=http://127.0.0.1:${PORT:-8000} \
#       serve.model=meta-llama/Llama-3.1-70B-Instruct serve.tp=4 load.concurrency=16
# or let serve-bench launch the same command itself: phase6 serve-bench serve=vllm_llama3.1_70b --tp 4
# TP=4: 141 GB of bf16 weights = 35 GB per GPU; fits 80 GB H100s with ~37 GB per GPU for KV cache at 0.90 utilisation.
# Prefix caching off: ShareGPT prompts rarely repeat, and cache hits would differ between rows of the TP table.
set -euo pipefail
exec vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --host 127.0.0.1 --port "${PORT:-8000}" \
    --tensor-parallel-size 4 --dtype bfloat16 --max-model-len 4096 \
    --gpu-memory-utilization 0.90 --max-num-seqs 256 --no-enable-prefix-caching --seed 0 \
    ${QUANT:+--quantization "$QUANT"} "$@"
