"""Diff two runs' results.json, leaf by leaf, leaving out what changes from run to run by design.

    python scripts/results_diff.py /tmp/before/pretrain/results.json /tmp/after/pretrain/results.json

Keys that hold timestamps, paths, process ids, ports or measured timings (``IGNORED_KEYS``) are skipped; a string that
differs only by the two runs' own directories counts as equal. Every other differing leaf prints as
``<path>: <before> -> <after>``; exit status 1 when something printed (a refactoring that must not change behaviour
is checked by running each smoke job before and after and expecting only timing lines, or none).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

IGNORED_KEYS = re.compile(r"(time|_s$|_s_|_ms|per_s|/s|wall|dir$|path|date|stamp|seconds|hours|usd|pid|base_url)", re.I)


def diff(a: Any, b: Any, path: str, same: tuple[str, str]) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            if IGNORED_KEYS.search(str(k)):
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                out += diff(a[k], b[k], f"{path}.{k}", same)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{path}: {len(a)} items -> {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):  # a length change is reported above
            out += diff(x, y, f"{path}[{i}]", same)
        return out
    if isinstance(a, str) and isinstance(b, str) and a.replace(same[0], "<run>") == b.replace(same[1], "<run>"):
        return []
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args()
    docs = []
    for f in (args.before, args.after):
        try:
            docs.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            print(f"results_diff: error: {f}: {e}", file=sys.stderr)
            return 2
    lines = diff(docs[0], docs[1], "", (str(args.before.parent), str(args.after.parent)))
    print("\n".join(lines) if lines else "identical (timestamps, paths and timings left out)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
