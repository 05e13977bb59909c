"""`phase6 bench loss-parity`: the equal-loss verdict for numerics levers, on run directories written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from phase6.bench.loss_parity import compare, load_curve, main


def fake_run(root: Path, name: str, val: dict[int, float], seed: int = 0, **numerics: object) -> Path:
    d = root / name
    d.mkdir()
    model = {"name": "gpt2_124m", "float8": "none", "float8_lm_head": False, "residual_dtype": "fp32", **numerics}
    (d / "config.yaml").write_text(yaml.safe_dump({"job": "pretrain", "run": {"seed": seed}, "model": model}))
    rows = [{"step": s, "val/loss": v} for s, v in val.items()] + [{"step": 5, "loss": 9.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "results.json").write_text("{}")
    return d


def curves(tmp_path: Path, lever_final: float) -> list:
    runs = [
        fake_run(tmp_path, "s0", {0: 11.0, 10: 6.00, 20: 5.50}, seed=0),
        fake_run(tmp_path, "s1", {0: 11.0, 10: 6.01, 20: 5.51}, seed=1),
        fake_run(tmp_path, "s2", {0: 11.0, 10: 6.02, 20: 5.53}, seed=2),  # spread 0.03 > the 0.02 floor
        fake_run(tmp_path, "fp8", {0: 11.0, 10: 6.03, 20: lever_final}, float8="tensorwise"),
    ]
    return [load_curve(r) for r in runs]


def test_lever_within_the_seed_spread_passes(tmp_path: Path) -> None:
    rows = compare(curves(tmp_path, lever_final=5.54))  # default mean 5.5133: delta +0.0267 <= spread 0.03
    by = {r["numerics"]: r for r in rows}
    assert by["default"]["equal_loss"] == "reference" and by["default"]["runs"] == 3
    assert by["float8=tensorwise"]["delta_final"] == pytest.approx(0.0267, abs=1e-4)
    assert by["float8=tensorwise"]["tolerance"] == "0.0300 / 0.0300"
    assert by["float8=tensorwise"]["equal_loss"] == "yes"
    # paired with seed 0 (its default run): |6.03 - 6.00| at step 10, |5.54 - 5.50| = 0.04 at step 20
    assert by["float8=tensorwise"]["paired_max_abs_delta"] == pytest.approx(0.04)
    assert by["default"]["paired_max_abs_delta"] is None


def test_lever_outside_the_tolerance_fails(tmp_path: Path) -> None:
    rows = compare(curves(tmp_path, lever_final=5.56))  # delta +0.0467 > 0.03
    assert {r["numerics"]: r["equal_loss"] for r in rows}["float8=tensorwise"] == "NO"


def test_tolerance_floor_applies_when_seeds_agree_closely(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path, "s0", {0: 11.0, 10: 6.0}),
        fake_run(tmp_path, "b", {0: 11.0, 10: 6.015}, residual_dtype="bf16"),
    ]
    rows = compare([load_curve(r) for r in runs], tol=0.02)
    assert rows[1]["numerics"] == "residual_dtype=bf16" and rows[1]["equal_loss"] == "yes"
    assert compare([load_curve(r) for r in runs], tol=0.01)[1]["equal_loss"] == "NO"


def test_bad_inputs_name_the_problem(tmp_path: Path) -> None:
    a = fake_run(tmp_path, "a", {0: 11.0, 10: 6.0})
    b = fake_run(tmp_path, "b", {0: 11.0, 20: 6.0}, float8="rowwise")
    with pytest.raises(ValueError, match="different steps"):
        compare([load_curve(a), load_curve(b)])
    with pytest.raises(ValueError, match="no run with the default numerics"):
        compare([load_curve(b)])
    with pytest.raises(ValueError, match=r"config\.yaml: missing"):
        load_curve(tmp_path)
    c = fake_run(tmp_path, "c", {})
    with pytest.raises(ValueError, match=r"metrics\.jsonl: no val/loss rows"):
        load_curve(c)


def test_cli_prints_both_tables_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = [str(c.run_dir) for c in curves(tmp_path, lever_final=5.54)]
    main([*dirs, "--out", str(tmp_path / "parity.json")])
    out = capsys.readouterr().out
    assert "val loss per evaluation" in out and "| float8=tensorwise |" in out
    saved = json.loads((tmp_path / "parity.json").read_text())
    assert [r["equal_loss"] for r in saved["verdict"]] == ["reference", "yes"]
    assert saved["curves"][0]["step 20"] == 5.5


def test_cli_leaves_out_unfinished_runs_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A killed sweep member (val at step 0 only, no results.json) is named and left out; the others are judged."""
    dirs = [str(c.run_dir) for c in curves(tmp_path, lever_final=5.54)]
    killed = fake_run(tmp_path, "killed", {0: 11.0}, float8="rowwise")
    (killed / "results.json").unlink()
    main([*dirs, str(killed)])
    out = capsys.readouterr().out
    assert f"left out: {killed} (no results.json" in out and "float8=rowwise" not in out
    with pytest.raises(ValueError, match="no finished run"):
        main([str(killed)])
