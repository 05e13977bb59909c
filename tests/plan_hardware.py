"""The H100 SXM the planner tests (test_plan_recommend.py, test_plan_step.py, test_plan_serve.py) predict for: the
datasheet numbers of configs/hardware/h100_sxm.yaml spelled out here (no price), so an edit of that file does not move
the tests' expected values."""

from __future__ import annotations

from phase6.config import HardwareConfig
from phase6.plan.profile import build_profile

HW = HardwareConfig(
    name="h100_sxm",
    peak_bf16_tflops=989.4,
    hbm_gib=79.6,
    hbm_tbps=3.35,
    nvlink_gbps=450.0,
    internode_gbps=50.0,
    intranode_latency_us=30.0,
    internode_latency_us=50.0,
    gpus_per_node=8,
)
PROFILE = build_profile(HW)
