"""6A performance knobs the trainer and `phase6 bench pretrain` share: SDPA backend pinning, compile options,
fullgraph, and the fused linear + cross-entropy (model.fused_ce=liger) scoring only the real vocabulary rows.

CPU tests check the wiring (the mask excludes padded rows, the pinned kernel is the one that runs, config errors
name the key). The `gpu` tests check Liger-Kernel itself and cuDNN attention against the default path."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F

import phase6.models.fused_ce as fused_ce
from phase6.config.pretrain import ModelConfig, ParallelConfig, check_perf_combination
from phase6.dist import DistInfo
from phase6.launch import ConfigError, load_config
from phase6.models.gpt2 import GPT
from phase6.parallel import parallelize

# vocab 1000 padded to 1024: 24 padding rows that must never enter the softmax
CFG = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=1000, pad_vocab_multiple=64)
CPU = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def batch(seed: int = 0, device: str = "cpu", vocab: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (2, 32), generator=g)
    y = torch.randint(0, vocab, (2, 32), generator=g)
    y[0, :5] = -100  # ignored targets are part of the contract (F.cross_entropy's ignore_index)
    return x.to(device), y.to(device)


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    return loss.item(), [p.grad.detach().clone() for p in model.parameters()]


class ReferenceFusedCE:
    """Stand-in with Liger's call signature (weight, x, targets, bias): logits + bias, then fp32 cross-entropy."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    def __call__(self, w: torch.Tensor, x: torch.Tensor, t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        logits = x @ w.t() + (bias if bias is not None else 0)
        return F.cross_entropy(logits.float(), t, ignore_index=self.kwargs["ignore_index"])


def test_fused_ce_mask_scores_only_the_real_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT's fused path hands the full padded weight and a -inf bias on padding rows: same loss and gradients as
    the sliced logits path, and the padding rows get exactly zero gradient."""
    monkeypatch.setattr(fused_ce, "load_liger", lambda: ReferenceFusedCE)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the stand-in runs on CPU, as Liger's kernels do interpreted
    torch.manual_seed(0)
    ref = GPT(CFG)
    fused = GPT(dataclasses.replace(CFG, fused_ce="liger"))
    fused.load_state_dict(ref.state_dict())  # the mask is not in the state_dict: checkpoints are interchangeable
    x, y = batch()
    l_ref, g_ref = loss_and_grads(ref, x, y)
    l_fused, g_fused = loss_and_grads(fused, x, y)
    assert l_fused == pytest.approx(l_ref, abs=1e-5)
    for a, b in zip(g_ref, g_fused, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    assert fused.lm_head.weight.grad[CFG.vocab_size :].abs().max() == 0
    # without the mask the padding rows would enter the partition function: a different loss
    fused.fused_loss.vocab_mask = None
    assert abs(fused(x, y).item() - l_ref) > 1e-4


def test_fused_ce_errors_name_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)  # as if not installed: import fails
    with pytest.raises(ValueError, match=r"^model\.fused_ce: 'liger' needs the liger-kernel package"):
        GPT(dataclasses.replace(CFG, fused_ce="liger"))
    monkeypatch.setattr(fused_ce, "load_liger", lambda: ReferenceFusedCE)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = GPT(dataclasses.replace(CFG, fused_ce="liger"))
    with pytest.raises(ValueError, match=r"^model\.fused_ce: 'liger' runs Triton GPU kernels"):
        model(*batch())
    assert model(batch()[0]).shape == (2, 32, CFG.vocab_size)  # logits (no targets) never use the fused loss


def test_pinned_sdpa_backend_is_the_one_that_runs() -> None:
    """On CPU the flash kernel exists and must give the default path's loss; the memory-efficient kernel does not
    exist on CPU, so pinning it must fail rather than fall back (proof that the pin reaches the attention)."""
    torch.manual_seed(0)
    model = GPT(CFG)
    x, y = batch()
    l_auto = model(x, y).item()
    parallelize(model, ParallelConfig(sdpa_backend="flash", compile=False), CPU)
    assert model(x, y).item() == pytest.approx(l_auto, abs=1e-5)
    parallelize(model, ParallelConfig(sdpa_backend="efficient", compile=False), CPU)
    with pytest.raises(RuntimeError, match="No available kernel|No viable backend"):
        model(x, y)
    parallelize(model, ParallelConfig(sdpa_backend="auto", compile=False), CPU)
    assert model(x, y).item() == pytest.approx(l_auto, abs=1e-5)


def test_pinned_backend_survives_activation_checkpointing() -> None:
    """The recompute in backward re-enters the attention's own sdpa_kernel context (not an outer one)."""
    torch.manual_seed(0)
    model = GPT(CFG)
    parallelize(model, ParallelConfig(sdpa_backend="efficient", compile=False, activation_checkpointing=True), CPU)
    with pytest.raises(RuntimeError, match="No available kernel|No viable backend"):
        model(*batch())


