"""Tensor-parallel OpenAI-compatible server for machines without vLLM/SGLang (6B rows at TP=1, 2, 4; issue 10).

Launch (rank 0 serves HTTP on --host:--port; TP=1 is the same program without torchrun):

    python -m phase6.serving.tp_server --model <dir|config.json> --dummy-weights --dtype bfloat16 --port 8000
    torchrun --standalone --nproc_per_node 4 -m phase6.serving.tp_server --model outputs/models/qwen2.5-14b \
        --dummy-weights --dtype bfloat16 --port 8000 --max-batch 64 --cuda-graphs

The 6B table on an H200 node (engine torch-tp of `phase6 serve-bench`; one command per TP, server reused across
the three concurrencies):

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b
    phase6 serve-bench -m experiment=gpu_h200_tp serve.tp=4 load.concurrency=1,16,64

Endpoints: GET /health, GET /v1/models, GET /version, GET /metrics (vLLM metric names, so the 6B scraper reads them),
POST /v1/completions and /v1/chat/completions (stream with ``data: {...}`` chunks, ``stream_options.include_usage``
-> a final usage chunk, ``continuous_usage_stats`` -> usage on every chunk, ``ignore_eos``, ``min_tokens``, then
``data: [DONE]``). A malformed request gets HTTP 400 with a one-line reason; the server keeps running.

Model: ``AutoModelForCausalLM`` from a local directory (weights) or, with ``--dummy-weights``, from its config with
the model's own random init on the target device (seeded; TP ranks take rank 0's weights, so TP=N serves exactly
the model TP=1 serves for the same seed). Nothing is downloaded.

Tensor parallelism (Megatron-style, the plan the model declares): ``config.base_model_tp_plan`` + the causal-LM
class's ``_tp_plan`` (Llama/Qwen2/Qwen3/Mistral: q/k/v, gate/up "colwise"; o, down "rowwise"; lm_head
"colwise_gather_output"). Colwise Linears keep their 1/N slice of output features (whole heads, so attention runs
on local heads unchanged); rowwise Linears keep 1/N of input features and all-reduce their output in a forward
hook; lm_head all-gathers the vocabulary slices. Plain local tensors rather than DTensor ``parallelize_module``:
measured on this repo's torch 2.13 (CPU), a DTensor ColwiseParallel Linear costs ~115 us per call against 9 us
plain, i.e. ~40 ms of host overhead per decode step for 48 layers x 7 Linears, which would be measured as
"TP cost". Embeddings and norms are replicated.

Batching: continuous (iteration-level). A static KV cache holds ``--max-batch`` rows of ``--max-model-len``
positions per layer; active requests occupy rows [0, n) (a finished request's row is refilled by moving the last
row's KV into it). Every iteration rank 0 decides one step: the row moves, one decode token for every running
request, and a prefill of newly admitted requests (FCFS, at most ``--max-prefill-tokens`` padded tokens; new rows
get their first token from the prefill). The HF model runs with explicit ``position_ids``, a 4-D boolean mask and
the slot cache as ``past_key_values`` (its attention layers only call ``cache.update``); masked attention packs the
query heads of each KV head into one SDPA call (``gqa_sdpa_attention``) instead of HF's per-head K/V copies.
``--cuda-graphs``: decode steps are padded to (batch, KV length) buckets and replayed as CUDA graphs captured at
start on every rank (collectives included), after a check against eager decoding.
``--compile-prefill``: prefill runs each decoder layer through ``torch.compile`` (dynamic shapes; one set of
compiled graphs reused by every layer) instead of eagerly: a few fused kernels per layer instead of ~70 Python-level
ops (the engine thread shares the GIL with the HTTP thread). Alone on a GPU the step is within +-10 % of eager
(projects/6b_serving/bench_prefill.py, docs/benchmarks.md). The graphs are compiled at start on every rank, for
every shape class a step can take (one prompt or several), so no compile happens while serving.

Lockstep: rank 0 broadcasts each step (a small int64 header + payload on a gloo group, off the GPU stream) before
any rank computes; all ranks then run identical forwards with identical collectives. Only rank 0 samples
(greedy, or seeded per request); sampled tokens reach the other ranks as the next step's payload, so ranks never
diverge. SIGTERM/SIGINT on rank 0 drains HTTP, broadcasts STOP, and every rank exits 0; other ranks ignore
SIGTERM and wait for STOP (torchrun kills them if rank 0 dies first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import json
import logging
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ENGINE = "torch-tp"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TP_STYLES = ("colwise", "rowwise", "colwise_gather_output")

# Step commands broadcast by rank 0 (header[0]).
CMD_STEP, CMD_NOOP, CMD_STOP = 1, 2, 3
HEADER_LEN = 8
IDLE_HEARTBEAT_S = 30.0  # an idle rank 0 sends NOOP this often, far inside the control group's timeout

log = logging.getLogger("phase6.tp_server")
# transformers >= 5.18 renamed the model kwarg past_key_values -> cache (alias kept until 5.40); the GPU image has
# 5.17, which only knows past_key_values, so the server passes that and silences the rename notice.
warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)


# ----------------------------------------------------------------------------------------------------------------
# Arguments


@dataclass
class ServerArgs:
    """Command-line options of the server (see ``build_parser`` for the help texts)."""

    model: str
    tokenizer: str | None = None
    dummy_weights: bool = False
    dtype: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 64
    max_model_len: int = 4096
    max_prefill_tokens: int = 8192
    seed: int = 0
    served_model_name: str | None = None
    device: str = "auto"
    cuda_graphs: bool = False
    compile_prefill: bool = False

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="phase6.serving.tp_server", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local HF model directory, or a config.json with --dummy-weights")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory if it has one)")
    p.add_argument("--dummy-weights", action="store_true", help="random weights from the config (performance work)")
    p.add_argument(
        "--dtype", default="auto", help="auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float16 | float32"
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (loopback only)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0 = any free port, printed at startup)")
    p.add_argument("--max-batch", type=int, default=64, help="KV-cache rows = max concurrently running requests")
    p.add_argument("--max-model-len", type=int, default=4096, help="KV-cache positions per row (prompt + output)")
    p.add_argument("--max-prefill-tokens", type=int, default=8192, help="padded prompt tokens prefilled per step")
    p.add_argument("--seed", type=int, default=0, help="dummy-weight init and default sampling seed")
    p.add_argument("--served-model-name", default=None, help="model id at /v1/models (default: --model)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode steps as CUDA graphs per (batch, KV length) bucket, checked against eager at start",
    )
    p.add_argument(
        "--compile-prefill",
        action="store_true",
        help="prefill through torch.compile per decoder layer (dynamic shapes), compiled for every shape class at "
        "start: fused kernels instead of the eager forward's Python-level ops",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> ServerArgs:
    ns = build_parser().parse_args(argv)
    return ServerArgs(**vars(ns))


# ----------------------------------------------------------------------------------------------------------------
# Model: load, tensor-parallel split


def load_config(model: str) -> Any:
    """AutoConfig of a model directory or of a bare config.json (fields written by hand for dummy runs)."""
    from transformers import AutoConfig

    path = Path(model)
    if path.is_dir():
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read config JSON ({e})") from e
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError(f'{path}: key \'model_type\' missing (e.g. "llama", "qwen2")')
    model_type = fields.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as e:
        raise ValueError(f"{path}: model_type {model_type!r}: {e}") from e


def build_model(args: ServerArgs, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The full (unsharded) causal LM on ``device``: random init from config, or the directory's weights."""
    from transformers import AutoModelForCausalLM

    if args.dummy_weights:
        config = load_config(args.model)
        torch.manual_seed(args.seed)
        with torch.device(device):  # the model's own _init_weights, run on the device (seconds for 14B on a GPU)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=dtype, attn_implementation="sdpa", device_map={"": device}, trust_remote_code=False
        )
    apply_gqa_sdpa(model)
    return model.eval().requires_grad_(False)


