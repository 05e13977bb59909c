"""phase6's client against vLLM's own `vllm bench serve`: one request list, one running server, both clients.

The request list (prompt text + requested output tokens, completions API, ``ignore_eos``, one temperature) goes to
``vllm bench serve --dataset-name custom`` as JSONL, unshuffled and without a chat template, and to
``phase6.serving.client`` as the same bodies; both run closed loop at the same concurrency after the same number of
warmup copies of the first request. Everything runs in ONE process of the vLLM environment
(``<vllm python> -m phase6.serving.crosscheck``): vLLM's client is its ``vllm bench serve`` parser and ``main``
called in-process, so no run pays an interpreter start. Runs alternate in pairs (default ``pvvpvppv``: phase6,
vLLM, vLLM, phase6, ...) and the throughput comparison is the median over pairs of phase6/vLLM, so a shared
machine's drift falls on both clients alike.

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
- completed: an answer whose tokens all decode to nothing (a random model repeating a byte fragment at
  temperature 0) is completed for vLLM's client (it saw ``choices``) and failed for phase6 (no content).
Measured on CPU: docs/benchmarks.md ("6B on a real vLLM (CPU)").
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phase6 import timing
from phase6.serving.client import RunOutcome, request_body, run_benchmark
from phase6.serving.slo import percentile
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
    cpu_s: float = 0.0
    """CPU seconds this process spent in the run (client overhead; on a 2-core box it competes with the server)."""


def phase6_run(
    base_url: str,
    model_id: str,
    requests: list[BenchRequest],
    concurrency: int,
    warmups: int,
    extra_body: dict,
    temperature: float,
) -> tuple[ClientRun, RunOutcome]:
    kw = dict(engine="vllm", api="completions", model=model_id, fix_output_len=True, temperature=temperature)
    bodies = [request_body(r, extra_body=extra_body, **kw) for r in requests]
    t, c = timing.wall(), timing.cpu()
    out = run_benchmark(base_url, "completions", bodies, [0.0] * len(bodies), concurrency, warmup=[bodies[0]] * warmups)
    wall, cpu = timing.wall() - t, timing.cpu() - c
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
            ttft_p50_ms=percentile([r.ttft_s * 1e3 for r in ok], 50),
            ttft_p99_ms=percentile([r.ttft_s * 1e3 for r in ok], 99),
            tpot_p50_ms=percentile([r.tpot_s * 1e3 for r in ok], 50),
            tpot_p99_ms=percentile([r.tpot_s * 1e3 for r in ok], 99),
            itl_p50_ms=percentile([g * 1e3 for r in ok for g in r.itl_samples_s()], 50),
            itl_p99_ms=percentile([g * 1e3 for r in ok for g in r.itl_samples_s()], 99),
            e2e_p50_ms=percentile([r.e2e_s * 1e3 for r in ok], 50),
            wall_s=wall,
            cpu_s=cpu,
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
    temperature: float,
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
        "--temperature", str(temperature),
        "--num-warmups", str(warmups),
        "--extra-body", json.dumps(extra_body),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--save-result",
        "--result-dir", str(result_dir),
        "--result-filename", name,
        "--disable-tqdm",
    ]  # fmt: skip


def vllm_run(args: list[str], result: Path) -> ClientRun:
    """`vllm bench serve` in this process (its own parser and ``main``, as ``vllm_env.BENCH_SERVE`` runs them)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    t, c = timing.wall(), timing.cpu()
    bench_main(parser.parse_args(args))
    wall, cpu = timing.wall() - t, timing.cpu() - c
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
        cpu_s=cpu,
    )


def crosscheck(
    base_url: str,
    model_id: str,
    tokenizer: str,
    requests: list[BenchRequest],
    concurrency: int,
    out_dir: Path,
    *,
    warmups: int | None = None,
    order: str = "pvvpvppv",
    extra_body: dict | None = None,
    temperature: float = 0.0,
) -> dict[str, Any]:
    """Run both clients over ``requests`` in ``order`` (p = phase6, v = vLLM; pairs of one each); all runs and
    the comparison (median over pairs of the phase6/vLLM output-throughput ratio)."""
    if len(order) % 2 or any(sorted(order[i : i + 2]) != ["p", "v"] for i in range(0, len(order), 2)):
        raise ValueError(f"order must be pairs of one 'p' and one 'v', got {order!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    warm = concurrency if warmups is None else warmups
    extra = dict(extra_body or {})
    dataset = out_dir / "requests.jsonl"
    with dataset.open("w") as f:
        for r in requests:
            f.write(json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) + "\n")
    runs: list[ClientRun] = []
    for i, who in enumerate(order):
        if who == "p":
            runs.append(phase6_run(base_url, model_id, requests, concurrency, warm, extra, temperature)[0])
        else:
            name = f"vllm_bench_{i}.json"
            args = vllm_bench_args(
                base_url,
                model_id,
                tokenizer,
                dataset,
                len(requests),
                concurrency,
                warm,
                extra,
                temperature,
                out_dir,
                name,
            )
            runs.append(vllm_run(args, out_dir / name))
    ratios = []
    for a, b in zip(runs[::2], runs[1::2], strict=True):
        p, v = (a, b) if a.client == "phase6" else (b, a)
        ratios.append(p.output_tok_s / v.output_tok_s)
    by: dict[str, list[ClientRun]] = {"phase6": [], "vllm bench serve": []}
    for r in runs:
        by[r.client].append(r)
    result = {
        "requests": len(requests),
        "concurrency": concurrency,
        "order": order,
        "temperature": temperature,
        "runs": {k: [r.__dict__ for r in rs] for k, rs in by.items()},
        "median_output_tok_s": {k: float(np.median([r.output_tok_s for r in rs])) for k, rs in by.items()},
        "pair_throughput_ratios": ratios,
        "throughput_ratio": float(np.median(ratios)),
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
        ("client CPU s", "cpu_s"),
    ]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for rs in result["runs"].values():
        for r in rs:
            cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for _, k in cols]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``<vllm python> -m phase6.serving.crosscheck --base-url URL --model-id ID --tokenizer DIR
    --requests requests.jsonl (prompt, output_tokens per line) --concurrency 16 --out DIR``: crosscheck.json and
    the side-by-side table on stdout."""
    ap = argparse.ArgumentParser(prog="python -m phase6.serving.crosscheck")
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--requests", required=True, type=Path)
    ap.add_argument("--concurrency", required=True, type=int)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--order", default="pvvpvppv")
    ap.add_argument("--warmups", type=int, default=None)
    ap.add_argument("--extra-body", default="{}", help="JSON merged into every request body (both clients)")
    ap.add_argument("--temperature", type=float, default=0.0)
    a = ap.parse_args(argv)
    reqs = []
    for i, line in enumerate(a.requests.read_text().splitlines()):
        d = json.loads(line)
        reqs.append(BenchRequest(index=i, prompt=d["prompt"], prompt_len=0, output_len=int(d["output_tokens"])))
    res = crosscheck(
        a.base_url,
        a.model_id,
        a.tokenizer,
        reqs,
        a.concurrency,
        a.out,
        warmups=a.warmups,
        order=a.order,
        extra_body=json.loads(a.extra_body),
        temperature=a.temperature,
    )
    print("PHASE6_CROSSCHECK")
    print(table(res))
    print(f"output tok/s, median phase6/vLLM over pairs: {res['throughput_ratio']:.3f} {res['pair_throughput_ratios']}")


if __name__ == "__main__":
    main()
