"""The transformers rollout engine: a static-cache decode loop with per-token CUDA graphs (default), or ``generate``.

Measured on one H200 (issue 7; Qwen2.5-1.5B architecture, bf16, 64 prompts x 8 samples x 512 forced tokens, torch
2.11, transformers 5.17; ``python projects/6d_grpo/bench.py``, docs/benchmarks.md): plain padded ``generate`` (dynamic
cache, eager) 4,671 tokens/s; ``generate`` with a static cache and a compiled decode step (``mode="reduce-overhead"``,
CUDA graphs) 11,791 tokens/s after a 55 s first call; ``generate_batch`` (continuous batching, default settings)
1,543 tokens/s. The compiled ``generate`` spends 43 ms per token step where the weights, the matmuls and one read of
the KV cache need ~5 ms: phase6.rollout.hf_loop says where the rest goes and is the default decode (``decode="loop"``).
``decode="generate"`` keeps transformers' ``generate`` (static cache and ``compile_decode`` apply to it only).

- Prompts are left-padded to a multiple of ``pad_to_multiple`` so the static cache length (prompt + new tokens), and
  with it the captured graphs (or generate's compiled graph), take few distinct shapes; both are kept and reused
  while the batch shape repeats.
- The engine owns its own model instance: ``load_weights`` copies tensors into it in place (same addresses, so the
  recorded graphs stay valid). That copy is what lets the engine hold an older policy version than the trainer.
- Behaviour log-probabilities (the sampled tokens' log-probs under the engine's weights and temperature): the loop
  takes them from the logits it samples from (one logsumexp per token, inside the graph); ``decode="generate"`` runs
  one extra scoring forward over prompt + completion, chunked by ``score_batch_size`` rows so the (rows, tokens,
  vocab) float32 logits stay bounded (``generate`` could return per-step scores, but for 512 x 512 steps of a 152k
  vocabulary that is 160 GB).
- CUDA graphs and compilation happen only on CUDA; on CPU the same code runs eagerly.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import GenerationConfig, PreTrainedModel

from phase6.rollout import RolloutOutput, SamplingParams, WeightSyncStats, cut_at_eos
from phase6.rollout.hf_loop import DecodeLoop, LoopOptions
from phase6.timing import timed

DECODES = ("loop", "generate")


def left_pad(
    prompt_ids: list[list[int]], pad_id: int, device: torch.device, multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) input ids and attention mask, prompts aligned to the right; L rounded up to ``multiple``."""
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    length = max(len(p) for p in prompt_ids)
    length = -(-length // multiple) * multiple
    ids = torch.full((len(prompt_ids), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), length), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, length - len(p) :] = 1
    return ids.to(device), mask.to(device)


def generation_config(
    params: SamplingParams, pad_id: int, eos_ids: Iterable[int], static_cache: bool, compile_decode: bool
) -> GenerationConfig:
    """A complete GenerationConfig, so nothing is inherited from the checkpoint's generation_config.json
    (Qwen2.5-Instruct ships top_k=20, top_p=0.8, repetition_penalty=1.05, which would change the sampled policy)."""
    sampling = {}
    if not params.greedy:
        sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        min_new_tokens=params.min_new_tokens,
        do_sample=not params.greedy,
        **sampling,
        repetition_penalty=1.0,
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids),
        cache_implementation="static" if static_cache else None,
        disable_compile=not compile_decode,
    )


@torch.no_grad()
def sequence_logprobs(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    temperature: float,
    pad_id: int,
    batch_size: int = 8,
) -> list[list[float]]:
    """log p(completion token | prefix) under ``model`` with logits / temperature (TRL's convention), per token."""
    device = next(model.parameters()).device
    scale = temperature if temperature > 0 else 1.0
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts = prompt_ids[start : start + batch_size]
        comps = completion_ids[start : start + batch_size]
        num_new = max(1, max(len(c) for c in comps))
        p_ids, p_mask = left_pad(prompts, pad_id, device)
        c_ids = torch.full((len(comps), num_new), pad_id, dtype=torch.long, device=device)
        c_mask = torch.zeros((len(comps), num_new), dtype=torch.long, device=device)
        for i, c in enumerate(comps):
            c_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[i, : len(c)] = 1
        ids = torch.cat([p_ids, c_ids], dim=1)  # (b, P+C)
        mask = torch.cat([p_mask, c_mask], dim=1)
        # position t's logits predict token t+1: keep C+1 positions, drop the last
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=num_new + 1).logits[:, :-1]  # (b, C, V)
        logps = torch.log_softmax(logits.float() / scale, dim=-1).gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)
        out += [row[: len(c)].tolist() for row, c in zip(logps.cpu(), comps, strict=True)]
    return out


