"""Typed config of `phase6 plan` (configs/plan.yaml; model presets in configs/plan/model/, a group of this job only).

    phase6 plan model=llama3.1-70b hardware=h100_sxm gpus=8 workload=serve --json
    phase6 plan model=llama3.1-8b hardware=h100_sxm gpus=16 workload=train plan.seq_len=8192 --explain
    phase6 plan plan.hf_config=/path/to/config.json workload=serve plan.profile=outputs/calib/profile.json

The efficiency numbers below are the planner's assumptions; each carries its source in the field docstring and
docs/cost_model.md. A calibrated profile (`phase6 plan calibrate`) replaces the fabric numbers with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phase6.config import HardwareConfig, LoggerConfig, RunConfig, require

WORKLOADS = ("serve", "train")
PP_SCHEDULES = ("auto", "gpipe", "1f1b", "interleaved", "zero_bubble")
AC_MODES = ("auto", "none", "selective", "full")
OUTPUTS = ("table", "json", "explain")


@dataclass
class EfficiencyConfig:
    """How close to peak the kernels run (assumptions; override or calibrate)."""

    mfu: float | None = None
    """Training: a compute-only efficiency vs the dense bf16 peak for the whole forward+backward (communication and
    bubble are still added on top); None (default) = the kernel-level model: GEMMs at the hardware's achievable matmul
    rate, attention at its flash rate, memory-bound kernels at HBM bandwidth (phase6.plan.train.compute_breakdown)."""
    prefill_mfu: float = 0.5
    """Prefill matmul efficiency vs peak: large-batch GEMMs reach ~60-80% (H200 8192^3 matmul 769-798 of 989 TF,
    configs/hardware/h200.yaml), less attention/norm/sampling overheads; vLLM prefill typically ~50%."""
    decode_hbm_efficiency: float = 0.7
    """Fraction of HBM bandwidth a decode step streams weights + KV at (H200 copy 4.3 of 4.8 TB/s = 0.9 ceiling;
    NIM Llama-3.3-70B FP8 TP2 ITL 18.6 ms vs 10.5 ms pure weight read implies ~0.6-0.7 incl. overheads)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of HBM the engine may use (vLLM --gpu-memory-utilization default 0.9)."""
    runtime_overhead_gib: float = 1.5
    """Per-GPU memory outside weights/KV/activations we model: CUDA context (~0.5 GiB), NCCL buffers, CUDA graphs,
    allocator fragmentation. Measured for serving (issue 30): vLLM 0.26 serving Qwen2.5-14B on one H200 at
    gpu_memory_utilization 0.9 logged 96.4 GiB of KV cache, i.e. a reserve of 126.36 - 27.51 - 96.4 = 2.45 GiB, which
    this 1.5 + the 8192-token activation term (0.95 GiB) reproduces to 0.005 GiB (python -m phase6.plan.serve_reserve
    turns a vLLM log into this number; its CUDA graphs, 0.89 GiB, sit outside the 0.9 budget). Serving adds the activations of one prefill chunk of min(context_len,
    max_num_batched_tokens) tokens on top (phase6.plan.memory.serve_memory)."""
    max_num_batched_tokens: int = 8192
    """Serving: tokens one engine step may process (vLLM --max-num-batched-tokens, chunked prefill); its forward's
    activations are reserved beside the KV cache (vLLM's profile run)."""
    step_overhead_ms: float = 0.0
    """Serving: fixed time every engine step pays on top of the roofline (scheduler, sampling, kernel launches,
    host-device syncs), ms. 0 = pure roofline. phase6's torch-tp server on one H200: ~5 ms (Qwen2.5-14B shapes, TPOT
    at concurrency 1 minus the weight read; docs/benchmarks.md). Fit it with `phase6 fleet experiment=compare`."""
    prefill_overhead_ms: float = 0.0
    """Serving: extra fixed time of a step that prefills (on top of step_overhead_ms), ms: work per prefill step
    that does not scale with its tokens (eager launches where decode replays CUDA graphs, input building, first-token
    sampling/streaming). torch-tp on one H200: prefill steps ~110 ms + ~53 ms per 1000 padded tokens
    (scripts/repro/prefill_steps.py). Fit from the TTFT-vs-prompt-length line of a concurrency-1 run."""

    def __post_init__(self) -> None:
        if self.mfu is not None:
            require(0 < self.mfu <= 1, "plan.efficiency.mfu", f"must be in (0, 1] or null, got {self.mfu}")
        for k in ("prefill_mfu", "decode_hbm_efficiency", "gpu_memory_utilization"):
            v = getattr(self, k)
            require(0 < v <= 1, f"plan.efficiency.{k}", f"must be in (0, 1], got {v}")
        require(
            self.runtime_overhead_gib >= 0,
            "plan.efficiency.runtime_overhead_gib",
            f"must be >= 0, got {self.runtime_overhead_gib}",
        )
        require(
            self.max_num_batched_tokens >= 0,
            "plan.efficiency.max_num_batched_tokens",
            f"must be >= 0 (0 = no activation reserve), got {self.max_num_batched_tokens}",
        )
        for k in ("step_overhead_ms", "prefill_overhead_ms"):
            v = getattr(self, k)
            require(v >= 0, f"plan.efficiency.{k}", f"must be >= 0 ms, got {v}")


@dataclass
class PlanConfig:
    """What to plan for: the training or serving setup, fixed parallel sizes, assumptions, output."""

    hf_config: str | None = None
    """Path to an HF config.json (or its directory); wins over the ``model=`` preset."""
    profile: str | None = None
    """Calibrated hardware profile (JSON written by `phase6 plan calibrate`); None = datasheet numbers."""
    dp: int | None = None
    """Fix the data-parallel size (None = enumerate)."""
    tp: int | None = None
    """Fix the tensor-parallel size (None = enumerate)."""
    pp: int | None = None
    """Fix the pipeline-parallel size (None = enumerate)."""
    ep: int | None = None
    """Fix the expert-parallel size (None = enumerate; MoE only)."""
    cp: int | None = None
    """Fix the context-parallel size (None = enumerate; training only)."""
    top_k: int = 5
    """How many ranked candidates to print."""
    output: str = "table"
    """table | json | explain (`--json` / `--explain` on the command line)."""
    # training
    seq_len: int = 4096
    """Training sequence length T."""
    global_batch_tokens: int = 4_194_304
    """Tokens per optimizer step (4M: Llama-3 8B/70B pretraining started at 4M, arXiv 2407.21783 §3.4)."""
    micro_batch_size: int | None = None
    """Sequences per micro-batch per data-parallel replica; None = searched per layout: every power of two that
    divides the replica's sequences per step (and that whole share, one micro-batch), the fastest that fits wins.
    Under ZeRO-3 each micro-batch gathers the parameters again, so the micro-batch decides that traffic."""
    zero: int | None = None
    """ZeRO stage 0-3 (3 = FSDP); None = enumerate 0, 1, 2, 3."""
    activation_checkpointing: str = "auto"
    """none | selective | full | auto (each of the three per layout; the fastest that fits wins). Selective = op-level
    (torchtitan selective_ac_option=op: every other matmul output saved)."""
    fp8: bool = False
    """Training with FP8 linear layers (torchtitan Float8, TE fp8): GEMMs at the hardware's FP8 rate."""
    fused_elementwise: bool = True
    """Norms, activations, RoPE fused (torch.compile / TE); false = eager PyTorch (more HBM traffic)."""
    tp_comm_overlap: bool = False
    """TP collectives overlapped with GEMMs (Megatron --tp-comm-overlap, torchtitan AsyncTP)."""
    activation_layout: str = "sbh"
    """sbh (Megatron: sequence-first activations, TP's sequence-parallel collectives on dim 0) | bsh (torchtitan, HF:
    batch-first; each such collective adds a copy of the gathered tensor, docs/cost_model.md §9)."""
    cp_ring: str = "p2p"
    """p2p (Megatron/TE: one bf16 K/V send per ring step) | torch (torch's context_parallel, torchtitan: K/V
    all-gathered, fp32 dK/dV rotated after every step, the last one exposed; docs/cost_model.md §9)."""
    repeat_kv: bool = False
    """The model expands K/V to the query heads before attention (torchtitan's repeat_kv): CP moves them at that width."""
    fp32_grad_accumulation: bool = False
    """Gradients accumulated and reduced in fp32 main grads (Megatron's bf16 default): 4 B/param of grads and the
    weight-gradient GEMMs read + write fp32 (docs/cost_model.md §9)."""
    optimizer: str = "adamw"
    """adamw | muon (6A's optim=muon: torch.optim.Muon on the blocks' matrices, whole matrices on every rank, so only
    layouts with tp=1 and zero=0 are legal; its Newton-Schulz time is part of the optimizer step)."""
    pp_schedule: str = "auto"
    """auto | gpipe | 1f1b | interleaved | zero_bubble (ZB-H1). auto (default) searches 1F1B, interleaved with
    v = 2, 4, 8 virtual stages and ZB-H1 for every layout with PP > 1 (``recommend.SEARCHED_SCHEDULES``); each
    candidate reports the schedule it was ranked with."""
    virtual_stages: int = 2
    """Model chunks per pipeline rank for the interleaved schedule (when pp_schedule=interleaved)."""
    grad_reduce_bytes: int = 4
    """Bytes per gradient element on the wire: 4 = fp32 reduce (torchtitan MixedPrecisionPolicy default, DDP on
    fp32 params), 2 = bf16."""
    train_tokens: float = 0.0
    """Token budget for GPU-hours and $; 0 = 20 tokens per parameter (Chinchilla, arXiv 2203.15556)."""
    # serving
    context_len: int | None = None
    """Serving context (prompt + output) per sequence for KV capacity and decode cost (vLLM max_model_len); None =
    min(8192, the model's max_position_embeddings). A value above max_position_embeddings is an error."""
    prompt_len: int = 1024
    """Prompt length for the prefill (TTFT) prediction."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 16, 64])
    """Decode batch sizes of the serving table."""
    tp_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """TP sizes of the serving table (those that divide the heads and fit in gpus)."""
    weight_bytes: float = 2.0
    """Bytes per weight when serving (2 = bf16, 1 = FP8)."""
    kv_bytes: float = 2.0
    """Bytes per KV-cache element (2 = bf16, 1 = FP8 KV)."""
    efficiency: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    """Kernel efficiency assumptions."""

    def __post_init__(self) -> None:
        for k in ("dp", "tp", "pp", "ep", "cp"):
            v = getattr(self, k)
            require(v is None or v >= 1, f"plan.{k}", f"must be >= 1 or null, got {v}")
        require(self.top_k >= 1, "plan.top_k", f"must be >= 1, got {self.top_k}")
        require(self.optimizer in ("adamw", "muon"), "plan.optimizer", f"must be adamw or muon, got {self.optimizer!r}")
        if self.optimizer == "muon":
            # torch.optim.Muon orthogonalizes whole matrices on one device: no TP/EP shards, no sharded states
            for k in ("tp", "ep"):
                v = getattr(self, k)
                require(
                    v in (None, 1), f"plan.{k}", f"optimizer=muon needs whole matrices on each GPU ({k}=1), got {v}"
                )
            require(
                self.zero in (None, 0),
                "plan.zero",
                f"optimizer=muon keeps Muon's state whole on each rank (zero=0, DDP), got {self.zero}",
            )
        require(
            self.activation_layout in ("sbh", "bsh"),
            "plan.activation_layout",
            f"must be sbh or bsh, got {self.activation_layout!r}",
        )
        require(self.cp_ring in ("p2p", "torch"), "plan.cp_ring", f"must be p2p or torch, got {self.cp_ring!r}")
        require(self.output in OUTPUTS, "plan.output", f"must be one of {', '.join(OUTPUTS)}, got {self.output!r}")
        require(
            self.context_len is None or self.context_len >= 1,
            "plan.context_len",
            f"must be >= 1 or null, got {self.context_len}",
        )
        for k in ("seq_len", "global_batch_tokens", "micro_batch_size", "virtual_stages", "prompt_len"):
            v = getattr(self, k)
            if v is None and k == "micro_batch_size":
                continue  # searched per layout
            require(v >= 1, f"plan.{k}", f"must be >= 1, got {v}")
        require(
            self.global_batch_tokens >= self.seq_len,
            "plan.global_batch_tokens",
            f"{self.global_batch_tokens} is less than one sequence (plan.seq_len={self.seq_len}); a step holds whole "
            "sequences",
        )

        require(self.zero in (None, 0, 1, 2, 3), "plan.zero", f"must be 0, 1, 2, 3 or null, got {self.zero}")
        require(
            self.activation_checkpointing in AC_MODES,
            "plan.activation_checkpointing",
            f"must be one of {', '.join(AC_MODES)}, got {self.activation_checkpointing!r}",
        )
        require(
            self.pp_schedule in PP_SCHEDULES,
            "plan.pp_schedule",
            f"must be one of {', '.join(PP_SCHEDULES)}, got {self.pp_schedule!r}",
        )
        require(
            self.grad_reduce_bytes in (2, 4), "plan.grad_reduce_bytes", f"must be 2 or 4, got {self.grad_reduce_bytes}"
        )
        require(self.train_tokens >= 0, "plan.train_tokens", f"must be >= 0, got {self.train_tokens}")
        require(
            bool(self.batch_sizes) and all(b >= 1 for b in self.batch_sizes),
            "plan.batch_sizes",
            f"must be a non-empty list of sizes >= 1, got {self.batch_sizes}",
        )
        require(
            bool(self.tp_sizes) and all(t >= 1 for t in self.tp_sizes),
            "plan.tp_sizes",
            f"must be a non-empty list of sizes >= 1, got {self.tp_sizes}",
        )
        require(
            self.weight_bytes in (0.5, 1.0, 2.0, 4.0),
            "plan.weight_bytes",
            f"must be 0.5, 1, 2 or 4, got {self.weight_bytes}",
        )
        require(self.kv_bytes in (1.0, 2.0, 4.0), "plan.kv_bytes", f"must be 1, 2 or 4, got {self.kv_bytes}")


@dataclass
class PlanRunConfig:
    """`phase6 plan`: predict memory, communication, step time / latency and rank parallel layouts."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: dict[str, Any] = field(default_factory=dict)
    """HF config.json fields of the model (a preset from configs/plan/model/, picked with ``model=<name>``)."""
    gpus: int = 8
    """GPUs to plan for (dp*tp*pp*cp must equal it)."""
    workload: str = "serve"
    """serve | train."""
    plan: PlanConfig = field(default_factory=PlanConfig)

    def __post_init__(self) -> None:
        require(self.gpus >= 1, "gpus", f"must be >= 1, got {self.gpus}")
        require(self.workload in WORKLOADS, "workload", f"must be one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        require(
            bool(self.model) or bool(self.plan.hf_config),
            "model",
            "no model: pick a preset with model=<name> or pass plan.hf_config=PATH",
        )
        fixed = [(k, getattr(self.plan, k)) for k in ("dp", "tp", "pp", "cp") if getattr(self.plan, k)]
        prod = 1
        for _, v in fixed:
            prod *= v
        require(
            self.gpus % prod == 0,
            "gpus",
            f"{self.gpus} GPUs cannot be factorized as asked ({' * '.join(f'{k}={v}' for k, v in fixed)} = {prod} "
            f"does not divide {self.gpus})",
        )
        if all(getattr(self.plan, k) for k in ("dp", "tp", "pp", "cp")):
            require(prod == self.gpus, "gpus", f"plan.dp*tp*pp*cp = {prod} != gpus = {self.gpus}")
