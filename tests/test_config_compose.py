"""Config groups compose (issue 27): every experiment (and none) x every option of every config group of every job
either resolves to a validated config or is refused in one line by a rule docs/configs.md documents ("Groups
compose"). The fast checks cover the optimizer presets against every pretrain run length; the whole cross product
(about 650 compositions, ~0.5-1 s each of Hydra on 2 cores) is marked slow.
"""

from __future__ import annotations

import re

import pytest

from phase6.config import CONFIG_DIR, JOBS
from phase6.launch import ConfigError, job_groups, load_config

DOC = CONFIG_DIR.parent / "docs" / "configs.md"


def documented_rules() -> list[str]:
    """The message starts listed under the refusal-rules marker of docs/configs.md."""
    text = DOC.read_text().split("<!-- refusal rules:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\s*- `([^`]+)`", text, re.M)


def compositions(jobs: list[str] | None = None) -> list[tuple[str, list[str]]]:
    out = []
    for job in sorted(jobs or JOBS):
        groups = job_groups(job)
        for exp in [None, *groups.get("experiment", [])]:
            base = [f"experiment={exp}"] if exp else []
            out += [(job, [*base, f"{g}={o}"]) for g, opts in groups.items() if g != "experiment" for o in opts]
    return out


def resolves_or_is_refused_by_a_rule(job: str, overrides: list[str], rules: list[str]) -> str | None:
    """None when it resolves; the refusal line when a documented rule refused it; an AssertionError otherwise."""
    try:
        load_config(job, overrides)
        return None
    except ConfigError as e:
        msg = str(e)
    assert "\n" not in msg, f"{job} {overrides}: refusal is not one line: {msg!r}"
    assert any(msg.startswith(r) for r in rules), f"{job} {overrides}: refused by no documented rule: {msg}"
    return msg


def test_the_documented_rules_are_found() -> None:
    rules = documented_rules()
    assert len(rules) >= 5 and any(r.startswith("optim.") for r in rules), rules


@pytest.mark.parametrize("exp", ["smoke", None])
@pytest.mark.parametrize("optim", ["adamw_cosine", "adamw_tiny", "adamw_tuned", "muon"])
def test_every_optimizer_preset_fits_the_short_runs(exp: str | None, optim: str) -> None:
    """The issue's case: `experiment=smoke optim=muon` failed on muon's 1,800 absolute warmdown steps."""
    cfg = load_config("pretrain", [*([f"experiment={exp}"] if exp else []), f"optim={optim}"])
    n = cfg.train.max_steps
    warmup, warmdown = cfg.optim.num_warmup_steps(n), cfg.optim.num_warmdown_steps(n)
    assert 0 <= warmup and 0 <= warmdown and warmup + warmdown <= n
    if optim == "muon":  # record #3: no warmup, linear warmdown over the last 1800 of 6200 steps
        assert (warmup, warmdown) == (0, round(0.2903 * n))


def test_fractions_reproduce_the_recipes_step_counts() -> None:
    """At its source run's length each fraction gives the source's count (so the shipped 124M runs are unchanged)."""
    muon = load_config("pretrain", ["experiment=gpt2_124m_muon"]).optim
    assert (muon.num_warmup_steps(6200), muon.num_warmdown_steps(6200)) == (0, 1800)
    tuned = load_config("pretrain", ["experiment=gpt2_124m_fineweb"])
    assert (tuned.optim.num_warmup_steps(9536), tuned.optim.num_warmdown_steps(9536)) == (250, 2000)
    edu = load_config("pretrain", ["experiment=gpt2_124m_fineweb_edu"]).optim  # pinned absolute counts
    assert (edu.num_warmup_steps(19073), edu.num_warmdown_steps(19073)) == (250, 4000)


@pytest.mark.parametrize(
    "overrides,start",
    [
        (
            ["optim=muon", "optim.warmdown_steps=10"],
            "optim.warmdown_steps: set warmdown_steps (absolute) or warmdown_frac",
        ),
        (["optim.warmup_frac=1.5"], "optim.warmup_frac: must be in [0, 1]"),
        (["optim=muon", "optim.warmup_frac=0.8"], "optim.warmdown_frac: warmup_frac + warmdown_frac"),
        (["experiment=gpt2_1.3b_fsdp2", "train=tiny"], "optim.warmup_steps: (700) exceeds train.max_steps (200)"),
        (["experiment=enwiki_cmp_muon", "optim=adamw_cosine"], "optim.warmdown_steps: warmdown is only used with"),
    ],
)
def test_schedule_refusals_are_one_line_naming_the_key(overrides: list[str], start: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("pretrain", overrides)
    assert str(e.value).startswith(start) and "\n" not in str(e.value)


@pytest.mark.slow  # ~70 compositions: 24 s on the loaded 2-core box
def test_pretrain_experiments_compose_with_every_optim_and_train_option() -> None:
    rules = documented_rules()
    cases = [(j, o) for j, o in compositions(["pretrain"]) if o[-1].split("=")[0] in ("optim", "train")]
    refused = [m for j, o in cases if (m := resolves_or_is_refused_by_a_rule(j, o, rules))]
    assert len(refused) < len(cases) / 4, refused  # most combinations resolve; the rest each name their rule


@pytest.mark.slow
def test_every_experiment_composes_with_every_option_of_every_group_of_every_job() -> None:
    rules = documented_rules()
    cases = compositions()
    assert len(cases) > 500
    for job, overrides in cases:
        resolves_or_is_refused_by_a_rule(job, overrides, rules)
