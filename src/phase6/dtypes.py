"""phase6's dtype names and the one place they become torch dtypes or an external library's spelling.

Every phase6 config key spells a dtype ``bf16`` or ``fp32`` (``phase6.config.DTYPE_NAMES``; ``auto`` where a job
allows it). transformers, lm-eval, vLLM and SGLang spell them ``bfloat16`` / ``float32``: ``engine_dtype`` translates
at the call site. A value passed verbatim to an engine's own flag (serve-bench's ``serve.dtype`` -> ``--dtype``) keeps
the engine's spelling and never comes through here.
"""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}
ENGINE_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp32": "float32"}
"""transformers ``dtype=`` / lm-eval ``model_args`` / vLLM ``--dtype`` names."""


def torch_dtype(name: str) -> torch.dtype:
    """``bf16`` -> torch.bfloat16, ``fp32`` -> torch.float32."""
    return TORCH_DTYPES[name]


def engine_dtype(name: str) -> str:
    """``bf16`` -> ``bfloat16``, ``fp32`` -> ``float32`` (the spelling of transformers, lm-eval, vLLM, SGLang)."""
    return ENGINE_DTYPES[name]


def hf_load_dtype(name: str, cuda: bool) -> torch.dtype | str:
    """``from_pretrained(dtype=...)`` of an HF model config's dtype (bf16 | fp32 | auto = the checkpoint's own). bf16
    weights on a CPU-only machine would run every matmul through slow emulated bf16 kernels, so they load as fp32."""
    if name == "auto":
        return "auto"
    return torch_dtype("fp32" if name == "bf16" and not cuda else name)
