"""Fleet simulator: exactness vs the planner, queueing identities, KV limits, routers, PD, engine parity."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import phase6.fleet.sim as sim_module
from phase6.config import HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.sim import EngineLimits, Simulation, Topology, simulate
from phase6.fleet.steptime import TableStepTime, efficiency, kv_transfer_s, planner_model, prefill_pairs
from phase6.fleet.workload import BLOCK_TOKENS, RequestClass, Workload, fixed_lengths, synthetic
from phase6.plan.model import resolve_model
from phase6.plan.serve import ServeCostModel, serve_latency

ROOT = Path(__file__).resolve().parents[1]
HW = HardwareConfig(**yaml.safe_load((ROOT / "configs" / "hardware" / "h100_sxm.yaml").read_text()))
SPEC = resolve_model("llama3.1-8b")
ENG = EngineConfig(tp=2, decode_seq_ms=0.0)  # the planner exactly (the per-row term: test_fleet_interference)
MODEL = planner_model(SPEC, HW, ENG)
LIMITS = EngineLimits(max_num_seqs=64, max_num_batched_tokens=4096, kv_blocks=400)


def one(n_in: int, n_out: int) -> Workload:
    return Workload(np.zeros(1), np.asarray([n_in]), np.asarray([n_out]), np.zeros(1, dtype=np.int64), None, "one")


def xfer(tokens: int) -> float:
    return kv_transfer_s(SPEC, HW, ENG, "internode", tokens)


def max_overlap(start: np.ndarray, end: np.ndarray) -> int:
    ev = sorted([(t, 1) for t in start] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.parametrize("n_in", [100, 3000])
@pytest.mark.parametrize("overheads_ms", [(0.0, 0.0), (4.0, 90.0)])
def test_single_request_reproduces_planner_ttft_tpot(n_in: int, overheads_ms: tuple[float, float]) -> None:
    n_out = 64  # decode contexts n_in+1 .. n_in+63 average to n_in + 32
    eng = dataclasses.replace(ENG, step_overhead_ms=overheads_ms[0], prefill_overhead_ms=overheads_ms[1])
    r = simulate(one(n_in, n_out), planner_model(SPEC, HW, eng), LIMITS, Topology(colocated=1), "round_robin")
    p = serve_latency(SPEC, HW, tp=2, batch=1, context=n_in + n_out // 2, prompt_len=n_in, efficiency=efficiency(eng))
    assert r.ttft_s[0] * 1e3 == pytest.approx(p.prefill_ms, rel=1e-12)
    assert r.tpot_s[0] * 1e3 == pytest.approx(p.decode_ms, rel=1e-9)


def test_pd_single_request_pays_kv_transfer_in_tpot() -> None:
    n_in, n_out = 2000, 33
    r = simulate(one(n_in, n_out), MODEL, LIMITS, Topology(prefill=1, decode=1), "round_robin", kv_transfer_s=xfer)
    assert r.ttft_s[0] == pytest.approx(MODEL.prefill_s(n_in), rel=1e-12)
    decode = sum(MODEL.step_s(0, 0.0, 1, n_in + g) for g in range(1, n_out))
    assert r.e2e_s[0] - r.ttft_s[0] == pytest.approx(xfer(n_in) + decode, rel=1e-9)
    # 2000 tokens x 131,072 B/token over 2 GPUs x 50 GB/s = 2.6 ms + 50 us latency
    assert xfer(n_in) == pytest.approx(50e-6 + 2000 * 131072 / (2 * 50e9), rel=1e-12)


def test_chunked_prefill_splits_long_prompt() -> None:
    lim = EngineLimits(8, 1000, 400)
    r = simulate(one(2500, 2), MODEL, lim, Topology(colocated=1), "round_robin")
    chunks = [(0, 1000), (1000, 1000), (2000, 500)]
    expect = sum(MODEL.step_s(c, prefill_pairs(d, c), 0, 0) for d, c in chunks)
    assert r.ttft_s[0] == pytest.approx(expect, rel=1e-12)


def shared_prefix_workload(n: int = 400, seed: int = 0, rate: float = 6.0) -> Workload:
    return synthetic(
        n,
        rate,
        [RequestClass(1.0, 100, 1500, 20, 200)],
        seed,
        prefix_groups=4,
        prefix_tokens=1024,
        turns=2,
        think_time_s=5.0,
    )


@pytest.mark.parametrize(
    "topo,router", [(Topology(colocated=2), "prefix_aware"), (Topology(prefill=1, decode=2), "least_loaded")]
)
def test_decode_runs_equal_per_token_stepping(topo: Topology, router: str) -> None:
    """One event per batch change (closed-form decode runs, cut by arrivals) == one event per token."""
    w = shared_prefix_workload()
    lim = EngineLimits(32, 2048, 60)  # small KV: admissions wait and prefixes get evicted
    m = planner_model(SPEC, HW, dataclasses.replace(ENG, decode_seq_ms=0.3))  # with a per-row cost
    a = simulate(w, m, lim, topo, router, kv_transfer_s=xfer)
    b = simulate(w, m, lim, topo, router, kv_transfer_s=xfer, macro=False)
    assert a.events * 3 < b.events
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    assert np.array_equal(a.hit_tokens, b.hit_tokens)


def test_simpy_and_heapq_loops_identical_and_deterministic() -> None:
    w = shared_prefix_workload(300, seed=1)
    runs = [
        simulate(w, MODEL, LIMITS, Topology(colocated=3), "prefix_aware", engine=e) for e in ("simpy", "heapq", "simpy")
    ]
    for r in runs[1:]:
        assert np.array_equal(runs[0].finish_s, r.finish_s) and np.array_equal(runs[0].first_token_s, r.first_token_s)
        assert runs[0].events == r.events


def test_littles_law() -> None:
    """L = lambda W for the whole system and for the admission queue, with L integrated by the event loop."""
    w = fixed_lengths(3000, 40.0, 800, 100, seed=2)
    r = simulate(w, MODEL, LIMITS, Topology(colocated=2), "least_loaded")
    lt = r.little
    lam = len(w) / lt["horizon_s"]
    assert lt["area_in_system"] / lt["horizon_s"] == pytest.approx(lam * float(np.mean(r.e2e_s)), rel=1e-9)
    wq = float(np.mean(r.admit_s - r.arrival_s))
    assert wq > 0.0  # the load queues, so the identity is not 0 = 0
    assert lt["area_waiting"] / lt["horizon_s"] == pytest.approx(lam * wq, rel=1e-9)


def test_md1_mean_wait() -> None:
    """One replica, one request at a time, deterministic service D = prefill(512): an M/D/1 queue.

    Pollaczek-Khinchine: Wq = rho D / (2 (1 - rho)). At rho = 0.5 with 60k requests, seeds 0-5 land within 3 %
    (M/M/1 would be 100 % off); tolerance 5 %.
    """
    n_in, rho = 512, 0.5
    service = MODEL.prefill_s(n_in)
    w = fixed_lengths(60_000, rho / service, n_in, 1, seed=0)
    r = simulate(w, MODEL, EngineLimits(1, n_in, 100), Topology(colocated=1), "round_robin", engine="heapq")
    assert np.allclose(r.ttft_s - (r.admit_s - r.arrival_s), service, rtol=1e-9)
    wq = float(np.mean(r.admit_s - r.arrival_s))
    assert wq == pytest.approx(rho * service / (2 * (1 - rho)), rel=0.05)


def test_kv_capacity_bounds_running_requests() -> None:
    # every request needs ceil((1000 + 100) / 512) = 3 blocks; 9 blocks -> at most 3 hold KV at once
    w = fixed_lengths(200, 50.0, 1000, 100, seed=3)
    r = simulate(w, MODEL, EngineLimits(64, 4096, 9), Topology(colocated=1), "round_robin")
    assert np.isfinite(r.finish_s).all()
    assert max_overlap(r.admit_s, r.finish_s) == 3


def test_request_larger_than_kv_raises() -> None:
    with pytest.raises(ValueError, match=r"request 0 needs 3 KV blocks .* holds 2"):
        simulate(one(1000, 100), MODEL, EngineLimits(8, 4096, 2), Topology(colocated=1), "round_robin")


def test_prefix_aware_router_finds_cached_prefixes() -> None:
    """32 system prompts of 4 blocks = 128 blocks of prefixes, 60 KV blocks per replica: spraying requests makes
    every replica cache everything (and thrash); routing by cached prefix partitions the prefixes."""
    w = synthetic(
        800,
        8.0,
        [RequestClass(1.0, 100, 1500, 20, 200)],
        4,
        prefix_groups=32,
        prefix_tokens=2048,
        turns=2,
        think_time_s=5.0,
    )
    lim = EngineLimits(64, 4096, 60)
    hit = {
        rt: simulate(w, MODEL, lim, Topology(colocated=4), rt).prefix_hit_rate
        for rt in ("round_robin", "prefix_aware", "session_affinity")
    }
    assert hit["prefix_aware"] > 2 * hit["round_robin"]
    assert hit["session_affinity"] > hit["round_robin"] + 0.1


def test_session_affinity_keeps_sessions_on_one_replica() -> None:
    w = shared_prefix_workload(300, seed=5)
    r = simulate(w, MODEL, LIMITS, Topology(colocated=3), "session_affinity")
    for s in np.unique(w.session):
        assert len(np.unique(r.replica[w.session == s])) == 1
    assert len(np.unique(r.replica)) == 3


def test_closed_loop_concurrency() -> None:
    w = fixed_lengths(40, 1.0, 500, 20, seed=6)
    r1 = simulate(w, MODEL, LIMITS, Topology(colocated=1), "round_robin", closed_concurrency=1)
    np.testing.assert_allclose(r1.arrival_s[1:], r1.finish_s[:-1], rtol=0, atol=0)
    r4 = simulate(w, MODEL, LIMITS, Topology(colocated=1), "round_robin", closed_concurrency=4)
    assert max_overlap(r4.arrival_s, r4.finish_s) == 4
    assert r4.makespan_s < r1.makespan_s / 2  # batching 4 streams beats 1


def test_pd_removes_prefill_interference_from_tpot() -> None:
    """DistServe's argument: long prompts prefilled in the same steps stretch colocated decode steps (TPOT)."""
    w = fixed_lengths(600, 10.0, 3500, 200, seed=7)  # a 3500-token prefill step ~ 11 decode steps (62 vs 5.5 ms)
    colo = simulate(w, MODEL, LIMITS, Topology(colocated=2), "least_loaded")
    pd = simulate(w, MODEL, LIMITS, Topology(prefill=1, decode=1), "least_loaded", kv_transfer_s=xfer)
    assert np.percentile(pd.tpot_s, 99) < 0.8 * np.percentile(colo.tpot_s, 99)
    # ... and pays for it in TTFT: one prefill replica instead of two
    assert np.percentile(pd.ttft_s, 50) > 1.1 * np.percentile(colo.ttft_s, 50)


