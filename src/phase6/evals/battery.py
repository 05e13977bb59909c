"""Regression battery: lm-evaluation-harness through its Python API, on a base model and on base + PEFT adapter.

``run_battery`` calls ``lm_eval.simple_evaluate`` with the ``hf`` model (HFLM) and ``model_args`` built from a local
directory or hub id plus an optional ``peft=<adapter dir>``, so the adapter that is evaluated is the one that was saved.
Built-in tasks (``mmlu``, ``truthfulqa_mc2``, ...) come from lm-eval's registry; custom tasks come from local JSONL
files, turned into lm-eval task YAMLs in a directory that is put on ``TaskManager(include_path=...)``:

- ``multiple_choice``: rows ``{"question": str, "choices": [str, ...], "answer": int}``; metric ``acc``.
- ``generate``: rows ``{"prompt": str, "target": str}``; greedy generation until a stop string, metric ``exact_match``
  (whitespace-stripped), e.g. tool-calling-style checks where the target is the exact call.

Scores are fractions in [0, 1]; tables and the verdict report them in points (×100).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phase6.config.evals import LocalTask
from phase6.textio import iter_jsonl

# Primary metric per built-in task: (metric, filter) as in lm-eval's result keys "<metric>,<filter>".
PRIMARY_METRIC: dict[str, tuple[str, str]] = {
    "mmlu": ("acc", "none"),
    "truthfulqa_mc1": ("acc", "none"),
    "truthfulqa_mc2": ("acc", "none"),
    "hellaswag": ("acc_norm", "none"),
    "arc_easy": ("acc_norm", "none"),
    "arc_challenge": ("acc_norm", "none"),
    "piqa": ("acc_norm", "none"),
    "winogrande": ("acc", "none"),
    "gsm8k": ("exact_match", "flexible-extract"),
    "ifeval": ("prompt_level_strict_acc", "none"),
}


def _validate_local_rows(task: LocalTask) -> int:
    """Check every row of the JSONL file; one-line ValueError naming file and line. Returns the row count."""
    path = Path(task.path)
    if not path.is_file():
        raise ValueError(f"eval.local_tasks[{task.name}].path: {path} is not a file")
    n = 0
    for lineno, row in iter_jsonl(path):
        if task.kind == "multiple_choice":
            ok = (
                isinstance(row, dict)
                and isinstance(row.get("question"), str)
                and isinstance(row.get("choices"), list)
                and len(row["choices"]) >= 2
                and all(isinstance(c, str) for c in row["choices"])
                and isinstance(row.get("answer"), int)
                and 0 <= row["answer"] < len(row["choices"])
            )
            want = '{"question": str, "choices": [>=2 str], "answer": int index into choices}'
        else:
            ok = isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("target"), str)
            want = '{"prompt": str, "target": str}'
        if not ok:
            raise ValueError(f"{path}: line {lineno}: expected {want}")
        n += 1
    if n == 0:
        raise ValueError(f"{path}: no rows")
    return n


def write_local_task(task: LocalTask, task_dir: str | Path) -> Path:
    """Validate the JSONL file and write an lm-eval task YAML for it into ``task_dir``."""
    _validate_local_rows(task)
    task_dir = Path(task_dir)
    task_dir.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(task.path).resolve())}},
        "test_split": "test",
        "metadata": {"version": 1.0},
    }
    if task.kind == "multiple_choice":
        spec = {
            **common,
            "output_type": "multiple_choice",
            "doc_to_text": "Question: {{question}}\nAnswer:",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "answer",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
    else:
        spec = {
            **common,
            "output_type": "generate_until",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{target}}",
            "generation_kwargs": {"until": list(task.until), "do_sample": False, "max_gen_toks": task.max_gen_toks},
            "filter_list": [
                {"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}
            ],
            "metric_list": [
                {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": False}
            ],
        }
    out = task_dir / f"{task.name}.yaml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


@dataclass
class TaskScore:
    task: str
    metric: str
    value: float
    stderr: float | None
    n: int | None


@dataclass
class BatteryResult:
    """Primary score per task, plus lm-eval's full ``results`` dict for the record."""

    label: str
    scores: dict[str, TaskScore]
    raw: dict[str, Any]


