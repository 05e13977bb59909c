"""optim.algorithm=muon: torch.optim.Muon on the hidden matrices + AdamW on the rest (issue 20).

The Muon step is checked against a reference written here from the published algorithm (Jordan 2024,
https://kellerjordan.github.io/posts/muon/): Nesterov momentum B = mu B + G, U = G + mu B; quintic Newton-Schulz
X <- a X + (b A + c A^2) X with A = X X^T, (a, b, c) = (3.4445, -4.7750, 2.0315), 5 steps, on the update scaled
to unit Frobenius norm (transposed when rows > cols); W <- W (1 - lr wd) - lr sqrt(max(1, rows/cols)) O. The
reference runs in float64; torch runs Newton-Schulz in bf16, hence the tolerance. Also: the parameter split,
both optimizers under one schedule, the checkpoint round trip of Muon's momentum buffers, config errors, and the
planner's Newton-Schulz FLOPs.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from test_train_components import take_step, tiny_model  # the same tiny GPT and optimizer step as AdamW's tests

from phase6.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from phase6.config.pretrain import ModelConfig, OptimConfig, ParallelConfig, PretrainRunConfig
from phase6.models.gpt2 import GPT
from phase6.optim import MuonAdamW, build_optimizer, build_scheduler, hidden_matrices

NS_COEFFS = (3.4445, -4.7750, 2.0315)
UPDATE_RTOL = 0.03  # ||dW_torch - dW_ref|| / ||dW_ref||: bf16 Newton-Schulz against float64 (measured 0.011-0.013)


def muon_cfg(**kw: object) -> OptimConfig:
    base = dict(algorithm="muon", lr=3e-3, muon_lr=0.02, muon_weight_decay=0.1, warmup_steps=0, weight_decay=0.0)
    base.update(kw)
    return OptimConfig(**base)  # type: ignore[arg-type]


def newton_schulz_ref(u: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    x = u.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / max(x.norm().item(), eps)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def muon_ref_updates(
    w0: torch.Tensor, grads: list[torch.Tensor], lr: float, wd: float, mu: float = 0.95, nesterov: bool = True
) -> torch.Tensor:
    """The published Muon algorithm applied to w0 for each gradient in turn (float64)."""
    w, buf = w0.double().clone(), torch.zeros_like(w0, dtype=torch.float64)
    rows, cols = w.shape
    for g in grads:
        g = g.double()
        buf = mu * buf + g
        u = g + mu * buf if nesterov else buf
        w = w * (1 - lr * wd) - lr * math.sqrt(max(1.0, rows / cols)) * newton_schulz_ref(u)
    return w


def fixed_grads(model: GPT, steps: int, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(p.shape, generator=g) * 0.01 for n, p in model.named_parameters()} for _ in range(steps)]


def test_param_split_is_hidden_matrices_vs_the_rest() -> None:
    model = tiny_model()
    opt = build_optimizer(model, muon_cfg())
    assert isinstance(opt, MuonAdamW) and isinstance(opt.muon, torch.optim.Muon)
    muon_ids = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adamw_ids = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[i].split(".", 3)[-1] for i in muon_ids) == sorted(
        ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"] * 2
    )
    assert not muon_ids & adamw_ids and muon_ids | adamw_ids == set(names)  # every parameter, once (tied wte once)
    assert id(model.transformer.wte.weight) in adamw_ids and id(model.lm_head.weight) in adamw_ids
    assert id(model.transformer.wpe.weight) in adamw_ids
    assert [p.dim() for p in hidden_matrices(model)] == [2] * 8


def test_muon_step_matches_the_published_algorithm() -> None:
    model = tiny_model()
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = muon_cfg()
    opt = build_optimizer(model, cfg)
    grads = fixed_grads(model, steps=3)
    for step_grads in grads:
        for n, p in model.named_parameters():
            p.grad = step_grads[n].clone()
        opt.step()
        opt.zero_grad()
    hidden = {id(p) for p in hidden_matrices(model)}
    checked = 0
    for n, p in model.named_parameters():
        if id(p) not in hidden:
            continue
        ref = muon_ref_updates(w0[n], [g[n] for g in grads], cfg.muon_lr, cfg.muon_weight_decay)
        wrong = muon_ref_updates(w0[n], [g[n] for g in grads], cfg.muon_lr, cfg.muon_weight_decay, nesterov=False)
        d_ref, d_got, d_wrong = ref - w0[n].double(), p.detach().double() - w0[n].double(), wrong - w0[n].double()
        err = ((d_got - d_ref).norm() / d_ref.norm()).item()
        assert err < UPDATE_RTOL, (n, err)
        # the tolerance separates the algorithm from a near miss (plain instead of Nesterov momentum)
        assert ((d_wrong - d_ref).norm() / d_ref.norm()).item() > 5 * UPDATE_RTOL, n
        checked += 1
    assert checked == 8


def test_adamw_group_is_plain_adamw() -> None:
    model, twin = tiny_model(), tiny_model()
    cfg = muon_cfg(weight_decay=0.1)
    opt = build_optimizer(model, cfg)
    hidden = {id(p) for p in hidden_matrices(model)}
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in hidden]
    twin_params = dict(twin.named_parameters())
    ref = torch.optim.AdamW(
        [
            {"params": [twin_params[n] for n, p in rest if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [twin_params[n] for n, p in rest if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=True,
    )
    for step_grads in fixed_grads(model, steps=2):
        for n, p in model.named_parameters():
            p.grad = step_grads[n].clone()
        for n, p in twin.named_parameters():
            p.grad = step_grads[n].clone()
        opt.step()
        ref.step()
    for n, p in rest:
        assert torch.equal(p, twin_params[n]), n


def test_one_schedule_scales_both_peak_lrs() -> None:
    model = tiny_model()
    cfg = muon_cfg(schedule="warmdown", warmup_steps=2, warmdown_steps=2, muon_lr=0.04, lr=2e-3, min_lr_ratio=0.0)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, max_steps=6)
    seen = []
    for _ in range(6):
        seen.append((opt.muon.param_groups[0]["lr"], opt.adamw.param_groups[0]["lr"], opt.adamw.param_groups[1]["lr"]))
        opt.step()
        sched.step()
    factors = [0.5, 1.0, 1.0, 1.0, 0.5, 0.0]
    for (m, a, a1), f in zip(seen, factors, strict=True):
        assert m == pytest.approx(0.04 * f) and a == pytest.approx(2e-3 * f) and a1 == a


def test_checkpoint_round_trip_keeps_muon_state(tmp_path: Path) -> None:
    model = tiny_model()
    cfg = muon_cfg(warmup_steps=2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, max_steps=10)
    for s in range(3):
        take_step(model, opt, sched, s)
    path = save_checkpoint(tmp_path, 3, model, opt, sched, {"position": 7})
    plain = copy.deepcopy(opt.state_dict())  # torch's own (id-keyed) state dicts of both, for code that saves those
    assert set(plain) == {"muon", "adamw"} and len(plain["muon"]["state"]) == 8
    saved = read_checkpoint(path)["optimizer"]["state"]
    assert "momentum_buffer" in saved["transformer.h.0.attn.c_attn.weight"]  # Muon's state, keyed by name
    assert {"exp_avg", "exp_avg_sq"} <= set(saved["transformer.wte.weight"])  # AdamW's
    after = [take_step(model, opt, sched, s) for s in range(3, 6)]

    model2 = tiny_model(seed=99)
    opt2 = build_optimizer(model2, cfg)
    sched2 = build_scheduler(opt2, cfg, max_steps=10)
    load_checkpoint(path, model2, opt2, sched2)
    buf = opt2.muon.state[model2.transformer.h[0].attn.c_attn.weight]["momentum_buffer"]
    assert torch.equal(buf, saved["transformer.h.0.attn.c_attn.weight"]["momentum_buffer"])
    assert [take_step(model2, opt2, sched2, s) for s in range(3, 6)] == after  # bit-identical

    model3 = tiny_model(seed=99)
    model3.load_state_dict(read_checkpoint(path)["model"])
    opt3 = build_optimizer(model3, cfg)
    sched3 = build_scheduler(opt3, cfg, max_steps=10)
    opt3.load_state_dict(plain)
    sched3.load_state_dict(read_checkpoint(path)["scheduler"])
    assert [take_step(model3, opt3, sched3, s) for s in range(3, 6)] == after


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"algorithm": "lion"}, "optim.algorithm"),
        ({"algorithm": "muon", "muon_lr": float("inf")}, "optim.muon_lr"),
        ({"algorithm": "muon", "muon_momentum": 1.0}, "optim.muon_momentum"),
        ({"algorithm": "muon", "muon_ns_steps": 0}, "optim.muon_ns_steps"),
        ({"algorithm": "muon", "muon_adjust_lr": "rms"}, "optim.muon_adjust_lr"),
        ({"algorithm": "muon", "muon_weight_decay": -1.0}, "optim.muon_weight_decay"),
    ],
)
def test_bad_muon_settings_name_the_key(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}: "):
        OptimConfig(**kw)


def test_fsdp2_with_muon_is_refused_at_config_time() -> None:
    with pytest.raises(ValueError, match=r"^optim.algorithm: muon needs whole matrices .* use parallel=ddp"):
        PretrainRunConfig(optim=OptimConfig(algorithm="muon"), parallel=ParallelConfig(mode="fsdp2"))
    PretrainRunConfig(optim=OptimConfig(algorithm="muon"), parallel=ParallelConfig(mode="ddp"))


def test_planner_counts_newton_schulz_flops() -> None:
    from phase6.config import HardwareConfig
    from phase6.plan.pretrain import NS_EFFICIENCY, gpt2_hidden_shapes, newton_schulz_flops, predict_pretrain, spec_from

    m124 = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    c = 768
    per_layer = (4 * c * c * 3 * c + 2 * c**3) + 6 * c**3 + 2 * (4 * c * c * 4 * c + 2 * c**3)  # qkv, proj, fc, proj
    assert newton_schulz_flops(gpt2_hidden_shapes(spec_from(m124)), 5) == pytest.approx(5 * 12 * per_layer)
    assert 5 * 12 * per_layer == pytest.approx(1.522e12, rel=1e-3)
    hw = HardwareConfig()
    kw = dict(seq_len=1024, micro_batch_size=64, num_gpus=8, train_tokens=3.25e9)
    adamw = predict_pretrain(m124, hw, **kw)  # type: ignore[arg-type]
    muon = predict_pretrain(m124, hw, optimizer="muon", **kw)  # type: ignore[arg-type]
    ns_s = 5 * 12 * per_layer / (NS_EFFICIENCY * hw.peak_bf16_tflops * 1e12)
    assert muon.step_time_s == pytest.approx(adamw.step_time_s + ns_s)
    assert muon.tokens_per_s < adamw.tokens_per_s and muon.optimizer_flops_per_step > 0
    assert "Newton-Schulz" in muon.predicted()["formulas"]["optimizer"]
    # the loss is predicted at Muon's AdamW-equivalent tokens: lower than AdamW's at the same budget
    assert muon.loss is not None and adamw.loss is not None and muon.loss.mid < adamw.loss.mid


def test_phase6_plan_prices_muon_and_keeps_its_matrices_whole() -> None:
    """`phase6 plan plan.optimizer=muon`: the same step as AdamW at ZeRO-0 plus Newton-Schulz on every rank (a Llama
    -style model's q/k/v/o and gate/up/down counted separately), and only layouts with tp=1, zero=0."""
    from phase6.launch import ConfigError, load_config
    from phase6.plan.model import resolve_model
    from phase6.plan.profile import build_profile
    from phase6.plan.recommend import recommend_train
    from phase6.plan.train import NS_EFFICIENCY

    base = ["model=llama3.1-8b", "workload=train", "gpus=8", "plan.seq_len=8192", "plan.global_batch_tokens=1048576"]
    adamw = load_config("plan", [*base, "plan.zero=0"])
    muon = load_config("plan", [*base, "plan.optimizer=muon"])
    spec, profile = resolve_model(muon.model, None), build_profile(muon.hardware)
    rec_muon = recommend_train(spec, 8, muon.plan, profile)
    assert rec_muon.candidates + rec_muon.rejected
    assert all(c.layout.tp == 1 and c.layout.ep == 1 for c in rec_muon.candidates + rec_muon.rejected)
    assert all(c.detail.setup.zero == 0 for c in rec_muon.candidates + rec_muon.rejected)
    # one layout both can run: the step grows by exactly the Newton-Schulz time of the stage's matrices
    h, q, k, f, L = 4096, 4096, 1024, 14336, 32
    per_layer = 0
    for rows, cols in [(q, h), (k, h), (k, h), (h, q), (f, h), (f, h), (h, f)]:
        m_, n_ = min(rows, cols), max(rows, cols)
        per_layer += 5 * (4 * m_ * m_ * n_ + 2 * m_**3)
    ns_s = L * per_layer / (NS_EFFICIENCY * muon.hardware.peak_bf16_tflops * 1e12)
    rec_adamw = recommend_train(spec, 8, adamw.plan, profile)
    pick = {(c.layout.dp, c.layout.pp, c.layout.cp): c.detail for c in rec_adamw.candidates + rec_adamw.rejected}
    both = [c for c in rec_muon.candidates + rec_muon.rejected if (c.layout.dp, c.layout.pp, c.layout.cp) in pick]
    assert both
    for c in both:
        a = pick[(c.layout.dp, c.layout.pp, c.layout.cp)]
        if c.detail.setup.ac_mode == a.setup.ac_mode and c.layout.pp == 1:
            assert c.detail.optimizer_s == pytest.approx(a.optimizer_s + ns_s, rel=1e-9)
    for bad, key in ((["plan.tp=2"], "plan.tp"), (["plan.zero=3"], "plan.zero"), (["plan.optimizer=lion"], "plan.opt")):
        with pytest.raises(ConfigError, match=f"^{key}"):
            load_config("plan", [*base, "plan.optimizer=muon", *bad] if "lion" not in bad[0] else [*base, *bad])


def test_bench_muon_rows_on_cpu() -> None:
    """`phase6 bench pretrain --rows ...,muon`: Muon rows at the AdamW rows' shapes (the code path; CPU numbers)."""
    from phase6.bench.pretrain import main

    cpu = ["--device", "cpu", "--preset", "gpt2_tiny", "--seq-len", "32", "--steps", "2", "--warmup", "1"]
    rows = main([*cpu, "--batch-size", "2", "--accum", "2", "--rows", "combined,accum,muon", "--combine", "none"])
    assert [(r["row"], r["B"], r["accum"]) for r in rows] == [
        ("ours combined", 2, 1),
        ("ours combined, x2 accum", 2, 2),
        ("ours muon", 2, 1),
        ("ours muon, x2 accum", 2, 2),
    ]
    assert all(r.get("tokens/s", 0) > 0 and "note" not in r for r in rows)
