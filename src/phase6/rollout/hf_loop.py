"""The HF engine's decode loop: prefill each distinct prompt once, then one CUDA-graph replay per generated token.

Why (issue 7; one H200, Qwen2.5-1.5B architecture, 512 rows x 512 forced tokens): transformers' ``generate`` with a
static cache and a compiled decode step (CUDA graphs) spends 43 ms per token step. The step's unavoidable work is
~1.6 TFLOP of matmuls (2 x 1.54 G parameters x 512 rows: ~2.5 ms) and one read of the KV cache (28 KiB per token
per row: 10.3 GB at the full static length of 704, ~2.2 ms). The rest, and what this loop does instead (per-step
saving predicted before measuring; the measured rows are in docs/benchmarks.md):

1. GQA without ``repeat_kv``. transformers 5.17's SDPA path copies every layer's K and V to all 12 query heads when
   an attention mask is passed, and a static cache always passes one: per step 6x the KV bytes are written and read
   again (~134 GB, ~30 ms). Here a query's 12 heads are packed as (2 KV heads x 6 query rows), so SDPA reads each
   K/V once (``phase6.models.packed_gqa``, shared with the torch-tp server; the prefill's masked attention too).
   (transformers 5.24 does the same, ``pack_gqa``, but only when not compiling.)
2. Attention over the filled part of the cache: keys up to the current position rounded up to ``attend_bucket``
   (one graph per bucket), not the whole static length (~7.1 instead of 10.3 GB read: ~0.8 ms).
3. Sampling inside the graph: Gumbel-max (argmax of logits/T plus Gumbel noise is a sample of softmax(logits/T))
   instead of generate's float32 copy, processors, softmax and ``torch.multinomial``, which reads the probabilities
   three more times to validate them and waits for that check with two ``.item()`` host syncs per token (so it cannot
   be captured in a CUDA graph either): ~4.5 GB -> ~2.8 GB of float32 traffic per token, ~0.4 ms. The behaviour
   log-prob of the sampled token comes from the same logits (one logsumexp), not from a second forward over prompt
   + completion.
4. No host synchronization per token: EOS is checked every ``check_every`` tokens and the host only queues graph
   replays (generate reads ``unfinished.max() == 0`` after every token, so the GPU idles while Python prepares the
   next step: ~2-4 ms). With nothing left for the host to do between tokens, a sync per token would cost little.
5. Prefill of each distinct prompt once (GRPO repeats every prompt ``num_generations`` times); its K/V is copied to
   every row that repeats it; in chunks of ``prefill_tokens`` (~0.4 s of 0.5 s at 8 generations per prompt).
6. No compilation: the graphs are captured from the eager model (about one step's time each, instead of the ~55 s
   first call of the compiled path); the price is the unfused eager kernels (~35 small ones per layer, ~3 ms per step).

The model's own modules run every step. Only the KV cache (``StaticKV``, what transformers' attention layers call
``update`` on) and the attention function (registered with transformers' ``AttentionInterface``, switched on for the
duration of the loop) are ours, and the masks are passed as 4D tensors, which transformers uses as given. So this
should work for any transformers decoder whose layers are all full attention; it is tested on Qwen2 (the 6D models)
under transformers 5.17 and 5.24.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from phase6.models.packed_gqa import register_packed_gqa
from phase6.rollout import SamplingParams, cut_at_eos, fused_sample
from phase6.timing import sync, wall

ATTENTIONS = {"packed_gqa": register_packed_gqa(), "sdpa": "sdpa"}
"""LoopOptions.attention -> registry name; ``sdpa`` is transformers' own (repeat_kv under a mask on 5.17)."""


