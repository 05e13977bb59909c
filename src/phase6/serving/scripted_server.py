"""A timing-controlled OpenAI-compatible streaming server for testing the benchmark client (no model).

Each request picks a script by its prompt ``script:<i>`` (``scripts[i % len(scripts)]``; any other prompt uses
script 0). A script fixes when every chunk leaves the server, how many tokens it carries, and an optional fault:

    {"ttft_s": 0.05, "gaps_s": [0.02, 0.02], "tokens": [1, 3, 1], "usage": "final", "done": true,
     "fault": null, "fault_at": 0}

- chunk i is written at ``t_recv + ttft_s + sum(gaps_s[:i])`` (absolute targets, so delays never accumulate);
  ``tokens[i]`` words go in chunk i; ``usage``: "final" (usage in the last chunk, transformers style),
  "continuous" (cumulative usage in every chunk, vLLM continuous_usage_stats) or "none"; ``done``: send
  ``data: [DONE]`` (vLLM/SGLang) or not (transformers).
- faults: ``http500`` (error status before streaming), ``stall`` (stop sending before chunk ``fault_at``, keep
  the connection open), ``disconnect`` (abort the TCP connection before chunk ``fault_at``), ``malformed`` (chunk
  ``fault_at`` is broken JSON), ``no_finish`` (end the stream without finish_reason or [DONE]).

With ``--scripts`` it also stands in for an engine in lifecycle tests (``serve.launcher=[python, -m,
phase6.serving.scripted_server, --scripts, f.json]``): the model positional and engine flags are accepted and ignored.

The loop's timers fire on time (``client.PreciseEpollSelector``: epoll alone rounds timeouts up to whole
milliseconds), so a chunk leaves within tens of microseconds of its target; ``GET /lateness`` lists how late each
content chunk actually left. ``/metrics`` exposes vLLM-style gauges of the in-flight count.

    python -m phase6.serving.scripted_server --port 8123 --scripts scripts.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from phase6.serving.client import PreciseEpollSelector
from phase6.serving.server import Server, free_port, module_env

FAULTS = (None, "http500", "stall", "disconnect", "malformed", "no_finish")
USAGE_MODES = ("final", "continuous", "none")


def validate_script(s: dict[str, Any], where: str) -> dict[str, Any]:
    """Fill defaults and check one script; ValueError names the script and key."""
    out = {
        "ttft_s": 0.0,
        "gaps_s": [],
        "tokens": None,
        "usage": "final",
        "done": True,
        "fault": None,
        "fault_at": 0,
        **s,
    }
    if out["tokens"] is None:
        out["tokens"] = [1] * (len(out["gaps_s"]) + 1)
    if len(out["tokens"]) != len(out["gaps_s"]) + 1:
        raise ValueError(f"{where}: tokens needs len(gaps_s) + 1 = {len(out['gaps_s']) + 1} entries")
    if out["fault"] not in FAULTS:
        raise ValueError(f"{where}: fault must be one of {FAULTS}, got {out['fault']!r}")
    if out["usage"] not in USAGE_MODES:
        raise ValueError(f"{where}: usage must be one of {USAGE_MODES}, got {out['usage']!r}")
    if min(out["tokens"]) < 1 or out["ttft_s"] < 0 or min(out["gaps_s"], default=0) < 0:
        raise ValueError(f"{where}: tokens must be >= 1 and times >= 0")
    return out


def load_scripts(path: str | Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of scripts")
    return [validate_script(s, f"{path}: script {i}") for i, s in enumerate(data)]


def random_scripts(
    n: int,
    seed: int,
    ttft_s: tuple[float, float] = (0.02, 0.2),
    gap_s: tuple[float, float] = (0.02, 0.1),
    chunks: tuple[int, int] = (8, 20),
    max_tokens_per_chunk: int = 3,
) -> list[dict[str, Any]]:
    """``n`` seeded scripts: uniform TTFT and gaps (rounded to 0.1 ms), 1..k tokens per chunk, half of them with
    usage in every chunk (vLLM) and half with usage only at the end (transformers), a third without [DONE]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = int(rng.integers(chunks[0], chunks[1]))
        out.append(
            {
                "ttft_s": round(float(rng.uniform(*ttft_s)), 4),
                "gaps_s": rng.uniform(*gap_s, m - 1).round(4).tolist(),
                "tokens": rng.integers(1, max_tokens_per_chunk + 1, m).tolist(),
                "usage": "continuous" if i % 2 else "final",
                "done": bool(i % 3),
            }
        )
    return out


def expected_itl_s(script: dict[str, Any]) -> list[float]:
    """The per-token ITL samples a script implies: chunk i's gap split over its tokens (client.py's definition)."""
    return [g / k for g, k in zip(script["gaps_s"], script["tokens"][1:], strict=True) for _ in range(k)]


def _prompt_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        msgs = body["messages"]
        return str(msgs[-1].get("content", "")) if msgs else ""
    return str(body.get("prompt", ""))


