"""`phase6 report`: rebuild results.md and plots of run directories, and merge several into one table.

Also the Hydra callback that writes a sweep's summary table when ``-m`` finishes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from phase6.figures import save_figure
from phase6.redact import redact
from phase6.runrecord import markdown_table, read_metrics, read_results, render_markdown
from phase6.terminal import format_rows


def plot_metrics(run_dir: Path) -> list[Path]:
    """One PNG per run: every numeric logged key against step (loss-like keys together, log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(run_dir) if r.get("step") is not None]
    keys = sorted(
        {
            k
            for r in rows
            for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time_s")
        }
    )
    if not keys:
        return []
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    n = len(keys)
    cols = min(3, n)
    fig, axes = plt.subplots(
        (n + cols - 1) // cols, cols, figsize=(4.5 * cols, 3.2 * ((n + cols - 1) // cols)), squeeze=False
    )
    for ax, k in zip(axes.flat, keys, strict=False):  # more axes than keys: the extras are blanked below
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return [save_figure(fig, out / "metrics.png")]


def rebuild(run_dir: str | Path) -> Path:
    """Re-render results.md (and the generic metrics plot) of one run directory from its files."""
    run_dir = Path(run_dir)
    results = read_results(run_dir)
    plot_metrics(run_dir)
    plots = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "plots").glob("*.png"))
    (run_dir / "results.md").write_text(render_markdown(results, plots))
    return run_dir / "results.md"


def merge_rows(run_dirs: list[str | Path]) -> list[dict[str, Any]]:
    """All rows of all runs, each tagged with its run directory (how scaling tables and sweeps are assembled)."""
    merged = []
    for d in run_dirs:
        res = read_results(d)
        for row in res.get("rows", []):
            merged.append({"run": Path(d).name, "job": res.get("job"), **row})
    return merged


def write_merged(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = merge_rows(run_dirs)
    (out_dir / "summary.json").write_text(json.dumps({"runs": [str(d) for d in run_dirs], "rows": rows}, indent=2))
    md = "# phase6 comparison\n\n" + markdown_table(rows)
    (out_dir / "summary.md").write_text(md)
    return out_dir / "summary.md"


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a core dependency
    Callback = object  # type: ignore[misc,assignment]


class SweepSummaryCallback(Callback):  # type: ignore[misc]
    """At the end of ``-m``: summary.md/summary.json in the sweep dir, one row per member with its overrides."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        multirun_yaml = sweep_dir / "multirun.yaml"
        if multirun_yaml.is_file():  # Hydra saves the raw config there; keep only the redacted form on disk
            import yaml

            multirun_yaml.write_text(yaml.safe_dump(redact(yaml.safe_load(multirun_yaml.read_text())), sort_keys=False))
        members = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        rows = []
        for d in members:
            if not (d / "results.json").is_file():
                rows.append({"member": d.name, "status": "failed (no results.json)"})
                continue
            res = read_results(d)
            overrides = _member_overrides(d)
            for row in res.get("rows", []) or [{}]:
                rows.append({"member": d.name, "overrides": overrides, **row})
        (sweep_dir / "summary.json").write_text(json.dumps({"rows": rows}, indent=2))
        (sweep_dir / "summary.md").write_text(f"# sweep summary ({len(members)} runs)\n\n" + markdown_table(rows))
        print(format_rows(rows, f"sweep summary ({len(members)} runs)"))  # summary.md: the full table
        print(f"sweep dir: {sweep_dir}", flush=True)


def _member_overrides(run_dir: Path) -> str:
    """The sweep member's own overrides, read back from its recorded command line."""
    try:
        env = json.loads((run_dir / "env.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    return " ".join(o for o in env.get("overrides", "").split() if not o.startswith("run.dir="))


def main(run_dirs: list[str], out: str | None = None) -> None:
    from rich.console import Console

    console = Console()
    for d in run_dirs:
        if not Path(d).is_dir():
            raise ValueError(f"{d}: not a directory")
        console.print(f"rebuilt {rebuild(d)}")
    if len(run_dirs) > 1 or out:
        out_dir = out or os.path.join(os.path.commonpath([str(Path(d).resolve()) for d in run_dirs]), "report")
        path = write_merged(run_dirs, out_dir)
        console.print(markdown_table(merge_rows(run_dirs)))
        print(f"run dir: {Path(path).parent}", flush=True)
