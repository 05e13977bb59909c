"""6B write-up: fill WRITEUP.md from serve-bench run directories (single runs or whole sweep directories).

    python projects/6b_serving/writeup.py outputs/serve_bench/sweep_*/ --out outputs/serve_bench/writeup.md

Tables: the scaling table, TP scaling ratios per (engine, model, load, concurrency), predicted vs measured with
the planner's decode breakdown, cost per 1M output tokens against the configured API prices, capacity at the SLO
and which SLO breaks first (from capacity-mode runs: results.json ``capacity``, ``slo_broken_first``, ``knee``), and
caveats read from the runs (failures, aborted runs, unavailable telemetry, token-count fallbacks).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from phase6.runrecord import markdown_table, read_results
from phase6.serving.stats import ROW_KEYS

TEMPLATE = Path(__file__).with_name("WRITEUP.md")
TABLE_COLS = ("engine", "model", *ROW_KEYS[1:])  # the table row schema, with the model beside the engine


def find_runs(paths: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    """serve-bench results under each path (a run dir, or a sweep dir whose numbered members are runs)."""
    runs = []
    for p in map(Path, paths):
        dirs = (
            [p]
            if (p / "results.json").is_file()
            else sorted((d for d in p.iterdir() if (d / "results.json").is_file()), key=lambda d: (len(d.name), d.name))
        )
        for d in dirs:
            res = read_results(d)
            if res.get("job") == "serve_bench":
                runs.append((d, res))
    if not runs:
        raise ValueError(f"no serve_bench results.json under {', '.join(paths)}")
    return runs


def load_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["engine"], r.get("model"), r.get("load"), r.get("concurrency"), r.get("request_rate"))


def _ratio(r: dict[str, Any], base: dict[str, Any], k: str) -> float | None:
    return r[k] / base[k] if base.get(k) and r.get(k) is not None else None


def tp_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(load_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["tp"])
        base = rs[0]
        for r in rs[1:]:
            thr = r["throughput_tok_s"] / base["throughput_tok_s"] if base["throughput_tok_s"] else None
            gpus = r["tp"] / base["tp"]

            out.append(
                {
                    "engine": key[0],
                    "model": key[1],
                    "load": key[2],
                    "concurrency": key[3],
                    "request_rate": key[4],
                    "tp": f"{base['tp']} -> {r['tp']}",
                    "gpu_ratio": gpus,
                    "throughput_ratio": thr,
                    "efficiency": thr / gpus if thr is not None else None,
                    "tok_s_per_gpu": f"{base['throughput_tok_s'] / base['tp']:.4g} -> "
                    f"{r['throughput_tok_s'] / r['tp']:.4g}",
                    "tpot_p50_ratio": _ratio(r, base, "tpot_p50_ms"),
                    "ttft_p50_ratio": _ratio(r, base, "ttft_p50_ms"),
                    "usd_per_1m_ratio": _ratio(r, base, "usd_per_1m_output_tokens"),
                }
            )
    return out


def predicted_rows(runs: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for d, res in runs:
        pred, row = res.get("predicted") or {}, res["rows"][0]
        if not pred:
            continue
        b = pred.get("breakdown", {})
        step = sum(b.get(k, 0.0) for k in ("decode_weights_ms", "decode_kv_ms")) or None
        out.append(
            {
                "run": d.name,
                "engine": row["engine"],
                "tp": row["tp"],
                "concurrency": row["concurrency"],
                "tpot_pred_ms": pred.get("tpot_p50_ms"),
                "tpot_meas_ms": row["tpot_p50_ms"],
                "ttft_pred_ms": pred.get("ttft_p50_ms"),
                "ttft_meas_ms": row["ttft_p50_ms"],
                "tok_s_pred": pred.get("throughput_tok_s"),
                "tok_s_meas": row["throughput_tok_s"],
                "hbm_ms": step,
                "allreduce_ms": b.get("decode_allreduce_ms"),
                "allreduce_share": (b["decode_allreduce_ms"] / pred["tpot_p50_ms"])
                if b.get("decode_allreduce_ms") is not None and pred.get("tpot_p50_ms")
                else None,
                "max_seqs_in_kv": b.get("max_concurrent_seqs"),
                "fits": b.get("fits"),
            }
        )
    return out


def cost_rows(runs: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for d, res in runs:
        row = res["rows"][0]
        for api in (res.get("tables") or {}).get("API price comparison", []):
            out.append(
                {
                    "run": d.name,
                    "engine": row["engine"],
                    "tp": row["tp"],
                    "concurrency": row["concurrency"],
                    "self_usd_per_1m_out": row["usd_per_1m_output_tokens"],
                    "api": f"{api['provider']} {api['model']}",
                    "api_usd_per_1m_out": api["api_usd_per_1m_output"],
                    "api_over_self": api["output_api_over_self"],
                }
            )
    return out


def caveats(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    notes = []
    for d, res in runs:
        row, det = res["rows"][0], res.get("details", {})
        if row["failed"]:
            notes.append(
                f"- {d.name}: {row['failed']} failed requests ({det.get('errors')}); abort: {det.get('abort_reason')}"
            )
        if det.get("tokens_from_usage_pct") not in (None, 100.0):
            notes.append(f"- {d.name}: only {det['tokens_from_usage_pct']:.0f}% of output counts from server usage")
        tel = res.get("telemetry", {})
        for k in ("nvml", "metrics"):
            if str(tel.get(k, "ok")) != "ok":
                notes.append(f"- {d.name}: {k} {tel[k]}")
    return "\n".join(dict.fromkeys(notes)) or "- none recorded"


def capacity_rows(caps: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per capacity run: the capacity with its interval, the prediction, the SLO broken first, $ at capacity."""
    out = []
    for d, res in caps:
        c, probe = res["capacity"], res["rows"][0]
        at = c.get("at_capacity") or {}
        out.append(
            {
                "run": d.name,
                "engine": f"{probe['engine']} {res.get('server', {}).get('version') or ''}".strip(),
                "tp": probe["tp"],
                "search": f"{c['search']} ({c['unit']})",
                "capacity": c.get("value"),
                "ci_low": c["ci"][0],
                "ci_high": c["ci"][1],
                "highest_passing": c.get("highest_passing_load"),
                "lowest_failing": c.get("lowest_failing_load"),
                "predicted": c.get("predicted"),
                "probes": c["probes"],
                "slo_broken_first": res.get("slo_broken_first"),
                "usd_per_1m_out_at_capacity": at.get("usd_per_1m_output_tokens"),
                "goodput_req_s_at_capacity": at.get("goodput_req_s"),
            }
        )
    return out


