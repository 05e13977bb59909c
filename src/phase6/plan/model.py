"""What the planner knows about a model: shapes from a preset or any HF ``config.json``, parameter counts, FLOPs.

Dense and MoE decoder-only transformers (GPT-2, Llama, Qwen2, Mistral/Mixtral, Qwen2-MoE/Qwen3-MoE field names).
Parameter counts are exact for these architectures (checked in tests against the published totals, e.g.
Llama-3.1-70B = 70,553,706,496). FLOPs per token use the PaLM form 6N + 12·L·H·Q·T (``phase6.metrics``), where N
counts the parameters that take part in matmuls: the input-embedding and position tables are lookups and are left
out, the LM head counts (once when tied), and for MoE only the ``experts_per_token`` experts a token is routed to.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from phase6.config import CONFIG_DIR
from phase6.metrics import FLOPS_FORMULA
from phase6.metrics import flops_per_token as palm_flops_per_token

# Presets live next to the planner's primary config: configs/plan/model/<name>.yaml (a Hydra group of the plan job).
PRESET_DIR = CONFIG_DIR / "plan" / "model"

# HF field-name aliases: GPT-2 uses n_layer/n_embd/n_head/n_positions, Mixtral num_local_experts, Qwen-MoE num_experts.
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}


def _get(cfg: dict[str, Any], key: str, source: str) -> Any:
    for name in _ALIASES[key]:
        if cfg.get(name) is not None:
            return cfg[name]
    raise ValueError(f"{source}: missing field {' or '.join(_ALIASES[key])!s} (needed for {key})")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer, enough to count parameters, FLOPs, memory and bytes moved."""

    name: str
    num_layers: int
    """L: transformer blocks."""
    hidden_size: int
    """h: residual width."""
    num_heads: int
    """a: query heads."""
    num_kv_heads: int
    """KV heads (GQA); equals num_heads for MHA."""
    head_dim: int
    """Q: per-head width (hidden_size / num_heads unless the config says otherwise)."""
    intermediate_size: int
    """f: dense MLP width (per expert for MoE unless moe_intermediate_size is set)."""
    vocab_size: int
    """V: rows of the embedding / LM head."""
    max_position_embeddings: int
    """Longest context the model was configured for."""
    tie_word_embeddings: bool = False
    """LM head shares the token-embedding matrix."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with gate, up and down projections (3 matrices) instead of 2 (GPT-2)."""
    learned_positions: bool = False
    """A learned position table (GPT-2 wpe) of max_position_embeddings x hidden_size."""
    layernorm_bias: bool = False
    """LayerNorm with bias (GPT-2) vs RMSNorm (weight only)."""
    attention_bias: bool = False
    """Biases on q/k/v and output projections (GPT-2 all; see qkv_bias for Qwen2)."""
    qkv_bias: bool = False
    """Biases on q/k/v only (Qwen2)."""
    mlp_bias: bool = False
    """Biases on the MLP projections (GPT-2)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 = dense model."""
    experts_per_token: int = 0
    """Top-k experts each token is routed to."""
    moe_intermediate_size: int = 0
    """Width of each routed expert's MLP; 0 = intermediate_size."""
    shared_expert_intermediate_size: int = 0
    """Width of an always-on shared expert (Qwen2-MoE); 0 = none."""

    # ---- derived -------------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def expert_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def _mlp_params(self, width: int) -> int:
        h = self.hidden_size
        mats = 3 if self.gated_mlp else 2
        bias = (width * (2 if self.gated_mlp else 1) + h) if self.mlp_bias else 0
        return mats * h * width + bias

    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        p = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            p += self.q_dim + 2 * self.kv_dim + h
        elif self.qkv_bias:
            p += self.q_dim + 2 * self.kv_dim
        return p

    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size * (2 if self.layernorm_bias else 1)

    def dense_mlp_params_per_layer(self) -> int:
        """MLP parameters every token uses: the dense MLP, or for MoE the router plus any shared expert."""
        if not self.is_moe:
            return self._mlp_params(self.intermediate_size)
        p = self.hidden_size * self.num_experts  # router
        if self.shared_expert_intermediate_size:
            p += self._mlp_params(self.shared_expert_intermediate_size) + self.hidden_size  # + shared-expert gate
        return p

    def expert_params_per_layer(self) -> int:
        """All routed experts of one MoE layer (0 for dense models)."""
        return self.num_experts * self._mlp_params(self.expert_size) if self.is_moe else 0

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def position_params(self) -> int:
        return self.max_position_embeddings * self.hidden_size if self.learned_positions else 0

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def final_norm_params(self) -> int:
        return self.hidden_size * (2 if self.layernorm_bias else 1)

    def layer_params(self) -> int:
        return (
            self.attention_params_per_layer()
            + self.norm_params_per_layer()
            + self.dense_mlp_params_per_layer()
            + self.expert_params_per_layer()
        )

    def num_params(self) -> int:
        """Total parameters (what a checkpoint holds; HF ``num_parameters()``)."""
        return (
            self.num_layers * self.layer_params()
            + self.embedding_params()
            + self.position_params()
            + self.lm_head_params()
            + self.final_norm_params()
        )

    def num_expert_params(self) -> int:
        return self.num_layers * self.expert_params_per_layer()

    def num_active_params(self) -> int:
        """Parameters one token touches: total minus the experts it is not routed to."""
        if not self.is_moe:
            return self.num_params()
        unused = self.num_experts - self.experts_per_token
        return self.num_params() - self.num_layers * unused * self._mlp_params(self.expert_size)

    def num_matmul_params(self) -> int:
        """N of 6N: active parameters minus the embedding lookups (token table unless tied, position table)."""
        n = self.num_active_params() - self.position_params()
        return n if self.tie_word_embeddings else n - self.embedding_params()

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (fwd + bwd) = 6N + 12·L·H·Q·T, PaLM appendix B (see ``FLOPS_FORMULA``)."""
        return palm_flops_per_token(self.num_matmul_params(), self.num_layers, self.num_heads, self.head_dim, seq_len)

    def forward_flops_per_token(self, context: int) -> float:
        """Inference FLOPs per token (forward only) = 2N + 4·L·H·Q·context: one third of the training form."""
        return 2.0 * self.num_matmul_params() + 4.0 * self.num_layers * self.num_heads * self.head_dim * context

    def kv_cache_bytes_per_token(self, dtype_bytes: float = 2.0) -> float:
        """K and V for every layer: 2 · L · kv_heads · head_dim · bytes (GQA-aware; 327,680 B for Llama-3.1-70B)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            params=self.num_params(),
            active_params=self.num_active_params(),
            matmul_params=self.num_matmul_params(),
            flops_formula=FLOPS_FORMULA,
        )
        return d

    # ---- constructors ----------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str | None = None, source: str = "config") -> ModelSpec:
        """Read an HF ``config.json`` dict (GPT-2, Llama, Qwen2, Mistral, Mixtral, Qwen-MoE field names).

        Raises a one-line ValueError naming ``source`` and the missing or bad field.
        """
        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: expected a mapping of HF config.json fields, got {type(cfg).__name__}")
        model_type = str(cfg.get("model_type", ""))
        is_gpt2 = model_type == "gpt2" or "n_embd" in cfg
        num_layers = int(_get(cfg, "num_layers", source))
        hidden = int(_get(cfg, "hidden_size", source))
        heads = int(_get(cfg, "num_heads", source))
        vocab = int(_get(cfg, "vocab_size", source))
        if min(num_layers, hidden, heads, vocab) <= 0:
            raise ValueError(f"{source}: layers, hidden size, heads and vocab_size must be > 0")
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or 0) or hidden // heads
        if not cfg.get("head_dim") and hidden % heads:
            raise ValueError(f"{source}: hidden size {hidden} is not divisible by num_attention_heads {heads}")
        if heads % kv_heads:
            raise ValueError(
                f"{source}: num_attention_heads {heads} is not divisible by num_key_value_heads {kv_heads}"
            )
        if is_gpt2:
            ffn = int(cfg.get("n_inner") or 4 * hidden)
            max_pos = int(cfg.get("n_positions") or cfg.get("n_ctx") or 0)
        else:
            if cfg.get("intermediate_size") is None:
                raise ValueError(f"{source}: missing field intermediate_size")
            ffn = int(cfg["intermediate_size"])
            max_pos = int(cfg.get("max_position_embeddings") or 0)
        if max_pos <= 0:
            raise ValueError(f"{source}: missing field {'n_positions' if is_gpt2 else 'max_position_embeddings'}")
        num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
        top_k = int(cfg.get("num_experts_per_tok") or 0)
        if num_experts and not 0 < top_k <= num_experts:
            raise ValueError(
                f"{source}: num_experts_per_tok must be in [1, {num_experts}] for an MoE model, got {top_k}"
            )
        if cfg.get("first_k_dense_replace"):
            raise ValueError(f"{source}: mixed dense/MoE layer stacks (first_k_dense_replace) are not modelled")
        if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) > 1:
            raise ValueError(
                f"{source}: mixed dense/MoE layer stacks (mlp_only_layers / decoder_sparse_step > 1) are not modelled"
            )
        if not num_experts:
            moe_fields = [
                k
                for k in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts")
                if cfg.get(k)
            ]
            if moe_fields:
                raise ValueError(
                    f"{source}: looks like an MoE model ({', '.join(moe_fields)}) but has no num_experts / "
                    "num_local_experts; refusing to plan it as a dense model"
                )
        return cls(
            name=name or str(cfg.get("_name_or_path") or model_type or "model"),
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=ffn,
            vocab_size=vocab,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", is_gpt2)),
            gated_mlp=not is_gpt2,
            learned_positions=is_gpt2,
            layernorm_bias=is_gpt2 and bool(cfg.get("bias", True)),
            attention_bias=bool(cfg.get("attention_bias", False)) or (is_gpt2 and bool(cfg.get("bias", True))),
            qkv_bias=model_type in ("qwen2", "qwen2_moe"),
            mlp_bias=bool(cfg.get("mlp_bias", False)) or (is_gpt2 and bool(cfg.get("bias", True))),
            num_experts=num_experts,
            experts_per_token=top_k if num_experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        )

    @classmethod
    def gpt2(
        cls,
        n_layer: int,
        n_head: int,
        n_embd: int,
        vocab_size: int = 50304,
        block_size: int = 1024,
        bias: bool = True,
        name: str | None = None,
    ) -> ModelSpec:
        """A GPT-2 shape the way 6A builds it (nanoGPT / ``phase6.config.pretrain.ModelConfig`` fields)."""
        return cls.from_hf_config(
            {
                "model_type": "gpt2",
                "n_layer": n_layer,
                "n_head": n_head,
                "n_embd": n_embd,
                "vocab_size": vocab_size,
                "n_positions": block_size,
                "bias": bias,
            },
            name=name or f"gpt2-{n_layer}L-{n_embd}",
        )

    @classmethod
    def from_trainer_config(cls, model: Any, name: str | None = None) -> ModelSpec:
        """The shape 6A's trainer builds from a ``phase6.config.pretrain.ModelConfig`` (configs/pretrain/model/):
        its padded vocabulary (the rows of wte / the tied lm_head), context, biases. The planner's GPT-2 presets
        point at those files, so the trainer and the planner read one description."""
        missing = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size") if not hasattr(model, k)]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}")
        return cls.gpt2(
            model.n_layer,
            model.n_head,
            model.n_embd,
            getattr(model, "padded_vocab_size", model.vocab_size),
            model.block_size,
            bias=getattr(model, "bias", True),
            name=name or getattr(model, "name", None),
        )

    @classmethod
    def from_fields(cls, fields: dict[str, Any], name: str | None = None, source: str = "config") -> ModelSpec:
        """A preset's fields: 6A's trainer description (``block_size``: configs/pretrain/model/) or HF config.json."""
        if "block_size" not in fields:
            return cls.from_hf_config(fields, name=name, source=source)
        from phase6.config.pretrain import ModelConfig

        try:
            trainer_cfg = ModelConfig(**fields)
        except TypeError as e:  # an unknown field
            raise ValueError(f"{source}: not a 6A model description ({e})") from e
        return cls.from_trainer_config(trainer_cfg, name=name)


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The stored fields of a preset (configs/plan/model/<name>.yaml): HF config.json fields, or 6A's trainer
    description that the file names in its Hydra defaults list (``- /pretrain/model@_here_: gpt2_124m``)."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"model: unknown preset {name!r}; known: {', '.join(list_presets())} "
            f"(or pass plan.hf_config=PATH/config.json)"
        )
    return _load_yaml_with_defaults(path)


