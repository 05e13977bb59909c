"""Measured vs simulated engine steps, by step type, for the runs of a serve-bench sweep (torch-tp profile).

    python scripts/repro/fleet_step_diag.py outputs/gpu/tp2 outputs/gpu/blind4_tp2 --model outputs/models/qwen2.5-14b \\
        --hardware h200

Runs ``phase6 fleet experiment=compare`` on each sweep (same calibration, same replays) with a hook on the
replica's step ends, and sets the simulated steps of each run's final replay next to the measured steps
(``phase6.fleet.steps.run_steps``: chunk-time clusters). Step types: decode-only at a decode-row bin;
one prompt + decode (at a new / seen padded width); 2 prompts; 3+ prompts; prefill with no decode rows. Per type:
step count, p50 / mean duration, total time (the run's share of time), mean decode rows, mean padded tokens.
Simulated decode-only runs of k steps (the event-saving macro step) count as k steps of (run time / k).

Reproduces: docs/benchmarks.md § C=64 diagnosis: per-step comparison
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROW_BINS = ((1, 16), (17, 32), (33, 48), (49, 56), (57, 63), (64, 64))


def row_bin(d: int) -> str:
    for lo, hi in ROW_BINS:
        if lo <= d <= hi:
            return f"decode {lo}-{hi}" if lo != hi else f"decode {lo}"
    return f"decode {d}"


def step_type(n: int, decode_rows: int, new: bool | None) -> str:
    if n == 0:
        return row_bin(decode_rows)
    if decode_rows == 0:
        return "prefill, no decode"
    if n == 1:
        return "1 prompt + decode, " + ("new width" if new else "seen width")
    return "2 prompts + decode" if n == 2 else "3+ prompts + decode"


def order(k: str) -> tuple[int, int, str]:
    if k.startswith("decode "):
        return (0, int(k.split()[1].split("-")[0]), k)
    return (1, 0, k)


def measured(run_dir: Path, warm: frozenset[tuple[int, int]]) -> list[tuple[str, float, int, int]]:
    """(type, duration ms, decode rows, padded tokens) of every measured step but the first."""
    from phase6.fleet.steps import run_steps

    seen = set(warm)
    out = []
    for s in run_steps(run_dir):
        n = len(s.prompts)
        shape = (n, max(s.prompts)) if n else None
        new = shape not in seen if shape else None
        if shape:
            seen.add(shape)
        if np.isfinite(s.duration_s):
            out.append(
                (step_type(n, s.decode_rows, new), s.duration_s * 1e3, s.decode_rows, n * (max(s.prompts) if n else 0))
            )
    return out


TRACE: list[tuple[str, float, int, int, int]] = []


def install_hooks() -> dict[Path, list[tuple[str, float, int, int, int]]]:
    """Hook Replica step start/end and compare.replay; returns {run dir: simulated steps of its last replay}."""
    import phase6.fleet.compare as cmp
    from phase6.fleet.sim import Replica

    traces: dict[Path, list[tuple[str, float, int, int, int]]] = {}
    start, end, replay = Replica._start_step_padded, Replica._on_step_end, cmp.replay

    def start_hook(self: Replica, now: float) -> None:
        before = len(self.shapes)
        start(self, now)
        self._diag_new = len(self.shapes) > before  # type: ignore[attr-defined]

    def end_hook(self: Replica, gen: int) -> None:
        if gen == self.gen and self.padded:
            dur = (self.sim.loop.now - self.step_start) * 1e3
            n = len(self.chunks)
            w = max((c for _, c in self.chunks), default=0)
            k = max(1, self.run_k)
            t = step_type(n, self.n_dec, getattr(self, "_diag_new", None))
            TRACE.append((t, dur / k, self.n_dec, n * w, k))
        end(self, gen)

    def replay_hook(setup, run, engine, limits, lengths="requests"):  # type: ignore[no-untyped-def]
        TRACE.clear()
        res = replay(setup, run, engine, limits, lengths)
        traces[run.run_dir] = list(TRACE)
        return res

    Replica._start_step_padded = start_hook  # type: ignore[method-assign]
    Replica._on_step_end = end_hook  # type: ignore[method-assign]
    cmp.replay = replay_hook
    return traces


def summarize(rows: list[tuple[str, float, int, int, int]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[tuple[float, int, int, int]]] = defaultdict(list)
    for t, ms, d, pt, k in rows:
        by[t].append((ms, d, pt, k))
    total = sum(ms * k for v in by.values() for ms, _, _, k in v)
    out = {}
    for t, v in by.items():
        ms = np.repeat([x[0] for x in v], [x[3] for x in v])
        w = np.array([x[3] for x in v], dtype=float)
        out[t] = {
            "n": float(w.sum()),
            "p50": float(np.median(ms)),
            "mean": float(ms.mean()),
            "share": float(ms.sum() / total),
            "total_s": float(ms.sum() / 1e3),
            "rows": float(np.average([x[1] for x in v], weights=w)),
            "padded": float(np.average([x[2] for x in v], weights=w)),
        }
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fleet_step_diag.py")
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--model", required=True)
    p.add_argument("--hardware", required=True)
    p.add_argument("--only", default="", help="comma-separated run dir names (e.g. 2,0) to print")
    a = p.parse_args(argv)
    traces = install_hooks()
    from phase6.fleet.compare import compare_serve_bench, load_serve_bench, server_chain, shapes_before
    from phase6.fleet.run import build_setup
    from phase6.launch import load_config

    fleet = load_config("fleet", ["experiment=compare", f"model={a.model}", f"hardware={a.hardware}"])
    setup = build_setup(fleet)
    only = {s for s in a.only.split(",") if s}
    for sweep in a.sweeps:
        rows, _ = compare_serve_bench(sweep, fleet, setup)
        runs, _ = load_serve_bench(sweep)
        prev = server_chain([r.run_dir for r in runs])
        for run in runs:
            if only and run.run_dir.name not in only:
                continue
            row = next(r for r in rows if r["run"] == run.run_dir.name)
            m = summarize(
                [(t, ms, d, pt, 1) for t, ms, d, pt in measured(run.run_dir, shapes_before(run.run_dir, prev))]
            )
            s = summarize(traces[run.run_dir])
            print(
                f"\n{run.run_dir} (TP={row['tp']} C={row['concurrency']}): TTFT p50 {row['ttft_p50_ms_measured']:.1f} / "
                f"{row['ttft_p50_ms_sim']:.1f} ms ({row['ttft_err_pct']:+.1f} %), TPOT p50 {row['tpot_p50_ms_measured']:.2f} / "
                f"{row['tpot_p50_ms_sim']:.2f} ms ({row['tpot_err_pct']:+.1f} %); measured / simulated per step type:"
            )
            print("| step type | steps | p50 ms | mean ms | time s | share | mean decode rows | mean padded tokens |")
            print("|---|---|---|---|---|---|---|---|")
            for t in sorted(set(m) | set(s), key=order):
                x, y = m.get(t), s.get(t)

                def f(k: str, fmt: str, x=x, y=y) -> str:
                    return f"{format(x[k], fmt) if x else '-'} / {format(y[k], fmt) if y else '-'}"

                print(
                    f"| {t} | {f('n', '.0f')} | {f('p50', '.1f')} | {f('mean', '.1f')} | {f('total_s', '.1f')} | "
                    f"{f('share', '.2f')} | {f('rows', '.1f')} | {f('padded', '.0f')} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