def build_app(scripts: list[dict[str, Any]]) -> web.Application:
    state = {"running": 0, "generated": 0, "requests": 0}
    late: list[float] = []  # how late each content chunk was written (s after its target): the server's own error

    async def sleep_until(loop: asyncio.AbstractEventLoop, target: float) -> None:
        delay = target - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def complete(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        # the client's send time when it tells us (same host, same CLOCK_MONOTONIC as loop.time()), so the
        # script is the latency the client should observe; else our own receive time
        sent = request.headers.get("x-send-time")
        t_recv = float(sent) if sent else loop.time()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        prompt = _prompt_of(body)
        idx = int(prompt.split(":", 1)[1]) if prompt.startswith("script:") else 0
        sc = scripts[idx % len(scripts)]
        state["requests"] += 1
        if sc["fault"] == "http500":
            return web.json_response({"error": {"message": "scripted failure", "code": 500}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        state["running"] += 1
        obj = "chat.completion.chunk" if chat else "text_completion"
        rid = f"scripted-{state['requests']}"

        head = f'data: {{"id": "{rid}", "object": "{obj}", "model": "scripted", "choices": ['

        def event(choice: str, usage: int | None = None) -> bytes:
            # formatted by hand: json.dumps per chunk would dominate this server's CPU at 256 streams
            tail = (
                "]"
                if usage is None
                else (f'], "usage": {{"prompt_tokens": 7, "completion_tokens": {usage}, "total_tokens": {7 + usage}}}')
            )
            return f"{head}{choice}{tail}}}\n\n".encode()

        def piece(text: str, finish: str | None = None) -> str:
            fin = "null" if finish is None else f'"{finish}"'
            if chat:
                return f'{{"index": 0, "delta": {{"content": "{text}"}}, "finish_reason": {fin}}}'
            return f'{{"index": 0, "text": "{text}", "finish_reason": {fin}}}'

        try:
            if chat:  # role-only opening chunk, as vLLM and transformers send it: not a token
                await resp.write(event('{"index": 0, "delta": {"role": "assistant"}}'))
            target = t_recv + sc["ttft_s"]
            total = 0
            for i, k in enumerate(sc["tokens"]):
                if i > 0:
                    target += sc["gaps_s"][i - 1]
                if sc["fault"] in ("stall", "disconnect", "malformed") and i == sc["fault_at"]:
                    await sleep_until(loop, target)
                    if sc["fault"] == "stall":
                        await asyncio.sleep(3600)
                    if sc["fault"] == "disconnect":
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    await resp.write(b'data: {"choices": [{"delta": {"content": "broken\n\n')
                    continue
                await sleep_until(loop, target)
                late.append(loop.time() - target)
                total += k
                await resp.write(event(piece("tok " * k), total if sc["usage"] == "continuous" else None))
                state["generated"] += k
            if sc["fault"] != "no_finish":
                await resp.write(event(piece("", "length"), None if sc["usage"] == "none" else total))
                if sc["done"]:
                    await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            state["running"] -= 1
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "scripted-1"})

    async def lateness(_: web.Request) -> web.Response:
        """Emission error of every content chunk so far (seconds after target): separates server from client."""
        return web.json_response({"late_s": late})

    async def metrics(_: web.Request) -> web.Response:
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="scripted"}} {state["running"]}',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="scripted"} 0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="scripted"}} {min(1.0, state["running"] / 256):.4f}',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{model_name="scripted"}} {state["generated"]}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/chat/completions", complete),
            web.post("/v1/completions", complete),
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/version", version),
            web.get("/metrics", metrics),
            web.get("/lateness", lateness),
        ]
    )
    return app


def serve(scripts: list[dict[str, Any]], host: str, port: int) -> None:
    loop = asyncio.SelectorEventLoop(PreciseEpollSelector())
    asyncio.set_event_loop(loop)
    runner = web.AppRunner(build_app(scripts), access_log=None, handle_signals=True)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, host, port, backlog=4096)
    loop.run_until_complete(site.start())
    gc.collect()
    gc.freeze()  # as the client: no full collections (ms pauses) while it emits scripted chunks
    gc.set_threshold(gc.get_threshold()[0], gc.get_threshold()[1], 1 << 30)
    print(f"scripted server on http://{host}:{port} ({len(scripts)} scripts) at {time.time():.3f}", flush=True)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(runner.cleanup())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="scripted", help="ignored (accepted so it can stand in for vllm serve)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--scripts", required=True, help="JSON list of scripts (see module docstring)")
    args, unknown = p.parse_known_args(argv)  # engine flags of the command it stands in for are ignored
    if unknown:
        print(f"ignoring engine flags: {' '.join(unknown)}", flush=True)
    serve(load_scripts(args.scripts), args.host, args.port)


if __name__ == "__main__":
    main()


def start(scripts: list[dict[str, Any]], workdir: Path, port: int = 0, timeout_s: float = 30.0) -> Server:
    """Launch the scripted server in its own process group (own core, own event loop) and wait until ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "scripts.json"
    path.write_text(json.dumps([validate_script(s, f"script {i}") for i, s in enumerate(scripts)]))
    port = port or free_port()
    cmd = [sys.executable, "-m", "phase6.serving.scripted_server", "--port", str(port), "--scripts", str(path)]
    log_path = workdir / "scripted_server.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=module_env(),
        )
    srv = Server("scripted", f"http://127.0.0.1:{port}", "scripted", cmd, log_path, proc)
    srv.wait_ready(timeout_s)
    return srv
