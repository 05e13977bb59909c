"""Which verl releases accept the job ``phase6 grpo engine=verl`` writes (docs/benchmarks.md, "engine=verl against
verl itself (issue 32)"): one row per verl install directory, from verl's own code (phase6.posttrain.verl_check).

    # each DIR: `pip install --no-deps --target DIR verl==X` + the modules of verl_check.VERL_EXTRA
    PHASE6_VLLM_PYTHON=.venv-vllm/bin/python python scripts/repro/verl_versions.py DIR [DIR ...] [--gsm8k PATH]

Per directory, one verl child process runs: the default job (1 and 8 GPUs) and the smoke job through verl's Hydra
config + ``validate_config``; verl's dataset on the smoke parquet; verl's reward worker on GSM8K completions (the
first 200 train rows of PATH, 6 completions each, as tests/test_grpo_verl.py builds them), compared with phase6's
scorer and with verl's built-in GSM8K score. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from phase6.launch import load_config
from phase6.posttrain import grpo_verl, verl_check
from phase6.tasks import gsm8k

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["experiment=smoke", "engine=verl", "grpo.staleness=0", "grpo.is_correction=none"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--gsm8k", default=str(ROOT / "tests" / "data" / "gsm8k_sample"))
    ap.add_argument("--rows", type=int, default=200)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="verl_versions_"))
    run = tmp / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "phase6", "grpo", *SMOKE, "engine.verl_launch=false", f"run.dir={run}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"smoke job failed: {proc.stderr[-2000:]}")
    smoke = grpo_verl.command(yaml.safe_load((run / "verl" / "overrides.yaml").read_text()))[3:]
    default = load_config("grpo", ["engine=verl"])
    rows = gsm8k.load_gsm8k(a.gsm8k, "train", limit=a.rows)
    gsm_dir = grpo_verl.write_verl_job(
        load_config("grpo", SMOKE), rows, rows[:4], tmp / "gsm8k", 1, str(run / "tiny_model")
    )
    items = verl_check.answer_forms(rows)
    ours = [gsm8k.score(t, rows[i].solution) for i, t in items]
    jobs = [
        {"args": grpo_verl.command(grpo_verl.verl_overrides(default, tmp, tmp, 1))[3:], "data": False},
        {"args": grpo_verl.command(grpo_verl.verl_overrides(default, tmp, tmp, 8))[3:], "data": False},
        {"args": smoke},
        {
            "args": grpo_verl.command(yaml.safe_load((gsm_dir / "overrides.yaml").read_text()))[3:],
            "completions": [list(c) for c in items],
        },
    ]
    print(f"GSM8K: {len(rows)} rows of {a.gsm8k}, {len(items)} completions, phase6 scorer: {sum(ours):.0f} correct")
    print(
        "| verl | default 1 GPU | default 8 GPUs | smoke | RLHFDataset rows (train/val) | reward function loaded |"
        " = phase6 scorer | verl built-in GSM8K score = phase6 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for d in a.dirs:
        os.environ[verl_check.ENV_VAR] = str(d.resolve())
        try:
            res = verl_check.check_many(jobs)
        except RuntimeError as e:
            print(f"| {d} | probe failed: {str(e).splitlines()[-1][:200]} | | | | | | |")
            continue

        def cfg(r: dict) -> str:
            return "ok" if r.get("validated") else r.get("compose_error") or r.get("validate_error", "?")

        data, rew = res[2].get("data"), res[3].get("reward")
        rows_txt = f"{data['train']['rows']}/{data['val']['rows']}" if data else res[2].get("data_error", "-")
        if rew:
            same = sum(x == y for x, y in zip(rew["scores"], ours, strict=True))
            builtin = sum(x == y for x, y in zip(rew["builtin_scores"], ours, strict=True))
            loaded = f"{rew['loaded']['function']} ({Path(rew['loaded']['file'] or '?').name})"
            tail = f"{loaded} | {same}/{len(ours)} | {builtin}/{len(ours)}"
        else:
            tail = f"{res[3].get('reward_error') or res[3].get('data_error') or '-'} | - | -"
        print(f"| {res[0]['verl_version']} | {cfg(res[0])} | {cfg(res[1])} | {cfg(res[2])} | {rows_txt} | {tail} |")


if __name__ == "__main__":
    main()
