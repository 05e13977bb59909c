"""The FA4 kernels in the shape torch.nn.attention's FA4 registry calls them.

torch (2.11 to 2.13, torch/nn/attention/_fa4.py) runs `out, lse = module._flash_attn_fwd(q, k, v, ..., return_lse=True)`
on the module it was registered with; flash-attn-4 4.0.0b36 returns five values (out, lse, p, row_max, o_lo). This
module is registered in its place (phase6.parallel.activate_fa4): the forward keeps the first two, the backward is
flash-attn-4's own. Importing it imports flash-attn-4 (ImportError when the package is missing)."""

from __future__ import annotations

from typing import Any

import torch
from flash_attn.cute.interface import _flash_attn_bwd  # noqa: F401  (re-exported for the registry)
from flash_attn.cute.interface import _flash_attn_fwd as _fa4_fwd


def _flash_attn_fwd(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    result = _fa4_fwd(*args, **kwargs)
    return result[0], result[1]  # (out, lse): 2 values in older flash-attn-4 releases, 5 in 4.0.0b36
