"""Write tests/data/sglang_0.5.16_metrics.prom: the /metrics text SGLang 0.5.16 serves, made by SGLang's own code.

SGLang's server runs prometheus_client in multiprocess mode (``set_prometheus_multiproc_dir``: the scheduler and the
tokenizer manager write mmap files) and serves ``/metrics`` from a ``MultiProcessCollector`` registry
(``add_prometheus_middleware``). This script does the same in one process on CPU: SGLang's
``TokenizerMetricsCollector`` and ``SchedulerMetricsCollector`` with the labels its launcher gives them, one
finished request (583 prompt / 93 generated tokens, TTFT 0.05 s, queue 0.002 s), one scheduler stats tick (3
running, 1 waiting, token usage 0.25) and one retraction; then the exposition through SGLang's own registry set-up.
The numbers are inputs, so tests/test_serve_lifecycle.py checks that phase6's telemetry reads back exactly them
from SGLang's real names, label sets and multiprocess aggregation (not hand-written text). Reproduces the fixture
described in docs/benchmarks.md "SGLang on the lent H200 (issue 29)".

    # Python 3.12 with torch 2.11 and the SGLang carry's site on PYTHONPATH (docs/benchmarks.md, issue 29)
    # (MODEL: a config.json + tokenizer directory, e.g. the carry's setup.tar.xz models/qwen2.5-14b-fullvocab;
    # ServerArgs reads it)
    PYTHONPATH=/tmp/site python scripts/repro/sglang_metrics_fixture.py tests/data/sglang_0.5.16_metrics.prom MODEL
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

INPUTS = {
    "prompt_tokens": 583,
    "generation_tokens": 93,
    "ttft_s": 0.05,
    "queue_s": 0.002,
    "running": 3,
    "waiting": 1,
    "token_usage": 0.25,
    "retracted": 1,
    "itl_interval_s": 0.92,  # one decode interval that delivered itl_tokens tokens (SGLang divides it per token)
    "itl_tokens": 92,
}


def main(out: Path, model: str) -> None:
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()  # before prometheus_client is imported, as the server does
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from sglang.srt.observability.metrics_collector import (
        QueueCount,
        SchedulerMetricsCollector,
        SchedulerStats,
        TokenizerMetricsCollector,
    )
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=model, served_model_name="qwen2.5-14b-fullvocab", device="cpu", enable_metrics=True)
    tok_labels = {"model_name": "qwen2.5-14b-fullvocab"}
    tok = TokenizerMetricsCollector(server_args=sa, labels=tok_labels)
    tok.observe_one_finished_request(
        tok_labels, INPUTS["prompt_tokens"], INPUTS["generation_tokens"], 0, 1.0, has_grammar=False
    )
    tok.observe_time_to_first_token(tok_labels, INPUTS["ttft_s"])
    tok.observe_inter_token_latency(tok_labels, INPUTS["itl_interval_s"], INPUTS["itl_tokens"])
    sched_labels = {
        "model_name": "qwen2.5-14b-fullvocab",
        "engine_type": "unified",
        "tp_rank": 0,
        "pp_rank": 0,
        "moe_ep_rank": 0,
    }
    sched = SchedulerMetricsCollector(labels=sched_labels, server_args=sa)
    sched.observe_queue_time(INPUTS["queue_s"])
    sched.log_stats(
        SchedulerStats(
            num_running_reqs=QueueCount(total=INPUTS["running"]),
            num_queue_reqs=QueueCount(total=INPUTS["waiting"]),
            token_usage=INPUTS["token_usage"],
        )
    )
    sched.increment_retracted_reqs(INPUTS["retracted"], 100, 10)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    text = generate_latest(registry).decode()
    header = f"# sglang {metadata.version('sglang')}, prometheus_client {metadata.version('prometheus_client')}; "
    header += f"scripts/repro/sglang_metrics_fixture.py inputs {INPUTS}\n"
    out.write_text(header + text)
    print(f"{out}: {len(text.splitlines())} lines, {text.count('# TYPE')} metrics")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
