"""GPU utilization and memory sampled through NVML in a background thread (no CUDA context, no torch).

Neither TRL nor verl records a utilization series (anchors §8), so jobs that want one start a ``GpuSampler``:

    with GpuSampler(interval_s=0.05) as sampler:   # 20 Hz
        ...
    sampler.samples  -> [(t, gpu_index, util_pct, mem_used_gib), ...] on time.perf_counter()'s clock

NVML's utilization counter is the share of the last sample period (1/6 s to 1 s, device-dependent) in which a kernel
was running, so 20 Hz oversamples it; that is fine for aligning with phases, not a finer resolution. On a machine
without the NVIDIA driver the sampler records why it is unavailable instead of failing (``available`` is False).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from phase6.figures import save_figure


class GpuSampler:
    """Background NVML sampling of every visible GPU (or ``indices``) at ``1 / interval_s`` Hz."""

    def __init__(self, interval_s: float = 0.05, indices: list[int] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.indices = indices
        self.samples: list[tuple[float, int, float, float]] = []
        self.available = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []

    def start(self) -> GpuSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # no driver / no library: record it, the run goes on without the series
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
            return self
        if count == 0:
            self.reason = "NVML reports no GPUs"
            pynvml.nvmlShutdown()
            return self
        self._nvml = pynvml
        self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (self.indices or range(count))]
        self.available = True
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nvml = self._nvml
        next_t = time.perf_counter()
        while not self._stop.is_set():
            t = time.perf_counter()
            for i, h in self._handles:
                util = nvml.nvmlDeviceGetUtilizationRates(h).gpu
                mem = nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30
                self.samples.append((t, i, float(util), float(mem)))
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def rate_hz(self) -> float:
        """Achieved samples per second per GPU."""
        if len(self.samples) < 2:
            return 0.0
        gpu0 = [s[0] for s in self.samples if s[1] == self.samples[0][1]]
        return (len(gpu0) - 1) / (gpu0[-1] - gpu0[0]) if len(gpu0) > 1 and gpu0[-1] > gpu0[0] else 0.0

    def summary(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        utils = [s[2] for s in self.samples]
        return {
            "available": True,
            "num_samples": len(self.samples),
            "rate_hz": self.rate_hz(),
            "util_pct_mean": sum(utils) / len(utils) if utils else 0.0,
            "mem_gib_max": max((s[3] for s in self.samples), default=0.0),
        }


def plot_timeline(
    samples: list[tuple[float, int, float, float]],
    intervals: list[tuple[str, float, float]],
    path: Path,
    colors: dict[str, str] | None = None,
) -> Path:
    """GPU util (%) and memory (GiB) against time, with the phases shaded behind them (phase markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min([s[0] for s in samples] + [iv[1] for iv in intervals])
    fig, (ax_u, ax_m) = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
    palette = plt.get_cmap("tab10")
    names = sorted({iv[0] for iv in intervals})
    color = colors or {n: palette(i % 10) for i, n in enumerate(names)}
    for ax in (ax_u, ax_m):
        seen: set[str] = set()
        for name, a, b in intervals:
            ax.axvspan(a - t0, b - t0, color=color[name], alpha=0.18, lw=0, label=None if name in seen else name)
            seen.add(name)
    for gpu in sorted({s[1] for s in samples}):
        pts = [s for s in samples if s[1] == gpu]
        ax_u.plot([s[0] - t0 for s in pts], [s[2] for s in pts], lw=0.8, label=f"GPU {gpu}")
        ax_m.plot([s[0] - t0 for s in pts], [s[3] for s in pts], lw=0.8)
    ax_u.set_ylabel("util %")
    ax_m.set_ylabel("memory GiB")
    ax_m.set_xlabel("seconds since start")
    ax_u.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)
