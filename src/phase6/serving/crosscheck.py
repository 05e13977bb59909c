"""phase6's client against vLLM's own `vllm bench serve`: one request list, one running server, both clients.

The request list (prompt text + requested output tokens, completions API, ``ignore_eos``, temperature 0) goes to
``vllm bench serve --dataset-name custom`` as JSONL, unshuffled and without a chat template, and to
``phase6.serving.client`` as the same bodies; both run closed loop at the same concurrency after the same number of
warmup copies of the first request. Runs alternate (phase6, vLLM, vLLM, phase6 by default) so that drift of a
shared machine falls on both clients alike.

What must agree: completed requests and output tokens (the server's usage; ``ignore_eos`` fixes every length),
input tokens (both take the server's ``usage.prompt_tokens``), and output throughput (same denominator: first
dispatch -> last request end). What may differ, and why:
- TTFT: vLLM's client stops at the first SSE message carrying ``choices`` (on /v1/completions even an empty
  text); phase6 at the first non-empty content, so a first token that decodes to nothing (a partial UTF-8 byte)
  waits for the next one. Both exclude time queued in the client (vLLM #54101).
- ITL: vLLM pools raw per-chunk gaps, stamped when its coroutine reads each chunk; phase6 splits a chunk of k
  tokens into k gaps of g/k and stamps each socket read as it arrives (events of one read are one delivery).
  Chunks without visible text still carry a token: vLLM counts their gaps, phase6 folds them into the next.
- TPOT: the same formula, (E2E - TTFT) / (output tokens - 1), so it moves with the TTFT/E2E stamps above.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phase6.serving.client import RunOutcome, request_body, run_benchmark
from phase6.serving.stats import pct
from phase6.serving.vllm_env import vllm_bench_command
from phase6.serving.workload import BenchRequest


@dataclass
class ClientRun:
    """One client's run through the list: the numbers both clients report."""

    client: str
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    duration_s: float
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_ms: float
    wall_s: float


def phase6_run(
    base_url: str, model_id: str, requests: list[BenchRequest], concurrency: int, warmups: int, extra_body: dict
) -> tuple[ClientRun, RunOutcome]:
    kw = dict(engine="vllm", api="completions", model=model_id, fix_output_len=True, temperature=0.0)
    bodies = [request_body(r, extra_body=extra_body, **kw) for r in requests]
    t = time.perf_counter()
    out = run_benchmark(base_url, "completions", bodies, [0.0] * len(bodies), concurrency, warmup=[bodies[0]] * warmups)
    wall = time.perf_counter() - t
    ok = [r for r in out.results if r.ok]
    out_tok = sum(r.output_tokens for r in ok)
    return (
        ClientRun(
            client="phase6",
            completed=len(ok),
            failed=out.planned - len(ok),
            input_tokens=sum(r.prompt_tokens or 0 for r in ok),
            output_tokens=out_tok,
            duration_s=out.duration_s,
            output_tok_s=out_tok / out.duration_s,
            ttft_p50_ms=pct([r.ttft_s * 1e3 for r in ok], 50),
            ttft_p99_ms=pct([r.ttft_s * 1e3 for r in ok], 99),
            tpot_p50_ms=pct([r.tpot_s * 1e3 for r in ok], 50),
            tpot_p99_ms=pct([r.tpot_s * 1e3 for r in ok], 99),
            itl_p50_ms=pct([g * 1e3 for r in ok for g in r.itl_samples_s()], 50),
            itl_p99_ms=pct([g * 1e3 for r in ok for g in r.itl_samples_s()], 99),
            e2e_p50_ms=pct([r.e2e_s * 1e3 for r in ok], 50),
            wall_s=wall,
        ),
        out,
    )


def vllm_bench_args(
    base_url: str,
    model_id: str,
    tokenizer: str,
    dataset: Path,
    n: int,
    concurrency: int,
    warmups: int,
    extra_body: dict,
    result_dir: Path,
    name: str,
) -> list[str]:
    """The `vllm bench serve` arguments for the request list in ``dataset`` (JSONL of prompt/output_tokens)."""
    return [
        "--backend", "openai",
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", model_id,
        "--tokenizer", tokenizer,
        "--dataset-name", "custom",
        "--dataset-path", str(dataset),
        "--custom-output-len", "-1",
        "--skip-chat-template",
        "--disable-shuffle",
        "--num-prompts", str(n),
        "--max-concurrency", str(concurrency),
        "--request-rate", "inf",
        "--ignore-eos",
        "--temperature", "0",
        "--num-warmups", str(warmups),
        "--extra-body", json.dumps(extra_body),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--save-result",
        "--result-dir", str(result_dir),
        "--result-filename", name,
        "--disable-tqdm",
    ]  # fmt: skip


