"""GPT-2 model: HF GPT2LMHeadModel parity both ways (fp32, loss within 1e-5), vocab padding, export, init, presets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from phase6.config import CONFIG_DIR
from phase6.config.pretrain import ModelConfig
from phase6.metrics import flops_per_token
from phase6.models.gpt2 import GPT
from phase6.models.hf import export_hf, from_hf, hf_tokenizer, to_hf

TOL = 1e-5  # fp32 parity tolerance on the mean loss (nats) and on logits


def tiny(**kw: object) -> ModelConfig:
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=300, pad_vocab_multiple=64)
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (3, 24), generator=g)
    return x, torch.randint(0, vocab, (3, 24), generator=g)


def hf_loss(hf: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = hf(input_ids=x).logits  # HF `labels=` shifts internally; compare against the same targets instead
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def test_padded_vocab_is_allocated_but_never_scored() -> None:
    cfg = tiny()
    assert cfg.padded_vocab_size == 320
    assert ModelConfig(vocab_size=50257).padded_vocab_size == 50304
    model = GPT(cfg)
    assert model.transformer.wte.weight.shape == (320, 32)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    x, _ = batch(300)
    assert model(x).shape == (3, 24, 300)


@pytest.mark.parametrize("bias,ce_vocab", [(True, "sliced"), (False, "sliced"), (True, "padded")])
def test_export_to_hf_same_loss_and_logits(bias: bool, ce_vocab: str) -> None:
    """ce_vocab=padded scores all 320 columns with the 20 padding ones at -inf: HF's 300-column loss all the same."""
    torch.manual_seed(0)
    model = GPT(tiny(bias=bias, ce_vocab=ce_vocab)).eval()
    with torch.no_grad():  # move the padding rows away from zero: they must still not matter
        model.transformer.wte.weight[300:] = 5.0
    x, y = batch(300)
    hf = to_hf(model)
    assert hf.config.vocab_size == 300 and hf.config.activation_function == "gelu_new"
    with torch.no_grad():
        assert abs(model(x, y).item() - hf_loss(hf, x, y).item()) < TOL
        assert (model(x) - hf(input_ids=x).logits).abs().max().item() < TOL


