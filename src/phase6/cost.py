"""Cost accounting: GPU-hours, dollars, per-1M-token figures and the comparison with hosted API prices.

Formulas (stated in every report that uses them):
  gpu_hours              = num_gpus * seconds / 3600
  usd                    = gpu_hours * usd_per_gpu_hour
  gpu_hours_per_1m_tok   = num_gpus * 1e6 / (3600 * tokens_per_s)      (tokens_per_s summed over the job)
  usd_per_1m_tok         = gpu_hours_per_1m_tok * usd_per_gpu_hour
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from phase6.config import ApiPrice, CostRunConfig, HardwareConfig


def gpu_hours(num_gpus: int, seconds: float) -> float:
    if num_gpus < 1 or seconds < 0:
        raise ValueError(f"gpu_hours: need num_gpus >= 1 and seconds >= 0, got {num_gpus}, {seconds}")
    return num_gpus * seconds / 3600.0


def usd(gpu_h: float, usd_per_gpu_hour: float) -> float:
    return gpu_h * usd_per_gpu_hour


def gpu_hours_per_1m_tokens(num_gpus: int, tokens_per_s: float) -> float:
    """GPU-hours to process one million tokens at a sustained aggregate rate; inf when nothing was produced."""
    if tokens_per_s <= 0:
        return float("inf")
    return num_gpus * 1e6 / (3600.0 * tokens_per_s)


def usd_per_1m_tokens(num_gpus: int, tokens_per_s: float, usd_per_gpu_hour: float) -> float:
    return gpu_hours_per_1m_tokens(num_gpus, tokens_per_s) * usd_per_gpu_hour


def run_cost(hardware: HardwareConfig, num_gpus: int, seconds: float, tokens: float = 0.0) -> dict[str, Any]:
    """The ``cost`` block of results.json for a job that held ``num_gpus`` for ``seconds`` and made ``tokens``."""
    gh = gpu_hours(num_gpus, seconds)
    out: dict[str, Any] = {
        "hardware": hardware.name,
        "num_gpus": num_gpus,
        "seconds": seconds,
        "gpu_hours": gh,
        "usd_per_gpu_hour": hardware.usd_per_gpu_hour,
        "usd": usd(gh, hardware.usd_per_gpu_hour),
        "price_source": f"{hardware.source} ({hardware.date})",
        "formula": "usd = num_gpus * seconds / 3600 * usd_per_gpu_hour",
    }
    if tokens > 0:
        rate = tokens / seconds if seconds > 0 else 0.0
        out["tokens"] = tokens
        out["gpu_hours_per_1m_tokens"] = gpu_hours_per_1m_tokens(num_gpus, rate)
        out["usd_per_1m_tokens"] = usd_per_1m_tokens(num_gpus, rate, hardware.usd_per_gpu_hour)
    return out


def api_comparison(
    self_usd_per_1m_in: float, self_usd_per_1m_out: float, prices: list[ApiPrice]
) -> list[dict[str, Any]]:
    """One row per API price: its $/1M input and output next to ours and the ratio (API / self-hosted)."""
    rows = []
    for p in prices:
        rows.append(
            {
                "provider": p.provider,
                "model": p.model,
                "api_usd_per_1m_input": p.usd_per_1m_input,
                "api_usd_per_1m_output": p.usd_per_1m_output,
                "self_usd_per_1m_input": self_usd_per_1m_in,
                "self_usd_per_1m_output": self_usd_per_1m_out,
                "output_api_over_self": (p.usd_per_1m_output / self_usd_per_1m_out)
                if self_usd_per_1m_out > 0
                else None,
                "source": f"{p.source} ({p.date})",
            }
        )
    return rows


def main(cfg: CostRunConfig) -> dict[str, Any]:
    """`phase6 cost`: the bill for ``gpus`` x ``hours`` and, when tokens are given, $ per 1M tokens vs APIs."""
    from phase6.runrecord import RunRecord

    rec = RunRecord(cfg, job="cost")
    seconds = cfg.hours * 3600.0
    total_tokens = cfg.input_tokens + cfg.output_tokens
    block = run_cost(cfg.hardware, cfg.gpus, seconds, total_tokens)
    # Split the bill by token type the way API prices are quoted: all GPU time charged to output tokens
    # (decode dominates serving cost), input priced at the all-token rate. Both stated in the table.
    self_in = (
        usd_per_1m_tokens(cfg.gpus, total_tokens / seconds, cfg.hardware.usd_per_gpu_hour) if total_tokens else 0.0
    )
    self_out = (
        usd_per_1m_tokens(cfg.gpus, cfg.output_tokens / seconds, cfg.hardware.usd_per_gpu_hour)
        if cfg.output_tokens
        else 0.0
    )
    rows = [
        {
            "hardware": cfg.hardware.name,
            "gpus": cfg.gpus,
            "hours": cfg.hours,
            "gpu_hours": block["gpu_hours"],
            "usd": block["usd"],
            "usd_per_1m_tokens_all": self_in,
            "usd_per_1m_output_tokens": self_out,
        }
    ]
    comparison = api_comparison(self_in, self_out, cfg.prices.api) if total_tokens else []
    rec.finish(
        rows,
        cost=block,
        extra={"api_comparison": comparison, "hardware": asdict(cfg.hardware)},
        tables={"API price comparison": comparison},
    )
    return block
