"""phase6.serving.vllm_env: how the vLLM environment is found (env var, then <repo>/.venv-vllm, else None)."""

from __future__ import annotations

from pathlib import Path

from phase6.serving import vllm_env


def test_env_var_wins(monkeypatch):
    monkeypatch.setenv(vllm_env.ENV_VAR, "/opt/somewhere/bin/python")
    assert vllm_env.vllm_python() == "/opt/somewhere/bin/python"
    assert vllm_env.vllm_launcher() == ["/opt/somewhere/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert vllm_env.vllm_bench_command() == ["/opt/somewhere/bin/python", "-c", vllm_env.BENCH_SERVE]


def test_repo_venv_then_none(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_env.ENV_VAR, raising=False)
    monkeypatch.setattr(vllm_env, "repo_root", lambda: tmp_path)
    assert vllm_env.vllm_python() is None and vllm_env.vllm_launcher() is None
    py = tmp_path / ".venv-vllm" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    assert vllm_env.vllm_python() == str(py)


def test_repo_root_is_the_checkout():
    assert (vllm_env.repo_root() / "pyproject.toml").is_file()
    assert Path(vllm_env.__file__).resolve().is_relative_to(vllm_env.repo_root() / "src")


def test_vllm_launches_from_its_own_env(monkeypatch):
    """serve.launcher unset: the vLLM venv's interpreter runs the server module, the model goes in as --model."""
    from phase6.config.serve import ServeConfig
    from phase6.serving.server import build_command

    monkeypatch.setenv(vllm_env.ENV_VAR, "/opt/venv-vllm/bin/python")
    cmd = build_command(ServeConfig(engine="vllm", tp=2), "/models/m", 8123)
    assert cmd[:5] == ["/opt/venv-vllm/bin/python", "-m", vllm_env.SERVER_MODULE, "--model", "/models/m"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2" and cmd[cmd.index("--port") + 1] == "8123"
    # an explicit `vllm serve` launcher keeps the positional model
    cmd = build_command(ServeConfig(engine="vllm", launcher=["/opt/v/bin/vllm", "serve"]), "/models/m", 1)
    assert cmd[:3] == ["/opt/v/bin/vllm", "serve", "/models/m"]


def test_without_a_vllm_env_the_error_says_how_to_get_one(monkeypatch, tmp_path):
    import pytest

    from phase6.config.serve import ServeConfig
    from phase6.serving import server

    monkeypatch.delenv(vllm_env.ENV_VAR, raising=False)
    monkeypatch.setattr(vllm_env, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(server, "_resolve", lambda exe: exe)  # no `vllm` script anywhere
    with pytest.raises(ValueError, match=r"serve.launcher: 'vllm' is not installed here .*make setup-vllm"):
        server.build_command(ServeConfig(engine="vllm"), "m", 1)
