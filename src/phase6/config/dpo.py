"""Typed config of the 6C LoRA-DPO job (`configs/dpo.yaml`).

Groups: ``model`` (configs/dpo/model/), ``lora`` (configs/dpo/lora/, one per architecture), ``data``
(configs/dpo/data/), plus ``dpo`` (the knobs we sweep; everything else of TRL's DPOConfig/ORPOConfig passes through
``dpo.trl``), ``diagnostics``, ``eval`` (regression battery, verdict, judge) and ``output``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phase6.config import HardwareConfig, HFModelConfig, LoggerConfig, RunConfig, require
from phase6.config.evals import LOCAL_TASK_KINDS, LocalTask

FORMATS = ("preference", "ultrafeedback", "hh_rlhf", "llamafactory")
"""Preference-data formats phase6.posttrain.dpo_data reads (data.format)."""

# TRL 1.16 DPOConfig.loss_type values, plus "orpo" (trl.experimental.orpo.ORPOTrainer: single stage, no reference).
DPO_LOSSES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
LOSSES = (*DPO_LOSSES, "orpo")
# Fields of TRL's configs that this schema owns; setting them in dpo.trl would silently fight the typed field.
OWNED_TRL_KEYS = (
    "beta",
    "loss_type",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "precompute_ref_log_probs",
    "gradient_checkpointing",
    "bf16",
    "seed",
    "output_dir",
    "report_to",
    "eval_strategy",
    "eval_steps",
    "logging_steps",
    "push_to_hub",
    "hub_token",
    "use_cpu",
    "warmup_steps",
    "lr_scheduler_type",
)


@dataclass
class DPOModelConfig(HFModelConfig):
    """The policy (and, with the adapter disabled, the reference) model."""


@dataclass
class DPOLoraConfig:
    """PEFT LoRA adapter; target module names follow the architecture's checkpoint."""

    arch: str = "qwen2"
    """Architecture the target names belong to (documentation; checked against the model's modules at load)."""
    r: int = 16
    """Rank."""
    alpha: int = 32
    """lora_alpha; the update is scaled by alpha / r."""
    dropout: float = 0.05
    """Dropout on the adapter input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names to adapt; ['all-linear'] = every Linear except the LM head."""
    use_rslora: bool = False
    """Rank-stabilised scaling alpha / sqrt(r)."""

    def __post_init__(self) -> None:
        require(self.r >= 1, "lora.r", f"must be >= 1, got {self.r}")
        require(self.alpha > 0, "lora.alpha", f"must be > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, "lora.dropout", f"must be in [0, 1), got {self.dropout}")
        require(bool(self.target_modules), "lora.target_modules", "must name at least one module")
        require(
            "lm_head" not in self.target_modules,
            "lora.target_modules",
            "must not contain lm_head (TRL computes log-probs from lm_head.weight; an adapter there is ignored)",
        )


@dataclass
class DPODataConfig:
    """Preference data source, format and validation policy."""

    name: str = "smoke"
    """Preset name."""
    path: str = "projects/6c_dpo/data/smoke_pairs.jsonl"
    """Local .json/.jsonl file (relative to the working directory) or a hub dataset id."""
    format: str = "preference"
    """preference | ultrafeedback | hh_rlhf | llamafactory (see phase6.posttrain.dpo_data)."""
    split: str = "train"
    """Hub split (ignored for local files)."""
    data_dir: str | None = None
    """Hub data_dir, e.g. helpful-base for Anthropic/hh-rlhf."""
    drop_invalid: bool = False
    """Drop (and count) rows with missing fields / empty responses instead of stopping at the first one."""
    max_rows: int | None = None
    """Read only the first N rows (smoke runs)."""
    eval_size: int = 64
    """Held-out pairs (fixed by run.seed): eval loss / reward accuracy, the probe set and the length prompts."""

    def __post_init__(self) -> None:
        require(self.format in FORMATS, "data.format", f"must be one of {list(FORMATS)}, got {self.format!r}")
        require(bool(self.path), "data.path", "must be a local file or a hub dataset id")
        require(self.max_rows is None or self.max_rows > 0, "data.max_rows", f"must be > 0, got {self.max_rows}")
        require(self.eval_size >= 1, "data.eval_size", f"must be >= 1, got {self.eval_size}")


@dataclass
class DPOTrainConfig:
    """The knobs we sweep or must defend; the rest of TRL's config passes through ``trl``."""

    loss: str = "sigmoid"
    """sigmoid (DPO) | ipo | orpo (single-stage, no reference) | any other TRL 1.16 DPO loss_type."""
    beta: float = 0.1
    """DPO β (for ipo: τ; for orpo: λ). 0.1 = DPO paper / Tulu 2; Zephyr used 0.01."""
    learning_rate: float = 5e-6
    """LoRA-DPO LR: TRL's table gives 5e-6 for LoRA (10× the 5e-7 full fine-tune LR)."""
    num_epochs: float = 1.0
    """Epochs over the training split (ignored when max_steps > 0)."""
    max_steps: int = -1
    """Optimizer steps; -1 = num_epochs."""
    micro_batch_size: int = 2
    """Pairs per device per micro-step (each pair = 2 sequences); peak memory grows with pairs x 2 x max_length."""
    grad_accum_steps: int = 8
    """Micro-steps per optimizer step."""
    max_length: int = 1024
    """Tokens per prompt+completion sequence (keep_start truncation)."""
    precompute_ref_log_probs: bool = True
    """Score the reference once (length-sorted, phase6.posttrain.reference) instead of a forward per step (n/a: ORPO)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (memory for ~1 extra forward)."""
    group_by_length: bool = True
    """Batch pairs of similar token length (less padding; TRL 1.16's padding_free is disabled)."""
    warmup_ratio: float = 0.1
    """Linear warmup share of the steps."""
    lr_scheduler: str = "cosine"
    """transformers scheduler name."""
    eval_steps: int = 50
    """Held-out eval + margin probe every N optimizer steps."""
    logging_steps: int = 10
    """Training metrics every N optimizer steps."""
    trl: dict[str, Any] = field(default_factory=dict)
    """Pass-through kwargs for trl.DPOConfig / ORPOConfig (e.g. ld_alpha, label_smoothing, optim, weight_decay)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per field, rendered into results.md."""

    def __post_init__(self) -> None:
        require(self.loss in LOSSES, "dpo.loss", f"must be one of {list(LOSSES)}, got {self.loss!r}")
        require(self.beta > 0, "dpo.beta", f"must be > 0, got {self.beta}")
        require(self.learning_rate > 0, "dpo.learning_rate", f"must be > 0, got {self.learning_rate}")
        require(self.num_epochs > 0, "dpo.num_epochs", f"must be > 0, got {self.num_epochs}")
        require(self.max_steps == -1 or self.max_steps > 0, "dpo.max_steps", f"must be -1 or > 0, got {self.max_steps}")
        for k in ("micro_batch_size", "grad_accum_steps", "max_length", "eval_steps", "logging_steps"):
            require(getattr(self, k) >= 1, f"dpo.{k}", f"must be >= 1, got {getattr(self, k)}")
        require(0.0 <= self.warmup_ratio < 1.0, "dpo.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        clash = sorted(set(self.trl) & set(OWNED_TRL_KEYS))
        require(not clash, "dpo.trl", f"keys {clash} are typed fields of this config; set dpo.<field> instead")

    def pairs_per_step(self, world_size: int) -> int:
        """Preference pairs per optimizer step across all ranks."""
        return self.micro_batch_size * self.grad_accum_steps * world_size


@dataclass
class DiagnosticsConfig:
    """Margin probe and generation length statistics."""

    probe_size: int = 32
    """Held-out pairs scored at step 0 and at every eval (first N of the eval split)."""
    probe_batch_size: int = 4
    """Pairs per probe forward."""
    length_prompts: int = 32
    """Held-out prompts generated from before and after training (first N of the eval split)."""
    max_new_tokens: int = 1024
    """Greedy generation cap; generations that hit it are counted as truncated (the length check then cannot pass)."""
    length_batch_size: int = 8
    """Prompts per generate() call."""

    def __post_init__(self) -> None:
        for k in ("probe_size", "probe_batch_size", "length_prompts", "max_new_tokens", "length_batch_size"):
            require(getattr(self, k) >= 1, f"diagnostics.{k}", f"must be >= 1, got {getattr(self, k)}")


@dataclass
class LocalTaskConfig:
    """A custom lm-eval task from a local JSONL file."""

    name: str = ""
    """Task name."""
    path: str = ""
    """JSONL file (multiple_choice: question/choices/answer; generate: prompt/target)."""
    kind: str = "multiple_choice"
    """multiple_choice | generate."""
    until: list[str] = field(default_factory=lambda: ["\n"])
    """Stop strings (generate)."""
    max_gen_toks: int = 128
    """Generation cap (generate)."""

    def __post_init__(self) -> None:
        require(
            self.kind in LOCAL_TASK_KINDS,
            "eval.local_tasks.kind",
            f"must be one of {list(LOCAL_TASK_KINDS)}, got {self.kind!r}",
        )
        require(
            bool(self.name) and self.name.replace("_", "").isalnum(),
            "eval.local_tasks.name",
            f"must be letters, digits and '_', got {self.name!r}",
        )
        require(bool(self.path), "eval.local_tasks.path", "must be a JSONL file")

    def to_task(self) -> LocalTask:
        return LocalTask(
            name=self.name, path=self.path, kind=self.kind, until=list(self.until), max_gen_toks=self.max_gen_toks
        )


@dataclass
class JudgeConfig:
    """MT-Bench-style pairwise judge through an OpenAI-compatible endpoint; skipped when base_url is null."""

    base_url: str | None = None
    """e.g. http://127.0.0.1:8000/v1 ; null = skip judging (the report says so)."""
    model: str = ""
    """Judge model name at that endpoint."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself is never in the config or logs)."""
    num_prompts: int = 32
    """Held-out prompts judged (uses the length-stat generations)."""

    def __post_init__(self) -> None:
        require(self.base_url is None or bool(self.model), "eval.judge.model", "must be set when base_url is set")
        require(self.num_prompts >= 1, "eval.judge.num_prompts", f"must be >= 1, got {self.num_prompts}")


@dataclass
class DPOEvalConfig:
    """Regression battery (lm-eval, base vs base+adapter, same settings) and the verdict bar."""

    enabled: bool = True
    """Run the battery after training."""
    tasks: list[str] = field(default_factory=lambda: ["mmlu", "truthfulqa_mc2"])
    """lm-eval task names (built-in); local tasks are added from local_tasks."""
    local_tasks: list[LocalTaskConfig] = field(default_factory=list)
    """Custom tasks from local JSONL files."""
    num_fewshot: int | None = None
    """Few-shot count for every task; null = each task's default."""
    limit: int | None = None
    """Examples per task (smoke only: a capped MMLU is not MMLU)."""
    batch_size: int = 8
    """lm-eval batch size."""
    apply_chat_template: bool = False
    """Format battery prompts with the chat template (same setting before and after)."""
    target: str = "truthfulqa_mc2"
    """The metric DPO should improve: a battery task name, or 'judge' (pairwise win rate > 50%)."""
    max_mmlu_drop_pts: float = 2.0
    """Verdict: MMLU may drop at most this many points."""
    max_length_ratio: float = 1.3
    """Verdict: mean generation length after/before at most this."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Optional pairwise judge."""

    def __post_init__(self) -> None:
        names = [*self.tasks, *(t.name for t in self.local_tasks)]
        require(len(names) == len(set(names)), "eval.tasks", f"task names must be unique, got {names}")
        require(self.batch_size >= 1, "eval.batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.limit is None or self.limit >= 1, "eval.limit", f"must be >= 1, got {self.limit}")
        require(
            self.target == "judge" or self.target in names,
            "eval.target",
            f"must be 'judge' or one of the battery tasks {names}, got {self.target!r}",
        )
        require(self.max_mmlu_drop_pts >= 0, "eval.max_mmlu_drop_pts", f"must be >= 0, got {self.max_mmlu_drop_pts}")
        require(self.max_length_ratio > 0, "eval.max_length_ratio", f"must be > 0, got {self.max_length_ratio}")


@dataclass
class DPOOutputConfig:
    """What the run leaves behind."""

    merge: bool = False
    """Also write base+adapter merged weights (safetensors, full model size)."""
    push_to_hub: bool = False
    """Upload the adapter; only when asked. The token comes from the environment variable hub_token_env."""
    hub_model_id: str | None = None
    """Target repo, e.g. user/qwen2.5-7b-dpo-lora."""
    hub_private: bool = True
    """Create the hub repo private."""
    hub_token_env: str = "HF_TOKEN"
    """Environment variable holding the hub token (never logged or written)."""

    def __post_init__(self) -> None:
        require(
            not self.push_to_hub or bool(self.hub_model_id),
            "output.hub_model_id",
            "must be set when output.push_to_hub=true",
        )


@dataclass
class DPORunConfig:
    """`phase6 dpo`: LoRA-DPO (or IPO / ORPO) with TRL + PEFT, margin/length diagnostics and a regression battery."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: DPOModelConfig = field(default_factory=DPOModelConfig)
    lora: DPOLoraConfig = field(default_factory=DPOLoraConfig)
    data: DPODataConfig = field(default_factory=DPODataConfig)
    dpo: DPOTrainConfig = field(default_factory=DPOTrainConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    eval: DPOEvalConfig = field(default_factory=DPOEvalConfig)
    output: DPOOutputConfig = field(default_factory=DPOOutputConfig)

    def __post_init__(self) -> None:
        require(
            self.diagnostics.probe_size <= self.data.eval_size,
            "diagnostics.probe_size",
            f"({self.diagnostics.probe_size}) must be <= data.eval_size ({self.data.eval_size})",
        )
        require(
            self.diagnostics.length_prompts <= self.data.eval_size,
            "diagnostics.length_prompts",
            f"({self.diagnostics.length_prompts}) must be <= data.eval_size ({self.data.eval_size})",
        )
        require(
            self.eval.judge.base_url is None or self.eval.judge.num_prompts <= self.diagnostics.length_prompts,
            "eval.judge.num_prompts",
            f"({self.eval.judge.num_prompts}) must be <= diagnostics.length_prompts "
            f"({self.diagnostics.length_prompts}): the judge compares the length-stat generations",
        )
