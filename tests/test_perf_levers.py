"""6A performance knobs the trainer and `phase6 bench pretrain` share: SDPA backend pinning, compile options,
fullgraph, and the fused linear + cross-entropy (model.fused_ce=liger) scoring only the real vocabulary rows.

CPU tests check the wiring (the mask excludes padded rows, the pinned kernel is the one that runs, config errors
name the key). The `gpu` tests check Liger-Kernel itself and cuDNN attention against the default path."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

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


@pytest.mark.slow  # two inductor compiles: 42 s on the loaded 2-core box
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


def test_fa4_without_the_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """sdpa_backend=fa4 checks for flash-attn-4 when the model is parallelized, before any step: one line naming
    the key and the package, not an ImportError from inside a compiled graph."""
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import fails as if not installed
    assert load_config("pretrain", ["parallel.sdpa_backend=fa4"]).parallel.sdpa_backend == "fa4"
    with pytest.raises(ValueError, match=r"^parallel\.sdpa_backend: 'fa4' needs the flash-attn-4 package"):
        parallelize(GPT(CFG), ParallelConfig(sdpa_backend="fa4", compile=False), CPU)


def test_fa4_adapter_gives_torch_the_two_outputs_it_unpacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's FA4 glue runs `out, lse = _flash_attn_fwd(...)`; flash-attn-4 4.0.0b36 returns 5 values. The adapter
    module torch is registered with passes the arguments through and keeps (out, lse); the backward is FA4's own."""
    import importlib.util
    import types

    calls = []

    def fwd(*args: object, **kwargs: object) -> tuple[str, ...]:
        calls.append((args, kwargs))
        return ("out", "lse", "p", "row_max", "o_lo")

    def bwd(*args: object, **kwargs: object) -> tuple[str, ...]:
        return ("dq", "dk", "dv")

    fake = types.ModuleType("flash_attn.cute.interface")
    fake._flash_attn_fwd, fake._flash_attn_bwd = fwd, bwd
    for name, mod in (("flash_attn", types.ModuleType("flash_attn")), ("flash_attn.cute", types.ModuleType("c"))):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake)
    # a fresh copy of the adapter bound to the fake package, never entered in sys.modules (a later activate_fa4
    # in the same process must import the real one)
    spec = importlib.util.find_spec("phase6.models.fa4_interface")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    assert shim._flash_attn_fwd(1, 2, 3, causal=True, return_lse=True) == ("out", "lse")
    assert calls == [((1, 2, 3), {"causal": True, "return_lse": True})]
    assert shim._flash_attn_bwd is bwd


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


