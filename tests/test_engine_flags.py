"""Every shipped vLLM/SGLang server command line, parsed by the engine's own argument parser (issue 16).

Sources: the serve configs (configs/serve_bench/serve/*.yaml of engine vllm/sglang) at TP 2 and 4 as phase6's
``build_command`` writes them, and the deploy scripts (projects/6b_serving/deploy/*.sh, with and without QUANT).
vLLM's parser runs in the vLLM environment, SGLang's from ``<vLLM venv>/sglang-args`` (``make setup-vllm``);
skipped with one line when those are missing. A misspelled flag must be rejected (the check can fail).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from phase6.launch import load_config
from phase6.serving import engine_args, vllm_env
from phase6.serving.server import build_command

ROOT = Path(__file__).resolve().parents[1]
SERVE_DIR = ROOT / "configs" / "serve_bench" / "serve"
DEPLOY_DIR = ROOT / "projects" / "6b_serving" / "deploy"
VLLM_PY = vllm_env.vllm_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM_PY is None, reason=vllm_env.skip_reason()),
]  # needs the vLLM venv: make test-all


def shipped_configs(engine: str) -> list[str]:
    out = []
    for f in sorted(SERVE_DIR.glob("*.yaml")):
        data = yaml.safe_load(f.read_text()) or {}
        while "engine" not in data and data.get("defaults"):  # a preset on top of another: its parent's engine
            data = {**(yaml.safe_load((SERVE_DIR / f"{data['defaults'][0]}.yaml").read_text()) or {}), **data}
            data["defaults"] = [d for d in data.get("defaults", []) if d != "_self_"][1:]
        if data.get("engine") == engine:
            out.append(f.stem)
    return out


def config_argvs(engine: str) -> dict[str, list[str]]:
    """name@tp -> the arguments phase6 puts after the launcher (placeholder model path for random models)."""
    argvs = {}
    for name in shipped_configs(engine):
        for tp in (2, 4):
            smoke = ["experiment=smoke_vllm"] if name.startswith("vllm_tiny") else []  # its short max_model_len
            cfg = load_config("serve_bench", [*smoke, f"serve={name}", f"serve.tp={tp}"]).serve
            cfg.launcher = ["/x/python", "-m", "sglang.launch_server" if engine == "sglang" else vllm_env.SERVER_MODULE]
            cmd = build_command(cfg, "/models/placeholder" if cfg.random_model else cfg.model, 8000)
            argvs[f"{name}@tp{tp}"] = cmd[len(cfg.launcher) :]
    return argvs


def deploy_argvs(engine: str, tmp_path: Path) -> dict[str, list[str]]:
    """script[+fp8] -> the arguments its exec line passes (run with fake `vllm`/`python` that print them)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for exe in ("vllm", "python"):
        p = fake / exe
        p.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    out = {}
    for script in sorted(DEPLOY_DIR.glob(f"{engine}_*.sh")):
        for quant in ("", "fp8"):
            env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "QUANT": quant}
            env.pop("PORT", None)
            res = subprocess.run(["bash", str(script)], env=env, capture_output=True, check=True)
            args = res.stdout.decode().split("\0")[:-1]
            args = args[2:] if engine == "sglang" else args[1:]  # drop `-m sglang.launch_server` / `serve`
            out[script.stem + ("+" + quant if quant else "")] = args
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_shipped_command_lines_parse(engine: str, tmp_path: Path) -> None:
    if engine == "sglang" and engine_args.sglang_args_dir() is None:
        pytest.skip(f"no SGLang argument module in <vLLM venv>/{engine_args.SGLANG_ARGS_DIR} (make setup-vllm)")
    argvs = {**config_argvs(engine), **deploy_argvs(engine, tmp_path)}
    names = [n.split("@")[0] for n in argvs if "@" in n]
    models = {"vllm": ("llama3.1_70b", "qwen2.5_72b"), "sglang": ("llama3.1_70b", "qwen2.5_72b")}[engine]
    assert all(any(m in n for n in names) for m in models) and len(argvs) >= 8, sorted(argvs)
    bad = dict(argvs)
    bad["misspelled"] = [*next(iter(argvs.values())), "--tensor-paralel-size" if engine == "vllm" else "--tp-sise", "2"]
    res = engine_args.check(engine, list(bad.values()))
    errors = dict(zip(bad, res["errors"], strict=True))
    print(f"{engine} {res['version']}: {len(argvs)} command lines")
    assert errors.pop("misspelled") is not None  # the parser does reject what it does not know
    assert {k: v for k, v in errors.items() if v is not None} == {}, errors
