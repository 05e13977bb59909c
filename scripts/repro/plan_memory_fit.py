"""Fit `phase6 plan`'s training-memory terms to scripts/repro/h200_plan_memory.py's JSON (issue 30).

Reproduces docs/benchmarks.md "## plan memory measured on one H200 (issue 30)": per case, measured vs predicted for
three term groups, then the factors the planner applies (phase6.plan.memory.memory_calibration):
- activations (the factor the planner applies, per AC mode): peak allocated - resident - every block's bf16 grads vs
  the planner's ``activations`` term (none: per-layer x layers; selective: (block input + per-layer/2) x layers +
  per-layer/2; full: block input x layers + one block recomputed); the bytes saved after the forward (allocated after
  the forward vs the same formula without the recompute) are reported beside it;
- ZeRO-3 buffers: the extra peak of the ZeRO-3 run over the same case without it, plus the gradients the plain run
  keeps (all layers) and minus the 1/dp shards, vs the planner's gathered-layer term: layer params x (2 x 2 B + 4 B);
- allocator reserve: (peak reserved - peak allocated) / the dynamic bytes (peak allocated - resident).
The factor of a group is the median measured/predicted over its cases; ``--write`` stores them in
src/phase6/plan/memory_calibration.json (the planner then reports its memory term as measured on a GPU). ``--write``
is refused (exit 2, nothing written) when a group has no measured case (e.g. a partial, budget-cut run without
ZeRO-3 pairs); whether a complete fit is meaningful is for the reader of the table to judge, see the section.

    python scripts/repro/plan_memory_fit.py RESULTS/plan_memory.json [--write] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from phase6.plan.memory import MEMORY_CALIBRATION_PATH, activation_bytes_per_layer  # noqa: E402
from phase6.plan.model import ModelSpec, load_preset  # noqa: E402

GIB = 2**30
LLAMA_405B = {
    "model_type": "llama",
    "num_hidden_layers": 126,
    "hidden_size": 16384,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "intermediate_size": 53248,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}


def spec(name: str) -> ModelSpec:
    if name == "llama3.1-405b":
        return ModelSpec.from_hf_config(LLAMA_405B, name=name, source="Llama-3.1-405B config.json")
    return ModelSpec.from_fields(load_preset(name), name=name, source=f"configs/plan/model/{name}.yaml")


def predicted_saved(rec: dict) -> float:
    m = spec(rec["model"])
    per_layer = activation_bytes_per_layer(m, rec["seq"], rec["micro_batch"], rec["tp"])
    ckpt = 2.0 * rec["seq"] * rec["micro_batch"] * m.hidden_size / rec["tp"]
    unit = {"none": per_layer, "selective": ckpt + 0.5 * per_layer, "full": ckpt}[rec["ac"]]
    return rec["layers"] * unit


def predicted_peak_activations(rec: dict) -> float:
    """The planner's ``activations`` term for the case (phase6.plan.memory.train_memory, no PP): what is alive at the
    backward's peak - none: every block's; selective: block input + half per block, plus half a block recomputed;
    full: block inputs plus one block recomputed."""
    m = spec(rec["model"])
    per_layer = activation_bytes_per_layer(m, rec["seq"], rec["micro_batch"], rec["tp"])
    ckpt = 2.0 * rec["seq"] * rec["micro_batch"] * m.hidden_size / rec["tp"]
    n = rec["layers"]
    return {
        "none": n * per_layer,
        "selective": n * (ckpt + 0.5 * per_layer) + 0.5 * per_layer,
        "full": n * ckpt + per_layer,
    }[rec["ac"]]


def predicted_zero3(rec: dict) -> float:
    return rec["param_bytes_per_layer"] / 2 * (2 * 2 + 4)  # params x (2 gathered bf16 blocks + fp32 grads)


def fit(records: list[dict]) -> tuple[list[dict], dict]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("saved_bytes")]
    if not ok:
        raise ValueError("no usable record (status ok with measured bytes): nothing to fit")
    plain = {(r["model"], r["tp"], r["ac"]): r for r in ok if not r["zero3"]}
    rows, ratios = [], {"none": [], "selective": [], "full": [], "zero3": [], "reserve": []}
    for r in ok:
        row = {k: r[k] for k in ("model", "tp", "ac", "zero3", "layers")}
        pred = predicted_saved(r)
        row["saved_gib"] = r["saved_bytes"] / GIB
        row["saved_pred_gib"] = pred / GIB
        row["saved_ratio"] = r["saved_bytes"] / pred
        if not r["zero3"]:  # activations alive at the peak = peak - resident - the bf16 grads of every block
            act = r["peak_allocated_bytes"] - r["resident_bytes"] - r["layers"] * r["param_bytes_per_layer"]
            row["peak_act_gib"] = act / GIB
            row["peak_act_pred_gib"] = predicted_peak_activations(r) / GIB
            row["peak_act_ratio"] = act / predicted_peak_activations(r)
            ratios[r["ac"]].append(row["peak_act_ratio"])
        dyn = r["peak_allocated_bytes"] - r["resident_bytes"]
        row["reserve_fraction"] = (r["peak_reserved_bytes"] - r["peak_allocated_bytes"]) / dyn if dyn > 0 else None
        if row["reserve_fraction"] is not None:
            ratios["reserve"].append(row["reserve_fraction"])
        base = plain.get((r["model"], r["tp"], r["ac"]))
        if r["zero3"] and base:
            grads_plain = r["layers"] * r["param_bytes_per_layer"]
            shards = r["resident_bytes"] - (base["resident_bytes"] - r["layers"] * r["param_bytes_per_layer"])
            meas = (
                (r["peak_allocated_bytes"] - base["peak_allocated_bytes"])
                + grads_plain
                + (base["resident_bytes"] - r["resident_bytes"])
            )
            row["zero3_gib"] = meas / GIB
            row["zero3_pred_gib"] = predicted_zero3(r) / GIB
            row["zero3_ratio"] = meas / predicted_zero3(r)
            row["shard_gib"] = shards / GIB
            ratios["zero3"].append(row["zero3_ratio"])
        rows.append(row)
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    cal = {
        "source": "scripts/repro/h200_plan_memory.py on one H200, fitted by scripts/repro/plan_memory_fit.py",
        "activations": {k: med(ratios[k]) for k in ("none", "selective", "full") if ratios[k]},
        "zero3_transient": med(ratios["zero3"]),  # None: no ZeRO-3 pair measured (never shown as a fitted 1.0)
        "reserve_fraction": med(ratios["reserve"]),
        "cases": len(ok),
        "within_10pct": {  # share of cases whose formula (as is) is within 10% of the measurement
            k: round(sum(1 for x in ratios[k] if abs(x - 1) <= 0.10) / len(ratios[k]), 3) if ratios[k] else None
            for k in ("none", "selective", "full", "zero3")
        },
        "within_10pct_after_fit": {  # the same after the group's factor (one number per group, not per case)
            k: round(sum(1 for x in ratios[k] if abs(x / statistics.median(ratios[k]) - 1) <= 0.10) / len(ratios[k]), 3)
            if ratios[k]
            else None
            for k in ("none", "selective", "full", "zero3")
        },
    }
    return rows, cal


def markdown(rows: list[dict], cal: dict, meta: dict) -> str:
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    out = [
        f"Measured on {meta.get('gpu')} ({meta.get('date_utc')} UTC, torch {meta.get('torch')}, seq {meta.get('seq')},"
        f" {meta.get('layers')} layers, GQA {meta.get('gqa_mode')}).",
        "",
        "| model | tp | ac | zero3 | saved GiB | predicted | ratio | activations at peak GiB | predicted | ratio "
        "| ZeRO-3 buffers GiB | predicted | ratio | reserve/dyn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['tp']} | {r['ac']} | {'yes' if r['zero3'] else 'no'} | {f(r['saved_gib'])} | "
            f"{f(r['saved_pred_gib'])} | {f(r['saved_ratio'], 3)} | {f(r.get('peak_act_gib'))} | "
            f"{f(r.get('peak_act_pred_gib'))} | {f(r.get('peak_act_ratio'), 3)} | {f(r.get('zero3_gib'))} | "
            f"{f(r.get('zero3_pred_gib'))} | {f(r.get('zero3_ratio'), 3)} | {f(r['reserve_fraction'], 3)} |"
        )
    out += ["", f"fit (median measured/predicted): `{json.dumps(cal)}`"]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="plan_memory.json from scripts/repro/h200_plan_memory.py")
    ap.add_argument("--write", action="store_true", help=f"write {MEMORY_CALIBRATION_PATH.relative_to(ROOT)}")
    ap.add_argument("--md", default="", help="also write the markdown table here")
    a = ap.parse_args(argv)
    p = Path(a.json)
    try:
        if not p.is_file():
            raise ValueError(f"{p}: no such file")
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or "records" not in data:
            raise ValueError(f"{p}: expected the object h200_plan_memory.py writes (keys meta, records)")
        if data.get("meta", {}).get("smoke"):
            raise ValueError(f"{p}: a --smoke run (CPU logic check) has no memory numbers to fit")
        rows, cal = fit(data["records"])
        if a.write:
            missing = [g for g in ("none", "selective", "full") if g not in cal["activations"]]
            missing += [g for g in ("zero3_transient", "reserve_fraction") if cal[g] is None]
            if missing:  # the planner would report an unmeasured term as measured on a GPU
                raise ValueError(f"{p}: --write refused, no measured case for {', '.join(missing)}; nothing written")
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"plan_memory_fit: {e}", file=sys.stderr)
        return 2
    md = markdown(rows, cal, data.get("meta", {}))
    print(md)
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.write:
        cal["measured_file"] = str(p)
        MEMORY_CALIBRATION_PATH.write_text(json.dumps(cal, indent=1) + "\n")
        print(f"wrote {MEMORY_CALIBRATION_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