@pytest.fixture
def fp32_matmuls_in_ieee() -> Iterator[None]:
    """fp32 matmuls in full fp32 (no TF32) for one test, restored after it. Through torch's fp32_precision setting:
    torch 2.11's cuBLAS module has no ``allow_tf32`` attribute for monkeypatch to restore (teardown error)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = before


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_liger_fused_ce_matches_the_sliced_loss_on_gpu(bf16: bool, fp32_matmuls_in_ieee: None) -> None:
    """Liger-Kernel over the padded 50304-row weight with the -inf mask == logits[..., :50257] + cross-entropy.
    Tolerances: fp32 (TF32 off) 1e-5 on the loss; bf16 autocast 2e-3 on the loss, grads within bf16 rounding."""
    pytest.importorskip("liger_kernel")
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


@pytest.mark.gpu
@needs_gpu
def test_fa4_attention_matches_the_fp32_reference_on_gpu() -> None:
    """parallel.sdpa_backend=fa4 (FlashAttention-4 behind SDPA's flash backend) against SDPA's math kernel in fp32,
    causal, GPT-2 124M's head shape (12 heads x 64) at T=1024: output and q/k/v gradients within 2 % of each one's
    max (bf16 inputs; the default flash/cuDNN kernels land at ~0.5 %). The FA4 kernel must be the one that ran."""
    pytest.importorskip("flash_attn.cute")
    from torch.nn.attention import SDPBackend, current_flash_attention_impl, restore_flash_attention_impl, sdpa_kernel

    from phase6.parallel import activate_fa4

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 12, 1024, 64, device="cuda", generator=g) for _ in range(3))
    dout = torch.randn(2, 12, 1024, 64, device="cuda", generator=g)

    def run(dtype: torch.dtype, backend: SDPBackend) -> list[torch.Tensor]:
        qkv = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]  # fresh leaves per run
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(*qkv, is_causal=True)
        out.backward(dout.to(dtype))
        return [out.float(), *(t.grad.float() for t in qkv)]

    ref = run(torch.float32, SDPBackend.MATH)
    activate_fa4()
    try:
        assert current_flash_attention_impl() == "FA4"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = run(torch.bfloat16, SDPBackend.FLASH_ATTENTION)
            torch.cuda.synchronize()
    finally:
        restore_flash_attention_impl()
    names = " ".join(e.key for e in prof.key_averages())
    assert "pytorch_flash::flash_fwd_kernel" not in names  # not FA2
    # FA4's CuTe kernels, as the H200 profile names them (kernel_cutlass_..._FlashAttentionForwardSm90_...)
    assert "FlashAttentionForward" in names and "FlashAttentionBackward" in names
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, got, strict=True):
        err = (b - a).abs().max().item() / a.abs().max().item()
        assert err < 2e-2, f"{name}: max error {err:.3g} of max |ref|"


# ---------------------------------------------------------------------------------------------------- numerics levers
# model.float8 (torchao FP8 GEMMs) and model.residual_dtype=bf16. torch._scaled_mm has a CPU kernel, so the FP8
# path runs here for real (slowly); the throughput and the equal-loss check at 124M are GPU benchmarks
# (docs/benchmarks.md). Tolerance: the levers change rounding, not the model, so on a 30-step overfit of one batch
# the loss curve must stay within 5 % (relative) of the bf16-autocast default at every step (measured: <= 1.4 %).


def overfit_curve(cfg: ModelConfig, steps: int = 30, **float8: object) -> tuple[list[float], torch.nn.Module]:
    torch.manual_seed(0)
    model = GPT(cfg)
    if cfg.float8 != "none":
        parallelize(model, ParallelConfig(compile=False), CPU)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (8, 32), generator=g)
    y = torch.roll(x, -1, 1)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize(
    "change",
    [  # the FP8 GEMMs run emulated on CPU: 63-140 s each on the loaded 2-core box, so slow (make test-all)
        pytest.param({"float8": "tensorwise"}, marks=pytest.mark.slow),
        pytest.param({"float8": "rowwise"}, marks=pytest.mark.slow),
        pytest.param({"float8": "tensorwise", "float8_lm_head": True}, marks=pytest.mark.slow),
        {"residual_dtype": "bf16"},
    ],
    ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()),
)
def test_numerics_levers_follow_the_default_loss_curve(change: dict) -> None:
    pytest.importorskip("torchao.float8")
    ref, _ = overfit_curve(CFG)
    got, model = overfit_curve(dataclasses.replace(CFG, **change))
    worst = max(abs(a - b) / b for a, b in zip(got, ref, strict=True))
    assert worst <= 0.05, f"{change}: loss curve departs {worst:.1%} from the bf16 default"
    assert got[-1] < 0.3 * got[0], f"{change}: did not learn ({got[0]:.3f} -> {got[-1]:.3f})"
    if "float8" in change:
        from torchao.float8.float8_linear import Float8Linear

        converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
        expected = {f"transformer.h.{i}.{n}" for i in range(CFG.n_layer) for n in LINEARS}
        assert converted == expected | ({"lm_head"} if change.get("float8_lm_head") else set())
        assert model.lm_head.weight is model.transformer.wte.weight, "the wte / lm_head tie must survive"
        assert set(model.state_dict()) == set(GPT(CFG).state_dict()), "checkpoint keys must not change"


LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def test_bf16_residual_stream_is_bf16_between_blocks() -> None:
    model = GPT(dataclasses.replace(CFG, residual_dtype="bf16"))
    seen: list[torch.dtype] = []
    for block in model.transformer.h:
        block.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(*batch())
    assert seen == [torch.bfloat16] * CFG.n_layer
    seen.clear()
    default = GPT(CFG)
    default.transformer.h[0].register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        default(*batch())
    assert seen == [torch.float32], "bf16 autocast's default keeps an fp32 residual stream"


def test_float8_without_torchao_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import of torchao.float8 now raises ImportError
    with pytest.raises(ValueError, match=r"^model\.float8: 'tensorwise' needs the torchao package"):
        parallelize(GPT(dataclasses.replace(CFG, float8="tensorwise")), ParallelConfig(compile=False), CPU)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.float8=fp4"], r"^model\.float8: must be one of"),
        (["model.float8_lm_head=true"], r"^model\.float8_lm_head: needs model\.float8"),
        (["model.residual_dtype=fp16"], r"^model\.residual_dtype: must be one of"),
        (["model.ce_vocab=full"], r"^model\.ce_vocab: must be one of"),
        (["model.residual_dtype=bf16", "device=cpu"], r"^model\.residual_dtype: bf16 needs bf16 training"),
        (["model.residual_dtype=bf16", "train.dtype=fp32"], r"^model\.residual_dtype: bf16 needs bf16"),
        (
            ["model.float8=tensorwise", "model.n_embd=72", "model.n_head=2"],
            r"^model\.n_embd: \(72\) must be divisible by 16",
        ),
    ],
)
def test_numerics_config_errors_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("pretrain", overrides)
