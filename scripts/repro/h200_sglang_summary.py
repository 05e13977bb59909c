"""Compact markdown summary of scripts/repro/h200_sglang.sh's runs (docs/benchmarks.md, "SGLang on the lent H200
(issue 29)"): phase6 serve-bench rows with SGLang's own token counters beside the client's usage tokens, then
`sglang.bench_serving` rows on the same request lists.

    python3 scripts/repro/h200_sglang_summary.py RUNS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(v: object, nd: int = 1) -> str:
    if v is None:
        return "missing"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def phase6_rows(root: Path) -> list[str]:
    out = [
        "| run | C | done/failed | out tok/s | TTFT p50/p99 ms | ITL p50/p99 ms | TPOT p50/p99 ms | usage out tok "
        "| sglang:generation_tokens_total delta | prompt delta | req sha |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in sorted(root.rglob("results.json")):
        try:
            d = json.loads(f.read_text())
        except ValueError as e:
            out.append(f"| {f.parent.name} | unreadable: {e} |")
            continue
        if not d.get("rows"):
            err = str(d.get("error") or "")[:240].replace("|", "/")
            out.append(f"| {f.relative_to(root).parent} | status {d.get('status')} | {err} |")
            continue
        r = d["rows"][0]
        sm = d.get("server_metrics") or {}
        delta = sm.get("delta") or {}
        wl = d.get("workload") or {}
        c = r.get("concurrency")
        out.append(
            f"| {f.relative_to(root).parent} | {c} | {r.get('completed')}/{r.get('failed')} "
            f"| {fmt(r.get('throughput_tok_s'))} | {fmt(r.get('ttft_p50_ms'))} / {fmt(r.get('ttft_p99_ms'))} "
            f"| {fmt(r.get('itl_p50_ms'), 2)} / {fmt(r.get('itl_p99_ms'), 2)} "
            f"| {fmt(r.get('tpot_p50_ms'), 2)} / {fmt(r.get('tpot_p99_ms'), 2)} "
            f"| {fmt(sm.get('client_usage_output_tokens_sent'))} | {fmt(delta.get('generation_tokens_total'))} "
            f"| {fmt(delta.get('prompt_tokens_total'))} | {str(wl.get('request_list_sha256'))[:8]} |"
        )
        srv = d.get("server") or {}
        if srv:
            out.append(
                f"|  ↳ server | version {srv.get('version')} | startup {fmt(srv.get('startup_s'))} s "
                f"| reused {srv.get('reused')} | metrics {sm.get('status')} | | | | | | |"
            )
    return out


def bench_rows(root: Path) -> list[str]:
    out = [
        "| sglang.bench_serving | C | completed | out tok/s | TTFT p50/p99 ms | ITL p50/p99 ms | TPOT p50/p99 ms "
        "| total out tok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in sorted(root.glob("sbench/c*.jsonl"), key=lambda p: int(p.stem[1:]) if p.stem[1:].isdigit() else 0):
        lines = [ln for ln in f.read_text().splitlines() if ln.strip()]
        if not lines:
            out.append(f"| {f.name} | empty |")
            continue
        d = json.loads(lines[-1])
        g = d.get
        out.append(
            f"| {f.stem} | {g('max_concurrency')} | {g('completed')} | {fmt(g('output_throughput'))} "
            f"| {fmt(g('median_ttft_ms'))} / {fmt(g('p99_ttft_ms'))} | {fmt(g('median_itl_ms'), 2)} / "
            f"{fmt(g('p99_itl_ms'), 2)} | {fmt(g('median_tpot_ms'), 2)} / {fmt(g('p99_tpot_ms'), 2)} "
            f"| {fmt(g('total_output_tokens'))} |"
        )
    return out


def server_ttft(root: Path) -> list[str]:
    """SGLang's own TTFT histogram over each run (after - before): the server's share of the TTFT a client reads."""
    try:
        from phase6.serving.telemetry import parse_exposition
    except ImportError as e:
        return [f"server TTFT: phase6 not importable ({e})"]
    pairs = [(f.parent.name, f.with_name("metrics_before.prom"), f) for f in sorted(root.rglob("metrics_after.prom"))]
    pairs += [
        (f.name.removesuffix(".after.prom"), f.with_name(f.name.replace(".after.", ".before.")), f)
        for f in sorted(root.glob("sbench/*.after.prom"))
    ]
    out = ["| run (in name order) | requests | server TTFT mean ms | server queue mean ms |", "|---|---|---|---|"]
    for name, before, after in pairs:
        if not before.is_file():
            out.append(f"| {name} | missing: no before-scrape |")
            continue
        a, b = parse_exposition(after.read_text()), parse_exposition(before.read_text())
        k = "sglang:time_to_first_token_seconds"
        n = a.get(k + "_count", 0.0) - b.get(k + "_count", 0.0)
        q = "sglang:queue_time_seconds"
        nq = a.get(q + "_count", 0.0) - b.get(q + "_count", 0.0)
        ttft = (a.get(k + "_sum", 0.0) - b.get(k + "_sum", 0.0)) / n * 1e3 if n else None
        queue = (a.get(q + "_sum", 0.0) - b.get(q + "_sum", 0.0)) / nq * 1e3 if nq else None
        out.append(f"| {name} | {n:.0f} | {fmt(ttft, 2)} | {fmt(queue, 2)} |")
    return out


def metric_names(root: Path) -> list[str]:
    """Which ``sglang:`` names phase6's telemetry reads are in a real exposition of this server (and which not)."""
    proms = sorted(root.rglob("metrics_after.prom")) + sorted(root.rglob("metrics_sample.prom"))
    if not proms:
        return ["metric names: no /metrics exposition was saved (missing)"]
    try:
        from phase6.serving.telemetry import PROM_NAMES
    except ImportError as e:
        return [f"metric names: phase6 not importable ({e})"]
    text = proms[0].read_text()
    series = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    ours = [n for names in PROM_NAMES.values() for n in names if n.startswith("sglang:")]
    have = [n for n in ours if n in series]
    lack = [n for n in ours if n not in series]
    return [
        f"metric names ({proms[0].relative_to(root)}, {len(series)} series): present {have}; absent {lack}",
        f"sglang: series in the exposition: {sorted(s for s in series if s.startswith('sglang:'))[:60]}",
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: h200_sglang_summary.py RUNS_DIR (a directory)", file=sys.stderr)
        return 2
    root = Path(argv[0])
    print("\n".join(phase6_rows(root)))
    print()
    print("\n".join(bench_rows(root)))
    print()
    print("\n".join(server_ttft(root)))
    print()
    print("\n".join(metric_names(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
