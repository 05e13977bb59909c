"""The one NVML reader: GPU names, memory, utilization and power through the driver (no torch, no CUDA context).

Three users read it, each at its own rate:
- ``gpu_info()``: the GPUs of this machine, once, for a run's env.json;
- ``Nvml`` (a session: init once, ``sample()`` many times, ``close()``): serving telemetry's sampler process;
- ``GpuSampler``: a background thread sampling utilization and memory for the GRPO phase timeline.

    with GpuSampler(interval_s=0.05) as sampler:   # 20 Hz
        ...
    sampler.samples  -> [(t, gpu_index, util_pct, mem_used_gib), ...] with t on phase6.timing.wall's clock

NVML's utilization counter is the share of the last sample period (1/6 s to 1 s, device-dependent) in which a kernel
was running (not SM occupancy), so 20 Hz oversamples it; that is fine for aligning with phases, not a finer
resolution. On a machine without the NVIDIA driver (or without pynvml) nothing fails: the session's ``status`` says
why it is unavailable, ``gpu_info()`` is empty and the sampler records the reason (``available`` is False).
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from phase6.figures import save_figure
from phase6.timing import wall

GIB = 2**30


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU."""

    index: int
    util_pct: float
    """Share of the last NVML sample period in which a kernel ran."""
    mem_used_gib: float
    power_w: float
    """Board power draw; NaN where the device does not report it."""


class Nvml:
    """An NVML session over every visible GPU (or ``indices``); ``status`` is "ok" or "unavailable: <why>"."""

    def __init__(self, indices: list[int] | None = None) -> None:
        self._nv: Any = None
        self._handles: list[tuple[int, Any]] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # no driver / no library: recorded by the caller, never fatal to a run
            self.status = f"unavailable: {type(e).__name__}: {e}"
            return
        if count == 0:
            self.status = "unavailable: no GPUs"
            pynvml.nvmlShutdown()
            return
        self._nv = pynvml
        self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (indices or range(count))]
        self.status = "ok"

    @property
    def available(self) -> bool:
        return self._nv is not None

    @property
    def indices(self) -> list[int]:
        return [i for i, _ in self._handles]

    def info(self) -> list[dict[str, Any]]:
        """Index, name and total memory of each GPU."""
        out = []
        for i, h in self._handles:
            name = self._nv.nvmlDeviceGetName(h)
            out.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_gib": self._nv.nvmlDeviceGetMemoryInfo(h).total / GIB,
                }
            )
        return out

    def sample(self, power: bool = True) -> list[GpuSample]:
        """Utilization, used memory and (``power``) power draw of each GPU now."""
        out = []
        for i, h in self._handles:
            util = self._nv.nvmlDeviceGetUtilizationRates(h).gpu
            mem = self._nv.nvmlDeviceGetMemoryInfo(h).used / GIB
            watts = math.nan
            if power:
                with contextlib.suppress(Exception):  # not every board reports it (NVML_ERROR_NOT_SUPPORTED)
                    watts = self._nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
            out.append(GpuSample(i, float(util), float(mem), watts))
        return out

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def gpu_info() -> list[dict[str, Any]]:
    """The GPUs of this machine (index, name, memory_gib); empty on a machine without a driver."""
    with Nvml() as nv:
        return nv.info() if nv.available else []


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
        self._nv: Nvml | None = None

    def start(self) -> GpuSampler:
        nv = Nvml(self.indices)
        if not nv.available:
            self.reason = f"NVML {nv.status}"
            return self
        self._nv = nv
        self.available = True
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._nv is not None
        next_t = wall()
        while not self._stop.is_set():
            t = wall()
            for s in self._nv.sample(power=False):
                self.samples.append((t, s.index, s.util_pct, s.mem_used_gib))
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - wall()))

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nv is not None:
            self._nv.close()
            self._nv = None

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
