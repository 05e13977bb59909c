"""The hardware the planner predicts for: datasheet numbers (configs/hardware/*.yaml) or a calibrated profile.

A profile is the JSON that `phase6 plan calibrate` writes: measured matmul TFLOP/s and, per collective, the
small-message floor (latency) and large-message bus bandwidth of the fabric it ran on. Loading one replaces the
intra-node fabric (or the inter-node fabric, for a profile measured across nodes) and records the measured matmul
peak; everything else still comes from the hardware config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phase6.config import HardwareConfig
from phase6.plan.comm import Fabric

PROFILE_KIND = "phase6.plan.profile"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
# Per-step latency of one algorithm step: NCCL's own tuning table (NVIDIA/nccl src/graph/tuning.cc hwLat,
# LL protocol: NVLink ring 0.47 us / tree 0.52 us; network ring 2.7 us / tree 5.0 us). Base latency per collective
# comes from the hardware config (intranode_latency_us / internode_latency_us) or the calibrated floor.
NVLINK_HOP_US = 0.5
NETWORK_HOP_US = 2.7


@dataclass
class HardwareProfile:
    """Peak compute, HBM and the two fabrics; ``source`` says whether numbers are datasheet or measured."""

    hardware: HardwareConfig
    intra: Fabric
    inter: Fabric
    matmul_tflops: float | None = None
    """Measured dense bf16 matmul TFLOP/s (calibrated); None = not measured."""
    source: str = "datasheet"
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_flops(self) -> float:
        return self.hardware.peak_bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hardware.hbm_tbps * 1e12

    @property
    def gpus_per_node(self) -> int:
        return self.hardware.gpus_per_node

    def fabric_for(self, span: int) -> Fabric:
        """A process group whose ranks span ``span`` consecutive GPUs stays on NVLink iff it fits in one node."""
        return self.intra if span <= self.gpus_per_node else self.inter


def datasheet_profile(hw: HardwareConfig) -> HardwareProfile:
    return HardwareProfile(
        hardware=hw,
        intra=Fabric("nvlink", hw.nvlink_gbps, hw.intranode_latency_us, NVLINK_HOP_US),
        inter=Fabric("ib", hw.internode_gbps, hw.internode_latency_us, NETWORK_HOP_US),
    )


def _need(d: Any, key: str, path: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{path}: missing key {key!r}")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ValueError(f"{path}: key {key!r} has the wrong type ({type(v).__name__})")
    return v


def read_profile(path: str | Path) -> dict[str, Any]:
    """Load and validate a calibration profile; one-line ValueError naming the file and key otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"plan.profile: no such file {str(p)!r}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ValueError(f"{p}: not a phase6 plan profile (kind != {PROFILE_KIND!r})")
    _need(data, "world_size", str(p), int)
    _need(data, "nodes", str(p), int)
    colls = _need(data, "collectives", str(p), dict)
    ar = _need(colls, "all_reduce", f"{p}: collectives", dict)
    lat = _need(ar, "latency_us", f"{p}: collectives.all_reduce")
    bw = _need(ar, "busbw_gbps", f"{p}: collectives.all_reduce")
    if lat < 0 or bw <= 0:
        raise ValueError(f"{p}: collectives.all_reduce needs latency_us >= 0 and busbw_gbps > 0, got {lat}, {bw}")
    matmul = data.get("matmul")
    if matmul is not None:
        _need(matmul, "tflops", f"{p}: matmul")
    return data


def build_profile(hw: HardwareConfig, profile_path: str | None = None) -> HardwareProfile:
    """Datasheet profile, with the measured fabric and matmul peak of ``profile_path`` when given."""
    prof = datasheet_profile(hw)
    if not profile_path:
        return prof
    data = read_profile(profile_path)
    ar = data["collectives"]["all_reduce"]
    hop = prof.intra.hop_latency_us if data["nodes"] == 1 else prof.inter.hop_latency_us
    # The measured floor is a whole ring all-reduce at world_size ranks: base + 2(N-1) hops; keep the base.
    base = max(0.0, float(ar["latency_us"]) - 2 * (data["world_size"] - 1) * hop)
    measured = Fabric(
        "nvlink (measured)" if data["nodes"] == 1 else "ib (measured)", float(ar["busbw_gbps"]), base, hop
    )
    if data["nodes"] == 1:
        prof.intra = measured
    else:
        prof.inter = measured
    prof.matmul_tflops = float(data["matmul"]["tflops"]) if data.get("matmul") else None
    prof.source = f"calibrated ({profile_path}, {data.get('date', '?')}, {data.get('device', '?')})"
    prof.measured = data
    return prof
