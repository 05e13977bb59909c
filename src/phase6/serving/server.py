"""Server lifecycle: launch vLLM / SGLang / transformers serve on 127.0.0.1, wait until ready, record, stop.

- Launch: one process group per server (``start_new_session``), stdout+stderr to ``server.log``; engine knobs we
  do not model pass through ``serve.engine_args`` as ``--key value`` (e.g. ``load-format: dummy``).
- Ready: ``GET /health`` == 200 and ``GET /v1/models`` lists a model (vLLM starts its HTTP server after the
  engine loaded; SGLang's /health is 503 while starting, anchors §6). A process that exits during startup fails
  at once; a timeout fails with the log tail.
- Stop: SIGTERM to the whole group (TP workers are children), SIGKILL after a grace period.
- Cache: sweep members in one process (Hydra's basic launcher) reuse a running server whose launch spec
  (engine, model, TP, dtype, args) is unchanged; a different spec stops it first (one server holds the GPUs).
- ``serve.endpoint``: an already running server of any engine; nothing is launched or stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from phase6.config.serve import ServeConfig
from phase6.errors import UserError
from phase6.redact import redact_argv, redact_text
from phase6.serving import vllm_env
from phase6.serving.client import API_KEY_ENV, auth_headers
from phase6.timing import wall

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per readiness poll otherwise

# Default command prefix per engine (console scripts are looked up next to this interpreter first). vLLM: the
# interpreter of its own environment (phase6.serving.vllm_env: $PHASE6_VLLM_PYTHON or <repo>/.venv-vllm) when there
# is one, running the server module; else a `vllm` console script here or on PATH.
LAUNCHERS: dict[str, list[str]] = {
    "vllm": ["vllm", "serve"],
    "sglang": [sys.executable, "-m", "sglang.launch_server"],
    "transformers": [sys.executable, "-m", "transformers.cli.transformers", "serve"],  # = `transformers serve`
    "torch-tp": [sys.executable, "-m", "phase6.serving.tp_server"],  # TP > 1: under torchrun (build_command)
}
ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang", "transformers": "transformers"}


def module_env() -> dict[str, str]:
    """This environment with phase6's source root on PYTHONPATH, for ``python -m phase6...`` children."""
    src = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _resolve(exe: str) -> str:
    """Console scripts of the active environment first (works without activating the venv), then PATH."""
    if os.sep in exe:
        return exe
    local = Path(sys.executable).parent / exe
    if local.exists():
        return str(local)
    return shutil.which(exe) or exe


def engine_flags(args: dict[str, Any]) -> list[str]:
    """``{"load-format": "dummy", "enforce-eager": True, "x": False}`` -> ``--load-format dummy --enforce-eager``."""
    out: list[str] = []
    for k, v in args.items():
        flag = k if k.startswith("-") else f"--{k}"
        if v is True:
            out.append(flag)
        elif v is False or v is None:
            continue
        elif isinstance(v, (list, tuple)):
            out += [flag, *map(str, v)]
        elif isinstance(v, dict):
            import json

            out += [flag, json.dumps(v)]
        else:
            out += [flag, str(v)]
    return out


def default_launcher(engine: str) -> list[str]:
    """The engine's command prefix when ``serve.launcher`` is unset (vLLM: its own venv first)."""
    if engine == "vllm":
        own = vllm_env.vllm_launcher()
        if own is not None:
            return own
    return list(LAUNCHERS[engine])


