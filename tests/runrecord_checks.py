"""Shared steps of the `phase6 <job> experiment=smoke` end-to-end tests (test_dpo_smoke.py, test_grpo_smoke.py): run
the job offline in a subprocess and check its run directory (files, metrics.jsonl, results.json, results.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from phase6.config import CONFIG_DIR

REPO = CONFIG_DIR.parent


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment, offline (hub, datasets, W&B), plus ``extra``."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", **extra}


def phase6(*args: str, timeout: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m phase6 <args>` from the repo root, in ``env`` (default: :func:`offline_env`)."""
    return subprocess.run(
        [sys.executable, "-m", "phase6", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env or offline_env(),
    )


def run_smoke(job: str, run_dir: Path, *overrides: str, timeout: int, env: dict[str, str] | None = None) -> None:
    """`phase6 <job> experiment=smoke <overrides> run.dir=<run_dir>` succeeds and names its run dir last."""
    proc = phase6(job, "experiment=smoke", *overrides, f"run.dir={run_dir}", timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir}"


def run_sweep(job: str, sweep: Path, *overrides: str, timeout: int) -> list[dict[str, Any]]:
    """`phase6 <job> -m experiment=smoke <overrides> run.dir=<sweep>` succeeds; the rows of its summary.json."""
    proc = phase6(job, "-m", "experiment=smoke", *overrides, f"run.dir={sweep}", timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((sweep / "summary.json").read_text())["rows"]


# What every job's run directory holds (phase6 run records), before the job's own files.
RUN_RECORD_FILES = ("config.yaml", "env.json", "metrics.jsonl", "results.json", "results.md")


def assert_run_files(run_dir: Path, *job_files: str) -> None:
    """The run-record files and then ``job_files`` (relative paths) are all files in ``run_dir``."""
    for f in (*RUN_RECORD_FILES, *job_files):
        assert (run_dir / f).is_file(), f


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_results(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "results.json").read_text())


def assert_sections(run_dir: Path, sections: Iterable[str]) -> None:
    """Each of ``sections`` (headings, notes, plot links) appears in results.md."""
    md = (run_dir / "results.md").read_text()
    for section in sections:
        assert section in md, section
