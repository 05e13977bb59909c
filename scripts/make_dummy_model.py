"""Write a weight-free model directory for `phase6.serving.tp_server --dummy-weights`: config.json + a tokenizer.

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    python scripts/make_dummy_model.py llama3.1-8b outputs/models/llama3.1-8b     # any configs/plan/model preset

The architecture is the published config.json (real vocabulary, so embedding and LM-head work are the real
model's); the server initialises random weights on the GPUs from it, nothing is downloaded or written but a few
KB. The tokenizer is the byte-level BPE (4096 ids) that phase6.serving.tiny trains on the standard library's
docstrings, as for the other random models of 6B: prompts are real text, and the server samples only ids the
tokenizer can decode. Existing directories are left as they are.

``--full-vocab`` (engines that sample the whole vocabulary, e.g. vLLM): the same 4096-id BPE (same merges, so every
prompt encodes to the same ids and lengths) plus one filler word per remaining id up to the config's vocab_size
(`` aaa``, `` aab``, ...), so every id a random model samples decodes to text: vLLM's detokenizer would otherwise
turn the ~97 % of ids the tokenizer lacks into empty text, which streams as empty chunks. The torch-tp server then
samples the whole vocabulary too (as a real checkpoint would); the work per step is unchanged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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


def fill_vocab(tok: Any, vocab_size: int) -> Any:
    """``tok`` (a byte-level BPE PreTrainedTokenizerFast) with filler words at ids len(tok)..vocab_size-1."""
    import itertools
    import string

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    need = vocab_size - len(tok)
    if need <= 0:
        return tok
    words = (
        "\u0120" + "".join(c) for n in itertools.count(3) for c in itertools.product(string.ascii_lowercase, repeat=n)
    )
    next_id = max(vocab.values()) + 1
    for w in words:
        if need == 0:
            break
        if w not in vocab:
            vocab[w] = next_id
            next_id += 1
            need -= 1
    # the added (special) tokens sit inside the first ids; the new ones continue after the model's last id
    full = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=tok.eos_token,
        pad_token=tok.pad_token,
        bos_token=None,
        unk_token=None,
    )
    full.chat_template = tok.chat_template
    if len(full) != vocab_size:
        raise SystemExit(f"make_dummy_model: filled tokenizer has {len(full)} ids, expected {vocab_size}")
    return full


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arch", help=f"{', '.join(BUILTIN)} or a configs/plan/model preset")
    p.add_argument("out", type=Path, help="directory to write (kept if it already has config.json and tokenizer)")
    p.add_argument("--full-vocab", action="store_true", help="filler words up to the config's vocab_size (vLLM)")
    a = p.parse_args()
    if (a.out / "config.json").is_file() and (a.out / "tokenizer.json").is_file():
        print(f"{a.out}: exists, kept")
        return
    from phase6.posttrain.tiny import build_tiny_tokenizer
    from phase6.serving.tiny import stdlib_corpus

    fields = architecture(a.arch)
    a.out.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer(stdlib_corpus(), vocab_size=TOKENIZER_VOCAB)
    if a.full_vocab:
        tok = fill_vocab(tok, int(fields["vocab_size"]))
    tok.save_pretrained(a.out)
    (a.out / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    print(f"{a.out}: {a.arch} config.json (vocab {fields['vocab_size']}) + {len(tok)}-id tokenizer")


if __name__ == "__main__":
    main()