def build_command(cfg: ServeConfig, model: str, port: int) -> list[str]:
    """The server command line for ``cfg`` (model path resolved by the caller, port chosen)."""
    if cfg.engine not in LAUNCHERS:
        raise ValueError(f"serve.engine: {cfg.engine!r} cannot be launched; set serve.endpoint")
    launcher = list(cfg.launcher) if cfg.launcher else default_launcher(cfg.engine)
    launcher[0] = _resolve(launcher[0])
    if os.sep not in launcher[0]:
        raise ValueError(
            f"serve.launcher: {launcher[0]!r} is not installed here (not next to {sys.executable} "
            f"nor on PATH); install {cfg.engine}"
            + (" (`make setup-vllm`)" if cfg.engine == "vllm" else "")
            + f" or set serve.launcher=[/path/to/{launcher[0]}, ...]"
        )
    common = ["--host", cfg.host, "--port", str(port)]
    if cfg.engine == "vllm":
        # the server module (python -m vllm.entrypoints.openai.api_server) ignores the positional model of `vllm serve`
        by_module = vllm_env.SERVER_MODULE in launcher
        cmd = [*launcher, *(["--model", model] if by_module else [model]), *common]
        cmd += ["--tensor-parallel-size", str(cfg.tp), "--dtype", cfg.dtype]
        if cfg.max_model_len:
            cmd += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.served_model_name:
            cmd += ["--served-model-name", cfg.served_model_name]
    elif cfg.engine == "sglang":
        cmd = [
            *launcher,
            "--model-path",
            model,
            *common,
            "--tp-size",
            str(cfg.tp),
            "--dtype",
            cfg.dtype,
            "--enable-metrics",
        ]
        if cfg.max_model_len:
            cmd += ["--context-length", str(cfg.max_model_len)]
        if cfg.served_model_name:
            cmd += ["--served-model-name", cfg.served_model_name]
    elif cfg.engine == "transformers":
        if cfg.tp != 1:
            raise ValueError(f"serve.tp: transformers serve has no tensor parallelism, use tp=1 (got {cfg.tp})")
        cmd = [*launcher, model, *common, "--dtype", cfg.dtype]
    elif cfg.engine == "torch-tp":
        if cfg.tp > 1 and not cfg.launcher:
            launcher = [_resolve("torchrun"), "--standalone", "--nproc_per_node", str(cfg.tp), *launcher[1:]]
        cmd = [*launcher, "--model", model, *common, "--dtype", cfg.dtype]
        if cfg.max_model_len:
            cmd += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.served_model_name:
            cmd += ["--served-model-name", cfg.served_model_name]
    else:
        raise ValueError(f"serve.engine: {cfg.engine!r} cannot be launched; set serve.endpoint")
    return cmd + engine_flags(cfg.engine_args)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return "(no log)"


def engine_message(log_path: Path | None) -> str:
    """The engine's own reason from its log: the last line that reads like an error, else the last line."""
    lines = [ln.strip() for ln in log_tail(log_path, 60).splitlines() if ln.strip()] if log_path else []
    lines = [ln for ln in lines if not ln.startswith("$ ")]  # our own command line, written first
    errors = [ln for ln in lines if re.search(r"error|no such option|unrecognized|invalid|exception", ln, re.I)]
    text = (errors or lines or ["(no output)"])[-1].strip("│|╭╰─ ")
    return text[:300]


