"""Hold a job ``phase6 grpo engine=verl`` wrote against verl's OWN code, on CPU and without Ray running.

verl is pinned to :data:`VERL_SPEC`. ``make setup-vllm`` installs it without its dependencies into
``<vLLM venv>/verl`` (:data:`VERL_DIR`, beside SGLang's ``sglang-args``), with the few modules its import chain needs
that the vLLM environment lacks (:data:`VERL_EXTRA`: ``import verl`` imports ``verl.protocol``, which imports Ray and
tensordict at module level, so Ray's core wheel goes in too; nothing of Ray is started). ``$PHASE6_VERL_DIR``
points at another such directory. The check runs ``phase6/posttrain/verl_probe.py`` with that environment's
interpreter and ``PYTHONPATH=<verl dir>:<this phase6's src>`` (the reward file ``compute_score`` imports phase6) and
returns its result: config composition + ``validate_config``, verl's dataset on the parquet, verl's reward worker
on given completions. What each step runs: the probe's docstring.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from phase6.serving import vllm_env

VERL_VERSION = "0.9.1"
VERL_SPEC = f"verl=={VERL_VERSION}"
"""The verl release the CI checks run (``make setup-vllm``); the 6D README lists the known-good versions."""
VERL_EXTRA = (
    "ray==2.60.0",
    "tensordict==0.10.0",
    "codetiming==1.4.0",
    "msgpack==1.2.4",
    "orjson==3.13.0",
    "importlib_metadata==10.2.0",
    "zipp==4.1.2",
    "pyvers>=0.1,<0.2",
)
"""What verl's import chain (``verl.protocol``, ``verl.utils.profiler``, Ray's core) needs beyond the vLLM env
(scripts/setup_vllm.sh installs exactly these; tests/test_grpo_verl.py holds the two lists equal)."""
VERL_DIR = "verl"
"""Under the vLLM venv: ``pip install --no-deps --target`` of verl and :data:`VERL_EXTRA`."""
ENV_VAR = "PHASE6_VERL_DIR"
PROBE = Path(__file__).with_name("verl_probe.py")
SRC = Path(__file__).resolve().parents[2]


def verl_dir(python: str | None = None) -> Path | None:
    """``$PHASE6_VERL_DIR``, else ``<vLLM venv>/verl``, if it holds verl's trainer config; else None."""
    env = os.environ.get(ENV_VAR)
    py = python or vllm_env.vllm_python()
    d = Path(env) if env else (Path(py).parent.parent / VERL_DIR if py else None)
    return d if d is not None and (d / "verl" / "trainer" / "config" / "ppo_trainer.yaml").is_file() else None


def skip_reason() -> str:
    return f"no verl install: `make setup-vllm` puts {VERL_SPEC} into <vLLM venv>/{VERL_DIR} (or set {ENV_VAR})"


def check_many(jobs: list[dict[str, Any]], python: str | None = None, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the probe once on several jobs (``{"args": main_ppo's override list, "data": bool, "completions":
    [[row, text], ...]}``), paying verl's import once. RuntimeError when verl cannot be loaded or the probe dies."""
    py = python or vllm_env.vllm_python()
    d = verl_dir(py)
    if py is None or d is None:
        raise RuntimeError(skip_reason())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(d), str(SRC)]), "VERL_USE_EXTERNAL_PLUGINS": "none"}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return vllm_env.run_json_child([py, str(PROBE)], jobs, env, timeout_s, "verl probe failed")


def check(
    args: list[str], completions: list[tuple[int, str]] | None = None, data: bool = True, python: str | None = None
) -> dict[str, Any]:
    """One job: ``main_ppo``'s override list ``args``; ``completions`` scored on train rows by verl's reward worker."""
    return check_many([{"args": args, "data": data, "completions": [list(c) for c in completions or []]}], python)[0]


def answer_forms(rows: list[Any]) -> list[tuple[int, str]]:
    """(row index, completion) for each GSM8K row (``phase6.tasks.gsm8k.Gsm8kRow``): the reference solution and the
    forms where two scorers can differ (18.0, $1,080 without ####, \\boxed, a wrong number, another row's
    solution): what the reward check scores through verl's path and phase6's scorer."""
    out = []
    for i, r in enumerate(rows):
        gold, work = int(r.solution), r.answer.rsplit("####", 1)[0]
        out += [
            (i, r.answer),
            (i, f"{work}#### {gold}.0"),
            (i, f"{work}So the answer is ${gold:,}."),
            (i, f"{work}#### {gold + 1}"),
            (i, f"The final answer is \\boxed{{{gold}}}."),
            (i, rows[(i + 1) % len(rows)].answer),
        ]
    return out