def test_import_from_hf_same_loss_and_logits() -> None:
    torch.manual_seed(1)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    with torch.no_grad():  # HF's init leaves biases / LayerNorm at 0 / 1: randomise so a missed copy shows
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.normal_(0, 0.1)
    model = from_hf(hf).eval()
    assert model.cfg.bias and model.cfg.padded_vocab_size == 320
    x, y = batch(300, seed=1)
    with torch.no_grad():
        assert abs(model(x, y).item() - hf_loss(hf, x, y).item()) < TOL
        assert (model(x) - hf(input_ids=x).logits).abs().max().item() < TOL
    # and back again: the round trip is exact
    back = to_hf(model)
    for (k, a), b in zip(hf.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("ce_vocab", ["sliced", "padded"])
def test_gradients_match_hf(ce_vocab: str) -> None:
    torch.manual_seed(2)
    model = GPT(tiny(ce_vocab=ce_vocab))
    hf = to_hf(model).train()
    x, y = batch(300, seed=2)
    model(x, y).backward()
    hf_loss(hf, x, y).backward()
    g_ours = model.transformer.h[0].attn.c_attn.weight.grad
    g_hf = hf.transformer.h[0].attn.c_attn.weight.grad.t()  # Conv1D layout
    assert (g_ours - g_hf).abs().max().item() < TOL
    g_wte = model.transformer.wte.weight.grad
    assert (g_wte[:300] - hf.transformer.wte.weight.grad).abs().max().item() < TOL
    assert g_wte[300:].abs().max().item() == 0.0  # padding rows get no gradient


def test_export_dir_loads_with_auto_model(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = GPT(tiny()).eval()
    out = export_hf(model, tmp_path / "hf")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    x, y = batch(300, seed=3)
    with torch.no_grad():
        assert abs(model(x, y).item() - hf_loss(loaded, x, y).item()) < TOL
    assert loaded.config.eos_token_id == 299  # no tokenizer: EOT is the last id (GPT-2 / byte convention)


def test_export_with_locally_trained_bpe_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from phase6.data.tokenizer import train_bpe

    text = ["the quick brown fox jumps over the lazy dog. " * 20, "pack my box with five dozen liquor jugs. " * 20]
    bpe = train_bpe(text, 300, tmp_path / "tokenizer.json")
    tok = hf_tokenizer("bpe", bpe_file=tmp_path / "tokenizer.json")
    assert tok.eos_token_id == bpe.eot_token
    sample = "the lazy fox packs five jugs"
    assert tok(sample)["input_ids"] == bpe.encode(sample)
    model = GPT(tiny(vocab_size=bpe.vocab_size))
    out = export_hf(model, tmp_path / "hf", tok)
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded(sample)["input_ids"] == bpe.encode(sample)
    assert AutoModelForCausalLM.from_pretrained(out).config.eos_token_id == bpe.eot_token


def test_gpt2_hf_tokenizer_matches_tiktoken(shared: Path) -> None:
    from phase6.data.tokenizer import TiktokenGPT2

    d = shared / "gpt2-tokenizer"
    tok = hf_tokenizer("gpt2", d)
    text = (shared / "tinyshakespeare" / "input.txt").read_text()[:20000] + " naïve café 1234  spaces\n\n"
    assert tok(text)["input_ids"] == TiktokenGPT2(d).encode(text)
    assert tok.eos_token_id == 50256 and len(tok) == 50257


def test_gpt2_init_scales() -> None:
    torch.manual_seed(4)
    cfg = tiny(n_layer=8, n_embd=64, n_head=4)
    model = GPT(cfg)
    c_proj = torch.cat([b.attn.c_proj.weight.flatten() for b in model.transformer.h])
    c_fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.transformer.h])
    assert abs(c_proj.std().item() - 0.02 / math.sqrt(2 * cfg.n_layer)) < 2e-4
    assert abs(c_fc.std().item() - 0.02) < 5e-4
    assert model.transformer.h[0].attn.c_attn.bias.abs().max().item() == 0.0
    # the untrained loss is ~ln(V) + var(logit)/2 = ln 300 + (0.02^2 * 64)/2: the init favours no token
    # (0.1 covers the sampling noise of 72 tokens; std 0.1 instead of 0.02 would add ~0.3)
    x, y = batch(300, seed=4)
    assert abs(model(x, y).item() - math.log(300)) < 0.1


def test_sequence_longer_than_block_size_is_an_error() -> None:
    model = GPT(tiny())
    with pytest.raises(ValueError, match="exceeds model.block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_presets_match_the_reference_sizes() -> None:
    """Param counts and FLOPs/token (6N + 12LHQT) of the shipped presets against reference/anchors-6a-pretrain.md."""
    expected = {  # preset: (params with padded vocab + wpe, GFLOP/token at T=1024 from the anchors' §5 table)
        "gpt2_124m": (124_475_904, 0.854),
        "gpt2_350m": (354_871_296, 2.425),
        "gpt2_1.3b": (1_313_722_368, 8.40),
    }
    for name, (params, gflops) in expected.items():
        cfg = ModelConfig(**yaml.safe_load((CONFIG_DIR / "pretrain" / "model" / f"{name}.yaml").read_text()))
        with torch.device("meta"):
            model = GPT(cfg)
        assert model.num_params() == params, name
        n = model.num_params() - model.transformer.wpe.weight.numel()  # nanoGPT's N excludes wpe
        f = flops_per_token(n, cfg.n_layer, cfg.n_head, cfg.head_dim, 1024) / 1e9
        assert abs(f - gflops) / gflops < 0.01, (name, f)