@torch.no_grad()
def naive_generate(
    model: PreTrainedModel, prompt_ids: list[list[int]], params: SamplingParams, pad_id: int, eos_ids: set[int]
) -> RolloutOutput:
    """The baseline: one padded ``generate`` call with the default dynamic cache, eager (TRL's ``use_vllm=False``)."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, pad_id, device)
    cfg = generation_config(params, pad_id, eos_ids, static_cache=False, compile_decode=False)
    was_training = model.training
    model.eval()
    with timed(device) as t:  # CUDA-synchronized: the kernels, not their launch
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    model.train(was_training)
    completions = [cut_at_eos(row.tolist(), eos_ids) for row in out[:, ids.shape[1] :].cpu()]
    return RolloutOutput(completions, None, t.s)


class HFEngine:
    """Batched transformers generation on a private model copy (decode loop with CUDA graphs, or ``generate``)."""

    name = "hf"
    mechanism = "in-process tensor.copy_ into the engine's own model (device-to-device; host-to-device from a snapshot)"

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        eos_ids: Iterable[int],
        decode: str = "loop",
        static_cache: bool = True,
        compile_decode: bool = True,
        pad_to_multiple: int = 64,
        return_logprobs: bool = True,
        score_batch_size: int = 8,
        loop_options: LoopOptions | None = None,
    ) -> None:
        if decode not in DECODES:
            raise ValueError(f"HFEngine decode must be one of {list(DECODES)}, got {decode!r}")
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.eos_ids = set(eos_ids)
        if not self.eos_ids:
            raise ValueError("HFEngine needs at least one EOS token id")
        self.static_cache = static_cache
        # transformers compiles the decode step only on accelerators; say so instead of pretending on CPU
        self.compile_decode = compile_decode and self.device.type == "cuda"
        self.pad_to_multiple = pad_to_multiple
        self.return_logprobs = return_logprobs
        self.score_batch_size = score_batch_size
        # every checkpoint name, tied aliases too (the trainer sends lm_head.weight of a tied model; same storage)
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self.decode = decode
        self.loop = (
            DecodeLoop(self.model, pad_id, self.eos_ids, pad_to_multiple, loop_options) if decode == "loop" else None
        )
        self.last_timing: dict[str, float] = {}
        """The last ``generate``'s parts (loop: prefill_s, decode_s, steps, graphs_captured)."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_generations: int = 1) -> RolloutOutput:
        # the repeated prompts are generated as independent rows; num_generations only matters to vLLM's server mode
        if self.loop is not None:
            with timed() as t:  # the loop synchronizes its own phases
                res = self.loop.generate(prompt_ids, params, self.return_logprobs)
            self.last_timing = {
                "prefill_s": res.prefill_s,
                "decode_s": res.decode_s,
                "steps": res.steps,
                "graphs_captured": res.graphs_captured,
                "fused_sampling": res.fused_sampling,
            }
            return RolloutOutput(res.completion_ids, res.logprobs, t.s)
        ids, mask = left_pad(prompt_ids, self.pad_id, self.device, self.pad_to_multiple)
        cfg = generation_config(params, self.pad_id, self.eos_ids, self.static_cache, self.compile_decode)
        with timed(self.device) as gen:
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)  # (B, L + new)
        completions = [cut_at_eos(row.tolist(), self.eos_ids) for row in out[:, ids.shape[1] :].cpu()]
        if not self.return_logprobs:
            return RolloutOutput(completions, None, gen.s)
        with timed(self.device) as score:
            logprobs = sequence_logprobs(
                self.model, prompt_ids, completions, params.temperature, self.pad_id, self.score_batch_size
            )
        return RolloutOutput(completions, logprobs, gen.s, score.s)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncStats:
        count = nbytes = 0
        with timed(self.device) as t:
            for name, tensor in named_tensors:
                if name not in self._params:
                    raise ValueError(f"load_weights: engine model has no parameter {name!r}")
                self._params[name].copy_(tensor, non_blocking=True)
                count += 1
                nbytes += tensor.numel() * tensor.element_size()
        return WeightSyncStats(self.mechanism, count, nbytes, t.s)
