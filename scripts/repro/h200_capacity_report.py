"""After scripts/repro/h200_capacity.sh: keep the run's results.json + prediction.json under docs/results/ and print
the "measured" subsection of docs/benchmarks.md "6B capacity at an SLO: vLLM on one H200 (issue 33)" (every probe,
measured beside simulated, the capacity and its interval against the prediction written before the run, the SLO
broken first with the knee's evidence, $ per 1M output tokens at capacity).

    python scripts/repro/h200_capacity_report.py /work/.device/.../capacity.tar.xz --keep docs/results/i33_capacity_2026-12-02
    python scripts/repro/h200_capacity_report.py outputs/capacity_run_dir          # a run dir works too
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any


def _f(v: Any, p: int = 4) -> str:
    if v is None:
        return "–"
    return f"{v:.{p}g}" if isinstance(v, float) else str(v)


def render(res: dict[str, Any], pred: dict[str, Any]) -> str:
    c, knee = res["capacity"], res.get("knee") or {}
    srv = res.get("server") or {}
    out = [
        f"### Measured ({srv.get('version', '?')}; {c['probes']} probes, one server start; stop: {c['stop_reason']})",
        "",
        "| probe | rate req/s | attainment [95 % Wilson] | TTFT alone | TPOT alone | simulated | goodput req/s | "
        "out tok/s | TTFT p50 / p99 ms | server queue mean ms | ITL p99 ms | TPOT p99 ms | $/1M out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res["rows"]:
        out.append(
            f"| {p['probe']} | {_f(p['load'])} | {_f(p['attainment'], 3)} [{_f(p['attainment_ci_low'], 3)}, "
            f"{_f(p['attainment_ci_high'], 3)}] | {_f(p.get('ttft_attainment'), 3)} | {_f(p.get('tpot_attainment'), 3)} "
            f"| {_f(p.get('attainment_sim'), 3)} | {_f(p['goodput_req_s'])} | {_f(p['throughput_tok_s'])} | "
            f"{_f(p['ttft_p50_ms'])} / {_f(p['ttft_p99_ms'])} | {_f(p.get('server_queue_time_mean_ms'))} | "
            f"{_f(p['itl_p99_ms'])} | {_f(p['tpot_p99_ms'])} | {_f(p['usd_per_1m_output_tokens'], 3)} |"
        )
    at = c.get("at_capacity") or {}
    err = c.get("predicted_error_pct")
    out += [
        "",
        f"- **Capacity {_f(c['value'])} req/s** (95 % interval {_f(c['ci'][0])} - {_f(c['ci'][1])}; measured bracket "
        f"{_f(c['highest_passing_load'])} pass / {_f(c['lowest_failing_load'])} fail); predicted before the run "
        f"{_f(c.get('predicted'))} req/s (written {pred.get('written_before_first_probe_utc')}), error of the "
        f"prediction {_f(err, 3)} % (predicted - measured) / measured.",
        f"- **SLO broken first: {res['slo_broken_first']}** (predicted: {pred.get('slo_broken_first')}); crossings "
        f"measured {json.dumps(knee.get('slo_crossings'))}, simulated {json.dumps(pred.get('slo_crossings'))}.",
        f"- Knee: {knee.get('why')}",
        f"- At capacity (the highest rate that passed): {_f(at.get('usd_per_1m_output_tokens'), 3)} $ per 1M output "
        f"tokens, {_f(at.get('gpu_hours_per_1m_output_tokens'), 3)} GPU-h per 1M, goodput {_f(at.get('goodput_req_s'))} "
        f"req/s, {_f(at.get('throughput_tok_s'))} output tok/s.",
    ]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="capacity.tar.xz from h200_capacity.sh, or a capacity run dir")
    ap.add_argument("--keep", default=None, help="copy results.json + prediction.json into this folder")
    a = ap.parse_args()
    src = Path(a.source)
    with tempfile.TemporaryDirectory() as tmp:
        if src.is_file():
            with tarfile.open(src) as t:
                t.extractall(tmp, filter="data")
            src = Path(tmp) / "run"
        res = json.loads((src / "results.json").read_text())
        if res.get("status") != "complete" or "capacity" not in res:
            raise SystemExit(
                f"h200_capacity_report: {src}/results.json is not a complete capacity run: {res.get('error')}"
            )
        pred = json.loads((src / "prediction.json").read_text())
        if a.keep:
            keep = Path(a.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("results.json", "prediction.json"):
                shutil.copyfile(src / name, keep / name)
        print(render(res, pred))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
