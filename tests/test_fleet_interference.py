"""Issue 23: sessions after the shared prefix, per-token gaps and TBT goodput, mixed-step cost, vLLM V0 scheduling,
host-memory KV tier, per-phase PD TP. Small fixtures only (no ../shared)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.config.slo import SLOConfig
from phase6.fleet.analysis import summarize
from phase6.fleet.interference import SerialKernelStepTime
from phase6.fleet.papers import setup_for
from phase6.fleet.sessions import concentration_warning, replica_share, session_keys
from phase6.fleet.sim import EngineLimits, Topology, simulate
from phase6.fleet.steptime import build_step_model, planner_model
from phase6.fleet.tokens import token_gap_total
from phase6.fleet.workload import RequestClass, Workload, load_mooncake, synthetic
from phase6.plan.model import resolve_model
from phase6.plan.serve import ServeCostModel

SPEC = resolve_model("llama3.1-8b")
HW = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h100_sxm.yaml").read_text()))
ENG = EngineConfig(tp=1)


def shared_prefix_trace(path: Path, sessions: int = 40, turns: int = 5, with_ids: bool = False) -> Path:
    """A Mooncake-format trace whose every request starts with the same 2-block system prompt (ids 0, 1), then its
    conversation: turn t repeats the earlier turns' blocks and adds one (chained ids, as in the real traces)."""
    rows = []
    nxt = 2
    convs: list[list[int]] = [[] for _ in range(sessions)]
    t = 0
    for _turn in range(turns):
        for s in range(sessions):
            convs[s].append(nxt)
            nxt += 1
            hid = [0, 1, *convs[s]]
            row = {"timestamp": t, "input_length": 512 * len(hid), "output_length": 64, "hash_ids": hid}
            if with_ids:
                row["session_id"] = f"chat-{s}"
            rows.append(row)
            t += 50
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sessions_key_on_the_first_non_shared_block(tmp_path: Path) -> None:
    w = load_mooncake(shared_prefix_trace(tmp_path / "t.jsonl"))
    assert len(set(w.session.tolist())) == 40  # one key per conversation, not one for the whole trace
    first_block = np.asarray([h[0] for h in w.hash_ids])  # the old key
    assert len(set(first_block.tolist())) == 1
    # every turn of a conversation keeps its key
    by_conv = {h[2]: k for h, k in zip(w.hash_ids, w.session.tolist(), strict=True)}
    assert all(by_conv[h[2]] == k for h, k in zip(w.hash_ids, w.session.tolist(), strict=True))
    ids = load_mooncake(shared_prefix_trace(tmp_path / "u.jsonl", with_ids=True))
    assert len(set(ids.session.tolist())) == 40


def test_session_affinity_spreads_a_shared_first_block_trace_and_warns_when_it_does_not(tmp_path: Path) -> None:
    w = load_mooncake(shared_prefix_trace(tmp_path / "t.jsonl")).at_rate(20.0)
    lim = EngineLimits(64, 8192, 400)
    model = planner_model(SPEC, HW, ENG)
    r = simulate(w, model, lim, Topology(colocated=4), "session_affinity")
    _, share = replica_share(r.replica)
    assert share <= 2 / 4 and concentration_warning("session_affinity", "colocated", r.replica, 4) is None
    # the same conversations stay on one replica
    conv = np.asarray([h[2] for h in w.hash_ids])
    assert all(len(set(r.replica[conv == c].tolist())) == 1 for c in set(conv.tolist()))
    # keyed on the first block (the old rule): everything on one replica, and the warning says so
    old = Workload(w.arrival_s, w.input_tokens, w.output_tokens, np.zeros(len(w), np.int64), w.hash_ids, w.source)
    r0 = simulate(old, model, lim, Topology(colocated=4), "session_affinity")
    assert replica_share(r0.replica)[1] == 1.0
    msg = concentration_warning("session_affinity", "colocated", r0.replica, 4)
    assert msg is not None and "100%" in msg and "1/4" in msg


def test_session_keys_of_a_request_inside_the_shared_prefix_are_its_own() -> None:
    hid = [(0, 1, 10 + i) for i in range(10)] + [(0,), (0, 1)]
    k = session_keys(hid)
    assert len(set(k[:10].tolist())) == 10 and k[10] < 0 and k[11] < 0 and k[10] != k[11]


