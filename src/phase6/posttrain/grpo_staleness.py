"""A fixed rollout lag of exactly k optimizer steps, and the truncated importance-sampling correction for it.

No framework gives a constant lag (anchors §1.3: TRL's ``steps_per_generation = k·GA`` gives lags 0..k-1, AsyncGRPO
and verl bound staleness instead of fixing it). Here the policy *version* v is the number of optimizer steps taken;
at step s the engine generates with version ``max(0, s - k)``:

- ``PolicyHistory`` keeps copies of the last k+1 versions (on CPU by default: (k+1) x model bytes) and hands the
  engine the one it needs; with k = 0 no copy is kept, the live weights are pushed (TRL's on-policy behaviour).
- The PPO ratio needs a reference ("old") log-prob per token. ``is_correction="none"`` uses the behaviour policy
  (the stale weights that sampled the token): ratio = pi_theta / mu, clipped to [1-eps, 1+eps], so the clip fraction
  grows with k. ``is_correction="tis"`` is the decoupled form (Hilton et al. 2021; TRL's vLLM IS correction): the
  anchor is the current policy pi_s (proximal), and each token's advantage is multiplied by the truncated weight
  min(pi_s / mu, C) (token_truncate). TRL's loss multiplies the per-token loss by the weight; we fold it into a
  (B, T) advantage, which TRL documents for subclasses and which is the same thing for every clipped loss type
  because the weight is >= 0 and multiplies both branches of the min.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import torch

IS_CORRECTIONS = ("none", "tis")


class PolicyHistory:
    """Versions of the policy weights that the rollout engine may still need."""

    def __init__(self, staleness: int, device: str = "cpu", dtype: torch.dtype | None = None) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.staleness = staleness
        self.device = device
        self.dtype = dtype
        self._versions: OrderedDict[int, list[tuple[str, torch.Tensor]]] = OrderedDict()

    def target(self, current: int) -> int:
        """The version the engine must hold when the trainer is at version ``current``."""
        return max(0, current - self.staleness)

    @torch.no_grad()
    def record(self, version: int, named_params: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy version ``version`` (no-op when k = 0 or already held); returns the bytes copied."""
        if self.staleness == 0 or version in self._versions:
            return 0
        copies = []
        nbytes = 0
        by_storage: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
        for name, p in named_params:
            # tied weights arrive under every name (lm_head.weight = embed_tokens.weight): one copy, all names
            key = (p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape))
            c = by_storage.get(key)
            if c is None:
                c = p.detach().to(device=self.device, dtype=self.dtype or p.dtype, copy=True)
                by_storage[key] = c
                nbytes += c.numel() * c.element_size()
            copies.append((name, c))
        self._versions[version] = copies
        return nbytes

    def weights(self, version: int) -> list[tuple[str, torch.Tensor]]:
        if version not in self._versions:
            raise KeyError(f"policy version {version} not held (have {list(self._versions)})")
        return self._versions[version]

    def drop_before(self, version: int) -> None:
        """Forget versions older than ``version`` (the engine will never need them again)."""
        for v in [v for v in self._versions if v < version]:
            del self._versions[v]

    @property
    def held(self) -> list[int]:
        return list(self._versions)


def truncated_is_weights(
    current_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor, clip: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token min(pi/mu, clip) (0 on padding) and its statistics over the real tokens.

    NaN behaviour log-probs (vLLM could not score a token) get weight 1, i.e. no correction, as TRL does.
    """
    log_ratio = torch.nan_to_num(current_logps - behaviour_logps, nan=0.0)
    ratio = torch.exp(log_ratio)
    weights = torch.clamp(ratio, max=clip) * mask
    real = mask.bool()
    n = max(int(real.sum()), 1)
    stats = {
        "is_weight_mean": float(weights[real].sum()) / n,
        "is_truncated_frac": float((ratio[real] > clip).sum()) / n,
        # k1 estimate of KL(mu || pi) on tokens sampled from mu: how far the sampling policy is from the current one
        "kl_behaviour_current": float((-log_ratio)[real].sum()) / n,
        "logp_abs_diff_mean": float(log_ratio[real].abs().sum()) / n,
    }
    return weights, stats