def test_table_step_time_from_serve_bench(tmp_path: Path) -> None:
    rows = [
        {"concurrency": 1, "ttft_p50_ms": 50.0, "tpot_p50_ms": 10.0},
        {"concurrency": 16, "ttft_p50_ms": 80.0, "tpot_p50_ms": 14.0},
        {"concurrency": None, "request_rate": 2.0, "ttft_p50_ms": 1.0, "tpot_p50_ms": 1.0},
    ]
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"job": "serve_bench", "rows": rows}))
    t = TableStepTime.from_serve_bench(p, input_tokens=1000)
    assert t.prefill_s_per_token == pytest.approx(50e-6)
    assert t.decode_step_s(1) == pytest.approx(0.010) and t.decode_step_s(16) == pytest.approx(0.014)
    assert t.decode_step_s(31) == pytest.approx(0.018)  # extrapolates the last segment
    assert t.decode_run_s(4, 0, 10) == pytest.approx(10 * t.decode_step_s(4))
    p.write_text(json.dumps({"rows": [{"concurrency": 4, "ttft_p50_ms": 5.0}]}))
    with pytest.raises(ValueError, match=r"rows\[0\] lacks numeric tpot_p50_ms"):
        TableStepTime.from_serve_bench(p, input_tokens=10)


def test_table_step_time_with_measured_prefill_points() -> None:
    """A measured profile (phase6.fleet.papers: Splitwise's) prices prefill by tokens in the step, linearly between
    its points (superlinear where the profile is), and a step with decode rows adds the decode step at that batch."""
    t = TableStepTime(0.0, [(1, 0.030), (64, 0.050)], "profile", [(512, 0.054), (2048, 0.134), (4096, 0.376)])
    assert t.step_s(1024, 0.0, 0, 0) == pytest.approx(0.054 + 0.080 * 512 / 1536)
    assert t.step_s(3072, 0.0, 0, 0) == pytest.approx(0.255)
    assert t.step_s(100, 0.0, 0, 0) == pytest.approx(0.054)  # flat below the first point
    assert t.step_s(2048, 0.0, 64, 10_000) == pytest.approx(0.134 + 0.050)
    assert t.step_s(0, 0.0, 64, 10_000) == pytest.approx(0.050)
    with pytest.raises(ValueError, match="prefill points"):
        TableStepTime(0.0, [(1, 0.03)], "bad", [(0, 0.01)])