def _one_long_prefill_among_decodes(chunked: bool) -> tuple[np.ndarray, np.ndarray, object]:
    """8 short requests decoding, then one 6000-token prompt arrives."""
    n = 9
    arr = np.r_[np.zeros(8), 0.5]
    inp = np.r_[np.full(8, 100), 6000]
    out = np.r_[np.full(8, 200), 5]
    w = Workload(arr, inp.astype(np.int64), out.astype(np.int64), np.arange(n), None, "t")
    eng = dataclasses.replace(ENG, chunked_prefill=chunked, max_num_batched_tokens=8192)
    model = planner_model(SPEC, HW, eng)
    r = simulate(w, model, EngineLimits(64, 8192, 400, chunked), Topology(colocated=1), "round_robin")
    return r.token_gaps[0], r.token_gaps[1], (r, model)


@pytest.mark.parametrize("chunked", [True, False])
def test_token_gaps_count_every_token_and_show_the_stall(chunked: bool) -> None:
    tail, worst, (r, model) = _one_long_prefill_among_decodes(chunked)
    for i in range(9):  # every request's logged steps are exactly its output tokens - 1
        assert token_gap_total(r.logs, int(r.decode_replica[i]), r.join_s[i], r.finish_s[i]) == r.output_tokens[i] - 1
    prefill = model.step_s(6000, 6000 * 6001 / 2, 0, 0)
    decode = model.decode_run_s(8, 8 * 200, 1)
    # the 8 decoding requests wait for the long prefill: their worst gap is at least that step
    assert np.all(worst[:8] >= prefill * 0.99)
    assert np.all(worst[:8] > 10 * decode)
    # ... which the per-request mean (TPOT) spreads over 199 gaps
    assert np.all(r.tpot_s[:8] < worst[:8] / 5)
    # mean of the slowest 10 % (20 gaps): the stall plus 19 ordinary steps
    assert np.all(tail[:8] > worst[:8] / 20) and np.all(tail[:8] < worst[:8])


def test_tbt_slo_makes_stalled_requests_bad() -> None:
    _, _, (r, _) = _one_long_prefill_among_decodes(False)
    hw = HW
    loose = summarize(r, SLOConfig(ttft_ms=60_000, tpot_ms=1000), hw)
    tight = summarize(r, SLOConfig(ttft_ms=60_000, tpot_ms=1000, tbt_ms=20.0), hw)
    assert loose["slo_attainment"] == 1.0
    assert tight["slo_attainment"] == pytest.approx(1 / 9)  # only the long request itself (5 tokens, after it)
    assert tight["tbt_tail_p50_ms"] > 20.0


def test_serial_mixed_step_adds_the_decode_kv_read() -> None:
    hw = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "a100_80gb.yaml").read_text()))
    spec = resolve_model("llama3.1-70b")
    eng = EngineConfig(tp=8, decode_seq_ms=0.0, mixed_step="serial")
    serial = planner_model(spec, hw, eng)
    over = planner_model(spec, hw, dataclasses.replace(eng, mixed_step="overlap"))
    assert isinstance(serial, SerialKernelStepTime) and serial.serial and not over.serial
    plain = ServeCostModel(spec, hw, tp=8, efficiency=over.eff)
    assert over.step_s(300, 300 * 301 / 2, 40, 40 * 900) == plain.step_s(300, 300 * 301 / 2, 40, 40 * 900)
    p, pairs, d, ctx = 8192, 8192 * 8193 / 2, 100, 100 * 12_000
    kv_read = serial.kv_bytes_per_token * ctx / serial.bytes_per_s
    # the example: the mixed step costs the GEMMs over all p + d tokens, the chunk's attention and the
    # decodes' KV read (~40 ms here), serially
    assert serial.step_s(p, pairs, d, ctx) == pytest.approx(over.step_s(p + d, pairs, 0, 0) + kv_read, rel=1e-3)
    assert serial.step_s(p, pairs, d, ctx) - over.step_s(p, pairs, d, ctx) > 0.5 * kv_read  # the max hides the read
    # pure steps and decode runs are the planner's exactly
    assert serial.step_s(p, pairs, 0, 0) == over.step_s(p, pairs, 0, 0)
    assert serial.decode_run_s(64, 64 * 3000, 17) == over.decode_run_s(64, 64 * 3000, 17)


