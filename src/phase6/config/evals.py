"""Typed config of a local lm-eval task (a JSONL file), shared by `phase6 eval` (6A) and the 6C regression battery;
run by phase6.evals.battery."""

from __future__ import annotations

from dataclasses import dataclass, field

LOCAL_TASK_KINDS = ("multiple_choice", "generate")


@dataclass
class LocalTask:
    """A custom task read from a local JSONL file."""

    name: str
    """lm-eval task name (letters, digits, '_'); must not clash with a built-in task."""
    path: str
    """JSONL file; schema depends on ``kind`` (see module docstring)."""
    kind: str = "multiple_choice"
    """multiple_choice | generate."""
    until: list[str] = field(default_factory=lambda: ["\n"])
    """Stop strings for ``generate`` tasks."""
    max_gen_toks: int = 128
    """Generation cap for ``generate`` tasks."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"eval.local_tasks.name: {self.name!r} must be letters, digits and '_'")
        if self.kind not in LOCAL_TASK_KINDS:
            raise ValueError(f"eval.local_tasks.kind: {self.kind!r} is not one of {list(LOCAL_TASK_KINDS)}")
