"""Collective volumes and times: ring all-reduce 2(N-1)/N·S, AG/RS (N-1)/N·S, tree vs ring crossover."""

from __future__ import annotations

import math

import pytest

from phase6.plan import comm

NVL = comm.Fabric("nvlink", bandwidth_gbps=400.0, latency_us=20.0, hop_latency_us=0.5)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_all_reduce_volume(n: int) -> None:
    s = 1e9
    assert comm.ring_all_reduce_bytes(s, n) == pytest.approx(2 * (n - 1) / n * s)
    assert comm.all_gather_bytes(s, n) == comm.reduce_scatter_bytes(s, n) == pytest.approx((n - 1) / n * s)
    # all-reduce = reduce-scatter + all-gather, on the wire
    assert comm.ring_all_reduce_bytes(s, n) == pytest.approx(
        comm.reduce_scatter_bytes(s, n) + comm.all_gather_bytes(s, n)
    )


def test_single_rank_costs_nothing() -> None:
    assert comm.ring_all_reduce_bytes(1e9, 1) == 0 and comm.all_reduce_time(1e9, 1, NVL) == (0.0, "ring")


def test_ring_time_is_latency_plus_bytes_over_bandwidth() -> None:
    n, s = 8, 2**30
    expected = (20.0 + 2 * (n - 1) * 0.5) * 1e-6 + 2 * (n - 1) / n * s / 400e9
    assert comm.ring_all_reduce_time(s, n, NVL) == pytest.approx(expected)


def test_tree_wins_below_the_crossover_and_ring_above() -> None:
    n = 64
    ib = comm.Fabric("ib", bandwidth_gbps=50.0, latency_us=50.0, hop_latency_us=2.7)
    x = comm.tree_ring_crossover_bytes(n, ib)
    assert x == pytest.approx(n * 50e9 * 2.7e-6 * ((n - 1) - math.ceil(math.log2(n))))
    assert comm.all_reduce_time(x / 10, n, ib)[1] == "tree"
    assert comm.all_reduce_time(x * 10, n, ib)[1] == "ring"
    # at the crossover both algorithms take the same time
    assert comm.ring_all_reduce_time(x, n, ib) == pytest.approx(comm.tree_all_reduce_time(x, n, ib))


def test_two_ranks_never_prefer_the_tree() -> None:
    assert comm.tree_ring_crossover_bytes(2, NVL) == 0.0
    assert comm.all_reduce_time(8, 2, NVL)[1] == "ring"


def test_bad_fabric() -> None:
    with pytest.raises(ValueError, match="fabric x"):
        comm.Fabric("x", 0.0, 1.0)