def test_global_host_tier_hits_more_than_local_and_loads_cost_time() -> None:
    w = synthetic(600, 6.0, [RequestClass(1.0, 200, 1500, 20, 60)], 5, prefix_groups=60, prefix_tokens=4096)
    hits = {}
    for tier in ("local", "global"):
        eng = dataclasses.replace(ENG, kv_blocks=30, host_kv_gib=8.0, host_tier=tier, max_num_seqs=16)
        st = setup_for(SPEC, HW, eng)
        res = st.run(w, Topology(colocated=4), "round_robin")
        hits[tier] = (res.prefix_hit_rate, res.host_hit_tokens)
    none = setup_for(SPEC, HW, dataclasses.replace(ENG, kv_blocks=30, max_num_seqs=16))
    base = none.run(w, Topology(colocated=4), "round_robin").prefix_hit_rate
    assert hits["local"][1] > 0 and hits["global"][1] > hits["local"][1]
    assert hits["global"][0] > hits["local"][0] > base


def test_pd_pools_with_their_own_tp() -> None:
    w = synthetic(200, 5.0, [RequestClass(1.0, 500, 1500, 50, 100)], 1)
    eng = dataclasses.replace(ENG, tp=2, prefill_tp=2, decode_tp=1)
    st = setup_for(SPEC, HW, eng)
    r = st.run(w, Topology(prefill=2, decode=3), "least_loaded")
    assert r.num_gpus == 2 * 2 + 3 * 1
    assert np.all(np.isfinite(r.finish_s)) and math.isfinite(summarize(r, SLOConfig(), HW)["tbt_tail_p50_ms"])


def _fleet(args: list[str], tmp_path: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "phase6", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=CONFIG_DIR.parent,
        env=env,
    )


