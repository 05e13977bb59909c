"""The fused Triton sampler (phase6.rollout.fused_sample) against the torch path: on CUDA with the compiled kernel,
on CPU under TRITON_INTERPRET=1.

Runs only where Triton is importable (CUDA torch installs, or `pip install triton` beside CPU torch). Without CUDA the
interpreter is switched on before the kernel module is first imported (Triton reads the variable when ``@triton.jit``
decorates); if another module imported it first without the interpreter, the CPU tests skip."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from phase6.rollout import SamplingParams  # noqa: E402
from phase6.rollout import fused_sample as fs  # noqa: E402
from phase6.rollout.fused_sample import applies, fused_sample  # noqa: E402

if DEVICE == "cpu" and type(getattr(fs, "_sample_kernel", None)).__name__ != "InterpretedFunction":
    pytest.skip("the kernel module was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


# chi-square 99.9 % quantile at 19 degrees of freedom
CHI2_19_999 = 43.82


def _chi2(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = tokens.numel() * probs.double()
    return float(((counts - expected) ** 2 / expected).sum())


def test_fused_sample_distribution_and_logprobs() -> None:
    """600 rows of the same 20-token logits (two 16-wide blocks: the cross-block argmax and the online logsumexp
    are exercised): the sampled tokens follow softmax(logits / T) (chi-square below its 99.9 % quantile, and far
    above it against softmax(logits), so the check can fail), the log-probs equal torch's log_softmax within 1e-5."""
    torch.manual_seed(0)
    vocab, rows, temperature = 20, 600, 0.5
    row = (torch.randn(vocab) * 1.5).to(torch.bfloat16)
    logits = row.expand(rows, vocab).contiguous().to(DEVICE)
    tokens, logprobs = fused_sample(logits, temperature, _t([11]), _t([5]), block=16)
    assert tokens.dtype == torch.long and tokens.shape == (rows,)
    ref = torch.log_softmax(logits.float() / temperature, dim=-1)
    assert logprobs is not None
    assert torch.allclose(logprobs, ref.gather(1, tokens[:, None]).squeeze(1), atol=1e-5)
    tokens = tokens.cpu()
    assert _chi2(tokens, ref[0].cpu().exp()) < CHI2_19_999
    assert _chi2(tokens, torch.softmax(row.float(), dim=-1)) > 2 * CHI2_19_999  # T = 1 instead of 0.5: rejected


def test_fused_sample_new_noise_per_step_and_seed() -> None:
    """Another step (or seed) draws other tokens; the same (seed, step) the same tokens."""
    torch.manual_seed(1)
    logits = torch.zeros(64, 50, device=DEVICE)  # uniform: any fixed noise would show as identical draws
    a, _ = fused_sample(logits, 1.0, _t([3]), _t([0]), want_logprobs=False)
    b, _ = fused_sample(logits, 1.0, _t([3]), _t([0]), want_logprobs=False)
    c, _ = fused_sample(logits, 1.0, _t([3]), _t([1]), want_logprobs=False)
    d, _ = fused_sample(logits, 1.0, _t([4]), _t([0]), want_logprobs=False)
    assert torch.equal(a, b)
    assert (a != c).sum() > 32 and (a != d).sum() > 32
    assert len(set(a.tolist())) > 20  # rows of one call draw independently


def test_applies_only_to_plain_temperature_sampling() -> None:
    assert applies(SamplingParams(max_new_tokens=4, temperature=1.0))
    for params in (
        SamplingParams(max_new_tokens=4, temperature=0.0),
        SamplingParams(max_new_tokens=4, top_k=5),
        SamplingParams(max_new_tokens=4, top_p=0.9),
        SamplingParams(max_new_tokens=4, min_new_tokens=2),
    ):
        assert not applies(params)


@pytest.mark.skipif(DEVICE != "cpu", reason="the tiny engine check runs on CPU under the interpreter")
def test_decode_loop_with_the_fused_sampler() -> None:
    """The HF engine's decode loop takes the fused path for plain temperature sampling (and says so): the behaviour
    log-probs equal a direct forward's within 1e-4 (fp32), the draw repeats under torch.manual_seed, and the
    LoopOptions switch puts the torch path back."""
    import copy

    from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer
    from phase6.rollout.hf import HFEngine
    from phase6.rollout.hf_loop import LoopOptions

    torch.manual_seed(0)
    tok = build_tiny_tokenizer(["Ava has 3 apples and buys 4 more.", "How many?", "1 2 3 4 5 6 7 8 9 0"] * 20, 300)
    model = build_tiny_model(tok, seed=0)
    ids = [tok(t)["input_ids"] for t in ("Ava has 3 apples", "How many more?", "1 2")]
    params = SamplingParams(max_new_tokens=6, temperature=0.7)

    def run(fused: bool) -> tuple[Any, Any]:
        eng = HFEngine(
            copy.deepcopy(model),
            tok.pad_token_id,
            [tok.eos_token_id],
            pad_to_multiple=8,
            loop_options=LoopOptions(fused_sampling=fused),
        )
        torch.manual_seed(4)
        return eng.generate(ids, params), eng.last_timing

    out, timing = run(True)
    again, _ = run(True)
    _, torch_timing = run(False)
    assert timing["fused_sampling"] and not torch_timing["fused_sampling"]
    assert again.completion_ids == out.completion_ids
    assert out.logprobs is not None
    for p, comp, lps in zip(ids, out.completion_ids, out.logprobs, strict=True):
        full = torch.tensor([p + comp])
        with torch.no_grad():
            logits = model(full).logits[0, len(p) - 1 : -1].float() / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(comp)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), ref, atol=1e-4)
