"""Tensor-parallel OpenAI-compatible server for machines without vLLM/SGLang (6B rows at TP=1, 2, 4; issue 10).

Launch (rank 0 serves HTTP on --host:--port; TP=1 is the same program without torchrun):

    python -m phase6.serving.tp_server --model <dir|config.json> --dummy-weights --dtype bfloat16 --port 8000
    torchrun --standalone --nproc_per_node 4 -m phase6.serving.tp_server --model outputs/models/qwen2.5-14b \
        --dummy-weights --dtype bfloat16 --port 8000 --max-batch 64 --cuda-graphs

The 6B table on an H200 node (engine torch-tp of `phase6 serve-bench`; one command per TP, server reused across
the three concurrencies):

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    phase6 serve-bench -m experiment=gpu_h200_tp serve.tp=4 load.concurrency=1,16,64

Endpoints: GET /health, GET /v1/models, GET /version, GET /metrics (vLLM metric names, so the 6B scraper reads them),
POST /v1/completions and /v1/chat/completions (stream with ``data: {...}`` chunks, ``stream_options.include_usage``
-> a final usage chunk, ``continuous_usage_stats`` -> usage on every chunk, ``ignore_eos``, ``min_tokens``, then
``data: [DONE]``). A malformed request gets HTTP 400 with a one-line reason; the server keeps running.

Model: ``AutoModelForCausalLM`` from a local directory (weights) or, with ``--dummy-weights``, from its config with
the model's own random init on the target device (seeded; TP ranks take rank 0's weights, so TP=N serves exactly
the model TP=1 serves for the same seed). Nothing is downloaded.

Tensor parallelism (Megatron-style, the plan the model declares): ``phase6.parallel.apply_tp`` splits the Linears of
``config.base_model_tp_plan`` + the causal-LM class's ``_tp_plan`` into plain local tensors with all-reduce /
all-gather forward hooks (its docstring says why not DTensor). Embeddings and norms are replicated.

Batching: continuous (iteration-level). A static KV cache holds ``--max-batch`` rows of ``--max-model-len``
positions per layer; active requests occupy rows [0, n) (a finished request's row is refilled by moving the last
row's KV into it). Every iteration rank 0 decides one step: the row moves, one decode token for every running
request, and a prefill of newly admitted requests (FCFS, at most ``--max-prefill-tokens`` padded tokens; new rows
get their first token from the prefill). The HF model runs with explicit ``position_ids``, a 4-D boolean mask and
the slot cache as ``past_key_values`` (its attention layers only call ``cache.update``); masked attention packs the
query heads of each KV head into one SDPA call (``phase6.models.packed_gqa``) instead of HF's per-head K/V copies.
``--cuda-graphs``: decode steps are padded to (batch, KV length) buckets and replayed as CUDA graphs captured at
start on every rank (collectives included), after a check against eager decoding.
``--compile-prefill``: prefill runs each decoder layer through ``torch.compile`` (dynamic shapes; one set of
compiled graphs reused by every layer) instead of eagerly: a few fused kernels per layer instead of ~70 Python-level
ops (the engine thread shares the GIL with the HTTP thread). Alone on a GPU the step is within +-10 % of eager
(projects/6b_serving/bench_prefill.py, docs/benchmarks.md). The graphs are compiled at start on every rank, for
every shape class a step can take (one prompt or several), so no compile happens while serving.

Lockstep: rank 0 broadcasts each step (a small int64 header + payload on a gloo group, off the GPU stream) before
any rank computes; all ranks then run identical forwards with identical collectives. Only rank 0 samples
(greedy, or seeded per request); sampled tokens reach the other ranks as the next step's payload, so ranks never
diverge. SIGTERM/SIGINT on rank 0 drains HTTP, broadcasts STOP, and every rank exits 0; other ranks ignore
SIGTERM and wait for STOP (torchrun kills them if rank 0 dies first).

Modules, top down: ``server`` (entry point: ranks, model, engine, threads) -> ``http`` (endpoints, request
validation, Prometheus) -> ``scheduler`` (rank 0's admit/plan/sample loop) -> ``engine`` (slot KV cache, step plan,
forward, CUDA graphs, compiled prefill) -> ``model`` (load) -> ``args`` (the command line, one dataclass).
"""

# Only the torch-free command line is re-exported here, so that importing the package (and `phase6 fleet`, which
# reads ServerArgs' defaults) does not load torch; the engine, scheduler and HTTP API import from their modules.
from phase6.serving.tp_server.args import DTYPES, ENGINE, LOOPBACK_HOSTS, ServerArgs, build_parser, parse_args

__all__ = ["DTYPES", "ENGINE", "LOOPBACK_HOSTS", "ServerArgs", "build_parser", "parse_args"]
