"""Where each second of a GRPO step goes: an exclusive-time phase timer, per-step breakdown rows, the stacked figure.

A step is the wall-clock between two consecutive optimizer-step ends (the first starts at train begin), so the steps
add up to the whole training loop. Inside it, named phases are timed with ``with timer.phase(name)``; phases nest
(rollout runs inside the trainer's ``training_step``, which is timed as ``policy_update``) and each second is charged
to the innermost phase only, so no second is counted twice. ``other`` is the step minus every named phase, hence
``sum(phases) == step`` holds by construction, and a negative ``other`` (double counting) is an assertion failure.
Phase boundaries synchronize CUDA (``phase6.timing.sync``: the current device, a no-op without CUDA), otherwise
asynchronous kernels would be charged to whichever phase waits for them; the clock is ``phase6.timing.wall``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phase6 import timing
from phase6.figures import save_figure

# Fixed phase names, in the order of the table and of the stacked bars.
ROLLOUT = "rollout"
WEIGHT_SYNC = "weight_sync"
BEHAVIOUR_LOGPROBS = "behaviour_logprobs"
REWARD = "reward"
REF_LOGPROBS = "ref_logprobs"
POLICY_UPDATE = "policy_update"
THROUGHPUT_PROBE = "throughput_probe"
OTHER = "other"
PHASES = (ROLLOUT, WEIGHT_SYNC, BEHAVIOUR_LOGPROBS, REWARD, REF_LOGPROBS, POLICY_UPDATE, THROUGHPUT_PROBE, OTHER)
PHASE_HELP = {
    ROLLOUT: "engine generation of the step's completions",
    WEIGHT_SYNC: "snapshot of the policy (staleness > 0) + push of the target version into the engine",
    BEHAVIOUR_LOGPROBS: "HF engine, decode=generate: scoring forward for the sampled tokens' log-probs "
    "(0 otherwise: vLLM and the HF decode loop return them with the tokens)",
    REWARD: "reward functions",
    REF_LOGPROBS: "no-grad trainer forwards: reference model (beta > 0) and current-policy log-probs of the sampled "
    "tokens (PPO anchor under staleness, IS weights, rollout/training mismatch)",
    POLICY_UPDATE: "loss forward + backward of every micro-batch + optimizer step",
    THROUGHPUT_PROBE: "probe steps only: the same prompts through plain HF generate, for the tokens/s comparison",
    OTHER: "the rest: tokenization, padding, advantages, grad clipping, logging, data loading",
}


@dataclass
class _Open:
    name: str
    start: float
    children: float = 0.0


@dataclass
class PhaseTimer:
    """Exclusive-time accounting of named phases inside step windows."""

    sync: Callable[[], None] = timing.sync
    clock: Callable[[], float] = timing.wall
    _stack: list[_Open] = field(default_factory=list)
    _totals: dict[str, float] = field(default_factory=dict)
    _window_start: float | None = None
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    """Every closed phase as (name, start, end) on ``clock`` (for the GPU-utilization timeline)."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        assert name in PHASES, name
        self.sync()
        self._stack.append(_Open(name, self.clock()))
        try:
            yield
        finally:
            self.sync()
            end = self.clock()
            opened = self._stack.pop()
            assert opened.name == name, (opened.name, name)
            duration = end - opened.start
            self._totals[name] = self._totals.get(name, 0.0) + duration - opened.children
            if self._stack:
                self._stack[-1].children += duration
            self.intervals.append((name, opened.start, end))

    def reassign(self, src: str, dst: str, seconds: float) -> None:
        """Move ``seconds`` measured inside phase ``src`` to ``dst`` (a sub-interval the callee timed itself)."""
        assert dst in PHASES and 0 <= seconds <= self._totals.get(src, 0.0) + 1e-9, (src, dst, seconds)
        self._totals[src] = self._totals.get(src, 0.0) - seconds
        self._totals[dst] = self._totals.get(dst, 0.0) + seconds

    def start_window(self) -> None:
        self.sync()
        self._window_start = self.clock()
        self._totals = {}

    def end_window(self) -> dict[str, float]:
        """Close the step: seconds per phase (all of PHASES), ``other`` = remainder, plus ``step``; starts the next."""
        assert self._window_start is not None, "start_window() first"
        assert not self._stack, f"phases still open at step end: {[o.name for o in self._stack]}"
        self.sync()
        now = self.clock()
        step = now - self._window_start
        row = {p: self._totals.get(p, 0.0) for p in PHASES}
        named = sum(v for k, v in row.items() if k != OTHER)
        row[OTHER] = step - named  # explicit `other` phases + everything no phase claimed
        assert row[OTHER] >= -1e-6, f"phases add up to more than the step ({named:.6f} > {step:.6f} s)"
        row["step"] = step
        self._window_start = now
        self._totals = {}
        return row


def summarize(rows: list[dict[str, float]], skip_first: int = 1) -> list[dict[str, Any]]:
    """Table rows ``phase | mean s/step | share of step %`` over the steps after ``skip_first`` (compile/warm-up)."""
    use = rows[skip_first:] if len(rows) > skip_first else rows
    if not use:
        return []
    total = sum(r["step"] for r in use)
    out = []
    for p in PHASES:
        seconds = sum(r[p] for r in use)
        out.append(
            {
                "phase": p,
                "mean_s_per_step": seconds / len(use),
                "share_pct": 100 * seconds / total if total else 0.0,
                "what": PHASE_HELP[p],
            }
        )
    out.append(
        {
            "phase": "step",
            "mean_s_per_step": total / len(use),
            "share_pct": 100.0,
            "what": f"mean over steps {skip_first + 1}..{skip_first + len(use)}",
        }
    )
    return out


