"""`phase6 grpo experiment=smoke` end to end (CPU, offline, < 2 min) and a two-member staleness sweep."""

from __future__ import annotations

from pathlib import Path

from runrecord_checks import assert_run_files, assert_sections, read_jsonl, read_results, run_smoke, run_sweep


def test_smoke_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    run_smoke("grpo", run_dir, timeout=180)
    assert_run_files(
        run_dir, "steps.jsonl", "versions.jsonl", "plots/step_breakdown.png", "plots/lengths_before_after.png"
    )
    logged = {k for m in read_jsonl(run_dir / "metrics.jsonl") for k in m}
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
    versions = read_jsonl(run_dir / "versions.jsonl")
    assert [v["policy_version"] for v in versions] == [0, 0, 1, 2, 3, 4]  # grpo.staleness=1 in the smoke
    steps = read_jsonl(run_dir / "steps.jsonl")
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
    res = read_results(run_dir)
    row = res["rows"][0]
    assert row["steps"] == 6 and row["staleness"] == 1 and row["engine"] == "hf"
    assert {"pass@1_before", "pass@1_after", "delta_points", "p_value", "engine_vs_hf_generate"} <= set(row)
    gpu = res["tables"]["GPU utilization (NVML)"][0]
    assert gpu["available"] is False and gpu["reason"]  # CPU machine: recorded, not faked
    assert_sections(
        run_dir,
        (
            "## Step-time breakdown",
            "## Rollout throughput",
            "## Weight sync",
            "## Evaluation",
            "## Reward-hacking indicators",
            "## Policy version",
            "![step_breakdown](plots/step_breakdown.png)",
        ),
    )


def test_staleness_sweep_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    rows = run_sweep(
        "grpo",
        sweep,
        "grpo.staleness=0,2",
        "grpo.max_steps=3",
        "eval.enabled=false",
        "engine.probe_every=0",
        timeout=240,
    )
    assert sorted(r["staleness"] for r in rows) == [0, 2]
    assert all(r["steps"] == 3 for r in rows)
    for key in ("loss_last", "kl_last", "reward_last", "clip_frac_mean"):
        assert all(key in r for r in rows), key
    versions = [v["policy_version"] for v in read_jsonl(sweep / "1" / "versions.jsonl")]
    assert versions == [0, 0, 0]  # k=2: the first three batches all come from the initial policy
