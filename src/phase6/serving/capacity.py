"""Capacity at an SLO: the search over load, the capacity's confidence interval, which SLO breaks first, the plot.

Pure functions of probe results (no HTTP, no server, no simulator): serve-bench's capacity mode
(projects/6b_serving/capacity.py) measures the probes, the fleet simulator predicts them with the same search, and
the tests drive it with a fake curve.

Definitions
- A probe at load x (req/s open loop, or concurrency closed loop) sends n requests; its attainment a = good / n
  (good = completed and every SLO threshold met, phase6.serving.slo.good_masks; failed requests are never good); it
  *passes* when a >= slo.attainment. Each threshold also gets its own attainment (TTFT alone, TPOT alone, E2E alone).
- Search (:class:`CapacitySearch`): the first probe is ``start`` (the prediction); bracketing multiplies by ``growth``
  after a pass and divides after a fail, clipped to [min_load, max_load]; once lo (the highest pass below the lowest
  fail) and hi (that fail) exist, bisection (geometric mean for rates, integer midpoint for concurrency) until
  hi / lo - 1 <= resolution (concurrency: or hi - lo <= 1) or ``max_probes`` probes.
- Capacity (:func:`capacity_estimate`): the load where the attainment curve (probes sorted by load, straight lines
  between neighbours) first drops below the target, between the last probe at or above it and the first below.
  Confidence interval: the same crossing for the curves through each probe's Wilson score bounds (two-sided
  ``confidence``, n = the probe's requests): the lower end where the lower bounds first drop below the target, the
  upper end where the upper bounds do. An end that does not cross inside the probed range is open (None + reason).
  The number reported *at capacity* ($/1M output tokens, goodput) is the row of lo, the highest load measured to pass.
- SLO broken first (:func:`slo_broken_first`): the crossing of each threshold's own attainment curve; the threshold
  crossing at the lowest load broke first (equal crossings: both names joined by '+'); when no single threshold
  crosses but their conjunction does: 'joint'; when nothing crosses in the probed range: 'none'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from phase6.config.slo import SLOConfig
from phase6.serving.slo import good_masks

COMPONENTS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
"""SLO thresholds serve-bench checks (slo.tbt_ms is the fleet's only) -> the name reported for each."""


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Wilson score interval of a binomial proportion k / n (NaN, NaN for n = 0)."""
    if n <= 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def attainment_counts(slo: SLOConfig, planned: int, ttft_s: Any, tpot_s: Any, e2e_s: Any) -> dict[str, int]:
    """{'good': requests meeting every threshold, and per set threshold ('ttft_ms', ...) those meeting it alone}, of
    the completed requests' arrays; ``planned`` (>= their count) is the denominator, so failures count as misses."""
    ttft_s, tpot_s, e2e_s = (np.asarray(a, dtype=np.float64) for a in (ttft_s, tpot_s, e2e_s))
    assert len(ttft_s) <= planned, (len(ttft_s), planned)
    m = good_masks(slo, ttft_s, tpot_s, e2e_s=e2e_s)
    counts = {"good": int(m.good.sum())}
    for key, mask in (("ttft_ms", m.ttft), ("tpot_ms", m.token), ("e2e_ms", m.e2e)):
        if getattr(slo, key) is not None:
            counts[key] = int(mask.sum())
    return counts


def probe_point(load: float, planned: int, counts: dict[str, int], target: float, confidence: float) -> dict[str, Any]:
    """The search columns of one probe: load, attainment (overall and per threshold), its Wilson bounds, pass."""
    a = counts["good"] / planned if planned else math.nan
    lo, hi = wilson(counts["good"], planned, confidence)
    point: dict[str, Any] = {
        "load": load,
        "planned": planned,
        "good": counts["good"],
        "attainment": a,
        "attainment_ci_low": lo,
        "attainment_ci_high": hi,
        "passed": bool(a >= target),
    }
    for key, name in COMPONENTS.items():
        if key in counts:
            point[f"{name.lower()}_good"] = counts[key]
            point[f"{name.lower()}_attainment"] = counts[key] / planned if planned else math.nan
    return point


@dataclass
class CapacitySearch:
    """Bracketing + bisection on the load (see the module docstring). ``next`` proposes the next probe."""

    start: float
    min_load: float
    max_load: float
    growth: float = 1.5
    resolution: float = 0.1
    max_probes: int = 8
    integer: bool = False
    """Concurrency search: loads are integers >= 1."""

    def _clip(self, x: float) -> float:
        x = min(max(x, self.min_load), self.max_load)
        if self.integer:
            x = float(min(max(round(x), math.ceil(self.min_load), 1), math.floor(self.max_load)))
        return x

    @staticmethod
    def bracket(probes: list[tuple[float, bool]]) -> tuple[float | None, float | None]:
        """(lo, hi): the lowest failing load and the highest passing load below it (None where there is none)."""
        fails = [x for x, ok in probes if not ok]
        hi = min(fails) if fails else None
        passes = [x for x, ok in probes if ok and (hi is None or x < hi)]
        return (max(passes) if passes else None), hi

    def narrow(self, lo: float, hi: float) -> bool:
        return hi / lo - 1 <= self.resolution or (self.integer and hi - lo <= 1)

    def next(self, probes: list[tuple[float, bool]]) -> tuple[float | None, str]:
        """(next load, '') or (None, why the search stops) given the (load, passed) probes so far."""
        if not probes:
            return self._clip(self.start), ""
        lo, hi = self.bracket(probes)
        done = {x for x, _ in probes}
        if lo is not None and hi is not None and self.narrow(lo, hi):
            return None, f"resolution reached: bracket [{lo:g}, {hi:g}], {hi / lo - 1:.3f} <= {self.resolution:g}" + (
                " or adjacent integers" if self.integer else ""
            )
        if len(probes) >= self.max_probes:
            return None, f"max_probes={self.max_probes} reached; bracket [{lo}, {hi}]"
        if lo is not None and hi is not None:
            mid = float((lo + hi) // 2) if self.integer else math.sqrt(lo * hi)
        elif hi is None:
            assert lo is not None
            if lo >= self.max_load:
                return None, f"passes at max_load={self.max_load:g}: capacity >= max_load"
            mid = self._clip(max(lo * self.growth, lo + 1) if self.integer else lo * self.growth)
        else:
            if hi <= self.min_load or (self.integer and hi <= max(1, math.ceil(self.min_load))):
                return None, f"fails at min_load={self.min_load:g}: capacity below min_load"
            mid = self._clip(min(hi / self.growth, hi - 1) if self.integer else hi / self.growth)
        if mid in done:  # clipped onto a probed bound
            return None, f"next load {mid:g} already probed (bounds [{self.min_load:g}, {self.max_load:g}])"
        return mid, ""


def crossing(xs: list[float], ys: list[float], target: float) -> tuple[float | None, str]:
    """Where the piecewise-linear curve through (xs ascending, ys) first drops below ``target``: interpolated between
    the last point at or above it and the first below; (None, reason) when it does not cross inside [xs[0], xs[-1]]."""
    for j, y in enumerate(ys):
        if y < target:
            if j == 0:
                return None, f"below the lowest probe ({xs[0]:g})"
            x0, y0, x1 = xs[j - 1], ys[j - 1], xs[j]
            return x0 + (y0 - target) / (y0 - y) * (x1 - x0), ""
    return None, f"above the highest probe ({xs[-1]:g})" if xs else "no probes"


def _curve(points: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = sorted(points, key=lambda p: p["load"])
    return [p["load"] for p in pts], [p[key] for p in pts]


def capacity_estimate(points: list[dict[str, Any]], target: float, confidence: float) -> dict[str, Any]:
    """Capacity (interpolated crossing), its Wilson-based interval, and the measured bracket (module docstring)."""
    xs, ys = _curve(points, "attainment")
    value, why = crossing(xs, ys, target)
    lo_x, lo_why = crossing(*_curve(points, "attainment_ci_low"), target)
    hi_x, hi_why = crossing(*_curve(points, "attainment_ci_high"), target)
    lo, hi = CapacitySearch.bracket([(p["load"], p["passed"]) for p in points])
    monotone = all(p["passed"] == (hi is None or p["load"] < hi) for p in points)  # every pass below every fail
    return {
        "value": value,
        "value_missing_reason": why or None,
        "ci": [lo_x, hi_x],
        "ci_missing_reason": [lo_why or None, hi_why or None],
        "confidence": confidence,
        "highest_passing_load": lo,
        "lowest_failing_load": hi,
        "pass_fail_monotone": monotone,
        "method": (
            f"value: the load where the attainment curve (probes by load, linear between neighbours) first drops "
            f"below {target:g}; ci: the same crossing of the curves through each probe's {confidence:.0%} Wilson score "
            "bounds (lower bounds -> low end, upper bounds -> high end); an open end is null with its reason"
        ),
    }


def slo_broken_first(points: list[dict[str, Any]], slo: SLOConfig, target: float) -> tuple[str, dict[str, Any]]:
    """(name, each threshold's crossing load or the reason it has none): the threshold that breaks at the lowest
    load (module docstring)."""
    cross: dict[str, Any] = {}
    for key, name in COMPONENTS.items():
        if getattr(slo, key) is None:
            continue
        x, why = crossing(*_curve(points, f"{name.lower()}_attainment"), target)
        cross[name] = x if x is not None else why
    crossed = {n: x for n, x in cross.items() if isinstance(x, float)}
    if crossed:
        first = min(crossed.values())
        return "+".join(n for n, x in crossed.items() if math.isclose(x, first, rel_tol=1e-9)), cross
    joint, _ = crossing(*_curve(points, "attainment"), target)
    return ("joint" if joint is not None else "none"), cross


def plot_capacity(
    points: list[dict[str, Any]],
    path: Path,
    *,
    unit: str,
    target: float,
    capacity: dict[str, Any],
    predicted: float | None,
    sim_points: list[dict[str, Any]] | None = None,
    title: str = "",
) -> Path:
    """Goodput vs load (top) and the attainment of the SLO and of each threshold vs load (bottom), with the target,
    the measured capacity and its interval, and the simulator's predicted curve and capacity."""
    from phase6.serving.plots import _plt

    plt = _plt()
    pts = sorted(points, key=lambda p: p["load"])
    x = [p["load"] for p in pts]
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax0.plot(x, [p.get("goodput_req_s", math.nan) for p in pts], "o-", label="goodput (req/s), measured")
    ax0.plot(x, [p.get("req_s", math.nan) for p in pts], "s--", alpha=0.6, label="completed req/s, measured")
    sims = sorted(sim_points or [], key=lambda p: p["load"])
    if sims:
        ax0.plot([p["load"] for p in sims], [p["goodput_req_s"] for p in sims], ":", label="goodput, simulated")
    ax0.set_ylabel("requests / s")
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3)
    a = [p["attainment"] for p in pts]
    err = [  # Wilson bounds can sit a rounding error inside the point at 0 % / 100 %
        [max(0.0, ai - p["attainment_ci_low"]) for ai, p in zip(a, pts, strict=True)],
        [max(0.0, p["attainment_ci_high"] - ai) for ai, p in zip(a, pts, strict=True)],
    ]
    ax1.errorbar(x, a, yerr=err, fmt="o-", capsize=3, label="SLO (all thresholds), Wilson CI")
    for name in COMPONENTS.values():
        k = f"{name.lower()}_attainment"
        if pts and k in pts[0]:
            ax1.plot(x, [p[k] for p in pts], ".--", label=f"{name} alone")
    if sims:
        ax1.plot([p["load"] for p in sims], [p["attainment"] for p in sims], ":", label="SLO, simulated")
    ax1.axhline(target, color="k", lw=0.8, label=f"target {target:g}")
    lo, hi = capacity.get("ci") or [None, None]
    if capacity.get("value") is not None:
        ax1.axvline(capacity["value"], color="C3", lw=1.2, label=f"capacity {capacity['value']:.3g}")
    if lo is not None or hi is not None:
        ax1.axvspan(lo if lo is not None else min(x), hi if hi is not None else max(x), color="C3", alpha=0.1)
    if predicted is not None:
        ax1.axvline(predicted, color="C2", ls="--", lw=1.2, label=f"predicted {predicted:.3g}")
    ax1.set_xlabel(unit)
    ax1.set_ylabel("fraction of requests within SLO")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(fontsize=7, loc="lower left")
    ax1.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    from phase6.figures import save_figure

    return save_figure(fig, path)
