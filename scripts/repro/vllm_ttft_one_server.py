"""C=1 TTFT: phase6's client and `vllm bench serve` alternating on ONE vLLM server (scripts/repro/vllm_h200_run.sh ttft).

    python scripts/repro/vllm_ttft_one_server.py RUNS_DIR [--json OUT.json]

RUNS_DIR is the unpacked ``ttft/`` folder of that call: phase6 run dirs (``requests.jsonl``), ``vllm bench serve``
results (``--save-detailed``: per-request ``ttfts``) and the server's ``/metrics`` scraped before and after each run
(``NAME.before.prom`` / ``NAME.after.prom``). Per run: the client's TTFT p50/mean, the server's own TTFT histogram
mean over the same window (``vllm:time_to_first_token_seconds``; its count includes the run's one warm-up request),
the client's excess over it, and the server's prefill/queue means; then every run paired request by request with the
first ``vllm bench`` run (same request list, same order).

Reproduces: docs/benchmarks.md § 6B: the C=1 TTFT offset
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from phase6.serving.telemetry import parse_exposition

RUNS = ["p6_a", "vb_a", "p6nc_a", "vb_b", "p6_b", "p6nc_b"]


def prom(path: Path) -> dict[str, float]:
    """Every series of a scraped ``/metrics`` file, label sets summed (one model, one engine)."""
    return parse_exposition(path.read_text())


def hist_mean_ms(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float, int]:
    n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
    s = after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)
    return (1e3 * s / n if n else float("nan")), int(n)


def client_ttft_ms(root: Path, run: str) -> np.ndarray:
    if run.startswith("vb"):
        return np.array(json.loads((root / f"{run}.json").read_text())["ttfts"]) * 1e3
    reqs = [json.loads(x) for x in (root / run / "requests.jsonl").read_text().splitlines() if x.strip()]
    return np.array([q["ttft_s"] for q in sorted(reqs, key=lambda q: q["index"])]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", type=Path)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    runs = [r for r in RUNS if (a.runs / f"{r}.before.prom").is_file()]
    base = client_ttft_ms(a.runs, "vb_a")
    out = []
    print(
        "| run | client | TTFT p50 | TTFT mean | server TTFT mean (n) | client - server | server prefill mean | "
        "paired vs vb_a: median / mean |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        t = client_ttft_ms(a.runs, r)
        b, f = prom(a.runs / f"{r}.before.prom"), prom(a.runs / f"{r}.after.prom")
        srv, n = hist_mean_ms(b, f, "vllm:time_to_first_token_seconds")
        prefill, _ = hist_mean_ms(b, f, "vllm:request_prefill_time_seconds")
        queue, _ = hist_mean_ms(b, f, "vllm:request_queue_time_seconds")
        d = t - base
        row = {
            "run": r,
            "client": "vllm bench serve"
            if r.startswith("vb")
            else "phase6" + (" (include_usage only)" if "nc" in r else ""),
            "ttft_p50_ms": float(np.median(t)),
            "ttft_mean_ms": float(t.mean()),
            "server_ttft_mean_ms": srv,
            "server_ttft_count": n,
            "client_minus_server_ms": float(t.mean() - srv),
            "server_prefill_mean_ms": prefill,
            "server_queue_mean_ms": queue,
            "paired_vs_vb_a_median_ms": float(np.median(d)),
            "paired_vs_vb_a_mean_ms": float(d.mean()),
            "ttft_ms": [round(float(x), 3) for x in t],
        }
        out.append(row)
        print(
            f"| {r} | {row['client']} | {row['ttft_p50_ms']:.2f} | {row['ttft_mean_ms']:.2f} | {srv:.2f} ({n}) | "
            f"{row['client_minus_server_ms']:+.2f} | {prefill:.2f} | {np.median(d):+.2f} / {d.mean():+.2f} |"
        )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
