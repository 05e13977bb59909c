"""How fast serve-bench turns a request trace into prompts: a 12k-row Mooncake conversation-sized trace.

    python scripts/repro/bench_trace_load.py                       # GPT-2 BPE from ../shared/data, synthetic trace tiled
    python scripts/repro/bench_trace_load.py --trace my.jsonl --rows 12031 --slow-rows 40

Builds the trace by tiling ../shared/data/mooncake-traces/synthetic_trace.jsonl (3,993 rows, mean input 15.3k tokens,
larger than the conversation trace's 12.0k, so the timing is conservative) to --rows rows with fresh hash ids per
tile, then times serving.workload.load_mooncake (quick path: prompts joined from cached per-token strings) and the
tokenizer path (decode + re-encode per row) on --slow-rows rows, extrapolated. Prints one table.

Reproduces: docs/benchmarks.md § serve-bench trace loading
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from phase6.serving import workload
from phase6.serving.traces import iter_mooncake
from phase6.timing import cpu, wall

SHARED = Path(os.environ.get("PHASE6_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def gpt2_tokenizer(folder: Path):
    from phase6.models.hf import hf_tokenizer

    return hf_tokenizer("gpt2", folder)


def tiled_trace(src: Path, rows: int, out: Path) -> None:
    base = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    span = base[-1]["timestamp"] + 1
    top = max(h for r in base for h in r["hash_ids"]) + 1
    with out.open("w") as f:
        for i in range(rows):
            tile, r = divmod(i, len(base))
            row = dict(base[r])
            row["timestamp"] += tile * span
            row["hash_ids"] = [h + tile * top for h in row["hash_ids"]]
            f.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=12031)
    ap.add_argument("--slow-rows", type=int, default=30)
    ap.add_argument("--tokenizer-dir", type=Path, default=SHARED / "gpt2-tokenizer")
    args = ap.parse_args()
    tok = gpt2_tokenizer(args.tokenizer_dir)
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            trace = Path(tmp) / "conversation_sized.jsonl"
            tiled_trace(SHARED / "mooncake-traces" / "synthetic_trace.jsonl", args.rows, trace)
        n = sum(1 for _ in iter_mooncake(trace))
        t = wall()
        pool = workload._content_ids(tok)
        pool_s = wall() - t
        t = wall()
        for _ in iter_mooncake(trace):
            pass
        parse_s = wall() - t
        t, c = wall(), cpu()
        reqs, _ = workload.load_mooncake(trace, tok, seed=0)
        quick_s, quick_cpu = wall() - t, cpu() - c
        tokens = sum(r.prompt_len for r in reqs)
        # the tokenizer path alone: the quick builder switched off
        rows = list(iter_mooncake(trace))[: args.slow_rows]
        small = Path(tmp) / "head.jsonl"
        small.write_text("".join(line for line in trace.read_text().splitlines(keepends=True)[: args.slow_rows]))
        workload._QUICK = False
        try:
            t, c = wall(), cpu()
            slow, _ = workload.load_mooncake(small, tok, seed=0)
            slow_s, slow_cpu = wall() - t, cpu() - c
        finally:
            workload._QUICK = True
        assert [r.prompt for r in slow] == [r.prompt for r in reqs[: len(rows)]]
    per_row_slow = slow_s / len(rows)
    print(f"trace: {trace.name}, {n} rows, {tokens / n:,.0f} prompt tokens/row mean; tokenizer: GPT-2 BPE (50,257)")
    print("| path | rows | wall s | CPU s of this process | rows/s (wall) | rows/s (CPU) |")
    print("|---|---|---|---|---|---|")
    print(f"| word pool (_content_ids, once) | - | {pool_s:.2f} | - | - | - |")
    print(f"| parse only (iter_mooncake) | {n} | {parse_s:.2f} | - | {n / parse_s:,.0f} | - |")
    print(
        f"| load_mooncake, quick path (total, pool included) | {n} | {quick_s:.2f} | {quick_cpu:.2f} | "
        f"{n / quick_s:,.0f} | {n / quick_cpu:,.0f} |"
    )
    print(
        f"| load_mooncake, tokenizer path | {len(rows)} measured (x{n / len(rows):.0f}) | {slow_s:.2f} "
        f"({per_row_slow * n:,.0f} extrapolated) | {slow_cpu:.2f} | {1 / per_row_slow:,.1f} | "
        f"{len(rows) / slow_cpu:,.1f} |"
    )
    print(f"pool size {len(pool)}; prompts of the first {len(rows)} rows identical on both paths")


if __name__ == "__main__":
    main()