def load_hf_fields(name: str) -> dict[str, Any]:
    """A preset as HF config.json fields (what transformers builds from): a 6A trainer description becomes the
    GPT2Config of the same shape (its real vocabulary: the HF export drops the padding rows)."""
    fields = load_preset(name)
    if "block_size" not in fields:
        return fields
    keys = ("n_layer", "n_head", "n_embd", "vocab_size")
    return {
        "name": fields.get("name", name),
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        **{k: fields[k] for k in keys},
        "n_positions": fields["block_size"],
        "n_ctx": fields["block_size"],
    }


def _load_yaml_with_defaults(path: Path) -> dict[str, Any]:
    """A group option's mapping with the ``/<group>@_here_: <option>`` entries of its defaults list merged in, in
    Hydra's order (entries before ``_self_`` are overridden by the file's own keys); what ``phase6 plan`` composes."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    defaults = data.pop("defaults", [])
    out: dict[str, Any] = {}
    own_merged = False
    for entry in defaults:
        if entry == "_self_":
            out.update(data)
            own_merged = True
            continue
        if not (isinstance(entry, dict) and len(entry) == 1):
            raise ValueError(f"{path}: defaults entry {entry!r} is not '/<group>@_here_: <option>'")
        ((group, option),) = entry.items()
        group_path, _, package = str(group).partition("@")
        if not group_path.startswith("/") or package != "_here_":
            raise ValueError(f"{path}: defaults entry {entry!r} is not '/<group>@_here_: <option>'")
        target = CONFIG_DIR / group_path.lstrip("/") / f"{option}.yaml"
        if not target.is_file():
            raise ValueError(f"{path}: defaults entry {entry!r}: no such file {target}")
        out.update(_load_yaml_with_defaults(target))
    if not own_merged:
        out.update(data)
    return out


# The Qwen2Config fields that fix a Qwen2 model's shapes and numerics (what a random-weight "dummy" model needs).
QWEN2_ARCH_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "hidden_act",
)


def qwen_config(name: str, **overrides: Any) -> dict[str, Any]:
    """``transformers.Qwen2Config`` keyword arguments of a Qwen2 preset (``QWEN2_ARCH_FIELDS``), with ``overrides``."""
    preset = load_preset(name)
    missing = [k for k in QWEN2_ARCH_FIELDS if k not in preset]
    if missing:
        raise ValueError(f"model preset {name}: missing Qwen2 field(s) {', '.join(missing)}")
    return {k: preset[k] for k in QWEN2_ARCH_FIELDS} | overrides


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read an HF ``config.json`` (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"plan.hf_config: no such file {str(p)!r}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return data


def resolve_model(model: dict[str, Any] | str, hf_config: str | None = None) -> ModelSpec:
    """The ModelSpec for a plan run: ``hf_config`` (a config.json path) wins over the composed preset fields."""
    if hf_config:
        return ModelSpec.from_hf_config(load_hf_config(hf_config), name=Path(hf_config).stem, source=str(hf_config))
    if isinstance(model, str):
        return ModelSpec.from_fields(load_preset(model), name=model, source=f"configs/plan/model/{model}.yaml")
    fields = {k: v for k, v in model.items() if k != "name"}
    name = str(model.get("name") or fields.get("_name_or_path") or "model")
    return ModelSpec.from_fields(fields, name=name, source=f"model ({name})")
