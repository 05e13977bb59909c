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

A raw ``asyncio.Protocol`` HTTP/1.1 server (keep-alive, one request at a time per connection, chunked streams): each
chunk is a ``loop.call_at`` callback at its absolute target that writes straight to the transport, no task switch
or coroutine per chunk; the loop's timers fire on time (``client.PreciseEpollSelector``: epoll alone rounds timeouts
up to whole milliseconds) and the collector is off, so a chunk leaves within ~0.1 ms of its target (p99 0.3-0.6 ms
at 256 streams); ``GET /lateness`` lists how late each content chunk actually left (``late_s``) and which
(``script_chunk``: script index, chunk index). ``/metrics`` exposes vLLM-style gauges of the in-flight count.

    python -m phase6.serving.scripted_server --port 8123 --scripts scripts.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from phase6.serving.client import PreciseEpollSelector, _raise_nofile_limit
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


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_MAX_HEAD = 1 << 16


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of the response body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class _State:
    """What the server has done so far (for /metrics and /lateness)."""

    def __init__(self, scripts: list[dict[str, Any]]) -> None:
        self.scripts = scripts
        self.running = 0
        self.generated = 0
        self.requests = 0
        self.late: list[float] = []  # how late each content chunk was written (s after its target)
        self.late_at: list[tuple[int, int]] = []  # (script index, chunk index) of each entry of ``late``