@dataclass(frozen=True)
class LoopOptions:
    """Knobs of the decode loop. Each default is one fix of the module docstring; the benchmark turns them off one at
    a time to measure what each is worth."""

    attention: str = "packed_gqa"
    """packed_gqa (K/V read once per step) | sdpa (transformers' own function: repeat_kv under a mask)."""
    attend_bucket: int = 64
    """Decode attends to the cache up to the current position rounded up to this (one CUDA graph per bucket);
    0 = always the whole static length (one graph)."""
    check_every: int = 16
    """Check for all-rows-finished (one host sync) every this many tokens; 0 = never stop early."""
    dedup_prefill: bool = True
    """Prefill each distinct prompt once and copy its K/V to the rows that repeat it."""
    prefill_tokens: int = 16384
    """Padded prompt tokens per prefill forward (bounds the prefill activations)."""
    cuda_graphs: bool = True
    """Replay each token step as a CUDA graph (CUDA only; on CPU the same step runs eagerly)."""
    fused_sampling: bool = True
    """Plain temperature sampling + the token's log-prob in one Triton pass over the bf16 logits
    (``phase6.rollout.fused_sample``: same distribution and log-prob, one read of the logits instead of ~12 passes
    over a float32 copy; issue 31). Where Triton is missing, or top-k / top-p / min-new-tokens / greedy are set, the
    torch path ``sample_tokens`` runs."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"LoopOptions.attention must be one of {list(ATTENTIONS)}, got {self.attention!r}")
        for key in ("attend_bucket", "check_every"):
            if getattr(self, key) < 0:
                raise ValueError(f"LoopOptions.{key} must be >= 0, got {getattr(self, key)}")
        if self.prefill_tokens < 1:
            raise ValueError(f"LoopOptions.prefill_tokens must be >= 1, got {self.prefill_tokens}")


class StaticKV:
    """The KV cache of one decode batch: per layer (B, KV, S, D) tensors, allocated at the first prefill, then only
    written in place (so the captured graphs stay valid).

    transformers' attention layers call ``update(key, value, layer_idx)`` with the new tokens' K/V and attend to what
    it returns. With ``prefill_rows`` = (dest, src) set, a prefill chunk's K/V rows ``src`` are written to batch rows
    ``dest`` at positions [0, L) and the chunk attends to its own K/V; otherwise one decode token per row is written at
    ``slot`` and the first ``attend_len`` positions are returned.
    """

    def __init__(self, num_layers: int, batch: int, length: int) -> None:
        self.batch = batch
        self.length = length
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.num_layers = num_layers
        self.prefill_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self.slot: torch.Tensor | None = None
        """(1,) long: the cache position the decode step writes."""
        self.attend_len = length

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.keys) == layer_idx:  # layers are called in order: allocate this one's tensors on first use
            self.keys.append(key_states.new_zeros((self.batch, key_states.shape[1], self.length, key_states.shape[3])))
            self.values.append(
                value_states.new_zeros((self.batch, value_states.shape[1], self.length, value_states.shape[3]))
            )
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.prefill_rows is not None:
            dest, src = self.prefill_rows
            n = key_states.shape[2]
            keys[dest, :, :n] = key_states[src]
            values[dest, :, :n] = value_states[src]
            return key_states, value_states
        assert self.slot is not None, "decode step without a cache slot"
        keys.index_copy_(2, self.slot, key_states)
        values.index_copy_(2, self.slot, value_states)
        return keys[:, :, : self.attend_len], values[:, :, : self.attend_len]


def process_scores(logits: torch.Tensor, params: SamplingParams, step: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """generate's logits processing, in its order, on (B, V) logits -> float32 scores with -inf for excluded tokens.

    EOS is excluded while ``step`` (tokens generated so far, a (1,) tensor) < min_new_tokens; then temperature, top-k
    and top-p with transformers' TopK/TopPLogitsWarper semantics; greedy applies the EOS rule only. Tensor ops only
    (no host synchronization), so it runs inside a CUDA graph.
    """
    scores = logits.float() / (params.temperature if not params.greedy else 1.0)  # (B, V), always a new tensor
    if params.min_new_tokens > 0:
        blocked = torch.where(step < params.min_new_tokens, float("-inf"), scores.index_select(1, eos))
        scores.index_copy_(1, eos, blocked)
    if not params.greedy and params.top_k > 0:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1])).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if not params.greedy and params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - params.top_p)
        drop[:, -1:] = False  # keep at least one token
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    step: torch.Tensor,
    eos: torch.Tensor,
    want_logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token per row (B,) and its behaviour log-prob (B,) from (B, V) logits.

    Sampling is Gumbel-max: argmax(s - log E) with E ~ Exp(1) is a sample of softmax(s), the exponential race
    ``torch.multinomial`` also runs, without its validation (three extra reads and two ``.item()`` host syncs, which a
    CUDA graph cannot contain). The log-prob is TRL's convention, log softmax(logits / T) before top-k/top-p (T = 1 for greedy), the same as
    ``sequence_logprobs`` computes from a forward pass.
    """
    scores = process_scores(logits, params, step, eos)
    if params.greedy:
        tokens = scores.argmax(dim=-1)
    else:
        noise = torch.empty_like(scores).exponential_().log_()  # log E, E ~ Exp(1)
        tokens = (scores - noise).argmax(dim=-1)
    if not want_logprobs:
        return tokens, None
    scaled = logits.float() / (params.temperature if not params.greedy else 1.0)
    return tokens, scaled.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)