def test_fullgraph_compile_traces_the_pinned_backend() -> None:
    """torch.compile(fullgraph=True) through the sdpa_kernel context: no graph break, the eager loss and grads."""
    cfg = dataclasses.replace(CFG, n_layer=1)
    torch.manual_seed(0)
    ref = GPT(cfg)
    torch.manual_seed(0)
    model = GPT(cfg)
    torch._dynamo.reset()
    parallelize(model, ParallelConfig(sdpa_backend="flash", compile=True, fullgraph=True), CPU)
    x, y = batch()
    l_ref, g_ref = loss_and_grads(ref, x, y)
    l_c, g_c = loss_and_grads(model, x, y)
    assert l_c == pytest.approx(l_ref, abs=1e-5)
    for a, b in zip(g_ref, g_c, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()


def test_compile_options_merge_mode_and_inductor_passthrough() -> None:
    cfg = ParallelConfig(
        compile_mode="max-autotune-no-cudagraphs",
        inductor={"coordinate_descent_tuning": False, "triton": {"cudagraphs": False}},
    )
    opts = cfg.compile_options()
    assert opts["max_autotune"] is True  # from the mode
    assert opts["coordinate_descent_tuning"] is False  # parallel.inductor wins over the mode
    assert opts["triton.cudagraphs"] is False  # nested (as a Hydra command line delivers it) -> dotted
    assert ParallelConfig().compile_options() == {}


@pytest.mark.parametrize(
    "override,key",
    [
        ("parallel.sdpa_backend=flash3", "parallel.sdpa_backend"),
        ("model.fused_ce=apex", "model.fused_ce"),
        ("+parallel.inductor.coordinate_decent_tuning=true", "parallel.inductor"),
        ("parallel.compile_mode=fast", "parallel.compile_mode"),
    ],
)
def test_bad_perf_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("pretrain", [override])


def test_fullgraph_with_fused_ce_is_rejected_under_whole_model_compile() -> None:
    model = dataclasses.replace(CFG, fused_ce="liger")
    with pytest.raises(ValueError, match=r"^parallel\.fullgraph: cannot be true with model\.fused_ce=liger"):
        check_perf_combination(model, ParallelConfig(fullgraph=True))
    check_perf_combination(model, ParallelConfig(mode="fsdp2", fullgraph=True))  # per-block graphs exclude the loss
    cfg = load_config("pretrain", ["parallel.sdpa_backend=cudnn", "model.fused_ce=liger", "train.tf32=true"])
    assert (cfg.parallel.sdpa_backend, cfg.model.fused_ce, cfg.train.tf32) == ("cudnn", "liger", True)


# ----------------------------------------------------------------------------------------------------------------
# GPU: the real kernels


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPT2_VOCAB = ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=50257, pad_vocab_multiple=64)


def gpu_pair(cfg: ModelConfig, **changes: object) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = GPT(cfg)
        other = GPT(dataclasses.replace(cfg, **changes))
    other.load_state_dict(ref.state_dict())
    return ref, other


def gpu_batch(seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50257, (4, seq), generator=g)
    y = torch.randint(0, 50257, (4, seq), generator=g)
    y[0, :7] = -100
    return x.cuda(), y.cuda()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_liger_fused_ce_matches_the_sliced_loss_on_gpu(bf16: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Liger-Kernel over the padded 50304-row weight with the -inf mask == logits[..., :50257] + cross-entropy.
    Tolerances: fp32 (TF32 off) 1e-5 on the loss; bf16 autocast 2e-3 on the loss, grads within bf16 rounding."""
    pytest.importorskip("liger_kernel")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 means fp32 here
    ref, fused = gpu_pair(GPT2_VOCAB, fused_ce="liger")
    x, y = gpu_batch(64)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)
    with ctx:
        l_ref = ref(x, y)
    l_ref.backward()
    with ctx:
        l_fused = fused(x, y)
    l_fused.backward()
    assert l_fused.item() == pytest.approx(l_ref.item(), abs=2e-3 if bf16 else 1e-5)
    for (name, a), b in zip(ref.named_parameters(), fused.parameters(), strict=True):
        scale = a.grad.abs().max().item()
        assert (b.grad - a.grad).abs().max().item() <= (2e-2 if bf16 else 1e-4) * scale + 1e-7, name
    assert fused.lm_head.weight.grad[GPT2_VOCAB.vocab_size :].abs().max().item() == 0


@pytest.mark.gpu
@needs_gpu
def test_compiled_liger_and_cudnn_train_like_the_default_on_gpu() -> None:
    """The whole-model compile with the Liger graph break and cuDNN attention pinned: the default compiled path's
    bf16 loss within 5e-3 at init and 1e-2 after one AdamW step (lr 1e-3 moves it by ~0.1: a wrong gradient shows)."""
    pytest.importorskip("liger_kernel")
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    ref, fast = gpu_pair(GPT2_VOCAB, fused_ce="liger")
    torch._dynamo.reset()
    parallelize(ref, ParallelConfig(compile=True), info)
    parallelize(fast, ParallelConfig(compile=True, sdpa_backend="cudnn"), info)
    x, y = gpu_batch(64)
    losses = []
    for model in (ref, fast):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        seq = []
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            seq.append(loss.item())
        losses.append(seq)
    assert losses[1][0] == pytest.approx(losses[0][0], abs=5e-3)
    assert losses[1][1] == pytest.approx(losses[0][1], abs=1e-2)
    assert losses[0][0] - losses[0][1] > 2e-2  # the step moved the loss by more than the tolerance
    torch._dynamo.reset()
