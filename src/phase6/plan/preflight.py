"""`phase6 plan`'s checks that need the planner itself, run by the launcher before the job (every member of a
sweep before the first one starts), so config validation (config/plan.py) never runs the planner."""

from __future__ import annotations

from phase6.config.plan import PlanRunConfig
from phase6.plan.model import resolve_model
from phase6.plan.profile import read_profile
from phase6.plan.recommend import layouts


def check(cfg: PlanRunConfig) -> None:
    """Fail before any work: the model must parse (missing fields name the file), the profile must read, and a legal
    layout must exist; each ValueError names its key (plan.hf_config, plan.profile, gpus)."""
    if cfg.plan.profile:
        read_profile(cfg.plan.profile)
    spec = resolve_model(cfg.model, cfg.plan.hf_config)
    layouts(
        spec,
        cfg.gpus,
        cfg.workload,
        {k: getattr(cfg.plan, k) for k in ("dp", "tp", "pp", "ep", "cp")},
        cfg.plan.seq_len,
    )
