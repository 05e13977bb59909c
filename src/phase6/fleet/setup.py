"""What one fleet simulation needs besides the workload and the topology (:class:`FleetSetup`), and how a setup
becomes the simulator's PD pools and host-memory KV tiers. Its own module so that ``phase6.fleet.run`` (the job),
``phase6.fleet.compare`` and ``phase6.fleet.papers`` all import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phase6.config import HardwareConfig
from phase6.config.fleet import EngineConfig
from phase6.fleet.engines import TorchTPStepTime
from phase6.fleet.kvcache import HostTier
from phase6.fleet.sim import EngineLimits, SimResult, Topology, simulate
from phase6.fleet.steptime import StepTimeModel, kv_capacity_blocks, kv_transfer_s, planner_model
from phase6.fleet.workload import Workload
from phase6.plan.model import ModelSpec
from phase6.serving.traces import BLOCK_TOKENS


@dataclass
class FleetSetup:
    """Everything a simulation needs besides the workload and the topology."""

    spec: ModelSpec
    model: StepTimeModel | TorchTPStepTime
    limits: EngineLimits
    hardware: HardwareConfig
    engine: EngineConfig
    kv_link: str
    sim_engine: str
    new_shape_ms: float = 0.0
    """torch-tp: extra ms of a prefill step at a (prompts, width) shape new to the server (engines.TorchTPStepTime)."""
    warm_shapes: frozenset[tuple[int, int]] = frozenset()
    """torch-tp: prefill shapes the server ran before the simulated run."""
    seed: int = 0

    def transfer_fn(self) -> Callable[[int], float]:
        spec, hw, eng, link = self.spec, self.hardware, self.engine, self.kv_link
        tp = min(eng.prefill_tp or eng.tp, eng.decode_tp or eng.tp)  # the narrower side's links carry it
        return lambda tokens: kv_transfer_s(spec, hw, eng, link, tokens, tp)

    def run(self, workload: Workload, topology: Topology, router: str, closed: int | None = None) -> SimResult:
        pools = pd_pools(self) if topology.is_pd else None
        model, limits, tp = pools[0] if pools else (self.model, self.limits, self.engine.tp)
        return simulate(
            workload,
            model,
            limits,
            topology,
            router,
            tp=tp,
            kv_transfer_s=self.transfer_fn(),
            engine=self.sim_engine,
            closed_concurrency=closed,
            decode_pool=pools[1] if pools else None,
            host_tier=host_tiers(self, topology.replicas, tp),
            seed=self.seed,
            request_delay_s=self.engine.resolved_request_overhead_ms * 1e-3,
        )


def pd_pools(setup: FleetSetup) -> tuple[tuple[Any, EngineLimits, int], tuple[Any, EngineLimits, int]] | None:
    """(prefill, decode) pools' (step model, limits, tp) when engine.prefill_tp / decode_tp set them apart."""
    eng = setup.engine
    if eng.prefill_tp is None and eng.decode_tp is None:
        return None
    out = []
    for tp in (eng.prefill_tp or eng.tp, eng.decode_tp or eng.tp):
        if tp == eng.tp:
            out.append((setup.model, setup.limits, tp))
            continue
        lim = EngineLimits(
            eng.max_num_seqs,
            eng.max_num_batched_tokens,
            kv_capacity_blocks(setup.spec, setup.hardware, eng, tp),
            eng.chunked_prefill,
        )
        out.append((planner_model(setup.spec, setup.hardware, eng, tp), lim, tp))
    return out[0], out[1]


def host_tiers(setup: FleetSetup, replicas: int, tp: int) -> Callable[[int], HostTier | None] | None:
    """Replica id -> its host-memory KV tier: one per replica (local, PCIe) or one shared pool (global, RDMA)."""
    eng, hw = setup.engine, setup.hardware
    if eng.host_kv_gib <= 0:
        return None
    block_bytes = setup.spec.kv_cache_bytes_per_token(eng.kv_bytes_per_elem) * BLOCK_TOKENS
    per_replica = max(1, int(eng.host_kv_gib * 2**30 // block_bytes))
    if eng.host_tier == "global":
        pool = HostTier(per_replica * replicas, block_bytes, hw.internode_gbps, tp, hw.internode_latency_us * 1e-6)
        return lambda _rid: pool
    tiers: dict[int, HostTier] = {}

    def local(rid: int) -> HostTier:
        if rid not in tiers:
            tiers[rid] = HostTier(per_replica, block_bytes, eng.host_link_gbps, tp, hw.intranode_latency_us * 1e-6)
        return tiers[rid]

    return local
