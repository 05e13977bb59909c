"""Writing a matplotlib figure the way every phase6 plot does (the callers build the figure; this only saves it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """tight_layout, create the parent directory, write the PNG, close the figure (frees its memory); returns path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
