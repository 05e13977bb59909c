"""Typed configs for every phase6 job, and the one place where Hydra's DictConfig becomes a dataclass.

Layout (see docs/configs.md):
- ``configs/<job>.yaml`` is a job's primary Hydra config; shared groups live in ``configs/<group>/`` (hardware,
  logger, prices); job-specific groups live in ``configs/<job>/<group>/`` and are put on Hydra's search path only
  for that job, so ``experiment=smoke`` or ``model=...`` mean the job's own options.
- Every job has a root dataclass ``*RunConfig`` registered in ``JOBS``; YAML overrides its defaults, the command
  line wins, and ``__post_init__`` validates with a ``ValueError`` that names the full key.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"


def require(ok: bool, key: str, msg: str) -> None:
    """Raise the one-line ValueError that names the config key (full dotted path) when ``ok`` is false."""
    if not ok:
        raise ValueError(f"{key}: {msg}")


@dataclass
class RunConfig:
    """Where and under which name a run is recorded."""

    dir: str | None = None
    """Run directory; default ``outputs/<job>/<timestamp>_<name>`` (set by the CLI, Hydra's output dir)."""
    name: str = "run"
    """Short name appended to the run directory and used as the W&B run name."""
    seed: int = 1337
    """Global seed (torch, numpy, python) for everything the run samples."""
    overwrite: bool = False
    """A run.dir holding another run's records is refused unless the run resumes it (train.resume) or this is true:
    then the old directory is moved aside to ``<dir>.replaced-<timestamp>`` (never deleted)."""
    overrides: list[str] = field(default_factory=list)
    """Set by the launcher, not a knob: this run's (or sweep member's) command-line overrides, for env.json."""

    def __post_init__(self) -> None:
        require(
            bool(self.name) and "/" not in self.name,
            "run.name",
            f"must be a non-empty name without '/', got {self.name!r}",
        )
        require(self.seed >= 0, "run.seed", f"must be >= 0, got {self.seed}")


@dataclass
class LoggerConfig:
    """Console, local files and W&B fan-out; only rank 0 logs."""

    wandb: bool = True
    """Log to Weights & Biases (offline unless logged in or WANDB_MODE says otherwise)."""
    project: str = "phase6"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team); None = the user's default."""
    mode: str | None = None
    """Force a W&B mode: online | offline | disabled; None = auto (online only when logged in / WANDB_MODE)."""
    console: bool = True
    """Print metrics and progress bars to the console (rich)."""
    log_every: int = 1
    """Console print interval in steps (files and W&B get every logged step)."""

    def __post_init__(self) -> None:
        require(
            self.mode in (None, "online", "offline", "disabled"),
            "logger.mode",
            f"must be one of online, offline, disabled or null, got {self.mode!r}",
        )
        require(self.log_every >= 1, "logger.log_every", f"must be >= 1, got {self.log_every}")


