"""6B server lifecycle (command lines, readiness, log tail, process-group stop, sweep cache) and telemetry."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from phase6.config.serve import ServeConfig
from phase6.serving import scripted_server, server, telemetry


def test_command_lines_pass_engine_args_through() -> None:
    cfg = ServeConfig(
        engine="vllm",
        model="m",
        tp=2,
        dtype="bfloat16",
        max_model_len=4096,
        launcher=["/opt/vllm-env/bin/vllm", "serve"],
        engine_args={"load-format": "dummy", "enforce-eager": True, "enable-chunked-prefill": False},
    )
    cmd = server.build_command(cfg, "m", 8001)
    assert cmd[1:] == [
        "serve",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--tensor-parallel-size",
        "2",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--load-format",
        "dummy",
        "--enforce-eager",
    ]
    sg = server.build_command(ServeConfig(engine="sglang", tp=4, engine_args={"disable-radix-cache": True}), "m", 1)
    assert sg[1:3] == ["-m", "sglang.launch_server"] and sg[sg.index("--tp-size") + 1] == "4"
    assert "--enable-metrics" in sg and "--context-length" in sg and sg[-1] == "--disable-radix-cache"
    tf = server.build_command(
        ServeConfig(
            engine="transformers", tp=1, max_model_len=None, engine_args={"continuous-batching": True, "device": "cpu"}
        ),
        "/d",
        5,
    )
    assert tf[1:] == [
        "-m",
        "transformers.cli.transformers",
        "serve",
        "/d",
        "--host",
        "127.0.0.1",
        "--port",
        "5",
        "--dtype",
        "auto",
        "--continuous-batching",
        "--device",
        "cpu",
    ]
    with pytest.raises(ValueError, match="serve.launcher: 'no-such-engine-binary' is not installed here"):
        server.build_command(ServeConfig(engine="vllm", launcher=["no-such-engine-binary", "serve"]), "m", 1)
    with pytest.raises(ValueError, match="serve.tp: transformers serve has no tensor parallelism"):
        server.build_command(ServeConfig(engine="transformers", tp=2), "/d", 5)


def fake(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_not_ready_times_out_with_the_log_tail_and_kills_the_group(tmp_path: Path) -> None:
    cfg = ServeConfig(
        engine="vllm",
        launcher=fake("import time; print('loading shard 3/30', flush=True); time.sleep(120)"),
        ready_timeout_s=2.0,
        pin_server=False,
    )
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"not ready after 2 s.*loading shard 3/30"):
        server.acquire(cfg, "m", tmp_path / "server.log")
    assert time.perf_counter() - t < 30
    srv_cmd = (tmp_path / "server.log").read_text().splitlines()[0]
    assert srv_cmd.startswith("$ ") and "--tensor-parallel-size" in srv_cmd


def test_exit_during_startup_fails_at_once(tmp_path: Path) -> None:
    cfg = ServeConfig(
        engine="sglang",
        launcher=fake("import sys; print('CUDA out of memory'); sys.exit(3)"),
        ready_timeout_s=60,
        pin_server=False,
    )
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"exited with code 3 during startup: CUDA out of memory"):
        server.acquire(cfg, "m", tmp_path / "server.log")
    assert time.perf_counter() - t < 20


def test_import_crash_at_startup_is_one_line_naming_the_engines_last_error(tmp_path: Path) -> None:
    """Call E's failure (docs/benchmarks.md, issue 29): SGLang died importing its configs under the image's
    transformers, a Python traceback in its log. The UserError (CLI: one line, exit 2) carries the traceback's
    last line, the exception itself, not the traceback; any child the leader left is stopped first."""
    crash = (
        "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('child', c.pid); "
        "print('Traceback (most recent call last):'); print('  File \"/tmp/site/sglang/srt/configs/qwen3_asr.py\"');"
        "print(\"ValueError: 'qwen3_asr' is already used by a Transformers config, pick another name.\", flush=True);"
        "sys.exit(1)"
    )
    cfg = ServeConfig(engine="sglang", launcher=fake(crash), ready_timeout_s=60, pin_server=False)
    with pytest.raises(server.UserError) as e:
        server.acquire(cfg, "m", tmp_path / "server.log")
    msg = str(e.value)
    assert msg.startswith("serve.engine: sglang server process exited with code 1 during startup: ValueError: ")
    assert "'qwen3_asr' is already used" in msg and "Traceback" not in msg and "\n" not in msg
    assert f"(log: {tmp_path / 'server.log'})" in msg
    child = int(next(ln for ln in (tmp_path / "server.log").read_text().splitlines() if ln.startswith("child "))[6:])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_rejected_flag_is_the_engines_own_one_line_user_error(tmp_path: Path) -> None:
    """An engine that exits 2 from its argument parser (vLLM's and SGLang's argparse) gives a UserError (the CLI's
    one line and exit 2) carrying the parser's own message, not the INFO line before it."""
    parser = (
        "import argparse, sys; p = argparse.ArgumentParser(prog='launch_server.py'); "
        "p.add_argument('--model-path'); print('INFO importing', flush=True); p.parse_args(sys.argv[1:])"
    )
    cfg = ServeConfig(
        engine="sglang",
        launcher=fake(parser),
        max_model_len=None,
        ready_timeout_s=60,
        pin_server=False,
        engine_args={"no-such-flag": 1},
    )
    with pytest.raises(server.UserError) as e:
        server.acquire(cfg, "m", tmp_path / "server.log")
    msg = str(e.value)
    assert msg.startswith("serve.engine: sglang server process exited with code 2 during startup: launch_server.py: ")
    assert "unrecognized arguments: --host 127.0.0.1" in msg and "--no-such-flag 1" in msg and "\n" not in msg


