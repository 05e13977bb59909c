"""Issue 30: schedules searched by default, the practice layout beside the #1 with the deciding term's validation
status, CP overheads, the memory calibration hook, the serving reserve from a vLLM log and the memory fit script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from plan_hardware import PROFILE

from phase6.config.plan import PlanConfig
from phase6.plan import memory as memory_mod
from phase6.plan.memory import ParallelLayout, TrainSetup, train_memory
from phase6.plan.model import resolve_model
from phase6.plan.practice import (
    DATASHEET,
    FITTED,
    MEASURED,
    TERM_STATUS,
    Comparison,
    compare,
    memory_status,
    practice_layout,
)
from phase6.plan.recommend import SEARCHED_SCHEDULES, recommend_train, schedules
from phase6.plan.serve_reserve import calibrate, parse_vllm_log
from phase6.plan.train import cp_merge_bytes, predict_train_step

ROOT = Path(__file__).resolve().parents[1]


def test_auto_searches_every_schedule_and_each_candidate_reports_its_own() -> None:
    m = resolve_model("llama3.1-70b")
    plan = PlanConfig(seq_len=4096, global_batch_tokens=4096 * 512, pp=4, top_k=50)
    assert plan.pp_schedule == "auto"
    got = schedules(m, ParallelLayout(dp=4, tp=8, pp=4), plan)
    assert got == list(SEARCHED_SCHEDULES)  # 80 layers >= 4 x 8 chunks, m = 128 divisible by 4
    rec = recommend_train(m, 128, plan, PROFILE)
    labels = {c.extra["pp_schedule"] for c in rec.candidates}
    assert labels and all(
        lab in {"1f1b", "zero_bubble", "interleaved v=2", "interleaved v=4", "interleaved v=8"} for lab in labels
    )
    for c in rec.candidates:
        assert "schedule " in c.reason


def test_interleaving_needs_a_layer_per_chunk_and_whole_rounds() -> None:
    m = resolve_model("gpt2")  # 12 layers
    plan = PlanConfig(seq_len=1024, global_batch_tokens=1024 * 6)
    got = schedules(m, ParallelLayout(dp=1, tp=1, pp=4), plan)  # m = 6: not a multiple of 4
    assert ("interleaved", 2) not in got and ("1f1b", 1) in got and ("zero_bubble", 1) in got
    assert schedules(m, ParallelLayout(dp=4, pp=1), plan) == [("1f1b", 1)]
    assert schedules(m, ParallelLayout(pp=4), PlanConfig(pp_schedule="gpipe")) == [("gpipe", 2)]


def test_cp_merge_traffic_grows_with_ring_steps_and_is_zero_without_cp() -> None:
    m = resolve_model("llama3.1-8b")
    assert cp_merge_bytes(m, 1, 1, 1) == 0.0
    one, full = cp_merge_bytes(m, 8, 1, 1), cp_merge_bytes(m, 8, 1, 2)
    assert full > one > cp_merge_bytes(m, 2, 1, 1) > 0
    # (cp-1) x (38 q fwd + 10 q + 20 kv) per token
    assert one == pytest.approx(7 * (38 * 4096 + 10 * 4096 + 20 * 1024))


def test_cp_ring_is_priced_merges_and_step_efficiency(monkeypatch: pytest.MonkeyPatch) -> None:
    # 70B at 8K on 256 GPUs: CP 8 (1K-token chunks) used to win over TP 8 only because its ring cost nothing
    from phase6.plan import train as train_mod

    m = resolve_model("llama3.1-70b")
    setup = TrainSetup(
        seq_len=8192,
        global_batch_tokens=4194304,
        micro_batch_size=16,
        zero=3,
        activation_checkpointing=True,
        attention_kernel="fa2",
    )
    cp8 = predict_train_step(m, ParallelLayout(dp=32, cp=8), setup, PROFILE)
    tp8 = predict_train_step(m, ParallelLayout(dp=32, tp=8), setup, PROFILE)
    assert cp8.breakdown.cp_merge_s > 0 and tp8.breakdown.cp_merge_s == 0
    # measured on one H200 (§9, seventh round), not fitted on a published row
    assert train_mod.cp_ring_step_efficiency(8192 / 16) == 0.71
    monkeypatch.setattr(train_mod, "cp_ring_step_efficiency", lambda half: 1e9)  # ring steps free beyond the diagonal
    monkeypatch.setattr(train_mod, "cp_merge_bytes", lambda *a: 0.0)
    free = predict_train_step(m, ParallelLayout(dp=32, cp=8), setup, PROFILE)
    assert free.step_time_s < cp8.step_time_s - cp8.breakdown.cp_merge_s * 0.99
    assert predict_train_step(m, ParallelLayout(dp=32, tp=8), setup, PROFILE).step_time_s == tp8.step_time_s


def test_practice_layout_follows_the_rules() -> None:
    plan = PlanConfig(seq_len=8192, global_batch_tokens=4194304)
    p70, why = practice_layout(resolve_model("llama3.1-70b"), 256, plan, PROFILE)
    assert p70 is not None and p70.layout.tp == 8 and p70.layout.cp == 1 and p70.setup.ac_mode == "full", why
    p8, why = practice_layout(resolve_model("llama3.1-8b"), 64, plan, PROFILE)
    assert p8 is not None and p8.layout == ParallelLayout(dp=64) and p8.setup.ac_mode == "selective", why
    assert "DP 64 outermost" in why


def test_compare_names_the_deciding_term_and_its_status() -> None:
    m = resolve_model("llama3.1-70b")
    plan = PlanConfig(seq_len=8192, global_batch_tokens=4194304)
    rec = recommend_train(m, 256, plan, PROFILE)
    top = rec.candidates[0].detail
    c = compare(top, m, 256, plan, PROFILE)
    text = "\n".join(c.lines(top))
    assert "practice:" in text and "#1:" in text
    assert c.status in (MEASURED, FITTED, DATASHEET)
    if not c.same and c.gap > 0.05:
        assert c.term in text and c.status in text
        assert ("WARNING" in text) == (c.status == DATASHEET)
    assert set(s for s, _ in TERM_STATUS.values()) == {MEASURED, FITTED, DATASHEET}


def test_same_or_tied_practice_still_names_a_term_and_its_validation() -> None:
    m = resolve_model("llama3.1-8b")
    plan = PlanConfig(seq_len=8192, global_batch_tokens=8192 * 64)
    prac, _ = practice_layout(m, 8, plan, PROFILE)
    assert prac is not None
    same = compare(prac, m, 8, plan, PROFILE)  # the #1 is the practice layout itself
    assert same.same
    text = "\n".join(same.lines(prac))
    assert "the #1 is the practice layout; its largest term:" in text and "validation: " in text
    tie = Comparison(prac, "rule", False, 0.02, "tp communication", 0.1, DATASHEET, "NVLink busbw")
    text = "\n".join(tie.lines(prac))
    assert "within the 5% tie tolerance" in text
    assert (
        "the term that differs most: tp communication (+100 ms/step in the #1's favour), validation: datasheet only"
        in text
    )


def test_explain_output_carries_the_practice_comparison(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phase6.cli import app

    args = ["plan", "model=llama3.1-70b", "hardware=h100_sxm", "gpus=256", "workload=train", "plan.seq_len=8192"]
    r = CliRunner().invoke(app, [*args, f"run.dir={tmp_path / 'run'}", "--explain"])
    assert r.exit_code == 0, r.output
    assert "## Practice layout beside the #1" in r.stdout and "practice rule:" in r.stdout
    assert "validation:" in r.stdout.split("## Practice layout beside the #1")[1]
    j = CliRunner().invoke(app, [*args, f"run.dir={tmp_path / 'run2'}", "--json"])
    practice = json.loads(j.stdout)["practice"]
    assert practice["deciding_term_status"] in (MEASURED, FITTED, DATASHEET) and practice["practice_layout"]


def test_memory_calibration_file_scales_the_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = resolve_model("llama3.1-8b")
    lay, setup = ParallelLayout(dp=8), TrainSetup(seq_len=8192, global_batch_tokens=8192 * 8, zero=3)
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "none.json")
    base = train_memory(m, lay, setup)
    cal = {"source": "test", "activations": {"none": 1.2}, "zero3_transient": 1.5, "reserve_fraction": 0.0}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "cal.json")
    got = train_memory(m, lay, setup)
    assert got.activations == pytest.approx(1.2 * base.activations)
    assert got.transient == pytest.approx(1.5 * base.transient)
    # the allocator reserve lands on the step's dynamic bytes only (activations, logits, per-block ZeRO-3 buffers)
    cal["reserve_fraction"] = 0.25
    (tmp_path / "cal2.json").write_text(json.dumps(cal))
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "cal2.json")
    got = train_memory(m, lay, setup)
    dyn = 1.2 * base.activations + base.logits + 1.5 * base.transient
    assert got.transient == pytest.approx(1.5 * base.transient + 0.25 * dyn)
    assert (got.params, got.grads, got.optimizer) == (base.params, base.grads, base.optimizer)
    # with PP the stage's unsharded params + grads stay resident (not emulated on the GPU): neither factor nor reserve
    pp_got = train_memory(m, ParallelLayout(dp=4, pp=2), setup)
    copies = [(d + e) * (2 + setup.grad_reduce_bytes) for d, e in memory_mod.stage_params(m, 2)]  # first, last stage
    resident = pp_got.transient - 0.25 * (pp_got.activations + pp_got.logits)
    assert any(resident == pytest.approx(c) for c in copies), (resident, copies)
    assert "allocator reserve 0.25" in memory_status()[1] and memory_status()[0] == MEASURED
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "none.json")
    assert memory_status()[0] == DATASHEET
    (tmp_path / "bad.json").write_text(json.dumps({"source": "x"}))
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "bad.json")
    with pytest.raises(ValueError, match="missing key 'activations'"):
        train_memory(m, lay, setup)


VLLM_LOG = """\
INFO 12-01 10:00:01 [gpu_model_runner.py:2000] Model loading took 27.5261 GiB and 6.1 seconds
INFO 12-01 10:00:20 [gpu_worker.py:300] Available KV cache memory: 96.40 GiB
INFO 12-01 10:00:20 [kv_cache_utils.py:900] GPU KV cache size: 526,512 tokens
INFO 12-01 10:00:25 [gpu_model_runner.py:2500] Graph capturing finished in 5 secs, took 0.89 GiB
"""


def test_serving_reserve_from_a_vllm_log() -> None:
    prof = parse_vllm_log(VLLM_LOG, "fixture")
    assert (prof.weights_gib, prof.kv_cache_gib, prof.kv_cache_tokens, prof.cuda_graph_gib) == (
        27.5261,
        96.40,
        526512.0,
        0.89,
    )
    assert set(prof.missing()) == {"activation_peak_gib", "non_torch_gib"}
    m = resolve_model({}, str(ROOT / "tests/data/serve_bench_sweep_h200/qwen2.5-14b_config.json"))
    res = calibrate(prof, m, 140.401, 0.9)
    assert res["reserve_gib_measured"] == pytest.approx(0.9 * 140.401 - 27.5261 - 96.40)
    # calibrated overhead reproduces the measured KV cache exactly
    again = calibrate(prof, m, 140.401, 0.9, runtime_overhead_gib=res["runtime_overhead_gib_calibrated"])
    assert again["kv_cache_gib_predicted"] == pytest.approx(96.40, abs=0.01)
    with pytest.raises(ValueError, match="Available KV cache memory"):
        calibrate(parse_vllm_log("nothing", "empty"), m, 140.0, 0.9)


def _synthetic(factor: float) -> dict:
    """A sweep JSON whose every measurement is the planner's formula x ``factor`` (ZeRO-3 buffers x 1.25,
    allocator reserve 10 % of the dynamic bytes), plus one OOM row."""
    sys.path.insert(0, str(ROOT / "scripts/repro"))
    import plan_memory_fit as fitmod

    recs = []
    for tp in (1, 2):
        for ac in ("none", "selective", "full"):
            for z3 in (False, True):
                r = {
                    "model": "llama3.1-8b",
                    "tp": tp,
                    "ac": ac,
                    "zero3": z3,
                    "layers": 3,
                    "seq": 8192,
                    "micro_batch": 1,
                    "param_bytes_per_layer": 436207616 // tp,
                    "status": "ok",
                    "sp": "gathered",
                    "swiglu": "eager",
                    "grads": "fsdp2" if z3 else "preallocated",
                }
                p = fitmod.predicted(r)
                resident = r["param_bytes_per_layer"] * (3 if not z3 else 3 / 8 * 3) + 1e8
                dyn = factor * p["peak_act"] + (1.25 * p["zero3"] if z3 else 0.0)
                r.update(
                    saved_bytes=factor * p["saved"],
                    resident_bytes=resident,
                    peak_allocated_bytes=resident + dyn,
                    peak_reserved_bytes=resident + 1.1 * dyn,
                )
                recs.append(r)
    recs.append({"model": "llama3.1-405b", "tp": 1, "ac": "none", "zero3": False, "layers": 3, "status": "OOM"})
    return {"meta": {"gpu": "synthetic"}, "records": recs}


def _fit(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/repro/plan_memory_fit.py"), str(path), *extra],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src")},
        timeout=120,
    )


def test_memory_fit_recovers_known_factors_per_term_group(tmp_path: Path) -> None:
    p = tmp_path / "plan_memory.json"
    p.write_text(json.dumps(_synthetic(1.08)))
    md = tmp_path / "mem.md"
    out = _fit(p, "--md", str(md))
    assert out.returncode == 0, out.stderr
    cal = json.loads(out.stdout.split("fit (median measured/predicted): `")[1].split("`")[0])
    assert cal["activations"] == {"none": 1.08, "selective": 1.08, "full": 1.08}
    assert cal["zero3_transient"] == 1.25 and cal["reserve_fraction"] == pytest.approx(0.1, abs=1e-3)
    g = cal["groups"]
    assert g["saved none"]["median"] == 1.08 and g["saved none"]["cases"] == 4  # 2 TP x (plain, ZeRO-3)
    assert g["none"]["within_10pct"] == 1.0 and g["zero3"]["within_10pct"] == 0.0  # 1.08 in, 1.25 out of the bar
    assert g["zero3"]["within_10pct_after_fit"] == 1.0
    assert cal["cases"] == 12  # the OOM row is not fitted
    assert "| ZeRO-3 buffers | 6 | 1.250 |" in md.read_text()


def test_memory_fit_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    smoke = tmp_path / "smoke.json"
    smoke.write_text(json.dumps({"meta": {"smoke": True}, "records": []}))
    bad = _fit(smoke)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--smoke" in bad.stderr
    old = _synthetic(1.0)
    for r in old["records"]:
        r.pop("grads", None)  # the 2026-12-02 01:07 records: emulation not named, grads not preallocated
    (tmp_path / "old.json").write_text(json.dumps(old))
    bad = _fit(tmp_path / "old.json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "old.json" in bad.stderr and "rerun" in bad.stderr


def test_memory_fit_refuses_to_write_a_group_it_never_measured(tmp_path: Path) -> None:
    # a budget-cut run without ZeRO-3 pairs must not become "measured" factors
    data = _synthetic(1.1)
    data["records"] = [r for r in data["records"] if not r["zero3"]]
    p = tmp_path / "plan_memory.json"
    p.write_text(json.dumps(data))
    shown = _fit(p)
    assert shown.returncode == 0, shown.stderr
    cal = json.loads(shown.stdout.split("fit (median measured/predicted): `")[1].split("`")[0])
    assert cal["zero3_transient"] is None and cal["activations"]["none"] == 1.1
    existed = memory_mod.MEMORY_CALIBRATION_PATH.exists()
    bad = _fit(p, "--write")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "zero3_transient" in bad.stderr
    assert memory_mod.MEMORY_CALIBRATION_PATH.exists() == existed


def test_a_written_fit_is_what_train_memory_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the patch path: the fit's JSON, read by the planner, scales its terms and adds the reserve
    sys.path.insert(0, str(ROOT / "scripts/repro"))
    import plan_memory_fit as fitmod

    _, cal = fitmod.fit(_synthetic(1.1)["records"])
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    m = resolve_model("llama3.1-8b")
    lay = ParallelLayout(dp=8, tp=2)
    setup = TrainSetup(seq_len=8192, global_batch_tokens=8192 * 8, zero=3, activation_layout="bsh")
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "none.json")
    base = train_memory(m, lay, setup)
    monkeypatch.setattr(memory_mod, "MEMORY_CALIBRATION_PATH", tmp_path / "cal.json")
    got = train_memory(m, lay, setup)
    assert got.activations == pytest.approx(1.1 * base.activations)
    dyn = 1.1 * base.activations + base.logits + 1.25 * base.transient  # the reserve is a fraction of these
    assert got.transient == pytest.approx(1.25 * base.transient + 0.1 * dyn, rel=1e-3)


def test_serving_explain_carries_the_practice_comparison(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phase6.cli import app

    args = ["plan", "model=llama3.1-70b", "hardware=h100_sxm", "gpus=8", "workload=serve"]
    r = CliRunner().invoke(app, [*args, f"run.dir={tmp_path / 'run'}", "--explain"])
    assert r.exit_code == 0, r.output
    out = r.stdout.split("## Practice layout beside the #1")[1]
    assert "practice: dp2·tp4" in out and "#1:       dp1·tp8" in out
    assert "deciding term: decode HBM reads" in out and MEASURED in out


def test_every_fitted_constant_is_named_by_the_rows_it_came_from() -> None:
    from phase6.plan import train as train_mod
    from phase6.plan.validate import load_cases, source_label

    cases = load_cases()
    named = {c for case in cases for c in case.fits}
    assert named == {"HBM_EFFICIENCY"}
    assert all(f"FITS {', '.join(c.fits)}" in source_label(c) for c in cases if c.fits)
    # no constant is fitted on a held-out row (CP_RING_STEP_EFFICIENCY was, until issue 30's fifth round; since the
    # seventh it is measured on one H200, scripts/repro/plan_layout_compute.py --fit)
    assert not [c.id for c in cases if c.held_out and c.fits]
    assert TERM_STATUS["ring attention (CP)"][0] == MEASURED
    assert [e for _, e in train_mod.CP_RING_STEP_EFFICIENCY_CURVE] == [0.71, 0.903, 0.953, 0.935]


@pytest.mark.slow  # ~10 s alone, ~60 s on a loaded 2-core box
def test_h200_memory_script_runs_every_case_path_in_smoke_mode(tmp_path: Path) -> None:
    # CPU logic check of the GPU script (tiny shapes): every AC mode, every TP width, with and without ZeRO-3
    script = ROOT / "scripts/repro/h200_plan_memory.py"
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path), "--seq", "128", "--layers", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "plan_memory.json").read_text())
    assert len(data["records"]) == 24 and all(r["status"] == "ok" for r in data["records"]), data["records"]
    assert {(r["ac"], r["zero3"]) for r in data["records"]} == {
        (a, z) for a in ("none", "selective", "full") for z in (False, True)
    }
    assert out.stdout.strip().splitlines()[-1].startswith("| tiny | 8 | full | yes |")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan_memory.json", "plan_memory.md"]


def test_micro_batch_is_searched_over_the_replica_share_unless_fixed() -> None:
    from phase6.plan.recommend import micro_batches

    plan = PlanConfig(seq_len=8192, global_batch_tokens=4194304)  # 512 sequences per step
    assert plan.micro_batch_size is None
    assert micro_batches(plan, ParallelLayout(dp=32, tp=8)) == [1, 2, 4, 8, 16]
    assert micro_batches(plan, ParallelLayout(dp=24, tp=8)) == [1]  # 512 / 24 is not whole: one sequence
    assert micro_batches(PlanConfig(seq_len=8192, global_batch_tokens=8192 * 96), ParallelLayout(dp=8)) == [
        1,
        2,
        4,
        12,
    ]
    assert micro_batches(PlanConfig(seq_len=8192, micro_batch_size=2), ParallelLayout(dp=32)) == [2]


def test_searched_micro_batch_prices_the_practice_layout_as_torchtitan_runs_it() -> None:
    """70B on 256 H100s at 8K, 4M tokens: FSDP32·TP8 with full AC, as torchtitan's published run (local batch 16).
    At one sequence per micro-batch ZeRO-3 gathers the parameters 16 times per step; searched, the replica's 16
    sequences run as one micro-batch, and the step is shorter by more than those gathers' exposure."""
    m = resolve_model("llama3.1-70b")
    searched, why = practice_layout(m, 256, PlanConfig(seq_len=8192, global_batch_tokens=4194304), PROFILE)
    one, _ = practice_layout(m, 256, PlanConfig(seq_len=8192, global_batch_tokens=4194304, micro_batch_size=1), PROFILE)
    assert searched is not None and one is not None
    assert searched.layout == one.layout == ParallelLayout(dp=32, tp=8) and searched.setup.ac_mode == "full"
    assert (searched.setup.micro_batch_size, searched.num_microbatches) == (16, 1), why
    assert "micro-batch 16 x 1" in why
    assert one.num_microbatches == 16
    assert searched.step_time_s < 0.8 * one.step_time_s  # 20.6 s against 28.9 s (docs/cost_model.md §6)
    # the recommender's search holds the fixed micro-batch among its candidates, so it is never slower
    fixed = recommend_train(m, 256, PlanConfig(seq_len=8192, global_batch_tokens=4194304, micro_batch_size=1), PROFILE)
    free = recommend_train(m, 256, PlanConfig(seq_len=8192, global_batch_tokens=4194304), PROFILE)
    assert min(c.time_value for c in free.candidates) <= min(c.time_value for c in fixed.candidates) + 1e-9
    assert all("micro_batch_size" in c.extra for c in free.candidates)


