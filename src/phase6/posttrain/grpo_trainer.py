"""TRL's GRPOTrainer with a pluggable rollout engine, a fixed rollout lag, and per-phase timing.

Why a subclass and not a loop of our own: TRL 1.16's GRPOTrainer takes a ``rollout_func(prompts, trainer)`` that
replaces its generation step and returns ``prompt_ids``, ``completion_ids``, ``logprobs`` (+ extra columns for the
reward functions). Everything after generation (rewards, group-normalized advantages, KL to the reference, the
clipped loss of every ``loss_type``, metrics) stays TRL's. What the analysis needs on top:

- ``rollout_func`` = our engine (``phase6.rollout``: HF or vLLM) fed the policy version ``step - k`` (weight sync and
  snapshots through ``PolicyHistory``), with the version of every batch logged;
- the PPO anchor is set explicitly (behaviour log-probs, or the current policy + truncated IS weights folded into a
  (B, T) advantage; see grpo_staleness) because TRL applies its own IS correction only when ``use_vllm=True``, and
  ``use_vllm=True`` would make TRL push the live weights itself before every rollout, which defeats a fixed lag;
- every phase of a step is timed (grpo_timing) by wrapping the methods TRL calls: ``training_step`` (policy update),
  ``_prepare_inputs``, ``_calculate_rewards``, ``_get_per_token_logps_and_entropies`` without grad (ref log-probs),
  plus optimizer-step callbacks; these are private TRL methods, so the TRL version matters: tested with TRL 1.16, and
  tests/test_grpo_train.py runs the whole loop on CPU.
- on probe steps the same prompts go through the policy's plain ``generate`` (what ``use_vllm=False`` does), so the
  engine's tokens/s and the baseline's come from the same run, prompts and sampling settings.

Step-time levers (issue 31; each measured in docs/benchmarks.md, "6D at the roofline"):

- ``mismatch_every``: the current-policy no-grad forward runs only when the step needs it (staleness > 0, IS
  correction, behaviour log-probs the engine could not give) or on mismatch-sampling steps (``step % N == 0``); at
  lag 0 without IS the PPO anchor is the behaviour log-probs either way, so skipping it changes no number the loss
  uses, only how often ``rollout/logp_mismatch_*`` is measured;
- ``length_buckets``: the generation batch is sorted by length before it is split into micro-batches (instead of
  TRL's random shuffle; only for loss types whose value does not depend on which rows share a micro-batch), and
  every log-prob forward drops the columns that are padding in all of its rows;
- ``liger``: Liger-Kernel's fused RMSNorm and SwiGLU on the policy and reference instances, and (``liger_engine``,
  default on) on the HF rollout engine's own model, whose decode-loop CUDA graphs then replay Liger's kernels (the
  module's classes are left as they were).
- ``shared_prompt`` (opt-in): every log-prob pass runs each distinct prompt through the backbone once and shares
  its KV cache with the rows of its group (same log-probs and gradient; the prompt tokens' FLOPs / group size).
  Measured slower on one H200 (25.24 vs 18.72 s per step, 2026-12-02): not recommended until profiled.

``TimedGRPOTrainer`` is the timing alone on TRL's stock trainer (its own HF ``generate`` rollout): the anchor the
benchmark measures beside ours, same phases, same token counts.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from phase6.posttrain.grpo_monitor import RewardMonitor
from phase6.posttrain.grpo_staleness import IS_CORRECTIONS, PolicyHistory, truncated_is_weights
from phase6.posttrain.grpo_timing import (
    BEHAVIOUR_LOGPROBS,
    OTHER,
    PHASES,
    POLICY_UPDATE,
    REF_LOGPROBS,
    REWARD,
    ROLLOUT,
    THROUGHPUT_PROBE,
    WEIGHT_SYNC,
    PhaseTimer,
)
from phase6.rollout import RolloutEngine, SamplingParams, checkpoint_tensors
from phase6.rollout.hf import naive_generate
from phase6.tasks.gsm8k import completion_text


class _StepWindows(TrainerCallback):
    """Opens/closes the timer's step windows and times the optimizer step as part of the policy update."""

    def __init__(self, trainer: TimedGRPOTrainer) -> None:
        self.trainer = trainer
        self._optimizer_phase: AbstractContextManager[None] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.timer.start_window()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._optimizer_phase = self.trainer.timer.phase(POLICY_UPDATE)
        self._optimizer_phase.__enter__()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self._optimizer_phase is not None
        self._optimizer_phase.__exit__(None, None, None)
        self._optimizer_phase = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        row = self.trainer.timer.end_window()
        self.trainer.step_rows.append(row)
        metrics = self.trainer._metrics["train"]
        for phase in (*PHASES, "step"):
            metrics[f"time/{phase}_s"].append(row[phase])