def primary_score(task: str, res: dict[str, Any], local_metric: dict[str, str], n: int | None) -> TaskScore:
    """Pick the task's primary metric from lm-eval's ``results[task]`` dict."""
    if task in local_metric:
        metric, filt = local_metric[task], ("strip" if local_metric[task] == "exact_match" else "none")
    elif task in PRIMARY_METRIC:
        metric, filt = PRIMARY_METRIC[task]
    else:  # first plain metric lm-eval reported
        keys = [k for k in res if "," in k and "_stderr" not in k]
        if not keys:
            raise ValueError(f"eval.tasks: lm-eval returned no metric for task {task!r}")
        metric, filt = keys[0].split(",", 1)
    key = f"{metric},{filt}"
    if key not in res:
        raise ValueError(f"eval.tasks: task {task!r} has no metric {key!r}; lm-eval reported {sorted(res)}")
    se = res.get(f"{metric}_stderr,{filt}")
    stderr = float(se) if isinstance(se, (int, float)) and not math.isnan(float(se)) else None
    return TaskScore(task=task, metric=metric, value=float(res[key]), stderr=stderr, n=n)


def run_battery(
    pretrained: str,
    tasks: Sequence[str],
    *,
    label: str,
    peft: str | None = None,
    local_tasks: Sequence[LocalTask] = (),
    task_dir: str | Path | None = None,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int | str = 8,
    device: str | None = None,
    dtype: str = "bfloat16",
    apply_chat_template: bool = False,
    trust_remote_code: bool = False,
    seed: int = 1234,
) -> BatteryResult:
    """Evaluate ``pretrained`` (+ ``peft`` adapter) on built-in and local tasks with identical settings.

    ``limit`` caps examples per task (use it only for smoke runs: a capped MMLU is not MMLU).
    """
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    local_names = [t.name for t in local_tasks]
    builtin = [t for t in tasks if t not in local_names]
    if local_tasks and task_dir is None:
        raise ValueError("eval.local_tasks: a task_dir is needed to write the task YAMLs")
    for t in local_tasks:
        write_local_task(t, task_dir)  # type: ignore[arg-type]
    # Indexing lm-eval's ~15k built-in task YAMLs takes ~10 s, so skip it when only local tasks are asked for
    tm = TaskManager(include_path=str(task_dir) if local_tasks else None, include_defaults=bool(builtin))
    unknown = [t for t in [*builtin, *local_names] if t not in tm.all_tasks]
    if unknown:
        raise ValueError(f"eval.tasks: unknown lm-eval task(s) {unknown}")
    model_args: dict[str, Any] = {"pretrained": pretrained, "dtype": dtype, "trust_remote_code": trust_remote_code}
    if peft is not None:
        model_args["peft"] = peft
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=model_args,
        tasks=[*builtin, *local_names],
        num_fewshot=num_fewshot,
        batch_size=batch_size,
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
        limit=limit,
        log_samples=False,
        apply_chat_template=apply_chat_template,
        task_manager=tm,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    if out is None:  # non-zero ranks under accelerate get None
        return BatteryResult(label=label, scores={}, raw={})
    local_metric = {t.name: ("acc" if t.kind == "multiple_choice" else "exact_match") for t in local_tasks}
    n_samples = out.get("n-samples", {})
    scores = {}
    for task in [*builtin, *local_names]:
        n = n_samples.get(task, {}).get("effective") if isinstance(n_samples.get(task), dict) else None
        scores[task] = primary_score(task, out["results"][task], local_metric, n)
    return BatteryResult(label=label, scores=scores, raw={"results": out["results"], "n-shot": out.get("n-shot")})


def delta_rows(before: BatteryResult, after: BatteryResult) -> list[dict[str, Any]]:
    """Before/after/delta in points (×100) per task; ± is lm-eval's bootstrap/analytic stderr."""
    rows = []
    for task, b in before.scores.items():
        a = after.scores[task]

        def fmt(s: TaskScore) -> str:
            return f"{100 * s.value:.2f}" + (f" ± {100 * s.stderr:.2f}" if s.stderr is not None else "")

        rows.append(
            {
                "task": task,
                "metric": b.metric,
                "n": b.n if b.n is not None else "",
                before.label: fmt(b),
                after.label: fmt(a),
                "delta (pts)": f"{100 * (a.value - b.value):+.2f}",
            }
        )
    return rows
