"""The run directory is decided once, by the launcher, and handed down: under torchrun rank 0 decides and the other
ranks receive its answer (or its refusal) through torchrun's rendezvous store; library code raises, the CLI exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from phase6.cli import app

REPO = Path(__file__).resolve().parents[1]


def torchrun_cost(cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """`phase6 cost` (no GPU, no process group) on 2 torchrun ranks: only the run-directory agreement is exercised."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "phase6", "cost", "hours=1", *overrides]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_ranks_agree_on_the_default_run_dir(tmp_path: Path) -> None:
    proc = torchrun_cost(tmp_path, "run.name=ranks")
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = list((tmp_path / "outputs" / "cost").iterdir())
    assert len(dirs) == 1 and dirs[0].name.endswith("_ranks"), dirs  # one directory, not one per rank
    assert (dirs[0] / "results.json").is_file()
    assert proc.stdout.count("run dir: ") == 1 and proc.stdout.strip().endswith(str(dirs[0].relative_to(tmp_path)))


def test_torchrun_ranks_share_rank_0s_refusal(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "results.json").write_text("{}")
    proc = torchrun_cost(tmp_path, f"run.dir={taken}")
    assert proc.returncode != 0
    # both ranks stop on the same one line (rank 1 gets it from rank 0 instead of waiting for a directory)
    assert proc.stderr.count("holds another run's records") == 2, proc.stderr[-3000:]
    assert "phase6/launch.py" not in proc.stderr  # no worker traceback (torchrun prints its own ChildFailedError)
    assert sorted(p.name for p in taken.iterdir()) == ["results.json"]


def test_overrides_reach_env_json_as_data(tmp_path: Path) -> None:
    import json

    result = CliRunner().invoke(app, ["cost", "gpus=2", f"run.dir={tmp_path / 'r'}"])
    assert result.exit_code == 0, result.output
    env = json.loads((tmp_path / "r" / "env.json").read_text())
    assert env["overrides"].split() == ["gpus=2", f"run.dir={tmp_path / 'r'}"]
    assert "PHASE6_OVERRIDES" not in os.environ


def test_fleet_bench_bad_flag_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(app, ["fleet-bench", "--scenarios", "nope"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "phase6: error: --scenarios: unknown scenario 'nope'; known: " + result.output.split("known: ", 1)[1].strip()
    ]
