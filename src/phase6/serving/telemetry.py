"""Side-channel samplers for a measured run: GPU utilisation/memory (NVML) and the server's Prometheus /metrics.

They run in a separate process (``Sampler``) so that parsing a scrape never holds the client's GIL while it
timestamps chunks. Output is JSONL with ``t`` on ``phase6.timing.wall``'s clock (the client's; one monotonic clock per host):

    {"kind": "status", "nvml": "ok" | "unavailable: ...", "metrics": "ok" | "unavailable: ..."}
    {"kind": "nvml", "t": ..., "gpus": [{"index": 0, "util_pct": 97, "mem_used_gib": 71.2, "power_w": 612.0}]}
    {"kind": "metrics", "t": ..., "values": {"running": 12, "waiting": 0, "kv_cache_usage": 0.41, ...}}

Prometheus names differ by engine and version (anchors §6): each of our names maps to the candidates below, the
first one present wins, label sets are summed. GPU_UTIL is "a kernel ran during the sample", not SM occupancy.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from phase6.nvml import Nvml
from phase6.timing import wall

PROM_NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "generation_tokens_total": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    # SGLang: the counter (its gauge sglang:num_retracted_reqs is the current count, not a total)
    "preemptions_total": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    "queue_time_s_sum": ("vllm:request_queue_time_seconds_sum", "sglang:queue_time_seconds_sum"),
    "queue_time_s_count": ("vllm:request_queue_time_seconds_count", "sglang:queue_time_seconds_count"),
    "ttft_s_sum": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_s_count": ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"),
    # the server's own decode timing (histograms: per-request TPOT; per-token ITL, vLLM's pre-0.11 name first)
    # (SGLang declares no per-request TPOT histogram: its server-side decode timing is the ITL one below)
    "tpot_s_sum": ("vllm:request_time_per_output_token_seconds_sum",),
    "tpot_s_count": ("vllm:request_time_per_output_token_seconds_count",),
    "itl_s_sum": (
        "vllm:inter_token_latency_seconds_sum",
        "vllm:time_per_output_token_seconds_sum",
        "sglang:inter_token_latency_seconds_sum",
    ),
    "itl_s_count": (
        "vllm:inter_token_latency_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "sglang:inter_token_latency_seconds_count",
    ),
}
GAUGES = ("running", "waiting", "kv_cache_usage")


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {series name: value}, summing label sets (one model, one engine)."""
    raw: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        rest = line[line.rfind("}") + 1 :] if "{" in line[: name_end + 1] else line[name_end:]
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        raw[name] = raw.get(name, 0.0) + value
    return raw


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {our name: value} (:data:`PROM_NAMES`), summing label sets; unknown series are
    skipped."""
    raw = parse_exposition(text)
    out = {}
    for ours, candidates in PROM_NAMES.items():
        for c in candidates:
            if c in raw:
                out[ours] = raw[c]
                break
    return out


def scrape(metrics_url: str, timeout_s: float = 5.0) -> tuple[str | None, str]:
    """(exposition text or None, status) of one GET of a Prometheus endpoint."""
    from phase6.serving.client import auth_headers

    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, headers=auth_headers()) as c:
            r = c.get(metrics_url)
    except httpx.HTTPError as e:
        return None, f"unavailable: {type(e).__name__}"
    if r.status_code != 200:
        return None, f"unavailable: HTTP {r.status_code}"
    return r.text, "ok"


def counters_settled(metrics_url: str, settle_s: float = 0.3, max_s: float = 10.0) -> str:
    """The exposition once the token counters stopped moving (the engine records a request's stats as it emits its
    last output, so a scrape right after the client saw the last chunk can be a step behind); max ``max_s``."""
    t_end = wall() + max_s
    text, _ = scrape(metrics_url)
    prev = parse_prometheus(text or "")
    while wall() < t_end:
        time.sleep(settle_s)
        nxt, _ = scrape(metrics_url)
        cur = parse_prometheus(nxt or "")
        keys = ("generation_tokens_total", "prompt_tokens_total")
        if nxt is not None and all(cur.get(k) == prev.get(k) for k in keys):
            return nxt
        text, prev = nxt, cur
    return text or ""


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before of every counter (``*_total``, ``*_sum``, ``*_count``) present in both."""
    return {
        k: after[k] - before[k]
        for k in after
        if k in before and k not in GAUGES and k.endswith(("_total", "_sum", "_count"))
    }


