"""6B write-up: TP scaling ratios and the filled template from two fake serve-bench runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phase6.config import load_object


def fake_run(d: Path, tp: int, tok_s: float, tpot: float) -> None:
    d.mkdir(parents=True)
    row = {
        "engine": "vllm",
        "tp": tp,
        "concurrency": 16,
        "request_rate": None,
        "throughput_tok_s": tok_s,
        "ttft_p50_ms": 100.0,
        "ttft_p99_ms": 300.0,
        "itl_p50_ms": tpot,
        "itl_p99_ms": 2 * tpot,
        "tpot_p50_ms": tpot,
        "tpot_p99_ms": 1.5 * tpot,
        "goodput_req_s": 3.0,
        "gpu_hours_per_1m_output_tokens": tp * 1e6 / 3600 / tok_s,
        "usd_per_1m_output_tokens": 1.0,
        "completed": 200,
        "failed": 0,
        "model": "Qwen/Qwen2.5-72B-Instruct",
        "load": "sharegpt",
    }
    res = {
        "job": "serve_bench",
        "rows": [row],
        "details": {"tokens_from_usage_pct": 100.0, "errors": {}},
        "predicted": {
            "tpot_p50_ms": tpot * 0.8,
            "ttft_p50_ms": 50.0,
            "throughput_tok_s": tok_s * 1.2,
            "breakdown": {
                "decode_weights_ms": tpot * 0.5,
                "decode_kv_ms": tpot * 0.1,
                "decode_allreduce_ms": tpot * 0.2,
                "max_concurrent_seqs": 90,
                "fits": True,
            },
        },
        "telemetry": {"nvml": "ok", "metrics": "ok"},
        "workload": {"dataset": "sharegpt", "seed": 0},
        "slo": {"ttft_ms": 2000, "tpot_ms": 100, "e2e_ms": None},
        "tables": {
            "API price comparison": [
                {
                    "provider": "DeepInfra",
                    "model": "Qwen2.5-72B-Instruct",
                    "api_usd_per_1m_output": 0.39,
                    "output_api_over_self": 0.39,
                }
            ]
        },
    }
    (d / "results.json").write_text(json.dumps(res))


def test_tp_scaling_and_template(tmp_path: Path) -> None:
    fake_run(tmp_path / "sweep" / "0", 2, 1000.0, 40.0)
    fake_run(tmp_path / "sweep" / "1", 4, 1500.0, 30.0)
    find_runs, render, tp_scaling = (
        load_object(f"projects/6b_serving/writeup.py:{n}") for n in ("find_runs", "render", "tp_scaling")
    )
    runs = find_runs([str(tmp_path / "sweep")])
    (s,) = tp_scaling([r["rows"][0] for _, r in runs])
    assert s["tp"] == "2 -> 4" and s["gpu_ratio"] == 2.0 and s["throughput_ratio"] == pytest.approx(1.5)
    assert s["efficiency"] == pytest.approx(0.75) and s["tpot_p50_ratio"] == pytest.approx(0.75)
    text = render(runs)
    assert "{{" not in text and "| 2 -> 4 |" in text and "DeepInfra Qwen2.5-72B-Instruct" in text
    with pytest.raises(ValueError, match="no serve_bench results.json"):
        find_runs([str(tmp_path)])
