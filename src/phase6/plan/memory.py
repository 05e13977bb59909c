"""Memory per GPU: training (model states under DP / ZeRO-1/2/3 / TP / PP / EP / CP, activations) and serving.

Model states follow ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054 §3.1): mixed-precision Adam keeps 2 B bf16
params + 2 B bf16 grads + 12 B fp32 optimizer states (master copy, momentum, variance) = 16 B/param before
sharding; ZeRO-1 shards the 12, ZeRO-2 the 12 and the grads, ZeRO-3 (= FSDP full shard) all 16 over the
data-parallel group. Activations follow Korthikanti et al. 2022 (arXiv 2205.05198 §4), generalised to GQA and
gated MLPs; with sequence parallelism every term divides by TP, and flash attention removes the a·s² terms.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from phase6.plan.model import ModelSpec

GIB = 2**30
# ZeRO's byte split of mixed-precision Adam: bf16 param, bf16 grad, fp32 master + m + v (arXiv 1910.02054 §3.1).
PARAM_BYTES, GRAD_BYTES, OPTIM_BYTES = 2, 2, 12
# Per-term factors measured on a GPU (scripts/repro/h200_plan_memory.py on one H200, fitted by
# scripts/repro/plan_memory_fit.py, which writes this file): {"source", "activations": {none|selective|full: measured
# / formula}, "zero3_transient": measured / formula, "reserve_fraction": (peak reserved - peak allocated) / dynamic
# bytes}. Absent = the formulas alone (what `phase6 plan --explain` then calls "formula only, never measured").
MEMORY_CALIBRATION_PATH = Path(__file__).with_name("memory_calibration.json")


@lru_cache(maxsize=4)
def _load_calibration(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    for key in ("source", "activations", "zero3_transient", "reserve_fraction"):
        if key not in data:
            raise ValueError(f"{p}: missing key {key!r} (written by scripts/repro/plan_memory_fit.py)")
    return data


def memory_calibration() -> dict:
    """The GPU-measured memory factors, or {} when none were fitted yet."""
    return _load_calibration(str(MEMORY_CALIBRATION_PATH))


@dataclass(frozen=True)
class ParallelLayout:
    """One factorization of the GPUs: dp * tp * pp * cp = GPUs; EP is carved out of dp * cp (torchtitan/Megatron)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}·ep{self.ep}·cp{self.cp}"