def test_pd_prefill_replica_resumes_when_transfers_free_its_kv() -> None:
    """Saturated decode pool: prefill KV stays held until the decode side has room; a prefill replica blocked on that
    KV must restart when a transfer frees it (regression: it idled forever and requests never finished)."""
    w = fixed_lengths(300, 50.0, 600, 200, seed=8)  # 2 blocks at the prefill side, 2 at the decode side
    r = simulate(w, MODEL, EngineLimits(64, 4096, 6), Topology(prefill=2, decode=1), "least_loaded", kv_transfer_s=xfer)
    assert np.isfinite(r.finish_s).all()
    # prompt done, not finished: <= 3 holding KV at the decode replica + 2 x 3 still held at the prefill replicas
    assert max_overlap(r.first_token_s, r.finish_s) == 9


class ReferenceStepTime:
    """ServeCostModel's step formulas evaluated from scratch on every call (none of its per-token-count caches)."""

    def __init__(self, m: ServeCostModel) -> None:
        self.m = m

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        m, tokens = self.m, prefill_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        step = max(m.compute_s(tokens, prefill_pairs + decode_ctx), m.memory_s(tokens, decode_ctx))
        step = step + m._allreduce_uncached(tokens) + m.p2p_s + m.overhead_s
        return step + m.prefill_overhead_s if prefill_tokens > 0 else step

    def decode_run_s(self, d: int, ctx: int, k: int) -> float:
        m = self.m
        if d <= 0 or k <= 0:
            return 0.0
        c0, c1 = m.compute_s(d, ctx), m.attn_flops_per_pair * d / m.flops_per_s
        m0, m1 = m.memory_s(d, ctx), m.kv_bytes_per_token * d / m.bytes_per_s
        fixed = k * (m._allreduce_uncached(d) + m.p2p_s + m.overhead_s)
        if c1 == m1:
            return k * max(c0, m0) + (c1 * k * (k - 1) / 2) + fixed
        switch = min(max(math.ceil((m0 - c0) / (c1 - m1)), 0), k)

        def arith(a: float, b: float, j0: int, j1: int) -> float:
            n = j1 - j0
            return n * a + b * n * (j0 + j1 - 1) / 2 if n > 0 else 0.0

        if c1 > m1:
            return arith(m0, m1, 0, switch) + arith(c0, c1, switch, k) + fixed
        return arith(c0, c1, 0, switch) + arith(m0, m1, switch, k) + fixed