# TRL 1.16 loss types whose value does not depend on which rows share a micro-batch (per-row means, or sums over a
# normalizer fixed for the whole generation batch); bnpo divides by the micro-batch's own token count.
COMPOSITION_FREE_LOSSES = ("grpo", "sapo", "dr_grpo", "cispo", "dapo", "vespo", "luspo")
# _get_per_token_logps_and_entropies keyword arguments that carry per-row multimodal data (bucketing passes them
# through untouched, so it is skipped when any is set)
_MULTIMODAL_KWARGS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class TimedGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer, unchanged, with every phase of a step timed and the step's token counts recorded.

    Used as is, it is TRL's stock trainer (its own HF ``generate`` rollout, timed as ``rollout``); the benchmark's
    anchor. ``token_log`` holds per step: rows, real prompt and completion tokens, the padded tokens the log-prob
    passes saw, and the sums the roofline bounds need (``phase6.posttrain.grpo_timing.phase_bounds``)."""

    def __init__(self, *args: Any, timer: PhaseTimer | None = None, **kwargs: Any) -> None:
        self.timer = timer or PhaseTimer()
        super().__init__(*args, **kwargs)
        self.step_rows: list[dict[str, float]] = []
        self.token_log: list[dict[str, Any]] = []
        self.add_callback(_StepWindows(self))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.token_log.append(token_counts(out, self.state.global_step, self.num_generations))
        return out

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        with self.timer.phase(POLICY_UPDATE):
            return super().training_step(model, inputs, num_items_in_batch)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        with self.timer.phase(OTHER):
            return super()._prepare_inputs(generation_batch)

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's own generation (stock trainer; not called when a ``rollout_func`` generates)."""
        with self.timer.phase(ROLLOUT):
            return super()._generate_single_turn(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return self._per_token_logps(*args, **kwargs)
        with self.timer.phase(REF_LOGPROBS):
            return self._per_token_logps(*args, **kwargs)

    def _per_token_logps(self, *args: Any, **kwargs: Any) -> Any:
        return GRPOTrainer._get_per_token_logps_and_entropies(self, *args, **kwargs)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        with self.timer.phase(REWARD):
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)


def token_counts(batch: dict[str, Any], step: int, group: int) -> dict[str, Any]:
    """Real and padded token counts of a scored generation batch (left-padded prompts, right-padded completions)."""
    prompt = batch["prompt_mask"].sum(1).double()
    completion = batch["completion_mask"].sum(1).double()
    rows = int(prompt.numel())
    total = prompt + completion
    return {
        "step": step,
        "rows": rows,
        "group": group,
        "prompt_tokens": int(prompt.sum()),
        "completion_tokens": int(completion.sum()),
        "padded_tokens": rows * (batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)),
        "max_completion": int(completion.max()) if rows else 0,
        # sum over rows of len^2 / 2: causal attention pairs of one full forward
        "attention_pairs": float((total * (total + 1) / 2).sum()),
        # sum over generated tokens of the positions they attend to while decoding
        "decode_context": float((prompt * completion + completion * (completion + 1) / 2).sum()),
    }


