"""Typed config of the 6B serving benchmark (`phase6 serve-bench`, `configs/serve_bench.yaml`).

Groups (job-specific, under ``configs/serve_bench/``): ``serve/`` -> ServeConfig (which server, how launched),
``load/`` -> LoadConfig (requests and arrivals), ``slo/`` -> SLOConfig (goodput thresholds; phase6.config.slo, shared
with the fleet), ``experiment/`` (smoke, table presets). Engine knobs we do not sweep pass through ``serve.engine_args``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from phase6.config import HardwareConfig, LoggerConfig, PricesConfig, RunConfig, require
from phase6.config.capacity import CapacityConfig
from phase6.config.slo import SLOConfig

ENGINES = ("vllm", "sglang", "transformers", "torch-tp", "openai")
APIS = ("chat", "completions")
DATASETS = ("sharegpt", "synthetic", "mooncake", "azure")
ARRIVALS = ("concurrency", "poisson", "gamma", "constant", "trace")
LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SHAREGPT_V3 = "hf://anon8231489123/ShareGPT_Vicuna_unfiltered/ShareGPT_V3_unfiltered_cleaned_split.json"


@dataclass
class ServeConfig:
    """The server under test: launched here (vllm / sglang / transformers) or an already running ``endpoint``."""

    engine: str = "vllm"
    """vllm | sglang | transformers | torch-tp (phase6.serving.tp_server) | openai (any OpenAI-compatible
    server; needs endpoint)."""
    model: str = "Qwen/Qwen2.5-72B-Instruct"
    """Model id or local directory passed to the server (and to the tokenizer unless ``tokenizer`` is set)."""
    tokenizer: str | None = None
    """Tokenizer id/dir for sampling prompt/output lengths; None = ``model``."""
    served_model_name: str | None = None
    """``model`` field of requests; None = the first id the server lists at /v1/models."""
    tp: int = 4
    """Tensor-parallel size (GPUs per server); also the GPU count in the cost columns."""
    dtype: str = "auto"
    """Weight/activation dtype passed to the engine (auto, bfloat16, float16, ...)."""
    max_model_len: int | None = 4096
    """Context limit passed to the engine (vLLM --max-model-len, SGLang --context-length); None = engine default."""
    host: str = "127.0.0.1"
    """Bind address of a launched server; loopback only (use ``endpoint`` for servers elsewhere)."""
    port: int = 0
    """Port of a launched server; 0 = a free port chosen at launch."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Extra engine CLI flags, passed through as ``--key value`` (true -> bare flag, false/null -> omitted)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the server process."""
    launcher: list[str] | None = None
    """Command prefix replacing the engine default (e.g. ['/opt/vllm-env/bin/vllm', 'serve'])."""
    endpoint: str | None = None
    """Base URL (http://host:port) of an already running server; nothing is launched or stopped."""
    ready_timeout_s: float = 1800.0
    """Seconds to wait for /health and /v1/models (70B loads take minutes); on timeout the log tail is printed."""
    random_model: str | None = None
    """Serve a random-weight model built here instead of ``model``: 'tiny' (0.1M params, CPU smoke) or a planner
    preset of configs/plan/model/ (e.g. llama3.1-8b: real shapes, random bf16 weights, 4096-token local vocab)."""
    plan_model: str | None = None
    """Planner model for the predicted column: a preset of configs/plan/model/ or a config.json path;
    None = ``model``'s config.json when ``model`` is a local directory, else no prediction."""
    pin_server: bool = True
    """Keep the server running between sweep members with the same launch spec (engine, model, TP, args)."""

    def __post_init__(self) -> None:
        require(self.engine in ENGINES, "serve.engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        require(self.tp >= 1, "serve.tp", f"must be >= 1, got {self.tp}")
        require(
            self.max_model_len is None or self.max_model_len > 0,
            "serve.max_model_len",
            f"must be > 0 or null, got {self.max_model_len}",
        )
        require(
            self.host in LOOPBACK_HOSTS,
            "serve.host",
            f"launched servers bind loopback only ({', '.join(LOOPBACK_HOSTS)}); got {self.host!r}; "
            "use serve.endpoint for a server elsewhere",
        )
        require(0 <= self.port < 65536, "serve.port", f"must be in [0, 65535], got {self.port}")
        require(self.ready_timeout_s > 0, "serve.ready_timeout_s", f"must be > 0, got {self.ready_timeout_s}")
        require(
            self.endpoint is None or self.endpoint.startswith(("http://", "https://")),
            "serve.endpoint",
            f"must be an http(s):// base URL, got {self.endpoint!r}",
        )
        require(
            self.engine != "openai" or self.endpoint is not None,
            "serve.endpoint",
            "engine=openai means an already running server: set serve.endpoint=http://host:port",
        )
        require(
            not (self.random_model and self.endpoint),
            "serve.random_model",
            "cannot build a model for an already running serve.endpoint",
        )

    def launch_key(self) -> tuple[Any, ...]:
        """What forces a server restart between sweep members: everything that goes on its command line."""
        return (
            self.engine,
            self.model,
            self.tp,
            self.dtype,
            self.max_model_len,
            tuple(sorted((k, repr(v)) for k, v in self.engine_args.items())),
            tuple(sorted(self.env.items())),
            tuple(self.launcher or ()),
            self.random_model,
        )


@dataclass
class LengthDist:
    """A token-length distribution for synthetic requests (clipped to [min, max], rounded to integers)."""

    kind: str = "uniform"
    """fixed (= mean) | uniform (integers in [min, max]) | normal (mean, std) | lognormal (mean, std of the lengths)."""
    mean: float = 512.0
    """Mean length in tokens (fixed, normal, lognormal)."""
    std: float = 0.0
    """Standard deviation in tokens (normal, lognormal)."""
    min: int = 1
    """Lower clip (and uniform lower bound)."""
    max: int = 1024
    """Upper clip (and uniform upper bound)."""

    def validate(self, key: str) -> None:
        require(
            self.kind in LENGTH_KINDS, f"{key}.kind", f"must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}"
        )
        require(1 <= self.min <= self.max, f"{key}.min", f"need 1 <= min <= max, got min={self.min} max={self.max}")
        require(self.std >= 0, f"{key}.std", f"must be >= 0, got {self.std}")
        require(
            self.kind == "uniform" or self.min <= self.mean <= self.max,
            f"{key}.mean",
            f"must lie in [min, max] = [{self.min}, {self.max}], got {self.mean}",
        )
        require(self.kind != "lognormal" or self.mean > 0, f"{key}.mean", "lognormal needs mean > 0")


@dataclass
class LoadConfig:
    """Which requests are sent and when: dataset, length window, arrival process, API and timeouts."""

    name: str = "sharegpt_c16"
    """Preset name, used in tables and run names."""
    dataset: str = "sharegpt"
    """sharegpt (ShareGPT V3 JSON) | synthetic (length distributions) | mooncake (JSONL trace) | azure (CSV trace)."""
    path: str | None = SHAREGPT_V3
    """Dataset file (sharegpt JSON, mooncake JSONL, azure CSV) or hf://owner/dataset/file; unused for synthetic."""
    num_requests: int | None = None
    """Measured requests; None = max(min_requests, requests_per_slot x concurrency) for closed loop,
    min_requests for open loop, the whole trace for trace replay."""
    min_requests: int = 200
    """Lower bound of the derived request count (percentiles need samples: p99 of 200 is the 2nd worst)."""
    requests_per_slot: int = 10
    """Closed loop: measured requests per concurrency slot (>= 10, so ramp-up and drain are a small share)."""
    prompt_len_min: int = 100
    """ShareGPT window: keep conversations whose first prompt has at least this many tokens (served model's tokenizer)."""
    prompt_len_max: int = 2000
    """ShareGPT window: upper bound on prompt tokens."""
    output_len_min: int = 100
    """ShareGPT window: lower bound on the reference answer's tokens (= requested output length)."""
    output_len_max: int = 500
    """ShareGPT window: upper bound on output tokens."""
    prompt_dist: LengthDist = field(default_factory=lambda: LengthDist("uniform", 512, 0, 100, 2000))
    """synthetic: prompt-length distribution."""
    output_dist: LengthDist = field(default_factory=lambda: LengthDist("uniform", 256, 0, 100, 500))
    """synthetic: output-length distribution."""
    arrival: str = "concurrency"
    """concurrency (closed loop, all queued at t=0) | poisson | gamma (burstiness) | constant | trace (timestamps)."""
    concurrency: int | None = 16
    """Max requests in flight (client semaphore); required for arrival=concurrency, optional cap otherwise."""
    request_rate: float | None = None
    """Offered requests/s for poisson, gamma and constant arrivals."""
    burstiness: float = 1.0
    """Gamma shape k of inter-arrival times (1 = Poisson, <1 burstier, >1 more regular); vLLM's --burstiness."""
    time_scale: float = 1.0
    """Trace replay: multiply trace inter-arrival times by this (0.5 = replay twice as fast)."""
    warmup_requests: int | None = None
    """Requests sent (and discarded) before measuring, at the same concurrency; None = concurrency (or 4)."""
    api: str = "chat"
    """chat (/v1/chat/completions, server applies the chat template) | completions (/v1/completions, raw prompt)."""
    fix_output_len: bool = True
    """Force exactly the requested output tokens (ignore_eos on vLLM/SGLang, min_new_tokens on transformers)."""
    temperature: float = 0.0
    """Sampling temperature sent with every request."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra JSON body fields merged into every request (engine-specific sampling knobs)."""
    connect_timeout_s: float = 10.0
    """TCP connect timeout per request."""
    read_timeout_s: float = 120.0
    """Max silence between two reads of one stream; a stalled stream fails after this."""
    request_timeout_s: float = 1800.0
    """Total time limit of one request, queueing for a connection included."""

    def __post_init__(self) -> None:
        require(self.dataset in DATASETS, "load.dataset", f"must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        require(self.arrival in ARRIVALS, "load.arrival", f"must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        require(self.api in APIS, "load.api", f"must be one of {', '.join(APIS)}, got {self.api!r}")
        require(
            self.dataset == "synthetic" or self.path is not None,
            "load.path",
            f"dataset={self.dataset} needs a file path (load.path=...)",
        )
        require(
            self.concurrency is None or self.concurrency >= 1,
            "load.concurrency",
            f"must be >= 1 or null, got {self.concurrency}",
        )
        if self.arrival == "concurrency":
            require(self.concurrency is not None, "load.concurrency", "arrival=concurrency needs a concurrency")
            if self.num_requests is not None and self.concurrency is not None:
                require(
                    self.num_requests >= 10 * self.concurrency,
                    "load.num_requests",
                    f"closed loop needs >= 10 x concurrency = {10 * self.concurrency} requests, "
                    f"got {self.num_requests}",
                )
        if self.arrival in ("poisson", "gamma", "constant"):
            require(
                self.request_rate is not None and self.request_rate > 0 and math.isfinite(self.request_rate),
                "load.request_rate",
                f"arrival={self.arrival} needs a finite request_rate > 0, got {self.request_rate}",
            )
        require(
            self.arrival != "trace" or self.dataset in ("mooncake", "azure"),
            "load.arrival",
            f"arrival=trace needs a trace dataset (mooncake, azure), got dataset={self.dataset}",
        )
        require(self.burstiness > 0, "load.burstiness", f"must be > 0, got {self.burstiness}")
        require(self.time_scale > 0, "load.time_scale", f"must be > 0, got {self.time_scale}")
        require(
            self.requests_per_slot >= 10,
            "load.requests_per_slot",
            f"must be >= 10 (closed-loop runs need >= 10 x concurrency requests), got {self.requests_per_slot}",
        )
        require(self.min_requests >= 1, "load.min_requests", f"must be >= 1, got {self.min_requests}")
        require(
            self.num_requests is None or self.num_requests >= 1,
            "load.num_requests",
            f"must be >= 1 or null, got {self.num_requests}",
        )
        require(
            self.warmup_requests is None or self.warmup_requests >= 0,
            "load.warmup_requests",
            f"must be >= 0 or null, got {self.warmup_requests}",
        )
        require(
            1 <= self.prompt_len_min <= self.prompt_len_max,
            "load.prompt_len_min",
            f"need 1 <= prompt_len_min <= prompt_len_max, got {self.prompt_len_min}, {self.prompt_len_max}",
        )
        require(
            1 <= self.output_len_min <= self.output_len_max,
            "load.output_len_min",
            f"need 1 <= output_len_min <= output_len_max, got {self.output_len_min}, {self.output_len_max}",
        )
        self.prompt_dist.validate("load.prompt_dist")
        self.output_dist.validate("load.output_dist")
        for k in ("connect_timeout_s", "read_timeout_s", "request_timeout_s"):
            require(getattr(self, k) > 0, f"load.{k}", f"must be > 0, got {getattr(self, k)}")
        require(self.temperature >= 0, "load.temperature", f"must be >= 0, got {self.temperature}")

    def measured_requests(self, trace_rows: int | None = None) -> int:
        """Number of measured requests this load sends (derived, see ``num_requests``)."""
        if self.num_requests is not None:
            return self.num_requests if trace_rows is None else min(self.num_requests, trace_rows)
        if self.arrival == "trace" and trace_rows is not None:
            return trace_rows
        if self.arrival == "concurrency":
            assert self.concurrency is not None
            return max(self.min_requests, self.requests_per_slot * self.concurrency)
        return self.min_requests

    def warmup(self) -> int:
        """Warmup requests (derived): ``warmup_requests`` or one per concurrent slot (4 without a cap)."""
        if self.warmup_requests is not None:
            return self.warmup_requests
        return self.concurrency or 4


@dataclass
class TelemetryConfig:
    """Side channels sampled during a measured run: GPU (NVML) and the server's Prometheus /metrics."""

    nvml_interval_s: float = 0.5
    """GPU utilisation/memory sampling period; recorded as unavailable without an NVIDIA driver."""
    metrics_interval_s: float = 1.0
    """Prometheus /metrics scrape period (running/waiting requests, KV-cache usage); 404 -> unavailable."""
    plots: bool = True
    """Write latency CDFs and the time-series plots into <run dir>/plots."""

    def __post_init__(self) -> None:
        require(self.nvml_interval_s > 0, "telemetry.nvml_interval_s", f"must be > 0, got {self.nvml_interval_s}")
        require(
            self.metrics_interval_s > 0, "telemetry.metrics_interval_s", f"must be > 0, got {self.metrics_interval_s}"
        )


@dataclass
class ServeBenchRunConfig:
    """`phase6 serve-bench`: one row of the serving scaling table per run (a sweep builds the table)."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    prices: PricesConfig = field(default_factory=PricesConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    predict: bool = True
    """Put the planner's serving-latency prediction beside the measured row (when phase6.plan provides one)."""
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    """Capacity mode (``capacity.search=rate|concurrency``): the highest load meeting the SLO, one server start."""

    def __post_init__(self) -> None:
        require(
            self.slo.tbt_ms is None,
            "slo.tbt_ms",
            f"the per-token SLO is simulated by `phase6 fleet` only; serve-bench's goodput uses TTFT/TPOT/E2E, got {self.slo.tbt_ms}",
        )
        if self.capacity.search == "concurrency":
            require(
                self.load.arrival == "concurrency",
                "load.arrival",
                f"capacity.search=concurrency searches the closed loop: needs load.arrival=concurrency, got "
                f"{self.load.arrival!r}",
            )
        if self.capacity.search == "rate" and self.capacity.arrival == "trace":
            require(
                self.load.dataset in ("mooncake", "azure"),
                "capacity.arrival",
                f"trace needs a trace dataset (mooncake, azure), got load.dataset={self.load.dataset}",
            )
        if self.load.dataset == "sharegpt" and self.serve.max_model_len is not None:
            need = self.load.prompt_len_max + self.load.output_len_max
            require(
                need <= self.serve.max_model_len,
                "serve.max_model_len",
                f"{self.serve.max_model_len} < load.prompt_len_max + load.output_len_max = {need}",
            )
