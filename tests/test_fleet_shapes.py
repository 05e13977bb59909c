"""torch-tp new-prefill-shape cost: a prefill step at a (prompts, width) shape the server process has not run
before costs ``new_shape_s`` more (phase6.fleet.engines), the replica remembers the shapes it ran (seeded with the
server's earlier runs), and phase6.fleet.steps recovers steps and the cost from a run's chunk times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.engines import TorchTPStepTime
from phase6.fleet.run import model_spec
from phase6.fleet.sim import EngineLimits, Topology, simulate
from phase6.fleet.steps import new_shape_cost_ms, run_steps, server_chain, shapes_before
from phase6.fleet.steptime import build_step_model, kv_capacity_blocks
from phase6.fleet.workload import Workload

HW = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text()))
SPEC = model_spec(str(Path(__file__).parent / "data" / "serve_bench_sweep_h200" / "qwen2.5-14b_config.json"))
ENG = EngineConfig(
    tp=1,
    profile="torch-tp",
    step_overhead_ms=5.0,
    prefill_overhead_ms=100.0,
    prefill_mfu=0.5,
    max_num_seqs=64,
    max_num_batched_tokens=16384,
    max_model_len=4096,
    cuda_graphs=True,
)
LIM = EngineLimits(64, 16384, kv_capacity_blocks(SPEC, HW, ENG))


def model(new_ms: float, warm: frozenset[tuple[int, int]] = frozenset()) -> TorchTPStepTime:
    m = build_step_model(SPEC, HW, ENG, new_ms, warm)
    assert isinstance(m, TorchTPStepTime)
    return m


def test_step_cost() -> None:
    m = model(50.0)
    assert m.padded_step_s(2, 300, 10, 500, new_shape=True) - m.padded_step_s(2, 300, 10, 500, new_shape=False) == (
        pytest.approx(0.05)
    )
    assert m.padded_step_s(0, 0, 10, 500, new_shape=True) == m.padded_step_s(0, 0, 10, 500, new_shape=False)
    assert m.idle_prefill_s(300) == m.padded_step_s(1, 300, 0, 0, new_shape=True)
    assert model(0.0).padded_step_s(1, 300, 0, 0) == m.padded_step_s(1, 300, 0, 0, new_shape=False)
    with pytest.raises(ValueError, match="new-shape"):
        TorchTPStepTime(m.base, m.engine, -1.0)


def _seq(n_in: list[int], warm: frozenset[tuple[int, int]] = frozenset(), new_ms: float = 50.0):  # noqa: ANN202
    n = len(n_in)
    w = Workload(np.zeros(n), np.asarray(n_in), np.full(n, 2), np.arange(n, dtype=np.int64), None, "t")
    return simulate(w, model(new_ms, warm), LIM, Topology(1), "round_robin", closed_concurrency=1)


def test_replica_charges_a_shape_once() -> None:
    """C=1: the second request at width 300 pays no new-shape cost; a warm server pays it for neither."""
    res = _seq([300, 300, 400])
    t = res.ttft_s
    assert t[0] - t[1] == pytest.approx(0.05)
    assert t[2] > t[1]
    assert res.prefill_shapes == {(1, 300), (1, 400)}
    warm = _seq([300, 300], warm=frozenset({(1, 300)}))
    assert warm.ttft_s[0] == pytest.approx(t[1]) and warm.ttft_s[1] == pytest.approx(t[1])
    assert np.allclose(_seq([300, 300], new_ms=0.0).ttft_s, t[1])


def _write_run(d: Path, reqs: list[tuple[float, int, list[float]]], time: str, server: bool) -> Path:
    d.mkdir(parents=True)
    lines = [
        json.dumps({"index": i, "ok": True, "send_s": s, "prompt_tokens": p, "chunk_times_s": c})
        for i, (s, p, c) in enumerate(reqs)
    ]
    (d / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (d / "env.json").write_text(json.dumps({"time": time}))
    if server:
        (d / "server.log").write_text("")
    return d


def test_steps_and_shape_cost(tmp_path: Path) -> None:
    """A decoding request witnesses each step; one-prompt steps at new widths last 0.15 s, at seen widths 0.09 s."""
    widths = [100 + i for i in range(6)] * 2  # 6 new widths, then the same 6 again
    dec, t, reqs = [], 0.0, []
    for k, w in enumerate(widths):
        t += 0.02  # a decode-only step
        dec.append(t)
        t += 0.15 if k < 6 else 0.09  # the step that prefills prompt k (and decodes the long request)
        dec.append(t)
        reqs.append((t - 0.01, w, [0.01]))  # sent 10 ms before the step's end: first token = its only chunk
    reqs.insert(0, (0.0, 50, dec))
    a = _write_run(tmp_path / "a", reqs[:1], "2026-01-01T00:00:00", True)
    b = _write_run(tmp_path / "b", reqs, "2026-01-01T00:01:00", False)
    steps = run_steps(b)
    assert len(steps) == 2 * len(widths)
    pf = [s for s in steps if s.prompts][1:]  # the first step prefills the long request itself (its first chunk)
    assert [s.prompts[0] for s in pf] == widths and all(s.decode_rows == 1 for s in pf)
    assert [round(s.duration_s, 6) for s in pf] == [0.15] * 6 + [0.09] * 6
    prev = server_chain([b, a])
    assert prev == {a: None, b: a}
    assert shapes_before(b, prev) == {(1, 50)}
    cost = new_shape_cost_ms(b)
    assert cost is not None and cost.cost_ms == pytest.approx(60.0) and (cost.n_new, cost.n_seen) == (6, 6)
    assert new_shape_cost_ms(b, frozenset((1, w) for w in widths)) is None  # nothing new: fewer than 5 new
    c = _write_run(tmp_path / "c", reqs[:1], "2026-01-01T00:02:00", True)
    assert server_chain([a, b, c])[c] is None