def bucket_order(
    prompt_lens: torch.Tensor, completion_lens: torch.Tensor, groups: torch.Tensor | None = None
) -> torch.Tensor:
    """Row order for length buckets: by completion length, then prompt length, then row (stable, deterministic).

    With ``groups`` (a group id per row: rows sharing one prompt), the rows of a group stay together, ordered by the
    group's longest completion, so micro-batches hold whole groups (the shared-prompt pass computes each once)."""
    if prompt_lens.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    prompt_lens, completion_lens = prompt_lens.long(), completion_lens.long()
    if groups is None:
        return torch.sort(completion_lens * (int(prompt_lens.max()) + 1) + prompt_lens, stable=True).indices
    groups = groups.long()
    n = int(groups.max()) + 1
    longest = torch.zeros(n, dtype=torch.long, device=groups.device).scatter_reduce(
        0, groups, completion_lens, "amax", include_self=False
    )
    key = (longest[groups] * (int(prompt_lens.max()) + 1) + prompt_lens) * n + groups
    return torch.sort(key, stable=True).indices


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A group id per row: rows with the same (left-padded) prompt tokens and mask share one."""
    return torch.unique(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1), dim=0, return_inverse=True)[1]


def trim_padding(attention_mask: torch.Tensor, logits_to_keep: int) -> tuple[int, int]:
    """Columns (lead, trail) that are padding in every row: left of the prompts, right of the completions.

    The last prompt column and the first completion column are always kept, so the log-prob of every kept
    completion position still has its predecessor."""
    width = attention_mask.size(1)
    prompt_width = width - logits_to_keep
    used = attention_mask.bool().any(0)
    idx = torch.nonzero(used).flatten()
    if idx.numel() == 0:
        return 0, 0
    lead = min(int(idx[0]), max(prompt_width - 1, 0))
    trail = min(width - 1 - int(idx[-1]), logits_to_keep - 1)
    return lead, max(trail, 0)


def right_align(
    ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompt + right-padded completion rows, shifted left so every row starts at column 0.

    Returns (ids, mask, labels, cols): the shifted rows (padding only on the right), TRL's fused-LM-head labels
    (the completion tokens; -100 on prompt and padding), and (B, logits_to_keep) the column of each completion
    position in the shifted layout. Under causal attention a right-padded row needs no mask (no real token sees a
    later column), so the forward runs with ``attention_mask=None``: SDPA's causal flash kernel with native GQA
    instead of the masked kernel with K/V repeated to every query head. Positions become 0-based per row, as in
    the rollout engine (generate's position ids); RoPE depends on position differences only, so in float32 the
    log-probs equal the left-padded pass up to rounding (tests/test_grpo_levers.py: 1e-5)."""
    width = ids.size(1)
    prompt_width = width - logits_to_keep
    shift = prompt_width - mask[:, :prompt_width].sum(1)  # (B,) leading padding columns
    src = torch.arange(width, device=ids.device) + shift[:, None]
    inside = src < width
    src = src.clamp(max=width - 1)
    ids_r = ids.gather(1, src).masked_fill(~inside, pad_id)
    mask_r = mask.gather(1, src) * inside
    cols = (prompt_width - shift)[:, None] + torch.arange(logits_to_keep, device=ids.device)
    labels = ids_r.masked_fill(mask_r == 0, -100)
    labels = labels.masked_fill(torch.arange(width, device=ids.device) < (prompt_width - shift)[:, None], -100)
    return ids_r, mask_r, labels, cols


def _select_cache_rows(cache: Any, index: torch.Tensor) -> None:
    """Row ``index[i]`` of every layer's K/V becomes row i (differentiable indexing; transformers 5.x caches)."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return
    for layer in cache.layers:  # pragma: no cover - caches without the method
        layer.keys, layer.values = layer.keys[index], layer.values[index]


def _take_rows(value: Any, order: torch.Tensor) -> Any:
    """Reorder the rows of one generation-batch entry (tensors and per-row lists; anything else is batch-wide)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == order.numel():
        return value[order.to(value.device)]
    if isinstance(value, list) and len(value) == order.numel():
        return [value[i] for i in order.tolist()]
    return value