FAST_ROUTE = Simulation._route


def reference_route(sim: Simulation, r: Any) -> tuple[Any, int]:
    """The prefix-aware rule evaluated on every replica with a full prefix match each (no candidate filter)."""
    if sim.router != "prefix_aware":
        return FAST_ROUTE(sim, r)
    best, best_cost, best_hit = sim.front[0], math.inf, 0
    for rep in sim.front:
        m = rep.cache.match(r.hid) if r.hid else 0
        hit = min(m * BLOCK_TOKENS, r.n_in - 1) if m else 0
        cost = rep.queued_prefill_tokens - hit
        if cost < best_cost or (cost == best_cost and rep.outstanding < best.outstanding):
            best, best_cost, best_hit = rep, cost, hit
    return best, best_hit


def bisect_first_step(run_s: Any, d: int, s: int, k: int, elapsed: float) -> int:
    lo, hi = 1, k
    while lo < hi:
        mid = (lo + hi) // 2
        if run_s(d, s, mid) >= elapsed:
            hi = mid
        else:
            lo = mid + 1
    return lo


@pytest.mark.parametrize(
    "topo,router",
    [
        (Topology(colocated=4), "prefix_aware"),
        (Topology(prefill=2, decode=2), "prefix_aware"),
        (Topology(colocated=3), "session_affinity"),
    ],
)
def test_fast_paths_equal_straightforward_versions(topo: Topology, router: str, monkeypatch: Any) -> None:
    """The speed work (prefix router scoring only replicas that hold the first block, cached step-time terms,
    bracketed search for where an arrival cuts a decode run) changes no result bit: same times, hits, replicas and
    evictions as the straightforward versions, with step and prefill overheads and TP all-reduces in the step times."""
    w = synthetic(
        1500,
        12.0,
        [RequestClass(1.0, 100, 3000, 20, 300)],
        3,
        prefix_groups=12,
        prefix_tokens=2048,
        turns=3,
        think_time_s=2.0,
    )
    model = planner_model(
        SPEC,
        HW,
        dataclasses.replace(
            ENG, step_overhead_ms=2.5, prefill_overhead_ms=30.0, prefill_mfu=0.4, mixed_step="overlap"
        ),  # the reference below is the planner's max formula; the serial mixed step has its own test
    )
    lim = EngineLimits(32, 2048, 40)  # small KV: evictions and admission waits
    fast = simulate(w, model, lim, topo, router, kv_transfer_s=xfer)
    monkeypatch.setattr(Simulation, "_route", reference_route)
    monkeypatch.setattr(sim_module, "_first_step_reaching", bisect_first_step)
    ref = simulate(w, ReferenceStepTime(model), lim, topo, router, kv_transfer_s=xfer)
    for key in ("arrival_s", "first_token_s", "finish_s", "admit_s", "hit_tokens", "replica"):
        assert np.array_equal(getattr(fast, key), getattr(ref, key)), key
    assert fast.evictions == ref.evictions > 100 and fast.events == ref.events
    assert fast.prefix_hit_rate > 0.1


