"""`phase6 fleet`: config validation, the smoke run's record, PD-grid rate search, bad traces (sim vs measured:
test_fleet_compare.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from runrecord_checks import run_smoke

from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig, FleetRunConfig
from phase6.fleet.run import build_setup
from phase6.fleet.sim import Topology
from phase6.launch import ConfigError, load_config

REPO = CONFIG_DIR.parent
HW = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text()))


@pytest.mark.parametrize(
    "override,key",
    [
        ("fleet.policies=[colocated,pd:0:2]", "fleet.policies"),
        ("fleet.routers=[fastest]", "fleet.routers"),
        ("engine.max_num_batched_tokens=16", "engine.max_num_batched_tokens"),
        ("workload.kind=parquet", "workload.kind"),
        ("slo.attainment=1.5", "slo.attainment"),
        ("slo.ttft_ms=null", "slo.ttft_ms"),
        ("slo.tbt_ms=0", "slo.tbt_ms"),
        ("load.rates=[0]", "load.rates"),
        ("engine.step_time=table", "engine.table_path"),
    ],
)
def test_bad_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config("fleet", [override])


def test_shipped_experiments_compose() -> None:
    for exp in sorted((CONFIG_DIR / "fleet" / "experiment").glob("*.yaml")):
        cfg = load_config("fleet", [f"experiment={exp.stem}"])
        assert isinstance(cfg, FleetRunConfig)
    cfg = load_config("fleet", ["workload=mooncake"])
    assert cfg.workload.path and cfg.workload.path.endswith("mooncake-traces/synthetic_trace.jsonl")


def test_smoke_run_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    run_smoke("fleet", run_dir, timeout=300)
    res = json.loads((run_dir / "results.json").read_text())
    rows = res["rows"]
    assert len(rows) == 2 * 4 * 2  # policies x routers x rates
    assert {r["policy"] for r in rows} == {"colocated", "pd:1:1"}
    for r in rows:
        assert 0 <= r["slo_attainment"] <= 1 and r["goodput_req_s"] <= r["offered_rate"] * 1.05
        assert r["usd_per_1m_output_tokens"] > 0
    tables = res["tables"]
    assert any(k.startswith("Replicas needed") for k in tables)
    grid = tables["When PD disaggregation pays (max rate within SLO, same GPUs)"]
    assert len(grid) == 1 and grid[0]["winner"] in ("PD", "colocated", "tie", "neither") and grid[0]["reason"]
    for f in (
        "config.yaml",
        "env.json",
        "metrics.jsonl",
        "results.md",
        "plots/goodput_vs_load.png",
        "plots/pd_grid.png",
    ):
        assert (run_dir / f).is_file(), f
    keys = set(json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0]))
    assert {"serve/goodput_req_s", "fleet/slo_attainment", "fleet/prefix_hit_rate"} <= keys


def test_pd_grid_max_rate_respects_decode_roofline() -> None:
    """Steady-state probes: the max rate within SLO can't exceed what the decode batches physically produce.

    (A short fixed probe at a high rate arrives within one request lifetime, is absorbed whole by the batch slots
    and overstates the rate.)
    """
    from phase6.config.slo import SLOConfig
    from phase6.fleet.run import search_rate, unloaded_latency

    # 2 x 256 batch slots > 300 requests: a fixed short probe is absorbed whole (the old method reported 3.2x the bound)
    cfg = FleetRunConfig(hardware=HW, model="llama3.1-8b", engine=EngineConfig(tp=1, max_num_seqs=256))
    setup = build_setup(cfg)
    inp, out, n = 16, 64, 2
    ttft0, tpot0 = unloaded_latency(setup, inp, out)
    e2e0 = ttft0 + (out - 1) * tpot0
    slo = SLOConfig(ttft_ms=4 * ttft0 * 1e3, tpot_ms=4 * tpot0 * 1e3)
    s = search_rate(setup, inp, out, e2e0, Topology(colocated=n), slo, n / e2e0, 5, 300, 0)
    best_tok_s = n * 256 / setup.model.decode_step_s(256, inp + out // 2)  # full batches at the mean context
    assert 0.5 * best_tok_s < s.rate * out <= 1.02 * best_tok_s
    assert s.ok_row is not None and s.ok_row["slo_attainment"] >= 0.9


def test_bad_trace_row_exits_2_with_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [2]}\n'
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "phase6",
            "fleet",
            "workload=mooncake",
            f"workload.path={trace}",
            "load.rates=[1]",
            "logger=none",
            f"run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"phase6: error: {trace}:2: timestamps not sorted (1 ms after 5 ms); sort the trace by arrival"
    ]
    assert not (run_dir / "results.json").exists()
