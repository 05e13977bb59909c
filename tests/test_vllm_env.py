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
