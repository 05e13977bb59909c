"""Collective costs in the alpha-beta model: time = latency terms + bytes on the wire / bandwidth.

Per-rank volumes follow Thakur, Rabenseifner & Gropp 2005 ("Optimization of collective communication operations
in MPICH") and NCCL's bus-bandwidth convention (nccl-tests doc/PERFORMANCE.md): a ring all-reduce of S bytes
moves 2(N-1)/N·S per rank in 2(N-1) steps; all-gather / reduce-scatter (N-1)/N·S in N-1 steps (S = the full,
gathered size). A (double binary) tree all-reduce needs 2·log2(N) latency steps but moves ~2·S per rank (Sanders,
Speck & Träff 2009), so it wins below the crossover size where the ring's extra latency steps cost more than the
tree's extra bytes. NCCL picks the faster algorithm; so do we.

``bandwidth_gbps`` is the *bus* bandwidth per GPU per direction in GB/s (1e9 B/s): the datasheet link rate until a
calibrated profile replaces it with the measured all-reduce bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Fabric:
    """One interconnect: NVLink/NVSwitch inside a node or InfiniBand/RoCE across nodes.

    Time of a collective = latency_us (base: launch, sync, protocol; the small-message floor) + steps x
    hop_latency_us + bytes on the wire / bandwidth: NCCL's own tuning model (src/graph/tuning.cc: baseLat +
    nsteps * hwLat + nBytes / algBw).
    """

    name: str
    bandwidth_gbps: float
    """Bus bandwidth per GPU per direction, GB/s."""
    latency_us: float
    """Base latency of one collective (small-message floor), microseconds."""
    hop_latency_us: float = 0.0
    """Extra latency per algorithm step (ring: 2(N-1) steps, tree: 2·log2 N), microseconds."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0 or self.latency_us < 0 or self.hop_latency_us < 0:
            raise ValueError(
                f"fabric {self.name}: bandwidth must be > 0 and latencies >= 0, got "
                f"{self.bandwidth_gbps} GB/s, {self.latency_us} us, {self.hop_latency_us} us/hop"
            )

    def time(self, steps: int, wire_bytes: float) -> float:
        """Seconds for a collective of ``steps`` algorithm steps moving ``wire_bytes`` per rank."""
        return (self.latency_us + steps * self.hop_latency_us) * 1e-6 + wire_bytes / (self.bandwidth_gbps * 1e9)


# ---- per-rank volumes (bytes on the wire per GPU) ------------------------------------------------------------------
def ring_all_reduce_bytes(size: float, n: int) -> float:
    """2(N-1)/N · S."""
    return 2.0 * (n - 1) / n * size if n > 1 else 0.0


def all_gather_bytes(size: float, n: int) -> float:
    """(N-1)/N · S (S = gathered size); reduce-scatter moves the same."""
    return (n - 1) / n * size if n > 1 else 0.0


reduce_scatter_bytes = all_gather_bytes


def all_to_all_bytes(size: float, n: int) -> float:
    """(N-1)/N · S: each rank keeps 1/N of its S bytes and sends the rest."""
    return (n - 1) / n * size if n > 1 else 0.0


def tree_all_reduce_bytes(size: float, n: int) -> float:
    """~2·S per rank: reduce up and broadcast down a (double binary) tree, pipelined (NCCL algBw = busBw / 2)."""
    return 2.0 * size if n > 1 else 0.0


# ---- times (seconds) ----------------------------------------------------------------------------------------------
def ring_all_reduce_time(size: float, n: int, f: Fabric) -> float:
    return f.time(2 * (n - 1), ring_all_reduce_bytes(size, n)) if n > 1 else 0.0


def tree_all_reduce_time(size: float, n: int, f: Fabric) -> float:
    return f.time(2 * math.ceil(math.log2(n)), tree_all_reduce_bytes(size, n)) if n > 1 else 0.0


def all_reduce_time(size: float, n: int, f: Fabric) -> tuple[float, str]:
    """(seconds, algorithm): the faster of ring and tree, as NCCL's tuner would choose."""
    ring, tree = ring_all_reduce_time(size, n, f), tree_all_reduce_time(size, n, f)
    return (tree, "tree") if tree < ring else (ring, "ring")


def tree_ring_crossover_bytes(n: int, f: Fabric) -> float:
    """Message size below which the tree all-reduce beats the ring.

    ring - tree = 2·hop·((N-1) - ceil(log2 N)) - 2·S/(N·B) > 0  <=>  S < N·B·hop·((N-1) - ceil(log2 N)).
    """
    if n <= 2:
        return 0.0
    return n * f.bandwidth_gbps * 1e9 * f.hop_latency_us * 1e-6 * ((n - 1) - math.ceil(math.log2(n)))


def all_gather_time(size: float, n: int, f: Fabric) -> float:
    return f.time(n - 1, all_gather_bytes(size, n)) if n > 1 else 0.0


reduce_scatter_time = all_gather_time


def all_to_all_time(size: float, n: int, f: Fabric) -> float:
    return f.time(n - 1, all_to_all_bytes(size, n)) if n > 1 else 0.0


def p2p_time(size: float, f: Fabric) -> float:
    """One send/recv of ``size`` bytes."""
    return f.time(1, size)
