"""Config of `phase6 fleet`: a discrete-event simulation of serving replicas fed with request traces.

Groups: ``workload`` (configs/fleet/workload/*.yaml), ``engine``, ``fleet``, ``load``, ``slo``, ``analysis``; the model
is a planner preset name (configs/plan/model/<name>.yaml), hardware the shared group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phase6.config import HardwareConfig, LoggerConfig, RunConfig, require
from phase6.config.slo import SLOConfig

WORKLOAD_KINDS = ("mooncake", "azure", "synthetic")
STEP_TIME_SOURCES = ("planner", "table")
ROUTERS = ("random", "round_robin", "least_loaded", "prefix_aware", "session_affinity")
MIXED_STEPS = ("serial", "overlap")
HOST_TIERS = ("local", "global")
SIM_ENGINES = ("simpy", "heapq")
KV_LINKS = ("internode", "nvlink")
ENGINE_PROFILES = ("vllm", "torch-tp")
PROFILE_DEFAULTS: dict[str, dict[str, float]] = {
    # Each engine's own measurements on one H200 (docs/fleet.md "Engine defaults per profile"); used where
    # engine.step_overhead_ms / decode_seq_ms / request_overhead_ms are null (the default).
    "vllm": {
        # vLLM 0.26.0, Qwen2.5-14B TP=1 (docs/benchmarks.md "Fleet simulator vs the measured vLLM rows"):
        "step_overhead_ms": 0.0,  # C=1 TPOT 8.71 ms is the roofline's 8.83 with no fixed cost (C=1 fit: 0.00 ms)
        "decode_seq_ms": 0.0066,  # decode-only steps at 1 / 16 / 64 rows vs the roofline: +0.43 ms from 1 to 64 rows
        "request_overhead_ms": 8.8,  # client TTFT - vLLM's own prefill time, six C=1 runs on one server (mean)
    },
    "vllm-v0": {
        # vllm profile with engine.chunked_prefill=false: vLLM V0's scheduler, the 2023-24 engines the papers compare
        # against (DistServe's and Mooncake's baselines). Not measured here; vLLM 0.26's near-zero costs do not
        # transfer to it (V1 was rebuilt to cut the V0 engine's per-step CPU work), so it keeps the defaults it had
        # before the per-profile split (phase6's own engine's, below) as a stand-in.
        "step_overhead_ms": 5.0,
        "decode_seq_ms": 0.06,
        "request_overhead_ms": 0.0,
    },
    "torch-tp": {
        # phase6.serving.tp_server (docs/benchmarks.md "Validation on the compiled-prefill engine", "Per-row ..."):
        "step_overhead_ms": 5.0,  # TPOT at C=1 minus the weight read, 4.46 / 4.95 ms at TP=1 / 2
        "decode_seq_ms": 0.06,  # decode-only steps at 16-64 padded rows vs the roofline, least squares 0.059 ms
        "request_overhead_ms": 0.0,  # its per-request work is in the per-step prefill overhead (C=1 fit)
    },
}
"""Per-profile defaults of the engine costs the roofline does not see, each measured on that engine only."""
KV_ALLOCS = ("incremental", "reserve")
COMPARE_PROFILES = ("auto", "vllm")


@dataclass
class RequestClassConfig:
    """One component of a synthetic mix; lengths uniform on inclusive integer ranges."""

    weight: float = 1.0
    """Relative frequency of this class."""
    input_min: int = 100
    """Smallest prompt, tokens (new tokens only: shared system prompt / earlier turns come on top)."""
    input_max: int = 2000
    """Largest prompt, tokens."""
    output_min: int = 100
    """Shortest answer, tokens."""
    output_max: int = 500
    """Longest answer, tokens."""


@dataclass
class FleetWorkloadConfig:
    """Where requests come from: a Mooncake JSONL or Azure CSV trace, or a seeded synthetic mix."""

    kind: str = "synthetic"
    """mooncake | azure | synthetic."""
    path: str | None = None
    """Trace file (mooncake: JSONL with timestamp ms, input_length, output_length, hash_ids; azure: CSV)."""
    limit: int | None = None
    """Read only the first N requests of the trace."""
    repeat: int = 1
    """Play the trace this many times back to back (prefix ids kept distinct); for million-request runs."""
    max_tokens: int | None = None
    """Drop requests whose prompt + output exceed this (counted in the results); None keeps all."""
    num_requests: int = 2000
    """Synthetic: number of requests."""
    rate: float = 10.0
    """Synthetic: mean arrival rate, req/s (load.rates rescale it)."""
    burstiness: float = 1.0
    """Synthetic: gamma shape of inter-arrival gaps (1 = Poisson; < 1 burstier)."""
    classes: list[RequestClassConfig] = field(default_factory=lambda: [RequestClassConfig()])
    """Synthetic: the length mix."""
    prefix_groups: int = 0
    """Synthetic: number of shared system prompts (0 = none)."""
    prefix_tokens: int = 0
    """Synthetic: tokens per shared system prompt."""
    zipf_alpha: float = 0.0
    """Synthetic: Zipf exponent of system-prompt popularity (0 = uniform)."""
    turns: int = 1
    """Synthetic: turns per session; turn k's prompt contains the whole earlier conversation."""
    think_time_s: float = 0.0
    """Synthetic: mean (exponential) gap between a session's turns, seconds."""

    def __post_init__(self) -> None:
        require(
            self.kind in WORKLOAD_KINDS,
            "workload.kind",
            f"must be one of {', '.join(WORKLOAD_KINDS)}, got {self.kind!r}",
        )
        require(self.kind == "synthetic" or bool(self.path), "workload.path", f"a {self.kind} trace needs a file path")
        require(self.limit is None or self.limit >= 1, "workload.limit", f"must be >= 1 or null, got {self.limit}")
        require(self.repeat >= 1, "workload.repeat", f"must be >= 1, got {self.repeat}")
        require(
            self.max_tokens is None or self.max_tokens >= 2,
            "workload.max_tokens",
            f"must be >= 2, got {self.max_tokens}",
        )
        require(self.num_requests >= 1, "workload.num_requests", f"must be >= 1, got {self.num_requests}")
        require(self.rate > 0, "workload.rate", f"must be > 0 req/s, got {self.rate}")
        require(self.burstiness > 0, "workload.burstiness", f"must be > 0, got {self.burstiness}")
        require(len(self.classes) > 0, "workload.classes", "must list at least one request class")
        for i, c in enumerate(self.classes):
            require(
                c.weight > 0 and 1 <= c.input_min <= c.input_max and 1 <= c.output_min <= c.output_max,
                f"workload.classes[{i}]",
                "need weight > 0, 1 <= input_min <= input_max, 1 <= output_min <= output_max",
            )
        require(
            (self.prefix_groups > 0) == (self.prefix_tokens > 0) and self.prefix_groups >= 0,
            "workload.prefix_groups",
            "prefix_groups and prefix_tokens must both be > 0 or both 0",
        )
        require(self.zipf_alpha >= 0, "workload.zipf_alpha", f"must be >= 0, got {self.zipf_alpha}")
        require(self.turns >= 1, "workload.turns", f"must be >= 1, got {self.turns}")
        require(self.think_time_s >= 0, "workload.think_time_s", f"must be >= 0, got {self.think_time_s}")


