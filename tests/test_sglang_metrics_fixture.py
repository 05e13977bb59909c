"""phase6's telemetry against the /metrics text SGLang 0.5.16 itself produces (tests/data/sglang_0.5.16_metrics.prom,
written by scripts/repro/sglang_metrics_fixture.py with SGLang's own collectors and multiprocess registry): every
``sglang:`` name telemetry reads is there, and the values read back are the generator's inputs."""

from __future__ import annotations

import ast
from pathlib import Path

from phase6.serving import telemetry

FIXTURE = Path(__file__).parent / "data" / "sglang_0.5.16_metrics.prom"


def inputs() -> dict[str, float]:
    """The generator's inputs, recorded in the fixture's first line."""
    first = FIXTURE.read_text().splitlines()[0]
    return ast.literal_eval(first.split(" inputs ", 1)[1])


def test_every_sglang_name_telemetry_reads_is_in_sglangs_exposition() -> None:
    raw = telemetry.parse_exposition(FIXTURE.read_text())
    ours = [n for names in telemetry.PROM_NAMES.values() for n in names if n.startswith("sglang:")]
    # an SGLang name for every quantity we read, except the per-request TPOT histogram SGLang does not declare
    # (its server-side decode timing is sglang:inter_token_latency_seconds, read as itl_s_*)
    without = {k for k, names in telemetry.PROM_NAMES.items() if not any(n.startswith("sglang:") for n in names)}
    assert without == {"tpot_s_sum", "tpot_s_count"}
    assert len(ours) == len(telemetry.PROM_NAMES) - len(without)
    assert [n for n in ours if n not in raw] == []
    assert "sglang:num_retracted_reqs" in raw  # the gauge exists beside the counter we read


def test_values_read_back_are_the_generators_inputs() -> None:
    got = telemetry.parse_prometheus(FIXTURE.read_text())
    x = inputs()
    assert got == {
        "running": x["running"],
        "waiting": x["waiting"],
        "kv_cache_usage": x["token_usage"],
        "generation_tokens_total": x["generation_tokens"],
        "prompt_tokens_total": x["prompt_tokens"],
        "preemptions_total": x["retracted"],
        "queue_time_s_sum": x["queue_s"],
        "queue_time_s_count": 1.0,
        "ttft_s_sum": x["ttft_s"],
        "ttft_s_count": 1.0,
        "itl_s_sum": x["itl_interval_s"],  # SGLang adds the whole interval to _sum and one count per token
        "itl_s_count": float(x["itl_tokens"]),
    }
