"""The serving memory reserve measured from a vLLM server's start-up log, against `phase6 plan`'s serving formula.

vLLM sizes its KV cache after a profile run: KV = gpu_memory_utilization x HBM - weights - (activation peak of the
largest forward + non-torch memory), then captures CUDA graphs (logged separately). The planner predicts the same
budget as weights + ``runtime_overhead_gib`` + the activations of a min(context, max_num_batched_tokens)-token forward
(phase6.plan.memory.serve_memory). This module reads the log lines vLLM prints
- ``Model loading took 27.52 GiB [memory] and 5.3 seconds``
- ``Available KV cache memory: 96.40 GiB`` and ``GPU KV cache size: 527,040 tokens``
- ``Graph capturing finished in 5 secs, took 0.89 GiB`` (or ``CUDA graphs ... took 0.89 GiB``)
- optionally ``torch peak memory increase: 1.42GiB`` / ``non-torch forward increase memory: 0.14GiB``
and returns the measured reserve (usable - weights - KV), the planner's prediction and the calibrated
``runtime_overhead_gib`` that makes them agree (reserve - the formula's activation part). A field a log lacks is
reported missing with the reason, never 0.

    python -m phase6.plan.serve_reserve LOG --hbm-gib 140.4 --util 0.9 --model qwen2.5-14b [--max-num-batched-tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from phase6.plan.memory import GIB, serve_memory
from phase6.plan.model import ModelSpec, resolve_model

_NUM = r"([0-9][0-9,]*\.?[0-9]*)"
PATTERNS: dict[str, str] = {
    "weights_gib": rf"Model loading took {_NUM}\s*GiB",
    "kv_cache_gib": rf"Available KV cache memory:\s*{_NUM}\s*GiB",
    "kv_cache_tokens": rf"GPU KV cache size:\s*{_NUM}\s*tokens",
    "cuda_graph_gib": rf"(?:Graph capturing finished|CUDA graphs?)[^\n]*?took {_NUM}\s*GiB",
    "cuda_graph_s": rf"Graph capturing finished in {_NUM}\s*secs?",
    "activation_peak_gib": rf"(?:torch peak memory increase|PyTorch activation peak memory takes):?\s*{_NUM}\s*GiB",
    "non_torch_gib": rf"(?:non-torch forward increase memory|non_torch_memory takes):?\s*{_NUM}\s*GiB",
}


@dataclass
class VllmMemoryProfile:
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: float | None = None
    cuda_graph_gib: float | None = None
    cuda_graph_s: float | None = None
    activation_peak_gib: float | None = None
    non_torch_gib: float | None = None
    source: str = ""

    def missing(self) -> dict[str, str]:
        return {k: f"no line matching {PATTERNS[k]!r} in {self.source}" for k in PATTERNS if getattr(self, k) is None}


def parse_vllm_log(text: str, source: str = "log") -> VllmMemoryProfile:
    """The last value of every memory line vLLM printed (a restarted engine logs them again)."""
    prof = VllmMemoryProfile(source=source)
    for key, pat in PATTERNS.items():
        hits = re.findall(pat, text)
        if hits:
            setattr(prof, key, float(hits[-1].replace(",", "")))
    return prof


def calibrate(
    prof: VllmMemoryProfile,
    model: ModelSpec,
    hbm_gib: float,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int = 8192,
    context_len: int = 8192,
    runtime_overhead_gib: float = 1.5,
    tp: int = 1,
) -> dict[str, Any]:
    """Measured reserve vs the planner's; the ``runtime_overhead_gib`` that reproduces the measured KV cache."""
    if prof.kv_cache_gib is None:
        raise ValueError(f"{prof.source}: no 'Available KV cache memory' line: the reserve cannot be measured")
    usable = gpu_memory_utilization * hbm_gib
    formula_weights = model.num_params() * 2.0 / tp / GIB
    weights = prof.weights_gib if prof.weights_gib is not None else formula_weights
    reserve = usable - weights - prof.kv_cache_gib
    pred = serve_memory(
        model,
        tp,
        1,
        context_len,
        hbm_gib,
        gpu_memory_utilization,
        runtime_overhead_gib,
        2.0,
        2.0,
        1,
        max_num_batched_tokens,
    )
    activation_formula = pred.overhead_bytes / GIB - runtime_overhead_gib
    out = {
        "usable_gib": usable,
        "weights_gib": weights,
        "weights_source": "vLLM log"
        if prof.weights_gib is not None
        else "planner's count (no 'Model loading took' line)",
        "kv_cache_gib_measured": prof.kv_cache_gib,
        "kv_cache_gib_predicted": pred.kv_capacity_tokens * pred.kv_bytes_per_token / GIB,
        "reserve_gib_measured": reserve,
        "reserve_gib_predicted": pred.overhead_bytes / GIB,
        "activation_reserve_gib_formula": activation_formula,
        # what makes the planner's own KV capacity (its weight count, not the log's) equal the measured one
        "runtime_overhead_gib_calibrated": usable - formula_weights - prof.kv_cache_gib - activation_formula,
        "weights_gib_planner": formula_weights,
        "cuda_graph_gib": prof.cuda_graph_gib,
        "beyond_budget_gib": prof.cuda_graph_gib,
        "note": "vLLM captures CUDA graphs after sizing the KV cache: their pool comes on top of "
        "gpu_memory_utilization x HBM, so the headroom 1 - utilization must hold it",
        "missing": prof.missing(),
    }
    if prof.activation_peak_gib is not None:
        out["activation_peak_gib_measured"] = prof.activation_peak_gib
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m phase6.plan.serve_reserve", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="vLLM server log (stdout+stderr)")
    ap.add_argument("--model", required=True, help="planner preset name or HF config.json path")
    ap.add_argument("--hbm-gib", type=float, required=True, help="the GPU's memory (nvidia-smi total / 1024)")
    ap.add_argument("--util", type=float, default=0.9, help="--gpu-memory-utilization of the run")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--context-len", type=int, default=8192)
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args(argv)
    path = Path(a.log)
    try:
        if not path.is_file():
            raise ValueError(f"{path}: no such log file")
        model = resolve_model({}, a.model) if a.model.endswith(".json") else resolve_model(a.model)
        prof = parse_vllm_log(path.read_text(errors="replace"), str(path))
        res = calibrate(prof, model, a.hbm_gib, a.util, a.max_num_batched_tokens, a.context_len, tp=a.tp)
    except ValueError as e:
        print(f"serve_reserve: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"profile": asdict(prof), "calibration": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
