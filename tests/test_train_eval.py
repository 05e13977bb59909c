"""`phase6 eval` (projects/6a_pretrain/eval.py): lm-eval on a 6A HF export with a local task, and its val loss on
our shards equal to the loss our own model computes on the same windows (fp32, 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phase6.config import LoggerConfig, RunConfig, load_object
from phase6.config.data import DataConfig
from phase6.config.pretrain import EvalRunConfig, ModelConfig
from phase6.data.loader import ValLoader
from phase6.data.prepare import prepare_shards
from phase6.data.shards import load_manifest
from phase6.evals.battery import LocalTask
from phase6.launch import ConfigError, load_config
from phase6.models.gpt2 import GPT
from phase6.models.hf import export_hf, hf_tokenizer

EVAL = load_object("projects/6a_pretrain/eval.py:main")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, GPT]:
    """BPE shards of CPython's docs, and a tiny GPT exported with that tokenizer."""
    root = tmp_path_factory.mktemp("eval")
    data = DataConfig(
        out_dir=str(root / "data"),
        tokenizer="bpe",
        bpe_vocab_size=300,
        bpe_train_docs=200,
        shard_tokens=8_000,
        num_val_tokens=2_048,
        max_tokens=20_000,
        num_workers=0,
    )
    prepare_shards(data, show_progress=False)
    info = load_manifest(data.out_dir).tokenizer
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=info.vocab_size)).eval()
    tok = hf_tokenizer("bpe", bpe_file=Path(data.out_dir) / info.file)
    return export_hf(model, root / "hf", tok), Path(data.out_dir), model


def test_eval_local_task_and_val_loss(tmp_path: Path, exported: tuple[Path, Path, GPT]) -> None:
    hf_dir, data_dir, model = exported
    rows = [
        {"question": f"What is {a} plus {a}?", "choices": [str(2 * a), str(2 * a + 1), "blue"], "answer": 0}
        for a in range(1, 6)
    ]
    task_file = tmp_path / "arith.jsonl"
    task_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = EvalRunConfig(
        run=RunConfig(dir=str(tmp_path / "run"), name="eval"),
        logger=LoggerConfig(wandb=False, console=False),
        model=str(hf_dir),
        tasks=[],
        local_tasks=[LocalTask(name="arith_local", path=str(task_file))],
        batch_size=4,
        device="cpu",
        val_data=str(data_dir),
        val_tokens=1024,
        val_seq_len=64,
        val_batch_size=4,
    )
    out = EVAL(cfg)
    by_task = {r["task"]: r for r in out["rows"]}
    score = by_task["arith_local"]
    assert score["metric"] == "acc" and score["n"] == 5 and 0.0 <= score["score (pts)"] <= 100.0
    with torch.no_grad():
        ours = [model(x, y).item() for x, y in ValLoader(data_dir, 4, 64, 1024)]
    assert abs(out["measured"]["val/loss"] - sum(ours) / len(ours)) < 1e-5
    md = (Path(out["run_dir"]) / "results.md").read_text()
    assert "arith_local" in md and "3.2924" in md


def test_eval_refuses_data_the_model_cannot_read(tmp_path: Path, exported: tuple[Path, Path, GPT]) -> None:
    hf_dir, data_dir, _ = exported
    small = export_hf(GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=257)), tmp_path / "hf")
    cfg = EvalRunConfig(
        model=str(small),
        tasks=[],
        val_data=str(data_dir),
        val_tokens=256,
        val_seq_len=64,
        device="cpu",
        logger=LoggerConfig(wandb=False, console=False),
        run=RunConfig(dir=str(tmp_path / "run")),
    )
    with pytest.raises(ValueError, match="301-token vocabulary, model .* has 257"):
        EVAL(cfg)
    cfg.model, cfg.val_seq_len = str(hf_dir), 65
    with pytest.raises(ValueError, match="val_seq_len: 65 exceeds the model's context 64"):
        EVAL(cfg)


def test_eval_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="tasks: nothing to do"):
        load_config("eval", ["tasks=[]"])
    with pytest.raises(ConfigError, match="dtype"):
        load_config("eval", ["dtype=fp8"])