@dataclass
class HardwareConfig:
    """One accelerator type: peak rates, memory, fabric and price, each with its source and date."""

    name: str = "cpu"
    """Identifier, e.g. h100_sxm."""
    peak_bf16_tflops: float = 1.0
    """Dense bf16 tensor-core peak per GPU in TFLOP/s (no sparsity)."""
    hbm_gib: float = 16.0
    """Device memory per GPU in GiB."""
    hbm_tbps: float = 0.05
    """Device memory bandwidth per GPU in TB/s."""
    nvlink_gbps: float = 10.0
    """Intra-node bandwidth per GPU per direction in GB/s (NVLink / NVSwitch)."""
    internode_gbps: float = 1.25
    """Inter-node bandwidth per GPU per direction in GB/s (InfiniBand / RoCE NIC)."""
    intranode_latency_us: float = 10.0
    """Small-message collective latency inside a node, microseconds."""
    internode_latency_us: float = 20.0
    """Small-message collective latency across nodes, microseconds."""
    gpus_per_node: int = 8
    """Accelerators per node."""
    matmul_tflops_bf16: float = 0.0
    """Achievable dense bf16 GEMM TFLOP/s (kernel level, e.g. the published Maximum Achievable Matmul FLOPS or
    `phase6 plan calibrate`'s measured matmul); 0 = unknown (the planner assumes 0.8 x peak and says so)."""
    peak_fp8_tflops: float = 0.0
    """Dense FP8 tensor-core peak in TFLOP/s; 0 = no FP8 tensor cores (FP8 weights then run at the bf16 rate)."""
    matmul_tflops_fp8: float = 0.0
    """Achievable dense FP8 GEMM TFLOP/s (published MAMF); 0 = 0.7 x peak_fp8_tflops."""
    attention_tflops_bf16: float = 0.0
    """Achievable flash-attention forward+backward TFLOP/s on the causal FLOPs actually executed (head_dim 128);
    0 = unknown (0.4 x peak)."""
    nvlink_busbw_gbps: float = 0.0
    """NCCL bus bandwidth inside a node (nccl-tests busbw, ring / all-gather / reduce-scatter), GB/s; 0 = 0.8 x
    nvlink_gbps (NCCL protocol overhead ~20%, NVIDIA/nccl-tests#212)."""
    internode_busbw_gbps: float = 0.0
    """NCCL bus bandwidth per GPU across nodes, GB/s; 0 = 0.96 x internode_gbps (NVIDIA/nccl#1576: 8x200 Gb/s HDR
    -> 192 GB/s all-reduce busbw; nccl-tests#267: NDR 400 Gb/s -> 48-49 GB/s per NIC)."""
    usd_per_gpu_hour: float = 0.0
    """On-demand rental price per GPU-hour in USD."""
    source: str = ""
    """Where the numbers come from (datasheet, price page)."""
    date: str = ""
    """When the numbers were read (YYYY-MM-DD)."""

    def __post_init__(self) -> None:
        for k in ("peak_bf16_tflops", "hbm_gib", "hbm_tbps", "nvlink_gbps", "internode_gbps"):
            require(getattr(self, k) > 0, f"hardware.{k}", f"must be > 0, got {getattr(self, k)}")
        require(self.usd_per_gpu_hour >= 0, "hardware.usd_per_gpu_hour", f"must be >= 0, got {self.usd_per_gpu_hour}")
        require(self.gpus_per_node >= 1, "hardware.gpus_per_node", f"must be >= 1, got {self.gpus_per_node}")
        for k in (
            "matmul_tflops_bf16",
            "peak_fp8_tflops",
            "matmul_tflops_fp8",
            "attention_tflops_bf16",
            "nvlink_busbw_gbps",
            "internode_busbw_gbps",
        ):
            require(getattr(self, k) >= 0, f"hardware.{k}", f"must be >= 0 (0 = unknown), got {getattr(self, k)}")


DTYPES = ("auto", "bf16", "fp32")
"""How every phase6 config key spells a dtype (phase6.dtypes maps them to torch and to the engines' bfloat16 / float32);
``auto`` is each key's documented default rule."""


def check_dtype(value: str, key: str, allowed: tuple[str, ...] = DTYPES) -> None:
    """The one-line error of a dtype key; an engine's spelling (bfloat16, float32) is told phase6's."""
    hint = {"bfloat16": " (phase6 spells it bf16)", "float32": " (phase6 spells it fp32)"}.get(value, "")
    require(value in allowed, key, f"must be one of {list(allowed)}, got {value!r}{hint}")


