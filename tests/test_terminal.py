"""What a job prints at its end fits the terminal (phase6.terminal), and no command logs torchao's import notices."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phase6.terminal import format_rows

SRC = Path(__file__).resolve().parents[1] / "src"

PRETRAIN_ROW = {
    "model": "gpt2_tiny",
    "params": 128832,
    "data": "embedded",
    "gpus": 1,
    "parallel": "ddp",
    "steps": 60,
    "tokens": 491520,
    "final_loss": 3.4131,
    "val_loss": 3.2203,
    "tokens_per_s": 1710.2,
    "mfu_pct": 0.7841,
    "run_dir": "outputs/pretrain/20261201-153440_smoke",
}


def test_one_row_is_key_value_lines() -> None:
    text = format_rows([PRETRAIN_ROW], "pretrain results", width=80)
    lines = text.splitlines()
    assert lines[0] == "pretrain results" and len(lines) == 1 + len(PRETRAIN_ROW)
    assert "final_loss:   3.413" in lines and "run_dir:      outputs/pretrain/20261201-153440_smoke" in lines
    assert "…" not in text


def test_a_narrow_table_prints_as_is() -> None:
    rows = [{"split": "val", "shards": 1}, {"split": "train", "shards": 5}]
    assert format_rows(rows, width=80).splitlines() == ["split  shards", "-----  ------", "val    1", "train  5"]


@pytest.mark.parametrize("with_path", [False, True])
def test_a_wide_table_fits_80_columns_and_keeps_every_value(with_path: bool) -> None:
    """Short cells: transposed (one line per key, one column per row); with a long path in every row even that is too
    wide, so column blocks that each repeat the first column. Either way no line is over 80 and every key and value
    appears in full."""
    base = PRETRAIN_ROW if with_path else {k: v for k, v in PRETRAIN_ROW.items() if k != "run_dir"}
    rows = [{**base, "steps": 100 * (i + 1), "val_loss": 3.0 + i / 7} for i in range(3)]
    text = format_rows(rows, width=80)
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert all(k in text for k in base) and "…" not in text
    assert all(f"{r['val_loss']:.4g}" in text and str(r["steps"]) in text for r in rows)
    if not with_path:
        assert any(ln.startswith("final_loss") for ln in text.splitlines())  # transposed: keys down the side
    else:
        blocks = text.split("\n\n")
        # the rows differ first in column 6 (too wide to repeat): each block names its rows by number
        assert len(blocks) > 1 and all(b.startswith("#  ") for b in blocks)
        assert text.count(PRETRAIN_ROW["run_dir"]) == 3


def test_a_transposed_table_is_headed_by_the_row_names() -> None:
    path = "/work/phase6/outputs/pretrain/20261201-160640_smoke"
    rows = [
        {"job": "pretrain", "status": "ok", "seconds": 912, "run dir": path},
        {"job": "serve_bench", "status": "FAILED (2)", "seconds": 12, "run dir": ""},
    ]
    lines = format_rows(rows, width=80).splitlines()
    assert lines[0].split() == ["job", "pretrain", "serve_bench"] and lines[1].startswith("---")
    assert lines[2].split() == ["status", "ok", "FAILED", "(2)"] and lines[4].split() == ["run", "dir", path]


def test_blocks_repeat_the_columns_that_tell_the_rows_apart() -> None:
    """A fleet sweep: no single column names a row (8 rows per policy), policy + router + rate do; every block
    repeats those three, so each line of each block still says which run it is."""
    rows = [
        {
            "policy": p,
            "router": r,
            "rate": rate,
            "ttft_p50_ms": 70.0 + i,
            "tpot_p50_ms": 15.5,
            "goodput_req_s": 1.98,
            "throughput_tok_s": 590.4,
            "prefix_hit_rate": 0.44,
            "usd_per_1m_output_tokens": 2.343,
        }
        for i, (p, r, rate) in enumerate(
            (p, r, x) for p in ("colocated", "pd:1:1") for r in ("rr", "prefix_aware") for x in (2, 8)
        )
    ]
    text = format_rows(rows, width=80)
    blocks = text.split("\n\n")
    assert len(blocks) > 1 and max(len(ln) for ln in text.splitlines()) <= 80
    for b in blocks:
        lines = b.splitlines()
        assert lines[0].split()[:3] == ["policy", "router", "rate"]
        assert [ln.split()[:3] for ln in lines[2:]] == [[r["policy"], r["router"], str(r["rate"])] for r in rows]


def test_a_long_last_column_wraps_at_spaces() -> None:
    reason = "16.4 GiB weights/GPU leave KV for 169 seqs x 8192 tok; decode at batch 16 = 15.32 ms/token, HBM-bound"
    rows = [{"#": i, "reason": reason} for i in (1, 2)]
    lines = format_rows(rows, width=60).splitlines()
    assert max(len(ln) for ln in lines) <= 60 and lines[0].split() == ["#", "reason"]
    assert lines[2].startswith("1  16.4 GiB") and lines[3].startswith("   ")  # continuation under its column
    assert " ".join(ln[3:].strip() for ln in lines[2:]).count(reason) == 2


def test_columns_env_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{**PRETRAIN_ROW, "steps": i} for i in range(3)]
    monkeypatch.setenv("COLUMNS", "200")
    assert len(format_rows(rows).splitlines()) == 2 + 3  # header, rule, 3 rows: fits 200 columns
    monkeypatch.setenv("COLUMNS", "80")
    assert max(len(ln) for ln in format_rows(rows).splitlines()) <= 80


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed: nothing to log")
def test_loading_a_model_class_logs_no_torchao_notices() -> None:
    """transformers imports torchao with every model class where it is installed; its import-time notices about
    kernels phase6 never uses are dropped (phase6/__init__.py), other warnings are not."""
    code = (
        "import logging, sys, phase6\n"
        "from transformers import LlamaForCausalLM\n"
        "assert 'torchao' in sys.modules\n"
        "logging.getLogger('torchao').warning('a real torchao warning')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    for notice in ("Failed to load", "Detected no triton", "Enum subclass"):
        assert notice not in out.stderr, out.stderr
    assert "a real torchao warning" in out.stderr
