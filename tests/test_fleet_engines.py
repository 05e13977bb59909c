"""Engine profile torch-tp (phase6.fleet.engines): the simulator follows phase6.serving.tp_server's mechanics.

- the CUDA-graph buckets and the admission rule are the server's own (checked against a real ``Engine`` and
  ``Scheduler._admit``);
- hand-computed step times: a 2-prompt prefill step of 100 + 900 tokens costs 2 x 900 padded tokens with every
  (query, key) pair of the padded squares; a decode step of 58 rows at context 1100 runs at the (64, 1536) bucket;
  a mixed step is decode forward + prefill forward;
- the simulator on a torch-tp replica: both prompts of that step get their first token at its end; closed-form decode
  runs across a KV-bucket edge equal per-step stepping; SimPy == heapq; PD, over-long requests and mismatched limits
  are refused by name.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.engines import TorchTPEngine, TorchTPStepTime, torch_tp_buckets
from phase6.fleet.run import model_spec
from phase6.fleet.sim import EngineLimits, Topology, simulate
from phase6.fleet.steptime import build_step_model, kv_capacity_blocks, planner_model
from phase6.fleet.workload import Workload

HW = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text()))
QWEN14 = Path(__file__).parent / "data" / "serve_bench_sweep_h200" / "qwen2.5-14b_config.json"
SPEC = model_spec(str(QWEN14))
TT = dict(max_num_seqs=64, max_num_batched_tokens=16384, max_model_len=4096, cuda_graphs=True)
ENG = EngineConfig(
    tp=1, profile="torch-tp", step_overhead_ms=5.0, prefill_overhead_ms=100.0, prefill_mfu=0.5, decode_seq_ms=0.0, **TT
)


def model(**kw: object) -> TorchTPStepTime:
    m = build_step_model(SPEC, HW, dataclasses.replace(ENG, **kw))
    assert isinstance(m, TorchTPStepTime)
    return m


def limits(eng: EngineConfig = ENG) -> EngineLimits:
    return EngineLimits(eng.max_num_seqs, eng.max_num_batched_tokens, kv_capacity_blocks(SPEC, HW, eng))


def workload(n_in: list[int], n_out: list[int], t: list[float] | None = None) -> Workload:
    n = len(n_in)
    arr = np.zeros(n) if t is None else np.asarray(t, dtype=float)
    return Workload(arr, np.asarray(n_in), np.asarray(n_out), np.arange(n, dtype=np.int64), None, "t")


# ---- the server's own rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mb,ml", [(64, 4096), (5, 256), (48, 1500), (1, 100)])
def test_buckets_are_the_servers(tmp_path: Path, mb: int, ml: int) -> None:
    """torch_tp_buckets == what tp_server.Engine builds for --max-batch / --max-model-len."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from phase6.serving.tp_server import ServerArgs
    from phase6.serving.tp_server.engine import Engine

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    cfg.save_pretrained(tmp_path)
    args = ServerArgs(model=str(tmp_path), dummy_weights=True, max_batch=mb, max_model_len=ml)
    engine = Engine(LlamaForCausalLM(cfg), args, torch.device("cpu"), 0, 1, None, static_decode=True)
    assert torch_tp_buckets(mb, ml) == (tuple(engine.batch_buckets), tuple(engine.kv_buckets))
    assert torch_tp_buckets(64, 4096) == (
        (1, 2, 4, 8, 16, 32, 64),
        (128, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096),
    )


@pytest.mark.parametrize(
    "running,prompts",
    [(0, [100, 900, 500]), (0, [3000, 10, 10]), (0, [900, 900, 200, 50]), (6, [10, 10, 10]), (0, [2500, 2600])],
)
def test_admission_is_the_schedulers(running: int, prompts: list[int]) -> None:
    """TorchTPEngine.admitted_width == tp_server.Scheduler._admit (8 rows, 2000 padded tokens): FCFS whole prompts
    while rows are free and (prompts) x (longest) <= the budget; the first always goes."""
    from phase6.serving.tp_server import ServerArgs
    from phase6.serving.tp_server.scheduler import GenParams, Request, Scheduler

    args = ServerArgs(model=str(QWEN14), dummy_weights=True, max_batch=8, max_prefill_tokens=2000)
    sched = Scheduler(None, args, set(), 100)  # type: ignore[arg-type]  # _admit touches no engine
    sched.active = [None] * running  # type: ignore[list-item]
    sched.waiting = deque(Request(str(i), GenParams([1] * p, 1), lambda evs: None) for i, p in enumerate(prompts))
    admitted = sched._admit()
    tt = TorchTPEngine(max_batch=8, max_prefill_tokens=2000)
    n, width = tt.admitted_width(running, prompts)
    assert n == len(admitted) and width == max((len(r.params.prompt_ids) for r in admitted), default=0)
    # the simulator's replica admits the same step: the prompts arrive while a 50-token request's prefill runs
    # (simultaneous arrivals at an idle replica would start a step with the first alone), so the next step has that
    # request decoding (1 row busy) and admits by the same rule
    if running == 0:
        eng = dataclasses.replace(ENG, max_num_seqs=8, max_num_batched_tokens=2000)
        k = len(prompts)
        w = workload([50, *prompts], [2] + [3] * k, [0.0] + [1e-6] * k)
        res = simulate(w, build_step_model(SPEC, HW, eng), limits(eng), Topology(1), "round_robin")
        first = res.first_token_s[1:]
        assert (first == first.min()).sum() == tt.admitted_width(1, prompts)[0]


