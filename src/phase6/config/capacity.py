"""Typed config of serve-bench's capacity mode (``capacity:`` block of configs/serve_bench.yaml): find the highest
request rate (open loop) or concurrency (closed loop) at which at least ``slo.attainment`` of the requests meet the
SLO, on one server start (projects/6b_serving/capacity.py; the search itself: phase6.serving.capacity)."""

from __future__ import annotations

from dataclasses import dataclass

from phase6.config import require

SEARCHES = ("rate", "concurrency")
RATE_ARRIVALS = ("poisson", "gamma", "constant", "trace")


@dataclass
class CapacityConfig:
    """Which load is searched, where the search starts, and when it stops."""

    search: str | None = None
    """null = one row at the given load (serve-bench's normal mode); rate = open loop, the request rate is searched
    (each probe: ``arrival`` at that rate, no client cap); concurrency = closed loop, the concurrency is searched.
    The load group still decides the requests (dataset, lengths, seed, API, timeouts)."""
    arrival: str = "poisson"
    """Rate search: the arrival process whose rate is searched: poisson | gamma (load.burstiness) | constant |
    trace (the trace's own inter-arrival shape, time-rescaled to the probed mean rate)."""
    start: float | None = None
    """First probe; null = the fleet simulator's predicted capacity (written to the run dir before the first probe)."""
    min_load: float = 0.05
    """Lowest load probed (req/s or concurrency); a failure there ends the search with 'below min_load'."""
    max_load: float = 1024.0
    """Highest load probed; a pass there ends the search with 'at or above max_load'."""
    growth: float = 1.5
    """Bracketing: the next probe is the last one times (pass) or divided by (fail) this, until pass and fail are
    both seen; then bisection (geometric mean for rates, integer midpoint for concurrency)."""
    resolution: float = 0.1
    """Stop when the bracket's relative width (fail / pass - 1) is at most this (concurrency: or fail - pass = 1)."""
    max_probes: int = 8
    """Most measured probes (bracketing + bisection); the search stops there with its bracket so far."""
    requests_per_probe: int | None = None
    """Measured requests per probe; null = load.num_requests, else min_requests (rate) or max(min_requests,
    requests_per_slot x concurrency) (concurrency). The same seeded list (its prefix) at every probe."""
    confidence: float = 0.95
    """Two-sided level of the Wilson score interval of each probe's attainment (the capacity's interval)."""
    time_budget_s: float | None = None
    """Wall seconds for the whole capacity run from its start (server start, prediction and probes); no probe starts
    that could not end inside it (the longest probe so far, or n / rate, as the estimate): results are written with
    the bracket reached. null = no limit."""

    def __post_init__(self) -> None:
        require(
            self.search is None or self.search in SEARCHES,
            "capacity.search",
            f"must be null or one of {', '.join(SEARCHES)}, got {self.search!r}",
        )
        require(
            self.arrival in RATE_ARRIVALS,
            "capacity.arrival",
            f"must be one of {', '.join(RATE_ARRIVALS)}, got {self.arrival!r}",
        )
        require(
            0 < self.min_load < self.max_load,
            "capacity.min_load",
            f"need 0 < min_load < max_load, got {self.min_load}, {self.max_load}",
        )
        require(
            self.start is None or self.min_load <= self.start <= self.max_load,
            "capacity.start",
            f"must lie in [min_load, max_load] = [{self.min_load}, {self.max_load}], got {self.start}",
        )
        require(self.growth > 1, "capacity.growth", f"must be > 1, got {self.growth}")
        require(0 < self.resolution < 1, "capacity.resolution", f"must be in (0, 1), got {self.resolution}")
        require(self.max_probes >= 2, "capacity.max_probes", f"must be >= 2 (a pass and a fail), got {self.max_probes}")
        require(
            self.requests_per_probe is None or self.requests_per_probe >= 10,
            "capacity.requests_per_probe",
            f"must be >= 10 or null (an attainment of fewer requests says little), got {self.requests_per_probe}",
        )
        require(0.5 < self.confidence < 1, "capacity.confidence", f"must be in (0.5, 1), got {self.confidence}")
        require(
            self.time_budget_s is None or self.time_budget_s > 0,
            "capacity.time_budget_s",
            f"must be > 0 or null, got {self.time_budget_s}",
        )
