"""Rollout engines for GRPO: one interface, two implementations (``hf``: transformers, ``vllm``: TRL's vLLM backend).

The trainer (phase6.posttrain.grpo_trainer) only talks to this interface, so the staleness knob, the weight-sync
accounting and the throughput comparison are the same code whichever engine generates:

    engine.load_weights(named_tensors) -> WeightSyncStats     # push a policy version into the engine
    engine.generate(prompt_ids, SamplingParams) -> RolloutOutput

Each engine owns its own copy of the weights (vLLM's, or a separate HF model), which is what makes a fixed rollout
lag possible: the engine can hold the policy of k steps ago while the trainer updates the current one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings shared by every engine (and by the plain-``generate`` comparison)."""

    max_new_tokens: int
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 = off."""
    min_new_tokens: int = 0
    """Forbid EOS before this many tokens (benchmarks force the full length with min = max)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class RolloutOutput:
    """Completions of one batch: token ids up to and including the first EOS (or cut at max_new_tokens)."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None
    """Per-token log-probabilities of the sampled tokens under the engine's weights and temperature, or None."""
    generate_s: float
    """Wall-clock of the generation call alone (device-synchronized)."""
    logprob_s: float = 0.0
    """Wall-clock of computing ``logprobs`` when the engine does it in a separate pass (HF engine)."""

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.generate_s if self.generate_s > 0 else 0.0


@dataclass(frozen=True)
class WeightSyncStats:
    """One weight push into an engine."""

    mechanism: str
    num_tensors: int
    bytes: int
    seconds: float


class RolloutEngine(Protocol):
    """What the GRPO trainer needs from a rollout engine."""

    name: str
    mechanism: str
    """How ``load_weights`` moves tensors, in words (reported next to the sync bytes and milliseconds)."""

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_generations: int = 1) -> RolloutOutput:
        """``prompt_ids`` holds every sample's prompt (each prompt repeated ``num_generations`` times, consecutively)."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncStats:
        """Copy the given (checkpoint-named) tensors into the engine's weights."""
        ...


def checkpoint_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, detached tensor) for every checkpoint name of ``model``, tied aliases included.

    ``named_parameters()`` yields a tied tensor once (``model.embed_tokens.weight``), but an engine may keep a
    derived copy per *name*: vLLM 0.32 on CPU packs ``lm_head`` for its GEMM kernel and repacks it only when
    ``lm_head.weight`` itself is loaded, so a sync without the alias leaves the output layer stale, silently
    (tests/test_grpo_vllm.py). Aliases share storage: a copy of one is a copy of all (PolicyHistory keeps one).
    """
    for name, p in model.named_parameters(remove_duplicate=False):
        yield name, p.detach()


def cut_at_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    """Keep tokens up to and including the first EOS (TRL's convention: a completion ending in EOS terminated)."""
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1]
    return ids
