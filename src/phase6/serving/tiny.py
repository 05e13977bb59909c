"""Random-weight chat models saved as HF directories, for `transformers serve` without hub access.

- ``tiny``: a 2-layer, 64-wide Qwen2 (~0.1M parameters) with the 6C/6D ChatML tokenizer
  (``phase6.posttrain.tiny``): the CPU smoke run and the end-to-end test (~1 s to build).
- ``tiny-vllm``: the same at width 128 (4 heads of 32, 2 KV heads; ~0.3M parameters): vLLM's CPU attention
  supports head sizes 32, 64, 80 and up, not tiny's 16 (``experiment=smoke_vllm``).
- a planner preset (``configs/plan/model/<name>.yaml``, the model's real config.json fields), e.g. ``llama3.1-8b``:
  the real architecture with random bf16 weights and the vocabulary cut to the local tokenizer, the GPU-table
  stand-in when no weights can be downloaded ("dummy weights", like vLLM's ``--load-format dummy``). Per-token
  compute and HBM traffic are the real model's minus the embedding/LM-head rows of the cut vocabulary.

The tokenizer is a byte-level BPE trained on the docstrings of Python's standard library (always present, so no
data files are needed).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

STDLIB_MODULES = (
    "json",
    "asyncio",
    "collections",
    "functools",
    "itertools",
    "pathlib",
    "subprocess",
    "typing",
    "argparse",
    "dataclasses",
    "statistics",
    "random",
    "string",
    "textwrap",
    "urllib.parse",
    "os",
    "re",
    "socket",
    "threading",
    "email.message",
    "http.client",
    "inspect",
    "logging",
    "unittest",
)


TINY_WIDTH = {"tiny": 64, "tiny-vllm": 128}
"""Hidden size of the built-in tiny kinds (2 layers, 4 query / 2 KV heads)."""


def stdlib_corpus() -> list[str]:
    """Docstrings of standard-library modules and their members: a few hundred KB of English and code."""
    texts: list[str] = []
    for name in STDLIB_MODULES:
        mod = importlib.import_module(name)
        texts.append(inspect.getdoc(mod) or "")
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return [t for t in texts if t]


def build_random_chat_model(out_dir: str | Path, kind: str = "tiny", seed: int = 0) -> Path:
    """Write config, random weights, tokenizer and chat template of ``kind`` to ``out_dir`` (kept if present)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from phase6.plan.model import load_hf_fields
    from phase6.posttrain.tiny import build_tiny_tokenizer

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    small = kind in TINY_WIDTH
    tok = build_tiny_tokenizer(stdlib_corpus(), vocab_size=512 if small else 4096)
    if small:
        fields = {
            "model_type": "qwen2",
            "hidden_size": TINY_WIDTH[kind],
            "intermediate_size": 2 * TINY_WIDTH[kind],
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
        }
    else:
        fields = {k: v for k, v in load_hf_fields(kind).items() if k not in ("name", "architectures", "torch_dtype")}
    # Untied LM head: with tied embeddings a random model's greedy argmax repeats its input token forever
    # (one "\n" after the chat template), and `transformers serve` then streams the whole answer as one chunk.
    fields.update(
        vocab_size=len(tok),
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    big = not small
    device = "cuda" if big and torch.cuda.is_available() else "cpu"  # 8B random init on CPU takes minutes
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if big else torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" on stderr: a one-line error must stay one line
    try:
        tok.save_pretrained(out)
        model.save_pretrained(out)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    del model
    if big and torch.cuda.is_available():
        torch.cuda.empty_cache()  # the server process needs this GPU's memory for the same weights and its KV cache
    return out