@pytest.mark.slow  # ~20 s alone (three cases, each in its own process)
def test_h200_layout_compute_script_runs_its_case_paths_in_smoke_mode(tmp_path: Path) -> None:
    # CPU logic check of the GPU script: torch's TP plan over a fake process group, AC none / full / selective, every
    # case in its own process (a second fake group in one process fails to resolve its name)
    script = ROOT / "scripts/repro/h200_layout_compute.py"
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path), "--iters", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "layout_compute.json").read_text())
    assert [(r["ac"], r["status"]) for r in data["records"]] == [("none", "ok"), ("full", "ok"), ("selective", "ok")]
    assert all(r["step_s"] > 0 and r["rank_params"] > 0 for r in data["records"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layout_compute.json", "layout_compute.md"]


def test_ring_step_efficiency_curve_is_the_fit_of_the_committed_h200_measurement() -> None:
    # the curve in train.py is what scripts/repro/plan_layout_compute.py fits on the committed H200 runs (torch's
    # ring on one rank over a fake process group against TP of the same degree), to the printed 3 decimals
    sys.path.insert(0, str(ROOT / "scripts/repro"))
    try:
        from plan_layout_compute import fit_ring_efficiency_curve, ring_ratios
    finally:
        sys.path.pop(0)
    from phase6.plan import train as train_mod

    runs = sorted((ROOT / "docs/results/i30_layout_compute_2026-12-02").glob("run*.json"))
    ratios = [r for p in runs for r in ring_ratios(json.loads(p.read_text())["records"])]
    assert len(ratios) == 13 and {r["cp"] for r in ratios} == {2, 4, 8}
    curve, residuals = fit_ring_efficiency_curve(ratios)
    assert curve == train_mod.CP_RING_STEP_EFFICIENCY_CURVE
    assert max(abs(e) for e in residuals) < 0.04  # the curve prices every measured CP layout within 4%
    assert all(r["ratio"] > 1.0 for r in ratios)  # ring attention measured dearer than one causal call
    assert max(ratios, key=lambda r: r["ratio"])["half"] == 512  # and dearest at the shortest half chunks
