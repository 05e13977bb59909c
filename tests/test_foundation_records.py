"""Run directories, redaction, cost math, sweeps, report merging and W&B offline."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from phase6 import cost
from phase6.config import ApiPrice, HardwareConfig
from phase6.launch import load_config
from phase6.redact import REDACTED, is_secret_key, redact, redact_text
from phase6.report import merge_rows, rebuild

REPO = Path(__file__).resolve().parents[1]


def phase6(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "phase6", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
    )


# --- cost math: hand-computed ---------------------------------------------------------------------------------


def test_cost_hand_computed() -> None:
    assert cost.gpu_hours(8, 2700) == pytest.approx(6.0)  # 8 GPUs x 45 min
    assert cost.usd(6.0, 2.49) == pytest.approx(14.94)
    # Llama-3.1-70B TP4 at 3,542.9 output tok/s -> 4e6/(3600*3542.9) = 0.3136 GPU-h per 1M (anchors §5.3)
    assert cost.gpu_hours_per_1m_tokens(4, 3542.9) == pytest.approx(0.31363, rel=1e-4)
    assert cost.usd_per_1m_tokens(4, 3542.9, 2.49) == pytest.approx(0.78094, rel=1e-4)
    assert cost.gpu_hours_per_1m_tokens(1, 0.0) == float("inf")
    hw = HardwareConfig(name="x", usd_per_gpu_hour=2.0)
    block = cost.run_cost(hw, num_gpus=2, seconds=1800, tokens=3.6e6)  # 1 GPU-h, 2000 tok/s
    assert block["gpu_hours"] == pytest.approx(1.0) and block["usd"] == pytest.approx(2.0)
    assert block["gpu_hours_per_1m_tokens"] == pytest.approx(2 * 1e6 / (3600 * 2000))
    rows = cost.api_comparison(
        0.5, 1.0, [ApiPrice(provider="p", model="m", usd_per_1m_input=0.1, usd_per_1m_output=0.4)]
    )
    assert rows[0]["output_api_over_self"] == pytest.approx(0.4)
    with pytest.raises(ValueError):
        cost.gpu_hours(0, 10)


# --- redaction ----------------------------------------------------------------------------------------------------


def test_redaction_rules() -> None:
    for k in ("HF_TOKEN", "WANDB_API_KEY", "api_key", "password", "client_secret", "OPENAI_API_KEY", "judge.apiKey"):
        assert is_secret_key(k), k
    for k in ("max_new_tokens", "tokenizer", "tokens_per_s", "keyframe", "monkey", "flops_per_token", "eot_token"):
        assert not is_secret_key(k), k
    # numbers are never secrets, whatever the key says
    assert redact({"kv_cache_bytes_per_token": 327680}) == {"kv_cache_bytes_per_token": 327680}
    data = {
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx",
        "nested": {"api_key": "xyz", "max_new_tokens": 128},
        "tokenizer": "gpt2",
        "free": "use sk-abcdefghijklmnopqrstuvwx here",
        "list": [{"password": "p"}],
    }
    out = redact(data)
    assert out["HF_TOKEN"] == REDACTED and out["nested"]["api_key"] == REDACTED
    assert out["nested"]["max_new_tokens"] == 128 and out["tokenizer"] == "gpt2"
    assert "sk-" not in out["free"] and out["list"][0]["password"] == REDACTED
    assert redact_text("phase6 dpo judge.api_key=abc123 model=x") == f"phase6 dpo judge.api_key={REDACTED} model=x"


def test_secrets_never_reach_run_files(tmp_path: Path) -> None:
    secret = "hf_SECRETSECRETSECRETSECRET"
    run_dir = tmp_path / "r"
    proc = phase6(
        "cost",
        f"run.dir={run_dir}",
        "run.name=secretcheck",
        "hours=1",
        "output_tokens=1e6",
        f"+note={secret}",
        env={"HF_TOKEN": secret, "MY_PASSWORD": "hunter2"},
    )
    # `+note` is an unknown key: rejected before anything is written
    assert proc.returncode == 2 and "note" in proc.stderr
    proc = phase6(
        "cost",
        f"run.dir={run_dir}",
        "hours=1",
        "output_tokens=1e6",
        f"hardware.source={secret}",
        env={"HF_TOKEN": secret, "MY_PASSWORD": "hunter2"},
    )
    assert proc.returncode == 0, proc.stderr
    for f in run_dir.rglob("*"):
        if f.is_file():
            text = f.read_text(errors="ignore")
            assert secret not in text and "hunter2" not in text, f


# --- run directory --------------------------------------------------------------------------------------------------


def test_run_directory_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "cost_run"
    proc = phase6("cost", f"run.dir={run_dir}", "gpus=8", "hours=0.75", "output_tokens=5e9")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir}"
    for name in ("config.yaml", "env.json", "metrics.jsonl", "results.json", "results.md"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "plots").is_dir()
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["job"] == "cost" and cfg["gpus"] == 8 and cfg["hardware"]["name"] == "h100_sxm"
    env = json.loads((run_dir / "env.json").read_text())
    assert {"git", "packages", "gpus", "host", "command"} <= set(env)
    assert "sha" in env["git"] and "dirty" in env["git"] and "torch" in env["packages"]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["job"] == "cost" and isinstance(res["rows"], list) and res["rows"][0]["gpu_hours"] == pytest.approx(6.0)
    assert res["cost"]["usd"] == pytest.approx(6.0 * 2.49)
    md = (run_dir / "results.md").read_text()
    assert "| hardware |" in md and "API price comparison" in md


def test_default_run_dir_layout(tmp_path: Path) -> None:
    proc = phase6("cost", "run.name=layout", "hours=1", cwd=tmp_path, env={"PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1].split("run dir: ")[1])
    assert run_dir.relative_to(tmp_path).parts[:2] == ("outputs", "cost") and run_dir.name.endswith("_layout")
    assert (run_dir / "results.json").is_file()


def test_multirun_sweep_two_dirs_and_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = phase6("cost", "-m", "gpus=1,2", f"run.dir={sweep}", "hours=2")
    assert proc.returncode == 0, proc.stderr
    members = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in members] == ["0", "1"]
    gh = [json.loads((m / "results.json").read_text())["rows"][0]["gpu_hours"] for m in members]
    assert gh == [pytest.approx(2.0), pytest.approx(4.0)]
    summary = json.loads((sweep / "summary.json").read_text())["rows"]
    assert [r["overrides"] for r in summary] == ["gpus=1 hours=2", "gpus=2 hours=2"]
    assert (sweep / "summary.md").read_text().count("\n| ") >= 2


def test_report_rebuilds_and_merges(tmp_path: Path) -> None:
    dirs = []
    for g in (1, 4):
        d = tmp_path / f"g{g}"
        assert phase6("cost", f"run.dir={d}", f"gpus={g}", "hours=1").returncode == 0
        dirs.append(d)
    (dirs[0] / "results.md").unlink()
    with open(dirs[0] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 1, "loss": 3.0}) + "\n" + json.dumps({"step": 2, "loss": 2.5}) + "\n")
    rebuild(dirs[0])
    assert (dirs[0] / "results.md").is_file() and (dirs[0] / "plots" / "metrics.png").is_file()
    rows = merge_rows(dirs)
    assert [r["gpus"] for r in rows] == [1, 4] and [r["run"] for r in rows] == ["g1", "g4"]
    proc = phase6("report", str(dirs[0]), str(dirs[1]), "--out", str(tmp_path / "merged"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged" / "summary.md").read_text().count("\n| g") == 2
    bad = phase6("report", str(tmp_path / "nope"))
    assert bad.returncode == 2 and "nope" in bad.stderr


# --- W&B offline ------------------------------------------------------------------------------------------------------


def test_wandb_offline_writes_local_run_and_no_external_connection(tmp_path: Path) -> None:
    """Offline W&B writes a local run; a proxy on loopback sees zero connection attempts and the Python process
    opens no socket to a non-loopback address (audit hook)."""
    hits: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits.append(conn.recv(200))
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    proxy = f"http://127.0.0.1:{srv.getsockname()[1]}"
    script = textwrap.dedent(f"""
        import ipaddress, socket, sys
        bad = []
        def hook(event, args):
            if event == "socket.connect":
                addr = args[1]
                if isinstance(addr, tuple):
                    try:
                        if not ipaddress.ip_address(addr[0]).is_loopback:
                            bad.append(addr)
                    except ValueError:
                        bad.append(addr)
        sys.addaudithook(hook)
        from phase6.launch import load_config
        from phase6.runrecord import RunRecord
        cfg = load_config("cost", ["run.dir={tmp_path / "wb"}", "logger=default"])
        rec = RunRecord(cfg, job="cost")
        assert rec._wandb is not None, "wandb should be active"
        for s in range(3):
            rec.log({{"loss": 1.0 / (s + 1)}}, step=s)
        rec.finish([{{"a": 1}}])
        print("BAD", bad)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update(
        {
            "HTTPS_PROXY": proxy,
            "HTTP_PROXY": proxy,
            "https_proxy": proxy,
            "http_proxy": proxy,
            "NO_PROXY": "",
            "WANDB_SILENT": "true",
            "HOME": str(tmp_path),
            "NETRC": str(tmp_path / "none"),
        }
    )
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=env)
    finally:
        stop.set()
        t.join()
        srv.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BAD []" in proc.stdout, proc.stdout
    assert not hits, f"W&B tried to reach the network through the proxy: {hits}"
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].glob("*.wandb")), list((tmp_path / "wb").rglob("*"))


def test_wandb_mode_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from phase6.runrecord import wandb_mode

    for k in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_mode(None) == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password abc\n")
    assert wandb_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(None) == "disabled"
    assert wandb_mode("offline") == "offline"
    assert load_config("cost", ["logger=none"]).logger.wandb is False
