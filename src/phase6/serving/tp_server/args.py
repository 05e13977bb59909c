"""The server's command line: one dataclass whose fields (names, types, defaults, docstrings) generate the parser.

No torch here: `phase6 fleet` (fleet/compare.py) reads these defaults to replay a torch-tp run on a CPU machine."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ENGINE = "torch-tp"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DTYPES = ("bfloat16", "float16", "float32")
"""--dtype values besides auto; each names a torch dtype (``getattr(torch, name)``, server.py)."""


@dataclass
class ServerArgs:
    """Command-line options of the server: ``--max-batch`` is the field ``max_batch``; its docstring is the help."""

    model: str
    """local HF model directory, or a config.json with --dummy-weights"""
    tokenizer: str | None = None
    """tokenizer directory (default: the model directory if it has one)"""
    dummy_weights: bool = False
    """random weights from the config (performance work)"""
    dtype: str = "auto"
    """auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float16 | float32"""
    host: str = "127.0.0.1"
    """HTTP bind address (loopback only)"""
    port: int = 8000
    """HTTP port (0 = any free port, printed at startup)"""
    max_batch: int = 64
    """KV-cache rows = max concurrently running requests"""
    max_model_len: int = 4096
    """KV-cache positions per row (prompt + output)"""
    max_prefill_tokens: int = 8192
    """padded prompt tokens prefilled per step"""
    seed: int = 0
    """dummy-weight init and default sampling seed"""
    served_model_name: str | None = None
    """model id at /v1/models (default: --model)"""
    device: str = "auto"
    """auto | cpu | cuda"""
    cuda_graphs: bool = False
    """decode steps as CUDA graphs per (batch, KV length) bucket, checked against eager at start"""
    compile_prefill: bool = False
    """prefill through torch.compile per decoder layer (dynamic shapes), compiled for every shape class at start:
    fused kernels instead of the eager forward's Python-level ops"""

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ValueError(f"{key}: {msg}")

        need(
            self.dtype == "auto" or self.dtype in DTYPES,
            "--dtype",
            f"must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}",
        )
        need(
            self.host in LOOPBACK_HOSTS,
            "--host",
            f"binds loopback only ({', '.join(LOOPBACK_HOSTS)}), got {self.host!r}",
        )
        need(0 <= self.port < 65536, "--port", f"must be in [0, 65535], got {self.port}")
        need(self.max_batch >= 1, "--max-batch", f"must be >= 1, got {self.max_batch}")
        need(self.max_model_len >= 2, "--max-model-len", f"must be >= 2, got {self.max_model_len}")
        need(self.max_prefill_tokens >= 1, "--max-prefill-tokens", f"must be >= 1, got {self.max_prefill_tokens}")
        need(self.device in ("auto", "cpu", "cuda"), "--device", f"must be auto, cpu or cuda, got {self.device!r}")
        path = Path(self.model)
        need(
            path.is_dir() or (path.is_file() and path.suffix == ".json"),
            "--model",
            f"{self.model!r} is not a local model directory or config.json (this server never downloads)",
        )
        need(
            self.dummy_weights or path.is_dir(),
            "--model",
            f"{self.model!r} is a config file: real weights need a model directory, or pass --dummy-weights",
        )
        tok = self.tokenizer_path()
        need(tok is None or tok.is_dir(), "--tokenizer", f"{self.tokenizer!r} is not a local directory")

    def tokenizer_path(self) -> Path | None:
        """--tokenizer, else the model directory when it holds tokenizer files, else None (token-id prompts only)."""
        if self.tokenizer is not None:
            return Path(self.tokenizer)
        d = Path(self.model) if Path(self.model).is_dir() else Path(self.model).parent
        has = any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
        return d if has else None


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal right under it} of a dataclass, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


# the field annotations (strings under `from __future__ import annotations`) -> argparse type
_TYPES = {"str": str, "str | None": str, "int": int}


def build_parser() -> argparse.ArgumentParser:
    """One ``--flag-name`` per ServerArgs field: a field without a default is required, a bool is a switch."""
    p = argparse.ArgumentParser(
        prog="phase6.serving.tp_server",
        description="Tensor-parallel OpenAI-compatible server for machines without vLLM/SGLang (engine torch-tp).",
    )
    docs = field_docs(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        assert f.name in docs, f"ServerArgs.{f.name} needs a docstring (its --help text)"
        if f.type == "bool":
            assert f.default is False, f"ServerArgs.{f.name}: a switch defaults to False"
            p.add_argument(flag, action="store_true", help=docs[f.name])
        elif f.default is dataclasses.MISSING:
            p.add_argument(flag, type=_TYPES[str(f.type)], required=True, help=docs[f.name])
        else:
            p.add_argument(flag, type=_TYPES[str(f.type)], default=f.default, help=docs[f.name])
    return p


def parse_args(argv: Sequence[str] | None = None) -> ServerArgs:
    ns = build_parser().parse_args(argv)
    return ServerArgs(**vars(ns))