class _Batch:
    """Device state of one batch shape: KV cache, per-row buffers, captured graphs (reused while the shape repeats)."""

    def __init__(
        self,
        key: tuple[Any, ...],
        num_layers: int,
        batch: int,
        prompt_len: int,
        params: SamplingParams,
        want_logprobs: bool,
        device: torch.device,
        fused: bool = False,
    ) -> None:
        self.key = key
        self.want_logprobs = want_logprobs
        self.prompt_len = prompt_len  # L: left-padded prompt length; cache slots [0, L) hold prompts
        self.params = params
        length = prompt_len + params.max_new_tokens
        self.cache = StaticKV(num_layers, batch, length)
        self.positions = torch.arange(length, device=device)  # (S,)
        self.start = torch.zeros(batch, dtype=torch.long, device=device)  # first real prompt slot per row
        self.prompt_lens = torch.zeros(batch, dtype=torch.long, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)  # index of the token the next step samples
        self.cur = torch.zeros((batch, 1), dtype=torch.long, device=device)  # last sampled token per row
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.fused = fused
        self.seed = torch.zeros(1, dtype=torch.long, device=device)  # the fused sampler's Philox key base, per call
        self.tokens = torch.zeros((batch, params.max_new_tokens), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None


@dataclass
class LoopResult:
    """One batch through the loop (device-synchronized timings)."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None
    prefill_s: float
    decode_s: float
    steps: int
    """Tokens generated per row (decode stops early when every row has finished)."""
    graphs_captured: int
    fused_sampling: bool = False
    """Whether the fused Triton sampler drew the tokens (LoopOptions.fused_sampling, where it applies)."""


class DecodeLoop:
    """Static-cache sampling loop over a transformers causal LM, with per-token CUDA graphs on CUDA."""

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        eos_ids: set[int],
        pad_to_multiple: int = 64,
        options: LoopOptions | None = None,
    ) -> None:
        layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(f"the HF decode loop needs full-attention layers only; config.layer_types = {layer_types}")
        self.model = model
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.pad_to_multiple = pad_to_multiple
        self.options = options or LoopOptions()
        self.use_graphs = self.options.cuda_graphs and self.device.type == "cuda"
        # the cache argument's name: `cache` from transformers 5.2x (`past_key_values` still accepted, with a warning)
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self._batch: _Batch | None = None

    @contextmanager
    def _attention(self) -> Iterator[None]:
        """The loop's attention function for the duration of the loop (the engine's model is private to it)."""
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = ATTENTIONS[self.options.attention]
        try:
            yield
        finally:
            config._attn_implementation = previous

    def _state(self, batch: int, prompt_len: int, params: SamplingParams, want_logprobs: bool) -> _Batch:
        key = (batch, prompt_len, params, want_logprobs)
        if self._batch is None or self._batch.key != key:
            self._batch = None  # free the previous shape's cache and graphs first
            fused = self.options.fused_sampling and fused_sample.available(self.device) and fused_sample.applies(params)
            self._batch = _Batch(
                key, self.model.config.num_hidden_layers, batch, prompt_len, params, want_logprobs, self.device, fused
            )
        return self._batch

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, want_logprobs: bool) -> LoopResult:
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        lengths = [len(p) for p in prompt_ids]
        prompt_len = -(-max(lengths) // self.pad_to_multiple) * self.pad_to_multiple
        st = self._state(len(prompt_ids), prompt_len, params, want_logprobs)
        lens = torch.tensor(lengths, dtype=torch.long)
        st.prompt_lens.copy_(lens)
        st.start.copy_(prompt_len - lens)
        st.done.zero_()
        st.t.zero_()
        if st.fused:  # the kernel's Philox key, from torch's generator (manual_seed holds); the torch path draws none
            st.seed.fill_(int(torch.randint(0, 2**31 - 1, (1,)).item()))
        captured = len(st.graphs)
        with self._attention():
            sync(self.device)  # three synchronized clock reads: prefill = t1 - t0, decode = t2 - t1
            t0 = wall()
            self._prefill(st, prompt_ids)
            sync(self.device)
            t1 = wall()
            steps = self._decode(st)
            sync(self.device)
            t2 = wall()
        tokens = st.tokens[:, :steps].cpu().tolist()
        eos_ids = set(self.eos.tolist())
        completions = [cut_at_eos(row, eos_ids) for row in tokens]
        logprobs = None
        if want_logprobs:
            lps = st.logprobs[:, :steps].cpu().tolist()
            logprobs = [row[: len(c)] for row, c in zip(lps, completions, strict=True)]
        return LoopResult(completions, logprobs, t1 - t0, t2 - t1, steps, len(st.graphs) - captured, st.fused)

    def _prefill(self, st: _Batch, prompt_ids: list[list[int]]) -> None:
        """Prompt K/V of every row into the cache, and the first token sampled from each prompt's last logits."""
        if self.options.dedup_prefill:
            index: dict[tuple[int, ...], int] = {}
            src_of_row = [index.setdefault(tuple(p), len(index)) for p in prompt_ids]
            unique = [list(p) for p in index]
        else:
            src_of_row, unique = list(range(len(prompt_ids))), prompt_ids
        L = st.prompt_len
        chunk = max(1, self.options.prefill_tokens // L)
        causal = torch.ones((L, L), dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(L, dtype=torch.bool, device=self.device)
        last_logits = []
        for c0 in range(0, len(unique), chunk):
            prompts = unique[c0 : c0 + chunk]
            ids = torch.full((len(prompts), L), self.pad_id, dtype=torch.long)
            valid = torch.zeros((len(prompts), L), dtype=torch.bool)
            for i, p in enumerate(prompts):
                ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
                valid[i, L - len(p) :] = True
            ids, valid = ids.to(self.device), valid.to(self.device)
            # padding queries attend to themselves only: a row with no key would give NaN, and NaN K/V in the pad slots
            # would leak through 0 * NaN in later layers even though those slots are masked
            mask = (causal & valid[:, None, :]) | eye  # (n, L, L)
            positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)  # generate's position ids for left padding
            rows = [r for r, u in enumerate(src_of_row) if c0 <= u < c0 + len(prompts)]
            st.cache.prefill_rows = (
                torch.tensor(rows, dtype=torch.long, device=self.device),
                torch.tensor([src_of_row[r] - c0 for r in rows], dtype=torch.long, device=self.device),
            )
            out = self.model(
                input_ids=ids,
                attention_mask=mask[:, None],
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_arg: st.cache},
            )
            last_logits.append(out.logits[:, -1])  # (n, V)
        st.cache.prefill_rows = None
        rows_of = torch.tensor(src_of_row, dtype=torch.long, device=self.device)
        self._emit(st, torch.cat(last_logits)[rows_of])  # token 0 of every row

    def _decode(self, st: _Batch) -> int:
        """Tokens 1 .. max_new_tokens - 1; returns how many tokens every row has (fewer if all finished early)."""
        num_new = st.params.max_new_tokens
        bucket = self.options.attend_bucket
        for t in range(1, num_new):
            if self.options.check_every and t % self.options.check_every == 0 and bool(st.done.all()):
                return t
            # the step writes slot L + t - 1 and attends to slots [0, L + t)
            attend = (
                st.cache.length if bucket == 0 else min(st.cache.length, -(-(st.prompt_len + t) // bucket) * bucket)
            )
            if not self.use_graphs:
                self._step(st, attend)
            elif attend in st.graphs:
                st.graphs[attend].replay()
            else:
                self._capture(st, attend)
        return num_new

    def _capture(self, st: _Batch, attend: int) -> None:
        """Run this token's step eagerly on a side stream (warm-up, as torch.cuda.graph requires), then record it: the
        recording does not execute, so the next tokens of this bucket replay it."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._step(st, attend)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=st.pool, capture_error_mode="thread_local"):
            self._step(st, attend)
        st.graphs[attend] = graph

    def _step(self, st: _Batch, attend: int) -> None:
        """Feed the last token of every row, sample the next one. Everything reads and writes ``st``'s buffers in
        place and nothing waits on the device, so the same code is the CUDA graph's body."""
        slot = st.t + (st.prompt_len - 1)  # (1,) cache slot of the token being fed
        keys = st.positions[:attend]
        mask = (keys >= st.start[:, None]) & (keys <= slot)  # (B, attend): the row's prompt and what it generated
        st.cache.slot, st.cache.attend_len = slot, attend
        logits = self.model(
            input_ids=st.cur,
            attention_mask=mask[:, None, None, :],
            position_ids=(st.prompt_lens + st.t - 1)[:, None],
            use_cache=True,
            **{self.cache_arg: st.cache},
        ).logits[:, -1]  # (B, V)
        self._emit(st, logits)

    def _emit(self, st: _Batch, logits: torch.Tensor) -> None:
        """Sample token ``t`` of every row and store it; finished rows get padding (as generate)."""
        if st.fused:
            tokens, logprobs = fused_sample.fused_sample(logits, st.params.temperature, st.seed, st.t, st.want_logprobs)
        else:
            tokens, logprobs = sample_tokens(logits, st.params, st.t, self.eos, st.want_logprobs)
        tokens = torch.where(st.done, self.pad_id, tokens)
        st.done.logical_or_((tokens[:, None] == self.eos).any(dim=-1))  # (B,): explicit, no sorting path of isin
        st.tokens.index_copy_(1, st.t, tokens[:, None])
        if logprobs is not None:
            st.logprobs.index_copy_(1, st.t, logprobs[:, None])
        st.cur.copy_(tokens[:, None])
        st.t.add_(1)
