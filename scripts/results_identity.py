"""Do two runs of the same jobs record the same results? Compares results.json files key by key and lists every
difference, leaving out what cannot repeat between two runs: timestamps, paths, and measured durations and the rates,
shares and costs computed from them (the lists below, stated once; ``--show-ignored`` lists what they left out).

    python scripts/results_identity.py /tmp/before/pretrain /tmp/after/pretrain   # two run directories
    python scripts/results_identity.py /tmp/before /tmp/after                     # two roots: pairs by relative path
    python scripts/results_identity.py a/results.json b/results.json             # two files

Predictions (keys under ``predicted.``) are computed, not measured: they are always compared. A two-key row
{"quantity": name, "value": v} (a Details table) is compared under the path ``<table>.<name>``, so the lists apply
to it. A root pairs every results.json below it by its path relative to the root; one on one side only is a
difference. Numbers must be equal (a float differing in its last bit is a difference: the jobs are seeded on CPU).
In strings, the run's directory reads ``<run>``, the one above it ``<up>`` and the compared root ``<root>`` (a sweep
member names the member that started the server), and a duration ("52.0 s") reads ``<duration>``.
Exit status: 0 when identical, 1 when anything differs, 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

# Left out in every job, as regular expressions over the key path (rows[0].ttft_p50_ms, cost.seconds, ...).
TIMESTAMPS = r"(.*\.)?(date|created|time|timestamp|started|finished)"
"""When the run happened."""
PATHS = r"(.*\.)?(\w*_dir|dir|\w*_path|path|base_url|model_id|pid|host|command)"
"""Where it ran: its directories, a fresh port, a process id."""
MEASURED_ALL = r"wall_time_s|cost\.(seconds|gpu_hours|usd|gpu_hours_per_1m_tokens|usd_per_1m_tokens)"
"""The run's wall time and its cost (phase6.cost prices the measured seconds)."""
# Left out per job: the key path ends with one of these (never under predicted.).
MEASURED: dict[str, str] = {
    "prepare_data": r"prep_seconds|tokens_per_s",  # tokenizer throughput
    "pretrain": r"step_time_s|tokens_per_s|mfu_pct|train_hours|cost/gpu_hours|cost/usd",  # step times and from them
    "dpo": r"pairs_per_s|_runtime|_per_second",  # trainer throughput
    # phase times, rollout throughput, and the shares and ratios computed from them
    "grpo": r"_s|_ms|ms|ms_mean|_s_mean|_s_per_step|_pct|tokens_per_s|engine_vs_hf_generate|speedup",
    # every latency, rate and cost of a real server under a real client, and the server-side samples
    "serve_bench": r"_ms|_s|_s_sum|server_delta_\w+|tok_s|req_s|attainment|good_fraction|gpu_hours_per_1m_\w+|(?<!api_)usd_per_1m_\w+|cost/\w+|"
    r"server_\w*(mean|max)|mean_in_flight|gpu_util_mean_pct|gpu_mem_max_gib|tokens_from_usage_pct|"
    r"usage_vs_tokenizer_diff_pct",
    "fleet": r"sim_wall_s|sim_requests_per_s",  # the simulator's own speed (its simulated results are compared)
}
# A measured duration quoted inside a text (a note's "52.0 s of training loop") is compared as "<duration>".
DURATION_IN_TEXT = re.compile(r"\b\d[\d,]*(\.\d+)? ?(s|ms)\b")
_EVERY_JOB = re.compile(f"{TIMESTAMPS}|{PATHS}|{MEASURED_ALL}")
_PER_JOB = {job: re.compile(rf"(?!predicted\.).*({keys})") for job, keys in MEASURED.items()}


def ignored(job: str, path: str) -> bool:
    per_job = _PER_JOB.get(job)
    return bool(_EVERY_JOB.fullmatch(path) or (per_job and per_job.fullmatch(path)))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def pair_label(item: Any) -> str | None:
    """The name of a two-key row like {"quantity": "e2e_p50_ms", "value": 179.2} (a Details table), else None."""
    if isinstance(item, dict) and len(item) == 2 and "value" in item:
        (label,) = (v for k, v in item.items() if k != "value")
        return label if isinstance(label, str) else None
    return None


def local(text: str, dirs: list[str]) -> str:
    """``text`` with this side's directories (its run dir, the dir above it, the compared root) read as ``<run>``,
    ``<up>``, ``<root>``."""
    for d, name in zip(dirs, ("<run>", "<up>", "<root>"), strict=True):
        text = text.replace(d, name)
    return text


def diff(
    a: Any, b: Any, job: str, path: str, roots: tuple[list[str], list[str]], out: list[str], skipped: list[str]
) -> None:
    """Append "path: a != b" to ``out`` for every leaf that differs (recursing through dicts and lists), and the
    paths left out to ``skipped``."""
    if path and ignored(job, path):
        skipped.append(path)
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(dict.fromkeys([*a, *b])):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if not ignored(job, sub):
                    out.append(f"{sub}: only in {'after' if k not in a else 'before'}")
                continue
            diff(a[k], b[k], job, sub, roots, out, skipped)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items != {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            label = pair_label(x)
            if label is not None and label == pair_label(y):  # a (quantity, value) row: its path names the quantity
                diff(x["value"], y["value"], job, f"{path}.{label}", roots, out, skipped)
            else:
                diff(x, y, job, f"{path}[{i}]", roots, out, skipped)
    else:
        if isinstance(a, str) and isinstance(b, str):
            a, b = (DURATION_IN_TEXT.sub("<duration>", local(x, r)) for x, r in zip((a, b), roots, strict=True))
        if not same(a, b):
            out.append(f"{path}: {a!r} != {b!r}")


def pairs(before: Path, after: Path) -> list[tuple[str, Path | None, Path | None]]:
    """(name, before's results.json, after's) of two files, two run directories, or every run directory under two
    roots."""
    if before.is_file() and after.is_file():
        return [(before.parent.name, before, after)]
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
    p.add_argument("before", type=Path, help="a results.json, a run directory, or a root of run directories")
    p.add_argument("after", type=Path, help="the same, from the other run")
    p.add_argument("--show-ignored", action="store_true", help="also list the keys left out, per run")
    args = p.parse_args()
    if not (args.before.is_file() and args.after.is_file()):
        for d in (args.before, args.after):
            if not d.is_dir():
                print(f"results_identity: {d} is neither a results.json nor a directory", file=sys.stderr)
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
        skipped: list[str] = []
        dirs = (
            [str(b.parent), str(b.parent.parent), str(args.before)],
            [str(a.parent), str(a.parent.parent), str(args.after)],
        )
        diff(rb, ra, str(rb.get("job", "")), "", dirs, out, skipped)
        print(f"{name}: {'identical' if not out else f'{len(out)} differences'}")
        for line in out:
            print(f"  {line}")
        if args.show_ignored:
            print(f"  left out ({len(skipped)}): {', '.join(skipped)}")
        differing += bool(out)
    print(f"{len(found) - differing} of {len(found)} identical (ignored: timestamps, paths, measured durations/rates)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
