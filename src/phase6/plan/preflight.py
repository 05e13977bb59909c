"""`phase6 plan`'s checks that need the planner itself, run by the launcher before the job (every member of a
sweep before the first one starts), so config validation (config/plan.py) never runs the planner."""

from __future__ import annotations

from phase6.config import require
from phase6.config.plan import PlanRunConfig
from phase6.plan.model import resolve_model
from phase6.plan.profile import read_profile
from phase6.plan.recommend import layouts, serve_context


def check(cfg: PlanRunConfig) -> None:
    """Fail before any work: the model must parse (missing fields name the file), the profile must read, and a legal
    layout must exist; the longest sequence must fit the model's positions; each ValueError names its key
    (plan.hf_config, plan.profile, plan.seq_len / plan.context_len, gpus)."""
    if cfg.plan.profile:
        read_profile(cfg.plan.profile)
    spec = resolve_model(cfg.model, cfg.plan.hf_config)
    longest = cfg.plan.seq_len if cfg.workload == "train" else serve_context(cfg.plan, spec)
    key = "plan.seq_len" if cfg.workload == "train" else "plan.context_len"
    require(
        longest <= spec.max_position_embeddings,
        key,
        f"{longest} exceeds {spec.name}'s max_position_embeddings {spec.max_position_embeddings}",
    )
    layouts(
        spec,
        cfg.gpus,
        cfg.workload,
        {k: getattr(cfg.plan, k) for k in ("dp", "tp", "pp", "ep", "cp")},
        cfg.plan.seq_len,
    )