# ---- hand-computed step times ----------------------------------------------------------------------------------
N_MM = SPEC.num_matmul_params()
PAIR_FLOPS = 4.0 * 48 * 40 * 128  # Qwen2.5-14B: layers x query heads x head_dim, 4 FLOPs per (query, key) pair
KV_BYTES = 2 * 48 * 8 * 128 * 2  # K and V, 48 layers, 8 KV heads, head_dim 128, bf16 = 196,608 B per token
FLOPS = 989.4e12 * 0.5  # H200 bf16 peak x prefill_mfu
BW = 4.8e12 * 0.7  # H200 HBM x decode_hbm_efficiency
WEIGHTS = SPEC.num_params() * 2.0


def test_two_prompt_prefill_pays_the_padded_square() -> None:
    """Prompts of 100 and 900 tokens in one step run as a (2, 900) batch: 1800 tokens through the matmuls and
    2 x 900 x 900 attention pairs (a boolean mask, so no causal skipping), + the fixed overheads."""
    assert SPEC.num_layers == 48 and SPEC.num_heads == 40 and SPEC.head_dim == 128 and SPEC.num_kv_heads == 8
    m = model()
    compute = (2 * N_MM * 1800 + PAIR_FLOPS * 2 * 900 * 900) / FLOPS
    assert compute > WEIGHTS / BW  # compute-bound
    want = 0.005 + compute + 0.100
    assert m.padded_step_s(2, 900, 0, 0) == pytest.approx(want, rel=1e-12)
    assert m.padded_step_s(2, 900, 0, 0) > m.padded_step_s(1, 1000, 0, 0)  # padding costs more than the 1000 real
    # the simulator: both arrive while a 50-token request's prefill runs, so the next step decodes that request
    # (1 row at context 51 -> the (1, 128) graph) and prefills both padded; each first token comes at its end
    w = workload([50, 100, 900], [2, 2, 2], [0.0, 1e-6, 1e-6])
    res = simulate(w, m, limits(), Topology(1), "round_robin")
    step1 = m.idle_prefill_s(50)
    step2 = want + (WEIGHTS + 1 * 128 * KV_BYTES) / BW
    assert res.first_token_s[1:].tolist() == pytest.approx([step1 + step2] * 2, rel=1e-12)
    # the vllm profile charges the 1000 real tokens with causal pairs in one step: cheaper
    vllm = planner_model(SPEC, HW, dataclasses.replace(ENG, profile="vllm"))
    res_v = simulate(w, vllm, limits(), Topology(1), "round_robin")
    assert res_v.first_token_s[1:].max() - res_v.first_token_s[0] < 0.8 * step2


def test_decode_step_runs_at_the_bucket() -> None:
    """58 running rows, the longest at 1100 tokens -> the (64, 1536) graph: 64 rows of weights-matmuls and
    64 x 1536 positions of KV read, memory-bound at 0.7 x 4.8 TB/s, + the 5 ms step overhead."""
    m = model()
    assert m.engine.decode_shape(58, 1100) == (64, 1536)
    assert m.engine.decode_shape(58, 1024) == (64, 1024) and m.engine.decode_shape(58, 1025) == (64, 1536)
    assert m.engine.decode_shape(1, 129) == (1, 256) and m.engine.decode_shape(33, 4000) == (64, 4096)
    want = 0.005 + (WEIGHTS + 64 * 1536 * KV_BYTES) / BW
    assert (2 * N_MM * 64 + PAIR_FLOPS * 64 * 1536) / FLOPS < want - 0.005  # memory-bound
    assert m.padded_step_s(0, 0, 58, 1100) == pytest.approx(want, rel=1e-12)
    assert m.padded_decode_run_s(58, 1100, 1) == pytest.approx(want, rel=1e-12)
    # every batch in (32, 64] and every context in (1024, 1536] costs the same step
    assert m.padded_step_s(0, 0, 33, 1025) == m.padded_step_s(0, 0, 64, 1536) == m.padded_step_s(0, 0, 58, 1100)
    # eager decode (no --cuda-graphs): exact batch, every row reads the longest row's KV
    e = model(cuda_graphs=False)
    assert e.engine.decode_shape(58, 1100) == (58, 1100)
    assert e.padded_step_s(0, 0, 58, 1100) == pytest.approx(0.005 + (WEIGHTS + 58 * 1100 * KV_BYTES) / BW, rel=1e-12)


