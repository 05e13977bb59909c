"""Event loops of the fleet simulator and the decode-run cut search (moved out of ``phase6.fleet.sim``).

Both loops order events by (time, insertion order), so SimPy's ``Environment`` and the 30-line heapq loop give
bit-identical simulations (tests/test_fleet_sim.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any


# ---- event loops ---------------------------------------------------------------------------------------------------
class HeapqLoop:
    """A minimal event loop: (time, insertion counter) heap of callbacks. Same ordering rule as SimPy."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._eid = 0
        self.events = 0

    def call_in(self, delay: float, fn: Callable[[Any], None], arg: Any) -> None:
        self._eid += 1
        heapq.heappush(self._heap, (self.now + delay, self._eid, fn, arg))

    def run(self) -> None:
        heap, pop = self._heap, heapq.heappop
        n = 0
        while heap:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
            n += 1
        self.events += n


class SimpyLoop:
    """The same interface on a SimPy ``Environment``: each callback is a ``Timeout`` event's callback."""

    def __init__(self) -> None:
        import simpy

        self.env = simpy.Environment()
        self._timeout = self.env.timeout
        self.events = 0

    @property
    def now(self) -> float:
        return self.env.now

    def call_in(self, delay: float, fn: Callable[[Any], None], arg: Any) -> None:
        self._timeout(delay).callbacks.append(lambda _ev: fn(arg))
        self.events += 1

    def run(self) -> None:
        self.env.run()


def make_loop(name: str) -> HeapqLoop | SimpyLoop:
    if name == "simpy":
        return SimpyLoop()
    if name == "heapq":
        return HeapqLoop()
    raise ValueError(f"fleet.sim_engine: must be simpy or heapq, got {name!r}")


def _first_step_reaching(run_s: Callable[[int, int, int], float], d: int, s: int, k: int, elapsed: float) -> int:
    """Smallest m in [1, k] with run_s(d, s, m) >= elapsed, given that m = k qualifies (run_s increases in m).

    Steps only get longer within a run (contexts grow), so m <= ceil(elapsed / first step) and is usually exactly
    that; probing it and its neighbour first, then bisecting what is left, finds the same m as plain bisection over
    [1, k] with 2-3 evaluations instead of log2(k).
    """
    first = run_s(d, s, 1)
    if k == 1 or first >= elapsed:
        return 1
    lo, hi = 2, k
    g = min(k, max(2, math.ceil(elapsed / first)))
    if g < k:
        if run_s(d, s, g) >= elapsed:
            hi = g
        else:
            lo = g + 1
    if hi == g and lo < g:
        if run_s(d, s, g - 1) < elapsed:
            return g
        hi = g - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if run_s(d, s, mid) >= elapsed:
            hi = mid
        else:
            lo = mid + 1
    return lo
