"""The one NVML reader (phase6.nvml) and the one timing helper (phase6.timing), on a machine without a GPU: a fake
pynvml stands in for the driver, and a recording stand-in for torch.cuda.synchronize shows where a timed region
synchronizes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from phase6 import nvml, timing
from phase6.serving import telemetry


def fake_pynvml(count: int = 2, power: bool = True) -> types.ModuleType:
    """Two GPUs: util 10*(i+1) %, (i+1) GiB used of 80 GiB, 300 W (or NVML_ERROR_NOT_SUPPORTED for power)."""
    fake = types.ModuleType("pynvml")
    state = {"init": 0, "shutdown": 0}

    def get_power(h: int) -> int:
        if not power:
            raise RuntimeError("Not Supported")
        return 300_000  # mW

    fake.state = state  # type: ignore[attr-defined]
    fake.nvmlInit = lambda: state.__setitem__("init", state["init"] + 1)  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * (h + 1))  # type: ignore[attr-defined]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=(h + 1) * 2**30, total=80 * 2**30
    )
    fake.nvmlDeviceGetPowerUsage = get_power  # type: ignore[attr-defined]
    return fake


def no_driver() -> types.ModuleType:
    fake = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = fail  # type: ignore[attr-defined]
    return fake


def test_nvml_reads_info_and_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml(power=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with nvml.Nvml() as nv:
        assert nv.status == "ok" and nv.indices == [0, 1]
        assert nv.info() == [
            {"index": 0, "name": "NVIDIA H200", "memory_gib": 80.0},
            {"index": 1, "name": "NVIDIA H200", "memory_gib": 80.0},
        ]
        s = nv.sample()
    assert [(g.index, g.util_pct, g.mem_used_gib) for g in s] == [(0, 10.0, 1.0), (1, 20.0, 2.0)]
    assert all(math.isnan(g.power_w) for g in s)  # a board without power readings: NaN, not a failure
    assert fake.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with nvml.Nvml(indices=[1]) as nv:
        assert [(g.index, g.power_w) for g in nv.sample()] == [(1, 300.0)]
    assert nvml.gpu_info()[1]["name"] == "NVIDIA H200"


def test_no_nvml_is_a_status_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", no_driver())
    nv = nvml.Nvml()
    assert not nv.available and nv.status == "unavailable: RuntimeError: NVML Shared Library Not Found"
    assert nv.sample() == [] and nv.info() == []
    nv.close()
    assert nvml.gpu_info() == []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=0))
    assert nvml.Nvml().status == "unavailable: no GPUs"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import raises ImportError
    assert nvml.Nvml().status.startswith("unavailable: ModuleNotFoundError")
    with nvml.GpuSampler(0.05) as s:
        pass
    assert s.summary() == {"available": False, "reason": f"NVML {nvml.Nvml().status}"}


def test_env_json_gpus_come_from_the_nvml_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    from phase6.runrecord import env_info

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1))
    assert env_info()["gpus"] == [{"index": 0, "name": "NVIDIA H200", "memory_gib": 80.0}]
    monkeypatch.setitem(sys.modules, "pynvml", no_driver())
    assert env_info()["gpus"] == []


def test_telemetry_writes_nvml_samples_on_the_timing_clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    out, stop = tmp_path / "telemetry.jsonl", threading.Event()
    t0 = timing.wall()
    worker = threading.Thread(target=telemetry.sample_loop, args=(out, None, 1.0, 0.05, stop))
    worker.start()
    deadline = timing.wall() + 60  # the sampler's start (an HTTP client, an SSL context) is slow on a loaded box
    while timing.wall() < deadline and (not out.exists() or out.read_text().count('"kind": "nvml"') < 3):
        time.sleep(0.05)
    stop.set()
    worker.join()
    t1 = timing.wall()
    status, samples, _ = telemetry.read_samples(out)
    assert status["nvml"] == "ok" and len(samples) >= 2
    assert all(t0 <= s["t"] <= t1 for s in samples)  # the client's clock: comparable with its request stamps
    assert samples[0]["gpus"][1] == {"index": 1, "util_pct": 20.0, "mem_used_gib": 2.0, "power_w": 300.0}
    summary = telemetry.summarize(out, t0, t1)
    assert summary["gpu"]["1"]["util_mean_pct"] == 20.0 and summary["gpu"]["0"]["mem_max_gib"] == 1.0


def test_timed_wall_clock_measures_the_block() -> None:
    with timing.timed() as t:
        time.sleep(0.05)
    assert t.end is not None and t.s == t.end - t.start
    assert 0.05 <= t.s < 5.0  # a lower bound that holds on any machine; the upper one only catches a wrong unit
    with pytest.raises(AssertionError, match="after the timed block"):
        _ = timing.Span(timing.wall()).s


def test_timed_region_synchronizes_cuda_at_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    events: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))
    with timing.timed("cuda:1") as t:
        events.append("work")
    assert events == [("sync", "cuda:1"), "work", ("sync", "cuda:1")] and t.s >= 0
    events.clear()
    with timing.timed("cpu"), timing.timed():
        events.append("work")
    timing.sync("cpu")
    assert events == ["work"]  # a CPU device and the plain wall clock never synchronize


def test_kernel_ms_is_the_median_after_warmup() -> None:
    """On a CPU device: ``warmup`` untimed calls, then the median of ``reps`` timed ones, in milliseconds (one slow
    call among five does not move the median; the sleep's lower bound holds on any machine)."""
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        time.sleep(1.0 if len(calls) == 4 else 0.01)  # the first timed call is the slow one

    ms = timing.kernel_ms(fn, reps=5, warmup=3, device="cpu")
    assert len(calls) == 8
    assert 10.0 <= ms < 1000.0


def test_sync_without_cuda_is_a_no_op() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path")
    timing.sync()  # the default device ("cuda") on a machine without CUDA: nothing to wait for
    timing.sync("cpu")


def test_timing_and_nvml_import_no_torch() -> None:
    """Serving telemetry and the fleet use them without torch; only ``sync`` on a device imports it."""
    code = "import sys, phase6.timing, phase6.nvml, phase6.serving.telemetry; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) is False