def sample_loop(
    out: Path, metrics_url: str | None, metrics_interval_s: float, nvml_interval_s: float, stop: threading.Event
) -> None:
    """Write samples to ``out`` until ``stop`` is set."""
    nv = Nvml()
    metrics_status = "unavailable: no URL" if metrics_url is None else "ok"
    client = httpx.Client(timeout=max(0.5, metrics_interval_s), trust_env=False)
    if metrics_url is not None:
        try:
            r = client.get(metrics_url)
            if r.status_code != 200:
                metrics_status = f"unavailable: HTTP {r.status_code}"
            elif not parse_prometheus(r.text):
                metrics_status = "unavailable: no known serving metrics in the exposition"
        except httpx.HTTPError as e:
            metrics_status = f"unavailable: {type(e).__name__}"
    with out.open("w", buffering=1) as f:
        f.write(json.dumps({"kind": "status", "nvml": nv.status, "metrics": metrics_status}) + "\n")
        next_nvml = next_metrics = wall()
        while not stop.is_set():
            now = wall()
            if nv.available and now >= next_nvml:
                gpus = [dataclasses.asdict(g) for g in nv.sample()]
                f.write(json.dumps({"kind": "nvml", "t": now, "gpus": gpus}) + "\n")
                next_nvml += nvml_interval_s
            if metrics_status == "ok" and now >= next_metrics:
                assert metrics_url is not None
                with contextlib.suppress(httpx.HTTPError):
                    r = client.get(metrics_url)
                    if r.status_code == 200:
                        f.write(json.dumps({"kind": "metrics", "t": wall(), "values": parse_prometheus(r.text)}) + "\n")
                next_metrics += metrics_interval_s
            wake = min(
                [x for x, on in ((next_nvml, nv.available), (next_metrics, metrics_status == "ok")) if on],
                default=now + 0.5,
            )
            stop.wait(max(0.0, wake - wall()))
    client.close()
    nv.close()


class Sampler:
    """The sampler process around a measured run: ``start()`` before, ``stop()`` after, then ``summary()``."""

    def __init__(
        self, out: Path, metrics_url: str | None, metrics_interval_s: float = 1.0, nvml_interval_s: float = 0.5
    ) -> None:
        self.out = out
        self.cmd = [
            sys.executable,
            "-m",
            "phase6.serving.telemetry",
            "--out",
            str(out),
            "--metrics-interval",
            str(metrics_interval_s),
            "--nvml-interval",
            str(nvml_interval_s),
        ]
        if metrics_url:
            self.cmd += ["--metrics-url", metrics_url]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        from phase6.serving.server import module_env

        log = self.out.with_suffix(".log")
        with log.open("wb") as f:
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=module_env()
            )
        t0 = wall()
        while wall() - t0 < timeout_s:  # the status line says the first samples are on their way
            if self.out.exists() and self.out.stat().st_size > 0:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"telemetry sampler exited with {self.proc.returncode}: {log.read_text(errors='replace')[-500:]}"
                )
            time.sleep(0.05)
        raise RuntimeError(f"telemetry sampler wrote nothing to {self.out} in {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def read_samples(path: Path) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(status, nvml samples, metrics samples) from a sampler file."""
    status: dict[str, str] = {"nvml": "unavailable: no samples", "metrics": "unavailable: no samples"}
    nvml, metrics = [], []
    if not path.exists():
        return status, nvml, metrics
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        with contextlib.suppress(json.JSONDecodeError):
            rec = json.loads(line)
            if rec.get("kind") == "status":
                status = {"nvml": rec["nvml"], "metrics": rec["metrics"]}
            elif rec.get("kind") == "nvml":
                nvml.append(rec)
            elif rec.get("kind") == "metrics":
                metrics.append(rec)
    return status, nvml, metrics


def summarize(path: Path, t_from: float, t_to: float) -> dict[str, Any]:
    """Mean/max of each gauge, GPU util/memory, and counter deltas over [t_from, t_to] (monotonic seconds)."""
    status, nvml, metrics = read_samples(path)
    nvml = [s for s in nvml if t_from <= s["t"] <= t_to]
    metrics_in = [s for s in metrics if t_from <= s["t"] <= t_to]
    out: dict[str, Any] = {"nvml": status["nvml"], "metrics": status["metrics"]}
    if nvml:
        by_gpu: dict[int, list[dict[str, Any]]] = {}
        for s in nvml:
            for g in s["gpus"]:
                by_gpu.setdefault(g["index"], []).append(g)
        out["gpu"] = {
            str(i): {
                "util_mean_pct": sum(g["util_pct"] for g in gs) / len(gs),
                "util_max_pct": max(g["util_pct"] for g in gs),
                "mem_max_gib": max(g["mem_used_gib"] for g in gs),
                "samples": len(gs),
            }
            for i, gs in sorted(by_gpu.items())
        }
    if metrics_in:
        for k in GAUGES:
            vals = [s["values"][k] for s in metrics_in if k in s["values"]]
            if vals:
                out[f"server_{k}_mean"] = sum(vals) / len(vals)
                out[f"server_{k}_max"] = max(vals)
        # counters: last sample at or before the end minus the last sample before the start
        before = [s for s in metrics if s["t"] < t_from] or metrics_in[:1]
        first, last = before[-1]["values"], metrics_in[-1]["values"]
        for k in last:
            if k not in GAUGES and k in first:
                out[f"server_delta_{k}"] = last[k] - first[k]
        q_n = out.get("server_delta_queue_time_s_count")
        if q_n:
            out["server_queue_time_mean_ms"] = 1e3 * out["server_delta_queue_time_s_sum"] / q_n
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="phase6 serving telemetry sampler (NVML + Prometheus)")
    p.add_argument("--out", required=True)
    p.add_argument("--metrics-url", default=None)
    p.add_argument("--metrics-interval", type=float, default=1.0)
    p.add_argument("--nvml-interval", type=float, default=0.5)
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sample_loop(Path(args.out), args.metrics_url, args.metrics_interval, args.nvml_interval, stop)


if __name__ == "__main__":
    main()
