"""Predict-first numbers for 6A (GPT-2 124M / 350M / 1B pretraining): tokens/s, MFU, memory (DDP vs FSDP2), loss.

    from phase6.plan.pretrain import predict_pretrain
    pred = predict_pretrain(cfg.model, cfg.hardware, seq_len=1024, micro_batch_size=64, num_gpus=1, parallel="ddp",
                            train_tokens=10e9)
    rec.finish(rows, predicted=pred.predicted(), measured={...same metric keys...})

Formulas (docs/cost_model.md):
- FLOPs/token = 6N + 12·L·H·Q·T (PaLM appendix B; nanoGPT ``estimate_mfu``, torchtitan), N = matmul parameters.
- tokens/s = tokens per step / (kernel-level compute + exposed communication + optimizer) (phase6.plan.train; an
  explicit mfu= makes the forward+backward run at that fraction of the bf16 peak instead).
- memory = 16 B/param mixed-precision Adam (DDP: replicated; FSDP2 = ZeRO-3: / GPUs) + activations
  (Korthikanti et al. 2022, flash attention) + logits b·s·V·(2+4) B.
- optimizer=muon: + Newton-Schulz FLOPs per step on every GPU (torch.optim.Muon orthogonalizes each hidden matrix on
  every rank): 5 quintic iterations x (4 m^2 n + 2 m^3) per m x n matrix (m <= n), at NS_EFFICIENCY of the peak.
- loss L(N, D) = E + A/N^alpha + B/D^beta (Chinchilla approach 3) for the Hoffmann 2022 and Besiroglu 2024 fits,
  each shifted by delta = observed - fit at a reference run; the two calibrated values are the reported band.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from phase6 import metrics
from phase6.config import HardwareConfig
from phase6.cost import gpu_hours, usd
from phase6.plan.memory import GIB, ParallelLayout, TrainSetup
from phase6.plan.model import ModelSpec
from phase6.plan.profile import HardwareProfile, build_profile
from phase6.plan.train import (
    NS_EFFICIENCY,
    StepPrediction,
    muon_matrix_shapes,
    newton_schulz_flops,
    predict_train_step,
)

# Tokens Muon needs for AdamW's loss on a GPT-2-like 124M model: modded-nanogpt record #3 (Muon, 6,200 steps x
# 524,288 = 3.25B tokens) vs record #2 (tuned AdamW, 4.97B) to 3.28 FineWeb val, same architecture otherwise.
MUON_TOKEN_RATIO = 3.25 / 4.97


def gpt2_hidden_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(rows, cols) of Muon's matrices in a GPT-2 block stack: c_attn, attn c_proj, c_fc, mlp c_proj per layer."""
    return muon_matrix_shapes(spec)


@dataclass(frozen=True)
class LossFit:
    """Chinchilla approach-3 fit L(N, D) = E + A/N^alpha + B/D^beta (N = total parameters)."""

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def __call__(self, n_params: float, tokens: float) -> float:
        return self.E + self.A / n_params**self.alpha + self.B / tokens**self.beta


LOSS_FITS = (
    LossFit("hoffmann", 1.69, 406.4, 410.7, 0.34, 0.28, "Hoffmann et al. 2022, arXiv 2203.15556 App. D"),
    LossFit("besiroglu", 1.8172, 482.01, 2085.43, 0.3478, 0.3658, "Besiroglu et al. 2024 refit, arXiv 2404.10102"),
)


@dataclass(frozen=True)
class LossReference:
    """A measured (N, D, loss) point the fits are shifted to pass through."""

    n_params: float
    tokens: float
    loss: float
    source: str


# llm.c GPT-2 124M on FineWeb (GPT-2 tokenizer): 3.2722 after 10.26B tokens (anchors-6a §0.2). Replace with 6A's own
# measured 124M FineWeb-Edu run once it exists (loss_reference=...).
LLMC_124M = LossReference(124_439_808, 10.26e9, 3.2722, "llm.c 124M, FineWeb 10.26B tokens (modded-nanogpt records)")


@dataclass
class LossPrediction:
    """Final validation loss band for (N, D): each fit raw, its offset delta and calibrated value."""

    n_params: float
    tokens: float
    reference: LossReference
    raw: dict[str, float]
    delta: dict[str, float]
    calibrated: dict[str, float]

    @property
    def low(self) -> float:
        return min(self.calibrated.values())

    @property
    def high(self) -> float:
        return max(self.calibrated.values())

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2


