"""Typed config groups of the 6A pretraining job (`configs/pretrain.yaml`).

Each dataclass is one Hydra group (`configs/model/`, `configs/optim/`, `configs/parallel/`, `configs/train/`).
Values that a user must be able to defend carry their one-line justification and source in the YAML file
beside them (`justify:`), so the hyperparameter table in results.md is read from the same place as the value.
Derived values (padded vocab, grad-accumulation steps, tokens per step) are methods, not fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from phase6.config import CONFIG_DIR, HardwareConfig, LoggerConfig, RunConfig, check_dtype, require
from phase6.config.data import DataConfig
from phase6.config.evals import LocalTask

SCHEDULES = ("cosine", "warmdown")
ALGORITHMS = ("adamw", "muon")
MUON_ADJUST_LR = ("original", "match_rms_adamw")
PARALLEL_MODES = ("ddp", "fsdp2")
SANITY_MODES = ("none", "overfit_batch")
COMPILE_MODES = (None, "default", "max-autotune", "max-autotune-no-cudagraphs")
SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math", "fa4")
FUSED_CE = ("none", "liger")
FLOAT8 = ("none", "tensorwise", "rowwise")
RESIDUAL_DTYPES = ("fp32", "bf16")
CE_VOCAB = ("sliced", "padded")


RESUME_MUTABLE = (
    "train.max_steps",
    "train.val_every",
    "train.val_tokens",
    "train.ckpt_every",
    "train.keep_checkpoints",
    "train.dry_run_steps",
    "train.export_hf",
    "train.dtype",
    "train.tf32",
    "optim.name",
    "optim.lr",
    "optim.muon_lr",
    "optim.min_lr_ratio",
    "optim.schedule",
    "optim.warmup_steps",
    "optim.warmdown_steps",
    "optim.grad_clip",
    "parallel.",
    "hardware.",
    "logger.",
    "predict.",
    "run.name",
    "data.num_workers",
    "device",
    "auto_prepare",
)
"""Keys a resumed run may change (length, LR schedule, eval and checkpoint cadence, how it runs): applied from the
resume step on and recorded as a change at that step. Any other changed key is refused (``resume_changes``)."""
RESUME_IGNORED = ("run.dir", "run.overrides", "run.overwrite", "train.resume", ".justify")
"""Keys that say where or how a run was started, not what it trains: never compared."""


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(
        key == p or (p.endswith(".") and key.startswith(p)) or (p.startswith(".") and p[1:] in key.split("."))
        for p in patterns
    )


def resume_changes(saved: dict[str, Any], new: dict[str, Any], where: str) -> dict[str, list[Any]]:
    """{key: [saved value, new value]} of the keys a resume may change (RESUME_MUTABLE) that it does change.

    ``saved`` is the config the checkpoint was trained with, ``new`` this run's (both as plain nested dicts);
    a changed key outside RESUME_MUTABLE (model shape, data, seed, optimizer kind and its state-held
    hyperparameters, batch geometry) raises one ValueError naming ``where`` (the checkpoint) and every such key.
    """
    a, b = _flat(saved), _flat(new)
    changed = {
        k: [a.get(k), b.get(k)]
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and not _matches(k, RESUME_IGNORED)
    }
    refused = {k: v for k, v in changed.items() if not _matches(k, RESUME_MUTABLE)}
    if refused:
        shown = "; ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(refused.items())[:6])
        raise ValueError(
            f"train.resume: {where} was trained with a different {', '.join(refused)} ({shown}); a resume may only "
            "change the length, LR schedule, eval/checkpoint cadence and how it runs; start a new run.dir instead"
        )
    return {k: v for k, v in changed.items() if _matches(k, RESUME_MUTABLE)}


def flatten_options(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"triton": {"cudagraphs": False}} -> {"triton.cudagraphs": False}: inductor's dotted option names (a Hydra
    command-line key `parallel.inductor.triton.cudagraphs=false` arrives nested)."""
    flat: dict[str, Any] = {}
    for k, v in options.items():
        if isinstance(v, dict):
            flat.update(flatten_options(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def check_justify(group: Any, key: str) -> None:
    """`justify:` may only name real fields of its group (a typo would silently drop a row from results.md)."""
    names = {f.name for f in fields(group)} - {"justify", "name"}
    unknown = sorted(set(group.justify) - names)
    require(not unknown, f"{key}.justify", f"names unknown fields {unknown}; fields are {sorted(names)}")


@dataclass
class ModelConfig:
    """GPT-2 architecture (module names follow the HF checkpoint: wte, wpe, c_attn, c_proj, c_fc, ln_f)."""

    name: str = "gpt2_tiny"
    """Preset name, used in run names and tables."""
    n_layer: int = 2
    """Number of transformer blocks (L)."""
    n_head: int = 2
    """Attention heads per block (H); n_embd must divide by it."""
    n_embd: int = 64
    """Residual stream width (C); head_dim Q = n_embd / n_head."""
    block_size: int = 64
    """Maximum context (T) and size of the learned position table wpe."""
    vocab_size: int = 257
    """Real tokenizer vocabulary (50257 for GPT-2 BPE, 257 for bytes + EOT); logits beyond it are never scored."""
    pad_vocab_multiple: int = 64
    """wte/lm_head rows are padded up to a multiple of this for tensor-core shapes (50257 -> 50304)."""
    bias: bool = True
    """Biases in Linear/LayerNorm; HF GPT-2 checkpoints have them, so exports stay loadable."""
    dropout: float = 0.0
    """Dropout on attention and residual branches; 0 for single-epoch pretraining (nanoGPT, llm.c)."""
    fused_ce: str = "none"
    """'none': lm_head logits + cross-entropy (compiled); 'liger': Liger-Kernel's fused linear + cross-entropy
    (Triton, CUDA only, optional dependency `liger-kernel`): no (B, T, V) logits in memory, same loss."""
    float8: str = "none"
    """FP8 GEMMs in the blocks' four Linear layers (torchao.float8 training, optional dependency `torchao`):
    'tensorwise' (one dynamic scale per tensor, the fastest) or 'rowwise' (one per row, closer to bf16);
    'none' = bf16 autocast GEMMs. Weights, optimizer and checkpoints stay as they are (fp32 master weights)."""
    float8_lm_head: bool = False
    """Also run the (tied) lm_head GEMMs in FP8 (model.float8 must be set). Its gradient is the widest tensor of the
    step (B x T x 50304), cast to e5m2: check the loss against float8_lm_head=false before trusting it."""
    residual_dtype: str = "fp32"
    """dtype of the residual stream between blocks: 'fp32' (bf16 autocast's default: the embeddings are fp32, so
    every residual add stays fp32) or 'bf16' (cast once after the embeddings; halves the stream's memory
    traffic; needs bf16 training)."""
    ce_vocab: str = "padded"
    """Columns the cross-entropy reads: 'padded' = all padded_vocab_size columns with the padding ones set to -inf
    inside the fused kernels (aligned rows; the same loss, the padding columns get zero gradient) or 'sliced' =
    logits[..., :vocab_size] (rows of 50257 bf16: odd length, no row starts 16-byte aligned; measured 6.6 % slower
    at GPT-2 124M on an H200, docs/benchmarks.md)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per field name, rendered into results.md."""

    def __post_init__(self) -> None:
        check_justify(self, "model")
        require(self.ce_vocab in CE_VOCAB, "model.ce_vocab", f"must be one of {CE_VOCAB}, got {self.ce_vocab!r}")
        require(self.fused_ce in FUSED_CE, "model.fused_ce", f"must be one of {FUSED_CE}, got {self.fused_ce!r}")
        for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "pad_vocab_multiple"):
            require(getattr(self, key) > 0, f"model.{key}", f"must be > 0, got {getattr(self, key)}")
        require(
            self.n_embd % self.n_head == 0,
            "model.n_embd",
            f"({self.n_embd}) must be divisible by model.n_head ({self.n_head})",
        )
        require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        require(self.float8 in FLOAT8, "model.float8", f"must be one of {FLOAT8}, got {self.float8!r}")
        check_dtype(self.residual_dtype, "model.residual_dtype", RESIDUAL_DTYPES)
        if self.float8 != "none":
            # FP8 tensor-core GEMMs (torch._scaled_mm) need every GEMM dimension divisible by 16
            require(self.n_embd % 16 == 0, "model.n_embd", f"({self.n_embd}) must be divisible by 16 for model.float8")
        require(
            not self.float8_lm_head or self.float8 != "none",
            "model.float8_lm_head",
            "needs model.float8=tensorwise|rowwise",
        )
        require(
            not self.float8_lm_head or self.padded_vocab_size % 16 == 0,
            "model.pad_vocab_multiple",
            f"must make the padded vocabulary ({self.padded_vocab_size}) divisible by 16 for model.float8_lm_head",
        )
        require(
            not (self.float8_lm_head and self.fused_ce != "none"),
            "model.float8_lm_head",
            f"cannot be combined with model.fused_ce={self.fused_ce} (the fused loss does its own lm_head GEMM)",
        )

    @property
    def padded_vocab_size(self) -> int:
        """Rows of wte / lm_head: vocab_size rounded up to pad_vocab_multiple."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class OptimConfig:
    """Fused AdamW with weight decay on 2-D (matrix) parameters only, and an LR schedule; or (algorithm='muon')
    torch.optim.Muon on the blocks' hidden matrices with this AdamW on everything else (embeddings / tied LM head,
    biases, LayerNorm gains). Both groups follow the one schedule below, each from its own peak LR."""

    algorithm: str = "adamw"
    """'adamw': AdamW on every parameter; 'muon': torch.optim.Muon on the 2-D weights inside transformer.h (the
    hidden matrices), AdamW (lr, betas, eps, weight_decay below) on the rest (modded-nanogpt's split)."""

    name: str = "adamw_cosine"
    """Preset name."""
    lr: float = 6e-4
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak (cosine: floor; warmdown: end point)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to 2-D parameters only (no biases, no LayerNorm gains)."""
    grad_clip: float = 1.0
    """Global grad-norm clip; 0 disables."""
    schedule: str = "cosine"
    """'cosine': linear warmup then cosine to min_lr; 'warmdown': warmup, constant, then linear decay."""
    warmup_steps: int | None = 10
    """Linear warmup steps from ~0 to lr, as an absolute count (for a recipe defined in steps); null when
    warmup_frac sets it. Exactly one of the two is set."""
    warmup_frac: float | None = None
    """Linear warmup as a fraction of train.max_steps (round(frac * max_steps) steps), so a preset fits any run
    length (modded-nanogpt's cooldown_frac); null when warmup_steps sets it."""
    warmdown_steps: int | None = 0
    """Steps of linear decay at the end (schedule='warmdown' only), as an absolute count; null when warmdown_frac
    sets it. Exactly one of the two is set."""
    warmdown_frac: float | None = None
    """Linear decay at the end as a fraction of train.max_steps (schedule='warmdown' only); null when
    warmdown_steps sets it."""
    fused: bool = True
    """Fused CUDA AdamW kernel (ignored on CPU, where the foreach path is used)."""
    muon_lr: float = 0.02
    """algorithm=muon: peak LR of the hidden matrices (scaled per matrix by muon_adjust_lr)."""
    muon_momentum: float = 0.95
    """algorithm=muon: momentum of the gradient buffer that Newton-Schulz orthogonalizes."""
    muon_nesterov: bool = True
    """algorithm=muon: Nesterov momentum (orthogonalize g + momentum * buffer instead of the buffer)."""
    muon_ns_steps: int = 5
    """algorithm=muon: Newton-Schulz iterations (quintic, bf16) per matrix per step."""
    muon_weight_decay: float = 0.0
    """algorithm=muon: decoupled weight decay of the hidden matrices (p *= 1 - lr * wd)."""
    muon_adjust_lr: str = "original"
    """algorithm=muon: per-matrix LR scale: 'original' = sqrt(max(1, rows/cols)) (Keller Jordan's Muon) or
    'match_rms_adamw' = 0.2 * sqrt(max(rows, cols)) (Moonshot, arXiv 2502.16982)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per field name, rendered into results.md."""

    def __post_init__(self) -> None:
        check_justify(self, "optim")
        require(self.algorithm in ALGORITHMS, "optim.algorithm", f"must be one of {ALGORITHMS}, got {self.algorithm!r}")
        require(0 < self.muon_lr < float("inf"), "optim.muon_lr", f"must be finite and > 0, got {self.muon_lr}")
        require(0.0 <= self.muon_momentum < 1.0, "optim.muon_momentum", f"must be in [0, 1), got {self.muon_momentum}")
        require(0 < self.muon_ns_steps < 100, "optim.muon_ns_steps", f"must be in 1..99, got {self.muon_ns_steps}")
        require(self.muon_weight_decay >= 0, "optim.muon_weight_decay", f"must be >= 0, got {self.muon_weight_decay}")
        require(
            self.muon_adjust_lr in MUON_ADJUST_LR,
            "optim.muon_adjust_lr",
            f"must be one of {MUON_ADJUST_LR}, got {self.muon_adjust_lr!r}",
        )
        require(self.schedule in SCHEDULES, "optim.schedule", f"must be one of {SCHEDULES}, got {self.schedule!r}")
        require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        require(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        for key in ("beta1", "beta2"):
            require(0.0 <= getattr(self, key) < 1.0, f"optim.{key}", f"must be in [0, 1), got {getattr(self, key)}")
        for key in ("weight_decay", "grad_clip"):
            require(getattr(self, key) >= 0, f"optim.{key}", f"must be >= 0, got {getattr(self, key)}")
        for phase in ("warmup", "warmdown"):
            steps, frac = getattr(self, f"{phase}_steps"), getattr(self, f"{phase}_frac")
            require(
                (steps is None) != (frac is None),
                f"optim.{phase}_steps",
                f"set {phase}_steps (absolute) or {phase}_frac (of train.max_steps), exactly one; "
                f"got {phase}_steps={steps}, {phase}_frac={frac} (null the other)",
            )
            require(steps is None or steps >= 0, f"optim.{phase}_steps", f"must be >= 0, got {steps}")
            require(frac is None or 0.0 <= frac <= 1.0, f"optim.{phase}_frac", f"must be in [0, 1], got {frac}")
        require(
            (self.warmup_frac or 0.0) + (self.warmdown_frac or 0.0) <= 1.0,
            "optim.warmdown_frac",
            f"warmup_frac + warmdown_frac ({self.warmup_frac} + {self.warmdown_frac}) exceeds 1",
        )
        require(
            self.schedule == "warmdown" or not (self.warmdown_steps or self.warmdown_frac),
            "optim.warmdown_steps",
            "warmdown is only used with optim.schedule=warmdown; set warmdown_steps=0 (warmdown_frac=null)",
        )

    def num_warmup_steps(self, max_steps: int) -> int:
        """Warmup length in optimizer steps for a run of max_steps."""
        return self.warmup_steps if self.warmup_steps is not None else round((self.warmup_frac or 0.0) * max_steps)

    def num_warmdown_steps(self, max_steps: int) -> int:
        """Warmdown length in optimizer steps for a run of max_steps."""
        if self.warmdown_steps is not None:
            return self.warmdown_steps
        return round((self.warmdown_frac or 0.0) * max_steps)


def check_schedule(optim: OptimConfig, max_steps: int) -> None:
    """The LR schedule must fit in the run: warmup (+ warmdown) <= train.max_steps. Fractions always fit (their sum
    is <= 1); an absolute count set by a recipe for a longer run does not fit a shorter one."""
    warmup, warmdown = optim.num_warmup_steps(max_steps), optim.num_warmdown_steps(max_steps)
    require(warmup <= max_steps, "optim.warmup_steps", f"({warmup}) exceeds train.max_steps ({max_steps})")
    require(
        warmup + warmdown <= max_steps,
        "optim.warmdown_steps",
        f"warmup + warmdown ({warmup} + {warmdown}) exceeds train.max_steps ({max_steps})",
    )


@dataclass
class ParallelConfig:
    """How the model is spread over GPUs and compiled (applied by phase6.parallel in one fixed order)."""

    name: str = "ddp"
    """Preset name."""
    mode: str = "ddp"
    """'ddp' (replicate, all-reduce grads) or 'fsdp2' (fully_shard per block, bf16 params / fp32 reduce)."""
    compile: bool | None = None
    """torch.compile the model (whole model under DDP, per block under FSDP2); None = on for CUDA, off for CPU."""
    compile_mode: str | None = None
    """torch.compile mode (None = default; 'max-autotune-no-cudagraphs' tunes matmuls without CUDA graphs)."""
    fullgraph: bool = False
    """torch.compile(fullgraph=True): a graph break becomes an error instead of a silent slowdown."""
    inductor: dict[str, Any] = field(default_factory=dict)
    """Extra torch._inductor options passed through to torch.compile (e.g. coordinate_descent_tuning: true),
    merged over the compile_mode's own options (torch._inductor.list_mode_options)."""
    sdpa_backend: str = "auto"
    """Attention kernel: 'auto' (PyTorch's priority order: flash on Hopper), or force 'flash', 'cudnn',
    'efficient', 'math' (torch.nn.attention.sdpa_kernel); forcing one that cannot run is an error, not a fallback.
    'fa4' routes SDPA's flash backend to FlashAttention-4's CuTe kernels (SM90/SM100; needs the flash-attn-4
    package: torch.nn.attention.activate_flash_attention_impl)."""
    activation_checkpointing: bool = False
    """Recompute each block in backward to save activation memory (~+33% compute)."""
    reshard_after_forward: bool = True
    """FSDP2 only: free gathered params after forward (ZeRO-3); False keeps them (ZeRO-2-like)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per field name, rendered into results.md."""

    def __post_init__(self) -> None:
        check_justify(self, "parallel")
        require(self.mode in PARALLEL_MODES, "parallel.mode", f"must be one of {PARALLEL_MODES}, got {self.mode!r}")
        require(
            self.compile_mode in COMPILE_MODES,
            "parallel.compile_mode",
            f"must be one of {COMPILE_MODES}, got {self.compile_mode!r}",
        )
        require(
            self.sdpa_backend in SDPA_BACKENDS,
            "parallel.sdpa_backend",
            f"must be one of {SDPA_BACKENDS}, got {self.sdpa_backend!r}",
        )
        if self.inductor:
            from torch._inductor import config as inductor_config

            known = inductor_config.get_config_copy()
            unknown = sorted(set(flatten_options(self.inductor)) - set(known))
            require(not unknown, "parallel.inductor", f"unknown torch._inductor options {unknown}")

    def compile_options(self) -> dict[str, Any]:
        """The inductor options torch.compile gets: the compile_mode's options, then parallel.inductor over them
        (torch.compile takes `mode` or `options`, not both, so the mode is expanded here)."""
        from torch._inductor import list_mode_options

        mode = self.compile_mode if self.compile_mode not in (None, "default") else None
        return {**(list_mode_options(mode) if mode else {}), **flatten_options(self.inductor)}


def check_perf_combination(model: ModelConfig, parallel: ParallelConfig) -> None:
    """The Liger loss is Triton launched from Python (with a host sync): it runs outside the compiled graph, so
    a whole-model fullgraph compile cannot contain it."""
    require(
        not (parallel.fullgraph and model.fused_ce != "none" and parallel.mode == "ddp"),
        "parallel.fullgraph",
        f"cannot be true with model.fused_ce={model.fused_ce} (the fused loss runs outside the compiled graph); "
        "set parallel.fullgraph=false",
    )


def check_precision(model: ModelConfig, bf16: bool) -> None:
    """A bf16 residual stream only exists under bf16 training (fp32 LayerNorm/Linear weights reject bf16 inputs)."""
    require(
        bf16 or model.residual_dtype == "fp32",
        "model.residual_dtype",
        "bf16 needs bf16 training (train.dtype=bf16, or auto on CUDA); set model.residual_dtype=fp32",
    )


@dataclass
class TrainConfig:
    """Batch geometry, length of the run, evaluation/checkpoint cadence and sanity modes."""

    micro_batch_size: int = 8
    """Sequences per GPU per forward (B)."""
    seq_len: int | None = None
    """Tokens per sequence (T), at most model.block_size; None = model.block_size."""
    global_batch_tokens: int = 2048
    """Tokens per optimizer step over all GPUs; grad-accum steps = this / (B * T * world)."""
    max_steps: int = 50
    """Optimizer steps of the run (sets the LR schedule length and the token budget)."""
    dtype: str = "auto"
    """'auto' = bf16 autocast on CUDA, fp32 on CPU; or force 'bf16' / 'fp32'."""
    tf32: bool = False
    """Allow TF32 tensor cores for fp32 matmuls (torch.backends.cuda.matmul.allow_tf32); under bf16 autocast no
    matmul runs in fp32, so this only matters for dtype=fp32 runs."""
    val_every: int = 25
    """Val loss every N steps (and at the last step); 0 disables."""
    val_tokens: int = 8192
    """Tokens of the val shard scored per evaluation (rounded down to whole global batches)."""
    ckpt_every: int = 0
    """Atomic checkpoint every N steps (and at the last step); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Most recent checkpoints kept on disk."""
    resume: str | None = None
    """Checkpoint file to resume from, or 'auto': the newest in <run.dir>/checkpoints (none there = start at step 0)."""
    sanity: str = "none"
    """'overfit_batch': train on one fixed batch (loss must go to ~0); 'none': normal run."""
    dry_run_steps: int = 0
    """If > 0, stop after this many steps (schedule still computed for max_steps); for checking a config."""
    export_hf: bool = True
    """Write an HF GPT2LMHeadModel safetensors directory at the end (for lm-eval / vLLM)."""
    justify: dict[str, str] = field(default_factory=dict)
    """One-line justification + source per field name, rendered into results.md."""

    def __post_init__(self) -> None:
        check_justify(self, "train")
        for key in ("micro_batch_size", "global_batch_tokens", "max_steps", "keep_checkpoints"):
            require(getattr(self, key) > 0, f"train.{key}", f"must be > 0, got {getattr(self, key)}")
        require(self.seq_len is None or self.seq_len > 0, "train.seq_len", f"must be > 0 or null, got {self.seq_len}")
        for key in ("val_every", "val_tokens", "ckpt_every", "dry_run_steps"):
            require(getattr(self, key) >= 0, f"train.{key}", f"must be >= 0, got {getattr(self, key)}")
        check_dtype(self.dtype, "train.dtype")
        require(self.sanity in SANITY_MODES, "train.sanity", f"must be one of {SANITY_MODES}, got {self.sanity!r}")

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step so that B * T * world * accum == global_batch_tokens exactly."""
        assert self.seq_len is not None, "train.seq_len is resolved by PretrainRunConfig"
        per_micro = self.micro_batch_size * self.seq_len * world_size
        require(
            self.global_batch_tokens % per_micro == 0,
            "train.global_batch_tokens",
            f"({self.global_batch_tokens}) must be divisible by train.micro_batch_size * train.seq_len * "
            f"world_size ({self.micro_batch_size} * {self.seq_len} * {world_size} = {per_micro})",
        )
        return self.global_batch_tokens // per_micro

    def total_tokens(self) -> int:
        """Token budget D of the run (max_steps * global_batch_tokens)."""
        return self.max_steps * self.global_batch_tokens


@dataclass
class PredictConfig:
    """Predict-first settings: the numbers written before step 1 (phase6.plan.pretrain.predict_pretrain)."""

    mfu: float | None = None
    """Compute-only efficiency (0-1) vs the bf16 peak for the tokens/s prediction (communication is still added);
    None = the planner's kernel-level model (hardware GEMM/attention/HBM rates, docs/cost_model.md §4)."""
    loss_ref_params: float | None = None
    """Reference run N for the loss offset delta = L_ref - L_fit(N_ref, D_ref); None = llm.c 124M on FineWeb."""
    loss_ref_tokens: float | None = None
    """Reference run D (tokens)."""
    loss_ref_val_loss: float | None = None
    """Reference run's measured val loss (e.g. 6A's own 124M run, or HF gpt2 on the same val shard)."""
    loss_ref_source: str = ""
    """Where the reference point comes from (shown next to the prediction)."""
    scaling_presets: list[str] = field(default_factory=lambda: ["gpt2_350m", "gpt2_1.3b"])
    """Other model presets (configs/pretrain/model/) predicted at the same token budget and hardware."""

    def __post_init__(self) -> None:
        require(self.mfu is None or 0 < self.mfu <= 1, "predict.mfu", f"must be in (0, 1] or null, got {self.mfu}")
        known = sorted(p.stem for p in (CONFIG_DIR / "pretrain" / "model").glob("*.yaml"))
        unknown = [name for name in self.scaling_presets if name not in known]
        require(not unknown, "predict.scaling_presets", f"unknown model presets {unknown}; known: {known}")
        ref = (self.loss_ref_params, self.loss_ref_tokens, self.loss_ref_val_loss)
        require(
            all(v is None for v in ref) or all(v is not None and v > 0 for v in ref),
            "predict.loss_ref_params",
            f"loss_ref_params / loss_ref_tokens / loss_ref_val_loss must be all null or all > 0, got {ref}",
        )


@dataclass
class PretrainRunConfig:
    """`phase6 pretrain`: GPT-2 pretraining with predictions written before step 1 and checked at the end."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    device: str = "auto"
    """'auto' (cuda:LOCAL_RANK if available, else cpu), 'cuda' or 'cpu'."""
    auto_prepare: bool = True
    """Tokenize data.* into data.out_dir first when it holds no shards (the embedded corpus takes seconds)."""
    predict: PredictConfig = field(default_factory=PredictConfig)

    def __post_init__(self) -> None:
        require(self.device in ("auto", "cuda", "cpu"), "device", f"must be auto, cuda or cpu, got {self.device!r}")
        check_schedule(self.optim, self.train.max_steps)
        check_perf_combination(self.model, self.parallel)
        require(
            not (self.optim.algorithm == "muon" and self.parallel.mode == "fsdp2"),
            "optim.algorithm",
            "muon needs whole matrices for Newton-Schulz and FSDP2 shards them (torch.optim.Muon is single-device); "
            "use parallel=ddp (GPT-2 <= 350M fits one GPU)",
        )
        if self.train.dtype == "fp32" or (self.train.dtype == "auto" and self.device == "cpu"):
            check_precision(self.model, bf16=False)  # known before any device is touched
        if self.train.seq_len is None:
            self.train.seq_len = self.model.block_size
        require(
            self.train.seq_len <= self.model.block_size,
            "train.seq_len",
            f"({self.train.seq_len}) must be <= model.block_size ({self.model.block_size})",
        )

    def hyperparameter_rows(self) -> list[dict[str, Any]]:
        """results.md table: every justified value with its one-line justification, read from the config itself."""
        rows = []
        for key in ("model", "optim", "parallel", "train"):
            group = getattr(self, key)
            for name, why in group.justify.items():
                rows.append({"hyperparameter": f"{key}.{name}", "value": getattr(group, name), "why (source)": why})
        return rows


@dataclass
class EvalRunConfig:
    """`phase6 eval`: lm-eval-harness on an HF model directory or hub id, and its val loss on our shards."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: str = "gpt2"
    """HF model directory (a 6A run's `hf/` export) or hub id (`gpt2` = OpenAI's 124M, the baseline)."""
    tasks: list[str] = field(default_factory=lambda: ["hellaswag", "arc_easy", "piqa"])
    """lm-eval built-in tasks (GPT-2 124M: HellaSwag acc_norm 29.4, the anchors' baseline)."""
    local_tasks: list[LocalTask] = field(default_factory=list)
    """Extra tasks from local JSONL files (phase6.config.evals.LocalTask, run by phase6.evals.battery)."""
    num_fewshot: int | None = 0
    """Few-shot examples (0 = the zero-shot setting of the GPT-2 / llm.c HellaSwag numbers); None = task default."""
    limit: int | None = None
    """Cap examples per task (smoke runs only: a capped benchmark is not the benchmark)."""
    batch_size: int = 16
    """lm-eval batch size."""
    dtype: str = "auto"
    """'auto' (bf16 on CUDA, fp32 on CPU), 'fp32' or 'bf16' (lm-eval gets transformers' bfloat16 / float32)."""
    device: str = "auto"
    """'auto', 'cuda' or 'cpu'."""
    val_data: str | None = None
    """Shard directory (prepare-data out_dir or llm.c shards): mean loss on its val shard; None = skip."""
    val_tokens: int = 10_485_760
    """Val tokens scored (10 x 2^20, the speedrun's definition), rounded down to whole batches."""
    val_seq_len: int | None = None
    """Context of each val window; None = the model's context (GPT-2: 1024)."""
    val_batch_size: int = 16
    """Windows per forward for the val loss."""
    trust_remote_code: bool = False
    """Allow model code from the model directory / hub (off unless you trust the source)."""

    def __post_init__(self) -> None:
        require(bool(self.model), "model", "is required: an HF directory (e.g. <run dir>/hf) or hub id (e.g. gpt2)")
        require(
            bool(self.tasks or self.local_tasks or self.val_data),
            "tasks",
            "nothing to do: give tasks, local_tasks or val_data",
        )
        check_dtype(self.dtype, "dtype")
        require(self.device in ("auto", "cuda", "cpu"), "device", f"must be auto, cuda or cpu, got {self.device!r}")
        for key in ("batch_size", "val_tokens", "val_batch_size"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        require(self.val_seq_len is None or self.val_seq_len > 0, "val_seq_len", f"must be > 0, got {self.val_seq_len}")
        require(self.limit is None or self.limit > 0, "limit", f"must be > 0 or null, got {self.limit}")
