"""`phase6 dpo experiment=smoke` end to end (CPU, offline, < 2 min) and a two-member β sweep with its summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from runrecord_checks import assert_run_files, assert_sections, read_jsonl, read_results, run_smoke, run_sweep

from phase6.launch import load_config


def test_smoke_experiment_is_the_tiny_cpu_run() -> None:
    """Fast check (the two end-to-end runs below are slow: make test-all): experiment=smoke resolves to the tiny CPU
    run they assert on: 16 steps with a margin probe of 16 pairs every 4 (margins.jsonl rows 0, 4, ..., 16), no
    lm-eval task beyond the local ones."""
    cfg = load_config("dpo", ["experiment=smoke"])
    assert (cfg.dpo.max_steps, cfg.dpo.eval_steps, cfg.diagnostics.probe_size) == (16, 4, 16)
    assert cfg.hardware.name == "cpu" and cfg.model.name == "tiny" and cfg.eval.tasks == []


@pytest.mark.slow  # the whole DPO smoke with its lm-eval battery: 148 s on the loaded 2-core box
def test_smoke_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    run_smoke("dpo", run_dir, "output.merge=true", timeout=300)
    assert_run_files(
        run_dir,
        "margins.jsonl",
        "plots/margins.png",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
    )
    assert (run_dir / "adapter" / "adapter_model.safetensors").stat().st_size < 5 * 2**20
    logged = {k for m in read_jsonl(run_dir / "metrics.jsonl") for k in m}
    assert {"loss", "val/loss", "rewards/margins", "rewards/accuracies", "eval_rewards/accuracies"} <= logged
    margins = read_jsonl(run_dir / "margins.jsonl")
    assert [m["step"] for m in margins] == [0, 4, 8, 12, 16]
    assert all(len(m["margin"]) == 16 for m in margins)  # diagnostics.probe_size per-pair values at every eval
    row = read_results(run_dir)["rows"][0]
    assert row["steps"] == 16 and row["loss"] == "sigmoid" and row["verdict"] in ("PASS", "FAIL", "INCOMPLETE")
    assert row["probe_margin_end"] > row["probe_margin_start"]
    assert "d_arith_mc_pts" in row
    # merged export == base + adapter (fp32 tiny model; tolerance 1e-4 on logits)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.arange(1, 40)[None]
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged").eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(run_dir / "base_model"), run_dir / "adapter"
    )
    base_logits = AutoModelForCausalLM.from_pretrained(run_dir / "base_model").eval()(ids).logits
    with torch.no_grad():
        a, m = adapted.eval()(ids).logits, merged(ids).logits
    assert torch.allclose(a, m, atol=1e-4)
    assert not torch.allclose(a, base_logits, atol=1e-3)  # the adapter did change the model
    assert_sections(
        run_dir,
        (
            "## Verdict",
            "## Regression battery",
            "## Generation length",
            "## Margin on the probe set",
            "## Data validation",
            "skipped: no judge endpoint configured",
            "![margins](plots/margins.png)",
        ),
    )


@pytest.mark.slow  # two DPO runs: 24-71 s on the loaded 2-core box
def test_beta_sweep_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    rows = run_sweep("dpo", sweep, "dpo.beta=0.05,0.3", "dpo.max_steps=4", "eval.enabled=false", timeout=180)
    assert sorted(r["beta"] for r in rows) == [0.05, 0.3]
    assert all(r["steps"] == 4 for r in rows)
    assert "| member |" in (sweep / "summary.md").read_text()
