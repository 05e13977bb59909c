"""Speed benchmark of the fleet simulator: simulated requests per second of wall time on one CPU core.

    phase6 fleet-bench                                   # 1M requests per scenario, SimPy and heapq loops
    phase6 fleet-bench --requests 200000 --scenarios azure --engines simpy
    python -m phase6.fleet.bench --requests 1000000

Scenarios (Llama-3.1-70B, TP4 replicas on H100 numbers from configs/hardware/h100_sxm.yaml, planner step times):
  azure     Azure LLM inference conv trace (19,366 rows) repeated to N requests, 16 colocated replicas,
            least-loaded router, rescaled to 40 req/s (busy but not overloaded: TTFT p50 ~0.1 s)
  mooncake  Mooncake synthetic trace (3,993 rows, ~30 prefix blocks each) repeated to N, 16 colocated replicas,
            prefix-aware router (scores the replicas that cache the first block), 8 req/s
  pd        the azure scenario on pd:6:10 (6 prefill, 10 decode replicas) with KV transfers
Without ../shared/data the traces are replaced by synthetic requests of similar lengths (stated in the table).
The process pins itself to one core (sched_setaffinity) so the number is a one-core number.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import numpy as np
import yaml

from phase6 import timing
from phase6.config import CONFIG_DIR, HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.sim import EngineLimits, Topology, simulate
from phase6.fleet.steptime import kv_capacity_blocks, kv_transfer_s, planner_model
from phase6.fleet.workload import RequestClass, Workload, load_azure, load_mooncake, synthetic
from phase6.plan.model import resolve_model

SCENARIOS = ("azure", "mooncake", "pd")


def _shared() -> Path | None:
    env = os.environ.get("PHASE6_SHARED_DATA")
    for p in ([Path(env)] if env else []) + [CONFIG_DIR.parent.parent / "shared" / "data"]:
        if p.is_dir():
            return p
    return None


def scenario_workload(name: str, n: int, seed: int = 0) -> tuple[Workload, str]:
    shared = _shared()
    if name in ("azure", "pd"):
        path = shared / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv" if shared else None
        if path is not None and path.is_file():
            base, src = load_azure(path), "Azure conv trace"
        else:
            base = synthetic(20_000, 5.0, [RequestClass(1.0, 100, 2200, 10, 420)], seed)
            src = "synthetic (Azure-like lengths)"
        return base.repeated(-(-n // len(base))).head(n).at_rate(40.0), src
    path = shared / "mooncake-traces" / "synthetic_trace.jsonl" if shared else None
    if path is not None and path.is_file():
        base, src = load_mooncake(path), "Mooncake synthetic trace"
    else:
        base = synthetic(
            4000,
            4.0,
            [RequestClass(1.0, 2000, 28000, 20, 300)],
            seed,
            prefix_groups=200,
            prefix_tokens=4096,
            zipf_alpha=1.0,
        )
        src = "synthetic (Mooncake-like lengths, shared prefixes)"
    return base.repeated(-(-n // len(base))).head(n).at_rate(8.0), src


def run_bench(requests: int, scenarios: list[str], engines: list[str]) -> list[dict]:
    hw = HardwareConfig(**yaml.safe_load((CONFIG_DIR / "hardware" / "h100_sxm.yaml").read_text()))
    spec = resolve_model("llama3.1-70b")
    eng = EngineConfig(tp=4)
    model = planner_model(spec, hw, eng)
    limits = EngineLimits(
        eng.max_num_seqs,
        eng.max_num_batched_tokens,
        kv_capacity_blocks(spec, hw, eng),
        True,
        eng.kv_alloc == "incremental",
    )
    rows = []
    for sc in scenarios:
        w, src = scenario_workload(sc, requests)
        topo, router = {
            "azure": (Topology(colocated=16), "least_loaded"),
            "mooncake": (Topology(colocated=16), "prefix_aware"),
            "pd": (Topology(prefill=6, decode=10), "least_loaded"),
        }[sc]
        for e in engines:
            t0, c0 = timing.wall(), timing.cpu()
            r = simulate(
                w,
                model,
                limits,
                topo,
                router,
                tp=eng.tp,
                engine=e,
                kv_transfer_s=lambda n: kv_transfer_s(spec, hw, eng, "internode", n),
            )
            wall, cpu = timing.wall() - t0, timing.cpu() - c0
            rows.append(
                {
                    "scenario": sc,
                    "source": src,
                    "engine": e,
                    "requests": len(w),
                    "events": r.events,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "sim_req_per_s": len(w) / wall,
                    "sim_req_per_cpu_s": len(w) / cpu,
                    "events_per_cpu_s": r.events / cpu,
                    "ttft_p50_ms": float(np.median(r.ttft_s)) * 1e3,
                    "tpot_p50_ms": float(np.median(r.tpot_s)) * 1e3,
                    "prefix_hit_rate": r.prefix_hit_rate,
                    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
            print(_fmt([rows[-1]], header=len(rows) == 1), flush=True)
    return rows


COLS = (
    "scenario",
    "engine",
    "requests",
    "events",
    "wall_s",
    "cpu_s",
    "sim_req_per_s",
    "sim_req_per_cpu_s",
    "events_per_cpu_s",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "prefix_hit_rate",
    "peak_rss_mib",
    "source",
)


def _fmt(rows: list[dict], header: bool = True) -> str:
    def f(v: object) -> str:
        return (
            f"{v:,.3g}"
            if isinstance(v, float) and abs(v) < 1000
            else (f"{v:,.0f}" if isinstance(v, (int, float)) else str(v))
        )

    lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)] if header else []
    lines += ["| " + " | ".join(f(r[c]) for c in COLS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="phase6 fleet-bench", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000, help="simulated requests per scenario")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--engines", default="simpy,heapq", help="comma list of simpy, heapq")
    a = ap.parse_args(argv)
    scenarios = [s for s in a.scenarios.split(",") if s]
    engines = [e for e in a.engines.split(",") if e]
    for s in scenarios:
        if s not in SCENARIOS:
            raise ValueError(f"--scenarios: unknown scenario {s!r}; known: {', '.join(SCENARIOS)}")
    for e in engines:
        if e not in ("simpy", "heapq"):
            raise ValueError(f"--engines: unknown engine {e!r}; known: simpy, heapq")
    if a.requests < 1:
        raise ValueError("--requests: must be >= 1")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # a one-core number
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown",
        )
        if Path("/proc/cpuinfo").is_file()
        else "unknown"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"fleet simulator speed, {time.strftime('%Y-%m-%d')}, CPU: {cpu}, 1 core pinned, load average {load:.1f} "
        f"over {os.cpu_count()} cores; Llama-3.1-70B TP4 replicas on H100 numbers. sim_req_per_cpu_s = requests / "
        "process CPU seconds (robust to other processes sharing the core)"
    )
    return run_bench(a.requests, scenarios, engines)


if __name__ == "__main__":
    main()