@dataclass(frozen=True)
class TrainSetup:
    """The training step being planned."""

    seq_len: int
    global_batch_tokens: int
    micro_batch_size: int = 1
    zero: int = 1
    """ZeRO stage 0-3."""
    activation_checkpointing: bool = False
    """Full recompute: keep each block's input only, rerun its forward in backward."""
    pp_schedule: str = "1f1b"
    virtual_stages: int = 2
    grad_reduce_bytes: int = 4
    flash_attention: bool = True
    """SDPA/flash: no a·s² score matrix is stored."""
    dropout: bool = False
    """Dropout masks stored (Korthikanti's 34·sbh counts two per block)."""
    selective_ac: bool = False
    """Selective (op-level) activation checkpointing, torchtitan ``mode=selective, selective_ac_option=op``: every
    other matmul output and the attention output are saved, the rest recomputed (ignored when
    ``activation_checkpointing`` is full)."""
    fp8: bool = False
    """FP8 linear layers (torchtitan Float8 / TE fp8): GEMMs at the FP8 rate, attention stays bf16."""
    fused_elementwise: bool = True
    """Norms, activations, RoPE and residual adds run as fused kernels (torch.compile, TE, llm.c); False = eager
    PyTorch, one kernel per op with fp32 upcasts (more HBM traffic, docs/cost_model.md §4)."""
    fused_loss: bool | None = None
    """Cross-entropy as one fused kernel (llm.c, torch.compile, Megatron --cross-entropy-loss-fusion); None = as
    ``fused_elementwise``."""
    tp_comm_overlap: bool = False
    """TP collectives overlap the neighbouring GEMMs (Megatron --tp-comm-overlap, torchtitan AsyncTP)."""
    tp_overlap_backward: bool = True
    """With ``tp_comm_overlap``: the backward's TP collectives are overlapped too (Transformer Engine userbuffers,
    Megatron); False = forward passes only (torch AsyncTP's inductor fusion, docs/cost_model.md §3)."""
    optimizer: str = "adamw"
    """adamw | muon (torch.optim.Muon on the blocks' 2-D weights, AdamW on the rest): Muon adds its Newton-Schulz
    iterations to the optimizer step (plan/train.py ``muon_seconds``) and needs whole matrices (tp=1, zero=0)."""
    ns_steps: int = 5
    """Muon's Newton-Schulz iterations per step (torch.optim.Muon ns_steps)."""
    attention_kernel: str = "cudnn"
    activation_layout: str = "sbh"
    """Activation tensor layout: "sbh" (Megatron: sequence first, so the sequence-parallel all-gathers and
    reduce-scatters of TP run on dim 0, contiguous) or "bsh" (torchtitan, HF: batch first; torch's functional
    collectives on the sequence dim 1 add a chunk + cat copy of the whole gathered tensor to each, plan/train.py
    ``tp_layout_copy_bytes``)."""
    fp32_grad_accumulation: bool = False
    """Weight-gradient GEMMs accumulate into fp32 main grads (Megatron's default in bf16: --accumulate-allreduce-
    grads-in-fp32 with gradient_accumulation_fusion): each reads and writes 4 B per weight element per micro-batch
    instead of writing 2 B (plan/train.py ``main_grad_bytes``)."""
    """Flash-attention kernel: "cudnn" (Transformer Engine, llm.c, PyTorch SDPA's default on Hopper in recent torch)
    or "fa2" (FlashAttention-2, PyTorch SDPA's flash backend); its rate curve is in plan/profile.py."""
    cp_ring: str = "p2p"
    """Ring attention of context parallelism: "p2p" (one K/V send per ring step in bf16, overlapped with the step
    before; Megatron/Transformer Engine style) or "torch" (torch.distributed.tensor.experimental.context_parallel, as
    torchtitan runs it: K/V all-gathered once per pass, fp32 dK/dV rotated by an all-to-all after every step - the
    last one waited with nothing to hide behind - and a cat copy of the K/V buffer per step; plan/train.py
    ``cp_merge_bytes`` and the CP term of ``predict_train_step``)."""
    repeat_kv: bool = False
    """The model expands K/V to the query heads before the attention call (torchtitan's Llama ``repeat_kv`` ahead of
    F.scaled_dot_product_attention): context parallelism then rotates, copies and accumulates K/V and dK/dV at the
    query width (n_heads/n_kv_heads x the bytes)."""

    def __post_init__(self) -> None:
        if self.activation_layout not in ("sbh", "bsh"):
            raise ValueError(f"activation_layout: must be sbh or bsh, got {self.activation_layout!r}")
        if self.cp_ring not in ("p2p", "torch"):
            raise ValueError(f"cp_ring: must be p2p or torch, got {self.cp_ring!r}")

    @property
    def sp_gathered_inputs(self) -> bool:
        """Sequence parallelism saves the all-gathered GEMM inputs at full length: torchtitan's DTensor SP, whose runs
        are the ``activation_layout: bsh`` ones (Megatron, "sbh", saves the s/TP shard and re-gathers in backward)."""
        return self.activation_layout == "bsh"

    @property
    def ac_mode(self) -> str:
        return "full" if self.activation_checkpointing else ("selective" if self.selective_ac else "none")

    def num_microbatches(self, layout: ParallelLayout) -> int:
        return microbatch_count(self.global_batch_tokens, self.seq_len, layout.dp, self.micro_batch_size)


def microbatch_count(global_batch_tokens: int, seq_len: int, dp: int, micro_batch_size: int) -> int:
    """m = sequences per step / (dp * micro_batch_size), rounded up; CP ranks share a sequence, TP/PP ranks share a
    micro-batch (``TrainSetup.num_microbatches``, and the recommender's schedule and practice checks before a setup
    exists)."""
    return max(1, math.ceil(global_batch_tokens / seq_len / (dp * micro_batch_size)))