@dataclass
class EngineConfig:
    """One serving replica: TP degree, continuous-batching limits, KV memory, and where step times come from."""

    tp: int = 4
    """GPUs per replica (tensor parallel)."""
    max_num_seqs: int = 256
    """Most sequences in a batch (vLLM --max-num-seqs)."""
    max_num_batched_tokens: int = 8192
    """Per-step token budget: decodes take 1 each, chunked prefill the rest (vLLM --max-num-batched-tokens)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of HBM the engine may use; KV capacity = that minus the weights (vLLM --gpu-memory-utilization)."""
    kv_blocks: int | None = None
    """Override the KV capacity per replica in 512-token blocks (None = derived from memory)."""
    step_time: str = "planner"
    """planner (phase6.plan.serve.ServeCostModel roofline, efficiencies below) | table (serve-bench results.json)."""
    table_path: str | None = None
    """step_time=table: a serve-bench results.json (rows with concurrency, ttft_p50_ms, tpot_p50_ms)."""
    table_input_tokens: int | None = None
    """step_time=table: mean prompt tokens of the serve-bench run (prefill ms/token = TTFT@C=1 / this)."""
    prefill_mfu: float = 0.5
    """Planner: fraction of peak bf16 FLOP/s a compute-bound step achieves (plan EfficiencyConfig.prefill_mfu)."""
    decode_hbm_efficiency: float = 0.7
    """Planner: fraction of HBM bandwidth a memory-bound step achieves (plan EfficiencyConfig)."""
    runtime_overhead_gib: float = 1.5
    """Planner: per-GPU memory outside weights and KV (CUDA context, NCCL buffers, activations), GiB."""
    step_overhead_ms: float | None = None
    """Planner: fixed per-step cost (scheduler, sampling, launches), ms; null = the profile's measured default
    (:data:`PROFILE_DEFAULTS`: vllm 0.0, torch-tp 5.0, vllm without chunked prefill 5.0). `analysis.compare_with` refits it on a serve-bench run."""
    decode_seq_ms: float | None = None
    """Cost of each decode row a step carries, ms, on top of the roofline (torch-tp: each row of the padded CUDA-graph
    batch); null = the profile's measured default (:data:`PROFILE_DEFAULTS`: vllm 0.0066, torch-tp and vllm-v0 0.06). Engines of
    the vLLM 0.2 era paid ~0.3 ms (Splitwise's measured A100/H100 profile; ``experiment=papers`` states where it uses
    that)."""
    request_overhead_ms: float | None = None
    """Fixed time every request spends outside the engine's steps before its first token, ms: the API server (HTTP,
    chat template, tokenisation), the hand-off to the engine and back; charged once per request (to TTFT and E2E,
    the request enters the engine's queue this long after it arrives), never to a step. null = the profile's measured
    default (:data:`PROFILE_DEFAULTS`: vllm 8.8, vllm-v0 0, torch-tp 0, whose per-request work sits in its per-step prefill
    overhead). `analysis.compare_with` refits it on a vLLM run (the C=1 TTFT intercept)."""
    prefill_overhead_ms: float = 0.0
    """Planner: extra fixed cost of a step that prefills, ms (plan EfficiencyConfig.prefill_overhead_ms); calibrate
    from the TTFT-vs-prompt-length line of a serve-bench run at C=1."""
    bytes_per_param: float = 2.0
    """Weight bytes per parameter (2 = bf16)."""
    kv_bytes_per_elem: float = 2.0
    """KV-cache bytes per element (2 = bf16, 1 = fp8)."""
    profile: str = "vllm"
    """Which engine's scheduling and step shapes a replica follows (phase6.fleet.engines): vllm (chunked prefill;
    a step is one forward of its decode tokens and prefill chunks) | torch-tp (phase6.serving.tp_server: whole
    prompts padded to the step's longest, decode padded to CUDA-graph (batch, KV length) buckets, decode and prefill
    as two forwards, no prefix cache; max_num_seqs = --max-batch, max_num_batched_tokens = --max-prefill-tokens)."""
    max_model_len: int = 4096
    """torch-tp: KV positions per cache row (--max-model-len; the server's default); the KV-length buckets end here."""
    cuda_graphs: bool = False
    """torch-tp: --cuda-graphs (decode padded to (batch, KV length) buckets; the server's default is off: eager
    decode, exact batch, every row attending to the longest row's length)."""
    mixed_step: str = "overlap"
    """vllm profile: cost of a step mixing prefill and decode (phase6.fleet.interference): overlap (the planner's
    max(compute, memory) of the whole batch: the decode rows' KV read hides under the prefill chunk's compute, as
    measured on vLLM 0.26, whose mixed batch is one attention kernel; docs/fleet.md "Mixed steps on vLLM") | serial
    (GEMMs over all tokens, then prefill attention, then the decode rows' KV read: kernels that do not overlap)."""
    chunked_prefill: bool = True
    """vllm profile: True = vLLM V1 (decodes first, prompts chunked into the rest of the budget); False = vLLM V0's
    default scheduler (the baselines of DistServe and Mooncake): whole prompts in prefill-only steps that pause the
    running decodes."""
    kv_alloc: str = "incremental"
    """vllm profile, colocated replicas: incremental = vLLM (a request is admitted on its prompt's KV blocks, takes a
    block per 512 generated tokens, and when none is free the newest running request is preempted and later recomputes
    prompt + generated tokens; phase6.fleet.preempt) | reserve = KV for the whole output reserved at admission, no
    preemption (the earlier model)."""
    prefill_tp: int | None = None
    """PD: TP of the prefill pool's replicas (None = engine.tp); DistServe picks each phase's parallelism."""
    decode_tp: int | None = None
    """PD: TP of the decode pool's replicas (None = engine.tp)."""
    host_kv_gib: float = 0.0
    """Second KV tier: host memory per replica for prefix blocks evicted from HBM (0 = none; phase6.fleet.kvcache)."""
    host_tier: str = "local"
    """local (each replica its own host memory, loaded over PCIe) | global (one pool of every replica's host memory,
    Mooncake Store; loaded over RDMA at hardware.internode_gbps per GPU)."""
    host_link_gbps: float = 25.0
    """Host -> GPU copy bandwidth per GPU for the local tier, GB/s (PCIe 4.0 x16: 32 GB/s raw per direction,
    ~25 GB/s achieved; PCI-SIG 4.0 spec / NVIDIA bandwidthTest)."""

    def __post_init__(self) -> None:
        require(self.tp >= 1, "engine.tp", f"must be >= 1, got {self.tp}")
        require(
            self.profile in ENGINE_PROFILES,
            "engine.profile",
            f"must be one of {', '.join(ENGINE_PROFILES)}, got {self.profile!r}",
        )
        require(
            self.profile != "torch-tp" or self.step_time == "planner",
            "engine.profile",
            "torch-tp shapes the planner's step times (engine.step_time=planner), not a measured table",
        )
        for k in ("step_overhead_ms", "decode_seq_ms", "request_overhead_ms"):
            v = getattr(self, k)
            require(v is None or v >= 0, f"engine.{k}", f"must be >= 0 ms or null, got {v}")
        require(self.max_model_len >= 2, "engine.max_model_len", f"must be >= 2, got {self.max_model_len}")
        require(
            self.mixed_step in MIXED_STEPS, "engine.mixed_step", f"must be serial or overlap, got {self.mixed_step!r}"
        )
        require(self.kv_alloc in KV_ALLOCS, "engine.kv_alloc", f"must be incremental or reserve, got {self.kv_alloc!r}")
        require(self.host_tier in HOST_TIERS, "engine.host_tier", f"must be local or global, got {self.host_tier!r}")
        require(self.host_kv_gib >= 0, "engine.host_kv_gib", f"must be >= 0, got {self.host_kv_gib}")
        require(self.host_link_gbps > 0, "engine.host_link_gbps", f"must be > 0, got {self.host_link_gbps}")
        for k in ("prefill_tp", "decode_tp"):
            v = getattr(self, k)
            require(v is None or v >= 1, f"engine.{k}", f"must be >= 1 or null, got {v}")
        require(self.max_num_seqs >= 1, "engine.max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "engine.max_num_batched_tokens",
            f"must be >= engine.max_num_seqs ({self.max_num_seqs}): each running sequence decodes one token a step, "
            f"got {self.max_num_batched_tokens}",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            "engine.gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        require(
            self.kv_blocks is None or self.kv_blocks >= 1,
            "engine.kv_blocks",
            f"must be >= 1 or null, got {self.kv_blocks}",
        )
        require(
            self.step_time in STEP_TIME_SOURCES,
            "engine.step_time",
            f"must be one of {', '.join(STEP_TIME_SOURCES)}, got {self.step_time!r}",
        )
        require(
            self.step_time != "table" or bool(self.table_path),
            "engine.table_path",
            "step_time=table needs a serve-bench results.json",
        )
        require(
            self.step_time != "table" or (self.table_input_tokens or 0) >= 1,
            "engine.table_input_tokens",
            "step_time=table needs the mean prompt tokens of the measured run",
        )
        require(0 < self.prefill_mfu <= 1, "engine.prefill_mfu", f"must be in (0, 1], got {self.prefill_mfu}")
        require(
            0 < self.decode_hbm_efficiency <= 1,
            "engine.decode_hbm_efficiency",
            f"must be in (0, 1], got {self.decode_hbm_efficiency}",
        )
        require(
            self.runtime_overhead_gib >= 0,
            "engine.runtime_overhead_gib",
            f"must be >= 0, got {self.runtime_overhead_gib}",
        )
        require(
            self.prefill_overhead_ms >= 0, "engine.prefill_overhead_ms", f"must be >= 0, got {self.prefill_overhead_ms}"
        )
        require(self.bytes_per_param > 0, "engine.bytes_per_param", f"must be > 0, got {self.bytes_per_param}")
        require(self.kv_bytes_per_elem > 0, "engine.kv_bytes_per_elem", f"must be > 0, got {self.kv_bytes_per_elem}")

    def _cost(self, key: str) -> float:
        v = getattr(self, key)
        return float(PROFILE_DEFAULTS[self.defaults_key][key] if v is None else v)

    @property
    def defaults_key(self) -> str:
        """The :data:`PROFILE_DEFAULTS` entry of this engine: its profile; vllm-v0 for the vllm profile without
        chunked prefill (vLLM V0's scheduler)."""
        return "vllm-v0" if self.profile == "vllm" and not self.chunked_prefill else self.profile

    @property
    def resolved_step_overhead_ms(self) -> float:
        """step_overhead_ms, or this profile's measured default when null."""
        return self._cost("step_overhead_ms")

    @property
    def resolved_decode_seq_ms(self) -> float:
        """decode_seq_ms, or this profile's measured default when null."""
        return self._cost("decode_seq_ms")

    @property
    def resolved_request_overhead_ms(self) -> float:
        """request_overhead_ms, or this profile's measured default when null."""
        return self._cost("request_overhead_ms")


