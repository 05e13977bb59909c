"""How phase6 measures durations: one monotonic clock, and CUDA synchronization at the boundaries of GPU work.

- ``wall()``: seconds on the host's monotonic clock (``time.perf_counter``: CLOCK_MONOTONIC on Linux, the same clock
  in every process of a host, so the serving client, its telemetry sampler and the server's phases line up). Only
  differences mean anything: use it for durations, deadlines and for ordering events of one run.
- ``cpu()``: CPU seconds used by this process (``time.process_time``), for the benchmarks that report CPU beside wall.
- ``sync(device)``: block until the kernels queued on a CUDA device have run; a no-op on CPU. CUDA launches are
  asynchronous, so a wall-clock interval around GPU work measures the work only when both ends are synchronized,
  otherwise the kernels are charged to whoever waits for them next.
- ``timed()`` / ``timed(device)``: ``with timed(device) as t: work`` -> ``t.s`` seconds; with a device, it
  synchronizes before reading the clock at both ends (a CUDA-synchronized region), without one it is the plain
  monotonic interval (CPU, HTTP, subprocesses).

Why not CUDA events: every region phase6 times mixes host and device work (a generate loop, a trainer step, a weight
push through an engine), and the phases must add up to the step's wall time; events would time one stream's kernels
only. Synchronizing costs a few microseconds per boundary, at phase (not kernel) granularity.

Timestamps are a different concept: *when* something happened (``time.time()`` / ``time.strftime`` in env.json, an
OpenAI ``created`` field, a directory name) is a calendar date that NTP may move; phase6 never subtracts two of them
for a duration. torch is imported only when ``sync`` (or ``timed(device)``) runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

wall: Callable[[], float] = time.perf_counter
"""Monotonic seconds (arbitrary origin): the one clock for durations (an alias, so stamping costs one call)."""
cpu: Callable[[], float] = time.process_time
"""CPU seconds of this process, all threads: beside a ``wall`` interval, how much of a core a CPU-bound path used."""


def sync(device: Any = "cuda") -> None:
    """Wait for the kernels queued on ``device`` (a ``torch.device`` or its name; "cuda" = the current CUDA device).

    A no-op for a CPU device and, for the default, on a machine without CUDA."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)


@dataclass
class Span:
    """A measured interval: ``start`` and ``end`` on ``wall``'s clock, ``s`` = end - start (set when the block ends)."""

    start: float
    end: float | None = None

    @property
    def s(self) -> float:
        assert self.end is not None, "read Span.s after the timed block"
        return self.end - self.start


@contextmanager
def timed(device: Any = None) -> Iterator[Span]:
    """Time the block: ``with timed() as t: ...`` (monotonic wall clock) or ``with timed(device) as t: ...``
    (``sync(device)`` before each clock read, so the GPU work queued inside is counted and the work before is not).
    ``t.s`` is only set when the block ends without raising."""
    if device is not None:
        sync(device)
    span = Span(wall())
    yield span
    if device is not None:
        sync(device)
    span.end = wall()


def kernel_ms(fn: Callable[[], Any], reps: int = 20, warmup: int = 3, device: Any = "cuda") -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones: a kernel microbenchmark
    (a matmul or copy ceiling, one sampler call), the one place phase6 times with CUDA events: the work is a single
    stream's kernels, with no host work to account for, and events resolve it without a sync per boundary. On a CPU
    device (or without CUDA) each call is a ``timed()`` interval instead."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            with timed() as t:
                fn()
            times.append(t.s * 1e3)
    return sorted(times)[len(times) // 2]
