"""engine=verl held against verl's OWN code (issue 32), not copies of it.

``phase6.posttrain.verl_check`` runs verl 0.9.1 (``make setup-vllm`` installs it into ``<vLLM venv>/verl``; skipped
with one line without it) in one child process on the jobs ``phase6 grpo engine=verl`` writes:

- config: verl's Hydra config (``verl/trainer/config/ppo_trainer.yaml``, what ``main_ppo`` composes) accepts every
  override of the default job (1 and 8 GPUs) and of the smoke job, and ``main()``'s ``validate_config`` passes; a
  misspelled key is rejected, naming it (so the check can fail);
- data: verl's ``create_rl_dataset`` (``RLHFDataset``) loads the written train/val parquet with the tiny model's
  tokenizer, keeps every row (none over ``max_prompt_length``), and hands on our prompt and ground truth;
- reward: verl's reward worker (``RewardLoopWorker`` -> ``load_reward_manager`` -> the custom-reward loader) loads
  ``grpo_verl.compute_score`` from the path we write and calls it, and its scores on GSM8K completions equal
  phase6's scorer exactly (scores are 0.0/1.0: tolerance 0). GSM8K rows: ../shared/data/gsm8k when present (200
  rows), else tests/data/gsm8k_sample (12 rows of the same file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import shared_data
from runrecord_checks import phase6

from phase6.launch import load_config
from phase6.posttrain import grpo_verl, verl_check
from phase6.tasks import gsm8k

SMOKE = ("experiment=smoke", "engine=verl", "grpo.staleness=0", "grpo.is_correction=none", "engine.verl_launch=false")
SAMPLE = Path(__file__).parent / "data" / "gsm8k_sample"
needs_verl = pytest.mark.skipif(verl_check.verl_dir() is None, reason=verl_check.skip_reason())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`phase6 grpo experiment=smoke engine=verl engine.verl_launch=false`: (run dir, stdout)."""
    run_dir = tmp_path_factory.mktemp("verl") / "smoke"
    proc = phase6("grpo", *SMOKE, f"run.dir={run_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc.stdout


def args_of(job_dir: Path) -> list[str]:
    """The override list command.sh passes to main_ppo (what run_verl launches)."""
    return grpo_verl.command(yaml.safe_load((job_dir / "overrides.yaml").read_text()))[3:]


def test_engine_verl_says_what_is_verified_and_ships_the_tiny_model(smoke_run: tuple[Path, str]) -> None:
    run_dir, stdout = smoke_run
    assert stdout.splitlines()[0] == grpo_verl.VERIFIED
    assert "NOT verified: a verl training run" in grpo_verl.VERIFIED and verl_check.VERL_VERSION in grpo_verl.VERIFIED
    o = yaml.safe_load((run_dir / "verl" / "overrides.yaml").read_text())
    model = Path(o["actor_rollout_ref.model.path"])  # model=tiny: a directory verl can load, not the word "tiny"
    assert model == run_dir / "tiny_model" and (model / "config.json").is_file()
    assert (model / "tokenizer.json").is_file() and o["actor_rollout_ref.model.trust_remote_code"] is False
    assert "custom_reward_function.path" not in o  # verl 0.9 ignores the legacy key (see test_reward_...)
    assert Path(o["reward.custom_reward_function.path"]).resolve() == Path(grpo_verl.__file__).resolve()


def gsm8k_rows() -> list[gsm8k.Gsm8kRow]:
    shared = shared_data()
    if shared is not None and (shared / "gsm8k" / "train.jsonl").is_file():
        return gsm8k.load_gsm8k(str(shared / "gsm8k"), "train", limit=200)
    return gsm8k.load_gsm8k(str(SAMPLE), "train")


def smoke_completion(job_dir: Path) -> str:
    """A correct answer to the smoke job's first train row, in a form verl's built-in string match rejects."""
    import pyarrow.parquet as pq

    gold = pq.read_table(job_dir / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"]
    return f"adding up, it is {gold}.0 in all"


@pytest.fixture(scope="module")
def probe(smoke_run: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One verl child process for every job below (verl's import chain costs ~10 s of CPU)."""
    if verl_check.verl_dir() is None:
        pytest.skip(verl_check.skip_reason())
    run_dir, _ = smoke_run
    smoke = args_of(run_dir / "verl")
    tmp = tmp_path_factory.mktemp("verl_jobs")
    default = load_config("grpo", ["engine=verl"])
    rows = gsm8k_rows()
    smoke_cfg = load_config("grpo", list(SMOKE[:-1]))
    gsm_dir = grpo_verl.write_verl_job(smoke_cfg, rows, rows[:4], tmp / "gsm8k", 1, str(run_dir / "tiny_model"))
    legacy = [a.removeprefix("reward.") for a in smoke]  # the key phase6 wrote before verl 0.9
    jobs = {
        "default_1gpu": {"args": grpo_verl.command(grpo_verl.verl_overrides(default, tmp, tmp, 1))[3:], "data": False},
        "default_8gpu": {"args": grpo_verl.command(grpo_verl.verl_overrides(default, tmp, tmp, 8))[3:], "data": False},
        "smoke": {"args": smoke, "completions": [[0, smoke_completion(run_dir / "verl")]]},
        "misspelled": {"args": [*smoke, "actor_rollout_ref.rollout.tempreature=1.0"], "data": False},
        "legacy_reward_key": {"args": legacy, "completions": [[0, "x"]]},
        "gsm8k": {"args": args_of(gsm_dir), "completions": [list(c) for c in verl_check.answer_forms(rows)]},
    }
    results = verl_check.check_many(list(jobs.values()))
    return {"results": dict(zip(jobs, results, strict=True)), "rows": rows, "smoke_dir": run_dir / "verl"}


@pytest.mark.slow
@needs_verl
def test_verl_config_composes_and_validates(probe: dict[str, Any]) -> None:
    r = probe["results"]
    for name in ("default_1gpu", "default_8gpu", "smoke", "gsm8k"):
        assert r[name]["verl_version"] == verl_check.VERL_VERSION, r[name]
        assert "compose_error" not in r[name] and r[name].get("validated") is True, (name, r[name])
        assert r[name]["reward_function"]["path"] == str(Path(grpo_verl.__file__).resolve())
    bad = r["misspelled"]
    assert "validated" not in bad and "actor_rollout_ref.rollout.tempreature" in bad["compose_error"]


@pytest.mark.slow
@needs_verl
def test_verl_dataset_loads_our_parquet(probe: dict[str, Any]) -> None:
    from datasets import Dataset

    smoke = probe["results"]["smoke"]
    assert "data_error" not in smoke, smoke["data_error"]
    data = smoke["data"]
    for split, n in (("train", 64), ("val", 8)):
        d = data[split]
        written = Dataset.from_parquet(str(probe["smoke_dir"] / f"{split}.parquet"))
        assert d["class"] == "RLHFDataset" and d["rows"] == n == len(written)  # nothing filtered out
        assert d["raw_prompt"] == written[0]["prompt"] and d["raw_prompt"][0]["content"].endswith(gsm8k.PROMPT_SUFFIX)
        assert d["data_source"] == "openai/gsm8k" and d["reward_model"] == written[0]["reward_model"]
        assert 0 < d["prompt_tokens"] <= d["max_prompt_length"]
    assert probe["results"]["gsm8k"]["data"]["train"]["rows"] == len(probe["rows"])


@pytest.mark.slow
@needs_verl
def test_verl_reward_loader_calls_our_compute_score(probe: dict[str, Any]) -> None:
    loaded = probe["results"]["smoke"]["reward"]["loaded"]
    assert loaded["function"] == "compute_score"
    assert Path(loaded["file"]).resolve() == Path(grpo_verl.__file__).resolve()
    reward = probe["results"]["smoke"]["reward"]
    assert reward["scores"] == [1.0] and reward["builtin_scores"] == [0.0]  # ours was called, not verl's
    assert gsm8k.score(smoke_completion(probe["smoke_dir"]), reward["ground_truths"][0]) == 1.0
    # the key phase6 wrote before: verl 0.9.1's main_ppo composes it and never reads it -> verl's built-in score
    assert probe["results"]["legacy_reward_key"]["reward"]["loaded"]["function"] == "default_compute_score"


@pytest.mark.slow
@needs_verl
def test_gsm8k_reward_through_verl_equals_phase6_scorer(probe: dict[str, Any]) -> None:
    job = probe["results"]["gsm8k"]
    assert "data_error" not in job and "reward_error" not in job, job
    rows, reward = probe["rows"], job["reward"]
    items = verl_check.answer_forms(rows)
    assert reward["ground_truths"] == [rows[i].solution for i, _ in items]  # through verl's dataset + collate
    assert all(reward["roundtrip_equal"])  # verl's decode gives back the completion text we scored
    ours = [gsm8k.score(text, rows[i].solution) for i, text in items]
    assert reward["scores"] == ours  # exact: 0.0/1.0
    assert 0 < sum(ours) < len(ours)
    # verl's built-in GSM8K score (string match after '####') differs exactly where ours is tolerant: 72.0, no ####
    builtin = reward["builtin_scores"]
    assert [b for b, (i, t) in zip(builtin, items, strict=True) if t.endswith(".0")] == [0.0] * len(rows)
    assert all(b <= s for b, s in zip(builtin, ours, strict=True))


def test_engine_verl_without_verl_is_one_line_and_no_run_dir(tmp_path: Path) -> None:
    """Launching (the default) from an environment without verl: exit 2, one line, after the verified-line."""
    import importlib.util

    if importlib.util.find_spec("verl") is not None:
        pytest.skip("verl is importable here: the job would launch")
    run_dir = tmp_path / "run"
    proc = phase6("grpo", *SMOKE[:-1], f"run.dir={run_dir}", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("phase6: error: engine.name=verl: verl is not installed")
    assert proc.stdout.splitlines()[0] == grpo_verl.VERIFIED
    assert not run_dir.exists()


def test_readme_quotes_the_verified_line() -> None:
    """The 6D README's blockquote is engine=verl's first output line, word for word."""
    readme = (Path(__file__).resolve().parents[1] / "projects" / "6d_grpo" / "README.md").read_text()
    assert grpo_verl.VERIFIED in " ".join(ln[2:] for ln in readme.splitlines() if ln.startswith("> "))


def test_one_verl_pin_everywhere() -> None:
    """setup-vllm installs what verl_check names, and `phase6[verl]` pins the same release."""
    import shlex

    root = Path(__file__).resolve().parents[1]
    setup = (root / "scripts" / "setup_vllm.sh").read_text()
    assert f"VERL_SPEC=${{VERL_SPEC:-{verl_check.VERL_SPEC}}}" in setup
    extra = setup.split("VERL_EXTRA=(", 1)[1].split(")", 1)[0]
    assert tuple(shlex.split(extra.replace("\n", " "))) == verl_check.VERL_EXTRA
    assert f'verl = ["{verl_check.VERL_SPEC}"]' in (root / "pyproject.toml").read_text()
