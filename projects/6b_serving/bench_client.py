"""6B client benchmark: how much error the harness itself adds, and the highest arrival rate it sustains here.

    python projects/6b_serving/bench_client.py                       # both parts, prints markdown tables
    python projects/6b_serving/bench_client.py --streams 256 --rates 500,1000,2000,3000 --out bench.json

Both parts run the real client (phase6.serving.client) against the timing-controlled scripted server
(phase6.serving.scripted_server) in its own process on the same host; no model, no GPU.

A. Timing error: open-loop Poisson arrivals at the rate that keeps ``--streams`` streams in flight; every request
   has a seeded script (TTFT 20-200 ms, 8-20 chunks 20-100 ms apart, 1-3 tokens per chunk). The server times each
   script from the client's send time (``x-send-time``, same CLOCK_MONOTONIC), so |measured - script| is the error
   the harness adds: HTTP transfer, both event loops, the timestamping. Reported as p50/p99/max of |error| for TTFT
   and per-token ITL, with the offered rate against the target; ``server_late_*`` is the scripted server's own
   part (how late its chunks left), the rest is the client's.
B. Arrival rate: open-loop Poisson at each ``--rates`` value (short scripts: TTFT 5 ms, 3 chunks 5 ms apart), for
   ``--seconds``. Sustained = offered rate within 1 % of the target, p99 dispatch lag (actual - scheduled send)
   <= 2 ms, and no failed request. The highest sustained rate is the harness's ceiling on this machine.
   ``one_core_ceiling_req_s`` = requests / client CPU seconds: the rate one uncontended core would carry, the
   figure to read when other processes share the cores (wall-clock lag then measures the neighbours).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from phase6.serving import scripted_server
from phase6.serving.client import RunOutcome, run_benchmark
from phase6.serving.workload import build_schedule
from phase6.timing import cpu


class WordTok:
    """One token per whitespace-separated word: the scripted server's 'tok ' words."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()

    def decode(self, ids: list[str], skip_special_tokens: bool = False) -> str:
        return " ".join(ids)


def body(i: int) -> dict[str, Any]:
    return {"model": "scripted", "messages": [{"role": "user", "content": f"script:{i}"}], "stream": True}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_in_flight(out: RunOutcome) -> int:
    events = sorted([(r.send_s, 1) for r in out.results if r.sent] + [(r.end_s, -1) for r in out.results if r.sent])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def offered_rate(out: RunOutcome) -> float:
    t = sorted(r.dispatch_s for r in out.results if r.dispatched)
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else float("nan")


def timing_error(streams: int, n: int, seed: int, workdir: Path) -> dict[str, Any]:
    scripts = scripted_server.random_scripts(n, seed)
    srv = scripted_server.start(scripts, workdir / "timing")
    try:
        mean_s = float(np.mean([s["ttft_s"] + sum(s["gaps_s"]) for s in scripts]))
        rate = streams / mean_s
        schedule = build_schedule("poisson", n, seed, request_rate=rate)
        c0, s0, load0 = cpu(), cpu_s(srv.proc.pid), os.getloadavg()[0]
        out = run_benchmark(
            srv.base_url,
            "chat",
            [body(i) for i in range(n)],
            schedule.tolist(),
            None,
            warmup=[body(i) for i in range(min(n, 64))],
            tokenizer=WordTok(),
            send_time_header=True,
        )
        c1, s1 = cpu(), cpu_s(srv.proc.pid)
        late = np.array(httpx.get(srv.base_url + "/lateness", timeout=30).json()["late_s"]) * 1e3
    finally:
        srv.stop()
    ttft = [abs(r.ttft_s - scripts[r.index]["ttft_s"]) * 1e3 for r in out.results if r.ok]
    itl = [
        abs(a - b) * 1e3
        for r in out.results
        if r.ok
        for a, b in zip(r.itl_samples_s(), scripted_server.expected_itl_s(scripts[r.index]), strict=True)
    ]
    chunks = sum(len(r.chunk_times_s) for r in out.results)
    offered = offered_rate(out)
    return {
        "streams_target": streams,
        "requests": n,
        "completed": out.completed,
        "failed": out.failed + out.not_sent,
        "peak_in_flight": peak_in_flight(out),
        "target_rate_req_s": rate,
        "offered_rate_req_s": offered,
        "offered_error_pct": 100 * (offered / rate - 1),
        "chunks_per_s": chunks / out.duration_s,
        "ttft_err_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_err_p99_ms": float(np.percentile(ttft, 99)),
        "ttft_err_max_ms": max(ttft),
        "itl_err_p50_ms": float(np.percentile(itl, 50)),
        "itl_err_p99_ms": float(np.percentile(itl, 99)),
        "itl_err_max_ms": max(itl),
        "server_late_p50_ms": float(np.percentile(late, 50)),
        "server_late_p99_ms": float(np.percentile(late, 99)),
        "client_cpu_per_s": (c1 - c0) / out.duration_s,
        "server_cpu_per_s": (s1 - s0) / out.duration_s,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg()[0],
    }


