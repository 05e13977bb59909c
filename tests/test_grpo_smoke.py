"""`phase6 grpo experiment=smoke` end to end (CPU, offline, < 2 min) and a two-member staleness sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from phase6.config import CONFIG_DIR

REPO = CONFIG_DIR.parent


def phase6(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "phase6", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def test_smoke_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    proc = phase6("grpo", "experiment=smoke", f"run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir}"
    for f in (
        "config.yaml",
        "env.json",
        "metrics.jsonl",
        "results.json",
        "results.md",
        "steps.jsonl",
        "versions.jsonl",
        "plots/step_breakdown.png",
        "plots/lengths_before_after.png",
    ):
        assert (run_dir / f).is_file(), f
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = {k for m in metrics for k in m}
    for key in (
        "loss",
        "reward/mean",
        "kl",
        "time/rollout_s",
        "time/weight_sync_s",
        "time/policy_update_s",
        "time/ref_logprobs_s",
        "time/other_s",
        "time/step_s",
        "rollout/policy_version",
        "rollout/lag",
        "rollout/engine_tokens_per_s",
        "rollout/hf_generate_tokens_per_s",
        "staleness/is_weight_mean",
        "hack/format_reward_share",
        "hack/no_reasoning_frac",
        "lengths/p50",
        "clip_ratio/region_mean",
    ):
        assert key in logged, key
    versions = [json.loads(line) for line in (run_dir / "versions.jsonl").read_text().splitlines()]
    assert [v["policy_version"] for v in versions] == [0, 0, 1, 2, 3, 4]  # grpo.staleness=1 in the smoke
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 6
    phases = (
        "rollout",
        "weight_sync",
        "behaviour_logprobs",
        "reward",
        "ref_logprobs",
        "policy_update",
        "throughput_probe",
        "other",
    )
    assert all(abs(sum(s[p] for p in phases) - s["step"]) < 1e-6 for s in steps)
    res = json.loads((run_dir / "results.json").read_text())
    row = res["rows"][0]
    assert row["steps"] == 6 and row["staleness"] == 1 and row["engine"] == "hf"
    assert {"pass@1_before", "pass@1_after", "delta_points", "p_value", "engine_vs_hf_generate"} <= set(row)
    gpu = res["tables"]["GPU utilization (NVML)"][0]
    assert gpu["available"] is False and gpu["reason"]  # CPU machine: recorded, not faked
    md = (run_dir / "results.md").read_text()
    for section in (
        "## Step-time breakdown",
        "## Rollout throughput",
        "## Weight sync",
        "## Evaluation",
        "## Reward-hacking indicators",
        "## Policy version",
        "![step_breakdown](plots/step_breakdown.png)",
    ):
        assert section in md, section


def test_staleness_sweep_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = phase6(
        "grpo",
        "-m",
        "experiment=smoke",
        "grpo.staleness=0,2",
        "grpo.max_steps=3",
        "eval.enabled=false",
        "engine.probe_every=0",
        f"run.dir={sweep}",
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((sweep / "summary.json").read_text())["rows"]
    assert sorted(r["staleness"] for r in rows) == [0, 2]
    assert all(r["steps"] == 3 for r in rows)
    for key in ("loss_last", "kl_last", "reward_last", "clip_frac_mean"):
        assert all(key in r for r in rows), key
    versions = [
        json.loads(line)["policy_version"] for line in (sweep / "1" / "versions.jsonl").read_text().splitlines()
    ]
    assert versions == [0, 0, 0]  # k=2: the first three batches all come from the initial policy
