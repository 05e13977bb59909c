"""Every YAML composes into its dataclass; bad keys, types and values exit 2 naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from phase6.cli import app
from phase6.config import CONFIG_DIR, JOBS
from phase6.launch import ConfigError, expand_sweep, load_config

runner = CliRunner()


def _defaults_groups(job: str) -> set[str]:
    primary = yaml.safe_load((CONFIG_DIR / f"{job}.yaml").read_text()) or {}
    groups = set()
    for d in primary.get("defaults", []):
        if isinstance(d, dict):
            for k in d:
                groups.add(k.replace("optional ", "").split("@")[0].strip())
    return groups


def _all_cases() -> list[tuple[str, list[str], Path]]:
    """(job, overrides, yaml file) for the primary config and every option of every group the job uses."""
    cases = []
    for job in JOBS:
        cases.append((job, [], CONFIG_DIR / f"{job}.yaml"))
        groups = _defaults_groups(job)
        for group in sorted(groups):
            for root in (CONFIG_DIR / job, CONFIG_DIR):
                gdir = root / group
                if gdir.is_dir():
                    for f in sorted(gdir.glob("*.yaml")):
                        cases.append((job, [f"{group}={f.stem}"], f))
    return cases


CASES = _all_cases()


def _experiments_selecting(job: str, group: str, option: str) -> list[str]:
    """Experiments of ``job`` whose defaults pick ``group=option`` (``override /group: option``)."""
    exp_dir = CONFIG_DIR / job / "experiment"
    found = []
    for f in sorted(exp_dir.glob("*.yaml")) if exp_dir.is_dir() else []:
        for d in (yaml.safe_load(f.read_text()) or {}).get("defaults", []):
            if isinstance(d, dict) and d.get(f"override /{group}") == option:
                found.append(f.stem)
    return found


@pytest.mark.parametrize("job,overrides,path", CASES, ids=[f"{c[0]}:{' '.join(c[1]) or 'default'}" for c in CASES])
def test_every_yaml_composes_into_its_dataclass(job: str, overrides: list[str], path: Path) -> None:
    """Each option composes with the job's defaults, or, when it only makes sense next to other groups (a 250-step
    warmup needs a long run), with every shipped experiment that selects it; an option that composes nowhere fails."""
    try:
        cfgs = [load_config(job, overrides)]
    except ConfigError:
        group, _, option = overrides[0].partition("=") if overrides else ("", "", "")
        experiments = _experiments_selecting(job, group, option) if group not in ("", "experiment") else []
        if experiments:
            cfgs = [load_config(job, [f"experiment={x}"]) for x in experiments]
        else:  # a variant used on top of an experiment (serve=vllm_tiny_tp2 with experiment=smoke_vllm)
            cfgs = []
            for x in sorted(p.stem for p in (CONFIG_DIR / job / "experiment").glob("*.yaml")) if group else []:
                try:
                    cfgs.append(load_config(job, [f"experiment={x}", *overrides]))
                except ConfigError:
                    pass
            if not cfgs:
                raise
    for cfg in cfgs:
        assert type(cfg).__name__.endswith("RunConfig")
        assert cfg.run.name


def test_no_orphan_yaml() -> None:
    """Each YAML under configs/ is reached by at least one job's composition test above."""
    covered = {c[2].resolve() for c in CASES}
    orphans = [p for p in CONFIG_DIR.rglob("*.yaml") if p.resolve() not in covered]
    assert not orphans, f"YAML files no job composes: {orphans}"


@pytest.mark.parametrize(
    "override,key",
    [
        ("gpus=-1", "gpus"),  # impossible value (dataclass __post_init__)
        ("hours=abc", "hours"),  # wrong type
        ("gpuz=3", "gpuz"),  # unknown key
        ("hardware.peak_bf16_tflops=-5", "hardware.peak_bf16_tflops"),
        ("logger.mode=sometimes", "logger.mode"),
        ("hardware=h999", "hardware"),  # unknown group option
    ],
)
def test_bad_input_exits_2_naming_the_key(override: str, key: str) -> None:
    result = runner.invoke(app, ["config", "cost", override])
    assert result.exit_code == 2, result.output
    err = result.stderr if result.stderr else result.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert key in lines[0] and lines[0].startswith("phase6: error:"), lines[0]


@pytest.mark.parametrize(
    "job,old,new",
    [
        ("pretrain", "train.total_batch_tokens=4096", "train.global_batch_tokens"),
        ("pretrain", "+train.total_batch_tokens=4096", "train.global_batch_tokens"),  # as a YAML file would set it
        ("dpo", "dpo.per_device_batch_size=2", "dpo.micro_batch_size"),
        ("dpo", "dpo.grad_accum=2", "dpo.grad_accum_steps"),
        ("plan", "plan.micro_batch=4", "plan.micro_batch_size"),
        ("fleet", "engine.max_batched_tokens=4096", "engine.max_num_batched_tokens"),
    ],
)
def test_renamed_key_fails_naming_the_new_key(job: str, old: str, new: str) -> None:
    """One name per concept across jobs (docs/configs.md): an old spelling is the one-line unknown-key error, and
    the line names the key to use; the new key itself composes."""
    result = runner.invoke(app, ["config", job, old])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in (result.stderr or result.output).strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("phase6: error:"), lines
    assert old.lstrip("+").split("=")[0] in lines[0] and f"renamed to {new}" in lines[0], lines[0]
    value = old.split("=")[1]
    assert load_config(job, [f"{new}={value}"]) is not None


