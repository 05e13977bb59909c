"""HTTP on rank 0 (aiohttp): the OpenAI-compatible endpoints, request validation and vLLM's Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import threading
import time
import uuid
from typing import Any

import torch

from phase6.serving.tp_server.args import ENGINE
from phase6.serving.tp_server.scheduler import GenParams, Request, Scheduler

log = logging.getLogger("phase6.tp_server")


class BadRequest(ValueError):
    """A client mistake: HTTP 400 with this message."""


def _get(body: dict[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"'{key}' must be {types}, got a boolean")
    if not isinstance(v, types):
        raise BadRequest(f"'{key}' has the wrong type ({type(v).__name__})")
    return v


class Api:
    """Request parsing and the OpenAI response shapes; owns nothing but the tokenizer and the model id."""

    def __init__(self, sched: Scheduler, tokenizer: Any, model_id: str, max_model_len: int, vocab_size: int) -> None:
        self.sched, self.tok, self.model_id = sched, tokenizer, model_id
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.started = time.time()
        import transformers

        world = sched.engine.world
        self.version = (
            f"phase6 {ENGINE} (tp={world}, torch {torch.__version__}, transformers {transformers.__version__})"
        )

    def params(self, body: Any, chat: bool) -> GenParams:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_id:
            raise BadRequest(f"model {model!r} is not served here (serving {self.model_id!r})")
        if _get(body, "n", int, 1) != 1:
            raise BadRequest("'n' must be 1")
        if body.get("stop") not in (None, [], ""):
            raise BadRequest("'stop' is not supported by this server")
        if body.get("logprobs") not in (None, False, 0):
            raise BadRequest("'logprobs' is not supported by this server")
        ids = self._chat_ids(body) if chat else self._prompt_ids(body)
        if not ids:
            raise BadRequest("prompt is empty")
        room = self.max_model_len - len(ids)
        if room < 1:
            raise BadRequest(f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}")
        max_tokens = _get(body, "max_tokens", int, None)
        if chat:
            max_tokens = _get(body, "max_completion_tokens", int, max_tokens)
        if max_tokens is None:
            max_tokens = room if chat else 16  # OpenAI defaults: chat = up to the context, completions = 16
        if max_tokens < 1:
            raise BadRequest(f"'max_tokens' must be >= 1, got {max_tokens}")
        if len(ids) + max_tokens > self.max_model_len:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len {self.max_model_len}"
            )
        temperature = float(_get(body, "temperature", (int, float), 1.0))
        top_p = float(_get(body, "top_p", (int, float), 1.0))
        if not (math.isfinite(temperature) and temperature >= 0):
            raise BadRequest(f"'temperature' must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise BadRequest(f"'top_p' must be in (0, 1], got {top_p}")
        min_tokens = _get(body, "min_tokens", int, 0)
        if not 0 <= min_tokens <= max_tokens:
            raise BadRequest(f"'min_tokens' must be in [0, max_tokens], got {min_tokens}")
        return GenParams(
            ids,
            max_tokens,
            temperature,
            top_p,
            _get(body, "seed", int, None),
            bool(_get(body, "ignore_eos", bool, False)),
            min_tokens,
            bool(_get(body, "return_token_ids", bool, False)),
        )

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if self.tok is None:
                raise BadRequest("this server has no tokenizer: send 'prompt' as a list of token ids")
            return list(self.tok.encode(prompt, add_special_tokens=False)) if prompt else []
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise BadRequest(f"token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
            return list(prompt)
        raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")

    def _chat_ids(self, body: dict[str, Any]) -> list[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise BadRequest(f"messages[{i}] must be {{'role': str, 'content': str}}")
        if self.tok is None or not getattr(self.tok, "chat_template", None):
            raise BadRequest("this server's tokenizer has no chat template: use /v1/completions")
        out = self.tok.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in msgs],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def chunk(
        self,
        rid: str,
        chat: bool,
        text: str | None,
        finish: str | None,
        usage: dict[str, int] | None,
        role: bool = False,
    ) -> dict[str, Any]:
        if text is None:  # usage-only chunk
            choices: list[dict[str, Any]] = []
        elif chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        obj: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
        }
        if usage is not None:
            obj["usage"] = usage
        return obj


class Detokenizer:
    """Incremental decode (the vLLM/TGI offsets scheme): emit text only once it is not a partial UTF-8 char."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        if self.tok is None:
            return f"<{token}>"  # no tokenizer configured: token ids as text (documented, token-id clients only)
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        after = self.tok.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""