def _pad_right(x: torch.Tensor | None, width: int) -> torch.Tensor | None:
    if x is None or x.size(1) == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.size(1)))


def apply_liger_layers(model: torch.nn.Module) -> list[str]:
    """Liger-Kernel's fused RMSNorm and SwiGLU on this instance only; returns what was patched.

    ``liger_kernel``'s instance patch also rebinds module-level names (the model's RMSNorm / MLP classes, its
    ``apply_rotary_pos_emb``), which would change every model built afterwards, the rollout engine's included:
    the modeling module's globals are restored after the call. RoPE stays transformers' (its Liger version is a
    module-level function, not per instance)."""
    try:
        from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance
    except ImportError as e:
        raise ValueError(f"grpo.liger: needs the liger-kernel package (pip install liger-kernel): {e}") from e
    module = sys.modules[type(model).__module__]
    saved = dict(vars(module))
    before = {n: m.forward for n, m in model.named_modules() if "forward" in vars(m)}
    try:
        _apply_liger_kernel_to_instance(
            model=model, rope=False, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False
        )
    finally:
        for name in [n for n in vars(module) if n not in saved]:
            delattr(module, name)
        for name, value in saved.items():
            if vars(module).get(name) is not value:
                setattr(module, name, value)
    return [n for n, m in model.named_modules() if "forward" in vars(m) and before.get(n) is not m.forward]


