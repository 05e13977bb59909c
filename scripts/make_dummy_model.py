"""Write a weight-free model directory for `phase6.serving.tp_server --dummy-weights`: config.json + a tokenizer.

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    python scripts/make_dummy_model.py llama3.1-8b outputs/models/llama3.1-8b     # any configs/plan/model preset

The architecture is the published config.json (real vocabulary, so embedding and LM-head work are the real
model's); the server initialises random weights on the GPUs from it, nothing is downloaded or written but a few
KB. The tokenizer is the byte-level BPE (4096 ids) that phase6.serving.tiny trains on the standard library's
docstrings, as for the other random models of 6B: prompts are real text, and the server samples only ids the
tokenizer can decode. Existing directories are left as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json (base model; read via the copy in
# github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md, 2026-11-29): 14.77B parameters (13.2B without embeddings).
QWEN25_14B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 13824,
    "max_position_embeddings": 131072,
    "max_window_layers": 48,
    "model_type": "qwen2",
    "num_attention_heads": 40,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
BUILTIN = {"qwen2.5-14b": QWEN25_14B}
TOKENIZER_VOCAB = 4096


def architecture(name: str) -> dict[str, object]:
    """config.json fields: a built-in architecture above, else a planner preset (configs/plan/model/<name>.yaml)."""
    if name in BUILTIN:
        return dict(BUILTIN[name])
    from phase6.plan.model import load_preset

    return {k: v for k, v in load_preset(name).items() if k != "name"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arch", help=f"{', '.join(BUILTIN)} or a configs/plan/model preset")
    p.add_argument("out", type=Path, help="directory to write (kept if it already has config.json and tokenizer)")
    a = p.parse_args()
    if (a.out / "config.json").is_file() and (a.out / "tokenizer.json").is_file():
        print(f"{a.out}: exists, kept")
        return
    from phase6.posttrain.tiny import build_tiny_tokenizer
    from phase6.serving.tiny import stdlib_corpus

    fields = architecture(a.arch)
    a.out.mkdir(parents=True, exist_ok=True)
    build_tiny_tokenizer(stdlib_corpus(), vocab_size=TOKENIZER_VOCAB).save_pretrained(a.out)
    (a.out / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    print(f"{a.out}: {a.arch} config.json (vocab {fields['vocab_size']}) + {TOKENIZER_VOCAB}-id tokenizer")


if __name__ == "__main__":
    main()