def prometheus(sched: Scheduler, model_id: str) -> str:
    """vLLM's metric names (anchors §6.1), so scrapers written for vLLM read this server unchanged."""
    g, c = sched.gauges(), sched.counters
    lbl = f'{{model_name="{model_id}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", g["running"]),
        ("vllm:num_requests_waiting", "gauge", g["waiting"]),
        ("vllm:kv_cache_usage_perc", "gauge", g["kv_cache_usage"]),
        ("vllm:prompt_tokens_total", "counter", c["prompt_tokens"]),
        ("vllm:generation_tokens_total", "counter", c["generation_tokens"]),
        ("vllm:request_success_total", "counter", c["success"]),
        ("vllm:time_to_first_token_seconds_sum", "counter", c["ttft_sum"]),
        ("vllm:time_to_first_token_seconds_count", "counter", c["ttft_count"]),
        ("vllm:request_queue_time_seconds_sum", "counter", c["queue_sum"]),
        ("vllm:request_queue_time_seconds_count", "counter", c["queue_count"]),
    ]
    out: list[str] = []
    for name, kind, value in rows:
        out += [f"# TYPE {name} {kind}", f"{name}{lbl} {value}"]
    return "\n".join(out) + "\n"


def build_app(api: Api) -> Any:
    from aiohttp import web

    sched = api.sched

    async def health(_: web.Request) -> web.Response:
        if sched.error is not None:
            return web.json_response({"status": "engine failed"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": api.model_id,
                        "object": "model",
                        "created": int(api.started),
                        "owned_by": ENGINE,
                        "max_model_len": api.max_model_len,
                    }
                ],
            }
        )

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": api.version})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=prometheus(sched, api.model_id), content_type="text/plain")

    def error(status: int, msg: str) -> web.Response:
        return web.json_response(
            {"error": {"message": msg, "type": "invalid_request_error", "code": status}}, status=status
        )

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError as e:
            return error(400, f"body is not valid JSON: {e}")
        try:
            params = api.params(body, chat)
            stream = bool(_get(body, "stream", bool, False))
            opts = _get(body, "stream_options", dict, {})
        except BadRequest as e:
            return error(400, str(e))
        if sched.error is not None or sched.stopping:
            return error(503, "server is not accepting requests")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()

        def sink(evs: list[tuple[Request, int | None, str | None]]) -> None:
            loop.call_soon_threadsafe(lambda: [events.put_nowait((t, f)) for _, t, f in evs])

        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        req = Request(rid, params, sink)
        sched.submit(req)
        detok = Detokenizer(api.tok)
        n_prompt, n_out = len(params.prompt_ids), 0

        def usage() -> dict[str, int]:
            return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

        try:
            if not stream:
                parts: list[str] = []
                finish = None
                while finish is None:
                    tok, finish = await events.get()
                    if tok is not None:
                        n_out += 1
                        parts.append(detok.add(tok))
                out_ids = detok.ids
                if finish == "abort":
                    return error(500, "engine stopped before the request finished")
                text = "".join(parts)
                choice: dict[str, Any] = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                    if chat
                    else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                )
                if params.return_token_ids:
                    choice |= {"token_ids": out_ids, "prompt_token_ids": params.prompt_ids}
                return web.json_response(
                    {
                        "id": rid,
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": api.model_id,
                        "choices": [choice],
                        "usage": usage(),
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            every = bool(opts.get("continuous_usage_stats"))

            async def send(obj: dict[str, Any]) -> None:
                await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

            role = chat
            finish = None
            held: list[int] = []  # tokens whose text is still an incomplete character
            while finish is None:
                tok, finish = await events.get()
                if finish == "abort":
                    await resp.write(b'data: {"error": {"message": "engine stopped", "code": 500}}\n\n')
                    return resp
                if tok is not None:
                    n_out += 1
                    held.append(tok)
                    text = detok.add(tok)
                    if text or finish is not None or role:
                        obj = api.chunk(rid, chat, text, finish, usage() if every else None, role=role)
                        if params.return_token_ids:
                            obj["choices"][0]["token_ids"] = held
                        await send(obj)
                        held, role = [], False
            if opts.get("include_usage"):
                await send(api.chunk(rid, chat, None, None, usage()))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            req.cancelled = True  # client went away: the engine frees the row at its next step
            raise
        finally:
            if req.finish_reason is None:
                req.cancelled = True

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/metrics", metrics),
            web.get("/version", version),
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat_completions),
        ]
    )
    return app


async def serve_http(api: Api, host: str, port: int, engine_thread: threading.Thread) -> None:
    """Serve until SIGTERM/SIGINT or engine failure; then stop the engine (which releases every rank)."""
    from aiohttp import web

    runner = web.AppRunner(build_app(api), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
    log.info("ready: http://%s:%s (model %s)", host, bound, api.model_id)
    print(f"tp_server ready on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and engine_thread.is_alive():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
    api.sched.stop()
    await asyncio.to_thread(engine_thread.join)
    await runner.cleanup()