def test_fleet_job_routes_a_shared_first_block_trace_and_warns_on_one_key(tmp_path: Path) -> None:
    common = [
        "workload=mooncake",
        "fleet.policies=[colocated]",
        "fleet.routers=[session_affinity]",
        "fleet.replicas=4",
        "load.rates=[20]",
        "model=llama3.1-8b",
        "engine.tp=1",
        "plots=false",
    ]
    good = shared_prefix_trace(tmp_path / "t.jsonl")
    p = _fleet([*common, f"workload.path={good}", f"run.dir={tmp_path / 'a'}"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning:" not in p.stdout
    # a trace that names one session for everything: all on one replica, and the run says so
    rows = [json.loads(line) for line in good.read_text().splitlines()]
    bad = tmp_path / "one.jsonl"
    bad.write_text("".join(json.dumps({**r, "session_id": "same"}) + "\n" for r in rows))
    p = _fleet([*common, f"workload.path={bad}", f"run.dir={tmp_path / 'b'}"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning: colocated / session_affinity sent 100% of the requests to replica" in " ".join(p.stdout.split())
    assert "Warnings" in (tmp_path / "b" / "results.md").read_text()


def test_papers_without_shared_data_is_one_line_exit_2(tmp_path: Path) -> None:
    p = _fleet(["experiment=papers", f"run.dir={tmp_path / 'p'}"], tmp_path, {"PHASE6_SHARED_DATA": str(tmp_path)})
    err = p.stderr.strip()
    assert p.returncode == 2 and err.startswith("phase6: error:") and "mooncake-traces/synthetic_trace.jsonl" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "p" / "results.json").exists()


def test_papers_claim_verdicts_and_splitwise_slo() -> None:
    from phase6.fleet.papers import Claim, splitwise_meets

    def row(direction: bool, magnitude: bool | None) -> str:
        return Claim("p", "c", "s", "1", "2", direction, magnitude).row()["agree"]

    assert row(True, True) == "agree" and row(True, None) == "agree"
    assert row(True, False) == "disagree" and row(False, None) == "disagree" and row(False, True) == "disagree"
    # Splitwise's percentile-slowdown SLO: met by a lightly loaded fleet, missed by an overloaded one
    w = synthetic(300, 1.0, [RequestClass(1.0, 200, 1500, 20, 200)], 3)
    st = setup_for(SPEC, HW, ENG)
    alone = setup_for(SPEC, HW, ENG)
    assert splitwise_meets(st.run(w.at_rate(0.5), Topology(prefill=1, decode=1), "least_loaded"), alone)
    assert not splitwise_meets(st.run(w.at_rate(200.0), Topology(prefill=1, decode=1), "least_loaded"), alone)


def test_splitwise_trace_batching_and_slowdown_as_splitwise_sim() -> None:
    """splitwise-sim's trace (Poisson at the rate for the stated seconds, lengths drawn from the trace's columns; a
    higher rate's trace starts with the same draws), its KV room (no GQA: 411 blocks of 512 on a DGX-H100) and its
    TBT slowdown ((E2E - TTFT) / output tokens against the unloaded token time read at the prompt size)."""
    from phase6.fleet.papers import SPLITWISE_SIM_KV_BLOCKS, splitwise_meets, splitwise_workload

    assert SPLITWISE_SIM_KV_BLOCKS == 411
    lengths = synthetic(500, 1.0, [RequestClass(1.0, 100, 3000, 5, 400)], 1)
    w = splitwise_workload(lengths, 50.0, 60.0)
    assert abs(len(w) - 3000) < 4 * math.sqrt(3000) and w.arrival_s[-1] < 60.0 and w.arrival_s[0] == 0.0
    gaps = np.diff(w.arrival_s)
    assert abs(gaps.mean() - 1 / 50) < 0.1 / 50 and abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential
    assert set(w.input_tokens.tolist()) <= set(lengths.input_tokens.tolist())
    assert set(w.output_tokens.tolist()) <= set(lengths.output_tokens.tolist())
    w2 = splitwise_workload(lengths, 100.0, 60.0)
    assert np.array_equal(w2.input_tokens[: len(w)], w.input_tokens)
    assert np.allclose(w2.arrival_s[: len(w)], w.arrival_s / 2)
    # one request alone on an idle fleet: its TTFT is the unloaded prefill, its (E2E - TTFT) / n is one step per token
    one = Workload(np.zeros(1), np.array([1000]), np.array([100]), np.zeros(1, dtype=np.int64), None, "one")
    st = setup_for(SPEC, HW, ENG)
    res = st.run(one, Topology(prefill=1, decode=1), "least_loaded")
    step = st.model.decode_run_s(1, 1001, 1)
    assert splitwise_meets(res, st, [(1.0, step * 1e3 / 1.2)])  # TBT slowdown 1.2 <= 1.25
    assert not splitwise_meets(res, st, [(1.0, step * 1e3 / 1.3)])  # 1.3 > 1.25


def test_decode_seq_cost_is_per_row_of_every_step() -> None:
    """engine.decode_seq_ms adds rows x cost to every step and decode run (vllm profile), and to every padded row of a
    torch-tp CUDA-graph decode (58 running rows compute the 64-row graph)."""
    hw = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text()))
    spec = resolve_model("llama3.1-8b")
    eng0 = EngineConfig(tp=1, decode_seq_ms=0.0)
    eng = dataclasses.replace(eng0, decode_seq_ms=0.25)
    m0, m = planner_model(spec, hw, eng0), planner_model(spec, hw, eng)
    for args in ((0, 0.0, 58, 58 * 700), (512, 512 * 513 / 2, 58, 58 * 700), (512, 512 * 513 / 2, 0, 0)):
        assert m.step_s(*args) - m0.step_s(*args) == pytest.approx(args[2] * 0.25e-3, abs=1e-12)
    assert m.decode_run_s(58, 58 * 700, 9) - m0.decode_run_s(58, 58 * 700, 9) == pytest.approx(9 * 58 * 0.25e-3)
    tt = dict(profile="torch-tp", cuda_graphs=True, max_num_seqs=64, max_num_batched_tokens=16384)
    t0 = build_step_model(spec, hw, dataclasses.replace(eng0, **tt))
    t1 = build_step_model(spec, hw, dataclasses.replace(eng, **tt))
    assert t1.padded_step_s(0, 0, 58, 700) - t0.padded_step_s(0, 0, 58, 700) == pytest.approx(64 * 0.25e-3)
    assert t1.padded_decode_run_s(58, 700, 5) - t0.padded_decode_run_s(58, 700, 5) == pytest.approx(5 * 64 * 0.25e-3)
    with pytest.raises(ValueError, match="engine.decode_seq_ms"):
        EngineConfig(decode_seq_ms=-1.0)