HF_ATTN = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class HFModelConfig:
    """A transformers causal LM (6C's and 6D's `model` group): hub id or local dir, dtype, attention backend."""

    name: str = "tiny"
    """Preset name, used in run names and tables."""
    name_or_path: str = "tiny"
    """Hub id or local directory; ``tiny`` builds a random Qwen2-architecture model + local tokenizer (tests)."""
    dtype: str = "bf16"
    """Weight dtype: bf16 (GPU default) | fp32 | auto (checkpoint's); bf16 on a CPU-only machine falls to fp32."""
    attn_implementation: str = "sdpa"
    """transformers attention backend."""
    trust_remote_code: bool = False
    """Allow the checkpoint's own Python code (off unless you have read it)."""
    revision: str | None = None
    """Hub revision (commit/tag) to pin."""
    tiny_hidden_size: int = 64
    """Width of the ``tiny`` model."""
    tiny_layers: int = 2
    """Depth of the ``tiny`` model."""
    tiny_vocab_size: int = 512
    """BPE vocabulary of the locally trained ``tiny`` tokenizer."""

    def __post_init__(self) -> None:
        require(bool(self.name_or_path), "model.name_or_path", "must be a hub id, a local directory or 'tiny'")
        check_dtype(self.dtype, "model.dtype")
        require(
            self.attn_implementation in HF_ATTN,
            "model.attn_implementation",
            f"must be one of {list(HF_ATTN)}, got {self.attn_implementation!r}",
        )
        for k in ("tiny_hidden_size", "tiny_layers", "tiny_vocab_size"):
            require(getattr(self, k) > 0, f"model.{k}", f"must be > 0, got {getattr(self, k)}")

    @property
    def is_tiny(self) -> bool:
        return self.name_or_path == "tiny"


@dataclass
class ApiPrice:
    """One hosted-API price point for the cost comparison."""

    provider: str = ""
    model: str = ""
    usd_per_1m_input: float = 0.0
    usd_per_1m_output: float = 0.0
    source: str = ""
    date: str = ""


@dataclass
class PricesConfig:
    """Hosted API prices (per 1M tokens) that self-hosted cost is compared with."""

    api: list[ApiPrice] = field(default_factory=list)


