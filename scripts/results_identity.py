"""Do two runs of the same jobs record the same results? Compares results.json files key by key and lists every
difference, leaving out what cannot repeat between two runs: timestamps, paths, and measured durations and the rates
and costs computed from them (the lists below, stated once).

    python scripts/results_identity.py /tmp/before/pretrain /tmp/after/pretrain   # two run directories
    python scripts/results_identity.py /tmp/before /tmp/after                     # two roots: pairs by relative path

A root pairs every results.json below it by its path relative to the root; one that exists on one side only is a
difference. Numbers must be equal (a float differing in its last bit is a difference: the jobs are seeded on CPU).
Strings that contain the compared directory itself are compared with it replaced by ``<run>``. Exit status: 0 when
identical, 1 when anything differs, 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

# Keys left out, as regular expressions matched against "<job>:<key path>" (a path like rows[0].ttft_p50_ms). Each
# line says why its values differ between two runs of identical code.
IGNORED: list[tuple[str, str]] = [
    # timestamps: when the run happened
    (r".*:(.*\.)?(date|created|time|timestamp|started|finished)", "a timestamp"),
    # paths and endpoints of this run (a fresh port, process id, temporary directory each time)
    (r".*:(.*\.)?(run_dir|dir|path|base_url|model_id|pid|host|command)", "a path, port or process of this run"),
    # every job: the run's wall-clock duration
    (r".*:wall_time_s", "measured duration"),
    # 6A: step times and what is computed from them
    (r"(pretrain|prepare_data):.*(step_time_s|tokens_per_s|tok_s|mfu_pct|seconds|_hours|gpu_hours|usd)", "measured"),
    # 6C: trainer throughput
    (r"dpo:.*(pairs_per_s|_runtime|per_second|seconds|_s)", "measured duration or rate"),
    # 6D: phase times, rollout throughput and the shares and ratios computed from them
    (
        r"grpo:.*(_s|_ms|ms|ms_mean|_s_mean|_pct|share_pct|tokens_per_s|engine_vs_hf_generate|speedup|seconds)",
        "measured duration, rate or share",
    ),
    # 6B: every latency, rate and cost of a real server under a real client, and the server-side samples
    (
        r"serve_bench:.*(_ms|_s|_ms_.*|tok_s|req_s|attainment|good_fraction|gpu_hours.*|usd.*|cost/.*|"
        r"server_.*(mean|max)|mean_in_flight|gpu_.*|nvml|tokens_from_usage_pct|usage_vs_tokenizer_diff_pct)",
        "measured latency, rate, utilization or a cost from them",
    ),
    # the fleet simulator's own speed (its simulated results are deterministic and compared)
    (r"fleet:.*(sim_wall_s|sim_requests_per_s|sim_req_per_s)", "the simulator's measured speed"),
]
_IGNORED = [re.compile(p) for p, _ in IGNORED]


def ignored(job: str, path: str) -> bool:
    key = f"{job}:{path}"
    return any(p.fullmatch(key) for p in _IGNORED)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def diff(a: Any, b: Any, job: str, path: str, roots: tuple[str, str], out: list[str]) -> None:
    """Append "path: a != b" for every leaf that differs (recursing through dicts and lists)."""
    if path and ignored(job, path):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(dict.fromkeys([*a, *b])):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if not ignored(job, sub):
                    out.append(f"{sub}: only in {'after' if k not in a else 'before'}")
                continue
            diff(a[k], b[k], job, sub, roots, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items != {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            diff(x, y, job, f"{path}[{i}]", roots, out)
    else:
        if isinstance(a, str) and isinstance(b, str):
            a, b = a.replace(roots[0], "<run>"), b.replace(roots[1], "<run>")
        if not same(a, b):
            out.append(f"{path}: {a!r} != {b!r}")


def pairs(before: Path, after: Path) -> list[tuple[str, Path | None, Path | None]]:
    """(name, before's results.json, after's) of two run directories, or of every run directory under two roots."""
    if (before / "results.json").is_file() or (after / "results.json").is_file():
        names = ["."]
    else:
        names = sorted(
            {str(p.parent.relative_to(root)) for root in (before, after) for p in root.rglob("results.json")}
        )
    out = []
    for n in names:
        b, a = before / n / "results.json", after / n / "results.json"
        out.append((before.name if n == "." else n, b if b.is_file() else None, a if a.is_file() else None))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path, help="a run directory, or a root of run directories")
    p.add_argument("after", type=Path, help="the same, from the other run")
    args = p.parse_args()
    for d in (args.before, args.after):
        if not d.is_dir():
            print(f"results_identity: {d} is not a directory", file=sys.stderr)
            return 2
    found = pairs(args.before, args.after)
    if not found:
        print(f"results_identity: no results.json under {args.before} or {args.after}", file=sys.stderr)
        return 2
    differing = 0
    for name, b, a in found:
        if b is None or a is None:
            print(f"{name}: results.json only in {'after' if b is None else 'before'}")
            differing += 1
            continue
        rb, ra = json.loads(b.read_text()), json.loads(a.read_text())
        out: list[str] = []
        diff(rb, ra, str(rb.get("job", "")), "", (str(b.parent), str(a.parent)), out)
        print(f"{name}: {'identical' if not out else f'{len(out)} differences'}")
        for line in out:
            print(f"  {line}")
        differing += bool(out)
    print(f"{len(found) - differing} of {len(found)} identical (ignored: timestamps, paths, measured durations/rates)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