def broken_first_text(caps: list[tuple[Path, dict[str, Any]]]) -> str:
    """Which SLO breaks first, per capacity run, stated from its probes (results.json ``slo_broken_first``/``knee``)."""
    lines = []
    for d, res in caps:
        c, first, knee = res["capacity"], res.get("slo_broken_first"), res.get("knee") or {}
        cross = knee.get("slo_crossings") or {}
        at = ", ".join(f"{k} at {v:.4g} {c['unit']}" if isinstance(v, float) else f"{k}: {v}" for k, v in cross.items())
        lines.append(f"- {d.name}: **{first}** breaks first ({at}). {knee.get('why', '')}")
        rows = knee.get("rows") or []
        if rows:
            lines += ["", markdown_table(rows), ""]
    return "\n".join(lines) or "- no capacity run among these directories"


def render(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    caps = [(d, res) for d, res in runs if "capacity" in res]
    runs = [(d, res) for d, res in runs if "capacity" not in res] or caps  # probes are not table rows
    rows = [res["rows"][0] for _, res in runs]
    first = runs[0][1]
    srv, wl = first.get("server", {}), first.get("workload", {})
    engines = sorted(
        {
            f"{r['engine']} {res.get('server', {}).get('version', '')}".strip()
            for r, (_, res) in zip(rows, runs, strict=True)
        }
    )
    setup = "\n".join(
        [
            f"- runs: {len(runs)} ({', '.join(str(d) for d, _ in runs[:4])}{', ...' if len(runs) > 4 else ''})",
            f"- engines: {', '.join(engines)}; model(s): {', '.join(sorted({str(r.get('model')) for r in rows}))}",
            f"- workload: {wl.get('dataset')} ({wl.get('arrival')}), {wl.get('num_requests')} requests, prompt mean "
            f"{wl.get('prompt_len_mean', 0):.0f} / output mean {wl.get('output_len_mean', 0):.0f} tokens, "
            f"seed {wl.get('seed')}, request list sha256 {str(wl.get('request_list_sha256'))[:12]}",
            f"- first server command: `{' '.join(srv.get('command') or ['(external endpoint)'])}`",
        ]
    )
    slo = first.get("slo", {})
    fill = {
        "title": ", ".join(sorted({str(r.get("model")) for r in rows})),
        "setup": setup,
        "slo": " AND ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.items() if v is not None),
        "table": markdown_table([{k: r.get(k) for k in TABLE_COLS} for r in rows]),
        "tp_scaling": markdown_table(tp_scaling(rows)),
        "predicted": markdown_table(predicted_rows(runs)),
        "cost": markdown_table(cost_rows(runs)),
        "caveats": caveats(runs),
        "capacity": markdown_table(capacity_rows(caps)) if caps else "- no capacity run among these directories",
        "slo_broken_first": broken_first_text(caps),
    }
    text = TEMPLATE.read_text()
    for k, v in fill.items():
        text = text.replace("{{" + k + "}}", v.rstrip("\n"))
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="serve-bench run or sweep directories")
    p.add_argument("--out", default=None, help="write here (default: print)")
    args = p.parse_args(argv)
    try:
        text = render(find_runs(args.paths))
    except ValueError as e:
        raise SystemExit(f"writeup: error: {e}") from e
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