def predict_loss(n_params: float, tokens: float, reference: LossReference = LLMC_124M) -> LossPrediction:
    """L_fit(N, D) + delta, delta = reference.loss - L_fit(reference) (anchors-6a §6: predicts llm.c 350M within
    0.045 nats from the 124M point)."""
    if n_params <= 0 or tokens <= 0:
        raise ValueError(f"predict_loss: need n_params > 0 and tokens > 0, got {n_params}, {tokens}")
    raw = {f.name: f(n_params, tokens) for f in LOSS_FITS}
    delta = {f.name: reference.loss - f(reference.n_params, reference.tokens) for f in LOSS_FITS}
    return LossPrediction(n_params, tokens, reference, raw, delta, {k: raw[k] + delta[k] for k in raw})


def spec_from(model: ModelSpec | Any) -> ModelSpec:
    """A ModelSpec, or the one 6A's trainer builds from a GPT-2 ModelConfig (``ModelSpec.from_trainer_config``)."""
    if isinstance(model, ModelSpec):
        return model
    try:
        return ModelSpec.from_trainer_config(model)
    except ValueError as e:
        raise ValueError(f"predict_pretrain: {e}") from e


@dataclass
class PretrainPrediction:
    """Predicted throughput, memory and loss for a 6A run; ``predicted()`` gives the results.json block."""

    model: str
    params: int
    matmul_params: int
    flops_per_token: float
    seq_len: int
    micro_batch_size: int
    grad_accum_steps: int
    num_gpus: int
    parallel: str
    mfu_assumed: float
    mfu_source: str
    hardware: str
    hardware_source: str
    peak_tflops: float
    step: StepPrediction
    memory_gib: dict[str, dict[str, float]]
    loss: LossPrediction | None
    train_tokens: float
    usd_per_gpu_hour: float
    notes: list[str] = field(default_factory=list)
    optimizer: str = "adamw"
    optimizer_flops_per_step: float = 0.0
    """Newton-Schulz FLOPs per optimizer step on each GPU (optimizer='muon'); included in step.compute_s."""

    @property
    def tokens_per_s(self) -> float:
        return self.step.tokens_per_s

    @property
    def step_time_s(self) -> float:
        return self.step.step_time_s

    @property
    def mfu_pct(self) -> float:
        """Predicted MFU in percent (model FLOPs, recompute not counted)."""
        return 100 * self.step.mfu(self.peak_tflops * 1e12)

    def predicted(self) -> dict[str, Any]:
        """Metric-keyed numbers (phase6.metrics names) so they line up with the measured block of results.json."""
        mem = self.memory_gib[self.parallel]
        out: dict[str, Any] = {
            metrics.TOKENS_PER_S: self.tokens_per_s,
            metrics.STEP_TIME_S: self.step_time_s,
            metrics.MFU_PCT: self.mfu_pct,
            metrics.MEM_MAX_ALLOCATED_GIB: mem["total"],
            "flops_per_token": self.flops_per_token,
            "params": self.params,
        }
        if self.loss is not None:
            out[metrics.VAL_LOSS] = self.loss.mid
            out["val_loss_low"] = self.loss.low
            out["val_loss_high"] = self.loss.high
        if self.train_tokens:
            hours = self.train_tokens / self.tokens_per_s / 3600
            out["train_hours"] = hours
            out[metrics.COST_GPU_HOURS] = gpu_hours(self.num_gpus, hours * 3600)
            out[metrics.COST_USD] = usd(out[metrics.COST_GPU_HOURS], self.usd_per_gpu_hour)
        out["formulas"] = self.formulas()
        return out

    def formulas(self) -> dict[str, str]:
        f = {
            "flops_per_token": f"{metrics.FLOPS_FORMULA} with N={self.matmul_params:,} matmul params, T={self.seq_len}",
            "tokens_per_s": (
                f"MFU {self.mfu_assumed:.2f} x {self.hardware} peak x {self.num_gpus} GPUs / FLOPs-per-token"
                if self.mfu_assumed
                else "tokens/step / (GEMM + attention + memory-bound kernels + optimizer)"
            )
            + f" + exposed comm ({self.mfu_source}; hardware: {self.hardware_source})",
            **(
                {
                    "optimizer": f"Muon: + {self.optimizer_flops_per_step / 1e12:.2f} TFLOP of Newton-Schulz per step "
                    f"per GPU at {NS_EFFICIENCY:.0%} of peak; loss at D x {1 / MUON_TOKEN_RATIO:.2f} AdamW-equivalent "
                    "tokens (modded-nanogpt records #2 vs #3)"
                }
                if self.optimizer == "muon"
                else {}
            ),
            "memory": "16 B/param mixed-precision Adam (DDP replicated, FSDP2 / GPUs) + Korthikanti activations "
            "(flash) + logits b*s*V*6 B",
        }
        if self.loss is not None:
            r = self.loss.reference
            f["val_loss"] = (
                f"mid of band [{self.loss.low:.3f}, {self.loss.high:.3f}]: Chinchilla fits (Hoffmann, "
                f"Besiroglu) + delta from {r.source} (N={r.n_params:.3g}, D={r.tokens:.3g}, L={r.loss})"
            )
        return f

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("step", "loss")}
        d["predicted"] = self.predicted()
        d["comm"] = [c.as_dict() for c in self.step.comm]
        if self.loss is not None:
            d["loss"] = {
                "raw": self.loss.raw,
                "delta": self.loss.delta,
                "calibrated": self.loss.calibrated,
                "band": [self.loss.low, self.loss.high],
                "reference": asdict(self.loss.reference),
            }
        return d


