"""6B serving benchmark library: workloads and schedules, the streaming client, server lifecycle, statistics,
telemetry and plots. The `phase6 serve-bench` entry is projects/6b_serving/serve_bench.py.

- ``traces``: the one strict parser per trace format (Mooncake JSONL, Azure CSV), shared with `phase6 fleet`
- ``slo``: the one percentile and goodput-at-an-SLO definition, shared with `phase6 fleet`
- ``workload``: ShareGPT / synthetic / Mooncake / Azure request lists, seeded arrival schedules
- ``client``: async SSE client (per-chunk timestamps, per-token ITL, accounting that never loses a request)
- ``server``: launch/ready/stop of vLLM, SGLang, transformers serve; cache across sweep members
- ``stats``: the scaling-table row (exact keys in ``stats.ROW_KEYS``), goodput at the SLO, cost per 1M tokens
- ``telemetry``: NVML + Prometheus sampler process
- ``plots``: latency CDFs, time series, metrics vs load
- ``scripted_server``: a timing-controlled fake server for testing and benchmarking the client
- ``tiny``: tiny random chat models + tokenizer for CPU smoke runs (`transformers serve`, vLLM: ``tiny-vllm``)
- ``vllm_env``: where vLLM lives (``.venv-vllm`` from `make setup-vllm`, or ``$PHASE6_VLLM_PYTHON``)
- ``engine_args``: server command lines checked by vLLM's and SGLang's own argument parsers
- ``crosscheck``: the same request list through phase6's client and `vllm bench serve` on one server
"""