class _Stream:
    """One scripted SSE response: every chunk is a ``loop.call_at`` callback at its absolute target time that
    writes straight to the transport (no task switch, no per-chunk coroutine between the timer and the write)."""

    def __init__(self, conn: _Connection, idx: int, chat: bool, t_recv: float) -> None:
        st = conn.state
        self.conn, self.idx, self.chat = conn, idx, chat
        self.sc = st.scripts[idx % len(st.scripts)]
        st.requests += 1
        st.running += 1
        self.open = True
        self.i = 0
        self.total = 0
        self.target = t_recv + self.sc["ttft_s"]
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'data: {{"id": "scripted-{st.requests}", "object": "{obj}", "model": "scripted", "choices": ['
        first = _STREAM_HEAD
        if chat:  # role-only opening chunk, as vLLM and transformers send it: not a token
            first += _chunk(self.event('{"index": 0, "delta": {"role": "assistant"}}'))
        conn.transport.write(first)  # type: ignore[union-attr]
        self.handle: asyncio.TimerHandle | None = conn.loop.call_at(self.target, self.emit)

    def event(self, choice: str, usage: int | None = None) -> bytes:
        # formatted by hand: json.dumps per chunk would dominate this server's CPU at 256 streams
        tail = (
            "]"
            if usage is None
            else f'], "usage": {{"prompt_tokens": 7, "completion_tokens": {usage}, "total_tokens": {7 + usage}}}'
        )
        return f"{self.head}{choice}{tail}}}\n\n".encode()

    def piece(self, text: str, finish: str | None = None) -> str:
        fin = "null" if finish is None else f'"{finish}"'
        if self.chat:
            return f'{{"index": 0, "delta": {{"content": "{text}"}}, "finish_reason": {fin}}}'
        return f'{{"index": 0, "text": "{text}", "finish_reason": {fin}}}'

    def emit(self) -> None:
        self.handle = None
        conn, sc, st = self.conn, self.sc, self.conn.state
        transport = conn.transport
        if not self.open or transport is None:
            return
        i = self.i
        k = sc["tokens"][i]
        if sc["fault"] in ("stall", "disconnect", "malformed") and i == sc["fault_at"]:
            if sc["fault"] == "stall":  # keep the connection open, send nothing more
                return
            if sc["fault"] == "disconnect":
                self.close()
                transport.abort()
                return
            out = _chunk(b'data: {"choices": [{"delta": {"content": "broken\n\n')
        else:
            st.late.append(conn.loop.time() - self.target)
            st.late_at.append((self.idx, i))
            self.total += k
            usage = self.total if sc["usage"] == "continuous" else None
            out = _chunk(self.event(self.piece("tok " * k), usage))
            st.generated += k
        self.i += 1
        if self.i < len(sc["tokens"]):
            transport.write(out)
            self.target += sc["gaps_s"][i]
            self.handle = conn.loop.call_at(self.target, self.emit)
            return
        if sc["fault"] != "no_finish":  # the last content chunk, its finish chunk and [DONE] in one write
            out += _chunk(self.event(self.piece("", "length"), None if sc["usage"] == "none" else self.total))
            if sc["done"]:
                out += _chunk(b"data: [DONE]\n\n")
        transport.write(out + b"0\r\n\r\n")
        self.close()
        conn.response_done()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.conn.state.running -= 1
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _Connection(asyncio.Protocol):
    """HTTP/1.1 keep-alive connection, one request at a time (what OpenAI-compatible clients send)."""

    def __init__(self, state: _State, loop: asyncio.AbstractEventLoop) -> None:
        self.state, self.loop = state, loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.keep_alive = True
        self.stream: _Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.close()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.next_request()

    def response_done(self) -> None:
        self.busy, self.stream = False, None
        if not self.keep_alive:
            if self.transport is not None:
                self.transport.close()
            return
        if self.buf:
            self.next_request()

    def respond(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        assert self.transport is not None
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{'' if self.keep_alive else 'Connection: close' + chr(13) + chr(10)}\r\n"
        )
        self.transport.write(head.encode() + body)
        self.response_done()

    def next_request(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > _MAX_HEAD and self.transport is not None:
                self.transport.close()
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
        except ValueError:
            self.keep_alive = False
            self.busy = True
            self.respond(400, b'{"error": {"message": "bad request", "code": 400}}')
            return
        if len(self.buf) < end + 4 + n:
            return  # body not complete yet
        body = bytes(self.buf[end + 4 : end + 4 + n])
        del self.buf[: end + 4 + n]
        self.busy = True
        self.keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        self.handle(method, target.split("?", 1)[0], headers, body)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        st = self.state
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            # the client's send time when it tells us (same host, same CLOCK_MONOTONIC as loop.time()), so the
            # script is the latency the client should observe; else our own receive time
            sent = headers.get("x-send-time")
            t_recv = float(sent) if sent else self.loop.time()
            try:
                req = json.loads(body)
            except ValueError:
                self.respond(400, b'{"error": {"message": "body is not JSON", "code": 400}}')
                return
            prompt = _prompt_of(req) if isinstance(req, dict) else ""
            idx = int(prompt.split(":", 1)[1]) if prompt.startswith("script:") else 0
            if st.scripts[idx % len(st.scripts)]["fault"] == "http500":
                st.requests += 1
                self.respond(500, b'{"error": {"message": "scripted failure", "code": 500}}')
                return
            self.stream = _Stream(self, idx, path.endswith("/chat/completions"), t_recv)
            return
        if method != "GET":
            self.respond(405 if path in _GET_PATHS else 404, b'{"error": {"message": "not found", "code": 404}}')
            return
        if path == "/health":
            self.respond(200, b'{"status": "ok"}')
        elif path == "/v1/models":
            self.respond(200, b'{"object": "list", "data": [{"id": "scripted", "object": "model"}]}')
        elif path == "/version":
            self.respond(200, b'{"version": "scripted-1"}')
        elif path == "/lateness":
            # emission error of every content chunk so far (seconds after target): separates server from client
            self.respond(200, json.dumps({"late_s": st.late, "script_chunk": st.late_at}).encode())
        elif path == "/metrics":
            lines = [
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{model_name="scripted"}} {st.running}',
                "# TYPE vllm:num_requests_waiting gauge",
                'vllm:num_requests_waiting{model_name="scripted"} 0',
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f'vllm:kv_cache_usage_perc{{model_name="scripted"}} {min(1.0, st.running / 256):.4f}',
                "# TYPE vllm:generation_tokens_total counter",
                f'vllm:generation_tokens_total{{model_name="scripted"}} {st.generated}',
            ]
            self.respond(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")
        else:
            self.respond(404, b'{"error": {"message": "not found", "code": 404}}')


_GET_PATHS = ("/health", "/v1/models", "/version", "/lateness", "/metrics")


def serve(scripts: list[dict[str, Any]], host: str, port: int) -> None:
    _raise_nofile_limit()  # as the client: room for thousands of connections, descriptor table grown up front
    loop = asyncio.SelectorEventLoop(PreciseEpollSelector())
    asyncio.set_event_loop(loop)
    state = _State(scripts)
    srv = loop.run_until_complete(loop.create_server(lambda: _Connection(state, loop), host, port, backlog=4096))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    gc.collect()
    gc.freeze()  # as the client: no collector pauses (ms each) while it emits scripted chunks
    gc.disable()

    def gc_valve() -> None:  # the server makes next to no cyclic garbage; collect if tracked objects pile up
        if gc.get_count()[0] > 2_000_000:
            gc.collect(1)
        loop.call_later(1.0, gc_valve)

    loop.call_later(1.0, gc_valve)
    print(f"scripted server on http://{host}:{port} ({len(scripts)} scripts) at {time.time():.3f}", flush=True)
    try:
        loop.run_forever()
    finally:
        srv.close()
        loop.close()


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
