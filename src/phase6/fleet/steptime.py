"""How long one continuous-batching step of a replica takes: the simulator's only notion of the hardware.

A step processes ``prefill_tokens`` new prompt tokens (chunked prefill, ``prefill_pairs`` query-key pairs of causal
attention) and one token for each of ``decode_seqs`` running sequences whose contexts sum to ``decode_ctx`` tokens.

Two sources:
- ``planner``: the planner's roofline ``phase6.plan.serve.ServeCostModel`` (max(compute, memory) + TP all-reduces +
  per-step overhead; formulas in its docstring and docs/cost_model.md) -- one latency model for plan and fleet.
- :class:`TableStepTime`: measured by ``phase6 serve-bench`` (TTFT at concurrency 1 -> prefill ms per prompt token;
  TPOT at each concurrency C -> decode step ms at batch C, linear in between).

``decode_run_s`` returns the time of ``k`` consecutive pure-decode steps in closed form: the simulator advances a
replica from one batch change to the next in one event instead of one event per token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

from phase6.config import HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.config.plan import EfficiencyConfig
from phase6.fleet.engines import TorchTPEngine, TorchTPStepTime, kv_rows_blocks
from phase6.fleet.interference import EngineStepTime
from phase6.plan.memory import serve_memory
from phase6.plan.model import ModelSpec
from phase6.plan.serve import ServeCostModel
from phase6.serving.traces import BLOCK_TOKENS


class StepTimeModel(Protocol):
    """Time of one engine step, and of ``k`` back-to-back decode-only steps, in seconds."""

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float: ...

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        """Sum over j < num_steps of step_s(0, 0, decode_seqs, decode_ctx + j * decode_seqs)."""
        ...


def prefill_pairs(done: int, chunk: int) -> float:
    """Causal attention (query, key) pairs of a prefill chunk of ``chunk`` tokens after ``done`` computed ones."""
    return chunk * done + chunk * (chunk + 1) / 2


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted points; flat below the first, last segment's slope above the last."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


class TableStepTime:
    """Step times from serve-bench measurements.

    step = prefill(prefill_tokens) + decode_step_s(decode_seqs), where decode_step_s is linear between measured
    (batch, TPOT) points and prefill is prefill_tokens · prefill_s_per_token, or, given ``prefill_points``
    (tokens in the step, seconds), linear between those (a measured profile: superlinear where attention grows).
    Context length is not a variable: the table holds at the measured prompt mix.
    """

    def __init__(
        self,
        prefill_s_per_token: float,
        decode_points: list[tuple[float, float]],
        source: str = "",
        prefill_points: list[tuple[float, float]] | None = None,
    ) -> None:
        if not prefill_s_per_token > 0 and not prefill_points:
            raise ValueError(f"{source}: prefill seconds per token must be > 0, got {prefill_s_per_token}")
        if not decode_points or any(b < 1 or t <= 0 for b, t in decode_points):
            raise ValueError(f"{source}: decode points need batch >= 1 and step time > 0, got {decode_points}")
        if prefill_points is not None and (not prefill_points or any(n < 1 or t <= 0 for n, t in prefill_points)):
            raise ValueError(f"{source}: prefill points need tokens >= 1 and time > 0, got {prefill_points}")
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_points = sorted(decode_points)
        self.prefill_points = sorted(prefill_points) if prefill_points else None
        self.source = source

    def decode_step_s(self, decode_seqs: int) -> float:
        return _interp(self.decode_points, decode_seqs) if decode_seqs > 0 else 0.0

    def step_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx: int) -> float:
        if self.prefill_points is None or prefill_tokens <= 0:
            return prefill_tokens * self.prefill_s_per_token + self.decode_step_s(decode_seqs)
        return _interp(self.prefill_points, prefill_tokens) + self.decode_step_s(decode_seqs)

    def decode_run_s(self, decode_seqs: int, decode_ctx: int, num_steps: int) -> float:
        return num_steps * self.decode_step_s(decode_seqs)

    @classmethod
    def from_serve_bench(cls, path: str | Path, input_tokens: int) -> TableStepTime:
        """Read a serve-bench results.json: the lowest-concurrency row's TTFT p50 / ``input_tokens`` gives prefill
        seconds per token; each row's (concurrency, TPOT p50) is a decode point."""
        rows = read_serve_bench_rows(path)
        first = min(rows, key=lambda r: r["concurrency"])
        pts = [(float(r["concurrency"]), float(r["tpot_p50_ms"]) / 1e3) for r in rows]
        # Keep one point per concurrency (repeats / rates at equal C are averaged).
        by_c: dict[float, list[float]] = {}
        for c, t in pts:
            by_c.setdefault(c, []).append(t)
        points = [(c, sum(ts) / len(ts)) for c, ts in sorted(by_c.items())]
        return cls(float(first["ttft_p50_ms"]) / 1e3 / input_tokens, points, source=str(path))


SERVE_BENCH_KEYS = ("concurrency", "ttft_p50_ms", "tpot_p50_ms")