def test_sweep_cache_reuses_until_the_launch_spec_changes(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([{"ttft_s": 0.01, "gaps_s": [0.01]}]))
    # bash keeps a `sleep` child in the server's process group: stop() must take it down too
    launcher = [
        "bash",
        "-c",
        'sleep 300 & exec "$0" "$@"',
        sys.executable,
        "-m",
        "phase6.serving.scripted_server",
        "--scripts",
        str(scripts),
    ]
    tp2 = ServeConfig(engine="vllm", launcher=launcher, tp=2, ready_timeout_s=30)
    try:
        a, reused_a = server.acquire(tp2, "m", tmp_path / "a.log")
        b, reused_b = server.acquire(
            ServeConfig(engine="vllm", launcher=launcher, tp=2, ready_timeout_s=30), "m", tmp_path / "b.log"
        )
        assert (reused_a, reused_b) == (False, True) and a is b and a.model_id == "scripted"
        assert a.version == "scripted-1"  # from GET /version, as vLLM reports it
        c, reused_c = server.acquire(
            ServeConfig(engine="vllm", launcher=launcher, tp=4, ready_timeout_s=30), "m", tmp_path / "c.log"
        )
        assert not reused_c and c.proc.pid != a.proc.pid and a.exited() is not None
        with pytest.raises(ProcessLookupError):  # the old group (server + its sleep child) is gone
            os.killpg(a.proc.pid, 0)
    finally:
        server.stop_all()
    assert c.exited() is not None


