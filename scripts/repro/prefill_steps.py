"""Prefill steps of a measured serve-bench run, recovered from its per-request chunk times (requests.jsonl).

    python scripts/repro/prefill_steps.py outputs/gpu/tp1/1 outputs/gpu/tp1/2

For engines that emit every token of a step at once (phase6's torch-tp server: one prefill of the admitted prompts
plus one decode token per running request per step), the first tokens that reach the client within 2 ms of each
other came from one prefill step, and the chunk gap of a request that was decoding during that step (the gap that
ends at the same moment) is the step's duration. Prints, per number of prompts in the step: how many such steps,
their median duration and mean prompt tokens; a least-squares line step_ms = a + b * padded tokens (torch-tp pads the
prompts of a step to the longest); and, for every run, TTFT vs prompt tokens (a line through the requests, top 5 %
TTFT left out). Timestamps are the client's, so each duration carries the HTTP/stream delivery jitter (< 1 ms here).

Reproduces: docs/benchmarks.md § Engine mechanics: the torch-tp profile
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

BIN_S = 0.0005  # first tokens / chunk ends are matched on 0.5 ms bins
SAME_STEP_BINS = 4  # first tokens within 2 ms are one prefill step


def prefill_steps(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """((steps, 4) array of [prompts, prompt tokens, padded tokens, duration ms], (requests, 2) [prompt, TTFT ms])."""
    path = run_dir / "requests.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: not found (a serve-bench run dir has one)")
    reqs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    reqs = [r for r in reqs if r["ok"]]
    firsts: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, list[float]] = defaultdict(list)
    for r in reqs:
        firsts[round((r["send_s"] + r["ttft_s"]) / BIN_S)].append(int(r["prompt_tokens"]))
        t = np.asarray(r["chunk_times_s"]) + r["send_s"]
        for a, b in zip(t[:-1], t[1:], strict=True):
            ends[round(b / BIN_S)].append(b - a)
    groups: list[tuple[int, list[int]]] = []
    for k in sorted(firsts):
        if groups and k - groups[-1][0] <= SAME_STEP_BINS:
            groups[-1][1].extend(firsts[k])
        else:
            groups.append((k, list(firsts[k])))
    steps = []
    for k, toks in groups:
        witness = next((ends[j] for j in range(k - SAME_STEP_BINS, k + SAME_STEP_BINS + 1) if j in ends), None)
        if witness is not None:  # a request was decoding across this step
            steps.append((len(toks), sum(toks), max(toks) * len(toks), float(np.median(witness)) * 1e3))
    ttft = [(int(r["prompt_tokens"]), r["ttft_s"] * 1e3) for r in reqs]
    return np.asarray(steps, dtype=float).reshape(-1, 4), np.asarray(ttft, dtype=float)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print("| run | prompts per prefill step | steps | step ms p50 | prompt tokens (mean) | padded tokens (mean) |")
    print("|---|---|---|---|---|---|")
    fits = []
    for arg in argv:
        steps, ttft = prefill_steps(Path(arg))
        for k in sorted({int(x) for x in steps[:, 0]}):
            s = steps[steps[:, 0] == k]
            print(
                f"| {arg} | {k} | {len(s)} | {np.median(s[:, 3]):.0f} | {s[:, 1].mean():.0f} | {s[:, 2].mean():.0f} |"
            )
        line = ""
        if len(steps) >= 3 and len({int(x) for x in steps[:, 0]}) > 1:
            a, b = np.linalg.lstsq(np.c_[np.ones(len(steps)), steps[:, 2]], steps[:, 3], rcond=None)[0]
            line = f"prefill step ms = {a:.0f} + {b * 1e3:.0f} per 1000 padded tokens ({len(steps)} steps); "
        keep = ttft[:, 1] < np.percentile(ttft[:, 1], 95)
        slope, icpt = np.polyfit(ttft[keep, 0], ttft[keep, 1], 1)
        fits.append(
            f"{arg}: {line}TTFT ms = {icpt:.0f} + {slope * 1e3:.0f} per 1000 prompt tokens ({int(keep.sum())} requests)"
        )
    print("\n".join(fits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
