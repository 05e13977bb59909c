"""Issue 23, DistServe rows of `experiment=papers`: its fitted step profiles, its decode instance's KV (16-token blocks
grown per token, swapped out when full: EngineLimits.decode_swap), its request lengths and its reading of a
rate curve. Small fixtures only (no ../shared)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.config.slo import SLOConfig
from phase6.fleet.analysis import summarize
from phase6.fleet.papers import (
    DISTSERVE_PROFILE,
    OPT_66B,
    ProfileStepTime,
    distserve_lengths,
    distserve_run,
    grid_rate,
)
from phase6.fleet.results import SimResult
from phase6.fleet.sim import EngineLimits, Topology, simulate
from phase6.fleet.steptime import planner_model
from phase6.fleet.tokens import token_gap_total
from phase6.fleet.workload import RequestClass, Workload, synthetic
from phase6.plan.model import resolve_model

A100 = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "a100_80gb.yaml").read_text()))
H100 = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h100_sxm.yaml").read_text()))


def test_profile_step_time_is_distserves_fit_and_runs_are_sums_of_steps() -> None:
    m = ProfileStepTime("vllm", 4)
    a, b, c = DISTSERVE_PROFILE["vllm"][4]["prefill"]
    lens = (300, 1700)
    pairs = sum(n * (n + 1) / 2 for n in lens)
    want = a + b * sum(lens) + c * sum(n * n for n in lens) + 2.0 + 1e-4 * sum(lens)  # + its engine-loop overhead
    assert m.step_s(sum(lens), pairs, 0, 0) == pytest.approx(want / 1e3, rel=1e-12)
    for seqs in (7, 94, 95, 300):  # the small- and large-batch fits switch at 95
        ctx = seqs * 900
        steps = sum(m.step_s(0, 0.0, seqs, ctx + j * seqs) for j in range(13))
        assert m.decode_run_s(seqs, ctx, 13) == pytest.approx(steps, rel=1e-12)
    fit = DISTSERVE_PROFILE["vllm"][4]
    assert m.step_s(0, 0.0, 94, 0) - 2e-3 == pytest.approx(sum(fit["small"][::2] * np.array([1, 94])) / 1e3)
    assert m.step_s(0, 0.0, 95, 0) - 2e-3 == pytest.approx(sum(fit["large"][::2] * np.array([1, 95])) / 1e3)


def _pd(w: Workload, dec: EngineLimits, macro: bool = True) -> SimResult:
    model = planner_model(resolve_model("llama3.1-8b"), H100, EngineConfig(tp=1))
    pre = EngineLimits(64, 8192, 2000, False)
    return simulate(
        w,
        model,
        pre,
        Topology(prefill=1, decode=1),
        "least_loaded",
        kv_transfer_s=lambda n: 1e-4 * n / 512,
        decode_pool=(model, dec, 1),
        macro=macro,
    )


def test_decode_swap_grows_kv_per_token_and_swaps_the_newest_out_when_full() -> None:
    """A decode replica with decode_swap admits a request on the KV it holds, grows it per 16-token block, and when
    none is free swaps the most recently joined one out (it rejoins first, its KV priced as a transfer). Closed-form
    runs == one event per token; with ample KV nothing is swapped and times equal the reserving replica's; under
    pressure every request still gets exactly its tokens."""
    w = synthetic(200, 40.0, [RequestClass(1.0, 200, 900, 100, 700)], 5)
    tight = EngineLimits(256, 65536, 700, False, decode_swap=True, block_tokens=16)  # 11,200 tokens of KV
    a, b = _pd(w, tight), _pd(w, tight, macro=False)
    assert a.preemptions > 0 and a.preemptions == b.preemptions
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    assert np.all(np.isfinite(a.finish_s)) and np.all(a.finish_s > a.first_token_s)
    swapped = a.gap_from_s != a.first_token_s
    assert swapped.any()
    for i in np.flatnonzero(a.output_tokens > 1):  # decode steps after its (last) join = its tokens still to come
        steps = token_gap_total(a.logs, int(a.decode_replica[i]), a.join_s[i], a.finish_s[i])
        assert steps == a.gap_tokens[i] - 1
    roomy = [
        _pd(w, EngineLimits(256, 65536, 10**6, False, decode_swap=s, block_tokens=16 if s else 512)) for s in (0, 1)
    ]
    assert roomy[1].preemptions == 0
    np.testing.assert_allclose(roomy[0].finish_s, roomy[1].finish_s, rtol=0, atol=1e-9)
    # reserving whole outputs in the same memory holds fewer requests: they wait for room (token 2 later)
    reserve = _pd(w, EngineLimits(256, 65536, 700 * 16 // 512, False))
    assert reserve.preemptions == 0 and np.mean(reserve.tpot_s) > np.mean(a.tpot_s)


def test_distserve_lengths_are_its_datasets() -> None:
    rng = np.random.default_rng(0)
    p, o, _ = distserve_lengths("code completion", 20_000, rng)
    assert p.mean() == pytest.approx(171.3, abs=3) and o.mean() == pytest.approx(98.2, abs=3)
    assert p.min() >= 55 and p.max() <= 629  # HumanEval's shortest and longest prompt (OPT tokens)
    p, o, _ = distserve_lengths("chatbot", 20_000, rng)
    assert p.mean() == pytest.approx(770, abs=15) and o.mean() == pytest.approx(201, abs=8)
    assert np.all(p + o < 2048) and np.median(o) < o.mean()  # ShareGPT answers: skewed
    p, o, _ = distserve_lengths("summarization", 5_000, rng)
    assert np.all(p + o <= 2040) and np.all(p >= 1900 - 140) and p.mean() > 1850


def test_grid_rate_reads_a_curve_as_distserve_does() -> None:
    def curve(x: float) -> float:
        return 1.0 - 0.2 * x  # crosses 0.9 at 0.5

    assert grid_rate(curve, (0.25, 0.75, 1.25)) == (pytest.approx(0.5), "")
    rate, why = grid_rate(curve, (0.6, 0.8))  # below 90 % from the first rate on: DistServe reads the first rate
    assert rate == 0.6 and "(88% at 0.6): read as 0.6" in why
    rate, why = grid_rate(curve, (0.1, 0.2))  # above at the last rate: measured on at the grid's step
    assert rate == pytest.approx(0.5) and "past its grid's last rate 0.2" in why


def test_distserve_runs_both_systems_and_vllm_ttft_is_its_profile() -> None:
    spec = resolve_model(OPT_66B)
    one = Workload(np.zeros(1), np.array([171]), np.array([98]), np.zeros(1, dtype=np.int64), None, "one")
    r = distserve_run(one, spec, A100, "vllm")
    assert r.ttft_s[0] == pytest.approx(ProfileStepTime("vllm", 4).step_s(171, 171 * 172 / 2, 0, 0), rel=1e-12)
    d = distserve_run(one, spec, A100, "distserve")
    assert d.ttft_s[0] == pytest.approx(ProfileStepTime("distserve", 4).step_s(171, 171 * 172 / 2, 0, 0), rel=1e-12)
    assert d.num_gpus == 8 and r.num_gpus == 4
    rng = np.random.default_rng(1)
    n_in, n_out, _ = distserve_lengths("code completion", 100, rng)
    w = Workload(np.arange(100) * 4.0, n_in, n_out, np.arange(100, dtype=np.int64), None, "light")
    slo = SLOConfig(ttft_ms=125.0, tpot_ms=200.0, attainment=0.9)
    # one request every 4 s: DistServe's prefill instance meets 125 ms (but for prompts > ~580 tokens: 1 of 100);
    # vLLM's prompts also wait behind its ~42 ms decode steps
    ds, vl = (summarize(distserve_run(w, spec, A100, s), slo, A100)["slo_attainment"] for s in ("distserve", "vllm"))
    assert ds >= 0.98 and vl < ds - 0.05
