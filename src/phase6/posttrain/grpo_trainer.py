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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

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

    def __init__(self, trainer: EngineGRPOTrainer) -> None:
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


class EngineGRPOTrainer(GRPOTrainer):
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
        **kwargs: Any,
    ) -> None:
        if is_correction not in IS_CORRECTIONS:
            raise ValueError(f"grpo.is_correction must be one of {list(IS_CORRECTIONS)}, got {is_correction!r}")
        if kwargs.get("args") is not None and kwargs["args"].use_vllm:
            raise ValueError("use_vllm must be False: vLLM is driven through our engine (engine=vllm)")
        self.timer = timer or PhaseTimer()
        super().__init__(*args, rollout_func=self._rollout, **kwargs)
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
        self.engine = engine_builder(self)
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
        self.step_rows: list[dict[str, float]] = []
        self.version_log: list[dict[str, int]] = []
        self.sync_log: list[dict[str, Any]] = []
        self.throughput_log: list[dict[str, Any]] = []
        self.mismatch_log: list[dict[str, Any]] = []
        self.generated_tokens = 0
        self.add_callback(_StepWindows(self))

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
        # The current policy's log-probs of the sampled tokens (no grad; one forward per step, what TRL computes
        # for its vLLM IS correction too): the anchor for stale samples, and the rollout/training mismatch below.
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            current, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, out["completion_ids"].size(1), self.args.per_device_train_batch_size
            )
        self._log_mismatch(current, behaviour, mask)
        has_nan = bool(torch.isnan(behaviour).any())
        if self.staleness == 0 and self.is_correction == "none" and not has_nan:
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
            "logp_mismatch_mean": float(diff.mean()) if diff.numel() else 0.0,
            "logp_mismatch_max": float(diff.max()) if diff.numel() else 0.0,
        }
        self.mismatch_log.append(row)
        metrics = self._metrics["train"]
        metrics["rollout/logp_mismatch_mean"].append(row["logp_mismatch_mean"])
        metrics["rollout/logp_mismatch_max"].append(row["logp_mismatch_max"])

    # ---- timing wrappers -----------------------------------------------------------------------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        with self.timer.phase(POLICY_UPDATE):
            return super().training_step(model, inputs, num_items_in_batch)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        with self.timer.phase(OTHER):
            return super()._prepare_inputs(generation_batch)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        with self.timer.phase(REF_LOGPROBS):
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        with self.timer.phase(REWARD):
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