def parse_policy(p: str) -> tuple[str, int, int]:
    """``colocated`` -> ("colocated", 0, 0); ``pd:P:D`` -> ("pd", P, D). Raises ValueError naming fleet.policies."""
    if p == "colocated":
        return ("colocated", 0, 0)
    parts = p.split(":")
    ok = len(parts) == 3 and parts[0] == "pd" and parts[1].isdigit() and parts[2].isdigit()
    require(
        ok and int(parts[1]) >= 1 and int(parts[2]) >= 1,
        "fleet.policies",
        f"each entry must be 'colocated' or 'pd:P:D' with P, D >= 1 replicas, got {p!r}",
    )
    return ("pd", int(parts[1]), int(parts[2]))


@dataclass
class FleetConfig:
    """Replicas, the P/D policies compared, the routers compared."""

    replicas: int = 8
    """Replicas of the colocated fleet (each engine.tp GPUs); a pd:P:D policy uses P + D replicas."""
    policies: list[str] = field(default_factory=lambda: ["colocated", "pd:3:5"])
    """Serving policies: 'colocated' (prefill and decode share replicas) or 'pd:P:D' (disaggregated)."""
    routers: list[str] = field(default_factory=lambda: list(ROUTERS))
    """Request routers compared (for pd: the prefill pool; the decode pool is always least-loaded)."""
    kv_link: str = "internode"
    """PD KV transfer path: internode (hardware.internode_gbps per GPU) or nvlink (hardware.nvlink_gbps)."""
    sim_engine: str = "simpy"
    """Event loop: simpy (SimPy Environment) or heapq (hand-written; same events, same results)."""

    def __post_init__(self) -> None:
        require(self.replicas >= 1, "fleet.replicas", f"must be >= 1, got {self.replicas}")
        require(len(self.policies) > 0, "fleet.policies", "must list at least one policy")
        for p in self.policies:
            parse_policy(p)
        require(len(self.routers) > 0, "fleet.routers", "must list at least one router")
        for r in self.routers:
            require(r in ROUTERS, "fleet.routers", f"each must be one of {', '.join(ROUTERS)}, got {r!r}")
        require(
            self.kv_link in KV_LINKS, "fleet.kv_link", f"must be one of {', '.join(KV_LINKS)}, got {self.kv_link!r}"
        )
        require(
            self.sim_engine in SIM_ENGINES,
            "fleet.sim_engine",
            f"must be one of {', '.join(SIM_ENGINES)}, got {self.sim_engine!r}",
        )


