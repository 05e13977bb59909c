"""`make demo`: run every registered pipeline's smoke experiment on CPU, offline, and list the run directories.

A job takes part when it has ``configs/<job>/experiment/smoke.yaml``; jobs without one (cost) run a fixed example.
With a vLLM environment (``make setup-vllm``; phase6.serving.vllm_env) the real-vLLM smokes in ``VLLM_SMOKES`` run
too; without one they are skipped with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys

from phase6.config import CONFIG_DIR, JOBS
from phase6.serving import vllm_env
from phase6.terminal import format_rows
from phase6.timing import wall

EXAMPLES = {
    "cost": ["hardware=h100_sxm", "gpus=8", "hours=0.75", "output_tokens=5e9"],
    "prepare_data": ["run.name=demo"],  # the embedded corpus (CPython's docs), byte tokenizer: offline anywhere
    "plan": ["model=llama3.1-70b", "hardware=h100_sxm", "gpus=8", "workload=serve"],
}
# (label, job, overrides) against a real vLLM on CPU
VLLM_SMOKES = [("serve_bench (vLLM)", "serve_bench", ["experiment=smoke_vllm"])]


def main() -> int:
    results: list[tuple[str, str, float, str]] = []
    runs: list[tuple[str, str, list[str]]] = []
    for job in JOBS:
        smoke = CONFIG_DIR / job / "experiment" / "smoke.yaml"
        if smoke.is_file():
            runs.append((job, job, ["experiment=smoke"]))
        elif job in EXAMPLES:
            runs.append((job, job, EXAMPLES[job]))
    if vllm_env.vllm_python() is not None:
        runs += VLLM_SMOKES
    else:
        print(f"vLLM smokes skipped: {vllm_env.skip_reason()}", flush=True)
    for label, job, args in runs:
        cmd = [sys.executable, "-m", "phase6", job.replace("_", "-"), *args]
        print(f"\n=== {' '.join(cmd[2:])}", flush=True)
        t0 = wall()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        dt = wall() - t0
        sys.stdout.write(proc.stdout[-3000:])
        run_dir = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in reversed(proc.stdout.splitlines())
                if ln.startswith(("run dir:", "sweep dir:"))
            ),
            "",
        )
        if proc.returncode != 0:
            sys.stdout.write(proc.stderr[-3000:])
        if run_dir.startswith(os.getcwd() + os.sep):  # outputs/<job>/<stamp>: the table fits 80 columns
            run_dir = os.path.relpath(run_dir)
        results.append((label, "ok" if proc.returncode == 0 else f"FAILED ({proc.returncode})", dt, run_dir))
    rows = [{"job": j, "status": st, "seconds": round(dt), "run dir": d} for j, st, dt, d in results]
    print("\n" + format_rows(rows, "demo"))  # fitted to the terminal width (COLUMNS; 80 in a pipe)
    return 0 if all(r[1] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
