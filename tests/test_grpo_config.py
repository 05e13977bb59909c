"""GRPO config: every shipped YAML composes and validates, bad values fail naming the key, and engine=verl's
generated job (overrides + data) carries our settings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from phase6.config import CONFIG_DIR
from phase6.config.grpo import GrpoRunConfig, GrpoTrainConfig
from phase6.launch import ConfigError, load_config
from phase6.posttrain import grpo_verl
from phase6.tasks import gsm8k

GROUPS = {g: sorted(p.stem for p in (CONFIG_DIR / "grpo" / g).glob("*.yaml")) for g in ("model", "data", "engine")}


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_shipped_option_loads(group: str, option: str) -> None:
    cfg = load_config("grpo", [f"{group}={option}"])
    assert isinstance(cfg, GrpoRunConfig)


def test_defaults_and_experiments() -> None:
    cfg = load_config("grpo", [])
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.engine.name == "vllm" and cfg.engine.vllm_mode == "colocate"
    assert cfg.grpo.max_completion_length >= 512  # 256 truncates GSM8K chains
    assert cfg.grpo.samples_per_step == 512 and cfg.grpo.grad_accum_steps(1) == 32
    for exp in sorted(p.stem for p in (CONFIG_DIR / "grpo" / "experiment").glob("*.yaml")):
        assert isinstance(load_config("grpo", [f"experiment={exp}"]), GrpoRunConfig)
    smoke = load_config("grpo", ["experiment=smoke"])
    assert smoke.model.is_tiny and smoke.engine.name == "hf" and smoke.hardware.name == "cpu"


@pytest.mark.parametrize(
    "override,key",
    [
        ("grpo.staleness=-1", "grpo.staleness"),
        ("grpo.num_generations=1", "grpo.num_generations"),
        ("grpo.micro_batch_size=7", "grpo.micro_batch_size"),
        ("grpo.is_correction=magic", "grpo.is_correction"),
        ("grpo.loss_type=ppo", "grpo.loss_type"),
        ("engine.name=sglang", "engine.name"),
        ("engine.hf_decode=paged", "engine.hf_decode"),
        ("monitor.nvml_interval_s=0.5", "monitor.nvml_interval_s"),
        ("+grpo.trl.beta=0.1", "grpo.trl.beta"),
        ("+engine.vllm.mode=server", "engine.vllm.mode"),
        ("+engine.vllm.logprobs_mode=raw_logprobs", "engine.vllm.logprobs_mode"),
        ("model.tiny_heads=3", "model.tiny_heads"),
        ("grpo.mismatch_every=-1", "grpo.mismatch_every"),
    ],
)
def test_bad_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("grpo", [override])


def test_tiny_model_heads_fit_the_engine() -> None:
    smoke = load_config("grpo", ["experiment=smoke"])
    assert smoke.model.tiny_heads_for("hf") == 4  # head size 16, as before
    assert smoke.model.tiny_hidden_size // smoke.model.tiny_heads_for("vllm") == 32  # vLLM CPU attention: >= 32


def test_engine_vllm_without_a_vllm_environment_is_one_line(tmp_path: Path) -> None:
    """From a Python without vLLM and a vLLM env that is not there: exit 2, one line, no run directory."""
    from runrecord_checks import offline_env, phase6

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the job would run")
    run_dir = tmp_path / "run"
    env = offline_env(PHASE6_VLLM_PYTHON=str(tmp_path / "missing" / "python"))
    proc = phase6("grpo", "experiment=smoke", "engine=vllm", f"run.dir={run_dir}", timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("phase6: error: engine=vllm:") and "does not exist" in line
    assert not run_dir.exists()


def test_cross_field_rules() -> None:
    with pytest.raises(ConfigError, match="grpo.staleness"):
        load_config("grpo", ["engine=verl", "grpo.staleness=2"])
    with pytest.raises(ConfigError, match="enable_sleep_mode"):
        load_config("grpo", ["grpo.staleness=2", "+engine.vllm.enable_sleep_mode=true"])
    with pytest.raises(ConfigError, match="grpo.shared_prompt"):
        load_config("grpo", ["grpo.shared_prompt=true", "grpo.length_buckets=false"])
    with pytest.raises(ConfigError, match="engine.vllm_logprobs"):
        load_config("grpo", ["engine=vllm_server", "engine.vllm_logprobs=false"])
    with pytest.raises(ValueError, match="micro_batch_size"):
        GrpoTrainConfig(num_prompts=4, num_generations=4, micro_batch_size=8).grad_accum_steps(world_size=4)


def test_verl_job_carries_our_settings(tmp_path: Path) -> None:
    cfg = load_config(
        "grpo",
        [
            "engine=verl",
            "grpo.beta=0.002",
            "grpo.num_prompts=32",
            "grpo.loss_type=dr_grpo",
            "+engine.verl_overrides.trainer.val_before_train=false",
        ],
    )
    rows = gsm8k.synthetic_rows(6)
    out = grpo_verl.write_verl_job(cfg, rows[:4], rows[4:], tmp_path, num_gpus=2)
    o = yaml.safe_load((out / "overrides.yaml").read_text())
    assert o["algorithm.adv_estimator"] == "grpo"
    assert o["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert o["actor_rollout_ref.rollout.n"] == 8 and o["data.train_batch_size"] == 32
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 32  # one update per rollout batch (on-policy)
    assert o["actor_rollout_ref.actor.use_kl_loss"] is True and o["actor_rollout_ref.actor.kl_loss_coef"] == 0.002
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert o["data.max_response_length"] == 1024 and o["trainer.total_training_steps"] == 200
    assert o["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 8  # 16 per step split over 2 GPUs
    assert o["trainer.n_gpus_per_node"] == 2 and o["trainer.val_before_train"] is False  # user override wins
    assert o["reward.custom_reward_function.name"] == "compute_score"  # verl >= 0.9's key (tests/test_grpo_verl.py)
    assert Path(o["reward.custom_reward_function.path"]).resolve() == Path(grpo_verl.__file__).resolve()
    cmd = (out / "command.sh").read_text()
    assert "verl.trainer.main_ppo" in cmd and "algorithm.adv_estimator=grpo" in cmd
    assert "'trainer.logger=[console,wandb]'" in cmd  # a Hydra list, one shell word

    from datasets import Dataset

    train = Dataset.from_parquet(str(out / "train.parquet"))
    assert len(train) == 4 and train[0]["data_source"] == "openai/gsm8k"
    assert train[0]["reward_model"]["ground_truth"] == rows[0].solution
    assert train[0]["prompt"][0]["content"].endswith(gsm8k.PROMPT_SUFFIX)
    # our reward, through verl's custom-reward signature: tolerant where verl's string match is not
    assert grpo_verl.compute_score("openai/gsm8k", "so it is 18.0 dollars", "18") == 1.0


def test_verl_rejects_unmapped_settings(tmp_path: Path) -> None:
    cfg = load_config("grpo", ["engine=verl", "grpo.loss_type=cispo"])
    with pytest.raises(ValueError, match="grpo.loss_type"):
        grpo_verl.verl_overrides(cfg, tmp_path, tmp_path, 1)