def zero_state_bytes(
    num_params: float, zero: int, shard: int, grad_bytes: int = GRAD_BYTES
) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for ``num_params`` under ZeRO ``zero`` over ``shard`` ranks
    (``grad_bytes`` = 4 for fp32 main grads, Megatron's bf16 default)."""
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0, 1, 2 or 3, got {zero}")
    p = num_params * PARAM_BYTES / (shard if zero >= 3 else 1)
    g = num_params * grad_bytes / (shard if zero >= 2 else 1)
    o = num_params * OPTIM_BYTES / (shard if zero >= 1 else 1)
    return p, g, o


def activation_bytes_per_layer(
    model: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int = 1,
    cp: int = 1,
    flash_attention: bool = True,
    dropout: bool = False,
    sp_gathered: bool = False,
    eager_swiglu: bool = False,
) -> float:
    """Bytes one transformer block stores for backward (bf16), Korthikanti et al. 2022 generalised.

    For GPT-2-style blocks (MHA, 4h non-gated MLP) with dropout and no flash attention this is exactly
    s·b·h·(34 + 5·a·s/h); every term divides by TP (sequence parallel) and the sequence by CP, except:
    - ``sp_gathered`` (torchtitan's DTensor sequence parallelism, ``activation_layout: bsh``): the all-gathered input of
      the QKV and of the gate/up projections is what their matmuls save, at full length 2·s·b·h each, not /TP
      (Megatron saves the s/TP shard and all-gathers it again in backward, Korthikanti §4.2.2);
    - ``eager_swiglu`` (``fused_elementwise: false``): ``silu(w1 x) * w3 x`` in eager mode saves four s·f tensors
      (w1 out, silu out, w3 out, the product = w2's input); a fused/compiled SwiGLU saves three (silu recomputed).
    """
    s, b, h = seq_len / cp, micro_batch_size, model.hidden_size
    sbh = s * b * h
    norms = 2 * 2 * sbh  # inputs of the two norms
    attn = 2 * sbh  # QKV projection input
    attn += 2 * s * b * (model.q_dim + 2 * model.kv_dim)  # Q, K, V kept for the attention backward
    attn += 2 * s * b * model.q_dim  # attention output = output-projection input
    if flash_attention:
        attn += 4 * s * b * model.num_heads  # fp32 log-sum-exp per row
    else:
        attn += 2 * model.num_heads * s * s * b / cp  # softmax output
        if dropout:
            attn += 3 * model.num_heads * s * s * b / cp  # dropout mask (1 B) + dropout output (2 B)
    if dropout:
        attn += sbh  # residual dropout mask
    gated_bytes = 8 if eager_swiglu else 6
    if model.is_moe:
        f = model.expert_size
        per_token_mlp = model.experts_per_token * (gated_bytes if model.gated_mlp else 4) * f
        if model.shared_expert_intermediate_size:
            per_token_mlp += 6 * model.shared_expert_intermediate_size
        mlp = 2 * sbh + s * b * per_token_mlp + 2 * s * b * model.num_experts  # input, experts, router logits
    else:
        f = model.intermediate_size
        # input; gate/up/act (3·2sbf, eager 4·2sbf) or act-in/out (2·2sbf)
        mlp = 2 * sbh + s * b * (gated_bytes if model.gated_mlp else 4) * f
    if dropout:
        mlp += sbh
    gathered = 2 * (2 * sbh) * (1 - 1 / tp) if sp_gathered else 0.0  # QKV and MLP inputs at full length
    return (norms + attn + mlp) / tp + gathered


def _sac_saved_outputs(model: ModelSpec, s: float, b: int, tp: int, sp_gathered: bool) -> tuple[float, float]:
    """torchtitan op-level selective AC (``selective_ac_option: op``) on a Llama block (7 mms: wq, wk, wv, wo, w1,
    w3, w2): every other mm output is saved (wq, wv, w1, w2) and the attention output with its fp32 log-sum-exp.
    Returns (bytes those saved outputs take, the part of them that ``activation_bytes_per_layer`` also counts):
    w2's output is not needed by the plain backward, and with torchtitan's SP it is the full-length partial sum."""
    q, kv, h, f = model.q_dim, model.kv_dim, model.hidden_size, model.intermediate_size
    shared = 2 * s * b * (q + kv + q + f) / tp + 4 * s * b * model.num_heads / tp  # Q, V, attn out, w1 out, lse
    w2_out = 2 * s * b * h if (sp_gathered or tp == 1) else 2 * s * b * h / tp
    return shared + w2_out, shared


def activation_terms(model: ModelSpec, setup: TrainSetup, tp: int = 1, cp: int = 1) -> dict[str, float]:
    """Per-block activation terms of one micro-batch (bytes): ``per_layer`` (everything a block saves, no AC),
    ``checkpoint`` (a block's input, kept under full AC), ``saved`` (what a block keeps between forward and backward
    under the setup's AC mode), ``recompute`` (what the block being recomputed adds in backward on top of its kept
    bytes: full AC the rest of the block, selective what SAC did not save), ``workspace`` (the backward's working set at its peak, one block's MLP backward, the larger of two
    moments: in w2's backward, the grad of its input s·b·f/TP, its weight's gradient h·f/TP as the GEMM writes it
    before it is added into the accumulated grad, and with TP > 1 the block output's grad all-gathered to full length
    s·b·h (SP's reduce-scatter backward, torchtitan and Megatron alike); or in the SwiGLU backward, two s·b·f/TP grads
    with the product's saved tensor already freed)), and for ZeRO-3 (``zero3_buffer_bytes``): ``grads_at_peak``, the
    most that the block's own bf16 grads held so far plus the working set exceed ``workspace`` over the MLP backward's
    moments (``_zero3_mlp_backward_excess``), and ``incoming_grad``, the output gradient 2·s·b·h/TP of a block that is
    not the last one in backward (the last one's is the loss's, counted with the logits)."""
    s, b = setup.seq_len / cp, setup.micro_batch_size
    sp_gathered = setup.sp_gathered_inputs and tp > 1
    eager = not setup.fused_elementwise
    per_layer = activation_bytes_per_layer(
        model, setup.seq_len, b, tp, cp, setup.flash_attention, setup.dropout, sp_gathered, eager
    )
    checkpoint = 2 * s * b * model.hidden_size / tp
    f = model.expert_size * max(1, model.experts_per_token) if model.is_moe else model.intermediate_size
    h = model.hidden_size
    f_w = model.expert_size if model.is_moe else model.intermediate_size  # the largest weight is h x f_w / TP
    at_w2 = s * b * f / tp + h * f_w / tp + (s * b * h if tp > 1 else 0.0)
    workspace = 2 * max(at_w2, 2 * s * b * f / tp)
    if model.gated_mlp and not model.is_moe:
        grads_at_peak = _zero3_mlp_backward_excess(model, s * b, tp, sp_gathered, eager, workspace)
    else:  # other MLPs: w2's grad, held when the peak is the activation backward (after w2's)
        grads_at_peak = 2 * h * f_w / tp if 2 * s * b * f / tp > at_w2 else 0.0
    if setup.activation_checkpointing:
        saved, recompute = checkpoint, per_layer - checkpoint  # the recomputed block's input is its checkpoint
    elif setup.selective_ac and model.gated_mlp and not model.is_moe and setup.flash_attention:
        kept, shared = _sac_saved_outputs(model, s, b, tp, sp_gathered)
        saved, recompute = checkpoint + kept, per_layer - checkpoint - shared
    elif setup.selective_ac:  # other block shapes: ~half of each block kept, the other half recomputed
        saved, recompute = checkpoint + 0.5 * per_layer, 0.5 * per_layer
    else:
        saved, recompute = per_layer, 0.0
    return {
        "per_layer": per_layer,
        "checkpoint": checkpoint,
        "saved": saved,
        "recompute": recompute,
        "workspace": workspace,
        "grads_at_peak": grads_at_peak,
        "incoming_grad": 2 * s * b * h / tp,
    }


def peak_activation_bytes(terms: dict[str, float], kept_blocks: float) -> float:
    """The planner's ``activations`` term from ``activation_terms``: the kept bytes of ``kept_blocks`` blocks (layers x
    in-flight micro-batches) + the block being recomputed + the backward's working set. ``train_memory`` and the
    calibration fit (scripts/repro/plan_memory_fit.py) price it here, so the measured factor applies to this term."""
    return kept_blocks * terms["saved"] + terms["recompute"] + terms["workspace"]


def zero3_buffers(terms: dict[str, float], layer_params: float, grad_reduce_bytes: int, inflight: float = 1.0) -> float:
    """``zero3_buffer_bytes`` for a block of ``layer_params`` parameters per GPU with the activation terms of
    ``activation_terms`` (``inflight`` micro-batches of kept bytes per block); shared by ``train_memory`` and the fit."""
    return zero3_buffer_bytes(
        layer_params,
        inflight * terms["saved"],
        terms["recompute"] + terms["workspace"],
        grad_reduce_bytes,
        terms["grads_at_peak"],
        terms["incoming_grad"],
    )


def _zero3_mlp_backward_excess(
    model: ModelSpec, tokens: float, tp: int, sp_gathered: bool, eager: bool, workspace: float
) -> float:
    """How far a ZeRO-3 block's bf16 grads held so far + the working set exceed ``workspace`` (the plain run's peak,
    whose grads are preallocated) over a gated MLP's backward, in autograd's order (bytes; elements x 2 B below,
    relative to the block's whole state saved + recompute; t = tokens = s·b, f and the weights per TP rank):
    - w2's backward: w2's input grad t·f + its weight grad h·f (being written) + with TP > 1 the all-gathered output
      grad t·h (= the plain run's first moment; no grad held yet);
    - the SwiGLU product's backward: two t·f grads, the product's saved input freed, + w2's grad held;
    - w3's backward: its input grad at full length t·h, one t·f net freed (product, gate and up outputs freed, two
      grads alive), + w2's and w3's grads;
    - w1's backward: two full-length input grads 2·t·h, (k - 1)·t·f freed (k = the s·f tensors SwiGLU saved: 4 eager,
      3 fused; only w1's input grad alive), + the three MLP grads;
    - the MLP norm's backward: the MLP's saved tensors freed (k·t·f and its input, t·h gathered or t·h/TP Megatron),
      the norm's working set (eager, ``fused_elementwise: false``: fp32 copies of input, grad, normalised input, grad
      and two temporaries = 12·t·h/TP, + the incoming grad t·h/TP; fused: grad in + grad out, 2·t·h/TP), + the three
      MLP grads.
    Megatron's SP (``sp_gathered`` false, TP > 1) saves the t·h/TP shard and all-gathers it again for the weight-grad
    GEMMs: + t·h while w3's and w1's backward run. Measured (docs/benchmarks.md, plan memory on one H200): the plain run
    peaks at one of the first two moments; with ZeRO-3 the grads held move the peak later as h·f/TP grows against t·f
    (70B at TP 8, 405B)."""
    h, f = model.hidden_size, model.intermediate_size
    nf, nh, nl, w = tokens * f / tp, tokens * h, tokens * h / tp, h * f / tp
    k = 4 if eager else 3
    m_saved = nh if (sp_gathered or tp == 1) else nl
    regather = nh - m_saved
    norm_ws = (13 if eager else 2) * nl
    moments = (
        nf + w + (nh if tp > 1 else 0.0),  # w2's backward
        2 * nf + w,  # SwiGLU product's backward
        nh + regather - nf + 2 * w,  # w3's backward
        2 * nh + regather - (k - 1) * nf + 3 * w,  # w1's backward
        -k * nf - m_saved + norm_ws + 3 * w,  # the MLP norm's backward
    )
    return max(0.0, 2 * max(moments) - workspace)


def zero3_buffer_bytes(
    layer_params: float,
    block_saved: float,
    block_backward: float = 0.0,
    grad_reduce_bytes: int = 4,
    grads_at_peak: float = 0.0,
    incoming_grad: float = 0.0,
) -> float:
    """ZeRO-3 / FSDP2 buffers (no PP) on top of the activation peak, per GPU: P = one block's parameters per GPU.

    FSDP2's backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``: reshard, reclaim the
    previous reduce-scatter input, copy this block's grads into a new one kept in flight, ``reduce_scatter_max_input_
    buffers`` = 1) holds, while block i's backward runs: block i and the prefetched block i-1 gathered in bf16 (2·2 B),
    block i's unsharded bf16 grads as they are produced (2 B), and block i+1's reduce-scatter input in the reduce
    dtype (``grad_reduce_bytes``). The activation peak is at the first block in backward's working set
    (``block_backward`` = its recompute + working set, over ``block_saved`` kept bytes per block); the joint peak is
    the largest of three moments, measured from the activation peak:
    - A, the first block in backward: nothing in flight yet, 2·2 B·P + how far its own grads held so far and the
      working set exceed the plain peak (``grads_at_peak``; the plain run holds all grads already);
    - B, the second block's working set: A + the first block's reduce input, its kept bytes freed: - block_saved,
      + the second block's output gradient (``incoming_grad``; the first block's is the loss's, already counted);
    - C, the end of the second block: all 10 B·P, both blocks' kept bytes and the working set freed."""
    a = layer_params * 2 * PARAM_BYTES + grads_at_peak
    b = a + layer_params * grad_reduce_bytes - block_saved + incoming_grad
    c = layer_params * (2 * PARAM_BYTES + GRAD_BYTES + grad_reduce_bytes) - 2 * block_saved - block_backward
    return max(a, b, c)


def _inflight_microbatches(setup: TrainSetup, pp: int, m: int) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    if pp == 1:
        return 1.0
    if setup.pp_schedule == "gpipe":
        return float(m)  # all forwards before any backward
    inflight = float(min(pp, m))  # 1F1B and ZB-H1 (same peak as 1F1B, Qi et al. 2023)
    if setup.pp_schedule == "interleaved":
        inflight *= 1 + (pp - 1) / (pp * setup.virtual_stages)  # Narayanan et al. 2021 / Korthikanti eq. 5
    return inflight


@dataclass
class TrainMemory:
    """Peak bytes per GPU on the worst pipeline stage, by component."""

    params: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    transient: float
    overhead: float

    @property
    def total(self) -> float:
        return (
            self.params + self.grads + self.optimizer + self.activations + self.logits + self.transient + self.overhead
        )

    def gib(self) -> dict[str, float]:
        d = {k: v / GIB for k, v in asdict(self).items()}
        d["total"] = self.total / GIB
        return d


def stage_params(model: ModelSpec, pp: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((dense, expert) params of the first stage, (dense, expert) of the last stage), before TP/EP."""
    layers = math.ceil(model.num_layers / pp)
    dense_layer = (
        model.attention_params_per_layer() + model.norm_params_per_layer() + model.dense_mlp_params_per_layer()
    )
    body_dense, body_exp = layers * dense_layer, layers * model.expert_params_per_layer()
    embed = model.embedding_params() + model.position_params()
    head = model.vocab_size * model.hidden_size if model.tie_word_embeddings else model.lm_head_params()
    head += model.final_norm_params()
    if pp == 1:
        only = (body_dense + embed + head - (model.embedding_params() if model.tie_word_embeddings else 0), body_exp)
        return only, only
    return (body_dense + embed, body_exp), (body_dense + head, body_exp)


def train_memory(model: ModelSpec, layout: ParallelLayout, setup: TrainSetup, overhead_gib: float = 0.0) -> TrainMemory:
    """Peak training memory per GPU for ``layout`` (max over the first and last pipeline stage)."""
    m = setup.num_microbatches(layout)
    dense_shard = layout.dp * layout.cp  # FSDP/ZeRO shards over dp x cp (torchtitan dp_shard * cp)
    expert_shard = max(1, dense_shard // layout.ep)
    terms = activation_terms(model, setup, layout.tp, layout.cp)
    layers = math.ceil(model.num_layers / layout.pp)
    inflight = _inflight_microbatches(setup, layout.pp, m)
    best: TrainMemory | None = None
    for idx, (dense, expert) in enumerate(stage_params(model, layout.pp)):
        is_last = idx == 1
        dense_gpu, expert_gpu = dense / layout.tp, expert / (layout.tp * layout.ep)
        gb = 4 if setup.fp32_grad_accumulation else GRAD_BYTES
        pd, gd, od = zero_state_bytes(dense_gpu, setup.zero, dense_shard, gb)
        pe, ge, oe = zero_state_bytes(expert_gpu, setup.zero, expert_shard, gb)
        stage_inflight = 1.0 if (is_last and layout.pp > 1) else inflight
        # kept bytes of every in-flight block + the block being recomputed (AC) + the backward's working set
        acts = peak_activation_bytes(terms, layers * stage_inflight)
        logits = 0.0
        if is_last:  # bf16 logits + fp32 copy for the loss/grad (anchors-6a §5), vocab-parallel over TP
            logits = setup.seq_len / layout.cp * setup.micro_batch_size * model.vocab_size / layout.tp * (2 + 4)
        transient = buffers = 0.0  # stage-resident (PP) | per-block ZeRO-3 buffers, allocated and freed each block
        layer_gpu = (
            model.layer_params() - model.expert_params_per_layer() + model.expert_params_per_layer() / layout.ep
        ) / layout.tp
        if setup.zero >= 3 and layout.pp > 1:
            # With pipeline parallelism torchtitan keeps the stage unsharded from forward to backward
            # (reshard_after_forward = not pp_enabled, torchtitan/distributed/fsdp.py) and reduce-scatters gradients
            # only after the last micro-batch: the whole stage's bf16 params and its unsharded grads stay resident.
            transient = (dense_gpu + expert_gpu) * (PARAM_BYTES + setup.grad_reduce_bytes)
        elif setup.zero >= 3:
            buffers = zero3_buffers(terms, layer_gpu, setup.grad_reduce_bytes, stage_inflight)
        cal = memory_calibration()
        if cal:
            # each factor on what the H200 sweep measured it on: activations per AC mode; the per-block ZeRO-3 buffers
            # (no PP; the PP stage's unsharded params + grads above were not emulated and are allocated once, like
            # the params); the allocator reserve on the bytes allocated and freed within a step (activations, logits,
            # per-block buffers), never on params, grads, optimizer states or the PP stage's resident copy
            acts *= float(cal["activations"].get(setup.ac_mode, 1.0))
            buffers *= float(cal["zero3_transient"])
            transient += float(cal["reserve_fraction"]) * (acts + logits + buffers)  # allocator reserve
        transient += buffers
        mem = TrainMemory(
            params=pd + pe,
            grads=gd + ge,
            optimizer=od + oe,
            activations=acts,
            logits=logits,
            transient=transient,
            overhead=overhead_gib * GIB,
        )
        if best is None or mem.total > best.total:
            best = mem
    assert best is not None
    return best


@dataclass
class ServeMemory:
    """Serving memory per GPU and what is left for the KV cache."""

    weights_bytes: float
    """Weights held by one GPU."""
    kv_bytes_per_token: float
    """KV-cache bytes one token occupies on one GPU (KV heads replicate when TP > kv_heads)."""
    usable_bytes: float
    """HBM the engine may use (gpu_memory_utilization x HBM)."""
    overhead_bytes: float
    kv_capacity_tokens: float
    """Tokens of KV cache that fit after weights and overhead."""
    context_len: int

    @property
    def max_concurrent_seqs(self) -> int:
        return int(self.kv_capacity_tokens // self.context_len) if self.kv_capacity_tokens > 0 else 0

    @property
    def fits(self) -> bool:
        """Weights fit and at least one full-context sequence fits beside them."""
        return self.max_concurrent_seqs >= 1

    def total_bytes(self, num_seqs: int) -> float:
        return self.weights_bytes + self.overhead_bytes + num_seqs * self.context_len * self.kv_bytes_per_token


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> float:
    """KV heads one TP rank holds: kv_heads / tp, or 1 (replicated) when TP exceeds the KV heads (vLLM)."""
    return max(1.0, model.num_kv_heads / tp)


def serve_memory(
    model: ModelSpec,
    tp: int,
    pp: int,
    context_len: int,
    hbm_gib: float,
    gpu_memory_utilization: float,
    overhead_gib: float,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    ep: int = 1,
    max_num_batched_tokens: int = 0,
) -> ServeMemory:
    """Weights per GPU (TP x PP shards; experts over EP ranks inside the TP group) and KV capacity.

    The overhead is ``overhead_gib`` (CUDA context, graphs, NCCL) plus, when ``max_num_batched_tokens`` > 0, the
    activations of the largest forward the engine runs, min(context_len, max_num_batched_tokens) tokens (vLLM sizes
    the KV cache after a profile run of exactly that forward): per token 2 B x (gate/up 2f/tp + activation f/tp +
    4h residual/norm/attention buffers), so the reserve grows with max_model_len up to the chunk size.
    """
    expert = model.num_expert_params()
    other = model.num_params() - expert
    # EP in serving spreads whole experts over the TP group (vLLM --enable-expert-parallel): experts / max(tp, ep).
    weights = (other / tp + expert / max(tp, ep)) / pp * weight_bytes
    layers = math.ceil(model.num_layers / pp)
    kv_tok = 2 * layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_bytes
    usable = gpu_memory_utilization * hbm_gib * GIB
    overhead = overhead_gib * GIB
    if max_num_batched_tokens > 0:
        chunk = min(context_len, max_num_batched_tokens)
        f = model.expert_size * max(1, model.experts_per_token) if model.is_moe else model.intermediate_size
        overhead += chunk * 2.0 * (3 * f / tp + 4 * model.hidden_size)
    capacity = max(0.0, usable - weights - overhead) / kv_tok
    return ServeMemory(
        weights_bytes=weights,
        kv_bytes_per_token=kv_tok,
        usable_bytes=usable,
        overhead_bytes=overhead,
        kv_capacity_tokens=capacity,
        context_len=context_len,
    )
