"""The vLLM rollout engine: TRL's ``VLLMGeneration`` (colocate or server mode) behind our engine interface.

TRL already owns the hard parts (an in-process ``LLM`` with ``external_launcher`` in colocate mode; the HTTP + NCCL
client of ``trl vllm-serve`` in server mode), so this class only adapts it. What we change is *which* weights are
pushed: TRL's ``sync_weights()`` always pushes the live policy, while ``load_weights`` here takes any named tensors,
e.g. the snapshot of k steps ago for the staleness experiment.

- colocate: one ``model.load_weights(list)`` call on the driver worker's model (TRL loops one tensor per call); the
  prefix cache is reset afterwards because cached KV blocks were computed with the old weights.
- server: ``VLLMClient.update_named_params`` (names/dtypes/shapes over HTTP, tensors through vLLM's NCCL weight
  transfer); tensors must be on the trainer's GPU for the broadcast.

vLLM returns the sampled tokens' log-probs (``logprobs=0``, ``logprobs_mode="processed_logprobs"`` as TRL sets it),
so no scoring pass is needed. Not runnable on CPU machines; pick ``rollout.engine=hf`` there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from phase6.rollout import RolloutOutput, SamplingParams, WeightSyncStats
from phase6.rollout.hf import device_sync

MECHANISMS = {
    "colocate": "in-process vLLM model.load_weights (one batched call, device-to-device)",
    "server": "trl vllm-serve: HTTP metadata + NCCL broadcast (vLLM NCCLWeightTransferEngine, packed)",
}


class VLLMEngine:
    """Adapter over ``trl.generation.vllm_generation.VLLMGeneration``; build it with ``build_vllm_engine``."""

    name = "vllm"

    def __init__(self, generation: Any) -> None:
        self.gen = generation
        self.mode: str = generation.mode
        self.mechanism = MECHANISMS[self.mode]
        self.device: torch.device = generation.accelerator.device

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_generations: int = 1) -> RolloutOutput:
        # VLLMGeneration reads its sampling settings from attributes (it was built for a fixed GRPOConfig)
        self.gen.temperature = params.temperature
        self.gen.top_p, self.gen.top_k = params.top_p, params.top_k
        self.gen.max_completion_length = params.max_new_tokens
        self.gen.generation_kwargs = {"min_tokens": params.min_new_tokens} if params.min_new_tokens else {}
        device_sync(self.device)
        t0 = time.perf_counter()
        _, completion_ids, logprobs, _ = self.gen.generate(
            prompts=prompt_ids, images=None, num_generations=num_generations
        )
        device_sync(self.device)
        seconds = time.perf_counter() - t0
        # top-1 entry = the sampled token (logprobs=0); vLLM writes None for a NaN log-prob
        flat = None
        if logprobs is not None:
            flat = [[float("nan") if lp[0] is None else lp[0] for lp in seq] for seq in logprobs]
        return RolloutOutput([list(c) for c in completion_ids], flat, seconds)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncStats:
        tensors = list(named_tensors)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        device_sync(self.device)
        t0 = time.perf_counter()
        if self.mode == "colocate":
            model = self.gen.llm.llm_engine.model_executor.driver_worker.model_runner.model
            model.load_weights(tensors)
            self.gen.llm.reset_prefix_cache()
        else:
            if self.gen.accelerator.is_main_process:
                on_device = [(n, t.to(self.device, non_blocking=True)) for n, t in tensors]
                metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in on_device]
                self.gen.vllm_client.update_named_params(metadata, iter(on_device))
                self.gen.vllm_client.reset_prefix_cache()
        device_sync(self.device)
        return WeightSyncStats(self.mechanism, len(tensors), nbytes, time.perf_counter() - t0)


def build_vllm_engine(trainer: Any, mode: str, options: dict[str, Any]) -> VLLMEngine:
    """Create TRL's VLLMGeneration for ``trainer.model`` (its args give server/colocate settings) and wrap it.

    ``options`` are passed through to VLLMGeneration (e.g. ``gpu_memory_utilization``, ``server_base_url``,
    ``tensor_parallel_size``, ``max_model_length``, ``enable_sleep_mode``).
    """
    from trl.generation.vllm_generation import VLLMGeneration

    generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=trainer.processing_class,
        mode=mode,
        max_completion_length=trainer.args.max_completion_length,
        temperature=trainer.args.temperature,
        logprobs=0,
        **options,
    )
    return VLLMEngine(generation)
