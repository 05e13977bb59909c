"""`phase6 dpo experiment=smoke` end to end (CPU, offline, < 2 min) and a two-member β sweep with its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from phase6.config import CONFIG_DIR

REPO = CONFIG_DIR.parent


def phase6(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "phase6", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def test_smoke_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    proc = phase6("dpo", "experiment=smoke", "output.merge=true", f"run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir}"
    for f in (
        "config.yaml",
        "env.json",
        "metrics.jsonl",
        "results.json",
        "results.md",
        "margins.jsonl",
        "plots/margins.png",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
    ):
        assert (run_dir / f).is_file(), f
    assert (run_dir / "adapter" / "adapter_model.safetensors").stat().st_size < 5 * 2**20
    logged = {k for line in (run_dir / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert {"loss", "val/loss", "rewards/margins", "rewards/accuracies", "eval_rewards/accuracies"} <= logged
    margins = [json.loads(line) for line in (run_dir / "margins.jsonl").read_text().splitlines()]
    assert [m["step"] for m in margins] == [0, 4, 8, 12, 16]
    assert all(len(m["margin"]) == 16 for m in margins)  # diagnostics.probe_size per-pair values at every eval
    res = json.loads((run_dir / "results.json").read_text())
    row = res["rows"][0]
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
    md = (run_dir / "results.md").read_text()
    for section in (
        "## Verdict",
        "## Regression battery",
        "## Generation length",
        "## Margin on the probe set",
        "## Data validation",
        "skipped: no judge endpoint configured",
        "![margins](plots/margins.png)",
    ):
        assert section in md, section


def test_beta_sweep_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = phase6(
        "dpo",
        "-m",
        "experiment=smoke",
        "dpo.beta=0.05,0.3",
        "dpo.max_steps=4",
        "eval.enabled=false",
        f"run.dir={sweep}",
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((sweep / "summary.json").read_text())["rows"]
    assert sorted(r["beta"] for r in rows) == [0.05, 0.3]
    assert all(r["steps"] == 4 for r in rows)
    assert "| member |" in (sweep / "summary.md").read_text()