@pytest.mark.parametrize(
    "job,key",
    [("pretrain", "train.dtype"), ("pretrain", "model.residual_dtype"), ("eval", "dtype"), ("dpo", "model.dtype")],
)
def test_every_dtype_key_spells_bf16_and_fp32(job: str, key: str) -> None:
    """phase6's dtype keys take bf16 / fp32 (phase6.dtypes maps them to torch and to the engines' bfloat16 / float32);
    the engines' spelling is refused with a line that says phase6's."""
    for value in ("bf16", "fp32"):
        load_config(job, [f"{key}={value}", *(["train.dtype=bf16"] if key == "model.residual_dtype" else [])])
    with pytest.raises(ConfigError, match=rf"^{key}: must be one of .*got 'bfloat16' \(phase6 spells it bf16\)$"):
        load_config(job, [f"{key}=bfloat16"])


def test_unknown_key_suggests_the_closest_field() -> None:
    with pytest.raises(ConfigError, match=r"train\.micro_bach_size: .*did you mean train\.micro_batch_size\?"):
        load_config("pretrain", ["train.micro_bach_size=4"])
    with pytest.raises(ConfigError) as e:  # nothing close: no guess
        load_config("pretrain", ["train.zzz=1"])
    assert "did you mean" not in str(e.value)


def test_sweep_members_are_all_validated_before_running() -> None:
    assert expand_sweep(["gpus=1,2", "hours=1,3"]) == [
        ["gpus=1", "hours=1"],
        ["gpus=1", "hours=3"],
        ["gpus=2", "hours=1"],
        ["gpus=2", "hours=3"],
    ]
    result = runner.invoke(app, ["cost", "-m", "gpus=1,-2"])
    assert result.exit_code == 2
    assert "gpus" in (result.stderr or result.output)


def test_overrides_reach_the_dataclass() -> None:
    cfg = load_config("cost", ["hardware=h200", "gpus=4", "hours=2.5"])
    assert cfg.hardware.name == "h200" and cfg.gpus == 4 and cfg.hours == 2.5
    assert cfg.hardware.peak_bf16_tflops == pytest.approx(989.4)
    with pytest.raises(ConfigError, match="hours"):
        load_config("cost", ["hours=0"])


@pytest.mark.parametrize("name", ["h100_sxm", "h200", "a100_80gb", "cpu"])
def test_hardware_profiles_have_source_and_date(name: str) -> None:
    data = yaml.safe_load((CONFIG_DIR / "hardware" / f"{name}.yaml").read_text())
    for key in ("peak_bf16_tflops", "hbm_gib", "hbm_tbps", "nvlink_gbps", "internode_gbps", "usd_per_gpu_hour"):
        assert isinstance(data[key], (int, float)), key
    assert data["source"] and len(str(data["date"])) == 10


def test_dtype_names_become_torch_and_engine_dtypes_in_one_place() -> None:
    import torch

    from phase6.config import DTYPES
    from phase6.dtypes import ENGINE_DTYPES, TORCH_DTYPES, engine_dtype, hf_load_dtype, torch_dtype

    assert set(TORCH_DTYPES) == set(ENGINE_DTYPES) == set(DTYPES) - {"auto"}
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype("fp32") is torch.float32
    assert engine_dtype("bf16") == "bfloat16" and engine_dtype("fp32") == "float32"
    assert hf_load_dtype("bf16", cuda=True) is torch.bfloat16
    assert hf_load_dtype("bf16", cuda=False) is torch.float32  # no emulated bf16 matmuls on a CPU-only machine
    assert hf_load_dtype("auto", cuda=False) == "auto"


@pytest.mark.parametrize("job", sorted(JOBS))
def test_key_hint_reads_every_group_of_every_job(job: str) -> None:
    """The hint is built inside the error path: it must work for every nested group (a failure there would replace
    the one line with a traceback); a one-letter typo of a real field is found."""
    import dataclasses
    import typing

    from phase6.config import key_hint, schema_of

    def groups(cls: type, prefix: str) -> list[tuple[str, type]]:
        out = [(prefix, cls)]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                out += groups(hints[f.name], f"{prefix}{f.name}.")
        return out

    for prefix, cls in groups(schema_of(job), ""):
        name = max((f.name for f in dataclasses.fields(cls)), key=len)
        typo = name[:-1] + ("x" if name[-1] != "x" else "y")
        assert key_hint(job, f"{prefix}{typo}") == f"did you mean {prefix}{name}?", (prefix, typo)