def test_incremental_kv_preempts_by_recompute_and_runs_equal_per_token_stepping() -> None:
    """engine.kv_alloc=incremental (vLLM): prompts admitted on their prompt blocks, KV grows per token, and when a
    block is missing the newest request is preempted and recomputed. Closed-form runs == one event per token; with
    ample KV nothing is preempted and TPOT equals the reserving model's; under pressure requests are preempted,
    every one still finishes with its own token count, and reserving whole outputs admits later (higher TTFT)."""
    w = synthetic(300, 20.0, [RequestClass(1.0, 300, 1200, 200, 900)], 3)
    inc = EngineLimits(64, 4096, 40, incremental_kv=True)
    a = simulate(w, MODEL, inc, Topology(colocated=2), "least_loaded")
    b = simulate(w, MODEL, inc, Topology(colocated=2), "least_loaded", macro=False)
    assert a.preemptions > 0 and a.preemptions == b.preemptions
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    assert np.all(np.isfinite(a.finish_s)) and np.all(a.finish_s > a.first_token_s)
    # long prompts in several chunks: requests are also preempted while prefilling, before their first token
    w2 = synthetic(200, 10.0, [RequestClass(1.0, 1500, 3000, 400, 1200)], 4)
    c = simulate(w2, MODEL, EngineLimits(64, 256, 24, incremental_kv=True), Topology(colocated=2), "least_loaded")
    d = simulate(w2, MODEL, EngineLimits(64, 256, 24, incremental_kv=True), Topology(2), "least_loaded", macro=False)
    assert c.preemptions > 0 and np.all(np.isfinite(c.first_token_s)) and np.all(c.finish_s > c.first_token_s)
    np.testing.assert_allclose(c.finish_s, d.finish_s, rtol=0, atol=1e-9)
    tail, _ = a.token_gaps
    assert np.all(np.isfinite(tail[a.output_tokens > 2]))
    res = simulate(w, MODEL, EngineLimits(64, 4096, 40), Topology(colocated=2), "least_loaded")
    assert res.preemptions == 0 and np.median(res.ttft_s) > np.median(a.ttft_s)
    roomy = [
        simulate(w, MODEL, EngineLimits(64, 4096, 4000, incremental_kv=k), Topology(2), "least_loaded") for k in (0, 1)
    ]
    assert roomy[1].preemptions == 0
    np.testing.assert_allclose(roomy[0].finish_s, roomy[1].finish_s, rtol=0, atol=1e-9)


