"""Trainer parts: AdamW groups, LR schedules, grad accumulation arithmetic, atomic checkpoints, config checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from phase6.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, read_checkpoint, save_checkpoint
from phase6.config.pretrain import ModelConfig, OptimConfig, PretrainRunConfig, TrainConfig
from phase6.launch import ConfigError, load_config
from phase6.models.gpt2 import GPT
from phase6.optim import build_optimizer, build_scheduler, lr_factor, param_groups


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))


def take_step(model: GPT, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (2, 16), generator=g)
    loss = model(x, x.roll(-1, 1))
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    return loss.item()


def test_weight_decay_only_on_matrices() -> None:
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == model.num_params()  # tied wte once
    assert any(p is model.transformer.wte.weight for p in decay["params"])


def test_cosine_schedule_shape() -> None:
    f = lr_factor(OptimConfig(schedule="cosine", warmup_steps=10, min_lr_ratio=0.1), max_steps=110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55)  # halfway through the cosine: (1 + 0.1) / 2
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_warmdown_schedule_is_the_tuned_recipe() -> None:
    """modded-nanogpt #2: linear warmup 250, constant 1.8e-3, linear warmdown over the last 2000 steps to 0."""
    cfg = OptimConfig(lr=1.8e-3, schedule="warmdown", warmup_steps=250, warmdown_steps=2000, min_lr_ratio=0.0)
    f = lr_factor(cfg, max_steps=9536)
    assert f(0) == pytest.approx(1 / 250) and f(249) == pytest.approx(1.0)
    assert f(250) == 1.0 and f(7535) == 1.0
    assert f(7536) == pytest.approx(1 - 1 / 2000)
    assert f(8535) == pytest.approx(0.5) and f(9535) == pytest.approx(0.0)


def test_schedule_longer_than_the_run_is_an_error() -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig())
    with pytest.raises(ValueError, match=r"optim.warmdown_steps: warmup \+ warmdown \(50 \+ 60\) exceeds"):
        build_scheduler(opt, OptimConfig(schedule="warmdown", warmup_steps=50, warmdown_steps=60), max_steps=100)


def test_grad_accum_derived_and_divisibility_error() -> None:
    tc = TrainConfig(micro_batch_size=64, seq_len=1024, global_batch_tokens=524288)
    assert [tc.grad_accum_steps(w) for w in (1, 2, 8)] == [8, 4, 1]
    with pytest.raises(ValueError, match=r"train.global_batch_tokens.*64 \* 1024 \* 3"):
        tc.grad_accum_steps(3)


def test_checkpoint_round_trip_restores_training_exactly(tmp_path: Path) -> None:
    model = tiny_model()
    cfg = OptimConfig(warmup_steps=2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, max_steps=10)
    for s in range(3):
        take_step(model, opt, sched, s)
    path = save_checkpoint(tmp_path, 3, model, opt, sched, {"position": 42}, meta={"note": "x"})
    after = [take_step(model, opt, sched, s) for s in range(3, 6)]

    model2 = tiny_model(seed=99)  # different weights: everything must come from the file
    opt2 = build_optimizer(model2, cfg)
    sched2 = build_scheduler(opt2, cfg, max_steps=10)
    state = load_checkpoint(path, model2, opt2, sched2)
    assert state == {"step": 3, "data": {"position": 42}, "meta": {"note": "x"}}
    resumed = [take_step(model2, opt2, sched2, s) for s in range(3, 6)]
    assert resumed == after  # bit-identical losses
    assert sched2.last_epoch == 6


def test_rng_state_is_restored(tmp_path: Path) -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), max_steps=50)
    torch.manual_seed(5)
    path = save_checkpoint(tmp_path, 1, model, opt, sched, {})
    expected = torch.rand(4)
    torch.manual_seed(1234)
    load_checkpoint(path, model, opt, sched)
    assert torch.equal(torch.rand(4), expected)


def test_crash_during_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), max_steps=50)
    good = save_checkpoint(tmp_path, 10, model, opt, sched, {"position": 1})
    real_save = torch.save

    def crash_midway(obj: object, f: object, *a: object, **k: object) -> None:
        real_save({"partial": torch.zeros(10)}, f)  # some bytes hit the disk, then the process "dies"
        raise KeyboardInterrupt("killed during checkpoint save")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 20, model, opt, sched, {"position": 2})
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == good  # the half-written file is a .tmp, never a checkpoint name
    assert read_checkpoint(good)["data"] == [{"position": 1}]
    fresh = tiny_model(1)
    fresh_opt = build_optimizer(fresh, OptimConfig())
    assert load_checkpoint(good, fresh, fresh_opt, build_scheduler(fresh_opt, OptimConfig(), 50))["step"] == 10


def test_keep_prunes_oldest_and_bad_files_fail_clearly(tmp_path: Path) -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), max_steps=50)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, sched, {}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002.pt", "step_00000003.pt"]
    bad = tmp_path / "step_00000009.pt"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="step_00000009.pt: not a readable checkpoint"):
        read_checkpoint(bad)
    with pytest.raises(ValueError, match="checkpoint file not found"):
        read_checkpoint(tmp_path / "missing.pt")


def test_every_shipped_recipe_justifies_the_key_hyperparameters() -> None:
    """The results.md table is read from the configs: the values a user must defend always carry a reason."""
    must = {
        "optim.lr",
        "optim.beta2",
        "optim.weight_decay",
        "optim.grad_clip",
        "optim.schedule",
        "train.global_batch_tokens",
        "train.dtype",
        "train.max_steps",
    }
    for exp in ("gpt2_124m_fineweb_edu", "gpt2_124m_fineweb", "gpt2_1.3b_fsdp2"):
        cfg: PretrainRunConfig = load_config("pretrain", [f"experiment={exp}"])
        rows = {r["hyperparameter"]: r for r in cfg.hyperparameter_rows()}
        assert must <= set(rows), (exp, must - set(rows))
        assert {"optim.warmup_steps", "optim.warmup_frac"} & set(rows), exp  # the warmup, in steps or as a fraction
        assert all(len(r["why (source)"]) > 20 for r in rows.values()), exp
    cfg = load_config("pretrain", ["experiment=gpt2_124m_fineweb_edu"])
    rows = {r["hyperparameter"]: r["value"] for r in cfg.hyperparameter_rows()}
    assert rows["optim.lr"] == 1.8e-3 and rows["optim.beta2"] == 0.95 and rows["optim.warmup_steps"] == 250


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.justify.lrr=typo", "optim.justify"),
        ("model.n_head=5", "model.n_embd"),
        ("train.seq_len=4096", "train.seq_len"),
        ("optim.schedule=linear", "optim.schedule"),
        ("parallel.mode=zero3", "parallel.mode"),
        ("predict.scaling_presets=[gpt2_9b]", "predict.scaling_presets"),
        ("optim.warmup_steps=20", "optim.warmup_steps"),  # the tiny recipe's warmup is a fraction: not both
        ("optim.warmup_frac=-0.1", "optim.warmup_frac"),
    ],
)
def test_bad_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("pretrain", [override])
