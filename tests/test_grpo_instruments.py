"""GRPO instrumentation without a model: phase timer accounting, staleness bookkeeping, IS weights, reward-hacking
monitor, NVML sampler (with a fake NVML), and the figures."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

from phase6.nvml import GpuSampler, plot_timeline
from phase6.posttrain import grpo_timing as T
from phase6.posttrain.grpo_monitor import RewardMonitor, plot_length_histogram
from phase6.posttrain.grpo_staleness import PolicyHistory, truncated_is_weights
from phase6.tasks import gsm8k


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def test_phase_timer_exclusive_time_sums_to_step() -> None:
    clock = FakeClock()
    timer = T.PhaseTimer(sync=lambda: None, clock=clock)
    timer.start_window()
    clock.advance(0.5)  # data loading: unattributed -> other
    with timer.phase(T.POLICY_UPDATE):
        clock.advance(1.0)
        with timer.phase(T.OTHER):
            clock.advance(0.25)
            with timer.phase(T.WEIGHT_SYNC):
                clock.advance(0.125)
            with timer.phase(T.ROLLOUT):
                clock.advance(4.0)
            timer.reassign(T.ROLLOUT, T.BEHAVIOUR_LOGPROBS, 1.0)
            with timer.phase(T.REWARD):
                clock.advance(0.0625)
        clock.advance(2.0)
    row = timer.end_window()
    assert row["step"] == pytest.approx(7.9375)
    assert row[T.ROLLOUT] == pytest.approx(3.0) and row[T.BEHAVIOUR_LOGPROBS] == pytest.approx(1.0)
    assert row[T.POLICY_UPDATE] == pytest.approx(3.0)  # 1 + 2, nested phases excluded
    assert row[T.OTHER] == pytest.approx(0.25 + 0.5)  # explicit + unattributed remainder
    assert sum(row[p] for p in T.PHASES) == pytest.approx(row["step"], abs=1e-12)
    assert [iv[0] for iv in timer.intervals] == [T.WEIGHT_SYNC, T.ROLLOUT, T.REWARD, T.OTHER, T.POLICY_UPDATE]
    # the next window starts where this one ended
    clock.advance(1.0)
    assert timer.end_window()[T.OTHER] == pytest.approx(1.0)


def test_phase_timer_rejects_double_counting() -> None:
    clock = FakeClock()
    timer = T.PhaseTimer(sync=lambda: None, clock=clock)
    timer.start_window()
    with timer.phase(T.ROLLOUT):
        clock.advance(1.0)
    timer._totals[T.REWARD] = 5.0  # a phase measured outside the window would make other negative
    with pytest.raises(AssertionError, match="more than the step"):
        timer.end_window()


def test_summarize_and_plot(tmp_path: Path) -> None:
    rows = [
        {**{p: 0.0 for p in T.PHASES}, T.ROLLOUT: 3.0, T.OTHER: 1.0, "step": 4.0},
        {**{p: 0.0 for p in T.PHASES}, T.ROLLOUT: 1.0, T.POLICY_UPDATE: 1.0, "step": 2.0},
    ]
    table = T.summarize(rows, skip_first=1)
    share = {r["phase"]: r["share_pct"] for r in table}
    assert share[T.ROLLOUT] == pytest.approx(50.0) and share[T.POLICY_UPDATE] == pytest.approx(50.0)
    assert sum(r["share_pct"] for r in table if r["phase"] != "step") == pytest.approx(100.0)
    assert T.plot_breakdown(rows, tmp_path / "b.png").stat().st_size > 1000


def test_policy_history_serves_version_step_minus_k() -> None:
    """The trainer's protocol: record the live version, load the target only when it changes, drop older ones."""
    hist = PolicyHistory(staleness=2)
    engine_version, engine_value, served = 0, 0.0, []
    for step in range(7):
        live = [("w", torch.full((3,), float(step)))]  # the live weights are "version step"
        hist.record(step, live)
        target = hist.target(step)
        if target != engine_version:
            engine_version, engine_value = target, float(hist.weights(target)[0][1][0])
        hist.drop_before(target + 1)
        served.append(engine_value)
        assert len(hist.held) <= 2
    assert served == [0, 0, 0, 1, 2, 3, 4]
    assert PolicyHistory(0).record(5, live) == 0 and PolicyHistory(0).held == []
    with pytest.raises(ValueError, match="staleness"):
        PolicyHistory(-1)
    with pytest.raises(KeyError, match="not held"):
        hist.weights(0)


