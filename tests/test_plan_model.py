"""Model description: exact parameter counts, FLOPs/token (6N + 12·L·H·Q·T), KV bytes/token, bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phase6.plan.model import ModelSpec, list_presets, load_hf_config, load_preset, resolve_model

# Published totals (HF num_parameters(); model cards): a wrong shape or bias rule changes these by >= 8192.
PUBLISHED = {
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-8b": 8_030_261_248,
    "qwen2.5-72b": 72_706_203_648,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-1.5b-instruct": 1_543_714_304,
    "mixtral-8x7b": 46_702_792_704,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}
# The planner's GPT-2 presets are 6A's trainer descriptions (configs/pretrain/model/), whose wte holds the vocabulary
# padded from 50257 to 50304 rows: 47 x n_embd parameters more than the HF checkpoint.
GPT2_TRAINER = {"gpt2": "gpt2_124m", "gpt2-medium": "gpt2_350m", "gpt2-large": "gpt2_774m", "gpt2-xl": "gpt2_1558m"}


@pytest.mark.parametrize("name,params", sorted(PUBLISHED.items()))
def test_preset_parameter_counts_match_published(name: str, params: int) -> None:
    spec = resolve_model(name)
    padding = (50304 - 50257) * spec.hidden_size if name in GPT2_TRAINER else 0
    assert spec.num_params() == params + padding


@pytest.mark.parametrize("name", sorted(GPT2_TRAINER))
def test_gpt2_preset_as_hf_config_is_the_published_checkpoint(name: str) -> None:
    """What transformers builds from a GPT-2 preset (serve.random_model=gpt2): the HF shape, 50257 rows."""
    from phase6.plan.model import load_hf_fields

    assert ModelSpec.from_hf_config(load_hf_fields(name)).num_params() == PUBLISHED[name]


@pytest.mark.parametrize("preset,trainer_preset", sorted(GPT2_TRAINER.items()))
def test_planner_gpt2_is_the_model_the_trainer_builds(preset: str, trainer_preset: str) -> None:
    """One description of each GPT-2 shape: the planner's count (from the preset file and from `phase6 plan
    model=<preset>`'s composed config) is the trainer model's own sum(p.numel()), exactly."""
    import torch
    import yaml

    from phase6.config import CONFIG_DIR
    from phase6.config.pretrain import ModelConfig
    from phase6.launch import load_config
    from phase6.models.gpt2 import GPT

    trainer_cfg = ModelConfig(
        **yaml.safe_load((CONFIG_DIR / "pretrain" / "model" / f"{trainer_preset}.yaml").read_text())
    )
    with torch.device("meta"):  # shapes only: no 1.5B parameters allocated
        model = GPT(trainer_cfg)
    real = sum(p.numel() for p in model.parameters())
    composed = load_config("plan", [f"model={preset}", "workload=train", "plan.seq_len=1024"]).model
    assert resolve_model(preset).num_params() == resolve_model(composed).num_params() == real
    assert resolve_model(composed).vocab_size == model.transformer.wte.weight.shape[0] == 50304


def test_every_preset_is_checked() -> None:
    assert set(list_presets()) == set(PUBLISHED)


def test_mixtral_active_params_are_two_of_eight_experts() -> None:
    m = resolve_model("mixtral-8x7b")
    expert = 3 * 4096 * 14336
    assert m.num_active_params() == m.num_params() - 32 * 6 * expert == 12_879_925_248


def test_llama70b_kv_cache_bytes_per_token() -> None:
    # 2 (K and V) x 80 layers x 8 kv-heads x 128 head_dim x 2 bytes (bf16)
    assert resolve_model("llama3.1-70b").kv_cache_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_gqa_kv_is_smaller_than_mha() -> None:
    qwen7 = resolve_model("qwen2.5-7b")  # 28 query heads, 4 KV heads
    assert qwen7.kv_cache_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 57_344


def test_gpt2_124m_flops_per_token_palm_formula() -> None:
    # The nanoGPT transformer_sizing config (vocab 50257, no biases) that anchors-6a §5 quotes as 854.5 MFLOP/token.
    m = ModelSpec.gpt2(12, 12, 768, vocab_size=50257, block_size=1024, bias=False)
    n = m.num_params() - 1024 * 768  # N excludes wpe (nanoGPT get_num_params), tied wte counted once
    assert m.num_matmul_params() == n == 123_551_232
    expected = 6 * n + 12 * 12 * 12 * 64 * 1024
    assert m.flops_per_token(1024) == expected
    assert m.flops_per_token(1024) == pytest.approx(854.5e6, rel=1e-3)


def test_untied_head_counts_and_embedding_lookup_does_not() -> None:
    m = resolve_model("llama3.1-8b")
    assert m.num_matmul_params() == m.num_params() - m.embedding_params()
    assert m.flops_per_token(4096) == 6 * m.num_matmul_params() + 12 * 32 * 32 * 128 * 4096


def test_hf_config_json_file(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = resolve_model({}, hf_config=str(tmp_path))
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64
    assert m.num_params() == 2 * (attn + 3 * 64 * 128 + 2 * 64) + 100 * 64 + 64
    assert load_hf_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize(
    "drop,msg",
    [
        ("hidden_size", "missing field hidden_size or n_embd"),
        ("intermediate_size", "missing field intermediate_size"),
        ("num_attention_heads", "missing field num_attention_heads or n_head"),
        ("max_position_embeddings", "missing field max_position_embeddings"),
    ],
)
def test_missing_config_fields_are_one_line_errors(drop: str, msg: str) -> None:
    cfg = load_preset("llama3.1-8b")
    del cfg[drop]
    with pytest.raises(ValueError, match=msg) as e:
        ModelSpec.from_hf_config(cfg, source="x/config.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("x/config.json")


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown preset 'llama9'.*llama3.1-70b"):
        resolve_model("llama9")


def test_bad_hf_config_path_and_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        resolve_model({}, hf_config=str(tmp_path / "nope.json"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve_model({}, hf_config=str(bad))


def test_moe_fields_without_experts_are_not_planned_as_dense() -> None:
    cfg = {**load_preset("llama3.1-8b"), "n_routed_experts": 64, "num_experts_per_tok": 6}
    with pytest.raises(ValueError, match="looks like an MoE model .*n_routed_experts.*refusing") as e:
        ModelSpec.from_hf_config(cfg, source="x.json")
    assert "\n" not in str(e.value)
    mixed = {**load_preset("mixtral-8x7b"), "first_k_dense_replace": 1}
    with pytest.raises(ValueError, match="first_k_dense_replace"):
        ModelSpec.from_hf_config(mixed, source="y.json")