class EngineGRPOTrainer(TimedGRPOTrainer):
    """GRPOTrainer whose rollouts come from ``engine`` holding the policy of ``staleness`` steps ago."""

    def __init__(
        self,
        *args: Any,
        engine_builder: Callable[[GRPOTrainer], RolloutEngine],
        staleness: int = 0,
        is_correction: str = "none",
        is_clip: float = 2.0,
        snapshot_device: str = "cpu",
        probe_every: int = 0,
        monitor: RewardMonitor | None = None,
        timer: PhaseTimer | None = None,
        mismatch_every: int = 10,
        length_buckets: bool = True,
        liger: bool = False,
        liger_engine: bool = True,
        shared_prompt: bool = False,
        right_align: bool = True,
        **kwargs: Any,
    ) -> None:
        if is_correction not in IS_CORRECTIONS:
            raise ValueError(f"grpo.is_correction must be one of {list(IS_CORRECTIONS)}, got {is_correction!r}")
        if mismatch_every < 0:
            raise ValueError(f"grpo.mismatch_every must be >= 0, got {mismatch_every}")
        if kwargs.get("args") is not None and kwargs["args"].use_vllm:
            raise ValueError("use_vllm must be False: vLLM is driven through our engine (engine=vllm)")
        super().__init__(*args, rollout_func=self._rollout, timer=timer, **kwargs)
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            raise ValueError(
                "the engine weight sync reads whole parameters: run on one GPU or with DDP (torchrun); "
                "FSDP / DeepSpeed ZeRO-3 sharded weights are not supported"
            )
        if self.args.steps_per_generation != self.args.gradient_accumulation_steps or self.num_iterations != 1:
            raise ValueError(
                "one rollout per optimizer step is required for policy versions to equal optimizer steps "
                "(steps_per_generation = gradient_accumulation_steps, num_iterations = 1)"
            )
        self.mismatch_every = mismatch_every
        self.length_buckets = length_buckets
        # sorting rows into micro-batches must not change the loss: composition-free loss types only, and no
        # per-micro-batch statistics (entropy quantile mask, entropy bonus)
        self.sort_micro_batches = (
            length_buckets
            and self.loss_type in COMPOSITION_FREE_LOSSES
            and self.top_entropy_quantile >= 1.0
            and not getattr(self, "_entropy_bonus_enabled", False)
        )
        # one forward per distinct prompt in every log-prob pass (needs length_buckets for whole-group micro-batches;
        # one process; off under gradient checkpointing, whose recompute would append to the shared cache twice)
        self.shared_prompt = shared_prompt and length_buckets and self.accelerator.num_processes == 1
        # causal attention without a padding mask: rows shifted to right padding (with length buckets; the shared
        # prompt pass keeps its own layout)
        self.right_align = right_align and length_buckets
        self.right_aligned_chunks = 0
        self.liger_patched: dict[str, list[str]] = {}
        if liger:
            self.liger_patched["policy"] = apply_liger_layers(self._policy())
            if self.ref_model is not None:
                self.liger_patched["ref"] = apply_liger_layers(self.accelerator.unwrap_model(self.ref_model))
        self.engine = engine_builder(self)
        # the same kernels in the HF engine's own model (its prefill and the decode loop's CUDA graphs: ~430 fewer
        # small kernels per token step); a vLLM engine has its own fused kernels
        if liger and liger_engine and isinstance(getattr(self.engine, "model", None), torch.nn.Module):
            self.liger_patched["engine"] = apply_liger_layers(self.engine.model)
        self.staleness = staleness
        self.is_correction = is_correction
        self.is_clip = is_clip
        self.probe_every = probe_every
        self.monitor = monitor
        # snapshots keep the policy's dtype (bf16 on GPU runs): the engine casts on load if its dtype differs
        self.history = PolicyHistory(staleness, snapshot_device)
        self.engine_version = 0  # the engine was built from the same checkpoint as the policy
        self.sampling = SamplingParams(
            max_new_tokens=self.args.max_completion_length,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k or 0,
        )
        self.eos_ids = set(self.eos_token_ids)
        self.version_log: list[dict[str, int]] = []
        self.sync_log: list[dict[str, Any]] = []
        self.throughput_log: list[dict[str, Any]] = []
        self.mismatch_log: list[dict[str, Any]] = []
        self.generated_tokens = 0

    # ---- weights -------------------------------------------------------------------------------------------------
    def _policy(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def _named_policy_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every checkpoint name, tied aliases included (``lm_head.weight`` of a tied-embedding model): an engine
        may keep a derived copy of an alias (vLLM's CPU-packed ``lm_head``) that is refreshed only when that name
        is loaded, so deduplicated ``named_parameters()`` would leave it stale."""
        return checkpoint_tensors(self._policy())

    def _sync_engine(self, step: int) -> int:
        """Make the engine hold version ``step - k``; returns that version."""
        snapshot_bytes = self.history.record(step, self._named_policy_params())
        target = self.history.target(step)
        metrics = self._metrics["train"]
        pushed_bytes, pushed_ms = 0, 0.0
        if target != self.engine_version:
            source = self._named_policy_params() if target == step else self.history.weights(target)
            stats = self.engine.load_weights(source)
            self.engine_version = target
            self.sync_log.append(
                {
                    "step": step,
                    "version": target,
                    "num_tensors": stats.num_tensors,
                    "bytes": stats.bytes,
                    "ms": 1e3 * stats.seconds,
                    "snapshot_bytes": snapshot_bytes,
                    "mechanism": stats.mechanism,
                }
            )
            pushed_bytes, pushed_ms = stats.bytes, 1e3 * stats.seconds
        # every step, 0 when the engine already held the target version (lag k: the first k steps)
        metrics["sync/bytes"].append(pushed_bytes)
        metrics["sync/gib"].append(pushed_bytes / 2**30)
        metrics["sync/ms"].append(pushed_ms)
        self.history.drop_before(target + 1)  # the engine holds `target`; later steps need newer versions only
        return target

    # ---- rollout ---------------------------------------------------------------------------------------------------
    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        step = self.state.global_step
        prompt_ids = self._tokenize_prompts(prompts)[0]
        with self.timer.phase(WEIGHT_SYNC):
            version = self._sync_engine(step)
        with self.timer.phase(ROLLOUT):
            out = self.engine.generate(prompt_ids, self.sampling, num_generations=self.num_generations)
        # the HF engine scores its samples inside generate(); charge that pass to its own phase
        self.timer.reassign(ROLLOUT, BEHAVIOUR_LOGPROBS, out.logprob_s)
        self.generated_tokens += out.num_tokens
        self.version_log.append({"step": step, "policy_version": version, "lag": step - version})
        metrics = self._metrics["train"]
        metrics["rollout/policy_version"].append(version)
        metrics["rollout/lag"].append(step - version)
        metrics["rollout/engine_tokens_per_s"].append(out.tokens_per_s)
        if self.probe_every and step % self.probe_every == 0:
            with self.timer.phase(THROUGHPUT_PROBE):
                base = naive_generate(
                    self._policy(), prompt_ids, self.sampling, self._tokenizer.pad_token_id, self.eos_ids
                )
            self.throughput_log.append(
                {
                    "step": step,
                    "engine": self.engine.name,
                    "engine_tokens": out.num_tokens,
                    "engine_s": out.generate_s,
                    "engine_tokens_per_s": out.tokens_per_s,
                    "hf_generate_tokens": base.num_tokens,
                    "hf_generate_s": base.generate_s,
                    "hf_generate_tokens_per_s": base.tokens_per_s,
                    "speedup": out.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None,
                }
            )
            metrics["rollout/hf_generate_tokens_per_s"].append(base.tokens_per_s)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": out.completion_ids,
            "logprobs": out.logprobs,
            "policy_version": [version] * len(prompt_ids),
        }

    # ---- off-policy anchor -----------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        assert "sampling_per_token_logps" in out, "the engine must return behaviour log-probs"
        behaviour = out["sampling_per_token_logps"]  # (B, T); 0 on padding
        mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        has_nan = bool(torch.isnan(behaviour).any())
        anchor_is_behaviour = self.staleness == 0 and self.is_correction == "none" and not has_nan
        step = self.state.global_step
        if anchor_is_behaviour and not (self.mismatch_every and step % self.mismatch_every == 0):
            # lag 0, no IS: the PPO anchor is the behaviour log-probs; the current-policy forward would only feed
            # the mismatch metric, which is sampled every `mismatch_every` steps
            out["old_per_token_logps"] = behaviour
            return out
        # The current policy's log-probs of the sampled tokens (no grad; one forward, what TRL computes for its vLLM
        # IS correction too): the anchor for stale samples, and the rollout/training mismatch below.
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            current, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, out["completion_ids"].size(1), self.args.per_device_train_batch_size
            )
        self._log_mismatch(current, behaviour, mask)
        if anchor_is_behaviour:
            out["old_per_token_logps"] = behaviour
            return out
        weights, stats = truncated_is_weights(current, behaviour, mask, self.is_clip)
        for k, v in stats.items():
            self._metrics["train"][f"staleness/{k}"].append(v)
        if self.is_correction == "tis":
            out["old_per_token_logps"] = current
            out["advantages"] = out["advantages"].unsqueeze(1) * weights  # (B, T)
        else:
            out["old_per_token_logps"] = torch.where(torch.isnan(behaviour), current, behaviour)
        return out

    def _log_mismatch(self, current: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> None:
        """|log pi_trainer - log mu_engine| over the sampled tokens, per step (metrics ``rollout/logp_mismatch_*``).

        At lag 0 both sides hold the same weights, so this is the engine-vs-trainer numerical mismatch that
        importance-sampling corrections exist for (fp32: ~1e-6; bf16 kernels: ~1e-2); at lag k it also contains
        k optimizer steps of policy drift. Tokens vLLM could not score (NaN) are left out and counted."""
        real = mask.bool()
        nan = torch.isnan(behaviour) & real
        use = real & ~nan
        diff = (current - behaviour).abs()[use].float()
        step = self.state.global_step
        row = {
            "step": step,
            "policy_version": self.engine_version,
            "lag": step - self.engine_version,
            "tokens": int(use.sum()),
            "nan_tokens": int(nan.sum()),
            # no scored token (an engine without log-probs): not measured, NaN rather than 0
            "logp_mismatch_mean": float(diff.mean()) if diff.numel() else float("nan"),
            "logp_mismatch_max": float(diff.max()) if diff.numel() else float("nan"),
        }
        self.mismatch_log.append(row)
        metrics = self._metrics["train"]
        metrics["rollout/logp_mismatch_mean"].append(row["logp_mismatch_mean"])
        metrics["rollout/logp_mismatch_max"].append(row["logp_mismatch_max"])

    # ---- length buckets ------------------------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch: Any) -> Any:
        if not (self.sort_micro_batches and self.model.training):
            return super()._prepare_inputs(generation_batch)
        with self.timer.phase(OTHER):
            # TRL 1.16's training branch of _prepare_inputs, with a length sort where it shuffles: micro-batches of
            # similar lengths, so the padding each forward trims away is small
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                if any(batch.get(k) is not None for k in _MULTIMODAL_KWARGS):
                    raise ValueError("grpo.length_buckets: multimodal batches are not supported; set it to false")
                groups = prompt_groups(batch["prompt_ids"], batch["prompt_mask"]) if self.shared_prompt else None
                order = bucket_order(batch["prompt_mask"].sum(1), batch["completion_mask"].sum(1), groups)
                batch = {k: _take_rows(v, order) for k, v in batch.items()}
                self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _per_token_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **kwargs: Any,
    ) -> Any:
        plain = GRPOTrainer._get_per_token_logps_and_entropies
        if not self.length_buckets or any(kwargs.get(k) is not None for k in _MULTIMODAL_KWARGS) or compute_aux_loss:
            return plain(
                self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **kwargs,
            )  # fmt: skip
        rows = input_ids.size(0)
        batch_size = batch_size or rows
        prompt_width = input_ids.size(1) - logits_to_keep
        if batch_size < rows:  # a no-grad pass over the whole generation batch: sort it into chunks
            groups = (
                prompt_groups(input_ids[:, :prompt_width], attention_mask[:, :prompt_width])
                if self.shared_prompt
                else None
            )
            order = bucket_order(
                attention_mask[:, :prompt_width].sum(1), attention_mask[:, prompt_width:].sum(1), groups
            )
        else:
            order = None
        pieces, ent_pieces = [], []
        for start in range(0, rows, batch_size):
            sel = order[start : start + batch_size] if order is not None else slice(start, start + batch_size)
            ids, mask = input_ids[sel], attention_mask[sel]
            lead, trail = trim_padding(mask, logits_to_keep)
            ids, mask = ids[:, lead : ids.size(1) - trail], mask[:, lead : mask.size(1) - trail]
            lp, ent = self._chunk_logps(model, ids, mask, logits_to_keep - trail, compute_entropy, kwargs)
            pieces.append(_pad_right(lp, logits_to_keep))
            ent_pieces.append(_pad_right(ent, logits_to_keep))
        lp = torch.cat(pieces, 0)
        ent = torch.cat(ent_pieces, 0) if compute_entropy else None
        if order is None:  # one chunk per call in training: keep autograd's view simple
            return lp, ent, None
        logps = torch.zeros_like(lp)  # back to the caller's row order
        logps[order] = lp
        entropies = None
        if ent is not None:
            entropies = torch.zeros_like(ent)
            entropies[order] = ent
        return logps, entropies, None

    def _chunk_logps(
        self,
        model: Any,
        ids: torch.Tensor,
        mask: torch.Tensor,
        logits_to_keep: int,
        compute_entropy: bool,
        kwargs: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of one trimmed chunk; with ``shared_prompt``, each distinct prompt runs once.

        Shared prompt: the backbone runs over the distinct prompts minus their last token (KV cache kept), the cache
        is expanded to the chunk's rows (``index_select``: differentiable, the backward sums the rows' gradients into
        the shared prompt), then every row runs its last prompt token + completion against it through TRL's fused
        LM head. Same positions, same masks, same kernels per token as the one-pass forward; the prompt tokens'
        backbone FLOPs drop by the group size."""
        plain = GRPOTrainer._get_per_token_logps_and_entropies
        prompt_width = ids.size(1) - logits_to_keep
        unwrapped = self.accelerator.unwrap_model(model)
        eligible = (
            self.shared_prompt
            and prompt_width >= 2
            and not (torch.is_grad_enabled() and getattr(unwrapped, "is_gradient_checkpointing", False))
        )
        if eligible:
            key = torch.cat([ids[:, : prompt_width - 1], mask[:, : prompt_width - 1]], 1)
            distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
            eligible = distinct.size(0) < ids.size(0)
        if not eligible and self.right_align and kwargs.get("token_type_ids") is None:
            aligned = self._right_aligned_logps(model, ids, mask, logits_to_keep, compute_entropy)
            if aligned is not None:
                return aligned
        if not eligible:
            lp, ent, _ = plain(self, model, ids, mask, logits_to_keep, None, compute_entropy, False, **kwargs)
            return lp, ent
        backbone = unwrapped.base_model
        cache_arg = "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"
        with self.accelerator.autocast():
            prefix = backbone(
                input_ids=distinct[:, : prompt_width - 1],
                attention_mask=distinct[:, prompt_width - 1 :],
                use_cache=True,
            )
            cache = getattr(prefix, "cache", None) or prefix.past_key_values
            _select_cache_rows(cache, inverse)
            tail_ids, tail_mask = ids[:, prompt_width - 1 :], mask[:, prompt_width - 1 :]
            labels = tail_ids.masked_fill(tail_mask == 0, -100)
            labels[:, 0] = -100  # the last prompt token: predicted by the prompt, not scored
            positions = torch.arange(prompt_width - 1, ids.size(1), device=ids.device).expand(ids.size(0), -1)
            out = model(
                input_ids=tail_ids,
                attention_mask=mask,
                position_ids=positions,
                labels=labels,
                fused_lm_head=True,
                **{cache_arg: cache},
            )
        return out.log_probs[:, -logits_to_keep:], out.entropy[:, -logits_to_keep:] if compute_entropy else None

    def _right_aligned_logps(
        self, model: Any, ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int, compute_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """One chunk's log-probs (and entropies) through ``right_align``: no attention mask, causal flash attention.
        None (the caller runs the masked pass) when a row's mask is not one run of ones after the shift (a hole
        inside prompt or completion); one host sync, which also reads the width left after the shift."""
        pad_id = getattr(self._tokenizer, "pad_token_id", None) or 0  # never attended to by a real token
        ids_r, mask_r, labels, cols = right_align(ids, mask, logits_to_keep, pad_id)
        holes = (mask_r[:, 1:] > mask_r[:, :-1]).any()
        width, has_holes = torch.stack([mask_r.sum(1).max(), holes.long()]).tolist()
        if has_holes:
            return None
        width = max(int(width), 1)
        ids_r, labels = ids_r[:, :width], labels[:, :width]
        valid = mask[:, -logits_to_keep:].bool() & (cols < width)
        # the fused head's output t scores token t + 1 (shifted labels): completion column c is output c - 1
        at = (cols - 1).clamp(min=0, max=max(width - 2, 0))
        with self.accelerator.autocast():
            out = model(input_ids=ids_r, attention_mask=None, labels=labels, fused_lm_head=True)
        self.right_aligned_chunks += 1
        lp = torch.where(valid, out.log_probs.gather(1, at), 0.0)
        ent = torch.where(valid, out.entropy.gather(1, at), 0.0) if compute_entropy else None
        return lp, ent

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.monitor is not None and self.model.training:
            n = len(prompts)
            local = rewards[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n].cpu()
            columns = {name: local[:, i].nan_to_num(0.0).tolist() for i, name in enumerate(self.reward_func_names)}
            weights = dict(zip(self.reward_func_names, self.reward_weights.tolist(), strict=True))
            metrics = self.monitor.observe(
                self.state.global_step,
                [completion_text(c) for c in completions],
                [len(c) for c in completion_ids_list],
                columns,
                weights,
            )
            for k, v in metrics.items():
                self._metrics["train"][k].append(v)
        return rewards