def test_snapshots_are_copies_not_views() -> None:
    p = torch.ones(4)
    hist = PolicyHistory(staleness=1, dtype=torch.bfloat16)
    assert hist.record(0, [("p", p)]) == 4 * 2
    p.add_(1.0)
    assert hist.weights(0)[0][1].dtype == torch.bfloat16 and float(hist.weights(0)[0][1][0]) == 1.0


def test_truncated_is_weights() -> None:
    current = torch.tensor([[math.log(0.5), math.log(0.9), 0.0]])
    behaviour = torch.tensor([[math.log(0.5), math.log(0.3), float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    w, stats = truncated_is_weights(current, behaviour, mask, clip=2.0)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 1.0])  # 0.9/0.3 = 3 truncated to 2; NaN -> no correction
    assert stats["is_truncated_frac"] == pytest.approx(1 / 3)
    assert stats["is_weight_mean"] == pytest.approx(4 / 3)
    w2, _ = truncated_is_weights(current, behaviour, torch.tensor([[1.0, 0.0, 0.0]]), clip=2.0)
    assert w2[0].tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_reward_monitor_sees_format_farming(tmp_path: Path) -> None:
    monitor = RewardMonitor(
        16,
        "correctness_reward",
        "format_reward",
        has_format=gsm8k.has_answer_format,
        reasoning_words=gsm8k.reasoning_words,
    )
    texts = ["#### 1", "#### 2", "4 plus 5 is 9 so the total is\n#### 9", "I am not sure"]
    solutions = ["7", "7", "9", "7"]
    correct = gsm8k.correctness_reward(texts, solution=solutions)
    fmt = gsm8k.format_reward(texts)
    m = monitor.observe(
        0,
        texts,
        [3, 3, 12, 16],
        {"correctness_reward": correct, "format_reward": fmt},
        {"correctness_reward": 1.0, "format_reward": 0.5},
    )
    assert m["accuracy"] == 0.25
    assert m["hack/format_only_frac"] == 0.5  # '#### 1' and '#### 2' are formatted but wrong
    assert m["hack/format_reward_share"] == pytest.approx(1.5 / 2.5)  # 3 formatted x 0.5 of 1 + 1.5 paid
    assert m["hack/no_reasoning_frac"] == 0.75 and m["hack/no_reasoning_correct_frac"] == 0.0
    assert m["hack/truncated_frac"] == 0.25
    monitor.observe(
        1,
        texts[:1],
        [2],
        {"correctness_reward": [0.0], "format_reward": [1.0]},
        {"correctness_reward": 1.0, "format_reward": 0.5},
    )
    assert monitor.before_after() == ([3, 3, 12, 16], [2])
    assert {r["indicator"] for r in monitor.summary()} >= {"hack/format_reward_share", "lengths/p50"}
    assert plot_length_histogram([3, 3, 12], [2], tmp_path / "h.png", 16).stat().st_size > 1000


def test_nvml_unavailable_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with GpuSampler(0.05) as s:
        pass
    assert not s.available and "NVML Shared Library Not Found" in s.summary()["reason"]


def test_nvml_sampler_rate_and_timeline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fake NVML stands in for the driver: the thread must sample at >= 10 Hz and the figure must render."""
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50)  # type: ignore[attr-defined]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 * 2**30)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    import time

    with GpuSampler(0.05) as s:
        t0 = time.perf_counter()
        time.sleep(0.5)
        t1 = time.perf_counter()
    assert s.available and s.rate_hz() >= 10.0
    assert s.summary()["mem_gib_max"] == pytest.approx(2.0)
    out = plot_timeline(
        s.samples, [(T.ROLLOUT, t0, (t0 + t1) / 2), (T.POLICY_UPDATE, (t0 + t1) / 2, t1)], tmp_path / "gpu.png"
    )
    assert out.stat().st_size > 1000
