"""scripts/results_identity.py: timestamps, paths and measured durations are left out; any other difference is
named by its key and fails the comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_identity.py"


def write_run(root: Path, name: str, results: dict[str, Any]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    text = json.dumps(results).replace("<run>", str(run))
    (run / "results.json").write_text(text)
    return run


def compare(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True, timeout=60)


def results(loss: float, wall: float, date: str, rows_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "job": "pretrain",
        "status": "complete",
        "rows": [{"final_loss": loss, "tokens_per_s": 1e4 / wall, "hf_dir": "<run>/hf", **(rows_extra or {})}],
        "measured": {"perf/step_time_s": wall / 10, "val/loss": 3.2},
        "date": date,
        "wall_time_s": wall,
    }


def test_timestamps_paths_and_durations_are_left_out(tmp_path: Path) -> None:
    before = write_run(tmp_path / "before", "pretrain", results(3.41, 60.0, "2026-12-01"))
    after = write_run(tmp_path / "after", "pretrain", results(3.41, 71.5, "2026-12-02"))
    out = compare(before, after)
    assert out.returncode == 0 and "pretrain: identical" in out.stdout, out.stdout + out.stderr
    out = compare(tmp_path / "before", tmp_path / "after")  # two roots: paired by relative path
    assert out.returncode == 0 and "1 of 1 identical" in out.stdout


def test_a_difference_is_named_and_fails(tmp_path: Path) -> None:
    before = write_run(tmp_path / "before", "pretrain", results(3.41, 60.0, "2026-12-01"))
    write_run(tmp_path / "before", "cost", {"job": "cost", "usd": 14.94})
    after = write_run(tmp_path / "after", "pretrain", results(3.4100001, 60.0, "2026-12-01", {"steps": 60}))
    out = compare(before, after)
    assert out.returncode == 1
    assert "rows[0].final_loss: 3.41 != 3.4100001" in out.stdout and "rows[0].steps: only in after" in out.stdout
    out = compare(tmp_path / "before", tmp_path / "after")
    assert out.returncode == 1 and "cost: results.json only in before" in out.stdout
    assert compare(tmp_path / "before", tmp_path / "missing").returncode == 2