def probe_ready(base_url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(ready, detail): /health 200 (404 tolerated: not every server has it) and /v1/models lists a model; the
    probe sends the API key the benchmark sends ($OPENAI_API_KEY, phase6.serving.client.auth_headers)."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, headers=auth_headers()) as c:
            h = c.get(base_url + "/health")
            if h.status_code not in (200, 404):
                return False, f"/health {h.status_code}"
            m = c.get(base_url + "/v1/models")
            if m.status_code != 200:
                return False, f"/v1/models {m.status_code}"
            data = m.json().get("data") or []
            return (True, str(data[0].get("id"))) if data else (False, "/v1/models lists no model")
    except (httpx.HTTPError, ValueError) as e:
        return False, f"{type(e).__name__}: {e}"


def engine_version(base_url: str, engine: str) -> str:
    """vLLM ``/version``, SGLang ``/server_info`` (older ``/get_server_info``); else the installed package."""
    with (
        contextlib.suppress(httpx.HTTPError, ValueError),
        httpx.Client(timeout=5.0, trust_env=False, headers=auth_headers()) as c,
    ):
        for path in ("/version", "/server_info", "/get_server_info"):
            r = c.get(base_url + path)
            if r.status_code == 200:
                v = r.json().get("version")
                if v:
                    return str(v)
    pkg = ENGINE_PACKAGES.get(engine)
    if pkg:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{metadata.version(pkg)} (package in the client environment)"
    return "unknown"


def _group_alive(pgid: int, leader: subprocess.Popen[bytes]) -> bool:
    leader.poll()  # reap the leader: a zombie still counts as a member of its group
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Server:
    """A server the benchmark talks to: launched here (``proc`` set) or external (``proc`` None)."""

    engine: str
    base_url: str
    model: str = ""
    """Model path/id the server was launched with."""
    command: list[str] = field(default_factory=list)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    model_id: str = ""
    version: str = ""
    startup_s: float = 0.0
    key: tuple[Any, ...] = ()

    def exited(self) -> str | None:
        """A reason string once a launched server process has died (the client's abort check)."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"server process exited with code {self.proc.returncode}"
        return None

    def wait_ready(self, timeout_s: float) -> None:
        """Poll until ready; a UserError (one line) when the engine exits during startup (with its own last error
        line, e.g. a flag it does not know), when the server answers 401/403 (API key) or, for an external endpoint,
        404 (not an OpenAI server), and after ``timeout_s`` (a server that accepts connections but never answers)."""
        if self.model_id:  # already probed ready (a reused server)
            return
        t0 = wall()
        detail = ""
        where = "serve.endpoint" if self.proc is None else "serve.engine"
        while wall() - t0 < timeout_s:
            died = self.exited()
            if died:
                self.stop()  # what the engine's leader left behind (e.g. SGLang's scheduler), before the error
                raise UserError(
                    f"serve.engine: {self.engine} {died} during startup: {engine_message(self.log_path)} "
                    f"(log: {self.log_path})"
                )
            ok, detail = probe_ready(self.base_url)
            if ok:
                self.model_id = detail
                self.startup_s = wall() - t0
                self.version = engine_version(self.base_url, self.engine)
                return
            if detail.endswith((" 401", " 403")):
                self.stop()
                key = f"${API_KEY_ENV} is {'set but refused' if auth_headers() else 'not set'}"
                raise UserError(
                    f"{where}: {self.base_url}: {detail} (the server wants an API key; {key}: export "
                    f"{API_KEY_ENV}=<the server's --api-key>)"
                )
            if detail == "/v1/models 404" and self.proc is None:
                raise UserError(f"serve.endpoint: {self.base_url}: {detail}: not an OpenAI-compatible server")
            time.sleep(0.5)
        self.stop()
        log = f"; its last line: {engine_message(self.log_path)} (log: {self.log_path})" if self.log_path else ""
        raise UserError(f"{where}: {self.base_url}: not ready after {timeout_s:.0f} s (last probe: {detail}){log}")

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``grace_s``; return when the group is gone.

        Waiting for the group, not just the leader: TP workers that outlive their parent for a moment still hold
        GPU memory, and the next server of a sweep would start out of memory.
        """
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if not _group_alive(pgid, self.proc):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            t0 = wall()
            while _group_alive(pgid, self.proc) and wall() - t0 < wait_s:
                time.sleep(0.05)
        self.proc.wait(timeout=10)

    def info(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version": self.version,
            "base_url": self.base_url,
            "model": self.model,
            "model_id": self.model_id,
            "command": self.command,
            "log": str(self.log_path) if self.log_path else None,
            "startup_s": self.startup_s,
            "managed": self.proc is not None,
            "pid": self.proc.pid if self.proc is not None else None,
        }


def check_port(host: str, port: int) -> None:
    """A UserError naming serve.port when ``host:port`` is taken (the engine would die with a page of traceback)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"serve.port: {host}:{port}: {e.strerror}; pick another port or leave it unset") from None


def launch(cfg: ServeConfig, model: str, log_path: Path, env: dict[str, str] | None = None) -> Server:
    """Start the server process (not yet waiting for readiness)."""
    if cfg.port:
        check_port(cfg.host, cfg.port)
    port = cfg.port or free_port(cfg.host)
    cmd = build_command(cfg, model, port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**(module_env() if cfg.engine == "torch-tp" else os.environ), **(env or {}), **cfg.env}
    shown = redact_argv(cmd)  # secrets in engine flags (--api-key v) never reach server.log or results.json
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(shown)}\n".encode())
        log.flush()
        secret = shown != cmd  # the engine may echo its arguments: its output then goes through the redaction
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE if secret else log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=full_env,
        )
    if secret:
        threading.Thread(target=_redacting_copy, args=(proc.stdout, log_path), daemon=True).start()
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return Server(cfg.engine, f"http://{host}:{port}", model, shown, log_path, proc, key=cfg.launch_key())


def _redacting_copy(stream: Any, log_path: Path) -> None:
    """Append the server's output to ``log_path`` line by line through `redact_text` until it closes."""
    with log_path.open("a", errors="replace") as log:
        for raw in iter(stream.readline, b""):
            log.write(redact_text(raw.decode(errors="replace")))
            log.flush()


def check_endpoint(url: str, timeout_s: float = 5.0) -> None:
    """Fail at once when nothing listens at ``url`` (connection refused, unknown host): a server that is still
    loading accepts the connection, so this never cuts its start short."""
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        why = "connection refused, nothing listens there" if isinstance(e, ConnectionRefusedError) else str(e)
        raise UserError(f"serve.endpoint: {url}: {why}") from None


# Servers kept across the members of a sweep, keyed by their launch spec.
_CACHE: dict[tuple[Any, ...], Server] = {}


def stop_all() -> None:
    for key in list(_CACHE):
        _CACHE.pop(key).stop()


atexit.register(stop_all)


def cached(cfg: ServeConfig) -> Server | None:
    """The pinned server for ``cfg``'s launch spec if it is still running."""
    srv = _CACHE.get(cfg.launch_key())
    return srv if srv is not None and srv.exited() is None else None


def acquire(
    cfg: ServeConfig, model: str, log_path: Path, env: dict[str, str] | None = None, wait: bool = True
) -> tuple[Server, bool]:
    """A server for ``cfg``: (server, reused). External endpoints are probed, never launched.

    ``wait=False`` returns a freshly launched server before it is ready (call ``wait_ready`` after preparing the
    workload, so the model load and the tokenization overlap).
    """
    if cfg.endpoint is not None:
        base = cfg.endpoint.rstrip("/")
        base = base.removesuffix("/v1")  # OpenAI clients are often given .../v1; the paths we call include it
        check_endpoint(base)
        srv = Server(cfg.engine, base, cfg.model)
        srv.wait_ready(cfg.ready_timeout_s)
        return srv, False
    key = cfg.launch_key()
    cached = _CACHE.get(key)
    if cached is not None and cached.exited() is None and probe_ready(cached.base_url)[0]:
        return cached, True
    stop_all()  # a different spec (or a dead server): free the GPUs before starting the next one
    srv = launch(cfg, model, log_path, env)
    if cfg.pin_server:
        _CACHE[key] = srv
    if wait:
        try:
            srv.wait_ready(cfg.ready_timeout_s)
        except BaseException:  # SystemExit from SIGTERM, Ctrl-C: no caller holds this server yet to stop it
            if _CACHE.get(key) is not srv:
                srv.stop()
            raise
    return srv, False


def release(srv: Server, cfg: ServeConfig) -> None:
    """End of one run: stop the server unless it is pinned for the next sweep member."""
    if srv.proc is not None and not (cfg.pin_server and _CACHE.get(srv.key) is srv):
        srv.stop()
