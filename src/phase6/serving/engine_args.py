"""Check server command lines with the engines' OWN argument parsers, before any GPU time is spent on them.

- vLLM: ``make_arg_parser(FlexibleArgumentParser())`` -- the parser ``vllm serve`` and the OpenAI server module
  build -- run by the interpreter of the vLLM environment (``phase6.serving.vllm_env``).
- SGLang: ``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser`` -- what ``sglang.launch_server`` parses
  with. SGLang's full install needs CUDA wheels; its argument module imports with only ``sglang`` (``--no-deps``)
  plus ``orjson``, ``IPython`` and ``traitlets`` on top of the vLLM environment's torch/transformers, so
  ``make setup-vllm`` installs exactly those into ``.venv-vllm/sglang-args`` (``SGLANG_ARGS_DIR``), put on
  PYTHONPATH only for this check.

An unknown or misspelled flag, a bad choice or a malformed value is argparse's exit 2; its last stderr line is
returned as the reason. argparse's prefix matching stays on (``--max-num-seq`` is accepted, as the engine itself
would accept it at launch).
"""

from __future__ import annotations

import os
from pathlib import Path

from phase6.serving import vllm_env

SGLANG_ARGS_DIR = "sglang-args"
"""Under the vLLM venv: ``pip install --no-deps --target`` of sglang and the three modules its parser imports."""

_CHILD = r"""
import contextlib, io, json, sys
engine = sys.argv[1]
if engine == "vllm":
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM < 0.30
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    import vllm
    version = vllm.__version__
    def parser():
        return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
else:
    import argparse
    from importlib import metadata
    from sglang.srt.server_args import ServerArgs
    version = metadata.version("sglang")
    def parser():
        p = argparse.ArgumentParser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(p)
        return p
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser().parse_args(argv)
        out.append(None)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        out.append(lines[-1] if lines else "rejected")
print("PHASE6_RESULT " + json.dumps({"version": version, "errors": out}))
"""


def sglang_args_dir(python: str | None = None) -> Path | None:
    """``<vLLM venv>/sglang-args`` if it holds sglang's argument module."""
    py = python or vllm_env.vllm_python()
    if py is None:
        return None
    d = Path(py).parent.parent / SGLANG_ARGS_DIR
    return d if (d / "sglang" / "srt" / "server_args.py").is_file() else None


def check(engine: str, argvs: list[list[str]], python: str | None = None, timeout_s: float = 600) -> dict:
    """Parse each argument list (no launcher prefix) with ``engine``'s parser: ``{"version", "errors"}``, one
    error string or None per list. RuntimeError when the parser itself cannot be loaded."""
    if engine not in ("vllm", "sglang"):
        raise ValueError(f"no argument parser check for engine {engine!r}")
    py = python or vllm_env.vllm_python()
    if py is None:
        raise RuntimeError(vllm_env.skip_reason())
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    if engine == "sglang":
        d = sglang_args_dir(py)
        if d is None:
            raise RuntimeError(
                f"no SGLang argument module: `make setup-vllm` installs it into <vLLM venv>/{SGLANG_ARGS_DIR}"
            )
        env["PYTHONPATH"] = str(d)
    return vllm_env.run_json_child(
        [py, "-c", _CHILD, engine], argvs, env, timeout_s, f"{engine} argument parser did not load"
    )
