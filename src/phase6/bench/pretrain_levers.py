"""The performance levers of `phase6 bench pretrain`: each lever's config overrides (the trainer honours the same
fields) and prediction, a row's Setup built from them, and how the winners combine. The reasoning behind each
prediction is in phase6/bench/pretrain.py's docstring."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from phase6.config.pretrain import ModelConfig, ParallelConfig, check_perf_combination


@dataclass(frozen=True)
class Lever:
    """One performance knob: the config overrides it makes (the trainer reads the same fields) and its prediction."""

    overrides: dict[str, Any]
    """'model.<field>' / 'parallel.<field>' / 'train.tf32' -> value; 'parallel.inductor' dicts merge."""
    predicted: str
    """Predicted tokens/s change vs the baseline (the docstring gives the reasoning)."""
    needs_cuda: bool = False
    needs_compile: bool = False
    compile_cost: float = 0.7
    """Expected compile time of the row / the baseline's compile time (budget planning only)."""
    isolate: bool = False
    """Run in a child process killed at the time left (compile time open-ended)."""


LEVERS: dict[str, Lever] = {
    "cudnn": Lever({"parallel.sdpa_backend": "cudnn"}, "+3..4%", needs_cuda=True),
    "liger": Lever({"model.fused_ce": "liger"}, "-6..0%", needs_cuda=True),
    "fullgraph": Lever({"parallel.fullgraph": True}, "0%", needs_compile=True, compile_cost=0.3),
    "autotune": Lever(
        {"parallel.compile_mode": "max-autotune-no-cudagraphs"},
        "+3..8%",
        needs_compile=True,
        compile_cost=4.0,
        isolate=True,
    ),
    "coord": Lever(
        {"parallel.inductor": {"coordinate_descent_tuning": True}}, "+1..3%", needs_compile=True, compile_cost=2.0
    ),
    "chunker": Lever({"parallel.inductor": {"auto_chunker.enable": True}}, "-3..+2%", needs_compile=True),
    "fp8": Lever({"model.float8": "tensorwise"}, "+5..12%", compile_cost=1.3),
    "fp8_rowwise": Lever({"model.float8": "rowwise"}, "+0..6%", compile_cost=1.3),
    "fp8_head": Lever({"model.float8": "tensorwise", "model.float8_lm_head": True}, "+8..16%", compile_cost=1.3),
    "bf16_resid": Lever({"model.residual_dtype": "bf16"}, "+2..4%", needs_cuda=True),
    "ce_sliced": Lever({"model.ce_vocab": "sliced"}, "-6..-7% (the default before 2026-11-30)", needs_cuda=True),
    "fa4": Lever({"parallel.sdpa_backend": "fa4"}, "+2..4%", needs_cuda=True, compile_cost=1.5, isolate=True),
    "two_pass": Lever({"parallel.inductor": {"online_softmax": False}}, "+1.5..2.5%", needs_compile=True),
    "autotune_sub": Lever(
        {"parallel.compile_mode": "max-autotune-no-cudagraphs", "parallel.inductor": {"autotune_in_subproc": True}},
        "+0..5%",
        needs_compile=True,
        compile_cost=4.0,
        isolate=True,
    ),
    "tf32": Lever({"train.tf32": True}, "0%", compile_cost=0.5),
    "flash": Lever({"parallel.sdpa_backend": "flash"}, "0%", compile_cost=0.3),
    "efficient": Lever({"parallel.sdpa_backend": "efficient"}, "-10..-5%", needs_cuda=True),
}
DEFAULT_LEVERS = "cudnn,liger,fullgraph,autotune,coord"
# predictions of the other rows for the default run (GPT-2 124M on one H200; the docstring gives the reasoning)
ROW_PREDICTIONS = (
    ("ours baseline", "539-547k (measured 2026-11-30, ce_vocab=padded)"),
    ("HF ", "~417k (issue 3)"),
    ("ours combined DDP", "97..99% scaling"),
    ("ours combined FSDP2", "93..97% scaling"),
    ("ours combined,", "combined +0..1%"),
    ("ours combined", "+8..12%"),
)


@dataclass
class Setup:
    """The configuration a row runs: the trainer's model and parallel groups after the levers' overrides."""

    levers: tuple[str, ...]
    model: ModelConfig
    parallel: ParallelConfig
    tf32: bool = False

    def overrides(self) -> str:
        """The same configuration as `phase6 pretrain` command-line overrides."""
        items: list[str] = []
        for name in self.levers:
            for key, value in LEVERS[name].overrides.items():
                if isinstance(value, dict):
                    items += [f"+{key}.{k}={json.dumps(v)}" for k, v in value.items()]
                else:
                    items.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
        return " ".join(items) or "(none: the defaults)"


def build_setup(model: ModelConfig, parallel: ParallelConfig, levers: list[str] | tuple[str, ...]) -> Setup:
    """Apply the levers' overrides in order (dataclasses.replace re-runs each group's validation)."""
    setup = Setup((), model, parallel)
    for name in levers:
        if name not in LEVERS:
            raise ValueError(f"--levers: unknown lever {name!r}; known: {', '.join(LEVERS)}")
        for key, value in LEVERS[name].overrides.items():
            group, attr = key.split(".", 1)
            if group == "train":
                setup.tf32 = bool(value)
                continue
            target = getattr(setup, group)
            if isinstance(value, dict):
                value = {**getattr(target, attr), **value}
            setattr(setup, group, dataclasses.replace(target, **{attr: value}))
        setup.levers = (*setup.levers, name)
    check_perf_combination(setup.model, setup.parallel)
    return setup


def combine(ranked: list[str], model: ModelConfig, parallel: ParallelConfig) -> tuple[Setup, list[str]]:
    """Add levers best-first. A lever that sets a key an earlier one already set (two SDPA backends), or that the
    config rejects next to the earlier ones (fullgraph with liger), is dropped. Returns (setup, notes)."""
    kept: list[str] = []
    notes: list[str] = []
    for name in ranked:
        clash = [
            k
            for k in LEVERS[name].overrides
            if any(k in LEVERS[o].overrides for o in kept) and k != "parallel.inductor"
        ]
        if clash:
            notes.append(f"{name} dropped: {clash[0]} already set by a faster lever")
            continue
        try:
            build_setup(model, parallel, [*kept, name])
        except ValueError as e:
            notes.append(f"{name} dropped: {e}")
            continue
        kept.append(name)
    return build_setup(model, parallel, kept), notes


def pick_winners(rows: dict[str, dict[str, Any]], baseline_tps: float, min_gain_pct: float) -> list[str]:
    """Lever names whose row beat the baseline by >= min_gain_pct, fastest first."""
    gains = {n: 100 * (r["tokens/s"] / baseline_tps - 1) for n, r in rows.items() if r.get("tokens/s")}
    return sorted((n for n, g in gains.items() if g >= min_gain_pct), key=lambda n: -gains[n])
