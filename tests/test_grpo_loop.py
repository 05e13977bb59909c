"""The HF engine's decode loop (phase6.rollout.hf_loop) on a tiny model: greedy tokens equal plain ``generate`` with
every option on or off (prefill dedup and chunking, attention buckets, packed GQA vs transformers' SDPA), early stop
on EOS, generate's logits processing reproduced exactly (transformers' own processors as the reference), the
Gumbel-max sampler draws from softmax(logits / T), and the token step has no host synchronization (the condition for
CUDA-graph capture). The CUDA-graph path itself is checked on a GPU (marked test; ``projects/6d_grpo/bench.py --part
check``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from phase6.models.packed_gqa import packed_gqa_attention
from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer
from phase6.rollout import SamplingParams
from phase6.rollout.hf import HFEngine, naive_generate, sequence_logprobs
from phase6.rollout.hf_loop import DecodeLoop, LoopOptions, process_scores, sample_tokens

TEXTS = ["Ava has 3 apples and buys 4 more.", "How many?", "1 2 3 4 5 6 7 8 9 0", "marbles and coins"] * 20


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tok = build_tiny_tokenizer(TEXTS, vocab_size=300)
    # 6 query heads on 2 KV heads: the grouping the packed attention must get right (Qwen2.5-1.5B: 12 on 2)
    model = build_tiny_model(tok, hidden_size=48, num_heads=6, num_kv_heads=2, seed=0)
    # At init scale (std 0.02) a random model's residual stream is its input embedding and greedy decoding repeats the
    # last token whatever attention does; 8x larger layer weights make attention, positions and masks decide the
    # tokens (checked: an off-by-one position or mask then changes greedy tokens and log-probs by > 0.2).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(8.0)
    return tok, model


def prompts(tok: Any, group: int = 1) -> list[list[int]]:
    texts = ("Ava has 3 apples", "How many marbles and coins does she have now? 1 2 3 4 5 6 7 8 9", "1 2")
    return [tok(t)["input_ids"] for t in texts for _ in range(group)]


OPTION_SETS = [
    LoopOptions(),
    LoopOptions(dedup_prefill=False, attend_bucket=0, attention="sdpa", check_every=0),
    LoopOptions(prefill_tokens=1, attend_bucket=4, check_every=1),  # one prompt per prefill chunk, many buckets
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=["defaults", "all_off", "small_chunks"])
def test_greedy_tokens_equal_plain_generate(tiny: tuple[Any, Any], options: LoopOptions) -> None:
    tok, model = tiny
    ids = prompts(tok, group=3)  # each prompt three times, as GRPO groups
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    plain = naive_generate(model, ids, greedy, tok.pad_token_id, {tok.eos_token_id})
    loop = DecodeLoop(copy.deepcopy(model), tok.pad_token_id, {tok.eos_token_id}, pad_to_multiple=8, options=options)
    got = loop.generate(ids, greedy, want_logprobs=True)
    assert got.completion_ids == plain.completion_ids
    assert got.steps == 20 and len({tuple(c) for c in got.completion_ids}) == 3
    # decode-time log-probs equal a forward over prompt + completion (fp32; cached K/V vs recomputed: 1e-4)
    ref = sequence_logprobs(model, ids, got.completion_ids, 0.0, tok.pad_token_id)
    assert got.logprobs is not None
    for a, b in zip(got.logprobs, ref, strict=True):
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    # a second batch of another shape, then the first shape again: state is rebuilt / reused, same answers
    assert loop.generate(ids[:2], greedy, want_logprobs=False).completion_ids == plain.completion_ids[:2]
    assert loop.generate(ids, greedy, want_logprobs=False).completion_ids == plain.completion_ids
    assert model.config._attn_implementation == loop.model.config._attn_implementation == "sdpa"  # restored


def test_stops_early_when_every_row_has_ended(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    model = copy.deepcopy(model)
    eos = tok.eos_token_id
    bias = torch.zeros(model.config.vocab_size)
    bias[eos] = 50.0  # EOS becomes the likeliest token everywhere
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    ids = prompts(tok)
    params = SamplingParams(max_new_tokens=40, min_new_tokens=3, temperature=1.0)
    loop = DecodeLoop(model, tok.pad_token_id, {eos}, pad_to_multiple=8, options=LoopOptions(check_every=4))
    got = loop.generate(ids, params, want_logprobs=True)
    handle.remove()
    assert got.steps == 4  # the first check after every row ended
    assert [c[-1] for c in got.completion_ids] == [eos] * 3 and {len(c) for c in got.completion_ids} == {4}
    assert got.logprobs is not None and [len(x) for x in got.logprobs] == [4, 4, 4]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5, top_p=0.9, min_new_tokens=3),
        SamplingParams(max_new_tokens=8, temperature=1.3, top_p=0.5),
        SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1000),  # k > vocab: keep all
        SamplingParams(max_new_tokens=8, temperature=0.0, min_new_tokens=2),
    ],
)
def test_logits_processing_equals_transformers_processors(params: SamplingParams) -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    logits[:, 7] = logits[:, 8]  # a tie at the top-k / top-p boundaries is handled the same way
    eos = torch.tensor([3, 9])
    for step in (0, 2, 5):
        procs: list[Any] = []
        if params.min_new_tokens:
            procs.append(MinNewTokensLengthLogitsProcessor(0, params.min_new_tokens, eos))
        if not params.greedy:
            procs.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k:
                procs.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1:
                procs.append(TopPLogitsWarper(params.top_p))
        input_ids = torch.zeros((4, step), dtype=torch.long)  # generate's processors see only the new tokens' count
        want = LogitsProcessorList(procs)(input_ids, logits.clone())
        got = process_scores(logits, params, torch.tensor([step]), eos)
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.allclose(got, want, atol=1e-6)


def test_gumbel_sampler_draws_from_the_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(20000, 1)
    params = SamplingParams(max_new_tokens=1, temperature=0.8, top_k=4)
    tokens, logprobs = sample_tokens(logits, params, torch.tensor([0]), torch.tensor([5]))
    kept = torch.softmax(logits[0, :4] / 0.8, -1)
    freq = torch.bincount(tokens, minlength=6).float() / len(tokens)
    assert freq[4:].sum() == 0  # outside the top 4: never drawn
    # 20k draws: the standard error of each frequency is <= 0.0036; 0.015 is > 4 standard errors
    assert (freq[:4] - kept).abs().max() < 0.015, (freq, kept)
    assert logprobs is not None
    full = torch.log_softmax(logits[0] / 0.8, -1)  # behaviour log-prob: before top-k (TRL's convention)
    assert torch.allclose(logprobs, full[tokens])
    again, none = sample_tokens(logits[:5], params, torch.tensor([0]), torch.tensor([5]), want_logprobs=False)
    assert none is None and again.shape == (5,)


def test_packed_gqa_attention_equals_repeat_kv_sdpa() -> None:
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    q = torch.randn(4, 6, 1, 16)
    k, v = torch.randn(4, 2, 10, 16), torch.randn(4, 2, 10, 16)
    mask = torch.rand(4, 1, 1, 10) > 0.3
    mask[:, :, :, -1] = True
    got, _ = packed_gqa_attention(module, q, k, v, mask, scaling=0.25)  # (B, 1, H, D)
    rep = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask, scale=0.25
    )
    assert torch.allclose(got, rep.transpose(1, 2), atol=1e-5)


def test_the_token_step_never_waits_on_the_device(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """What CUDA-graph capture needs: no tensor -> Python value (.item(), bool(), .tolist(), .cpu()) in a step.
    Checked twice: the step traces into one graph (torch.compile fullgraph), and it runs with those methods raising."""
    tok, model = tiny
    loop = DecodeLoop(copy.deepcopy(model), tok.pad_token_id, {tok.eos_token_id}, pad_to_multiple=8)
    ids = prompts(tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=20, top_p=0.9, min_new_tokens=2)
    loop.generate(ids, params, want_logprobs=True)  # builds the batch state
    st = loop._batch
    assert st is not None
    st.t.zero_()
    with loop._attention(), torch.no_grad():
        loop._prefill(st, ids)
        torch.compile(loop._step, fullgraph=True, backend="eager", dynamic=False)(st, 32)
        assert int(st.t) == 2

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("host synchronization inside the token step")

        for name in ("item", "__bool__", "tolist", "cpu", "numpy", "__int__", "__float__", "nonzero"):
            monkeypatch.setattr(torch.Tensor, name, refuse)
        loop._step(st, 32)
        monkeypatch.undo()
    assert int(st.t) == 3


def test_engine_loop_and_generate_agree_and_report_timing(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    ids = prompts(tok, group=2)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    loop = HFEngine(copy.deepcopy(model), tok.pad_token_id, [tok.eos_token_id], pad_to_multiple=8)
    gen = HFEngine(copy.deepcopy(model), tok.pad_token_id, [tok.eos_token_id], decode="generate", pad_to_multiple=8)
    a, b = loop.generate(ids, greedy), gen.generate(ids, greedy)
    assert a.completion_ids == b.completion_ids and a.logprob_s == 0.0 and b.logprob_s > 0
    assert a.logprobs is not None and b.logprobs is not None
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert max(abs(p - q) for p, q in zip(x, y, strict=True)) < 1e-4
    assert set(loop.last_timing) == {"prefill_s", "decode_s", "steps", "graphs_captured", "fused_sampling"}
    assert loop.last_timing["fused_sampling"] is False  # greedy: the torch path (and no Triton on CPU)
    assert loop.last_timing["steps"] == 10 and loop.last_timing["graphs_captured"] == 0  # no graphs on CPU
    with pytest.raises(ValueError, match="decode must be one of"):
        HFEngine(model, tok.pad_token_id, [tok.eos_token_id], decode="vllm")


def test_bad_options_and_unsupported_models_fail_clearly() -> None:
    for bad, key in (
        ({"attention": "flash"}, "attention"),
        ({"attend_bucket": -1}, "attend_bucket"),
        ({"check_every": -2}, "check_every"),
        ({"prefill_tokens": 0}, "prefill_tokens"),
    ):
        with pytest.raises(ValueError, match=f"LoopOptions.{key}"):
            LoopOptions(**bad)
    arch = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    sliding = Qwen2Config(**arch, num_key_value_heads=1, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    with pytest.raises(ValueError, match="full-attention layers only"):
        DecodeLoop(Qwen2ForCausalLM(sliding), 0, {1})
    loop = DecodeLoop(Qwen2ForCausalLM(Qwen2Config(**arch, num_key_value_heads=1)), 0, {1})
    with pytest.raises(ValueError, match="at least one token"):
        loop.generate([[3], []], SamplingParams(max_new_tokens=2), want_logprobs=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_replay_the_eager_step(tiny: tuple[Any, Any]) -> None:
    """Graph replays (two calls: capture, then pure replay) give the eager loop's greedy tokens and log-probs (fp32)."""
    tok, model = tiny
    ids = prompts(tok, group=4)
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    eager = DecodeLoop(
        copy.deepcopy(model).cuda(), tok.pad_token_id, {tok.eos_token_id}, 8, LoopOptions(cuda_graphs=False)
    )
    graphs = DecodeLoop(copy.deepcopy(model).cuda(), tok.pad_token_id, {tok.eos_token_id}, 8, LoopOptions())
    want = eager.generate(ids, greedy, want_logprobs=True)
    first = graphs.generate(ids, greedy, want_logprobs=True)
    again = graphs.generate(ids, greedy, want_logprobs=True)
    assert first.graphs_captured > 0 and again.graphs_captured == 0
    for got in (first, again):
        assert got.completion_ids == want.completion_ids
        assert got.logprobs is not None and want.logprobs is not None
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