def vllm_run(python: str | None, args: list[str], result: Path, log: Path, timeout_s: float = 600) -> ClientRun:
    cmd = vllm_bench_command(python)
    if cmd is None:
        raise RuntimeError("no vLLM environment for `vllm bench serve`")
    t = time.perf_counter()
    with log.open("ab") as f:
        f.write(f"$ {' '.join(cmd[:2])} <bench serve> {' '.join(args)}\n".encode())
        f.flush()
        proc = subprocess.run([*cmd, *args], stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0 or not result.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}; log {log}:\n{tail}")
    r = json.loads(result.read_text())
    return ClientRun(
        client="vllm bench serve",
        completed=int(r["completed"]),
        failed=int(r["failed"]),
        input_tokens=int(r["total_input_tokens"]),
        output_tokens=int(r["total_output_tokens"]),
        duration_s=float(r["duration"]),
        output_tok_s=float(r["output_throughput"]),
        ttft_p50_ms=float(r["p50_ttft_ms"]),
        ttft_p99_ms=float(r["p99_ttft_ms"]),
        tpot_p50_ms=float(r["p50_tpot_ms"]),
        tpot_p99_ms=float(r["p99_tpot_ms"]),
        itl_p50_ms=float(r["p50_itl_ms"]),
        itl_p99_ms=float(r["p99_itl_ms"]),
        e2e_p50_ms=float(r["p50_e2el_ms"]),
        wall_s=wall,
    )


def crosscheck(
    base_url: str,
    model_id: str,
    tokenizer: str,
    requests: list[BenchRequest],
    concurrency: int,
    out_dir: Path,
    *,
    python: str | None = None,
    warmups: int | None = None,
    order: str = "pvvp",
    extra_body: dict | None = None,
) -> dict[str, Any]:
    """Run both clients over ``requests`` in ``order`` (p = phase6, v = vLLM); per-client runs and the comparison."""
    out_dir.mkdir(parents=True, exist_ok=True)
    warm = concurrency if warmups is None else warmups
    extra = dict(extra_body or {})
    dataset = out_dir / "requests.jsonl"
    with dataset.open("w") as f:
        for r in requests:
            f.write(json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) + "\n")
    runs: dict[str, list[ClientRun]] = {"phase6": [], "vllm bench serve": []}
    for i, who in enumerate(order):
        if who == "p":
            run, _ = phase6_run(base_url, model_id, requests, concurrency, warm, extra)
        else:
            name = f"vllm_bench_{i}.json"
            args = vllm_bench_args(
                base_url, model_id, tokenizer, dataset, len(requests), concurrency, warm, extra, out_dir, name
            )
            run = vllm_run(python, args, out_dir / name, out_dir / "vllm_bench.log")
        runs[run.client].append(run)
    mean_rate = {k: float(np.mean([r.output_tok_s for r in v])) for k, v in runs.items()}
    p, v = mean_rate["phase6"], mean_rate["vllm bench serve"]
    result = {
        "requests": len(requests),
        "concurrency": concurrency,
        "order": order,
        "runs": {k: [r.__dict__ for r in rs] for k, rs in runs.items()},
        "mean_output_tok_s": mean_rate,
        "throughput_ratio": p / v if v > 0 else math.nan,
    }
    (out_dir / "crosscheck.json").write_text(json.dumps(result, indent=2))
    return result


def table(result: dict[str, Any]) -> str:
    """Markdown: one line per client run, the metrics side by side."""
    cols = [
        ("client", "client"),
        ("completed", "completed"),
        ("failed", "failed"),
        ("input tok", "input_tokens"),
        ("output tok", "output_tokens"),
        ("duration s", "duration_s"),
        ("output tok/s", "output_tok_s"),
        ("TTFT p50 ms", "ttft_p50_ms"),
        ("TTFT p99 ms", "ttft_p99_ms"),
        ("TPOT p50 ms", "tpot_p50_ms"),
        ("TPOT p99 ms", "tpot_p99_ms"),
        ("ITL p50 ms", "itl_p50_ms"),
        ("ITL p99 ms", "itl_p99_ms"),
    ]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for rs in result["runs"].values():
        for r in rs:
            cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for _, k in cols]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
