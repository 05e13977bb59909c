"""A mistyped option of any config group is one line and exit 2, before any work (issue 22).

Hydra's ``- optional experiment: null`` skips a missing option silently, so ``phase6 pretrain experiment=<typo>`` used
to run the default job and exit 0. The table below is written out by hand (not derived from the code under test):
every job, every group of its defaults list.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from phase6.config import CONFIG_DIR, JOBS
from phase6.launch import ConfigError, job_groups, load_config, preflight

REPO = CONFIG_DIR.parent

GROUPS = {
    "cost": ["hardware", "logger", "prices"],
    "prepare_data": ["hardware", "logger", "data"],
    "pretrain": ["hardware", "logger", "data", "model", "optim", "parallel", "train", "experiment"],
    "eval": ["hardware", "logger", "experiment"],
    "dpo": ["hardware", "logger", "model", "lora", "data", "experiment"],
    "grpo": ["hardware", "logger", "model", "data", "engine", "experiment"],
    "plan": ["hardware", "logger", "model"],
    "fleet": ["hardware", "logger", "workload", "experiment"],
    "serve_bench": ["hardware", "logger", "prices", "serve", "load", "slo", "experiment"],
}
CASES = [(job, group) for job, groups in GROUPS.items() for group in groups]


def test_table_covers_every_job_and_group() -> None:
    assert set(GROUPS) == set(JOBS)
    for job, groups in GROUPS.items():
        assert sorted(job_groups(job)) == sorted(groups), job


@pytest.mark.parametrize("job,group", CASES, ids=[f"{j}-{g}" for j, g in CASES])
def test_unknown_option_names_group_value_and_options(job: str, group: str) -> None:
    options = job_groups(job)[group]
    with pytest.raises(ConfigError) as e:
        load_config(job, [f"{group}=nope_xyz"])
    msg = str(e.value)
    assert "\n" not in msg
    if options:
        assert msg.startswith(f"{group}=nope_xyz: no such {group} for {job}; choose from ")
        assert msg.endswith(", ".join(options))
    else:
        assert msg == f"{group}=nope_xyz: {job} has no {group} presets"


@pytest.mark.parametrize("job,group", CASES, ids=[f"{j}-{g}" for j, g in CASES])
def test_every_existing_option_passes_the_check(job: str, group: str) -> None:
    """The check must not reject a real option (composition errors of other keys are not this test's business)."""
    for option in job_groups(job)[group]:
        try:
            load_config(job, [f"{group}={option}"])
        except ConfigError as e:
            assert "no such" not in str(e) and "has no config group" not in str(e), (job, group, option, e)


def test_a_group_the_job_does_not_have() -> None:
    with pytest.raises(ConfigError, match=r"^experiment=nope_xyz: cost has no config group 'experiment'; its groups: "):
        load_config("cost", ["experiment=nope_xyz"])


def test_plain_key_named_like_another_jobs_group_is_not_a_group() -> None:
    """`model` is a group of pretrain but a plain value (a planner preset) of the fleet: not checked as a group."""
    cfg = load_config("fleet", ["model=llama3.1-8b"])
    assert cfg.model == "llama3.1-8b"


def test_sweep_member_with_a_typo_fails_before_the_first_runs() -> None:
    with pytest.raises(ConfigError, match=r"^experiment=nope_xyz: no such experiment for fleet"):
        preflight("fleet", ["experiment=smoke,nope_xyz"], multirun=True)


@pytest.mark.parametrize(
    "args",
    [
        ["pretrain", "experiment=nope_xyz"],
        ["fleet", "experiment=nope_xyz"],
        ["dpo", "experiment=nope_xyz"],
        ["grpo", "experiment=nope_xyz"],
        ["serve-bench", "experiment=nope_xyz"],
        ["cost", "experiment=nope_xyz"],
        ["pretrain", "-m", "experiment=smoke,nope_xyz"],
    ],
    ids=lambda a: "_".join(a),
)
def test_cli_one_line_exit_2_and_no_run_dir(args: list[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "phase6", *args, f"run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PATH": "/usr/bin:/bin"},
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phase6: error: experiment=nope_xyz: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not run_dir.exists() and not (tmp_path / "outputs").exists()
    print(f"{' '.join(args)}: exit 2 in {wall:.2f} s")  # the 3 s bar, shown rather than asserted (loaded CI)
