"""What the pre-flight shard check costs: sha256 of every shard (manifest.json) before step 1.

    python scripts/repro/bench_shard_verify.py --shards 4 --tokens 100000000 --workers 1,2

Writes --shards llm.c shards of --tokens random uint16 tokens each (1e8 = the FineWeb-Edu layout, 200 MB a shard)
into a temporary directory, then times phase6.data.shards.verify_shards with each thread count (files in the page
cache: the hashing bound; a cold read adds the disk's read time, stated beside the extrapolation). Prints one table
with the extrapolation to 10B tokens (20 GB, 100 shards): seconds = 20 GB / min(workers x per-thread rate, disk).

Reproduces: docs/benchmarks.md § Pre-flight shard integrity
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from phase6 import timing
from phase6.data.shards import Manifest, TokenizerInfo, verify_shards, write_manifest, write_shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--disk-gbps", type=float, default=2.0, help="assumed cold read rate of a node's local NVMe")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        d = Path(tmp)
        infos = []
        for i in range(args.shards):
            name = f"bench_{'val' if i == 0 else 'train'}_{i:06d}.bin"
            infos.append(write_shard(d / name, rng.integers(0, 50257, args.tokens, dtype=np.uint16)))
        total = sum(i.num_tokens for i in infos)
        write_manifest(d, Manifest("bench", "r", TokenizerInfo("gpt2", 50257, 50256), shards=infos, num_tokens=total))
        gb = sum((d / i.file).stat().st_size for i in infos) / 1e9
        verify_shards(d, workers=1)  # warm the page cache
        print(f"{args.shards} shards, {total:,} tokens, {gb:.2f} GB; os.cpu_count() = {os.cpu_count()}")
        print(
            "| workers | wall s | CPU s | GB/s (wall) | GB/s per CPU s | 10B tokens (20 GB), cached | 10B, cold disk |"
        )
        print("|---|---|---|---|---|---|---|")
        for w in (int(x) for x in args.workers.split(",")):
            t, c = timing.wall(), timing.cpu()
            verify_shards(d, workers=w)
            wall, cpu = timing.wall() - t, timing.cpu() - c
            per_thread = gb / cpu
            node = 16  # default_hash_workers on a node with >= 16 cores per rank group
            est = 20 / (node * per_thread)
            cold = max(est, 20 / args.disk_gbps)
            print(
                f"| {w} | {wall:.2f} | {cpu:.2f} | {gb / wall:.2f} | {per_thread:.2f} | "
                f"{est:.1f} s at 16 threads x {per_thread:.2f} GB/s | {cold:.1f} s at {args.disk_gbps:g} GB/s |"
            )


if __name__ == "__main__":
    main()
