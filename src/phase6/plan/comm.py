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
    """One interconnect: NVLink/NVSwitch inside a node or InfiniBand/RoCE across nodes."""

    name: str
    bandwidth_gbps: float
    """Bus bandwidth per GPU per direction, GB/s."""
    latency_us: float
    """Per-step latency (small-message floor of one collective), microseconds."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0 or self.latency_us < 0:
            raise ValueError(f"fabric {self.name}: bandwidth must be > 0 and latency >= 0, "
                             f"got {self.bandwidth_gbps} GB/s, {self.latency_us} us")

    @property
    def alpha_s(self) -> float:
        return self.latency_us * 1e-6

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / (self.bandwidth_gbps * 1e9)


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


# ---- times (seconds) ----------------------------------------------------------------------------------------------
# The calibrated latency is the measured small-message time of one whole collective (what torch.distributed
# sees: launch + sync + the algorithm's steps at ~0 bytes). With a calibrated fabric we use it as-is ("floor");
# from the datasheet we charge it per algorithm step (the textbook alpha-beta model).


def ring_all_reduce_time(size: float, n: int, f: Fabric, per_step_latency: bool = True) -> float:
    if n <= 1:
        return 0.0
    steps = 2 * (n - 1) if per_step_latency else 1
    return steps * f.alpha_s + ring_all_reduce_bytes(size, n) * f.beta_s_per_byte


def tree_all_reduce_time(size: float, n: int, f: Fabric, per_step_latency: bool = True) -> float:
    if n <= 1:
        return 0.0
    steps = 2 * math.ceil(math.log2(n)) if per_step_latency else 1
    return steps * f.alpha_s + 2.0 * size * f.beta_s_per_byte


def all_reduce_time(size: float, n: int, f: Fabric, per_step_latency: bool = True) -> tuple[float, str]:
    """(seconds, algorithm): the faster of ring and tree, as NCCL's tuner would choose."""
    ring = ring_all_reduce_time(size, n, f, per_step_latency)
    tree = tree_all_reduce_time(size, n, f, per_step_latency)
    return (tree, "tree") if tree < ring else (ring, "ring")


def tree_ring_crossover_bytes(n: int, f: Fabric) -> float:
    """Message size below which the tree all-reduce beats the ring (per-step alpha-beta model).

    ring - tree = 2·alpha·((N-1) - ceil(log2 N)) - 2·S/(N·B) < 0  <=>  S > N·B·alpha·((N-1) - ceil(log2 N)).
    """
    if n <= 2:
        return 0.0
    return n * f.bandwidth_gbps * 1e9 * f.alpha_s * ((n - 1) - math.ceil(math.log2(n)))


def all_gather_time(size: float, n: int, f: Fabric, per_step_latency: bool = True) -> float:
    if n <= 1:
        return 0.0
    steps = (n - 1) if per_step_latency else 1
    return steps * f.alpha_s + all_gather_bytes(size, n) * f.beta_s_per_byte


reduce_scatter_time = all_gather_time


def all_to_all_time(size: float, n: int, f: Fabric, per_step_latency: bool = True) -> float:
    if n <= 1:
        return 0.0
    steps = (n - 1) if per_step_latency else 1
    return steps * f.alpha_s + all_to_all_bytes(size, n) * f.beta_s_per_byte


def p2p_time(size: float, f: Fabric) -> float:
    """One send/recv of ``size`` bytes."""
    return f.alpha_s + size * f.beta_s_per_byte