@dataclass(frozen=True)
class Ceilings:
    """The two rates a phase is held against, measured on the device (phase6's GRPO bench: an 8192^3 bf16 matmul,
    and a large device-to-device copy counting bytes read + written)."""

    matmul_flops_per_s: float
    copy_bytes_per_s: float


@dataclass(frozen=True)
class ModelShape:
    """What the bounds need of the model: parameters (tied embedding counted once, as the LM head), the LM head's
    share, layers, query width and KV bytes per token."""

    params: int
    lm_head_params: int
    layers: int
    q_width: int
    kv_bytes_per_token: int
    param_bytes: int

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        params = sum(p.numel() for p in model.parameters())
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        elem = next(model.parameters()).element_size()
        return cls(
            params=params,
            lm_head_params=model.get_output_embeddings().weight.numel(),
            layers=c.num_hidden_layers,
            q_width=c.num_attention_heads * head_dim,
            kv_bytes_per_token=2 * c.num_hidden_layers * kv_heads * head_dim * elem,
            param_bytes=params * elem,
        )


def phase_bounds(
    tokens: dict[str, Any],
    model: ModelShape,
    ceilings: Ceilings,
    *,
    ref_forward: bool,
    sync_bytes: float = 0.0,
    micro_steps: int = 1,
) -> dict[str, dict[str, Any]]:
    """The least time each phase can take on this device: max(matmul FLOPs / matmul rate, HBM bytes / copy rate).

    FLOPs count the work the phase cannot avoid, not what a configuration chooses to redo: the backbone
    (params - lm_head) on every real token, the LM head on completion tokens only, causal attention (QK^T and PV:
    4 x layers x q_width per attended pair); padding, recomputation (gradient checkpointing) and a second no-grad
    forward are overheads the % of bound shows.
    - rollout: prefill of each distinct prompt once (prompt tokens / group) + one decode position per completion
      token; bytes: the weights once per decode step (max completion length steps) + the KV cache each generated
      token attends to;
    - ref_logprobs: one forward over the real tokens when the KL term needs the reference (beta > 0), else no bound;
    - policy_update: forward + backward = 3x the forward's FLOPs; bytes: weights read by each micro-step's forward
      and backward (3x) and AdamW's read of params, grads and two moments and write of params and moments (7x);
    - weight_sync: bytes read + written once;
    - reward, other, behaviour_logprobs, throughput_probe: no bound (host work, or not part of the minimal step).
    Returns {phase: {flops, bytes, bound_s, binds}} for the bounded phases, plus "step" (their sum)."""
    body = model.params - model.lm_head_params
    prompt, completion = tokens["prompt_tokens"], tokens["completion_tokens"]
    real = prompt + completion
    attention_fwd = 4.0 * model.layers * model.q_width * tokens["attention_pairs"]
    forward = 2.0 * body * real + 2.0 * model.lm_head_params * completion + attention_fwd
    unique_prompt = prompt / max(tokens.get("group", 1), 1)
    rollout_flops = (
        2.0 * body * (unique_prompt + completion)
        + 2.0 * model.lm_head_params * completion
        + 4.0 * model.layers * model.q_width * tokens["decode_context"]
    )
    rollout_bytes = tokens["max_completion"] * model.param_bytes + model.kv_bytes_per_token * tokens["decode_context"]
    work = {
        ROLLOUT: (rollout_flops, rollout_bytes),
        POLICY_UPDATE: (3.0 * forward, (3 * micro_steps + 7) * model.param_bytes),
    }
    if ref_forward:
        work[REF_LOGPROBS] = (forward, model.param_bytes)
    if sync_bytes:
        work[WEIGHT_SYNC] = (0.0, 2.0 * sync_bytes)
    out: dict[str, dict[str, Any]] = {}
    for phase, (flops, nbytes) in work.items():
        t_flops = flops / ceilings.matmul_flops_per_s
        t_bytes = nbytes / ceilings.copy_bytes_per_s
        out[phase] = {
            "flops": flops,
            "bytes": nbytes,
            "bound_s": max(t_flops, t_bytes),
            "binds": "flops" if t_flops >= t_bytes else "bytes",
        }
    out["step"] = {
        "flops": sum(v["flops"] for v in out.values()),
        "bytes": sum(v["bytes"] for v in out.values()),
        "bound_s": sum(v["bound_s"] for v in out.values()),
        "binds": "sum of phases",
    }
    return out


def add_bound_columns(table: list[dict[str, Any]], bounds: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds ``bound_s``, ``pct_of_bound`` (bound / measured x 100) and ``binds`` to summarize()'s rows."""
    for row in table:
        b = bounds.get(row["phase"])
        measured = row.get("mean_s_per_step")
        if b is None or not measured:
            row |= {"bound_s": None, "pct_of_bound": None, "binds": None}
            continue
        row |= {"bound_s": b["bound_s"], "pct_of_bound": 100.0 * b["bound_s"] / measured, "binds": b["binds"]}
    return table


def plot_breakdown(rows: list[dict[str, float]], path: Path) -> Path:
    """Stacked bars: seconds per phase for every step (the bar heights are the step times)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(rows) + 3), 4))
    steps = list(range(1, len(rows) + 1))
    bottom = [0.0] * len(rows)
    for p in PHASES:
        values = [r[p] for r in rows]
        if any(v > 0 for v in values):
            ax.bar(steps, values, bottom=bottom, label=p, width=0.85)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("seconds")
    ax.set_title("GRPO step-time breakdown")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)