def test_request_overhead_is_charged_once_per_request_outside_the_steps() -> None:
    """engine.request_overhead_ms (vLLM's API server, tokenisation, hand-off): TTFT and E2E grow by it, no step does
    (TPOT and the step log unchanged), a closed loop's next request still leaves when the last one finishes, and
    Little's law holds with the time before the engine counted in the system."""
    d = 0.0173
    base = simulate(one(3000, 64), MODEL, LIMITS, Topology(colocated=1), "round_robin")
    r = simulate(one(3000, 64), MODEL, LIMITS, Topology(colocated=1), "round_robin", request_delay_s=d)
    assert r.ttft_s[0] == pytest.approx(base.ttft_s[0] + d, rel=1e-12)
    assert r.tpot_s[0] == pytest.approx(base.tpot_s[0], rel=1e-12)
    assert r.busy_s == pytest.approx(base.busy_s, rel=1e-12)  # the replica did the same work
    w = fixed_lengths(40, 1.0, 500, 20, seed=6)
    c0 = simulate(w, MODEL, LIMITS, Topology(colocated=1), "round_robin", closed_concurrency=1)
    c1 = simulate(w, MODEL, LIMITS, Topology(colocated=1), "round_robin", closed_concurrency=1, request_delay_s=d)
    np.testing.assert_allclose(c1.arrival_s[1:], c1.finish_s[:-1], rtol=0, atol=1e-12)
    assert c1.makespan_s == pytest.approx(c0.makespan_s + len(w) * d, rel=1e-9)  # one delay per request, in series
    np.testing.assert_allclose(c1.ttft_s, c0.ttft_s + d, rtol=0, atol=1e-9)
    np.testing.assert_allclose(c1.tpot_s, c0.tpot_s, rtol=1e-9)
    o = simulate(
        fixed_lengths(3000, 40.0, 800, 100, seed=2), MODEL, LIMITS, Topology(2), "least_loaded", request_delay_s=d
    )
    lt = o.little
    assert lt["area_in_system"] / lt["horizon_s"] == pytest.approx(len(o.e2e_s) / lt["horizon_s"] * np.mean(o.e2e_s))
    with pytest.raises(ValueError, match="engine.request_overhead_ms"):
        simulate(one(10, 2), MODEL, LIMITS, Topology(colocated=1), "round_robin", request_delay_s=-1.0)


def test_engine_cost_defaults_follow_the_profile() -> None:
    """null step_overhead_ms / decode_seq_ms / request_overhead_ms take the profile's own measured values (vLLM's for
    vllm, phase6's engine's for torch-tp); an explicit value wins; switching the profile switches the defaults."""
    from phase6.config.fleet import PROFILE_DEFAULTS

    v, t = EngineConfig(), EngineConfig(profile="torch-tp")
    got = {
        p: (e.resolved_step_overhead_ms, e.resolved_decode_seq_ms, e.resolved_request_overhead_ms)
        for p, e in (("vllm", v), ("torch-tp", t))
    }
    assert got == {"vllm": (0.0, 0.0066, 8.8), "torch-tp": (5.0, 0.06, 0.0)}
    assert set(PROFILE_DEFAULTS) == {"vllm", "vllm-v0", "torch-tp"}
    v0 = EngineConfig(chunked_prefill=False)  # vLLM V0's scheduler: not vLLM 0.26, keeps the earlier stand-ins
    assert (v0.resolved_step_overhead_ms, v0.resolved_decode_seq_ms, v0.resolved_request_overhead_ms) == (5.0, 0.06, 0)
    assert dataclasses.replace(v, profile="torch-tp").resolved_step_overhead_ms == 5.0
    assert EngineConfig(step_overhead_ms=2.5, request_overhead_ms=0.0).resolved_step_overhead_ms == 2.5
    assert EngineConfig(request_overhead_ms=0.0).resolved_request_overhead_ms == 0.0
    assert planner_model(SPEC, HW, EngineConfig(tp=2)).overhead_s == 0.0
    assert planner_model(SPEC, HW, EngineConfig(tp=2, profile="torch-tp")).overhead_s == pytest.approx(5e-3)
    for k in ("step_overhead_ms", "decode_seq_ms", "request_overhead_ms"):
        with pytest.raises(ValueError, match=f"engine.{k}"):
            EngineConfig(**{k: -1.0})