def predict_pretrain(
    model: ModelSpec | Any,
    hardware: HardwareConfig | HardwareProfile,
    *,
    seq_len: int,
    micro_batch_size: int,
    grad_accum_steps: int = 1,
    num_gpus: int = 1,
    parallel: str = "ddp",
    mfu: float | None = None,
    train_tokens: float = 0.0,
    loss_reference: LossReference | None = LLMC_124M,
    activation_checkpointing: bool = False,
    grad_reduce_bytes: int = 4,
    optimizer: str = "adamw",
    ns_steps: int = 5,
) -> PretrainPrediction:
    """Predict a data-parallel GPT-2 pretraining run (6A): DDP (replicated states) or FSDP2 (ZeRO-3); AdamW or Muon
    (optimizer='muon': + Newton-Schulz time per step, loss at MUON_TOKEN_RATIO fewer tokens for the same value)."""
    if parallel not in ("ddp", "fsdp2"):
        raise ValueError(f"parallel must be 'ddp' or 'fsdp2', got {parallel!r}")
    if optimizer not in ("adamw", "muon"):
        raise ValueError(f"optimizer must be 'adamw' or 'muon', got {optimizer!r}")
    for k, v in (
        ("seq_len", seq_len),
        ("micro_batch_size", micro_batch_size),
        ("grad_accum_steps", grad_accum_steps),
        ("num_gpus", num_gpus),
    ):
        if v < 1:
            raise ValueError(f"predict_pretrain: {k} must be >= 1, got {v}")
    spec = spec_from(model)
    profile = hardware if isinstance(hardware, HardwareProfile) else build_profile(hardware)
    # mfu=None: kernel-level compute (GEMM/attention/memory-bound rates of the hardware) + exposed comm, no prior.
    mfu_source = "given" if mfu is not None else f"kernel-level model: {profile.kernel_source()}"
    layout = ParallelLayout(dp=num_gpus)
    tokens = seq_len * micro_batch_size * grad_accum_steps * num_gpus
    setups = {
        name: TrainSetup(
            seq_len=seq_len,
            global_batch_tokens=tokens,
            micro_batch_size=micro_batch_size,
            zero=zero,
            activation_checkpointing=activation_checkpointing,
            grad_reduce_bytes=grad_reduce_bytes,
            optimizer=optimizer,
            ns_steps=ns_steps,
        )
        for name, zero in (("ddp", 0), ("fsdp2", 3))
    }
    steps = {name: predict_train_step(spec, layout, s, profile, mfu) for name, s in setups.items()}
    ns_flops = newton_schulz_flops(muon_matrix_shapes(spec), ns_steps) if optimizer == "muon" else 0.0
    step = steps[parallel]
    loss_tokens = train_tokens / MUON_TOKEN_RATIO if optimizer == "muon" else train_tokens
    pred = PretrainPrediction(
        model=spec.name,
        params=spec.num_params(),
        matmul_params=spec.num_matmul_params(),
        flops_per_token=spec.flops_per_token(seq_len),
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        num_gpus=num_gpus,
        parallel=parallel,
        mfu_assumed=mfu or 0.0,
        mfu_source=mfu_source,
        hardware=profile.hardware.name,
        hardware_source=profile.source,
        peak_tflops=profile.hardware.peak_bf16_tflops,
        step=step,
        memory_gib={name: s.memory.gib() for name, s in steps.items()},
        loss=predict_loss(spec.num_params(), loss_tokens, loss_reference)
        if (train_tokens and loss_reference)
        else None,
        train_tokens=train_tokens,
        usd_per_gpu_hour=profile.hardware.usd_per_gpu_hour,
        optimizer=optimizer,
        optimizer_flops_per_step=ns_flops,
    )
    if step.memory.total > profile.hardware.hbm_gib * GIB:
        pred.notes.append(f"{parallel} needs {step.memory.total / GIB:.1f} GiB > {profile.hardware.hbm_gib} GiB HBM")
    return pred
