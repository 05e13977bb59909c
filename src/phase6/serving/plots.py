"""Serving plots: latency CDFs and time series of one run, and throughput / latency against load for many rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from phase6.figures import save_figure
from phase6.serving.client import RunOutcome
from phase6.serving.telemetry import read_samples


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdfs(outcome: RunOutcome, path: Path, title: str = "") -> Path:
    """Empirical CDFs of TTFT, TPOT, per-token ITL and E2E of the completed requests (ms, log x)."""
    plt = _plt()
    ok = [r for r in outcome.results if r.ok]
    series = {
        "TTFT (ms)": [r.ttft_s * 1e3 for r in ok],
        "TPOT (ms)": [r.tpot_s * 1e3 for r in ok if not math.isnan(r.tpot_s)],
        "ITL per token (ms)": [g * 1e3 for r in ok for g in r.itl_samples_s()],
        "E2E (ms)": [r.e2e_s * 1e3 for r in ok],
    }
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    for ax, (name, vals) in zip(axes, series.items(), strict=True):
        vals = sorted(v for v in vals if v > 0)
        if vals:
            ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))])
            ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("fraction of samples", fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def plot_timeseries(outcome: RunOutcome, t0_monotonic: float, telemetry_path: Path | None, path: Path) -> Path:
    """Client in-flight requests, server running/waiting/KV-cache (Prometheus) and GPU util/memory over time."""
    plt = _plt()
    sent = [r for r in outcome.results if r.sent]
    events = sorted([(r.send_s, 1) for r in sent] + [(r.end_s, -1) for r in sent])
    xs, ys, level = [], [], 0
    for t, d in events:
        level += d
        xs.append(t)
        ys.append(level)
    status, nvml, metrics = read_samples(telemetry_path) if telemetry_path else ({}, [], [])
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].step(xs, ys, where="post", label="client in flight")
    for key in ("running", "waiting"):
        pts = [(s["t"] - t0_monotonic, s["values"][key]) for s in metrics if key in s["values"]]
        if pts:
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"server {key}")
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=8)
    kv = [
        (s["t"] - t0_monotonic, 100 * s["values"]["kv_cache_usage"]) for s in metrics if "kv_cache_usage" in s["values"]
    ]
    if kv:
        axes[1].plot([p[0] for p in kv], [p[1] for p in kv], marker=".")
    axes[1].set_ylabel("KV cache used (%)")
    axes[1].set_title(f"server /metrics: {status.get('metrics', 'not sampled')}", fontsize=8)
    if nvml:
        for i in range(len(nvml[0]["gpus"])):
            ts = [s["t"] - t0_monotonic for s in nvml]
            axes[2].plot(ts, [s["gpus"][i]["util_pct"] for s in nvml], label=f"GPU{i} util %")
            axes[2].plot(ts, [s["gpus"][i]["mem_used_gib"] for s in nvml], linestyle="--", label=f"GPU{i} mem GiB")
        axes[2].legend(fontsize=7, ncol=4)
    axes[2].set_title(f"NVML: {status.get('nvml', 'not sampled')}", fontsize=8)
    axes[2].set_xlabel("seconds since the measured run started")
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def load_axis(rows: list[dict[str, Any]]) -> str:
    """The x axis of a load sweep: concurrency for closed-loop rows, request_rate otherwise."""
    return "concurrency" if all(r.get("request_rate") is None for r in rows) else "request_rate"


def plot_vs_load(rows: list[dict[str, Any]], path: Path) -> Path:
    """Throughput, TTFT and ITL/TPOT (p50 solid, p99 dashed) against load, one line per (engine, TP)."""
    plt = _plt()
    x_key = load_axis(rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get(x_key) is not None:
            groups.setdefault(f"{r.get('engine')} TP{r.get('tp')}", []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for label, rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r[x_key])
        x = [r[x_key] for r in rs]
        (line,) = axes[0].plot(x, [r.get("throughput_tok_s") for r in rs], marker="o", label=label)
        c = line.get_color()
        axes[1].plot(x, [r.get("ttft_p50_ms") for r in rs], marker="o", color=c, label=f"{label} p50")
        axes[1].plot(x, [r.get("ttft_p99_ms") for r in rs], marker="x", color=c, linestyle="--", label=f"{label} p99")
        axes[2].plot(x, [r.get("tpot_p50_ms") for r in rs], marker="o", color=c, label=f"{label} TPOT p50")
        axes[2].plot(
            x, [r.get("itl_p99_ms") for r in rs], marker="x", color=c, linestyle="--", label=f"{label} ITL p99"
        )
    for ax, title in zip(axes, ("output tok/s", "TTFT (ms)", "TPOT p50 / ITL p99 (ms)"), strict=True):
        ax.set_xlabel(x_key)
        ax.set_title(title, fontsize=9)
        if x_key == "concurrency":
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)
