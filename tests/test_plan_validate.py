"""`phase6 plan validate`: the planner against published training runs, with the error bounds of issue 21.

The bounds hold on the calibration cases of src/phase6/plan/published_runs.yaml; held-out cases (found while building
the table, no constant chosen from them) are reported separately and only guarded against regressions here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from phase6.cli import app
from phase6.plan.memory import ParallelLayout
from phase6.plan.recommend import TIE_TOLERANCE, order_layouts, simplicity
from phase6.plan.validate import CASES_PATH, load_cases, render, validate

runner = CliRunner()


@pytest.fixture(scope="module")
def results():  # noqa: ANN201
    return validate()


def test_table_has_the_issue_cases_with_sources(results) -> None:  # noqa: ANN001
    rows, _ = results
    ids = {r.case.id for r in rows if not r.case.held_out}
    issue = {
        "llmc-gpt2-124m-8xh100",
        "llmc-gpt2-1558m-8xh100",
        "torchtitan-llama3.1-8b-8xh100-fsdp",
        "torchtitan-llama3-8b-64xa100-fsdp",
        "torchtitan-llama3-70b-64xa100-fsdp",
        "megatron-gpt-70b-768xh100",
        "megatron-gpt-177b-2304xh100",
        "megatron-gpt-462b-6144xh100",
    }
    assert issue <= ids  # the eight runs of issue 21, plus this repo's own measured 6A run
    for r in rows:
        c = r.case
        assert c.source and c.date and c.approximated, c.id
        assert r.published_tps > 0 and r.predicted_tps > 0


def test_calibration_error_bounds(results) -> None:  # noqa: ANN001
    rows, summ = results
    cal = [r for r in rows if not r.case.held_out]
    errs = [abs(r.ratio - 1) for r in cal]
    assert statistics.mean(errs) <= 0.15, [(r.case.id, round(r.ratio, 3)) for r in cal]
    assert max(errs) <= 0.25, [(r.case.id, round(r.ratio, 3)) for r in cal]
    assert summ["calibration"]["mean_abs_error_pct"] <= 15.0


def test_published_layout_is_first_or_within_the_tie_tolerance(results) -> None:  # noqa: ANN001
    rows, _ = results
    for r in rows:  # calibration rows, nothing fixed: the planner's own choice
        if r.case.held_out:
            continue
        assert r.rank_free == 1 or r.within_tie_free, (r.case.id, r.rank_free, r.best_free)


def test_held_out_cases_are_reported_and_do_not_regress(results) -> None:  # noqa: ANN001
    rows, summ = results
    held = [r for r in rows if r.case.held_out]
    assert len(held) >= 4 and summ["held_out"]["cases"] == len(held)
    # Issue 30's targets (docs/cost_model.md §9): 22 rows, mean <= 12%, max <= 25%, the published layout first or tied
    # in >= 18 with NOTHING fixed (the planner's own choice), no row removed or moved. Not met on the choice: these
    # guard today's numbers against regressions. History (first or tied, nothing fixed): first pass 14; issue 21 13;
    # issue 30 first round 12, second round 10, third round 13 (torch's context_parallel priced as torchtitan runs
    # it, DP collectives per block / bucket, Megatron's two DP windows; mean 30.6% -> 17.3% -> 15.8% -> 9.76% ->
    # 9.63%, max 70.8% -> 22.7% -> 21.73%), fourth round 14 (FP8 training all-gathers TP activations in float8:
    # torchtitan 70B FSDP32·TP8 Float8 first; mean 9.63% -> 10.24%, the fp8 TP rows now predicted faster), fifth
    # round 16 (CP_RING_STEP_EFFICIENCY, fitted on the three held-out CP rows, replaced by the kernels' bound 1.0: the
    # three CP rows tie their TP alternative, the 2025 70B TP8 bf16 row falls behind TP4·CP2; mean 10.24% -> 11.21%),
    # seventh round 13 (the ring steps' efficiency measured on one H200 by half-chunk length, 0.71-0.95 of the unsplit
    # kernel's rate: the CP rows' errors fall (0.899/1.171/1.203 -> 0.876/1.121/1.141) and their TP alternatives lead
    # by 6-8%, past the tie; mean 11.21% -> 10.81%).
    errs = [abs(r.ratio - 1) for r in held]
    assert len(held) == 22
    free = sum(1 for r in held if r.rank_free == 1 or r.within_tie_free)
    assert free >= 13 and summ["held_out"]["first_or_tied_nothing_fixed"] == free
    assert statistics.mean(errs) <= 0.1081 and max(errs) <= 0.2174, [(r.case.id, round(r.ratio, 3)) for r in held]
    assert statistics.mean(errs) <= 0.12 and max(errs) <= 0.25  # issue 30's error targets
    # The AsyncTP rows: the predicted gain of async over vanilla TP stays near the published 1.09-1.10x (June 2025),
    # not the ~1.35x of hiding every TP collective.
    by_id = {r.case.id: r for r in held}
    for size in ("70b-256xh100", "8b-64xh100"):
        van = by_id[f"torchtitan-llama3.1-{size}-tp8-bf16-2025"]
        asy = by_id[f"torchtitan-llama3.1-{size}-tp8-bf16-asynctp-2025"]
        gain = asy.predicted_tps / van.predicted_tps
        assert 1.0 < gain < 1.2, (size, gain, asy.published_tps / van.published_tps)


def test_the_fixed_sizes_counts_are_diagnostics_printed_after_the_headline(results) -> None:  # noqa: ANN001
    rows, summ = results
    held = [r for r in rows if r.case.held_out]
    g = summ["held_out"]
    # narrowing the question can only help the published layout: fixed sizes >= DP-only >= nothing fixed
    assert g["diagnostic_first_or_tied_given_fixed_sizes"] >= g["diagnostic_first_or_tied_dp_fixed_only"]
    assert g["diagnostic_first_or_tied_dp_fixed_only"] >= g["first_or_tied_nothing_fixed"]
    assert g["diagnostic_first_or_tied_given_fixed_sizes"] == sum(1 for r in held if r.rank == 1 or r.within_tie)
    for r in held:  # a row without a fixed DP asks the free question when only DP is kept
        if "dp" not in r.case.fixed:
            assert (r.rank_dp_fixed, r.within_tie_dp_fixed) == (r.rank_free, r.within_tie_free), r.case.id
    text = render(rows, summ)
    head = text.index("held_out: first or tied (nothing fixed): ")
    assert head < text.index("diagnostic, given the sizes the published experiment fixed") < text.index("- held_out:")
    assert list(g)[:2] == ["cases", "first_or_tied_nothing_fixed"]


def test_tie_break_prefers_fewer_model_parallel_dims_then_smaller_pp() -> None:
    a = ParallelLayout(dp=8)  # 0 dims
    b = ParallelLayout(dp=4, tp=2)  # 1 dim
    c = ParallelLayout(dp=2, tp=2, pp=2)  # 2 dims
    d = ParallelLayout(dp=4, pp=2)  # 1 dim, pp 2
    times = {a: 1.03, b: 1.0, c: 0.99, d: 1.2}
    out = order_layouts(list(times), times.get, lambda x: x)
    assert out == [a, b, c, d]  # a, b, c within 5% of 0.99: simplest first; d outside the tolerance
    assert simplicity(b) < simplicity(ParallelLayout(dp=2, pp=4)) and TIE_TOLERANCE == 0.05
    assert order_layouts(list(times), times.get, lambda x: x, tol=0.0)[0] == c


def test_bad_case_file_is_one_line(tmp_path: Path) -> None:
    data = yaml.safe_load(CASES_PATH.read_text())
    data["cases"][0]["setup"]["micro_batchez"] = 2
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="unknown TrainSetup fields") as e:
        load_cases(p)
    assert "\n" not in str(e.value)


def test_cli_writes_the_run_dir_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "val"
    r = runner.invoke(app, ["plan", "validate", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert payload["summary"]["calibration"]["cases"] >= 8 and len(payload["rows"]) == len(load_cases())
    assert (out / "results.json").is_file() and "| megatron-gpt-462b-6144xh100 |" in (out / "results.md").read_text()
    again = runner.invoke(app, ["plan", "validate", "--out", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output


def test_cli_bad_cases_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "val"
    r = runner.invoke(app, ["plan", "validate", "--cases", str(tmp_path / "nope.yaml"), "--out", str(out)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "no such file" in lines[0]
    assert not out.exists()


def test_fixed_sizes_narrow_the_question_and_the_free_rank_is_kept(results) -> None:  # noqa: ANN001
    rows, _ = results
    for r in rows:
        if r.case.fixed:
            assert r.case.fixed_why, r.case.id
            assert all(getattr(r.best, k) == v for k, v in r.case.fixed.items()), (r.case.id, r.best)
        assert r.rank_free >= r.rank or r.within_tie  # fixing sizes never adds competitors
        assert r.best_free is not None
    meg = [r for r in rows if r.case.id.startswith("megatron-")]
    assert meg and all(r.case.fixed == {"dp": 48} for r in meg)  # the weak-scaling table's DP


def test_fixed_needs_its_reason_and_must_match_the_published_layout(tmp_path: Path) -> None:
    data = yaml.safe_load(CASES_PATH.read_text())
    case = next(c for c in data["cases"] if c["id"].startswith("megatron-gpt-16b"))
    case.pop("fixed_why")
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="fixed needs fixed_why") as e:
        load_cases(p)
    assert "\n" not in str(e.value)
    case["fixed_why"] = "test"
    case["fixed"] = {"dp": 96}
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="contradicts the published layout"):
        load_cases(p)