@dataclass
class LoadSweepConfig:
    """The load sweep (``load:``): absolute request rates (open loop) or concurrencies (closed loop); what one
    serve-bench run sends is ``phase6.config.serve.LoadConfig``."""

    rates: list[float] = field(default_factory=lambda: [2.0, 4.0, 8.0, 16.0])
    """Mean arrival rates, req/s: the workload's timestamps are rescaled to each (trace shape kept); [] = no sweep."""
    mode: str = "open"
    """open (arrivals from the timestamps) | closed (load.concurrency clients, next request on completion)."""
    concurrency: list[int] = field(default_factory=lambda: [1, 16, 64])
    """Closed loop: number of clients."""

    def __post_init__(self) -> None:
        require(self.mode in ("open", "closed"), "load.mode", f"must be open or closed, got {self.mode!r}")
        require(
            all(r > 0 for r in self.rates),
            "load.rates",
            f"must be rates > 0 req/s (an empty list skips the sweep), got {self.rates}",
        )
        require(
            all(c >= 1 for c in self.concurrency),
            "load.concurrency",
            f"must be integers >= 1 (an empty list skips the sweep), got {self.concurrency}",
        )


@dataclass
class AnalysisConfig:
    """Searches on top of the sweep: replicas needed for a rate, and the 'when PD pays' grid."""

    target_rate: float | None = None
    """Find the fewest replicas that serve this rate (req/s) within the SLO, per policy and router; None = skip."""
    max_replicas: int = 64
    """Upper bound of that search."""
    pd_table: bool = False
    """Build the 'when PD disaggregation pays' table (synthetic fixed-length requests, no shared prefixes)."""
    pd_ratios: list[float] = field(default_factory=lambda: [1.0, 4.0, 16.0])
    """Grid rows: prompt/output length ratio."""
    pd_output_tokens: int = 256
    """Output length of the grid's requests (prompt = ratio x this)."""
    pd_slo_scales: list[float] = field(default_factory=lambda: [2.0, 4.0, 8.0])
    """Grid columns: SLO tightness = multiples of the unloaded single-request TTFT and TPOT (DistServe's SLO scale)."""
    pd_replicas: int = 8
    """Replicas (each engine.tp GPUs) both sides get: colocated N vs every pd:P:(N-P)."""
    pd_requests: int = 1500
    """Least requests per simulated rate point of the grid (more at high rates: >= 10 request lifetimes of arrivals)."""
    rate_search_steps: int = 8
    """Bisection steps of a max-rate search."""
    papers: bool = False
    """Build the table of published claims (Mooncake, DistServe, Splitwise) vs simulated (phase6.fleet.papers);
    needs the traces of ../shared/data (or $PHASE6_SHARED_DATA)."""
    papers_requests: int = 1000
    """Requests per simulated trace in the papers table (not the Splitwise rows: they replay splitwise-sim's 2-minute
    traces, rate x 120 s requests)."""
    compare_with: str | None = None
    """A `phase6 serve-bench` run dir (or its results.json) or -m sweep dir: replay each closed-loop run's requests
    in the simulator and report the errors (phase6.fleet.compare)."""
    compare_calibrate: bool = True
    """Fit step overhead, prefill MFU and prefill overhead on each TP's concurrency-1 run (TPOT p50; TTFT vs prompt
    length over its requests) before predicting the other runs (phase6.fleet.compare.calibrate)."""
    compare_lengths: str = "requests"
    """Request lengths replayed per run: requests (the run's completed requests from its requests.jsonl, in send
    order) | mean (every request at the run's mean prompt/output; closed loops then run in lockstep)."""
    compare_profile: str = "auto"
    """Engine profile of the replayed replica: auto (the measured engine's own, from the run's serve.engine:
    torch-tp runs get engine.profile=torch-tp with the run's --max-batch / --max-prefill-tokens / --max-model-len /
    --cuda-graphs; other engines vllm) | vllm (every run on the generic chunked-prefill replica)."""

    def __post_init__(self) -> None:
        require(
            self.target_rate is None or self.target_rate > 0,
            "analysis.target_rate",
            f"must be > 0, got {self.target_rate}",
        )
        require(self.max_replicas >= 1, "analysis.max_replicas", f"must be >= 1, got {self.max_replicas}")
        require(
            len(self.pd_ratios) > 0 and all(r > 0 for r in self.pd_ratios),
            "analysis.pd_ratios",
            f"must be a non-empty list of ratios > 0, got {self.pd_ratios}",
        )
        require(self.pd_output_tokens >= 2, "analysis.pd_output_tokens", f"must be >= 2, got {self.pd_output_tokens}")
        require(
            len(self.pd_slo_scales) > 0 and all(s > 1 for s in self.pd_slo_scales),
            "analysis.pd_slo_scales",
            f"must be a non-empty list of scales > 1, got {self.pd_slo_scales}",
        )
        require(
            self.pd_replicas >= 2,
            "analysis.pd_replicas",
            f"must be >= 2 (one prefill + one decode), got {self.pd_replicas}",
        )
        require(self.pd_requests >= 50, "analysis.pd_requests", f"must be >= 50, got {self.pd_requests}")
        require(
            self.compare_lengths in ("requests", "mean"),
            "analysis.compare_lengths",
            f"must be requests or mean, got {self.compare_lengths!r}",
        )
        require(
            self.compare_profile in COMPARE_PROFILES,
            "analysis.compare_profile",
            f"must be one of {', '.join(COMPARE_PROFILES)}, got {self.compare_profile!r}",
        )
        require(
            self.rate_search_steps >= 2, "analysis.rate_search_steps", f"must be >= 2, got {self.rate_search_steps}"
        )
        require(self.papers_requests >= 50, "analysis.papers_requests", f"must be >= 50, got {self.papers_requests}")


@dataclass
class FleetRunConfig:
    """`phase6 fleet`: goodput, prefix hit rate, replicas and cost of serving policies and routers on a trace."""

    run: RunConfig = field(default_factory=lambda: RunConfig(name="fleet"))
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: str = "llama3.1-70b"
    """Planner preset (configs/plan/model/<name>.yaml) or a path to an HF config.json / model dir: the shapes for
    weights, KV bytes and FLOPs."""
    workload: FleetWorkloadConfig = field(default_factory=FleetWorkloadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    load: LoadSweepConfig = field(default_factory=LoadSweepConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    plots: bool = True
    """Write plots/*.png (matplotlib)."""

    def __post_init__(self) -> None:
        require(bool(self.model), "model", "must name a planner preset, e.g. llama3.1-70b")
        for k in ("ttft_ms", "tpot_ms"):  # the rate searches and the PD grid scale both
            require(getattr(self.slo, k) is not None, f"slo.{k}", "must be a number for the fleet, got null")
