"""On a GPU machine: hold phase6's one NVML reader and one timer (phase6.nvml, phase6.timing) against the references.

    python scripts/check_instruments_gpu.py            # exit 1 naming the check that failed

- ``Nvml().info()`` / ``sample()`` against pynvml read directly (name, total memory; used memory within 64 MiB, as
  other processes may allocate between the two reads);
- ``GpuSampler`` during a 3 s matmul loop: the samples from 1 s into the load (NVML's counter covers its last sample
  period, so earlier ones still see the idle time before the load) must average >= 90 %, and the rate must be near
  the asked one;
- ``timed("cuda")`` around queued matmuls against CUDA events on the same stream (within 2 % + 0.2 ms: the
  synchronised wall interval adds the launch of the first kernel and the host wake-up), and an unsynchronised
  interval around the same work measured for contrast (it returns before the kernels finish).
"""

from __future__ import annotations

import sys

import pynvml
import torch

from phase6.nvml import GpuSampler, Nvml
from phase6.timing import timed, wall

LOAD_S = 3.0
"""Seconds of back-to-back matmuls the sampler watches."""
SETTLE_S = 1.0
"""Samples in the first second of the load are left out: NVML's period (1/6 s to 1 s) still holds idle time."""


def main() -> int:
    failed: list[str] = []

    def check(name: str, ok: bool, detail: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            failed.append(name)

    dev = torch.device("cuda", 0)
    with Nvml([0]) as nv:
        check("nvml available", nv.available, nv.status)
        if not nv.available or not torch.cuda.is_available():
            print("FAIL needs a CUDA GPU and its NVML")
            return 1
        info = nv.info()[0]
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        ref_name = pynvml.nvmlDeviceGetName(h)
        ref_name = ref_name.decode() if isinstance(ref_name, bytes) else ref_name
        ref_mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        check("name", info["name"] == ref_name, f"{info['name']!r} vs {ref_name!r}")
        check("total memory", abs(info["memory_gib"] * 2**30 - ref_mem.total) < 1, f"{info['memory_gib']:.2f} GiB")
        s = nv.sample()[0]
        used_ref = pynvml.nvmlDeviceGetMemoryInfo(h).used
        check(
            "used memory",
            abs(s.mem_used_gib * 2**30 - used_ref) <= 64 * 2**20,
            f"{s}; pynvml {used_ref / 2**30:.3f} GiB",
        )

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()

    # NVML's utilisation is the busy share of its last sample period (up to 1 s, device-dependent), so a sample taken
    # before the load, or within one period after it starts, reads the idle time before it: only the samples from
    # SETTLE_S after the load starts to its end count toward the check (the 84.6 % seen on the H200 included them).
    with GpuSampler(interval_s=0.05, indices=[0]) as sampler:
        t0 = wall()
        while wall() - t0 < LOAD_S:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
        t1 = wall()
    summary = sampler.summary()
    print(f"     sampler summary (whole session, idle start included): {summary}")
    loaded = [s[2] for s in sampler.samples if t0 + SETTLE_S <= s[0] <= t1]
    mean = sum(loaded) / len(loaded) if loaded else float("nan")
    check(
        "sampler sees the load",
        len(loaded) >= 10 and mean >= 90,
        f"mean utilisation {mean:.1f} % over {len(loaded)} samples from {SETTLE_S:.0f} s into the {LOAD_S:.0f} s load",
    )
    check("sampler rate", 5 <= sampler.rate_hz() <= 25, f"{sampler.rate_hz():.1f} Hz asked 20")

    n = 50
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with timed(dev) as t:
        start.record()
        for _ in range(n):
            a @ b
        end.record()
    ev_s = start.elapsed_time(end) / 1e3
    check(
        "timed(cuda) vs CUDA events",
        abs(t.s - ev_s) <= 0.02 * ev_s + 2e-4,
        f"{t.s * 1e3:.2f} ms vs {ev_s * 1e3:.2f} ms",
    )
    with timed() as unsynced:
        for _ in range(n):
            a @ b
    torch.cuda.synchronize()
    print(f"     unsynchronised interval around the same work: {unsynced.s * 1e3:.2f} ms (kernels still queued)")
    tflops = 2 * 8192**3 * n / ev_s / 1e12
    print(f"     bf16 8192^3 matmul: {tflops:.0f} TFLOP/s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
