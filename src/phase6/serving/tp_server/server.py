"""Entry point: build the model and engine on every rank; rank 0 also runs the scheduler thread and HTTP."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phase6.parallel import apply_tp
from phase6.serving.tp_server.args import ServerArgs, parse_args
from phase6.serving.tp_server.engine import CMD_STEP, Engine, StepPlan
from phase6.serving.tp_server.http import Api, serve_http
from phase6.serving.tp_server.model import broadcast_weights, build_model
from phase6.serving.tp_server.scheduler import Scheduler
from phase6.timing import wall

log = logging.getLogger("phase6.tp_server")


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
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else (torch.bfloat16 if use_cuda else torch.float32)
    ctrl: dist.ProcessGroup | None = None
    if world > 1:
        if use_cuda:
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
        ctrl = dist.new_group(backend="gloo")  # the step plan travels on CPU: no GPU sync to read it
    t0 = wall()
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
        wall() - t0,
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