def test_mixed_step_is_two_forwards() -> None:
    """A step with decode rows and a prefill is the decode forward + the prefill forward (weights read twice) + one
    step overhead + the prefill overhead."""
    m = model()
    dec = (WEIGHTS + 64 * 1536 * KV_BYTES) / BW
    pre = (2 * N_MM * 600 + PAIR_FLOPS * 600 * 600) / FLOPS
    assert m.padded_step_s(1, 600, 58, 1100) == pytest.approx(0.005 + dec + pre + 0.100, rel=1e-12)


def test_decode_run_across_a_bucket_edge() -> None:
    """The closed-form run sums per-bucket segments: 10 steps from context 1020 = 5 at 1024 + 5 at 1536."""
    for graphs in (True, False):
        m = model(cuda_graphs=graphs)
        per_step = sum(m.padded_step_s(0, 0, 40, 1020 + j) for j in range(10))
        assert m.padded_decode_run_s(40, 1020, 10) == pytest.approx(per_step, rel=1e-12)
    m = model()
    assert m.padded_decode_run_s(40, 1020, 10) == pytest.approx(
        5 * m.padded_step_s(0, 0, 40, 1024) + 5 * m.padded_step_s(0, 0, 40, 1536), rel=1e-12
    )
    with pytest.raises(ValueError, match="--max-model-len 4096"):
        m.padded_decode_run_s(4, 4090, 10)


def test_single_request_ttft_and_tpot() -> None:
    """One request alone: TTFT = its prefill step (no decode rows), TPOT = the mean of its decode steps at their
    buckets (batch 1; contexts 1001..1099 cross the 1024 edge)."""
    m = model()
    res = simulate(workload([1000], [100]), m, limits(), Topology(1), "round_robin")
    assert res.ttft_s[0] == pytest.approx(m.idle_prefill_s(1000), rel=1e-12)
    decode = sum(m.padded_step_s(0, 0, 1, 1001 + j) for j in range(99))
    assert res.tpot_s[0] == pytest.approx(decode / 99, rel=1e-9)


def test_closed_loop_macro_runs_equal_per_step_and_loops_agree() -> None:
    rng = np.random.default_rng(3)
    n = 300
    w = workload(rng.integers(100, 1001, n).tolist(), rng.integers(64, 129, n).tolist())
    m = model()
    kw = dict(closed_concurrency=48)
    a = simulate(w, m, limits(), Topology(1), "round_robin", **kw)
    b = simulate(w, m, limits(), Topology(1), "round_robin", macro=False, **kw)
    c = simulate(w, m, limits(), Topology(1), "round_robin", engine="heapq", **kw)
    assert np.allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    assert np.allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    assert np.array_equal(a.finish_s, c.finish_s) and np.array_equal(a.first_token_s, c.first_token_s)
    # open loop with arrivals cutting decode runs: macro == per step
    t = np.cumsum(rng.exponential(0.05, n)).tolist()
    w2 = workload(w.input_tokens.tolist(), w.output_tokens.tolist(), t)
    a2 = simulate(w2, m, limits(), Topology(2), "least_loaded")
    b2 = simulate(w2, m, limits(), Topology(2), "least_loaded", macro=False)
    assert np.allclose(a2.finish_s, b2.finish_s, rtol=0, atol=1e-9)


def test_torch_tp_refusals() -> None:
    m = model()
    with pytest.raises(ValueError, match=r"pd:1:1 needs KV transfer .*torch-tp"):
        simulate(
            workload([100], [2]), m, limits(), Topology(prefill=1, decode=1), "round_robin", kv_transfer_s=lambda n: 0.0
        )
    with pytest.raises(ValueError, match=r"request 0 has 4000 \+ 200 tokens, .*--max-model-len 4096"):
        simulate(workload([4000], [200]), m, limits(), Topology(1), "round_robin")
    with pytest.raises(ValueError, match="step model built for --max-batch 64"):
        simulate(workload([100], [2]), m, EngineLimits(32, 16384, 10_000), Topology(1), "round_robin")
    assert kv_capacity_blocks(SPEC, HW, ENG) == 64 * 8  # the static cache: 64 rows of 4096 positions
    with pytest.raises(ValueError, match="engine.profile: torch-tp shapes the planner's step times"):
        EngineConfig(profile="torch-tp", step_time="table", table_path="x.json", table_input_tokens=10)
    with pytest.raises(ValueError, match="engine.profile: must be one of vllm, torch-tp"):
        EngineConfig(profile="sglang")
    # hash ids are ignored (the server has no prefix cache): the same prompt twice is computed twice
    w = Workload(
        np.asarray([0.0, 10.0]), np.asarray([1024, 1024]), np.asarray([2, 2]), np.arange(2), [(7, 8), (7, 8)], "h"
    )
    assert simulate(w, m, limits(), Topology(1), "round_robin").prefix_hit_rate == 0.0
