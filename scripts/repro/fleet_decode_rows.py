"""Simulated side of the torch-tp compare cells with and without the per-row decode cost (engine.decode_seq_ms),
for when the measured run dirs are not at hand: the requests are rebuilt exactly (scripts/repro/fleet_predict.py's
rebuild with serve-bench's workload code; checked against the real C=1 run in tests/data), the calibration is
the one recorded in docs/benchmarks.md for each engine (the compare's own C=1 fit where its requests are here).

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    python scripts/repro/fleet_decode_rows.py outputs/models/qwen2.5-14b 0.06

Prints TTFT / TPOT p50 per cell for decode_seq_ms = 0 and the given value. Eager-prefill engine (2026-11-29):
TP=1 C=16/32/40, calibrated on tests/data's C=1 run + the recorded 50.7 ms new-shape cost. Compiled-prefill engine
(2026-11-30): TP=1 and TP=2 at C=1/16/64 as one sweep per server (+ C=64 on a fresh server), recorded fits
(step overhead, prefill overhead, prefill MFU, new-shape cost); the step overhead is lowered by one row's cost so
the C=1 TPOT stays what was fitted (the compare's C=1 refit does the same).

Reproduces: docs/benchmarks.md § Per-row decode cost
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fleet_predict as fp  # noqa: E402

import phase6.fleet.compare as cmp  # noqa: E402
from phase6.fleet.run import build_setup  # noqa: E402
from phase6.launch import load_config  # noqa: E402

REAL = Path(__file__).resolve().parents[2] / "tests" / "data" / "serve_bench_sweep_h200"
COMPILED_FITS = {1: (4.46, 24.7, 1.0, 48.1), 2: (4.95, 86.6, 0.742, 84.7)}
"""docs/benchmarks.md "Validation on the compiled-prefill engine": step overhead ms, prefill overhead ms, prefill MFU,
new-shape cost ms per TP."""


def planned(model: str, tp: int, cs: str) -> list[cmp.MeasuredRun]:
    ov = ["experiment=gpu_h200_tp", f"serve.tp={tp}", f"serve.model={model}", f"load.concurrency={cs}"]
    return [
        cmp.planned_run(f"C={c.load.concurrency}", dataclasses.asdict(c.serve), tp, int(c.load.concurrency), p, o)
        for c, p, o in fp.planned_requests(ov, 11)
    ]


def main(model: str, seq_ms: float) -> None:
    fleet = load_config("fleet", ["experiment=compare", f"model={REAL}/qwen2.5-14b_config.json", "hardware=h200"])
    cmp.shape_calibration = lambda runs, tp_of, tp: (50.7, "new-shape cost 50.7 ms (recorded C=16 fit)", None)
    eager = planned(model, 1, "16,32,40")
    for seq in (0.0, seq_ms):
        f = dataclasses.replace(fleet, engine=dataclasses.replace(fleet.engine, decode_seq_ms=seq))
        for r in cmp.predict_serve_bench(REAL, eager, f, build_setup(f), "auto"):
            print(f"eager TP=1 C={r['concurrency']} seq={seq}: {r['ttft_p50_ms_sim']:.1f} / {r['tpot_p50_ms_sim']:.2f}")
    for tp in (1, 2):
        runs = planned(model, tp, "1,16,64")
        for seq in (0.0, seq_ms):
            over, pov, mfu, shape = COMPILED_FITS[tp]
            f = dataclasses.replace(fleet, engine=dataclasses.replace(fleet.engine, tp=tp, decode_seq_ms=seq))
            setup = dataclasses.replace(build_setup(f), new_shape_ms=shape)
            warm: frozenset[tuple[int, int]] = frozenset()
            for p in runs:
                eng, lim, _, _ = cmp.replica_config(p, f, setup, "auto")
                eng = dataclasses.replace(eng, step_overhead_ms=over - seq, prefill_overhead_ms=pov, prefill_mfu=mfu)
                for fresh in (False, True) if p.concurrency == 64 else (False,):
                    s = dataclasses.replace(setup, warm_shapes=frozenset() if fresh else warm)
                    res = cmp.replay(s, p, eng, lim)
                    ttft, tpot = cmp.p50_ms(res)
                    where = "fresh server" if fresh else "after the sweep's earlier members"
                    print(f"compiled TP={tp} C={p.concurrency} seq={seq} ({where}): {ttft:.1f} / {tpot:.2f}")
                    if not fresh:
                        warm = res.prefill_shapes


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[5].strip())
    main(sys.argv[1], float(sys.argv[2]))
