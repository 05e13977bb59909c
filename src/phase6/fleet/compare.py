"""Simulated vs measured: replay each closed-loop run of `phase6 serve-bench` in the simulator.

Protocol (issue 8, validation): for every finished serve-bench run (engine, tp, concurrency C) simulate one
colocated replica of the same TP with C closed-loop clients sending *the run's own requests in its send order*, then
compare TTFT p50, TPOT p50 and output throughput; a row passes when both latencies are within 20 %.

What is read from a serve-bench run directory (the files `projects/6b_serving/serve_bench.py` writes):
  results.json   ``rows[0]``: engine, tp, concurrency, ttft_p50_ms, tpot_p50_ms, throughput_tok_s, completed
  requests.jsonl one record per request (``RequestResult.to_json``): index (send order), ok, prompt_tokens
                 (server usage, chat template included; the client's ``prompt_len`` where usage was missing),
                 output_tokens (server usage)
  config.yaml    hardware.name (must be the fleet's hardware) and serve.engine / serve.engine_args, from which the
                 replica's batch limits are taken (:data:`ENGINE_LIMIT_ARGS`)
Request lengths: ``analysis.compare_lengths=requests`` (default) replays the completed requests exactly (their
length distribution, not the means); ``mean`` replays every request at the run's mean prompt/output (identical
requests make a closed loop run in lockstep, all C clients finishing and re-arriving together, which inflates TTFT).

Calibration (``calibrate=True``, default): three planner parameters are fitted on the *lowest-concurrency* run of
each TP only (concurrency 1 in a sweep) and then held for every other run, so C=16/64 are predictions, not fits:
  step_overhead_ms     the fixed cost every step pays: bisected until the replayed TPOT p50 equals the measured one
  prefill_mfu,         slope and intercept of TTFT vs prompt length over that run's requests: at C=1 a request
  prefill_overhead_ms  finds the server idle, so its TTFT is its own prefill step(s) (:func:`idle_ttft_s`), and the
                       two are the least-absolute-deviation fit of those steps to the measured TTFTs (robust to a
                       stray slow request; the intercept is the extra fixed cost of a step that prefills)
(:func:`calibrate`; the ordinary Theil-Sen line through the same points is reported next to it.)

Engine profile (``analysis.compare_profile=auto``, default): the replayed replica follows the measured engine's own
mechanics (phase6.fleet.engines): a torch-tp run gets ``engine.profile=torch-tp`` with the run's --max-batch,
--max-prefill-tokens, serve.max_model_len and --cuda-graphs (ServerArgs defaults where the record has none), i.e.
prompts padded to the step's longest, decode padded to the CUDA-graph buckets, decode and prefill as separate
forwards. Those are properties of the server's code, not fitted; the calibration above is then done through them.
``compare_profile=vllm`` replays every run on the generic chunked-prefill replica (the earlier behaviour).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.fleet.engines import TorchTPStepTime
from phase6.fleet.sim import EngineLimits, SimResult, Topology
from phase6.fleet.steps import new_shape_cost_ms, server_chain, shapes_before
from phase6.fleet.steptime import StepTimeModel, build_step_model, kv_capacity_blocks, prefill_pairs
from phase6.fleet.workload import Workload
from phase6.serving.tp_server.args import ServerArgs  # torch-free: the server's defaults, no engine
from phase6.textio import iter_jsonl

if TYPE_CHECKING:  # run.py imports this module inside main(); a runtime import here would be circular
    from phase6.fleet.setup import FleetSetup

TOLERANCE = 0.20
"""Relative error a simulated TTFT/TPOT p50 may have against the measurement (issue 8)."""

ROW_KEYS = ("concurrency", "ttft_p50_ms", "tpot_p50_ms", "completed")
"""Numeric keys a serve-bench results.json row must carry to be replayed."""

ENGINE_LIMIT_ARGS: dict[str, tuple[str, str]] = {
    # engine: (serve.engine_args key of the most running sequences, key of the per-step prefill token budget)
    "torch-tp": ("max-batch", "max-prefill-tokens"),  # phase6.serving.tp_server ServerArgs (budget: padded prompts)
    "vllm": ("max-num-seqs", "max-num-batched-tokens"),  # vLLM engine args (budget: decodes + prefill chunks)
}
"""Where a serve-bench record states the engine's batch limits; absent args fall back as :func:`engine_limits` says."""