def test_external_endpoint_is_probed_not_launched(tmp_path: Path) -> None:
    srv = scripted_server.start([{"ttft_s": 0.0}], tmp_path)
    try:
        ext, reused = server.acquire(ServeConfig(engine="openai", endpoint=srv.base_url + "/v1/"), "m", tmp_path / "x")
        assert ext.proc is None and not reused and ext.model_id == "scripted" and ext.base_url == srv.base_url
        ext.stop()  # a no-op for servers we did not start
        assert srv.exited() is None
    finally:
        srv.stop()


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:generation_tokens_total{engine="0",model_name="m"} 1.5e+04
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 2.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 8.0
"""
SGLANG_METRICS = """sglang:num_running_reqs{model_name="m"} 7
sglang:num_queue_reqs{model_name="m"} 1
sglang:token_usage{model_name="m"} 0.31
"""


def test_prometheus_dialects() -> None:
    v = telemetry.parse_prometheus(VLLM_METRICS)
    assert v["running"] == 15.0 and v["waiting"] == 4.0 and v["kv_cache_usage"] == 0.5
    assert v["generation_tokens_total"] == 15000.0 and v["queue_time_s_count"] == 8.0
    s = telemetry.parse_prometheus(SGLANG_METRICS)
    assert s == {"running": 7.0, "waiting": 1.0, "kv_cache_usage": 0.31}


def test_sampler_records_metrics_and_unavailable_nvml(tmp_path: Path) -> None:
    srv = scripted_server.start([{"ttft_s": 0.0}], tmp_path)
    sampler = telemetry.Sampler(tmp_path / "telemetry.jsonl", srv.base_url + "/metrics", 0.1, 0.1)
    try:
        t0 = time.monotonic()
        sampler.start()
        time.sleep(1.0)
    finally:
        sampler.stop()
        srv.stop()
    status, nvml, metrics = telemetry.read_samples(tmp_path / "telemetry.jsonl")
    assert status["metrics"] == "ok" and len(metrics) >= 5
    assert status["nvml"] == "ok" or status["nvml"].startswith("unavailable")
    assert bool(nvml) == (status["nvml"] == "ok")
    summary = telemetry.summarize(tmp_path / "telemetry.jsonl", t0, time.monotonic())
    assert summary["server_running_max"] == 0.0 and summary["server_delta_generation_tokens_total"] == 0.0
    missing = telemetry.Sampler(tmp_path / "t2.jsonl", "http://127.0.0.1:9/metrics", 0.1, 0.1)
    missing.start()
    missing.stop()
    assert telemetry.read_samples(tmp_path / "t2.jsonl")[0]["metrics"].startswith("unavailable")


@pytest.mark.slow
def test_sglang_metric_names_are_declared_by_sglang() -> None:
    """Every ``sglang:`` name telemetry reads is declared by SGLang's own metrics collector (the sglang package
    that `make setup-vllm` puts in <vLLM venv>/sglang-args): a histogram by its base name (``_sum``/``_count``
    are its series), a counter by its ``_total`` name, a gauge as is."""
    import re

    from phase6.serving import engine_args

    d = engine_args.sglang_args_dir()
    if d is None:
        pytest.skip(f"no sglang package in <vLLM venv>/{engine_args.SGLANG_ARGS_DIR} (make setup-vllm)")
    declared: set[str] = set()
    for f in (d / "sglang" / "srt").rglob("*.py"):
        declared |= set(re.findall(r'name="(sglang:[a-z0-9_]+)"', f.read_text(errors="replace")))
    assert len(declared) > 20, sorted(declared)  # the collector was found
    ours = [n for names in telemetry.PROM_NAMES.values() for n in names if n.startswith("sglang:")]
    missing = [n for n in ours if n not in declared and re.sub(r"_(sum|count)$", "", n) not in declared]
    assert missing == [], missing
    assert "sglang:num_retracted_reqs" not in ours  # a gauge: its delta is not a count of preemptions


@pytest.mark.parametrize("pinned", [False, True])
def test_sigterm_to_phase6_stops_the_engine_it_launched(tmp_path: Path, pinned: bool) -> None:
    """A phase6 process killed by SIGTERM (``timeout``, a scheduler) while its engine starts: the engine's process
    group is stopped (finally/atexit run), not left holding the GPU as on the H200 retry of issue 29; exit 143."""
    import signal
    import subprocess

    log = tmp_path / "server.log"
    engine = "import os, time; print('engine', os.getpid(), flush=True); time.sleep(120)"
    code = (
        "import sys; from pathlib import Path; from phase6 import cli; from phase6.config.serve import ServeConfig; "
        "from phase6.serving import server; cli.exit_on_sigterm(); "
        f"cfg = ServeConfig(engine='vllm', launcher=[sys.executable, '-c', {engine!r}], ready_timeout_s=120, "
        f"pin_server={pinned}); server.acquire(cfg, 'm', Path({str(log)!r}))"
    )
    p = subprocess.Popen([sys.executable, "-c", code])
    pid = None
    t0 = time.perf_counter()
    while pid is None and time.perf_counter() - t0 < 60:
        lines = log.read_text().splitlines() if log.exists() else []
        pid = next((int(ln.split()[1]) for ln in lines if ln.startswith("engine ")), None)
        time.sleep(0.1)
    assert pid is not None, "the fake engine never started"
    os.kill(pid, 0)  # alive while phase6 waits for readiness
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
