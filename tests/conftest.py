"""Shared test setup: offline, no W&B uploads, small thread counts for a 2-core machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def shared_data() -> Path | None:
    """../shared/data when this checkout has it (CI, dev machines); None on a user's clone."""
    env = os.environ.get("PHASE6_SHARED_DATA")
    for p in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if p.is_dir():
            return p
    return None


@pytest.fixture
def shared() -> Path:
    p = shared_data()
    if p is None:
        pytest.skip("../shared/data not present (user clone)")
    return p
