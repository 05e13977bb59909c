"""Typed config of the 6D GRPO job (`configs/grpo.yaml`).

Groups: ``model`` (configs/grpo/model/), ``data`` (configs/grpo/data/), ``engine`` (configs/grpo/engine/: vllm,
vllm_server, hf, verl), plus ``grpo`` (the knobs we sweep; the rest of TRL's GRPOConfig passes through ``grpo.trl``),
``eval`` (pass@1 greedy and pass@k before/after) and ``monitor`` (reward hacking, NVML).
Derived values (samples per step, gradient-accumulation steps) are methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phase6.config import HardwareConfig, HFModelConfig, LoggerConfig, RunConfig, require

TASKS = ("gsm8k", "digits")
FORMAT_REWARDS = ("none", "additive", "gated")
ENGINES = ("vllm", "hf", "verl")
VLLM_MODES = ("colocate", "server")
HF_DECODES = ("loop", "generate")
# TRL 1.16 GRPOConfig.loss_type values
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
IS_CORRECTIONS = ("none", "tis")
# GRPOConfig fields this schema owns; setting them in grpo.trl would silently fight the typed field.
OWNED_TRL_KEYS = (
    "beta",
    "loss_type",
    "learning_rate",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "epsilon",
    "use_vllm",
    "steps_per_generation",
    "num_iterations",
    "generation_batch_size",
    "gradient_checkpointing",
    "bf16",
    "seed",
    "output_dir",
    "report_to",
    "logging_steps",
    "use_cpu",
    "reward_weights",
    "save_strategy",
)


@dataclass
class GrpoModelConfig(HFModelConfig):
    """The policy (and, when ``grpo.beta > 0``, the frozen reference) model."""

    name: str = "qwen2.5-1.5b-instruct"
    name_or_path: str = "Qwen/Qwen2.5-1.5B-Instruct"
    tiny_heads: int | None = None
    """Attention heads of the ``tiny`` model (KV heads: half). None: 4 with engine=hf; tiny_hidden_size / 32 with
    engine=vllm, because vLLM's CPU attention supports head sizes 32, 64, 80, ... only (``tiny_heads_for``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tiny_heads is not None:
            require(
                self.tiny_heads > 0 and self.tiny_hidden_size % self.tiny_heads == 0,
                "model.tiny_heads",
                f"must be > 0 and divide model.tiny_hidden_size={self.tiny_hidden_size}, got {self.tiny_heads}",
            )

    def tiny_heads_for(self, engine: str) -> int:
        if self.tiny_heads is not None:
            return self.tiny_heads
        return max(1, self.tiny_hidden_size // 32) if engine == "vllm" else 4


@dataclass
class GrpoDataConfig:
    """Prompts and verifiers."""

    task: str = "gsm8k"
    """gsm8k (GSM8K main, '#### N' answers) | digits (toy task for CPU tests)."""
    path: str = "openai/gsm8k"
    """GSM8K source: hub id (config 'main'), a directory with <split>.jsonl/.parquet, a file, or 'synthetic'."""
    train_split: str = "train"
    """Split the prompts are drawn from."""
    eval_split: str = "test"
    """Split pass@1 / pass@k are measured on (GSM8K test: 1,319 questions)."""
    num_train: int | None = None
    """Use only the first N training rows (None = all)."""
    format_reward: str = "none"
    """none | additive ('#### N' present, whatever N: farmable, see the monitor) | gated (paid only with a correct N)."""
    format_reward_weight: float = 0.1
    """Weight of the format reward next to correctness (weight 1)."""

    def __post_init__(self) -> None:
        require(self.task in TASKS, "data.task", f"must be one of {list(TASKS)}, got {self.task!r}")
        require(bool(self.path), "data.path", "must be a hub id, a local path or 'synthetic'")
        require(self.num_train is None or self.num_train > 0, "data.num_train", f"must be > 0, got {self.num_train}")
        require(
            self.format_reward in FORMAT_REWARDS,
            "data.format_reward",
            f"must be one of {list(FORMAT_REWARDS)}, got {self.format_reward!r}",
        )
        require(
            self.format_reward_weight >= 0,
            "data.format_reward_weight",
            f"must be >= 0, got {self.format_reward_weight}",
        )


@dataclass
class EngineConfig:
    """Who generates the rollouts (and, for verl, who runs the whole job)."""

    name: str = "vllm"
    """vllm (TRL's vLLM backend, default on GPU) | hf (transformers: static-cache decode loop, CUDA graphs) | verl."""
    vllm_mode: str = "colocate"
    """colocate (vLLM inside the trainer process, shares the GPU) | server (``trl vllm-serve`` on other GPUs)."""
    vllm: dict[str, Any] = field(default_factory=dict)
    """colocate: ``vllm.LLM`` keyword arguments (gpu_memory_utilization, max_model_len, enable_sleep_mode, ...;
    checked against vLLM's EngineArgs before the run starts); server: TRL's VLLMGeneration arguments
    (server_host, server_port, server_timeout, ...)."""
    vllm_logprobs: bool = True
    """colocate: vLLM returns the sampled tokens' log-probs (the behaviour anchor). False: it returns none (vLLM 0.26
    spends ~8 ms per 512-row decode step building them) and the trainer's current-policy forward is the anchor."""
    hf_decode: str = "loop"
    """HF engine: loop (phase6's static-cache decode loop, one CUDA graph replay per token) | generate
    (transformers' generate; the two knobs below apply to it only)."""
    hf_static_cache: bool = True
    """HF engine, decode=generate: static KV cache (prerequisite for the compiled decode step)."""
    hf_compile: bool = True
    """HF engine, decode=generate: compile the decode step (CUDA graphs; CUDA only)."""
    hf_pad_to_multiple: int = 64
    """HF engine: left-pad prompts to a multiple of this (few distinct static-cache shapes, few recompiles)."""
    hf_score_batch_size: int = 8
    """HF engine, decode=generate: rows per scoring forward for behaviour log-probs (bounds the float32 logits)."""
    snapshot_device: str = "cpu"
    """Where the k most recent policy versions are kept for staleness k (cpu | cuda)."""
    probe_every: int = 50
    """Every N steps also run the batch through plain HF generate for the tokens/s comparison (0 = never); the probe
    is slow by design (it is the baseline), so it is timed as its own phase and kept rare."""
    verl_overrides: dict[str, Any] = field(default_factory=dict)
    """engine=verl: extra dotted verl keys (``actor_rollout_ref.rollout.n: 5``) applied on top of the mapping."""
    verl_launch: bool = True
    """engine=verl: launch ``python -m verl.trainer.main_ppo`` after writing the config (False: only write it)."""

    def __post_init__(self) -> None:
        require(self.name in ENGINES, "engine.name", f"must be one of {list(ENGINES)}, got {self.name!r}")
        require(
            self.vllm_mode in VLLM_MODES,
            "engine.vllm_mode",
            f"must be one of {list(VLLM_MODES)}, got {self.vllm_mode!r}",
        )
        require(
            self.snapshot_device in ("cpu", "cuda"),
            "engine.snapshot_device",
            f"must be cpu or cuda, got {self.snapshot_device!r}",
        )
        require(
            self.hf_decode in HF_DECODES,
            "engine.hf_decode",
            f"must be one of {list(HF_DECODES)}, got {self.hf_decode!r}",
        )
        for k in ("hf_pad_to_multiple", "hf_score_batch_size"):
            require(getattr(self, k) >= 1, f"engine.{k}", f"must be >= 1, got {getattr(self, k)}")
        require(self.probe_every >= 0, "engine.probe_every", f"must be >= 0, got {self.probe_every}")
        require(
            self.vllm_logprobs or self.vllm_mode == "colocate",
            "engine.vllm_logprobs",
            "false is supported with engine.vllm_mode=colocate only",
        )
        fixed = ("mode", "model", "accelerator", "processing_class", "logprobs")
        if self.vllm_mode == "colocate":  # phase6.rollout.vllm.COLOCATE_FIXED
            fixed += ("distributed_executor_backend", "logprobs_mode", "tensor_parallel_size")
        for key in fixed:
            require(key not in self.vllm, f"engine.vllm.{key}", "is set by phase6; remove it")


@dataclass
class GrpoTrainConfig:
    """The GRPO knobs we sweep; anything else of TRL's GRPOConfig goes in ``trl``."""

    num_prompts: int = 64
    """Prompts per optimizer step (global); each gets ``num_generations`` completions."""
    num_generations: int = 8
    """Group size G (>= 2): completions per prompt, normalized against each other."""
    micro_batch_size: int = 16
    """Completions per device per forward/backward (TRL's per_device_train_batch_size)."""
    max_steps: int = 200
    """Optimizer steps (= rollouts = policy versions)."""
    learning_rate: float = 1.0e-6
    """AdamW peak learning rate."""
    lr_scheduler: str = "constant_with_warmup"
    """transformers scheduler name."""
    warmup_ratio: float = 0.0
    """Warm-up share of max_steps."""
    beta: float = 0.001
    """KL-to-reference coefficient (k3 estimator); > 0 loads a frozen reference and logs ``kl``."""
    loss_type: str = "dapo"
    """TRL loss aggregation; dapo/dr_grpo avoid GRPO's per-sequence length bias."""
    epsilon: float = 0.2
    """PPO clip range (lower = upper unless grpo.trl.epsilon_high is set)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (log-probs are computed at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts."""
    max_completion_length: int = 1024
    """Generated tokens per completion; 256 (TRL's old default) truncates GSM8K chains and zeroes their reward."""
    staleness: int = 0
    """Rollouts are generated by the policy of exactly k optimizer steps ago (0 = on-policy)."""
    is_correction: str = "none"
    """none: PPO ratio against the behaviour policy | tis: current-policy anchor x truncated IS weight."""
    is_clip: float = 2.0
    """Truncation C of the IS weight min(pi/mu, C) (TRL's vLLM IS correction uses 3.0, verl 2.0)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (memory for speed). Off (with liger and length_buckets) took the
    policy update from 10.85 to 8.76 s and peak memory from 30.1 to 52.0 GiB at 64 x 8 x 512 on one H200
    (docs/benchmarks.md, issue 31; not measured alone); keep it on for 7B on one GPU."""
    mismatch_every: int = 10
    """Run the current-policy no-grad forward for the lag-0 rollout/training mismatch metric every N steps (1: every
    step, 0: never). Staleness > 0, IS correction, or behaviour log-probs the engine could not give run it anyway."""
    length_buckets: bool = True
    """Sort each generation batch by length before splitting it into micro-batches (not with loss_type bnpo, whose
    value depends on the split) and trim the all-padding columns of every log-prob forward."""
    shared_prompt: bool = False
    """Every log-prob pass runs each distinct prompt through the backbone once and shares its KV cache with the
    group's completions (needs length_buckets; one process; not under gradient checkpointing). Same log-probs and
    gradient within float noise (tests/test_grpo_levers.py); the prompt tokens' FLOPs drop by num_generations.
    Not recommended: measured slower on one H200, 25.24 vs 18.72 s per step (docs/benchmarks.md, issue 31)."""
    liger: bool = False
    """Liger-Kernel's fused RMSNorm + SwiGLU on the policy and reference (CUDA + the liger-kernel package). Part of
    the measured-fastest GPU settings (docs/benchmarks.md, issue 31; within transformers' own bf16 error there)."""
    right_align: bool = True
    """With length_buckets: every log-prob forward shifts its rows to right padding and runs without an attention
    mask (causal attention needs none then): SDPA's causal flash kernel with native GQA instead of the masked kernel
    with K/V repeated per query head. Same log-probs and gradient within 1e-5 in float32 (tests/test_grpo_levers.py;
    issue 31)."""
    liger_engine: bool = True
    """With liger: the same kernels in the HF rollout engine's model too (prefill and the decode loop's CUDA graphs;
    issue 31). No effect with engine=vllm."""
    logging_steps: int = 1
    """Log every N optimizer steps (1: every step's breakdown row is logged)."""
    trl: dict[str, Any] = field(default_factory=dict)
    """Other GRPOConfig fields, passed through unchanged (e.g. epsilon_high, scale_rewards, mask_truncated_completions)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per knob, rendered into results.md."""

    def __post_init__(self) -> None:
        for k in ("num_prompts", "micro_batch_size", "max_steps", "max_completion_length", "logging_steps"):
            require(getattr(self, k) >= 1, f"grpo.{k}", f"must be >= 1, got {getattr(self, k)}")
        require(self.num_generations >= 2, "grpo.num_generations", f"must be >= 2, got {self.num_generations}")
        require(
            self.samples_per_step % self.micro_batch_size == 0,
            "grpo.micro_batch_size",
            f"must divide num_prompts x num_generations = {self.samples_per_step}, got {self.micro_batch_size}",
        )
        require(self.learning_rate > 0, "grpo.learning_rate", f"must be > 0, got {self.learning_rate}")
        require(0 <= self.warmup_ratio < 1, "grpo.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        require(self.beta >= 0, "grpo.beta", f"must be >= 0, got {self.beta}")
        require(
            self.loss_type in LOSS_TYPES, "grpo.loss_type", f"must be one of {list(LOSS_TYPES)}, got {self.loss_type!r}"
        )
        require(self.epsilon > 0, "grpo.epsilon", f"must be > 0, got {self.epsilon}")
        require(self.temperature > 0, "grpo.temperature", f"must be > 0 (GRPO samples), got {self.temperature}")
        require(0 < self.top_p <= 1, "grpo.top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.staleness >= 0, "grpo.staleness", f"must be >= 0, got {self.staleness}")
        require(
            self.is_correction in IS_CORRECTIONS,
            "grpo.is_correction",
            f"must be one of {list(IS_CORRECTIONS)}, got {self.is_correction!r}",
        )
        require(self.is_clip >= 1, "grpo.is_clip", f"must be >= 1, got {self.is_clip}")
        require(self.mismatch_every >= 0, "grpo.mismatch_every", f"must be >= 0, got {self.mismatch_every}")
        require(
            self.length_buckets or not self.shared_prompt,
            "grpo.shared_prompt",
            "needs grpo.length_buckets=true (micro-batches of whole prompt groups)",
        )
        for key in self.trl:
            require(
                key not in OWNED_TRL_KEYS,
                f"grpo.trl.{key}",
                "is a typed field of the grpo group (or set elsewhere by phase6); not settable through grpo.trl",
            )

    @property
    def samples_per_step(self) -> int:
        return self.num_prompts * self.num_generations

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each rank."""
        per_rank, rem = divmod(self.samples_per_step, world_size * self.micro_batch_size)
        if rem or per_rank < 1:
            raise ValueError(
                f"grpo.micro_batch_size: {self.samples_per_step} samples per step do not split into "
                f"{world_size} ranks x micro-batches of {self.micro_batch_size}"
            )
        return per_rank


@dataclass
class GrpoEvalConfig:
    """pass@1 (greedy) and pass@k (sampled) on the eval split, before and after training."""

    enabled: bool = True
    """Run the evaluation."""
    before: bool = True
    """Also evaluate the starting policy (the +points are measured against it, same prompt, same scorer)."""
    num_questions: int | None = None
    """First N questions of the eval split (None = all; GSM8K test = 1,319, stderr ~1.2 points at 75%)."""
    k: int = 4
    """Samples per question for pass@k (unbiased estimator with n = k)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k (greedy for pass@1)."""
    max_new_tokens: int = 1024
    """Generation budget per answer."""
    batch_prompts: int = 64
    """Questions per engine call."""

    def __post_init__(self) -> None:
        require(
            self.num_questions is None or self.num_questions >= 1,
            "eval.num_questions",
            f"must be >= 1, got {self.num_questions}",
        )
        require(self.k >= 1, "eval.k", f"must be >= 1, got {self.k}")
        require(self.temperature > 0, "eval.temperature", f"must be > 0, got {self.temperature}")
        for k in ("max_new_tokens", "batch_prompts"):
            require(getattr(self, k) >= 1, f"eval.{k}", f"must be >= 1, got {getattr(self, k)}")


@dataclass
class MonitorConfig:
    """Reward-hacking indicators and the GPU timeline."""

    min_reasoning_words: int = 5
    """Fewer words before the final answer counts as 'no reasoning'."""
    nvml: bool = True
    """Sample GPU utilization and memory through NVML (recorded as unavailable without a driver)."""
    nvml_interval_s: float = 0.05
    """Sampling period (0.05 s = 20 Hz; >= 10 Hz required)."""

    def __post_init__(self) -> None:
        require(
            self.min_reasoning_words >= 0,
            "monitor.min_reasoning_words",
            f"must be >= 0, got {self.min_reasoning_words}",
        )
        require(
            0 < self.nvml_interval_s <= 0.1,
            "monitor.nvml_interval_s",
            f"must be in (0, 0.1] (>= 10 Hz), got {self.nvml_interval_s}",
        )


@dataclass
class GrpoRunConfig:
    """`phase6 grpo`: GRPO on a verifiable task with an instrumented rollout engine."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: GrpoModelConfig = field(default_factory=GrpoModelConfig)
    data: GrpoDataConfig = field(default_factory=GrpoDataConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    grpo: GrpoTrainConfig = field(default_factory=GrpoTrainConfig)
    eval: GrpoEvalConfig = field(default_factory=GrpoEvalConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def __post_init__(self) -> None:
        if self.engine.name == "verl":
            require(
                self.grpo.staleness == 0,
                "grpo.staleness",
                "engine=verl runs verl's synchronous hybrid engine (lag 0); staleness needs engine=vllm or hf",
            )
        if self.grpo.staleness > 0 and self.engine.name == "vllm":
            require(
                not self.engine.vllm.get("enable_sleep_mode", False),
                "engine.vllm.enable_sleep_mode",
                "must be off with grpo.staleness > 0 (not verified that the lagged weights survive sleep and wake-up)",
            )
        require(
            self.data.task != "digits" or self.data.format_reward == "none",
            "data.format_reward",
            "the digits task has no format reward",
        )
