"""6B end to end on CPU: `phase6 serve-bench -m experiment=smoke load.concurrency=2,4` against a real
`transformers serve --continuous-batching` (tiny random model, local tokenizer, offline); the second sweep member
reuses the server. Skipped when transformers' serving extra (fastapi, uvicorn, openai) is missing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phase6.cli import app
from phase6.serving.stats import EXTRA_ROW_KEYS, ROW_KEYS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai")),
        reason="transformers[serving] extra not installed",
    ),
]


def test_smoke_sweep_end_to_end(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = CliRunner().invoke(
        app, ["serve-bench", "-m", "experiment=smoke", "load.concurrency=2,4", f"run.dir={sweep}"]
    )
    assert result.exit_code == 0, result.output
    members = [sweep / "0", sweep / "1"]
    res = [json.loads((d / "results.json").read_text()) for d in members]
    for d, r in zip(members, res, strict=True):
        (row,) = r["rows"]
        assert tuple(row)[: len(ROW_KEYS) + len(EXTRA_ROW_KEYS)] == ROW_KEYS + EXTRA_ROW_KEYS
        assert row["engine"] == "transformers" and row["tp"] == 1 and row["failed"] == 0 and row["completed"] == 40
        assert row["throughput_tok_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert row["itl_p50_ms"] > 0 and row["tpot_p50_ms"] > 0  # more than one chunk per answer
        det = r["details"]
        assert det["tokens_from_usage_pct"] == 100.0  # transformers puts usage in its last chunk
        assert det["planned"] == det["sent"] == 40
        assert r["telemetry"]["metrics"] == "unavailable: HTTP 404"  # transformers serve has no /metrics
        lines = (d / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 40 and all(json.loads(x)["ok"] for x in lines)
        assert (d / "plots" / "latency_cdf.png").is_file() and (d / "plots" / "timeseries.png").is_file()
        assert r["server"]["command"][1:5] == ["-m", "transformers.cli.transformers", "serve", r["server"]["model"]]
        assert "--continuous-batching" in r["server"]["command"]
    assert [r["rows"][0]["concurrency"] for r in res] == [2, 4]
    assert not res[0]["server"]["reused"] and res[1]["server"]["reused"]  # same engine/TP/model: not restarted
    assert res[0]["server"]["pid"] == res[1]["server"]["pid"]
    assert res[0]["workload"]["request_list_sha256"] == res[1]["workload"]["request_list_sha256"]
    assert (sweep / "plots" / "serve_vs_load.png").is_file() and (sweep / "summary.md").is_file()