@dataclass
class MeasuredRun:
    """One finished serve-bench run: its closed-loop row and its completed requests in send order."""

    run_dir: Path
    row: dict[str, Any]
    """results.json ``rows[0]``."""
    input_tokens: np.ndarray
    """(N,) int64 prompt tokens of each completed request, in send (index) order."""
    output_tokens: np.ndarray
    """(N,) int64 output tokens of each completed request."""
    ttft_ms: np.ndarray
    """(N,) float64 measured TTFT of each completed request, ms (the client's ``ttft_s``)."""
    prompt_from_client: int
    """Requests whose prompt length is the client tokenizer's count (the server reported no usage)."""
    config: dict[str, Any]
    """The run's config.yaml ({} when absent)."""

    @property
    def concurrency(self) -> int:
        return int(self.row["concurrency"])


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _read_requests(path: Path, completed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(prompt tokens, output tokens, TTFT ms, prompts counted by the client) of the completed requests, by send
    index."""
    if not path.is_file():
        raise ValueError(
            f"{path}: not found (serve-bench writes one record per request there; the comparison "
            "replays those requests)"
        )
    recs: list[tuple[int, int, int, bool, float]] = []
    for line_no, r in iter_jsonl(path):
        if not isinstance(r, dict) or not isinstance(r.get("index"), int) or not isinstance(r.get("ok"), bool):
            raise ValueError(f"{path}:{line_no}: expected a request record with integer 'index' and bool 'ok'")
        if not r["ok"]:
            continue  # failed requests have no complete output to replay; the row counts them as failed
        usage = r.get("prompt_tokens")
        inp = usage if isinstance(usage, int) else r.get("prompt_len")
        out = r.get("output_tokens")
        if not isinstance(inp, int) or inp < 1 or not isinstance(out, int) or out < 1:
            raise ValueError(
                f"{path}:{line_no}: a completed request needs prompt_tokens (or prompt_len) >= 1 and "
                f"output_tokens >= 1, got {inp!r}, {out!r}"
            )
        ttft = r.get("ttft_s")
        if not _number(ttft) or ttft < 0:
            raise ValueError(f"{path}:{line_no}: a completed request needs a number ttft_s >= 0, got {ttft!r}")
        recs.append((r["index"], inp, out, not isinstance(usage, int), 1e3 * float(ttft)))
    if len(recs) != completed:
        raise ValueError(f"{path}: {len(recs)} completed requests, but results.json says completed = {completed}")
    recs.sort()
    return (
        np.asarray([r[1] for r in recs], dtype=np.int64),
        np.asarray([r[2] for r in recs], dtype=np.int64),
        np.asarray([r[4] for r in recs], dtype=np.float64),
        sum(r[3] for r in recs),
    )


def load_run(run_dir: str | Path) -> MeasuredRun | str:
    """A finished serve-bench run dir -> :class:`MeasuredRun`, or a one-line reason it has no closed-loop row."""
    d = Path(run_dir)
    res_path = d / "results.json"
    res = _read_json(res_path)
    if not isinstance(res, dict) or res.get("job", "serve_bench") != "serve_bench":
        raise ValueError(
            f"{res_path}: not a serve-bench results.json (job {res.get('job') if isinstance(res, dict) else None!r})"
        )
    rows = res.get("rows")
    if not isinstance(rows, list) or len(rows) != 1 or not isinstance(rows[0], dict):
        raise ValueError(
            f"{res_path}: expected one row (one serve-bench run), got "
            f"{len(rows) if isinstance(rows, list) else 'no'} rows; pass the run's directory, or the "
            "sweep dir that holds the runs"
        )
    row = rows[0]
    if row.get("concurrency") is None:
        return f"{d}: open loop (request_rate={row.get('request_rate')}), no fixed concurrency to replay"
    missing = [k for k in ROW_KEYS if not _number(row.get(k))]
    if missing:
        raise ValueError(f"{res_path}: rows[0] lacks numeric {', '.join(missing)}")
    if row["completed"] < 1:
        return f"{d}: no request completed"
    inp, out, ttft, from_client = _read_requests(d / "requests.jsonl", int(row["completed"]))
    cfg_path = d / "config.yaml"
    config = yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}
    return MeasuredRun(d, row, inp, out, ttft, from_client, config if isinstance(config, dict) else {})


def load_serve_bench(path: str | Path) -> tuple[list[MeasuredRun], list[str]]:
    """The closed-loop runs under ``path`` and why others were skipped.

    ``path``: a run dir, its results.json, a ``-m`` sweep dir (members in numbered subdirs), or the sweep's
    summary.json. A member without results.json (killed or still running) is skipped and named, never guessed.
    """
    p = Path(path)
    if p.is_file() and p.name in ("results.json", "summary.json"):
        p = p.parent
    if not p.is_dir():
        raise ValueError(f"{path}: no such serve-bench run or sweep directory")
    if (p / "results.json").is_file():
        dirs, skipped = [p], []
    else:
        subs = sorted(
            (s for s in p.iterdir() if s.is_dir() and (s / "config.yaml").is_file()),
            key=lambda s: (not s.name.isdigit(), int(s.name) if s.name.isdigit() else 0, s.name),
        )
        dirs = [s for s in subs if (s / "results.json").is_file()]
        skipped = [f"{s}: no results.json (the run did not finish)" for s in subs if s not in dirs]
        if not dirs:
            raise ValueError(f"{path}: no serve-bench results.json in it or in its member dirs")
    runs: list[MeasuredRun] = []
    for d in dirs:
        r = load_run(d)
        if isinstance(r, str):
            skipped.append(r)
        else:
            runs.append(r)
    if not runs:
        raise ValueError(f"{path}: no closed-loop serve-bench run to compare with ({'; '.join(skipped)})")
    return runs, skipped


def check_serve_bench(path: str | Path, cfg: FleetRunConfig) -> None:
    """Fail early (one line) if the runs under ``path`` cannot be replayed against this fleet config."""
    runs = load_serve_bench(path)[0]
    if cfg.analysis.compare_calibrate:
        by_tp: dict[int, list[int]] = {}
        for run in runs:
            by_tp.setdefault(int(run.row.get("tp") or cfg.engine.tp), []).append(run.concurrency)
        for tp, cs in sorted(by_tp.items()):
            if 1 not in cs:
                raise ValueError(
                    f"analysis.compare_calibrate: {path} has no concurrency-1 run for TP={tp} (only "
                    f"{sorted(cs)}); the calibration fits on it: add load.concurrency=1 to the sweep or "
                    "set analysis.compare_calibrate=false"
                )
    for run in runs:
        measured_hw = (run.config.get("hardware") or {}).get("name")
        if measured_hw is not None and measured_hw != cfg.hardware.name:
            raise ValueError(
                f"hardware: the fleet simulates {cfg.hardware.name} but {run.run_dir} was measured on "
                f"{measured_hw} (its config.yaml); pass hardware={measured_hw}"
            )
        engine_limits(run, cfg.engine)


def engine_limits(run: MeasuredRun, engine: EngineConfig) -> tuple[int, int, str]:
    """(max_num_seqs, max_num_batched_tokens, where they came from) of the measured server.

    Recorded ``serve.engine_args`` win; a torch-tp server without them ran with its own defaults (ServerArgs);
    any other engine gets the fleet's ``engine.*`` values, and the table says so.
    """
    serve = run.config.get("serve") or {}
    name = str(serve.get("engine") or run.row.get("engine") or "")
    args = serve.get("engine_args") or {}
    seqs, budget = engine.max_num_seqs, engine.max_num_batched_tokens
    src = [f"engine.max_num_seqs={seqs}", f"engine.max_num_batched_tokens={budget}"]
    if name in ENGINE_LIMIT_ARGS:
        defaults: dict[str, Any] = {}  # ServerArgs' defaults are what ran when no arg was given
        if name == "torch-tp" and any(k not in args for k in ENGINE_LIMIT_ARGS[name]):
            fields = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
            defaults = {"max-batch": fields["max_batch"], "max-prefill-tokens": fields["max_prefill_tokens"]}
        for i, key in enumerate(ENGINE_LIMIT_ARGS[name]):
            v = args.get(key, defaults.get(key))
            if v is None:
                continue
            if not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"{run.run_dir}/config.yaml: serve.engine_args.{key} must be an integer >= 1, got {v!r}"
                )
            if i == 0:
                seqs = v
            else:
                budget = v
            src[i] = f"{name} {key}={v}" + ("" if key in args else " (default)")
    if budget < seqs:
        raise ValueError(f"{run.run_dir}: token budget {budget} < max sequences {seqs} ({', '.join(src)})")
    return seqs, budget, ", ".join(src)


def engine_profile(run: MeasuredRun, mode: str = "auto") -> tuple[dict[str, Any], str]:
    """(EngineConfig overrides, description) of the replica that replays ``run``: ``mode=auto`` gives a torch-tp
    run the torch-tp profile with its recorded --max-model-len (serve.max_model_len) and --cuda-graphs
    (serve.engine_args; ServerArgs defaults where absent), every other engine -- and ``mode=vllm`` -- the generic
    vllm profile."""
    serve = run.config.get("serve") or {}
    name = str(serve.get("engine") or run.row.get("engine") or "")
    if mode == "vllm" or name != "torch-tp":
        return {"profile": "vllm"}, "vllm (chunked prefill, one forward per step)"
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    args = serve.get("engine_args") or {}
    ml = serve.get("max_model_len") or defaults["max_model_len"]  # serve-bench passes --max-model-len when set
    graphs = args.get("cuda-graphs", defaults["cuda_graphs"])
    if not isinstance(ml, int) or ml < 2:
        raise ValueError(f"{run.run_dir}/config.yaml: serve.max_model_len must be an integer >= 2, got {ml!r}")
    if not isinstance(graphs, bool):
        raise ValueError(f"{run.run_dir}/config.yaml: serve.engine_args.cuda-graphs must be true/false, got {graphs!r}")
    desc = (
        f"torch-tp (prompts padded to the step's longest, max-model-len {ml}, "
        + ("CUDA-graph decode buckets" if graphs else "eager decode at the longest row's length")
        + ")"
    )
    return {"profile": "torch-tp", "max_model_len": ml, "cuda_graphs": graphs}, desc


CALIBRATION_ROUNDS = 3
"""Alternating fits of (step overhead | prefill MFU and overhead); at C=1 they barely interact (the MFU touches a
decode step only when it is compute-bound), and one round already converges."""

MFU_GRID = np.geomspace(1e-3, 1.0, 121)
"""Coarse search grid of the prefill MFU (then refined by golden section around the best point)."""


def _bisect(f: Callable[[float], float], lo: float, hi: float, target: float, steps: int = 40) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (the nearer end when target is outside)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def idle_ttft_s(model: StepTimeModel | TorchTPStepTime, prompt_tokens: int, budget: int) -> tuple[float, int]:
    """(TTFT, prefill steps) of one request on an idle replica: its prompt in chunks of ``budget`` tokens, one step
    each, the last one emitting the first token -- what the simulator does for a request that finds no other work
    (torch-tp: the whole prompt in one step, whatever the budget). Without ``engine.request_overhead_ms``."""
    if isinstance(model, TorchTPStepTime):
        return model.idle_prefill_s(prompt_tokens), 1
    t, done, steps = 0.0, 0, 0
    while done < prompt_tokens:
        c = min(budget, prompt_tokens - done)
        t += model.step_s(c, prefill_pairs(done, c), 0, 0)
        done += c
        steps += 1
    return t, steps


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    """A minimiser of sum w_i |x_i - m| (the lower weighted median)."""
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cw, 0.5 * cw[-1])])


def per_request_intercept(engine: EngineConfig) -> bool:
    """Whether the C=1 TTFT intercept is charged per request (``engine.request_overhead_ms``: vllm, whose steps mix
    prefill chunks and decodes in one forward and whose per-request work -- HTTP, chat template, tokenisation, the
    hand-off to the engine -- runs outside the steps) or per prefill step (``prefill_overhead_ms``: torch-tp, whose
    prefill is its own forward with its own host work)."""
    return engine.profile == "vllm"


def fit_prefill(
    setup: FleetSetup, run: MeasuredRun, engine: EngineConfig, limits: EngineLimits
) -> tuple[float, float, float]:
    """(prefill_mfu, intercept ms, mean absolute deviation ms) fitted to the run's per-request TTFTs; the intercept is
    ``request_overhead_ms`` or ``prefill_overhead_ms`` as :func:`per_request_intercept` says.

    Model of request i (idle replica, the other planner parameters as in ``engine``): TTFT_i = base_i(mfu) + n_i·o,
    base_i = its prefill step(s) with neither overhead, o = the intercept and n_i = 1 (per request) or the number of
    its prefill steps (per prefill step). For a given MFU the o >= 0 minimising sum |TTFT_i - base_i - n_i·o| is a
    weighted median; the MFU is searched on a log grid over [1e-3, 1] and refined by golden section (a bound is kept
    when the data asks for more).
    """
    ttft_s = run.ttft_ms / 1e3
    budget = limits.max_num_batched_tokens
    lengths = [int(p) for p in run.input_tokens]
    per_request = per_request_intercept(engine)

    def fit_o(mfu: float) -> tuple[float, float]:
        model = build_step_model(
            setup.spec,
            setup.hardware,
            dataclasses.replace(engine, prefill_mfu=mfu, prefill_overhead_ms=0.0),
            setup.new_shape_ms,
        )
        base, n = np.asarray([idle_ttft_s(model, p, budget) for p in lengths]).T
        if per_request:
            n = np.ones_like(n)
        o = max(0.0, _weighted_median((ttft_s - base) / n, n))
        return o, float(np.abs(ttft_s - base - n * o).sum())

    logs = np.log(MFU_GRID)
    losses = [fit_o(float(m))[1] for m in MFU_GRID]
    j = int(np.argmin(losses))
    lo, hi = logs[max(j - 1, 0)], logs[min(j + 1, len(logs) - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = fit_o(math.exp(a))[1], fit_o(math.exp(b))[1]
    for _ in range(60):  # golden section on log(mfu); the bracket shrinks to ~1e-12 of its width
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = fit_o(math.exp(a))[1]
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = fit_o(math.exp(b))[1]
    best = min([(losses[j], logs[j]), (fa, a), (fb, b)])[1]
    mfu = float(min(1.0, math.exp(best)))
    o, loss = fit_o(mfu)
    return mfu, 1e3 * o, 1e3 * loss / len(lengths)


def ttft_line(run: MeasuredRun) -> tuple[float, float]:
    """Theil-Sen line through (prompt tokens, TTFT ms) of the run's requests: (intercept ms, ms per 1000 tokens)."""
    x, y = run.input_tokens.astype(float), run.ttft_ms
    i, j = np.triu_indices(len(x), 1)
    keep = x[i] != x[j]
    if not keep.any():
        return float(np.median(y)), 0.0
    slope = float(np.median((y[j] - y[i])[keep] / (x[j] - x[i])[keep]))
    return float(np.median(y - slope * x)), 1e3 * slope


def replay(
    setup: FleetSetup, run: MeasuredRun, engine: EngineConfig, limits: EngineLimits, lengths: str = "requests"
) -> SimResult:
    """Simulate ``run``: one replica with ``engine``'s step times, its C clients sending its requests in order."""
    spec = setup.spec
    model = build_step_model(spec, setup.hardware, engine, setup.new_shape_ms, setup.warm_shapes)
    s = dataclasses.replace(setup, model=model, engine=engine, limits=limits)
    n = len(run.input_tokens)
    if lengths == "requests":  # the run's own requests in send order (a closed loop sends the next on completion)
        inp, outp = run.input_tokens, run.output_tokens
    else:
        inp = np.full(n, max(1, round(float(run.input_tokens.mean()))), dtype=np.int64)
        outp = np.full(n, max(2, round(float(run.output_tokens.mean()))), dtype=np.int64)
    w = Workload(np.zeros(n), inp, outp, np.arange(n, dtype=np.int64), None, f"{run.run_dir} (C={run.concurrency})")
    return s.run(w, Topology(colocated=1), "round_robin", closed=run.concurrency)


def p50_ms(res: SimResult) -> tuple[float, float]:
    """(TTFT p50, TPOT p50) of a simulation in ms, as serve-bench computes them (one-token answers have no TPOT)."""
    return float(np.median(res.ttft_s)) * 1e3, float(np.nanmedian(res.tpot_s)) * 1e3


def calibrate(
    setup: FleetSetup, run: MeasuredRun, engine: EngineConfig, limits: EngineLimits, lengths: str = "requests"
) -> EngineConfig:
    """Fit step_overhead_ms (to TPOT p50, by replaying the run) and prefill_mfu + the TTFT intercept (to the TTFT
    of each request vs its prompt length, :func:`fit_prefill`: request_overhead_ms on a vllm replica,
    prefill_overhead_ms on a torch-tp one, the other set to 0) on one concurrency-1 run.

    TPOT p50 rises with the step overhead (every decode step pays it), so it is bisected in [0, TPOT p50] on the
    simulated replay of the run itself. The prefill pair comes from the run's own requests: at C=1 each finds the
    server idle, so its TTFT is its own prefill, and the spread of prompt lengths gives the slope (MFU) and the
    intercept (overhead) -- data of the calibration run only.
    """
    if run.concurrency != 1:
        raise ValueError(
            f"{run.run_dir}: the calibration needs the concurrency-1 run (TTFT = one request's own "
            f"prefill on an idle server), got concurrency {run.concurrency}; add load.concurrency=1 to "
            "the sweep or pass analysis.compare_calibrate=false"
        )
    tpot = float(run.row["tpot_p50_ms"])
    key = "request_overhead_ms" if per_request_intercept(engine) else "prefill_overhead_ms"
    eng = dataclasses.replace(engine, request_overhead_ms=0.0, prefill_overhead_ms=0.0)
    for _ in range(CALIBRATION_ROUNDS):
        oh = _bisect(
            lambda x, e=eng: p50_ms(replay(setup, run, dataclasses.replace(e, step_overhead_ms=x), limits, lengths))[1],
            0.0,
            tpot,
            tpot,
        )
        eng = dataclasses.replace(eng, step_overhead_ms=oh)
        mfu, po, _ = fit_prefill(setup, run, eng, limits)
        eng = dataclasses.replace(eng, prefill_mfu=mfu, **{key: po})
    return eng


def replica_config(
    run: MeasuredRun, cfg: FleetRunConfig, setup: FleetSetup, profile: str = "auto"
) -> tuple[EngineConfig, EngineLimits, str, str]:
    """(engine config, limits, where the limits came from, engine profile) of the replica that replays ``run``."""
    tp = int(run.row.get("tp") or cfg.engine.tp)
    seqs, budget, limits_src = engine_limits(run, cfg.engine)
    prof, prof_desc = engine_profile(run, profile)
    engine = dataclasses.replace(
        cfg.engine,
        tp=tp,
        step_time="planner",
        table_path=None,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        **prof,
    )
    limits = EngineLimits(seqs, budget, kv_capacity_blocks(setup.spec, cfg.hardware, engine))  # this TP's KV
    return engine, limits, limits_src, prof_desc


def calibration(
    setup: FleetSetup, run: MeasuredRun, engine: EngineConfig, limits: EngineLimits, lengths: str, prof_desc: str
) -> tuple[EngineConfig, str]:
    """:func:`calibrate` on the concurrency-1 ``run`` and a one-line summary of the fit."""
    fit = calibrate(setup, run, engine, limits, lengths)
    mad = fit_prefill(setup, run, fit, limits)[2]
    icpt, slope = ttft_line(run)
    intercept = (
        f"request overhead {fit.resolved_request_overhead_ms:.1f} ms (per request, outside the steps)"
        if per_request_intercept(fit)
        else f"prefill overhead {fit.prefill_overhead_ms:.1f} ms"
    )
    return fit, (
        f"fitted at C={run.concurrency} on the {prof_desc} replica: step overhead {fit.resolved_step_overhead_ms:.2f} "
        f"ms, {intercept}, prefill_mfu {fit.prefill_mfu:.3f} (TTFT fit mean "
        f"|error| {mad:.1f} ms over {len(run.input_tokens)} requests; Theil-Sen TTFT line {icpt:.0f} ms + "
        f"{slope:.0f} ms per 1000 prompt tokens)"
    )


def with_fit(engine: EngineConfig, fit: EngineConfig) -> EngineConfig:
    """``engine`` with the calibrated parameters of ``fit`` (step overhead, prefill MFU, both intercepts)."""
    return dataclasses.replace(
        engine,
        step_overhead_ms=fit.step_overhead_ms,
        prefill_mfu=fit.prefill_mfu,
        prefill_overhead_ms=fit.prefill_overhead_ms,
        request_overhead_ms=fit.request_overhead_ms,
    )


def planned_run(
    name: str, serve_cfg: dict[str, Any], tp: int, concurrency: int, prompts: Any, outputs: Any
) -> MeasuredRun:
    """A run not measured yet (prediction): its serve config (engine, engine_args, max_model_len) and the requests
    it will send, with no measured values."""
    inp = np.asarray(prompts, dtype=np.int64)
    out = np.asarray(outputs, dtype=np.int64)
    row = {"engine": serve_cfg.get("engine"), "tp": tp, "concurrency": concurrency, "completed": len(inp)}
    return MeasuredRun(Path(name), row, inp, out, np.zeros(len(inp)), 0, {"serve": serve_cfg})


def predict_serve_bench(
    calibration_path: str | Path,
    planned: list[MeasuredRun],
    cfg: FleetRunConfig,
    setup: FleetSetup,
    profile: str = "auto",
) -> list[dict[str, Any]]:
    """Predictions for runs not measured yet: calibrate on the concurrency-1 run of each TP under
    ``calibration_path`` (as :func:`compare_serve_bench` does) and replay each planned run's requests -- the numbers
    a later ``compare_serve_bench`` on a sweep holding that C=1 run and the measured runs prints as simulated
    (torch-tp: plus the new-shape cost from the lowest loaded run of that TP; each planned run on a fresh server)."""
    runs = load_serve_bench(calibration_path)[0]
    out = []
    fits: dict[int, tuple[EngineConfig, str]] = {}
    shape_ms: dict[int, float] = {}

    def tp_of(run: MeasuredRun) -> int:
        return int(run.row.get("tp") or cfg.engine.tp)

    for p in planned:
        tp = int(p.row["tp"])
        if tp not in fits:
            c1 = [r for r in runs if tp_of(r) == tp and r.concurrency == 1]
            if not c1:
                raise ValueError(f"{calibration_path}: no concurrency-1 run for TP={tp} to calibrate on")
            engine, limits, _, desc = replica_config(c1[0], cfg, setup, profile)
            tsetup, shape_desc = setup, ""
            if engine.profile == "torch-tp":
                ms, shape_desc, _ = shape_calibration(runs, tp_of, tp)
                shape_ms[tp] = ms
                tsetup = dataclasses.replace(setup, new_shape_ms=ms)
            fit, fdesc = calibration(tsetup, c1[0], engine, limits, "requests", desc)
            fits[tp] = (fit, f"{fdesc}; {shape_desc}" if tp in shape_ms else fdesc)
        engine, limits, limits_src, desc = replica_config(p, cfg, setup, profile)
        psetup = dataclasses.replace(setup, new_shape_ms=shape_ms[tp]) if engine.profile == "torch-tp" else setup
        res = replay(psetup, p, with_fit(engine, fits[tp][0]), limits)  # a fresh server: no warm shapes
        out.append(
            {
                "run": str(p.run_dir),
                **sim_columns(p, tp, res),
                "engine_profile": desc,
                "engine_limits": limits_src,
                "calibration": fits[tp][1],
            }
        )
    return out


def sim_columns(run: MeasuredRun, tp: int, res: SimResult) -> dict[str, Any]:
    """The simulated side of one measured run's row: its request mix and the replay's p50s, throughput, makespan."""
    ttft, tpot = p50_ms(res)
    return {
        "tp": tp,
        "concurrency": run.concurrency,
        "requests": len(run.input_tokens),
        "mean_input_tokens": float(run.input_tokens.mean()),
        "mean_output_tokens": float(run.output_tokens.mean()),
        "ttft_p50_ms_sim": ttft,
        "tpot_p50_ms_sim": tpot,
        "throughput_tok_s_sim": float(res.output_tokens.sum()) / res.makespan_s,
        "makespan_s_sim": res.makespan_s,
    }


def shape_calibration(
    runs: list[MeasuredRun], tp_of: Callable[[MeasuredRun], int], tp: int
) -> tuple[float, str, Path | None]:
    """torch-tp new-prefill-shape cost of TP ``tp`` (ms, summary, the run it was measured on): from the
    lowest-concurrency run above 1 of that TP (the second calibration run; C=1 cannot show it, every C=1 request has
    a new width), :func:`phase6.fleet.steps.new_shape_cost_ms` with the shapes its server ran before it."""
    loaded = sorted((r for r in runs if tp_of(r) == tp and r.concurrency > 1), key=lambda r: r.concurrency)
    if not loaded:
        return 0.0, "new-shape cost 0 (no loaded run of this TP to measure it on)", None
    run = loaded[0]
    prev = server_chain([r.run_dir for r in runs])
    cost = new_shape_cost_ms(run.run_dir, shapes_before(run.run_dir, prev))
    if cost is None:
        return 0.0, f"new-shape cost 0 ({run.run_dir}: fewer than 5 new or seen one-prompt steps)", None
    return cost.cost_ms, f"{cost.describe()} at C={run.concurrency}", run.run_dir


def compare_serve_bench(
    path: str | Path,
    cfg: FleetRunConfig,
    setup: FleetSetup,
    calibrate_rows: bool = True,
    lengths: str = "requests",
    profile: str = "auto",
) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per measured closed-loop run: measured vs simulated TTFT/TPOT p50 and throughput, errors, pass;
    plus the runs skipped (unfinished, open loop) with the reason. ``profile``: auto (each run's engine mechanics,
    :func:`engine_profile`) | vllm (the generic replica for every run)."""
    if lengths not in ("requests", "mean"):
        raise ValueError(f"analysis.compare_lengths: must be requests or mean, got {lengths!r}")
    if profile not in ("auto", "vllm"):
        raise ValueError(f"analysis.compare_profile: must be auto or vllm, got {profile!r}")
    runs, skipped = load_serve_bench(path)

    def tp_of(run: MeasuredRun) -> int:
        return int(run.row.get("tp") or cfg.engine.tp)

    runs.sort(key=lambda r: (tp_of(r), r.concurrency))
    prev = server_chain([r.run_dir for r in runs])
    end_shapes: dict[Path, frozenset[tuple[int, int]]] = {}  # run -> prefill shapes its replay's server had run
    out_rows: list[dict[str, Any]] = []
    calibrated: dict[int, tuple[MeasuredRun, EngineConfig, str]] = {}  # tp -> (run fitted on, engine, summary)
    shape_cal: dict[int, tuple[float, str, Path | None]] = {}
    for run in runs:
        r = run.row
        tp = tp_of(run)
        c = run.concurrency
        engine, limits, limits_src, prof_desc = replica_config(run, cfg, setup, profile)
        tsetup = setup
        if engine.profile == "torch-tp" and calibrate_rows:
            if tp not in shape_cal:
                shape_cal[tp] = shape_calibration(runs, tp_of, tp)
            p = prev.get(run.run_dir)
            warm = end_shapes[p] if p in end_shapes else shapes_before(run.run_dir, prev)
            tsetup = dataclasses.replace(setup, new_shape_ms=shape_cal[tp][0], warm_shapes=warm)
        if calibrate_rows:
            if tp not in calibrated:  # the lowest concurrency of this TP (runs are sorted)
                cal = calibration(tsetup, run, engine, limits, lengths, prof_desc)
                if tp in shape_cal:
                    cal = (cal[0], f"{cal[1]}; {shape_cal[tp][1]}")
                calibrated[tp] = (run, *cal)
            engine = with_fit(engine, calibrated[tp][1])
        res = replay(tsetup, run, engine, limits, lengths)
        end_shapes[run.run_dir] = res.prefill_shapes
        n = len(run.input_tokens)
        mean_in, mean_out = float(run.input_tokens.mean()), float(run.output_tokens.mean())
        sim_ttft, sim_tpot = p50_ms(res)
        sim_tok_s = float(res.output_tokens.sum()) / res.makespan_s
        e_ttft = sim_ttft / float(r["ttft_p50_ms"]) - 1
        e_tpot = sim_tpot / float(r["tpot_p50_ms"]) - 1
        fitted_here = calibrate_rows and calibrated[tp][0] is run
        shape_here = tp in shape_cal and shape_cal[tp][2] == run.run_dir
        out_rows.append(
            {
                "run": run.run_dir.name,
                "engine": r.get("engine"),
                "tp": tp,
                "concurrency": c,
                "requests": n,
                "failed": r.get("failed", 0),
                "mean_input_tokens": mean_in,
                "mean_output_tokens": mean_out,
                "ttft_p50_ms_measured": float(r["ttft_p50_ms"]),
                "ttft_p50_ms_sim": sim_ttft,
                "ttft_err_pct": 100 * e_ttft,
                "tpot_p50_ms_measured": float(r["tpot_p50_ms"]),
                "tpot_p50_ms_sim": sim_tpot,
                "tpot_err_pct": 100 * e_tpot,
                "throughput_tok_s_measured": r.get("throughput_tok_s"),
                "throughput_tok_s_sim": sim_tok_s,
                "within_20pct": abs(e_ttft) <= TOLERANCE and abs(e_tpot) <= TOLERANCE,
                "role": (
                    "calibration (fitted here)"
                    if fitted_here
                    else "calibration (new-shape cost)"
                    if shape_here
                    else "prediction"
                )
                if calibrate_rows
                else "prediction",
                "calibration": calibrated[tp][2] if calibrate_rows else "none (planner defaults)",
                "lengths": (
                    f"{lengths}; prompt tokens from server usage"
                    + (f" ({run.prompt_from_client} from the client tokenizer)" if run.prompt_from_client else "")
                ),
                "engine_limits": limits_src,
                "engine_profile": prof_desc,
            }
        )
    return out_rows, skipped