def read_serve_bench_rows(path: str | Path) -> list[dict]:
    """The closed-loop rows (concurrency set) of a serve-bench results.json, each with TTFT p50 and TPOT p50.

    ``path`` may be a run dir (its results.json) or a ``-m`` sweep dir (its summary.json: one row per member).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json" if (p / "summary.json").is_file() else p / "results.json"
    if not p.is_file():
        raise ValueError(f"{p}: serve-bench results.json not found")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{p}: expected a phase6 results.json with a non-empty 'rows' list")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or r.get("concurrency") is None:
            continue  # open-loop (request-rate) rows have no fixed concurrency to replay
        missing = [k for k in SERVE_BENCH_KEYS if not isinstance(r.get(k), (int, float)) or not math.isfinite(r[k])]
        if missing:
            raise ValueError(f"{p}: rows[{i}] lacks numeric {', '.join(missing)}")
        out.append(r)
    if not out:
        raise ValueError(f"{p}: no closed-loop rows (with a concurrency) to compare with")
    return out


def efficiency(engine: EngineConfig) -> EfficiencyConfig:
    """The planner's efficiency assumptions, taken from the fleet engine config."""
    return EfficiencyConfig(
        prefill_mfu=engine.prefill_mfu,
        decode_hbm_efficiency=engine.decode_hbm_efficiency,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        runtime_overhead_gib=engine.runtime_overhead_gib,
        step_overhead_ms=engine.resolved_step_overhead_ms,
        prefill_overhead_ms=engine.prefill_overhead_ms,
    )


def planner_model(
    spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig, tp: int | None = None
) -> ServeCostModel:
    """The planner's serving step-time model for one replica of ``tp`` (default ``engine.tp``) GPUs; mixed steps
    priced as serial kernels (``phase6.fleet.interference``) when ``engine.mixed_step=serial``, plus
    ``engine.decode_seq_ms`` per decode row of a step (null: the profile's default, config.fleet.PROFILE_DEFAULTS)."""
    tp = engine.tp if tp is None else tp
    if tp > hardware.gpus_per_node:
        raise ValueError(
            f"engine.tp: {tp} exceeds hardware.gpus_per_node {hardware.gpus_per_node} (a replica is one node here)"
        )
    vllm = engine.profile == "vllm"
    return EngineStepTime(
        spec,
        hardware,
        tp=tp,
        efficiency=efficiency(engine),
        weight_bytes=engine.bytes_per_param,
        kv_bytes=engine.kv_bytes_per_elem,
        serial=engine.mixed_step == "serial" and vllm,
        seq_s=engine.resolved_decode_seq_ms * 1e-3 if vllm else 0.0,  # torch-tp: per padded row, in TorchTPStepTime
    )


def torch_tp_engine(engine: EngineConfig) -> TorchTPEngine | None:
    """The torch-tp server flags of ``engine`` (profile torch-tp), else None."""
    if engine.profile != "torch-tp":
        return None
    return TorchTPEngine(engine.max_num_seqs, engine.max_num_batched_tokens, engine.max_model_len, engine.cuda_graphs)


def build_step_model(
    spec: ModelSpec,
    hardware: HardwareConfig,
    engine: EngineConfig,
    new_shape_ms: float = 0.0,
    warm_shapes: frozenset[tuple[int, int]] = frozenset(),
) -> StepTimeModel | TorchTPStepTime:
    """engine.step_time=planner -> ServeCostModel (profile torch-tp: wrapped in TorchTPStepTime, the server's padded
    shapes, with its new-prefill-shape cost and the shapes the server ran before); =table -> TableStepTime from a
    serve-bench results.json."""
    tt = torch_tp_engine(engine)
    if tt is not None:
        base = planner_model(spec, hardware, engine)
        return TorchTPStepTime(base, tt, new_shape_ms / 1e3, warm_shapes, engine.resolved_decode_seq_ms / 1e3)
    if engine.step_time == "table":
        assert engine.table_path is not None and engine.table_input_tokens is not None
        return TableStepTime.from_serve_bench(engine.table_path, engine.table_input_tokens)
    return planner_model(spec, hardware, engine)


def kv_capacity_blocks(spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig, tp: int | None = None) -> int:
    """512-token KV blocks one replica holds (planner's serve_memory: utilisation x HBM - weights - overhead;
    profile torch-tp: its static cache, --max-batch rows of --max-model-len positions)."""
    if engine.kv_blocks is not None:
        return engine.kv_blocks
    tt = torch_tp_engine(engine)
    if tt is not None:
        return kv_rows_blocks(tt, BLOCK_TOKENS)
    mem = serve_memory(
        spec,
        engine.tp if tp is None else tp,
        1,
        BLOCK_TOKENS,
        hardware.hbm_gib,
        engine.gpu_memory_utilization,
        engine.runtime_overhead_gib,
        engine.bytes_per_param,
        engine.kv_bytes_per_elem,
    )
    blocks = int(mem.kv_capacity_tokens // BLOCK_TOKENS)
    if blocks < 1:
        raise ValueError(
            f"engine.tp: {spec.name} weights ({mem.weights_bytes / 2**30:.1f} GiB per GPU) leave no KV "
            f"memory in {hardware.hbm_gib} GiB x {engine.gpu_memory_utilization} ({hardware.name}); "
            "raise engine.tp"
        )
    return blocks


def kv_transfer_s(
    spec: ModelSpec, hardware: HardwareConfig, engine: EngineConfig, link: str, tokens: int, tp: int | None = None
) -> float:
    """Time to move a prompt's KV from a prefill to a decode replica: latency + bytes / (tp · per-GPU link bw).

    Each of the tp GPUs sends its own KV shard over its own NIC / NVLink port, so bandwidth scales with tp.
    """
    gbps = hardware.internode_gbps if link == "internode" else hardware.nvlink_gbps
    lat_us = hardware.internode_latency_us if link == "internode" else hardware.intranode_latency_us
    nbytes = spec.kv_cache_bytes_per_token(engine.kv_bytes_per_elem) * tokens
    return lat_us * 1e-6 + nbytes / ((engine.tp if tp is None else tp) * gbps * 1e9)