def apply_gqa_sdpa(model: nn.Module) -> None:
    """Masked attention through ``gqa_sdpa_attention`` (registered with transformers' AttentionInterface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
    model.config._attn_implementation = GQA_SDPA  # read by every attention layer at call time


GQA_SDPA = "phase6_gqa_sdpa"


def gqa_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA with the query heads of one KV head packed into the query length, so K/V are read once.

    transformers 5.17 (the GPU image) repeats K/V to every query head whenever a mask is given (``repeat_kv``),
    i.e. rewrites the whole cache (Hq/Hkv = 5x for Qwen2.5-14B) in every layer of every step. Query (B, Hq, T, D)
    -> (B, Hkv, g*T, D) with g = Hq/Hkv (head h belongs to KV head h // g, as in repeat_kv); mask (B, 1, T, L) ->
    (B, 1, g*T, L). Without a mask (plain causal forward) this is HF's own SDPA path.
    """
    if attention_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    q = query.reshape(b, hkv, g * t, d)
    mask = attention_mask[:, :, None].expand(b, 1, g, t, attention_mask.shape[-1]).reshape(b, 1, g * t, -1)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, hq, t, d).transpose(1, 2).contiguous(), None  # (B, T, Hq, D) as HF expects


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The TP plan the model declares: config.base_model_tp_plan (under the base-model prefix) + class _tp_plan."""
    prefix = model.base_model_prefix
    plan = {f"{prefix}.{k}": v for k, v in (getattr(model.config, "base_model_tp_plan", None) or {}).items()}
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    return plan


def _all_reduce_hook(group: dist.ProcessGroup | None, bias: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(out, group=group)  # sum of the N partial products (rowwise split of the input features)
        return out if bias is None else out + bias

    return hook


def _all_gather_hook(group: dist.ProcessGroup | None, world: int) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.contiguous()
        parts = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(parts, out, group=group)
        return torch.cat(parts, dim=-1)  # (..., V): rank r holds vocabulary slice r

    return hook


def apply_tp(model: nn.Module, rank: int, world: int, group: dist.ProcessGroup | None = None) -> dict[str, str]:
    """Keep this rank's slice of every Linear in the model's TP plan and install the collectives; returns
    {module name: style} of what was split. ValueError names the config key that does not divide by ``world``."""
    if world == 1:
        return {}
    cfg = model.config
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = getattr(cfg, key, None)
        if value is not None and value % world:
            raise ValueError(f"config.{key} = {value} is not divisible by the tensor-parallel size {world}")
    plan = tp_plan(model)
    if not plan:
        raise ValueError(f"model_type {cfg.model_type!r} declares no tensor-parallel plan (config.base_model_tp_plan)")
    done: dict[str, str] = {}
    for name, module in model.named_modules():
        style = next((s for pat, s in plan.items() if fnmatch.fnmatchcase(name, pat)), None)
        if style is None:
            continue
        if style not in TP_STYLES:
            raise ValueError(
                f"tp plan of {cfg.model_type!r}: style {style!r} at {name!r} is not supported "
                f"(supported: {', '.join(TP_STYLES)})"
            )
        if not isinstance(module, nn.Linear):
            raise ValueError(f"tp plan of {cfg.model_type!r}: {name!r} is a {type(module).__name__}, not nn.Linear")
        w = module.weight
        if style in ("colwise", "colwise_gather_output"):
            module.weight = nn.Parameter(w.detach().chunk(world, dim=0)[rank].clone(), requires_grad=False)
            if module.bias is not None:
                module.bias = nn.Parameter(module.bias.detach().chunk(world)[rank].clone(), requires_grad=False)
            module.out_features = module.weight.shape[0]
            if style == "colwise_gather_output":
                module.register_forward_hook(_all_gather_hook(group, world))
        else:
            module.weight = nn.Parameter(w.detach().chunk(world, dim=1)[rank].clone(), requires_grad=False)
            module.in_features = module.weight.shape[1]
            bias = module.bias.detach().clone() if module.bias is not None else None
            module.bias = None  # added once, after the reduction
            module.register_forward_hook(_all_reduce_hook(group, bias))
        done[name] = style
    if not done:
        raise ValueError(f"tp plan of {cfg.model_type!r} matched no module: {sorted(plan)}")
    return done


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's stack of decoder layers: the ModuleList of ``config.num_hidden_layers`` blocks."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return list(module)
    raise ValueError(f"model {type(model).__name__}: no ModuleList of config.num_hidden_layers = {n} decoder layers")


def broadcast_weights(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Every rank gets rank 0's parameters and buffers (dummy weights: identical model whatever the RNG did)."""
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0, group=group)


