"""The service-level objective of goodput, one type for `phase6 serve-bench` (``slo/`` group) and `phase6 fleet`
(``slo:`` block): a request is good iff it completed and meets every threshold that is set
(``phase6.serving.slo.good_masks`` applies it to measured and simulated requests alike)."""

from __future__ import annotations

from dataclasses import dataclass

from phase6.config import require

LIMITS = ("ttft_ms", "tpot_ms", "e2e_ms", "tbt_ms")


@dataclass
class SLOConfig:
    """Latency thresholds of a good request (null = not part of the SLO) and the share of good requests a rate needs."""

    ttft_ms: float | None = 2000.0
    """Max time to first token (ms); null = not part of the SLO (the fleet needs it)."""
    tpot_ms: float | None = 100.0
    """Max per-request time per output token (E2E - TTFT)/(out - 1) in ms; a one-token answer passes; null = not
    part of the SLO (the fleet needs it)."""
    e2e_ms: float | None = None
    """Max end-to-end latency (ms); null = not part of the SLO."""
    tbt_ms: float | None = None
    """Per-token SLO: max mean of a request's slowest 10 % of token gaps (Mooncake's TBT), ms (phase6.fleet.tokens);
    null = none (TTFT and the per-request mean TPOT only). The fleet only: serve-bench refuses it."""
    attainment: float = 0.9
    """Fraction of requests that must be good for a rate to count as served (DistServe uses 90 %): the fleet's rate
    and replica searches and serve-bench's capacity mode (``capacity.search``); a single serve-bench row reports
    ``good_fraction``."""

    def __post_init__(self) -> None:
        for k in LIMITS:
            v = getattr(self, k)
            require(v is None or v > 0, f"slo.{k}", f"must be > 0 or null, got {v}")
        require(
            any(getattr(self, k) is not None for k in LIMITS),
            "slo",
            f"at least one of {', '.join(LIMITS)} must be set",
        )
        require(0 < self.attainment <= 1, "slo.attainment", f"must be in (0, 1], got {self.attainment}")

    def describe(self) -> str:
        """``TTFT <= 2000 ms AND TPOT <= 100 ms``: the thresholds that are set."""
        parts = [
            f"{k.removesuffix('_ms').upper()} <= {getattr(self, k):g} ms"
            for k in LIMITS
            if getattr(self, k) is not None
        ]
        return " AND ".join(parts)
