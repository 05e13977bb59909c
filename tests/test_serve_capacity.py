"""serve-bench capacity mode: the search (bracketing + bisection) against fake measured curves, the capacity's Wilson
interval, which SLO breaks first, config refusals, the write-up's capacity section -- and (slow) the whole mode
against a real vLLM on CPU (`experiment=capacity_smoke_vllm`: one server start, prediction before the first probe)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from phase6.config import load_object
from phase6.config.slo import SLOConfig
from phase6.launch import ConfigError, load_config
from phase6.serving import server as servers
from phase6.serving import vllm_env
from phase6.serving.capacity import (
    CapacitySearch,
    capacity_estimate,
    crossing,
    probe_point,
    slo_broken_first,
    wilson,
)
from phase6.serving.stats import ROW_KEYS

TARGET, CONF, N = 0.9, 0.95, 400


def fake_counts(x: float, ttft_knee: float, tpot_knee: float, width: float = 0.08) -> dict[str, int]:
    """A measured curve: each threshold's attainment falls from 1 to 0 over +-width around its knee (linear), the
    joint attainment is their product (independent misses); counts of N requests, rounded."""

    def a(knee: float) -> float:
        return min(1.0, max(0.0, 0.5 - (x / knee - 1) / (2 * width)))

    t, p = a(ttft_knee), a(tpot_knee)
    return {"good": round(N * t * p), "ttft_ms": round(N * t), "tpot_ms": round(N * p)}


def run_search(search: CapacitySearch, ttft_knee: float, tpot_knee: float) -> tuple[list[dict], str]:
    points: list[dict] = []
    while True:
        x, why = search.next([(p["load"], p["passed"]) for p in points])
        if x is None:
            return points, why
        points.append(probe_point(x, N, fake_counts(x, ttft_knee, tpot_knee), TARGET, CONF))


def true_capacity(ttft_knee: float, tpot_knee: float) -> float:
    """Where the fake joint attainment crosses TARGET (fine scan)."""
    x = 0.01
    while fake_counts(x, ttft_knee, tpot_knee)["good"] / N >= TARGET:
        x *= 1.0005
    return x


@pytest.mark.parametrize("start", [3.0, 20.0, 25.0, 200.0])
def test_rate_search_brackets_the_true_capacity_to_the_resolution(start: float) -> None:
    s = CapacitySearch(start, 0.5, 1000.0, growth=1.5, resolution=0.05, max_probes=12)
    points, why = run_search(s, ttft_knee=22.0, tpot_knee=40.0)
    assert why.startswith("resolution reached"), why
    assert len(points) <= 12 and points[0]["load"] == start  # the first probe is the start (the prediction)
    est = capacity_estimate(points, TARGET, CONF)
    lo, hi = est["highest_passing_load"], est["lowest_failing_load"]
    truth = true_capacity(22.0, 40.0)
    assert lo <= truth <= hi and hi / lo - 1 <= 0.05
    assert lo <= est["value"] <= hi
    ci_lo, ci_hi = est["ci"]
    assert ci_lo <= est["value"] <= ci_hi and ci_lo > 0.5 * truth and ci_hi < 1.5 * truth
    assert est["pass_fail_monotone"]


def test_a_good_prediction_saves_probes() -> None:
    near, _ = run_search(CapacitySearch(21.0, 0.5, 1000.0, 1.25, 0.05, 20), 22.0, 40.0)
    far, _ = run_search(CapacitySearch(400.0, 0.5, 1000.0, 1.25, 0.05, 20), 22.0, 40.0)
    assert len(near) < len(far), (len(near), len(far))


def test_max_probes_and_bounds_stop_the_search() -> None:
    pts, why = run_search(CapacitySearch(1.0, 0.5, 1000.0, 1.5, 0.001, 4), 22.0, 40.0)
    assert len(pts) == 4 and why.startswith("max_probes=4")
    pts, why = run_search(CapacitySearch(5.0, 2.0, 1000.0, 2.0, 0.05, 10), 1.0, 40.0)
    assert "below min_load" in why and all(not p["passed"] for p in pts) and pts[-1]["load"] == 2.0
    est = capacity_estimate(pts, TARGET, CONF)
    assert est["value"] is None and "below the lowest probe" in est["value_missing_reason"]
    pts, why = run_search(CapacitySearch(5.0, 1.0, 30.0, 2.0, 0.05, 10), 100.0, 200.0)
    assert "capacity >= max_load" in why and pts[-1]["load"] == 30.0
    est = capacity_estimate(pts, TARGET, CONF)
    assert est["value"] is None and est["ci"][1] is None and "above the highest probe" in est["ci_missing_reason"][1]


def test_concurrency_search_probes_integers_down_to_adjacent() -> None:
    s = CapacitySearch(10.0, 1.0, 512.0, 2.0, 0.01, 20, integer=True)
    pts, why = run_search(s, ttft_knee=70.0, tpot_knee=37.0)
    assert all(p["load"] == int(p["load"]) for p in pts)
    lo, hi = CapacitySearch.bracket([(p["load"], p["passed"]) for p in pts])
    assert hi - lo == 1 and "resolution reached" in why
    assert lo <= true_capacity(70.0, 37.0) <= hi


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson(9, 10, 0.95)  # Wilson (1927) score interval, z = 1.96
    assert lo == pytest.approx(0.5958, abs=1e-4) and hi == pytest.approx(0.9821, abs=1e-4)
    lo, hi = wilson(400, 400, 0.95)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(400 / (400 + 1.959964**2), abs=1e-6)
    assert all(math.isnan(v) for v in wilson(0, 0, 0.95))


def test_crossing_interpolates_and_names_open_ends() -> None:
    assert crossing([1, 2, 4], [1.0, 0.95, 0.75], 0.9) == (pytest.approx(2.5), "")
    assert crossing([1, 2], [0.5, 0.4], 0.9)[0] is None
    assert crossing([1, 2], [1.0, 0.95], 0.9)[1].startswith("above the highest probe")


@pytest.mark.parametrize(
    ("ttft_knee", "tpot_knee", "first"), [(22.0, 40.0, "TTFT"), (40.0, 22.0, "TPOT"), (500.0, 600.0, "none")]
)
def test_slo_broken_first_is_the_threshold_crossing_lowest(ttft_knee: float, tpot_knee: float, first: str) -> None:
    pts, _ = run_search(CapacitySearch(10.0, 0.5, 100.0, 1.5, 0.02, 16), ttft_knee, tpot_knee)
    name, cross = slo_broken_first(pts, SLOConfig(), TARGET)
    assert name == first, cross


def test_joint_breakage_when_no_single_threshold_crosses() -> None:
    # each threshold alone keeps 92 %, together 0.92 * 0.92 = 0.846 < 0.9 at the higher load
    pts = [
        probe_point(10.0, 100, {"good": 100, "ttft_ms": 100, "tpot_ms": 100}, TARGET, CONF),
        probe_point(20.0, 100, {"good": 85, "ttft_ms": 92, "tpot_ms": 92}, TARGET, CONF),
    ]
    assert slo_broken_first(pts, SLOConfig(), TARGET)[0] == "joint"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("capacity.search=bisect", "capacity.search"),
        ("capacity.growth=1", "capacity.growth"),
        ("capacity.max_probes=1", "capacity.max_probes"),
        ("capacity.start=5000", "capacity.start"),
        ("capacity.requests_per_probe=3", "capacity.requests_per_probe"),
        ("capacity.resolution=0", "capacity.resolution"),
        ("capacity.arrival=trace", "capacity.arrival"),
    ],
)
def test_bad_capacity_configs_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("serve_bench", ["capacity.search=rate", override] if "search=" not in override else [override])


def test_concurrency_search_needs_the_closed_loop() -> None:
    with pytest.raises(ConfigError, match=r"load\.arrival"):
        load_config("serve_bench", ["capacity.search=concurrency", "load=poisson", "load.request_rate=2"])
    cfg = load_config("serve_bench", ["experiment=capacity_h200_vllm"])
    assert cfg.capacity.search == "rate" and cfg.slo.ttft_ms == 2000 and cfg.slo.tpot_ms == 100


def test_writeup_states_which_slo_breaks_first(tmp_path: Path) -> None:
    pts, _ = run_search(CapacitySearch(10.0, 0.5, 100.0, 1.5, 0.05, 12), 22.0, 40.0)
    est = capacity_estimate(pts, TARGET, CONF)
    first, cross = slo_broken_first(pts, SLOConfig(), TARGET)
    rows = [{**dict.fromkeys(ROW_KEYS, 0), **p, "engine": "vllm", "tp": 1, "probe": i} for i, p in enumerate(pts)]
    res = {
        "job": "serve_bench",
        "rows": rows,
        "capacity": {
            **est,
            "search": "rate",
            "unit": "req/s",
            "probes": len(pts),
            "predicted": 21.0,
            "at_capacity": {"usd_per_1m_output_tokens": 0.5, "goodput_req_s": 19.0},
        },
        "slo_broken_first": first,
        "knee": {"rows": [{"load": est["highest_passing_load"]}], "slo_crossings": cross, "why": "queue grows"},
        "server": {"version": "0.26.0"},
    }
    d = tmp_path / "cap"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(res))
    writeup = load_object("projects/6b_serving/writeup.py:render")
    find = load_object("projects/6b_serving/writeup.py:find_runs")
    text = writeup(find([str(d)]))
    assert "**TTFT** breaks first (TTFT at" in text and "{{" not in text
    assert f"{est['value']:.4g}" in text


VLLM_PY = vllm_env.vllm_python()


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PY is None, reason=vllm_env.skip_reason())
def test_capacity_search_on_real_vllm_cpu(tmp_path: Path) -> None:
    """`experiment=capacity_smoke_vllm`: one server start, the prediction written before the first probe picks it,
    every probe a row, top-level capacity / slo_broken_first / knee, the plot; ~3-5 min on 2 shared cores. Where the
    knee lies depends on this machine's load (6-30 req/s seen), so the checks hold for a bracket or a bound."""
    from typer.testing import CliRunner

    from phase6.cli import app

    run_dir = tmp_path / "cap"
    try:
        r = CliRunner().invoke(app, ["serve-bench", "experiment=capacity_smoke_vllm", f"run.dir={run_dir}"])
    finally:
        servers.stop_all()  # in-process run: its pinned server must not be reused by the next test's sweep
    assert r.exit_code == 0, r.output[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    pred = json.loads((run_dir / "prediction.json").read_text())
    rows = res["rows"]
    assert 1 <= len(rows) <= 6 and [p["probe"] for p in rows] == list(range(len(rows)))
    assert all(p["passed"] == (p["attainment"] >= 0.9) for p in rows)
    assert rows[0]["load"] == pytest.approx(pred["first_probe"])  # the prediction picked the first probe
    assert all(p["planned"] == 40 and p["completed"] + p["failed"] == 40 for p in rows)
    cap = res["capacity"]
    assert {"value", "ci", "highest_passing_load", "lowest_failing_load", "at_capacity", "predicted"} <= set(cap)
    assert res["slo_broken_first"] in ("TTFT", "TPOT", "E2E", "TTFT+TPOT", "joint", "none")
    assert cap["probes"] == len(rows)
    lo, hi = cap["highest_passing_load"], cap["lowest_failing_load"]
    if lo is not None and hi is not None:  # a knee inside [1, 128] req/s: the estimate lies in the bracket
        assert lo <= cap["value"] <= hi and cap["stop_reason"].startswith(("resolution reached", "max_probes"))
    else:  # this box served everything (or nothing) in range: the search says which bound stopped it
        assert ("max_load" in cap["stop_reason"]) == (hi is None) and cap["value"] is None
    # one server start for the whole search: one command line ("$ ...", phase6.serving.server) in server.log
    assert sum(line.startswith("$ ") for line in (run_dir / "server.log").read_text().splitlines()) == 1
    assert (run_dir / "plots" / "capacity.png").stat().st_size > 0
    reqs = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 40 * len(rows) and {q["probe"] for q in reqs} == set(range(len(rows)))


def test_knee_sentence_follows_the_evidence() -> None:
    why = load_object("projects/6b_serving/capacity.py:knee_why")
    lo = {"load": 20.0, "ttft_p50_ms": 100.0, "server_queue_time_mean_ms": 5.0, "itl_p99_ms": 40.0}
    queued = {"load": 25.0, "ttft_p50_ms": 900.0, "server_queue_time_mean_ms": 700.0, "itl_p99_ms": 41.0}
    unqueued = {**queued, "server_queue_time_mean_ms": 6.0}
    assert "queueing." in why("TTFT", lo, queued, "req/s")
    assert "not to queueing" in why("TTFT", lo, unqueued, "req/s")
    assert "batch fill" in why("TPOT", lo, {**queued, "itl_p99_ms": 150.0}, "req/s")
    assert "no knee" in why("none", lo, None, "req/s")