# ----------------------------------------------------------------------------------------------------------------
# Static KV cache with one row per running request


class SlotKVCache:
    """Per layer K and V of shape (max_batch, kv_heads_local, max_len, head_dim), preallocated.

    Passed to the HF model as ``past_key_values``: each attention layer calls ``update(k, v, layer_idx)`` with the
    step's new keys (rows, kv_heads, T, head_dim); they are written at the bound positions of the bound rows, and
    the rows' cache up to ``kv_len`` comes back (a view, no copy). Positions and the mask are given to the model
    explicitly, so no sequence-length query is needed.
    """

    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (max_batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_batch, self.max_len = max_batch, max_len
        self._rows = slice(0, 0)
        self._positions = torch.zeros(0, 0, dtype=torch.long, device=device)
        self._kv_len = 0
        self._fresh = False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def bind(self, row0: int, positions: torch.Tensor, kv_len: int, fresh: bool = False) -> None:
        """The next forward writes rows [row0, row0 + B) at ``positions`` (B, T) and attends to [0, kv_len).
        ``fresh``: a prefill from position 0, whose attention needs only its own keys and values (kv_len = T)."""
        assert positions.dim() == 2 and row0 + positions.shape[0] <= self.max_batch and kv_len <= self.max_len
        assert not fresh or kv_len == positions.shape[1]
        self._rows = slice(row0, row0 + positions.shape[0])
        self._positions = positions
        self._kv_len = kv_len
        self._fresh = fresh

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fresh:  # the step's own K/V are the whole context: attend to them, store them on the side
            self._store(key, value, layer_idx)
            return key, value
        k, v = self._store(key, value, layer_idx)
        return k[:, :, : self._kv_len], v[:, :, : self._kv_len]

    @torch.compiler.disable
    def _store(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's K/V into the bound rows; returns those rows' cache views. Run eagerly under a compiled
        prefill (a graph break): the layer index and the first row stay runtime values, not graph constants."""
        idx = self._positions[:, None, :, None].expand_as(key)  # (B, H, T, D)
        k, v = self.k[layer_idx][self._rows], self.v[layer_idx][self._rows]
        k.scatter_(2, idx, key)
        v.scatter_(2, idx, value)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def move(self, src: int, dst: int, length: int) -> None:
        """Row ``dst`` takes row ``src``'s first ``length`` positions (compaction after a request finished)."""
        for t in (*self.k, *self.v):
            t[dst, :, :length] = t[src, :, :length]


# ----------------------------------------------------------------------------------------------------------------
# One engine step: what rank 0 broadcasts and every rank executes


@dataclass
class StepPlan:
    """Rows [0, len(decode_tokens)) decode one token each; rows after them prefill ``prefill_prompts``."""

    moves: list[tuple[int, int, int]] = field(default_factory=list)
    """(src row, dst row, KV length) compaction copies, applied in order before the forward."""
    decode_tokens: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    prefill_prompts: list[list[int]] = field(default_factory=list)

    def encode(self, cmd: int = CMD_STEP) -> tuple[torch.Tensor, torch.Tensor]:
        n_pre = len(self.prefill_prompts)
        max_len = max((len(p) for p in self.prefill_prompts), default=0)
        payload = [x for m in self.moves for x in m] + self.decode_tokens + self.decode_positions
        payload += [len(p) for p in self.prefill_prompts]
        for p in self.prefill_prompts:
            payload += p + [0] * (max_len - len(p))
        header = [cmd, len(self.moves), len(self.decode_tokens), n_pre, max_len, len(payload), 0, 0]
        return torch.tensor(header, dtype=torch.long), torch.tensor(payload, dtype=torch.long)

    @staticmethod
    def payload_len(header: torch.Tensor) -> int:
        return int(header[5])

    @classmethod
    def decode(cls, header: torch.Tensor, payload: torch.Tensor) -> StepPlan:
        _, n_moves, n_dec, n_pre, max_len = (int(x) for x in header[:5])
        vals = payload.tolist()
        i = 0
        moves = [(vals[i + 3 * j], vals[i + 3 * j + 1], vals[i + 3 * j + 2]) for j in range(n_moves)]
        i += 3 * n_moves
        dec_tok, dec_pos = vals[i : i + n_dec], vals[i + n_dec : i + 2 * n_dec]
        i += 2 * n_dec
        lens = vals[i : i + n_pre]
        i += n_pre
        prompts = [vals[i + j * max_len : i + j * max_len + lens[j]] for j in range(n_pre)]
        return cls(moves, dec_tok, dec_pos, prompts)


class Engine:
    """The sharded model + KV cache of one rank; ``execute`` runs a step, identically on every rank."""

    def __init__(
        self,
        model: nn.Module,
        args: ServerArgs,
        device: torch.device,
        rank: int,
        world: int,
        ctrl_group: dist.ProcessGroup | None,
        static_decode: bool = False,
        cuda_graphs: bool = False,
        compile_prefill: bool = False,
    ) -> None:
        cfg = model.config
        self.model, self.device, self.rank, self.world, self.ctrl = model, device, rank, world, ctrl_group
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        dtype = next(model.parameters()).dtype
        self.cache = SlotKVCache(
            cfg.num_hidden_layers, args.max_batch, kv_heads // world, args.max_model_len, head_dim, dtype, device
        )
        self.vocab_size = cfg.vocab_size
        # Static decode: every decode step is padded to a (batch, KV length) bucket and reads its inputs from fixed
        # buffers, so the step can be one CUDA graph per bucket (cuda_graphs) -- or run eagerly (CPU tests).
        self.static_decode = static_decode or cuda_graphs
        self.cuda_graphs = cuda_graphs
        mb, ml = args.max_batch, args.max_model_len
        self.batch_buckets = sorted({min(mb, 1 << i) for i in range(mb.bit_length() + 1)})
        # KV lengths: 128, 256, 512, then every 512 (a step attends to at most 1.5x its longest row beyond 1024)
        self.kv_buckets = sorted({min(ml, 128 << i) for i in range(3)} | set(range(1024, ml, 512)) | {ml})
        self.g_ids = torch.zeros(mb, 1, dtype=torch.long, device=device)
        self.g_pos = torch.zeros(mb, 1, dtype=torch.long, device=device)
        self.g_mask = torch.zeros(mb, 1, 1, ml, dtype=torch.bool, device=device)
        self.g_keys = torch.arange(ml, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.layers = decoder_layers(model)
        self._eager_layer_fwd = [layer.forward for layer in self.layers]
        self._compiled_layer_fwd: list[Callable[..., Any]] = []
        self.compile_prefill = compile_prefill
        self.graphs_at_start: int | None = None
        """Compiled graphs after warm_prefill; a later compile is logged (a stall of seconds while serving)."""
        if compile_prefill:
            from torch import _dynamo

            # Each layer hands its own ``layer_idx`` (an int on the module) to the cache write, which runs eagerly
            # (SlotKVCache._store, a graph break); kept a runtime value instead of a graph constant, it lets every
            # layer share the same graphs: the layer's fragments x (one prompt / several) = 8 graphs (4 per class).
            _dynamo.config.allow_unspec_int_on_nn_module = True
            _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, 16)
            self._compiled_layer_fwd = [torch.compile(f, dynamic=True) for f in self._eager_layer_fwd]

    # -- control plane: rank 0 -> all ------------------------------------------------------------------------

    def send(self, cmd: int, plan: StepPlan | None = None) -> None:
        header, payload = (plan or StepPlan()).encode(cmd)
        if self.world > 1:
            dist.broadcast(header, src=0, group=self.ctrl)
            if payload.numel():
                dist.broadcast(payload, src=0, group=self.ctrl)

    def receive(self) -> tuple[int, StepPlan]:
        header = torch.zeros(HEADER_LEN, dtype=torch.long)
        dist.broadcast(header, src=0, group=self.ctrl)
        payload = torch.zeros(StepPlan.payload_len(header), dtype=torch.long)
        if payload.numel():
            dist.broadcast(payload, src=0, group=self.ctrl)
        return int(header[0]), StepPlan.decode(header, payload)

    def follow(self) -> None:
        """Ranks > 0: execute whatever rank 0 broadcasts until STOP."""
        with torch.inference_mode():
            while True:
                cmd, plan = self.receive()
                if cmd == CMD_STOP:
                    return
                if cmd == CMD_STEP:
                    self.execute(plan)

    # -- data plane ------------------------------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        row0: int,
        kv_len: int,
        fresh: bool = False,
    ) -> torch.Tensor:
        self.cache.bind(row0, positions, kv_len, fresh)
        out = self.base(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        return out.last_hidden_state  # (B, T, hidden)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Run one step; returns float32 logits (decode rows, then prefill rows; (rows, vocab)) or None."""
        for src, dst, length in plan.moves:
            self.cache.move(src, dst, length)
        logits: list[torch.Tensor] = []
        n_dec = len(plan.decode_tokens)
        if n_dec:
            decode = self._decode_static if self.static_decode else self._decode_eager
            logits.append(decode(plan.decode_tokens, plan.decode_positions))
        if plan.prefill_prompts:
            logits.append(self._prefill(plan.prefill_prompts, n_dec))
        if not logits:
            return None
        return torch.cat(logits).float()  # (rows, vocab)

    def _prefill(self, prompts: list[list[int]], row0: int, fresh: bool = True) -> torch.Tensor:
        """Prompts padded to the longest as one (n, width) batch into KV rows [row0, row0 + n); last-token logits.
        ``fresh=False`` attends through the slot cache's row views instead of the step's own K/V (the same values;
        the path before --compile-prefill existed, kept for bench_prefill's comparison)."""
        dev, n = self.device, len(prompts)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(n, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(dev)
        pos = torch.arange(width, device=dev).expand(n, width).contiguous()  # contiguous: one stride for any n
        q = torch.arange(width, device=dev)
        causal = q[None, :] <= q[:, None]  # (T_q, T_k)
        mask = (causal[None] & (q[None, None, :] < lens[:, None, None])).view(n, 1, width, width)
        # width 1 would be one more 0/1-specialised shape class: a one-token prefill is cheap eagerly
        compiled = self.compile_prefill and width > 1
        with self._compiled_layers(compiled):
            h = self._forward(ids, pos, mask, row0, width, fresh=fresh)
        if compiled and self.graphs_at_start is not None:
            from torch._dynamo.utils import counters

            graphs = int(counters["stats"]["unique_graphs"])
            if graphs > self.graphs_at_start:  # a shape class warm_prefill missed: this step paid for a compile
                log.warning("prefill compiled a new graph while serving (%d prompts, width %d)", n, width)
                self.graphs_at_start = graphs
        return self.lm_head(h[torch.arange(n, device=dev), lens - 1])  # gathered by the TP hook

    @contextlib.contextmanager
    def _compiled_layers(self, on: bool) -> Any:
        """Decoder layers run their compiled forward inside (decode stays eager: its CUDA graphs hold it)."""
        if not on:
            yield
            return
        for layer, f in zip(self.layers, self._compiled_layer_fwd, strict=True):
            layer.forward = f
        try:
            yield
        finally:
            for layer, f in zip(self.layers, self._eager_layer_fwd, strict=True):
                layer.forward = f

    def warm_prefill(self) -> tuple[float, int]:
        """Compile the prefill for every shape class before serving, identically on every rank (the graphs hold the
        TP collectives); returns (seconds, compiled graphs). The classes are one prompt and several (0/1
        specialisation of the batch size); the first KV row is no class, it only reaches the eager cache write.
        Writes KV rows 0..1, which hold no request yet."""
        from torch._dynamo.utils import counters

        assert self._compiled_layer_fwd, "Engine(compile_prefill=True) builds the compiled layers"
        t0 = time.perf_counter()
        w = min(9, self.cache.max_len)
        for n in (1, 2) if self.cache.max_batch >= 2 else (1,):
            self._prefill([[0] * w] * n, 0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.graphs_at_start = int(counters["stats"]["unique_graphs"])
        return time.perf_counter() - t0, self.graphs_at_start

    def _decode_eager(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        n, dev = len(tokens), self.device
        ids = torch.tensor(tokens, dtype=torch.long, device=dev).view(n, 1)
        pos = torch.tensor(positions, dtype=torch.long, device=dev).view(n, 1)
        kv_len = max(positions) + 1
        mask = (torch.arange(kv_len, device=dev)[None, :] <= pos).view(n, 1, 1, kv_len)  # row i sees 0..pos_i
        return self.lm_head(self._forward(ids, pos, mask, 0, kv_len)[:, -1])

    def _decode_bucketed(self, batch: int, kv_len: int) -> torch.Tensor:
        """Rows [0, batch) decode from the static buffers, attending to [0, kv_len): what one graph captures."""
        pos = self.g_pos[:batch]
        h = self._forward(self.g_ids[:batch], pos, self.g_mask[:batch, :, :, :kv_len], 0, kv_len)
        return self.lm_head(h[:, -1])

    def _decode_static(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Decode padded to the smallest bucket: padding rows decode token 0 at position 0 of KV rows that hold no
        request (active requests are rows [0, n); a new request's prefill, later in the step, rewrites from 0)."""
        n = len(tokens)
        batch = next(b for b in self.batch_buckets if b >= n)
        kv_len = next(k for k in self.kv_buckets if k > max(positions))
        pad = [0] * (batch - n)
        self.g_ids[:batch, 0].copy_(torch.tensor(tokens + pad, dtype=torch.long))
        self.g_pos[:batch, 0].copy_(torch.tensor(positions + pad, dtype=torch.long))
        self.g_mask[:batch, 0, 0, :kv_len] = self.g_keys[:kv_len][None, :] <= self.g_pos[:batch]
        if self.cuda_graphs:
            graph, out = self.graphs[(batch, kv_len)]
            graph.replay()
            return out[:n]
        return self._decode_bucketed(batch, kv_len)[:n]

    def capture_graphs(self) -> float:
        """One CUDA graph per (batch, KV length) bucket, captured in the same order on every rank (the graphs hold
        the TP collectives, so every rank must replay the same graph each step); returns the seconds it took."""
        assert self.cuda_graphs and self.device.type == "cuda"
        t0 = time.perf_counter()
        self.g_mask.zero_()
        self.g_mask[:, :, :, 0] = True  # capture inputs: row i decodes at position 0 (no all-masked rows)
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for batch in reversed(self.batch_buckets):  # largest first: smaller graphs reuse its pool memory
            for kv_len in reversed(self.kv_buckets):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up outside capture (workspaces, lazy inits)
                    self._decode_bucketed(batch, kv_len)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._decode_bucketed(batch, kv_len)
                self.graphs[(batch, kv_len)] = (graph, out)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def verify_graphs(self) -> dict[str, float]:
        """Start-up check on every rank, errors as max |difference| / max |logit|: graph replay vs the same bucket run
        eagerly (<= 2 %: cuBLAS may pick other kernels under capture) and vs the unpadded eager decode (<= 10 %,
        bf16 through all layers). A stale input or address in a graph is off by ~100 %: RuntimeError, no start."""
        prompts = [[(7 * i + 3 * j) % self.vocab_size for j in range(5 + 4 * i)] for i in range(3)]
        self.execute(StepPlan(prefill_prompts=prompts))  # rows 0..2 (empty before serving; reused later)
        tokens, positions = [1, 2, 3], [len(p) for p in prompts]
        eager = self._decode_eager(tokens, positions).float()
        self.cuda_graphs = False
        bucket = self._decode_static(tokens, positions).float()
        self.cuda_graphs = True
        graph = self._decode_static(tokens, positions).float()
        scale = float(eager.abs().max())
        err = {
            "graph_vs_bucket": float((graph - bucket).abs().max()) / scale,
            "bucket_vs_eager": float((bucket - eager).abs().max()) / scale,
        }
        if not (err["graph_vs_bucket"] <= 2e-2 and err["bucket_vs_eager"] <= 1e-1):
            raise RuntimeError(
                f"--cuda-graphs: decode check failed (max error / max |logit|: {err}); run without --cuda-graphs"
            )
        return err


# ----------------------------------------------------------------------------------------------------------------
# Rank 0: requests, scheduling, sampling


@dataclass
class GenParams:
    """What one request asks for (validated from the HTTP body)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    return_token_ids: bool = False
    """vLLM's extension: put ``token_ids`` (and ``prompt_token_ids``) in each choice."""


@dataclass
class Request:
    rid: str
    params: GenParams
    sink: Callable[[list[tuple[Request, int | None, str | None]]], None]
    """Called from the engine thread with this step's events; must be thread-safe (call_soon_threadsafe)."""
    arrival: float = field(default_factory=time.perf_counter)
    output: list[int] = field(default_factory=list)
    cache_len: int = 0
    """Tokens of this request currently in its KV row."""
    cancelled: bool = False
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    number: int = 0
    """Submission order (default sampling seed = --seed + number)."""


class Scheduler:
    """Rank 0's engine loop (its own thread): admit, plan, broadcast, execute, sample, emit."""

    def __init__(self, engine: Engine, args: ServerArgs, eos_ids: set[int], sample_vocab: int) -> None:
        self.engine, self.args = engine, args
        self.eos_ids = eos_ids
        self.sample_vocab = sample_vocab
        """Ids >= this are never sampled (checkpoint vocab padding beyond the tokenizer's ids)."""
        self.inbox: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # index = KV row
        self.pending_moves: list[tuple[int, int, int]] = []
        self.stopping = False
        self.submitted = 0
        self.error: str | None = None
        self.counters = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "success": 0,
            "ttft_sum": 0.0,
            "ttft_count": 0,
            "queue_sum": 0.0,
            "queue_count": 0,
            "steps": 0,
        }

    # -- called from the HTTP thread -------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        self.submitted += 1
        req.number = self.submitted
        self.inbox.put(req)

    def stop(self) -> None:
        self.inbox.put(None)

    def gauges(self) -> dict[str, float]:
        active = list(self.active)
        used = sum(r.cache_len for r in active)
        return {
            "running": len(active),
            "waiting": len(self.waiting) + self.inbox.qsize(),
            "kv_cache_usage": used / (self.args.max_batch * self.args.max_model_len),
        }

    # -- engine thread ---------------------------------------------------------------------------------------

    def _drain(self, block: bool) -> bool:
        """Move submitted requests to ``waiting``; False when idle for the heartbeat period (send a NOOP)."""
        try:
            item = self.inbox.get(timeout=IDLE_HEARTBEAT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return not block
        while True:
            if item is None:
                self.stopping = True
            else:
                self.waiting.append(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _remove(self, row: int) -> None:
        last = self.active.pop()
        if row < len(self.active):
            self.active[row] = last
            self.pending_moves.append((len(self.active), row, last.cache_len))

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        width = 0
        while self.waiting and len(self.active) + len(admitted) < self.args.max_batch:
            req = self.waiting[0]
            if req.cancelled:
                self.waiting.popleft()
                continue
            w = max(width, len(req.params.prompt_ids))
            if admitted and w * (len(admitted) + 1) > self.args.max_prefill_tokens:
                break
            width = w
            admitted.append(self.waiting.popleft())
        return admitted

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        if self.sample_vocab < logits.shape[-1]:
            logits[:, self.sample_vocab :] = -math.inf
        tokens = logits.argmax(dim=-1)
        for i, r in enumerate(reqs):
            p = r.params
            if p.temperature <= 0:
                continue
            probs = torch.softmax(logits[i] / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, si = probs.sort(descending=True)
                keep = sp.cumsum(0) - sp < p.top_p  # smallest prefix whose mass reaches top_p
                probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
            if r.generator is None:
                r.generator = torch.Generator(device=logits.device)
                r.generator.manual_seed(p.seed if p.seed is not None else self.args.seed + r.number)
            tokens[i] = torch.multinomial(probs, 1, generator=r.generator)[0]
        return tokens.cpu().tolist()  # .cpu() waits for the step with the GIL released: HTTP streams meanwhile

    def _finish_reason(self, r: Request, token: int) -> str | None:
        p = r.params
        if len(r.output) >= p.max_tokens:
            return "length"
        if token in self.eos_ids and not p.ignore_eos and len(r.output) >= p.min_tokens:
            return "stop"
        return None

    def step(self) -> bool:
        """One iteration; False once stopped."""
        if not self._drain(block=not self.active and not self.waiting):
            self.engine.send(CMD_NOOP)
            return True
        if self.stopping:
            return False
        events: list[tuple[Request, int | None, str | None]] = []
        for row in range(len(self.active) - 1, -1, -1):  # disconnected clients free their rows
            if self.active[row].cancelled:
                self._remove(row)
        decode_rows = list(self.active)
        admitted = self._admit()
        if not decode_rows and not admitted:
            if self.pending_moves:
                self.pending_moves.clear()  # nothing runs: the moved rows are empty anyway
            return True
        now = time.perf_counter()
        for r in admitted:
            self.counters["queue_sum"] += now - r.arrival
            self.counters["queue_count"] += 1
        plan = StepPlan(
            self.pending_moves,
            [r.output[-1] for r in decode_rows],
            [r.cache_len for r in decode_rows],
            [r.params.prompt_ids for r in admitted],
        )
        self.pending_moves = []
        self.engine.send(CMD_STEP, plan)
        logits = self.engine.execute(plan)
        assert logits is not None
        reqs = decode_rows + admitted
        tokens = self._sample(logits, reqs)
        self.active.extend(admitted)
        now = time.perf_counter()
        for r in decode_rows:
            r.cache_len += 1
        for r in admitted:
            r.cache_len = len(r.params.prompt_ids)
            self.counters["prompt_tokens"] += r.cache_len
            self.counters["ttft_sum"] += now - r.arrival
            self.counters["ttft_count"] += 1
        finished: list[Request] = []
        for r, tok in zip(reqs, tokens, strict=True):
            r.output.append(tok)
            r.finish_reason = self._finish_reason(r, tok)
            events.append((r, tok, r.finish_reason))
            if r.finish_reason is not None:
                finished.append(r)
        self.counters["generation_tokens"] += len(tokens)
        self.counters["steps"] += 1
        for r in finished:
            self._remove(self.active.index(r))
            self.counters["success"] += 1
        by_sink: dict[int, tuple[Callable[..., None], list[tuple[Request, int | None, str | None]]]] = {}
        for ev in events:
            by_sink.setdefault(id(ev[0].sink), (ev[0].sink, []))[1].append(ev)
        for sink, evs in by_sink.values():
            sink(evs)
        return True

    def run(self) -> None:
        """Engine thread body: step until stopped, then release every rank; failures end all requests."""
        try:
            if self.engine.device.type == "cuda":
                torch.cuda.set_device(self.engine.device)  # the current device is per thread
            with torch.inference_mode():
                while self.step():
                    pass
        except Exception:  # the server cannot continue; report to every open request and to /health
            self.error = traceback.format_exc()
            log.error("engine failed:\n%s", self.error)
        finally:
            with contextlib.suppress(Exception):
                self.engine.send(CMD_STOP)
            pending = self.active + list(self.waiting)
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    pending.append(item)
            for r in pending:
                r.sink([(r, None, "abort")])


# ----------------------------------------------------------------------------------------------------------------
# HTTP (aiohttp), rank 0


class BadRequest(ValueError):
    """A client mistake: HTTP 400 with this message."""


def _get(body: dict[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"'{key}' must be {types}, got a boolean")
    if not isinstance(v, types):
        raise BadRequest(f"'{key}' has the wrong type ({type(v).__name__})")
    return v


class Api:
    """Request parsing and the OpenAI response shapes; owns nothing but the tokenizer and the model id."""

    def __init__(self, sched: Scheduler, tokenizer: Any, model_id: str, max_model_len: int, vocab_size: int) -> None:
        self.sched, self.tok, self.model_id = sched, tokenizer, model_id
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.started = time.time()
        import transformers

        world = sched.engine.world
        self.version = (
            f"phase6 {ENGINE} (tp={world}, torch {torch.__version__}, transformers {transformers.__version__})"
        )

    def params(self, body: Any, chat: bool) -> GenParams:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_id:
            raise BadRequest(f"model {model!r} is not served here (serving {self.model_id!r})")
        if _get(body, "n", int, 1) != 1:
            raise BadRequest("'n' must be 1")
        if body.get("stop") not in (None, [], ""):
            raise BadRequest("'stop' is not supported by this server")
        if body.get("logprobs") not in (None, False, 0):
            raise BadRequest("'logprobs' is not supported by this server")
        ids = self._chat_ids(body) if chat else self._prompt_ids(body)
        if not ids:
            raise BadRequest("prompt is empty")
        room = self.max_model_len - len(ids)
        if room < 1:
            raise BadRequest(f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}")
        max_tokens = _get(body, "max_tokens", int, None)
        if chat:
            max_tokens = _get(body, "max_completion_tokens", int, max_tokens)
        if max_tokens is None:
            max_tokens = room if chat else 16  # OpenAI defaults: chat = up to the context, completions = 16
        if max_tokens < 1:
            raise BadRequest(f"'max_tokens' must be >= 1, got {max_tokens}")
        if len(ids) + max_tokens > self.max_model_len:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len {self.max_model_len}"
            )
        temperature = float(_get(body, "temperature", (int, float), 1.0))
        top_p = float(_get(body, "top_p", (int, float), 1.0))
        if not (math.isfinite(temperature) and temperature >= 0):
            raise BadRequest(f"'temperature' must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise BadRequest(f"'top_p' must be in (0, 1], got {top_p}")
        min_tokens = _get(body, "min_tokens", int, 0)
        if not 0 <= min_tokens <= max_tokens:
            raise BadRequest(f"'min_tokens' must be in [0, max_tokens], got {min_tokens}")
        return GenParams(
            ids,
            max_tokens,
            temperature,
            top_p,
            _get(body, "seed", int, None),
            bool(_get(body, "ignore_eos", bool, False)),
            min_tokens,
            bool(_get(body, "return_token_ids", bool, False)),
        )

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if self.tok is None:
                raise BadRequest("this server has no tokenizer: send 'prompt' as a list of token ids")
            return list(self.tok.encode(prompt, add_special_tokens=False)) if prompt else []
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise BadRequest(f"token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
            return list(prompt)
        raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")

    def _chat_ids(self, body: dict[str, Any]) -> list[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise BadRequest(f"messages[{i}] must be {{'role': str, 'content': str}}")
        if self.tok is None or not getattr(self.tok, "chat_template", None):
            raise BadRequest("this server's tokenizer has no chat template: use /v1/completions")
        out = self.tok.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in msgs],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def chunk(
        self,
        rid: str,
        chat: bool,
        text: str | None,
        finish: str | None,
        usage: dict[str, int] | None,
        role: bool = False,
    ) -> dict[str, Any]:
        if text is None:  # usage-only chunk
            choices: list[dict[str, Any]] = []
        elif chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        obj: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
        }
        if usage is not None:
            obj["usage"] = usage
        return obj


class Detokenizer:
    """Incremental decode (the vLLM/TGI offsets scheme): emit text only once it is not a partial UTF-8 char."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        if self.tok is None:
            return f"<{token}>"  # no tokenizer configured: token ids as text (documented, token-id clients only)
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        after = self.tok.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""


def prometheus(sched: Scheduler, model_id: str) -> str:
    """vLLM's metric names (anchors §6.1), so scrapers written for vLLM read this server unchanged."""
    g, c = sched.gauges(), sched.counters
    lbl = f'{{model_name="{model_id}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", g["running"]),
        ("vllm:num_requests_waiting", "gauge", g["waiting"]),
        ("vllm:kv_cache_usage_perc", "gauge", g["kv_cache_usage"]),
        ("vllm:prompt_tokens_total", "counter", c["prompt_tokens"]),
        ("vllm:generation_tokens_total", "counter", c["generation_tokens"]),
        ("vllm:request_success_total", "counter", c["success"]),
        ("vllm:time_to_first_token_seconds_sum", "counter", c["ttft_sum"]),
        ("vllm:time_to_first_token_seconds_count", "counter", c["ttft_count"]),
        ("vllm:request_queue_time_seconds_sum", "counter", c["queue_sum"]),
        ("vllm:request_queue_time_seconds_count", "counter", c["queue_count"]),
    ]
    out: list[str] = []
    for name, kind, value in rows:
        out += [f"# TYPE {name} {kind}", f"{name}{lbl} {value}"]
    return "\n".join(out) + "\n"


def build_app(api: Api) -> Any:
    from aiohttp import web

    sched = api.sched

    async def health(_: web.Request) -> web.Response:
        if sched.error is not None:
            return web.json_response({"status": "engine failed"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": api.model_id,
                        "object": "model",
                        "created": int(api.started),
                        "owned_by": ENGINE,
                        "max_model_len": api.max_model_len,
                    }
                ],
            }
        )

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": api.version})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=prometheus(sched, api.model_id), content_type="text/plain")

    def error(status: int, msg: str) -> web.Response:
        return web.json_response(
            {"error": {"message": msg, "type": "invalid_request_error", "code": status}}, status=status
        )

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError as e:
            return error(400, f"body is not valid JSON: {e}")
        try:
            params = api.params(body, chat)
            stream = bool(_get(body, "stream", bool, False))
            opts = _get(body, "stream_options", dict, {})
        except BadRequest as e:
            return error(400, str(e))
        if sched.error is not None or sched.stopping:
            return error(503, "server is not accepting requests")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()

        def sink(evs: list[tuple[Request, int | None, str | None]]) -> None:
            loop.call_soon_threadsafe(lambda: [events.put_nowait((t, f)) for _, t, f in evs])

        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        req = Request(rid, params, sink)
        sched.submit(req)
        detok = Detokenizer(api.tok)
        n_prompt, n_out = len(params.prompt_ids), 0

        def usage() -> dict[str, int]:
            return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

        try:
            if not stream:
                parts: list[str] = []
                finish = None
                while finish is None:
                    tok, finish = await events.get()
                    if tok is not None:
                        n_out += 1
                        parts.append(detok.add(tok))
                out_ids = detok.ids
                if finish == "abort":
                    return error(500, "engine stopped before the request finished")
                text = "".join(parts)
                choice: dict[str, Any] = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                    if chat
                    else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                )
                if params.return_token_ids:
                    choice |= {"token_ids": out_ids, "prompt_token_ids": params.prompt_ids}
                return web.json_response(
                    {
                        "id": rid,
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": api.model_id,
                        "choices": [choice],
                        "usage": usage(),
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            every = bool(opts.get("continuous_usage_stats"))

            async def send(obj: dict[str, Any]) -> None:
                await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

            role = chat
            finish = None
            held: list[int] = []  # tokens whose text is still an incomplete character
            while finish is None:
                tok, finish = await events.get()
                if finish == "abort":
                    await resp.write(b'data: {"error": {"message": "engine stopped", "code": 500}}\n\n')
                    return resp
                if tok is not None:
                    n_out += 1
                    held.append(tok)
                    text = detok.add(tok)
                    if text or finish is not None or role:
                        obj = api.chunk(rid, chat, text, finish, usage() if every else None, role=role)
                        if params.return_token_ids:
                            obj["choices"][0]["token_ids"] = held
                        await send(obj)
                        held, role = [], False
            if opts.get("include_usage"):
                await send(api.chunk(rid, chat, None, None, usage()))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            req.cancelled = True  # client went away: the engine frees the row at its next step
            raise
        finally:
            if req.finish_reason is None:
                req.cancelled = True

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/metrics", metrics),
            web.get("/version", version),
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat_completions),
        ]
    )
    return app


async def serve_http(api: Api, host: str, port: int, engine_thread: threading.Thread) -> None:
    """Serve until SIGTERM/SIGINT or engine failure; then stop the engine (which releases every rank)."""
    from aiohttp import web

    runner = web.AppRunner(build_app(api), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
    log.info("ready: http://%s:%s (model %s)", host, bound, api.model_id)
    print(f"tp_server ready on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and engine_thread.is_alive():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
    api.sched.stop()
    await asyncio.to_thread(engine_thread.join)
    await runner.cleanup()


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def _eos_ids(model: nn.Module, tok: Any) -> set[int]:
    ids: set[int] = set()
    for src in (model.config, getattr(model, "generation_config", None)):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update(e if isinstance(e, list) else [e] if isinstance(e, int) else [])
    if tok is not None and tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def warmup(sched: Scheduler, engine: Engine) -> None:
    """One prefill + one decode through the normal broadcast path (first-step allocations, CUDA init)."""
    plan = StepPlan(prefill_prompts=[[0] * 8])
    engine.send(CMD_STEP, plan)
    engine.execute(plan)
    plan = StepPlan(decode_tokens=[0], decode_positions=[8])
    engine.send(CMD_STEP, plan)
    engine.execute(plan)


def die_with_parent() -> None:
    """torchrun starts each worker in its own session, so a SIGKILL to the launcher's process group reaches only
    the agent; the kernel then ends this worker too instead of leaving it holding a GPU (Linux prctl)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def run(args: ServerArgs) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        die_with_parent()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [tp_server rank {rank}] %(message)s")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but torch.cuda.is_available() is False")
    if args.cuda_graphs and not use_cuda:
        raise ValueError("--cuda-graphs: needs a CUDA device")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.bfloat16 if use_cuda else torch.float32)
    ctrl: dist.ProcessGroup | None = None
    if world > 1:
        if use_cuda:
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
        ctrl = dist.new_group(backend="gloo")  # the step plan travels on CPU: no GPU sync to read it
    t0 = time.perf_counter()
    model = build_model(args, device, dtype)
    if world > 1 and args.dummy_weights:
        broadcast_weights(model)
    split = apply_tp(model, rank, world)
    if use_cuda:
        torch.cuda.empty_cache()
    engine = Engine(
        model, args, device, rank, world, ctrl, cuda_graphs=args.cuda_graphs, compile_prefill=args.compile_prefill
    )
    if args.compile_prefill:
        with torch.inference_mode():
            took, graphs = engine.warm_prefill()
        log.info("compiled the prefill (decoder layers, dynamic shapes): %d graphs in %.1f s", graphs, took)
    if args.cuda_graphs:
        with torch.inference_mode():
            took = engine.capture_graphs()
            err = engine.verify_graphs()
        log.info(
            "captured %d decode graphs (batch %s x KV length %s) in %.1f s; check vs eager: %s",
            len(engine.graphs),
            engine.batch_buckets,
            engine.kv_buckets,
            took,
            err,
        )
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "model %s: %.3fB parameters on this rank (%s, tp=%d, %d modules split), KV cache %.2f GiB "
        "(%d rows x %d positions), load %.1f s",
        type(model).__name__,
        n_params / 1e9,
        dtype,
        world,
        len(split),
        engine.cache.nbytes / 2**30,
        args.max_batch,
        args.max_model_len,
        time.perf_counter() - t0,
    )
    if rank != 0:
        signal.signal(signal.SIGTERM, lambda *_: None)  # wait for rank 0's STOP (torchrun ends us if rank 0 dies)
        engine.follow()
        dist.destroy_process_group()
        log.info("stopped")
        return 0

    from transformers import AutoTokenizer

    tok_path = args.tokenizer_path()
    tok = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=False) if tok_path is not None else None
    vocab = model.config.vocab_size
    sample_vocab = min(vocab, len(tok)) if tok is not None else vocab
    if sample_vocab < vocab:
        log.info("sampling restricted to the tokenizer's %d ids (model vocab %d)", sample_vocab, vocab)
    sched = Scheduler(engine, args, _eos_ids(model, tok), sample_vocab)
    with torch.inference_mode():
        warmup(sched, engine)
    thread = threading.Thread(target=sched.run, name="engine", daemon=True)
    thread.start()
    api = Api(sched, tok, args.served_model_name or args.model, args.max_model_len, vocab)
    asyncio.run(serve_http(api, args.host, args.port, thread))
    if world > 1:
        dist.destroy_process_group()
    log.info("stopped")
    if sched.error is not None:
        print(f"tp_server: engine failed: {sched.error.strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except ValueError as e:  # a user mistake (flags, a config that does not split): one line, exit 2
        print(f"tp_server: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
