"""projects/6a_pretrain/train.py end to end on CPU (tiny GPT-2, fp32, byte shards of CPython's docs).

Smoke run directory, exact resume, NaN stop, overfit-one-batch, and 2-process gloo DDP / FSDP2 under torchrun
against one process at the same global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from phase6 import metrics
from phase6.checkpoint import list_checkpoints
from phase6.config import CONFIG_DIR, HardwareConfig, LoggerConfig, RunConfig, load_object
from phase6.config.data import DataConfig
from phase6.config.pretrain import ModelConfig, OptimConfig, PredictConfig, PretrainRunConfig, TrainConfig
from phase6.data.prepare import prepare_shards
from phase6.models.gpt2 import GPT
from phase6.runrecord import read_metrics, read_results

REPO = CONFIG_DIR.parent
TRAIN = load_object("projects/6a_pretrain/train.py:main")
LOSS_TOL = 1e-5  # DDP/FSDP2 vs one process: same math, different reduction order (fp32)
MUON_LOSS_TOL = 1e-4  # the same with Muon, whose bf16 Newton-Schulz can round the two runs' gradients differently


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("bytes")
    cfg = DataConfig(out_dir=str(out), shard_tokens=20_000, num_val_tokens=4_096, max_tokens=64_000, num_workers=0)
    prepare_shards(cfg, show_progress=False)
    return str(out)


def make_cfg(run_dir: Path, data_dir: str, **train: Any) -> PretrainRunConfig:
    tc = dict(
        micro_batch_size=4,
        seq_len=32,
        global_batch_tokens=256,
        max_steps=8,
        val_every=4,
        val_tokens=256,
        ckpt_every=4,
        export_hf=False,
    )
    tc.update(train)
    return PretrainRunConfig(
        run=RunConfig(dir=str(run_dir), name="t", seed=7),
        logger=LoggerConfig(wandb=False, console=False),
        hardware=HardwareConfig(),
        data=DataConfig(out_dir=data_dir),
        model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=257),
        optim=OptimConfig(lr=3e-3, warmup_steps=2),
        train=TrainConfig(**tc),  # type: ignore[arg-type]
        device="cpu",
        predict=PredictConfig(scaling_presets=[]),
    )


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r[metrics.LOSS] for r in read_metrics(run_dir) if metrics.LOSS in r}


def test_smoke_run_directory(tmp_path: Path, data_dir: str) -> None:
    cfg = make_cfg(tmp_path / "run", data_dir, export_hf=True)
    cfg.predict = PredictConfig(scaling_presets=["gpt2_124m"])
    cfg.optim.justify = {"beta2": "0.95: GPT-3 paper sec. B"}
    out = TRAIN(cfg)
    run = Path(out["run_dir"])
    assert (run / "plots" / "loss_curve.png").stat().st_size > 10_000
    res = read_results(run)
    for key in (metrics.TOKENS_PER_S, metrics.MFU_PCT, metrics.MEM_MAX_ALLOCATED_GIB, metrics.COST_GPU_HOURS):
        assert isinstance(res["predicted"][key], float) and res["predicted"][key] > 0, key
    assert res["measured"][metrics.TOKENS_PER_S] > 0 and res["measured"][metrics.VAL_LOSS] > 0
    assert res["measured"]["params"] == res["predicted"]["params"]  # planner and model count the same N
    assert "6N + 12*L*H*Q*T" in res["predicted"]["formulas"]["flops"]
    assert json.loads((run / "predicted.json").read_text())["predicted"][metrics.TOKENS_PER_S] > 0
    rows = read_metrics(run)
    keys = set().union(*rows)
    for key in (
        metrics.LOSS,
        metrics.VAL_LOSS,
        metrics.LR,
        metrics.GRAD_NORM,
        metrics.TOKENS_PER_S,
        metrics.MFU_PCT,
        metrics.STEP_TIME_S,
    ):
        assert key in keys, key
    val = [r[metrics.VAL_LOSS] for r in rows if metrics.VAL_LOSS in r]
    assert len(val) == 3 and val[-1] < val[0]  # steps 0, 4, 8: the val loss falls
    md = (run / "results.md").read_text()
    for text in (
        "Predicted vs measured",
        "Hyperparameters",
        "optim.beta2",
        "Batch and LR schedule",
        "grad_accum_steps",
        "loss_curve.png",
        "Cost",
        "gpt2_124m",
    ):
        assert text in md, text
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000004.pt", "step_00000008.pt"]
    # the HF export scores the val shard like the trainer did (same tokens, fp32)
    from transformers import AutoModelForCausalLM

    from phase6.data.loader import ValLoader

    hf = AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    with torch.no_grad():
        hf_val = sum(
            torch.nn.functional.cross_entropy(hf(input_ids=x).logits.flatten(0, 1), y.flatten()).item()
            for x, y in ValLoader(data_dir, 4, 32, 256)
        )
    assert abs(hf_val / 2 - val[-1]) < 1e-5


def with_optim(cfg: PretrainRunConfig, algorithm: str) -> PretrainRunConfig:
    cfg.optim = OptimConfig(lr=3e-3, warmup_steps=2, algorithm=algorithm)
    return cfg


@pytest.mark.parametrize(  # muon: Muon's momentum buffers + AdamW's moments (30 s on the loaded box: slow)
    "algorithm", ["adamw", pytest.param("muon", marks=pytest.mark.slow)]
)
def test_exact_resume(tmp_path: Path, data_dir: str, algorithm: str) -> None:
    full = tmp_path / "full"
    TRAIN(with_optim(make_cfg(full, data_dir), algorithm))  # uninterrupted 8 steps; checkpoint at 4 written mid-run
    ref = losses(full)
    resumed = tmp_path / "resumed"
    cfg = make_cfg(resumed, data_dir, resume=str(full / "checkpoints" / "step_00000004.pt"))
    TRAIN(with_optim(cfg, algorithm))
    got = losses(resumed)
    assert sorted(got) == [5, 6, 7, 8]
    assert [got[s] for s in range(5, 9)] == [ref[s] for s in range(5, 9)]  # bit-identical, not just close


@pytest.mark.slow  # 42 s on the loaded 2-core box
def test_resume_auto_continues_in_the_same_run_dir(tmp_path: Path, data_dir: str) -> None:
    run = tmp_path / "run"
    TRAIN(make_cfg(run, data_dir, dry_run_steps=4))  # "killed" after step 4 (its checkpoint)
    TRAIN(make_cfg(run, data_dir, resume="auto"))
    rows = read_metrics(run)
    assert [r["step"] for r in rows if metrics.LOSS in r] == list(range(1, 9))
    ref = tmp_path / "ref"
    TRAIN(make_cfg(ref, data_dir))
    assert losses(run) == losses(ref)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(
    tmp_path: Path, data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        out = real_forward(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 5 * 1:  # 1 micro-step per step: steps 1-5 fine, step 6 diverges
                return out * float("nan")
        return out

    monkeypatch.setattr(GPT, "forward", poisoned)
    run = tmp_path / "run"
    with pytest.raises(FloatingPointError, match=r"step 6: loss nan.*Last good checkpoint: .*step_00000004\.pt"):
        TRAIN(make_cfg(run, data_dir, global_batch_tokens=128))
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000004.pt"]
    assert max(losses(run)) == 5  # nothing logged for the diverged step


@pytest.mark.slow  # 150 steps: 221 s on the loaded 2-core box
def test_overfit_one_batch(tmp_path: Path, data_dir: str) -> None:
    cfg = make_cfg(tmp_path / "run", data_dir, sanity="overfit_batch", max_steps=150, val_every=0, ckpt_every=0)
    cfg.optim = OptimConfig(lr=1e-2, warmup_steps=10, grad_clip=1.0, weight_decay=0.0)
    out = TRAIN(cfg)
    assert out["summary"]["final_loss"] < 0.1
    assert "PASS" in (Path(out["run_dir"]) / "results.md").read_text()


def test_grad_accumulation_equals_one_big_batch(tmp_path: Path, data_dir: str) -> None:
    """B=4 x 2 micro-steps == B=8 x 1: the accumulated gradient is the mean over the same 256 tokens."""
    a, b = tmp_path / "accum", tmp_path / "big"
    TRAIN(make_cfg(a, data_dir, micro_batch_size=4, max_steps=4, ckpt_every=0, val_every=0))
    TRAIN(make_cfg(b, data_dir, micro_batch_size=8, max_steps=4, ckpt_every=0, val_every=0))
    la, lb = losses(a), losses(b)
    assert all(abs(la[s] - lb[s]) < LOSS_TOL for s in la), (la, lb)


# --- 2 processes (torchrun, gloo) vs 1 process at the same global batch ----------------------------------------


def torchrun(run_dir: Path, data_dir: str, mode: str, *extra: str) -> subprocess.CompletedProcess[str]:
    overrides = [
        "experiment=smoke",
        f"run.dir={run_dir}",
        "run.seed=7",
        "logger.console=false",
        f"data.out_dir={data_dir}",
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "optim.lr=3e-3",
        "optim.warmup_steps=2",
        "optim.warmup_frac=null",
        "train.micro_batch_size=2",
        "train.seq_len=32",
        "train.global_batch_tokens=256",
        "train.max_steps=4",
        "train.val_every=4",
        "train.val_tokens=256",
        "train.ckpt_every=2",
        "train.export_hf=false",
        "predict.scaling_presets=[]",
        f"parallel.mode={mode}",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "phase6",
        "pretrain",
        *overrides,
    ]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def both_ends(stderr: str) -> str:
    """A failed torchrun's stderr: the ranks' own first lines (where a rank says why it died) and torchrun's
    summary at the end."""
    return stderr if len(stderr) <= 6000 else stderr[:3000] + "\n[...]\n" + stderr[-3000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory, data_dir: str) -> dict[int, float]:
    run = tmp_path_factory.mktemp("one")
    TRAIN(make_cfg(run, data_dir, micro_batch_size=4, max_steps=4, ckpt_every=2))  # 2 micro-steps of 4 x 32
    return losses(run)


@pytest.mark.slow  # torchrun, 2 processes: 34-37 s each on the loaded 2-core box
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_process_gloo_matches_one_process(tmp_path: Path, data_dir: str, one_process: dict, mode: str) -> None:
    run = tmp_path / mode
    proc = torchrun(run, data_dir, mode)
    assert proc.returncode == 0, both_ends(proc.stderr)
    got = losses(run)
    assert sorted(got) == [1, 2, 3, 4]
    assert all(abs(got[s] - one_process[s]) < LOSS_TOL for s in got), (got, one_process)
    assert read_results(run)["rows"][0]["gpus"] == 2
    ckpt = torch.load(run / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert ckpt["world_size"] == 2 and ckpt["model"]["transformer.wte.weight"].shape == (320, 32)  # full, unsharded


@pytest.mark.slow  # torchrun, 2 processes: 44 s on the loaded 2-core box
def test_two_process_gloo_ddp_with_muon_matches_one_process(tmp_path: Path, data_dir: str) -> None:
    """Muon under DDP: every rank orthogonalizes the same all-reduced gradients, so the ranks stay identical and
    match one process (Newton-Schulz runs in bf16, hence the looser tolerance)."""
    one = tmp_path / "one"
    TRAIN(with_optim(make_cfg(one, data_dir, micro_batch_size=4, max_steps=4, ckpt_every=2), "muon"))
    ref = losses(one)
    run = tmp_path / "ddp"
    proc = torchrun(run, data_dir, "ddp", "optim.algorithm=muon")
    assert proc.returncode == 0, both_ends(proc.stderr)
    got = losses(run)
    assert sorted(got) == [1, 2, 3, 4]
    assert all(abs(got[s] - ref[s]) < MUON_LOSS_TOL for s in got), (got, ref)
    ckpt = torch.load(run / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert "momentum_buffer" in ckpt["optimizer"]["state"]["transformer.h.0.mlp.c_fc.weight"]
