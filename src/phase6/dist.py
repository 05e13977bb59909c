"""Process-group setup from the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT).

nccl on CUDA, gloo on CPU (so 2-process tests run on a laptop). A plain `python train.py` without torchrun
variables is a world of one and creates no process group.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(key: str, default: int) -> int:
    value = os.environ.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"environment variable {key} must be an integer, got {value!r}") from e


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Join the torchrun process group (if WORLD_SIZE > 1) and pick this rank's device.

    device: 'auto' (cuda:LOCAL_RANK when CUDA is available, else cpu), 'cuda' or 'cpu'.
    """
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be one of ('auto', 'cuda', 'cpu'), got {device!r}")
    rank, local_rank, world = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1)
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but torch.cuda.is_available() is False")
    if use_cuda:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)  # before init_process_group so NCCL binds each rank to its own GPU
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=timedelta(seconds=timeout_s),
            device_id=dev if use_cuda else None,
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world, device=dev)


def teardown() -> None:
    """Destroy the process group if one exists (safe to call twice and in a world of one).

    A ``fully_shard`` model sits in reference cycles (its hooks hold the module), so it, its DeviceMesh and the
    process group it references outlive ``train()`` until the cycle collector runs. Left to interpreter
    finalization, Gloo's worker threads are torn down while Python is half gone, and a rank can abort with
    "terminate called without an active exception" after a run that finished (seen once in CI, FSDP2 on gloo).
    Collecting first frees them while the interpreter is whole; the group is then destroyed by its last owner.
    """
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a tensor over ranks (identity in a world of one); in place, also returned."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.AVG if value.is_cuda else dist.ReduceOp.SUM)
        if not value.is_cuda:  # gloo has no AVG
            value /= dist.get_world_size()
    return value


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