@dataclass
class CostRunConfig:
    """`phase6 cost`: what a number of GPU-hours costs, per 1M tokens, next to API prices."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    prices: PricesConfig = field(default_factory=PricesConfig)
    gpus: int = 8
    """GPUs rented."""
    hours: float = 1.0
    """Wall-clock hours the GPUs are held."""
    input_tokens: float = 0.0
    """Input (prompt) tokens processed in that time; 0 = not applicable."""
    output_tokens: float = 0.0
    """Output (generated or trained) tokens processed in that time."""

    def __post_init__(self) -> None:
        require(self.gpus >= 1, "gpus", f"must be >= 1, got {self.gpus}")
        require(self.hours > 0, "hours", f"must be > 0, got {self.hours}")
        require(self.input_tokens >= 0, "input_tokens", f"must be >= 0, got {self.input_tokens}")
        require(self.output_tokens >= 0, "output_tokens", f"must be >= 0, got {self.output_tokens}")


@dataclass(frozen=True)
class JobSpec:
    """How a job is composed and run: its primary YAML, its root dataclass and its entry point."""

    schema: str
    """``module:Class`` of the root dataclass (imported lazily so `phase6 plan` never imports torch)."""
    main: str
    """``module:function`` or ``projects/<dir>/<file>.py:function`` taking the root dataclass."""
    help: str = ""
    check: str = ""
    """``module:function`` run on the validated root dataclass before the job starts (a check that needs the job's
    own library, e.g. the planner's feasibility check; config validation itself imports nothing else of phase6)."""
    preflight: str | None = None
    """``module:function`` checking the user's inputs (files, endpoints) of one config before the job's module and
    its heavy imports load: a bad file fails in a second with one line."""


# The registry: job name (= primary YAML name = CLI subcommand with '_' -> '-') -> spec.
JOBS: dict[str, JobSpec] = {
    "cost": JobSpec("phase6.config:CostRunConfig", "phase6.cost:main", "GPU-hours and $ per 1M tokens vs API prices"),
    "prepare_data": JobSpec(
        "phase6.config.data:PrepareDataRunConfig",
        "projects/6a_pretrain/prepare.py:main",
        "6A: tokenize a corpus into llm.c shards (shard 0 = val) + manifest.json; resumable",
    ),
    "pretrain": JobSpec(
        "phase6.config.pretrain:PretrainRunConfig",
        "projects/6a_pretrain/train.py:main",
        "6A: GPT-2 pretraining, predicted vs measured",
    ),
    "eval": JobSpec(
        "phase6.config.pretrain:EvalRunConfig",
        "projects/6a_pretrain/eval.py:main",
        "6A: lm-eval + val loss of an HF model",
    ),
    "dpo": JobSpec(
        "phase6.config.dpo:DPORunConfig",
        "projects/6c_dpo/dpo.py:main",
        "LoRA-DPO/IPO/ORPO + battery + verdict",
        preflight="phase6.posttrain.dpo_data:preflight",
    ),
    "grpo": JobSpec(
        "phase6.config.grpo:GrpoRunConfig", "projects/6d_grpo/grpo.py:main", "6D: GRPO on GSM8K, instrumented rollouts"
    ),
    "plan": JobSpec(
        "phase6.config.plan:PlanRunConfig",
        "phase6.plan.job:main",
        "predict memory/comm/time, rank layouts",
        check="phase6.plan.preflight:check",
    ),
    "fleet": JobSpec(
        "phase6.config.fleet:FleetRunConfig", "phase6.fleet.run:main", "fleet simulation: goodput, routing, PD"
    ),
    "serve_bench": JobSpec(
        "phase6.config.serve:ServeBenchRunConfig", "projects/6b_serving/serve_bench.py:main", "6B serving table row"
    ),
}


# Keys renamed so that one concept has one name in every job (docs/configs.md "Names"); the old spelling is refused
# with the one-line unknown-key error, which names the new key.
RENAMED_KEYS: dict[str, str] = {
    "dpo.per_device_batch_size": "dpo.micro_batch_size",
    "dpo.grad_accum": "dpo.grad_accum_steps",
    "plan.micro_batch": "plan.micro_batch_size",
    "train.total_batch_tokens": "train.global_batch_tokens",
    "engine.max_batched_tokens": "engine.max_num_batched_tokens",
}


def key_hint(job: str, key: str) -> str:
    """For an unknown dotted ``key`` of ``job``: "renamed to <new key>", or "did you mean <key>?" naming the closest
    field of the same group, or "" when nothing is close."""
    if key in RENAMED_KEYS:
        return f"renamed to {RENAMED_KEYS[key]}"
    *parents, leaf = key.split(".")
    cls: Any = schema_of(job)
    for name in parents:
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        cls = hints.get(name)
        if cls is None:
            return ""
    if not dataclasses.is_dataclass(cls):
        return ""
    close = difflib.get_close_matches(leaf, [f.name for f in dataclasses.fields(cls)], n=1, cutoff=0.6)
    return f"did you mean {'.'.join([*parents, close[0]])}?" if close else ""


def load_object(ref: str) -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr`` (project folders start with a digit, not importable)."""
    target, _, attr = ref.partition(":")
    if target.endswith(".py"):
        path = CONFIG_DIR.parent / target
        spec = importlib.util.spec_from_file_location(f"phase6_project_{path.parent.name}_{path.stem}", path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, attr)


def schema_of(job: str) -> type:
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; known: {', '.join(sorted(JOBS))}")
    return load_object(JOBS[job].schema)


def check_finite(obj: Any, key: str = "") -> None:
    """Every float in a config is finite: ``optim.lr=inf`` or ``nan`` (which compare false with every bound, so
    range checks let them through) -> the one-line error naming the key. No phase6 setting means infinity."""
    if isinstance(obj, float):
        require(math.isfinite(obj), key, f"must be a finite number, got {obj}")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            check_finite(getattr(obj, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_finite(v, f"{key}[{i}]")


def to_dataclass(job: str, cfg: DictConfig) -> Any:
    """Validate a composed config against the job's dataclass: unknown key, wrong type, bad value -> error."""
    merged = OmegaConf.merge(OmegaConf.structured(schema_of(job)), cfg)
    obj = OmegaConf.to_object(merged)
    check_finite(obj)
    return obj