def arrival_rates(rates: list[float], seconds: float, seed: int, workdir: Path) -> list[dict[str, Any]]:
    srv = scripted_server.start(
        [{"ttft_s": 0.005, "gaps_s": [0.005, 0.005], "tokens": [1, 1, 1], "usage": "continuous"}], workdir / "rates"
    )
    rows = []
    try:
        for rate in rates:
            n = max(1000, int(rate * seconds))
            schedule = build_schedule("poisson", n, seed, request_rate=rate)
            c0, s0, load0 = cpu(), cpu_s(srv.proc.pid), os.getloadavg()[0]
            out = run_benchmark(
                srv.base_url,
                "chat",
                [body(0)] * n,
                schedule.tolist(),
                None,
                warmup=[body(0)] * 64,
                read_timeout_s=10.0,
                request_timeout_s=30.0,
            )
            c1, s1 = cpu(), cpu_s(srv.proc.pid)
            lag = [r.dispatch_lag_s * 1e3 for r in out.results if r.dispatched]
            offered = offered_rate(out)
            row = {
                "target_req_s": rate,
                "requests": n,
                "offered_req_s": offered,
                "offered_error_pct": 100 * (offered / rate - 1),
                "lag_p50_ms": float(np.percentile(lag, 50)),
                "lag_p99_ms": float(np.percentile(lag, 99)),
                "lag_max_ms": max(lag),
                "completed": out.completed,
                "failed": out.failed + out.not_sent,
                "peak_in_flight": peak_in_flight(out),
                "client_cpu_per_s": (c1 - c0) / out.duration_s,
                "server_cpu_per_s": (s1 - s0) / out.duration_s,
                "loadavg_before": load0,
                # CPU time per request (warmup included, a slight overestimate): what one whole core would carry
                "client_cpu_us_per_req": 1e6 * (c1 - c0) / n,
                "one_core_ceiling_req_s": n / (c1 - c0),
            }
            row["sustained"] = bool(
                abs(row["offered_error_pct"]) <= 1.0 and row["lag_p99_ms"] <= 2.0 and row["failed"] == 0
            )
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        srv.stop()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    fmt = [f"{v:.3g}" if isinstance(v, float) else str(v) for r in rows for v in r.values()]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i in range(len(rows)):
        lines.append("| " + " | ".join(fmt[i * len(cols) : (i + 1) * len(cols)]) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "aiohttp": metadata.version("aiohttp"),
        "loadavg": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=256, help="part A: concurrent streams to hold in flight")
    p.add_argument("--requests", type=int, default=1024, help="part A: requests (scripts)")
    p.add_argument("--rates", default="500,1000,2000,3000", help="part B: comma-separated arrival rates (req/s)")
    p.add_argument("--seconds", type=float, default=3.0, help="part B: schedule length per rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--skip-rates", action="store_true")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    info = machine()
    print(f"machine: {info}")
    result: dict[str, Any] = {"machine": info}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_timing:
            result["timing"] = timing_error(args.streams, args.requests, args.seed, Path(tmp))
            print("\n## A. harness timing error (|measured - script|)\n")
            print(table([result["timing"]]))
        if not args.skip_rates:
            rates = [float(x) for x in args.rates.split(",")]
            result["rates"] = arrival_rates(rates, args.seconds, args.seed, Path(tmp))
            ok = [r["target_req_s"] for r in result["rates"] if r["sustained"]]
            result["highest_sustained_req_s"] = max(ok) if ok else None
            print("\n## B. arrival rate (sustained = offered within 1 %, p99 dispatch lag <= 2 ms, no failures)\n")
            print(table(result["rates"]))
            print(f"\nhighest sustained arrival rate: {result['highest_sustained_req_s']} req/s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
