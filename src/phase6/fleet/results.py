"""What a fleet simulation returns (:class:`SimResult`) and the replica layout it runs (:class:`Topology`).

Split out of ``phase6.fleet.sim`` (which re-exports both) to keep the event model itself short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from phase6.fleet.tokens import StepLog, gap_stats


@dataclass
class SimResult:
    """Per-request times (seconds; NaN if never reached) and fleet counters of one simulation."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    admit_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hit_tokens: np.ndarray
    replica: np.ndarray
    """Replica the router chose (the prefill replica under PD)."""
    num_gpus: int
    replicas: dict[str, int]
    busy_s: dict[str, float]
    """Sum of replica busy time per role."""
    events: int
    wall_s: float
    little: dict[str, float] = field(default_factory=dict)
    """Time-averaged counts integrated by the event loop (for Little's-law checks)."""
    evictions: int = 0
    prefill_shapes: frozenset[tuple[int, int]] = frozenset()
    """torch-tp: the (prompts, padded width) prefill shapes the replicas had run by the end (incl. warm ones)."""
    logs: dict[int, StepLog] = field(default_factory=dict)
    """Decode-step log per replica id (phase6.fleet.tokens): the token gaps of every request."""
    decode_replica: np.ndarray | None = None
    """Replica each request decoded on (= ``replica`` when colocated); -1 for one-token answers."""
    join_s: np.ndarray | None = None
    """Start of each request's first decode step."""
    host_hit_tokens: int = 0
    """Prompt tokens loaded from the host-memory KV tier instead of recomputed (included in ``hit_tokens``)."""
    _gaps: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def token_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(tail, max) token gap per request in seconds: mean of the slowest 10 % (Mooncake's TBT), and the longest."""
        if self._gaps is None and (self.decode_replica is None or self.join_s is None):
            nan = np.full(len(self.arrival_s), np.nan)  # a result built without step logs: no per-token data
            self._gaps = (nan, nan)
        if self._gaps is None:
            assert self.decode_replica is not None and self.join_s is not None
            self._gaps = gap_stats(
                self.logs, self.decode_replica, self.first_token_s, self.join_s, self.finish_s, self.output_tokens
            )
        return self._gaps

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """(E2E - TTFT) / (output - 1); 0 for one-token outputs (no inter-token time to miss)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            t = (self.finish_s - self.first_token_s) / np.maximum(self.output_tokens - 1, 1)
        return np.where(self.output_tokens > 1, t, 0.0)

    @property
    def makespan_s(self) -> float:
        return float(np.nanmax(self.finish_s) - self.arrival_s[0]) if len(self.arrival_s) else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / all prompt tokens."""
        return float(self.hit_tokens.sum() / self.input_tokens.sum()) if len(self.input_tokens) else 0.0


@dataclass
class Topology:
    """Replica counts: colocated N, or PD with P prefill and D decode replicas."""

    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        if self.colocated:
            assert self.prefill == 0 and self.decode == 0
        elif not (self.prefill >= 1 and self.decode >= 1):
            raise ValueError(f"a PD fleet needs >= 1 prefill and >= 1 decode replica, got {self.prefill}:{self.decode}")

    @property
    def is_pd(self) -> bool:
        return self.colocated == 0

    @property
    def replicas(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def name(self) -> str:
        return "colocated" if not self.is_pd else f"pd:{self.prefill}:{self.decode}"
