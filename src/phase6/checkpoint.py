"""Atomic, exactly-resumable training checkpoints.

One file per checkpoint, `<dir>/step_<NNNNNNNN>.pt`, holding: full (unsharded) model and optimizer state keyed by
parameter name (AdamW's moments; with Muon, its momentum buffers too) (torch.distributed.checkpoint.state_dict, so DDP, FSDP2 and plain modules save the same layout),
scheduler state, the step, every rank's data-loader position and RNG states, and free-form metadata.
Everything is tensors or plain Python data so `torch.load(weights_only=True)` reads it back.

Atomicity: rank 0 writes `<name>.tmp`, fsyncs it, then `os.replace`s it onto the final name; a crash at any point
leaves either the old set of checkpoints or the old set plus a complete new one. Old checkpoints beyond `keep`
are deleted only after the new one is in place, and only those at or before the saved step (`prunable`).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def capture_rng() -> dict[str, Any]:
    """This process's RNG states as tensors / plain data (python, numpy, torch CPU, current CUDA device)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(_plain, np_state[2:])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _plain(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else x


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The real optimizers behind `optimizer` (phase6.optim.MuonAdamW holds Muon + AdamW), whose states DCP merges
    into one name-keyed state dict."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def checkpoint_path(ckpt_dir: str | os.PathLike[str], step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def list_checkpoints(ckpt_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in `ckpt_dir`, oldest first (`.tmp` leftovers of a crashed save are ignored)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.match(p.name))


def step_of(path: Path) -> int:
    m = _NAME.match(path.name)
    assert m is not None, path
    return int(m.group(1))


def prunable(ckpt_dir: str | os.PathLike[str], step: int, keep: int) -> list[Path]:
    """Checkpoints that retention may delete after saving ``step``: the oldest of those at or before ``step``
    beyond the newest ``keep``. A checkpoint *after* ``step`` is not this run's history (another run's, or a
    timeline this run rewound past) and is never counted nor deleted in its favour."""
    own = [p for p in list_checkpoints(ckpt_dir) if step_of(p) <= step]
    return own[:-keep] if keep > 0 else own


def latest_checkpoint(ckpt_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX: readers see the old file set or the complete new file
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save_checkpoint(
    ckpt_dir: str | os.PathLike[str],
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_state: dict[str, Any],
    meta: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Collective: every rank calls it; rank 0 writes `step_<step>.pt` atomically and prunes to `keep` files."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, _optimizers(optimizer), options=opts)
    ranks_data = _gather(data_state)
    ranks_rng = _gather(capture_rng())
    path = checkpoint_path(ckpt_dir, step)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": scheduler.state_dict(),
            "data": ranks_data,
            "rng": ranks_rng,
            "world_size": len(ranks_rng),
            "meta": meta or {},
        }
        _atomic_torch_save(state, path)
        for old in prunable(ckpt_dir, step, keep):
            old.unlink()
    if dist.is_initialized():
        dist.barrier()  # no rank continues (and possibly crashes) before the file is complete
    return path


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw checkpoint dict (weights_only), with a one-line error naming the file if it is unreadable."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: checkpoint file not found")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, wrong format, unpickling refused
        raise ValueError(f"{p}: not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    missing = {"step", "model", "optimizer", "scheduler", "data", "rng"} - set(state)
    if missing:
        raise ValueError(f"{p}: checkpoint lacks keys {sorted(missing)}")
    return state


def read_checkpoint_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``meta`` and ``step`` of a checkpoint without reading its tensors into memory (mmap)."""
    p = Path(path)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, wrong format, unpickling refused
        raise ValueError(f"{p}: not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    return {"step": state.get("step"), "meta": state.get("meta") or {}}


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore model/optimizer/scheduler/RNG in place (every rank calls it, after parallelization).

    Returns {"step", "data" (this rank's loader state), "meta"}. The world size must match the saving run:
    per-rank RNG streams and data positions cannot be remapped exactly.
    """
    state = read_checkpoint(path)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    if state["world_size"] != world:
        raise ValueError(
            f"{path}: saved with world_size {state['world_size']}, resuming with {world}; exact "
            "resume needs the same number of processes"
        )
    opts = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(model, state["model"], options=opts)
        set_optimizer_state_dict(model, _optimizers(optimizer), state["optimizer"], options=opts)
        scheduler.load_state_dict(state["scheduler"])
    except (RuntimeError, KeyError, ValueError) as e:  # a different model shape or optimizer than the saving run's
        raise ValueError(
            f"{path}: does not fit this model/optimizer ({type(e).__name__}: {str(e).strip().splitlines()[0]})"
        ) from e
    restore_rng(state["rng"][rank])
    return {"step": state["step"], "data": state["data"][rank], "meta": state["meta"]}
