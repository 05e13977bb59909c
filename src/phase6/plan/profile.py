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
# Fallbacks when a hardware config does not carry kernel-level rates (the shipped ones do, with their sources):
# MAMF / peak is 0.80-0.87 for NVIDIA bf16 (stas00/ml-engineering compute/accelerator "Maximum Achievable Matmul FLOPS
# comparison table"), 0.71-0.73 for Hopper FP8; FlashAttention-2 fwd+bwd reaches ~35-55% of peak (Dao 2023; Shah et
# al. 2024 Fig. 5 for FA2 on H100).
DEFAULT_MATMUL_EFFICIENCY = 0.8
DEFAULT_FP8_MATMUL_EFFICIENCY = 0.7
DEFAULT_ATTENTION_EFFICIENCY = 0.4
# Memory-bound training kernels (norms, activations, residuals, loss, optimizer) stream at ~0.77 of the datasheet HBM
# bandwidth: measured on one H200 in a GPT-2 124M training step profile, where the fused GELU kernels ran at ~1.3x
# their traffic bound at 4.8 TB/s (docs/benchmarks.md, 6A fourth round, "What each part of the combined step could
# give"); a plain device copy reaches 0.9 (h200.yaml), fused training kernels less.
HBM_EFFICIENCY = 0.77
# NCCL bus bandwidth vs line rate when the hardware config gives none: ~20% protocol overhead on NVLink
# (NVIDIA/nccl-tests#212, H100: 450 GB/s line -> 370 GB/s busbw), ~4% on InfiniBand (nccl#1576, nccl-tests#267).
NVLINK_BUSBW_FRACTION = 0.8
NIC_BUSBW_FRACTION = 0.96


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

    def group_fabric(self, stride: int, size: int) -> Fabric:
        """The fabric of a group of ``size`` ranks ``stride`` apart (Megatron rank order, TP innermost).

        Inside a node: NVLink. Across nodes, NCCL runs one ring channel per NIC: a group holding k GPUs of every
        node crosses each node boundary on k NICs at once, so its bus bandwidth is min(NVLink, k x NIC busbw)
        (NVIDIA/nccl#1576: a DGX-A100, 8 x 200 Gb/s HDR, reaches 192 GB/s all-reduce busbw across nodes); a group
        with one GPU per node (e.g. DP across nodes with TP=8 inside) gets one NIC.
        """
        if stride * size <= self.gpus_per_node:
            return self.intra
        k = max(1, self.gpus_per_node // stride) if stride < self.gpus_per_node else 1
        if k == 1:
            return self.inter
        bw = min(self.intra.bandwidth_gbps, k * self.inter.bandwidth_gbps)
        return Fabric(f"{self.inter.name} x{k} NICs", bw, self.inter.latency_us, self.inter.hop_latency_us)

    # ---- kernel-level rates (what one GPU's kernels reach; no communication, no bubble) -------------------------
    @property
    def matmul_flops(self) -> float:
        """Achievable dense bf16 GEMM FLOP/s: calibrated matmul, else the hardware's published MAMF, else 0.8 x peak."""
        if self.matmul_tflops:
            return self.matmul_tflops * 1e12
        hw = self.hardware
        return (hw.matmul_tflops_bf16 or DEFAULT_MATMUL_EFFICIENCY * hw.peak_bf16_tflops) * 1e12

    @property
    def matmul_flops_fp8(self) -> float:
        """Achievable FP8 GEMM FLOP/s; the bf16 rate where the GPU has no FP8 tensor cores (A100)."""
        hw = self.hardware
        if not hw.peak_fp8_tflops:
            return self.matmul_flops
        return (hw.matmul_tflops_fp8 or DEFAULT_FP8_MATMUL_EFFICIENCY * hw.peak_fp8_tflops) * 1e12

    @property
    def attention_flops(self) -> float:
        """Flash-attention forward+backward FLOP/s on the causal FLOPs actually executed."""
        hw = self.hardware
        return (hw.attention_tflops_bf16 or DEFAULT_ATTENTION_EFFICIENCY * hw.peak_bf16_tflops) * 1e12

    @property
    def stream_bytes_per_s(self) -> float:
        """HBM bandwidth memory-bound kernels (norms, activations, optimizer) reach: HBM_EFFICIENCY x datasheet."""
        return HBM_EFFICIENCY * self.hbm_bytes_per_s

    def kernel_source(self) -> str:
        hw = self.hardware
        mm = (
            "calibrated matmul"
            if self.matmul_tflops
            else ("hardware.matmul_tflops_bf16" if hw.matmul_tflops_bf16 else f"{DEFAULT_MATMUL_EFFICIENCY} x peak")
        )
        return (
            f"GEMM {self.matmul_flops / 1e12:.0f} TF ({mm}), attention {self.attention_flops / 1e12:.0f} TF, "
            f"memory-bound kernels {self.stream_bytes_per_s / 1e12:.2f} TB/s ({HBM_EFFICIENCY} x HBM)"
        )


def datasheet_profile(hw: HardwareConfig) -> HardwareProfile:
    """Fabrics at NCCL's bus bandwidth (the published busbw, else line rate x the protocol fraction)."""
    intra_bw = hw.nvlink_busbw_gbps or NVLINK_BUSBW_FRACTION * hw.nvlink_gbps
    inter_bw = hw.internode_busbw_gbps or NIC_BUSBW_FRACTION * hw.internode_gbps
    return HardwareProfile(
        hardware=hw,
        intra=Fabric("nvlink", intra_bw, hw.intranode_latency_us, NVLINK_HOP_US),
        inter=Fabric("ib", inter_bw, hw.internode_latency_us, NETWORK_HOP_US),
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
