"""Nothing lost, nothing leaked (issue 17): run-directory safety, checkpoint retention, redaction of every written
file, failed runs marked, pre-flight shard integrity, evaluations that degrade, compressed inputs, quick trace prompts.
The bad-input table over every job is tests/test_bad_inputs.py."""

from __future__ import annotations

import gzip
import http.server
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phase6.cli import app
from phase6.errors import UserError
from phase6.redact import REDACTED, is_secret_key, redact, redact_argv, redact_text

SECRET = "plainsecret-93c1f7e2"  # neither sk- nor hf_ shaped: only the key or flag tells it is a secret


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


# --- 1. run directories and checkpoint retention -------------------------------------------------------------------


def test_a_run_dir_holding_another_run_is_refused_and_overwrite_moves_it_aside(tmp_path: Path) -> None:
    run = tmp_path / "R"
    first = cli("cost", f"run.dir={run}", "hours=1")
    assert first.exit_code == 0, first.output
    before = (run / "results.json").read_text()
    second = cli("cost", f"run.dir={run}", "hours=2")
    assert second.exit_code == 2
    err = second.stderr.strip()
    assert err.startswith("phase6: error: run.dir: ") and "another run's records" in err and "\n" not in err
    assert (run / "results.json").read_text() == before  # untouched
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    third = cli("cost", f"run.dir={run}", "hours=3", "run.overwrite=true")
    assert third.exit_code == 0, third.output
    (aside,) = tmp_path.glob("R.replaced-*")
    assert (aside / "results.json").read_text() == before  # moved, never deleted
    assert len((aside / "metrics.jsonl").read_text().splitlines()) == lines
    assert json.loads((run / "results.json").read_text())["rows"] != json.loads(before)["rows"]


def test_retention_never_deletes_this_runs_checkpoints_for_newer_foreign_ones(tmp_path: Path) -> None:
    import torch

    from phase6.checkpoint import list_checkpoints, save_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = tmp_path / "checkpoints"
    for step in (30, 60):  # another run's, left in the directory
        save_checkpoint(ckpt, step, model, opt, sched, {}, keep=2)
    for step in (10, 20, 25):  # this run, keep-last-2
        save_checkpoint(ckpt, step, model, opt, sched, {}, keep=2)
    assert [p.name for p in list_checkpoints(ckpt)] == [
        "step_00000020.pt",
        "step_00000025.pt",
        "step_00000030.pt",
        "step_00000060.pt",
    ]


def test_pretrain_rerun_in_the_same_dir_is_refused_resume_is_not(tmp_path: Path) -> None:
    data, run = tmp_path / "data", tmp_path / "R"
    common = [
        "experiment=smoke",
        f"data.out_dir={data}",
        "optim.warmup_steps=1",
        "optim.warmup_frac=null",
        "train.val_every=2",
    ]
    common += ["train.ckpt_every=2", "train.export_hf=false", f"run.dir={run}"]
    assert cli("pretrain", *common, "train.max_steps=4").exit_code == 0
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    again = cli("pretrain", *common, "train.max_steps=4", "run.seed=7")
    assert again.exit_code == 2 and "another run's records" in again.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ckpts
    resumed = cli("pretrain", *common, "train.max_steps=6", "train.resume=auto")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed from" in resumed.output


# --- 2. secrets -----------------------------------------------------------------------------------------------------


def test_redaction_covers_flag_pairs_env_names_and_values_seen_once() -> None:
    argv = ["vllm", "serve", "m", "--api-key", SECRET, "--port", "8000", "--hf-token=abcdef123", "--tokenizer", "gpt2"]
    out = redact_argv(argv)
    assert out[4] == REDACTED and out[6] == "8000" and out[7] == f"--hf-token={REDACTED}" and out[9] == "gpt2"
    assert redact({"cmd": argv})["cmd"] == out  # an argument list inside results.json
    for k in ("OPENAI_API_KEY", "MY_KEY", "GITHUBTOKEN", "CLIENT_SECRET_X", "DB_PASSWORD", "--api-key", "api-key"):
        assert is_secret_key(k), k
    for k in ("TOKENIZERS_PARALLELISM", "KEYBOARD", "max_new_tokens", "--max-tokens", "--tokenizer", "eot_token"):
        assert not is_secret_key(k), k
    line = f"$ vllm serve m --api-key {SECRET} --max-model-len 2048"
    assert SECRET not in redact_text(line) and "--max-model-len 2048" in redact_text(line)
    assert SECRET not in redact_text(f"non-default args: {{'api_key': '{SECRET}', 'model': 'm'}}")
    # once seen under a secret key, the value is masked in any later text (an engine echoing its arguments)
    assert redact_text(f"Namespace(model='m', port=8000) {SECRET}") == f"Namespace(model='m', port=8000) {REDACTED}"


def test_server_log_and_stored_command_never_hold_an_engine_secret(tmp_path: Path) -> None:
    from phase6.config.serve import ServeConfig
    from phase6.serving import server

    echo = "import sys, json; print('args:', sys.argv[1:]); print(json.dumps({'api_key': sys.argv[-1]}))"
    cfg = ServeConfig(engine="vllm", launcher=[sys.executable, "-c", echo], engine_args={"api-key": SECRET + "x"})
    log = tmp_path / "server.log"
    srv = server.launch(cfg, "m", log)
    srv.proc.wait(timeout=60)
    time.sleep(0.5)  # the redacting copier drains the pipe
    text = log.read_text()
    assert "args:" in text and "--api-key" in text, text
    assert SECRET not in text, text
    assert SECRET not in json.dumps(srv.info()) and SECRET not in json.dumps(redact(srv.info()))


def test_no_run_file_holds_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml, env.json, metrics.jsonl, results.json/md, W&B's offline files: every file of the run dir."""
    from phase6.launch import load_config
    from phase6.runrecord import RunRecord

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "1")
    monkeypatch.setenv("HF_HUB_TOKEN", SECRET + "2")
    monkeypatch.setattr(sys, "argv", ["phase6", "serve-bench", f"+serve.engine_args.api-key={SECRET}3"])
    cfg = load_config(
        "serve_bench",
        [
            "experiment=smoke",
            f"+serve.engine_args.api-key={SECRET}3",
            f"+serve.env.MY_TOKEN={SECRET}4",
            "logger.wandb=true",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    rec = RunRecord(cfg, "serve_bench")
    rec.log({"loss": 1.0, "note": f"--api-key {SECRET}3"}, step=1)
    cmd = ["vllm", "serve", "m", "--api-key", SECRET + "3"]
    rec.finish([{"engine": "vllm"}], extra={"server": {"command": cmd}}, notes={"cmd": " ".join(cmd)})
    files = [f for f in (tmp_path / "run").rglob("*") if f.is_file()]
    assert {"config.yaml", "env.json", "metrics.jsonl", "results.json", "results.md"} <= {f.name for f in files}
    assert any("wandb" in str(f) for f in files)
    for f in files:
        text = f.read_bytes().decode(errors="ignore")
        for i in range(1, 5):
            assert f"{SECRET}{i}" not in text, (f, i)


# --- 3. one error path: a failed run is marked, an early failure leaves nothing -----------------------------------


def test_a_user_error_inside_a_job_marks_the_run_failed(tmp_path: Path) -> None:
    from phase6.launch import run_job
    from phase6.runrecord import RunRecord

    def fails_after_writing(cfg: object) -> None:
        RunRecord(cfg, "cost")
        raise UserError(f"{tmp_path}/shard_3.bin: truncated shard")

    def fails_before_writing(cfg: object) -> None:
        raise ValueError("data.path: x.jsonl: line 4: not valid JSON")

    with pytest.raises(UserError, match="truncated shard"):
        run_job("cost", [f"run.dir={tmp_path / 'a'}"], main=fails_after_writing)
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    assert res["status"] == "failed" and "truncated shard" in res["error"]
    assert "FAILED" in (tmp_path / "a" / "results.md").read_text()
    with pytest.raises(UserError, match="line 4"):
        run_job("cost", [f"run.dir={tmp_path / 'b'}"], main=fails_before_writing)
    assert not (tmp_path / "b").exists()


# --- 4. pre-flight integrity ----------------------------------------------------------------------------------------


def test_verify_shards_checks_every_header_and_hashes_its_part(tmp_path: Path) -> None:
    import numpy as np

    from phase6.data.shards import HEADER_BYTES, Manifest, TokenizerInfo, verify_shards, write_manifest, write_shard

    infos = [
        write_shard(tmp_path / f"d_{'val' if i == 0 else 'train'}_{i:06d}.bin", np.arange(100) + i) for i in range(5)
    ]
    write_manifest(tmp_path, Manifest("t", "r", TokenizerInfo("byte", 257, 256), shards=infos, num_tokens=500))
    assert verify_shards(tmp_path, workers=2) is not None
    bad = tmp_path / infos[3].file
    data = bytearray(bad.read_bytes())
    data[HEADER_BYTES + 1] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"d_train_000003.bin: manifest mismatch: sha256"):
        verify_shards(tmp_path, workers=2)
    # ranks share the hashing: shard 3 belongs to rank 1 of 2
    assert verify_shards(tmp_path, part=(0, 2)) is not None
    with pytest.raises(UserError, match="sha256"):
        verify_shards(tmp_path, part=(1, 2))
    assert verify_shards(tmp_path, sha256=False) is not None  # headers and counts only


# --- 5. evaluations after training degrade --------------------------------------------------------------------------


class _JudgeDownAfterProbe(http.server.BaseHTTPRequestHandler):
    """Answers the pre-training probe (/v1/models), then fails every judging request (as a judge that went away)."""

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"data": [{"id": "judge"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_dpo_reports_an_unavailable_judge_and_battery_instead_of_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import phase6.evals.battery as battery
    from phase6.config import load_object
    from phase6.launch import load_config

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JudgeDownAfterProbe)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def battery_down(*args: object, **kw: object) -> None:
        raise ConnectionError("cais/mmlu: could not reach the dataset host")

    monkeypatch.setattr(battery, "run_battery", battery_down)
    try:
        cfg = load_config(
            "dpo",
            [
                "experiment=smoke",
                f"eval.judge.base_url=http://127.0.0.1:{srv.server_address[1]}/v1",
                "eval.judge.model=judge",
                "eval.judge.num_prompts=4",
                "dpo.max_steps=2",
                f"run.dir={tmp_path / 'run'}",
            ],
        )
        load_object("projects/6c_dpo/dpo.py:main")(cfg)
    finally:
        srv.shutdown()
    run = tmp_path / "run"
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "complete" and res["rows"][0]["verdict"] == "INCOMPLETE"
    md = (run / "results.md").read_text()
    assert "UNAVAILABLE after training" in md and "HTTPStatusError" in md
    assert "battery unavailable: ConnectionError" in md and "Regression battery" in md


# --- smaller: compressed inputs, quick trace prompts, non-finite floats ----------------------------------------------


def test_gzip_inputs_read_like_plain_ones(tmp_path: Path) -> None:
    from phase6.posttrain.dpo_data import read_rows
    from phase6.serving.traces import iter_mooncake

    rows = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(3)]
    plain = tmp_path / "pairs.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    packed = tmp_path / "pairs.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_rows(packed) == read_rows(plain) == rows
    trace = [{"timestamp": i, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]} for i in range(3)]
    t = tmp_path / "trace.jsonl.gz"
    t.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in trace).encode()))
    assert [r.time_s for r in iter_mooncake(t)] == [0.0, 0.001, 0.002]
    (tmp_path / "broken.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n')[:-12])
    with pytest.raises(UserError, match="broken.jsonl.gz: cannot read"):
        read_rows(tmp_path / "broken.jsonl.gz")


@pytest.fixture(scope="module")
def tok():
    from phase6.posttrain.tiny import build_tiny_tokenizer
    from phase6.serving.tiny import stdlib_corpus

    return build_tiny_tokenizer(stdlib_corpus(), vocab_size=512)


def test_quick_trace_prompts_equal_the_tokenizer_path(tok, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phase6.serving import workload

    rows = []
    for i in range(6):
        n = 300 + 211 * i
        blocks = -(-n // 512)
        rows.append(
            {
                "timestamp": 10 * i,
                "input_length": n,
                "output_length": 4,
                "hash_ids": [i % 3, *range(100 * i, 100 * i + blocks - 1)],
            }
        )
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    csv = tmp_path / "azure.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:4{i}.0,{50 + 37 * i},5\n" for i in range(6))
    )
    calls = {"n": 0}
    encode = workload._encode

    def counted(t, text):
        calls["n"] += 1
        return encode(t, text)

    monkeypatch.setattr(workload, "_encode", counted)
    quick = {"m": workload.load_mooncake(path, tok, 3)[0], "a": workload.load_azure(csv, tok, 3)[0]}
    assert calls["n"] <= 4 * workload._QUICK_CHECK  # the tokenizer ran on the checked rows only, not on all 12
    monkeypatch.setattr(workload, "_QUICK", False)  # every row through decode + re-encode
    slow = {"m": workload.load_mooncake(path, tok, 3)[0], "a": workload.load_azure(csv, tok, 3)[0]}
    for k in quick:
        assert [(r.prompt, r.prompt_len) for r in quick[k]] == [(r.prompt, r.prompt_len) for r in slow[k]]
        assert [r.prompt_len for r in quick[k]] == [
            len(tok.encode(r.prompt, add_special_tokens=False)) for r in quick[k]
        ]


def test_a_default_run_dir_taken_in_the_same_second_gets_a_suffix(tmp_path: Path) -> None:
    from phase6.launch import _fresh

    base = tmp_path / "20261201-120000_cost"
    assert _fresh(str(base)) == str(base)
    base.mkdir()
    assert _fresh(str(base)) == str(base)  # an empty directory is not a run
    (base / "config.yaml").write_text("job: cost\n")
    assert _fresh(str(base)) == f"{base}-1"


# --- issue 28: one writer per run dir, resume checks the config, Hydra's line redacted, OS errors ------------------

HOLD = """
import sys, time
from phase6.runrecord import lock_run_dir
lock_run_dir(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def _holder(run: Path) -> subprocess.Popen[str]:
    """A second process that takes ``run``'s writer lock and sleeps (a live writer)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_ones_lock_is_taken_over(tmp_path: Path) -> None:
    import signal
    import socket

    from phase6.runrecord import LOCK_FILE

    run = tmp_path / "R"
    proc = _holder(run)
    try:
        for args in (["hours=1"], ["hours=1", "run.overwrite=true"]):  # overwrite cannot move a live run aside
            second = cli("cost", f"run.dir={run}", *args)
            err = second.stderr.strip()
            assert second.exit_code == 2 and "\n" not in err, second.output
            assert err.startswith(f"phase6: error: run.dir: {run} is being written by another phase6 run"), err
            assert f"pid {proc.pid} on host {socket.gethostname()}, started 20" in err, err
        assert not (run / "results.json").exists() and not list(tmp_path.glob("R.replaced-*"))
        proc.send_signal(signal.SIGKILL)  # the holder dies without cleaning up: its lock file stays
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert str(proc.pid) in (run / LOCK_FILE).read_text()
    third = cli("cost", f"run.dir={run}", "hours=1")
    assert third.exit_code == 0, third.output
    assert f"took over the lock left by pid {proc.pid}" in third.stderr
    assert json.loads((run / "results.json").read_text())["status"] == "complete"
    assert not (run / LOCK_FILE).exists()  # released at the end of the run


def test_only_rank_0_takes_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun the other ranks never touch the lock: rank 0 owns the directory for the run."""
    from phase6.runrecord import LOCK_FILE, claim_run_dir, unlock_run_dir

    monkeypatch.setenv("RANK", "1")
    claim_run_dir(tmp_path / "R", overwrite=False, resume=False)
    assert not (tmp_path / "R").exists()
    monkeypatch.setenv("RANK", "0")
    claim_run_dir(tmp_path / "R", overwrite=False, resume=False)
    assert (tmp_path / "R" / LOCK_FILE).is_file()
    unlock_run_dir(tmp_path / "R")
    assert not (tmp_path / "R" / LOCK_FILE).exists()


@pytest.mark.slow  # four pretrain runs on the smoke model: ~60 s on 2 loaded cores
def test_resume_refuses_an_immutable_change_and_records_a_mutable_one(tmp_path: Path) -> None:
    import yaml

    data, run = tmp_path / "data", tmp_path / "R"
    common = ["experiment=smoke", f"data.out_dir={data}", "optim.warmup_steps=1", "optim.warmup_frac=null"]
    common += ["train.val_every=2"]
    common += ["train.ckpt_every=2", "train.export_hf=false", f"run.dir={run}", "logger.console=false"]
    assert cli("pretrain", *common, "train.max_steps=4").exit_code == 0
    original = (run / "config.yaml").read_text()
    lr0 = yaml.safe_load(original)["optim"]["lr"]
    before = (run / "results.json").read_text()
    for bad, key in (
        ("model.n_layer=3", "model.n_layer"),
        ("run.seed=7", "run.seed"),
        ("optim.algorithm=muon", "optim.algorithm"),
    ):
        r = cli("pretrain", *common, "train.max_steps=6", "train.resume=auto", bad)
        err = r.stderr.strip()
        assert r.exit_code == 2 and "\n" not in err and "Traceback" not in r.output, r.output[-2000:]
        assert err.startswith("phase6: error: train.resume: ") and key in err and "step_00000004.pt" in err, err
    assert (run / "results.json").read_text() == before and (run / "config.yaml").read_text() == original
    ok = cli("pretrain", *common, "train.max_steps=6", "train.resume=auto", "optim.lr=0.0001")
    assert ok.exit_code == 0, ok.output[-2000:]
    assert (run / "config.yaml").read_text() == original  # the record of how the run started is never rewritten
    (change,) = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert change["step"] == 4 and change["changes"] == {"optim.lr": [lr0, 0.0001], "train.max_steps": [4, 6]}
    res = json.loads((run / "results.json").read_text())
    assert res["config_changes"] == [change]
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r}
    assert lrs[5] <= 0.0001 < lrs[4]  # the new peak applies from step 5 on: the optimizer ran at what is recorded
    # the next resume compares with the checkpoint's own config (lr 1e-4 now), not the original config.yaml
    again = cli("pretrain", *common, "train.max_steps=8", "train.resume=auto", "optim.lr=0.0001")
    assert again.exit_code == 0, again.output[-2000:]
    last = json.loads((run / "config_changes.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 6 and last["changes"] == {"train.max_steps": [6, 8]}


def test_hydra_failure_line_never_shows_a_secret(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A crash inside a job: Hydra prints "Error executing job with overrides: [...]" itself; the value is masked."""
    from phase6.launch import run_job

    def crashes(cfg: object) -> None:
        raise RuntimeError("engine crashed")

    with pytest.raises(SystemExit):
        run_job(
            "serve_bench",
            ["experiment=smoke", f"+serve.engine_args.api-key={SECRET}h", f"run.dir={tmp_path / 'R'}"],
            main=crashes,
        )
    out, err = capfd.readouterr()
    assert "Error executing job with overrides" in err and "api-key" in err, err
    assert f"{SECRET}h" not in out + err
    # a sweep: Hydra's launcher lists every member's overrides ("#0 : ...") on the console
    sweep = ["experiment=smoke", f"+serve.engine_args.api-key={SECRET}m", "load.concurrency=1,2"]
    run_job("serve_bench", [*sweep, f"run.dir={tmp_path / 'S'}"], multirun=True, main=lambda cfg: None)
    out, err = capfd.readouterr()
    assert "#1 : " in out + err and "api-key" in out + err and f"{SECRET}m" not in out + err, out + err
    # a bad override quoted back in the one-line error is masked too
    r = cli("serve-bench", "experiment=smoke", f"+serve.engine_args.api-key={SECRET}q", "serve.tp=zero")
    assert r.exit_code == 2 and f"{SECRET}q" not in r.output, r.output


def test_a_full_disk_is_one_line_and_the_run_is_marked_failed(tmp_path: Path) -> None:
    """A real ENOSPC from the kernel: the results file being written is /dev/full."""
    run = tmp_path / "R"
    run.mkdir()
    (run / "results.json.tmp").symlink_to("/dev/full")
    r = cli("cost", f"run.dir={run}", "hours=1")
    err = r.stderr.strip()
    assert r.exit_code == 2 and "\n" not in err and "Traceback" not in r.output, r.output[-3000:]
    assert err.startswith("phase6: error: ") and "No space left on device" in err and "ENOSPC" in err, err
    res = json.loads((run / "results.json").read_text())  # written into the bytes reserved at the start
    assert not (run / ".results.reserve").exists()
    assert res["status"] == "failed" and "No space left on device" in res["error"]


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess

    parent = tmp_path / "locked"
    parent.mkdir()
    if os.geteuid() == 0:  # root writes through permission bits: make the directory immutable instead
        if subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
            pytest.skip("root without chattr +i on this file system: cannot make a directory unwritable")
    else:
        parent.chmod(0o500)
    try:
        r = cli("cost", f"run.dir={parent / 'R'}", "hours=1")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(parent)], check=True)
        parent.chmod(0o700)
    err = r.stderr.strip()
    assert r.exit_code == 2 and "\n" not in err and "Traceback" not in r.output, r.output[-3000:]
    assert err.startswith(f"phase6: error: run.dir: {parent / 'R'}: not writable"), err


def _row(results: list, **kw: object) -> tuple[dict, dict]:
    from phase6.config.slo import SLOConfig
    from phase6.serving.client import RunOutcome
    from phase6.serving.stats import summarize

    out = RunOutcome(results, duration_s=10.0, first_dispatch_s=0.0)
    return summarize(
        out, engine="vllm", tp=1, concurrency=None, request_rate=2.0, num_gpus=1, usd_per_gpu_hour=1.0, slo=SLOConfig()
    )


def _answer(i: int, chunks: list[float], out: int = 8) -> object:
    from phase6.serving.client import RequestResult

    r = RequestResult(i, 0.0, ok=True, dispatch_s=0.0, send_s=0.0, chunk_times_s=chunks, tokens_source="usage")
    r.chunk_tokens = [1] * len(chunks)
    r.output_tokens, r.end_s = out, chunks[-1]
    return r


def test_tokens_the_client_could_not_time_are_counted_not_timed_as_0_ms() -> None:
    """The smoke_vllm Poisson row on a loaded box: 56 of 80 answers arrived in one socket read each (every event of
    an answer stamped alike). TPOT/ITL come from the 24 timed answers; the row counts the rest; never TPOT 0."""
    whole = [_answer(i, [0.3] * 8) for i in range(56)]  # 8 SSE events, one read: TTFT = E2E
    timed = [_answer(56 + i, [0.2 + 0.05 * k for k in range(8)]) for i in range(24)]  # 50 ms apart
    row, details = _row(whole + timed)
    assert row["untimed_requests"] == 56 and row["untimed_tokens"] == 56 * 7
    assert row["tpot_p50_ms"] == pytest.approx(50.0) and row["itl_p50_ms"] == pytest.approx(50.0)
    assert details["tpot_mean_ms"] == pytest.approx(50.0)
    # a timed answer whose last three events shared a read: those three tokens give no ITL sample
    part = _answer(0, [0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.4, 0.4])
    assert part.coalesced_tokens() == 3 and not part.untimed
    assert part.timed_itl_samples_s() == pytest.approx([0.05] * 4)
    row, _ = _row([part])
    assert row["untimed_tokens"] == 3 and row["tpot_p50_ms"] == pytest.approx(300 / 7)
    all_whole, _ = _row(whole)
    assert all_whole["untimed_requests"] == 56
    assert math.isnan(all_whole["tpot_p50_ms"]) and math.isnan(all_whole["itl_p50_ms"])  # missing, not 0


def test_server_side_tpot_and_itl_from_metrics_sit_beside_the_clients_with_a_warning_past_the_bound() -> None:
    from phase6.serving import telemetry
    from phase6.serving.stats import SERVER_CLIENT_BOUND, server_side_latency

    def expo(n: int, tpot_sum: float, itl_sum: float, engine: str = "vllm") -> str:
        tpot = "request_time_per_output_token_seconds" if engine == "vllm" else "time_per_output_token_seconds"
        return "\n".join(
            [
                f'{engine}:{tpot}_sum{{model_name="m"}} {tpot_sum}',
                f'{engine}:{tpot}_count{{model_name="m"}} {n}',
                f'{engine}:{tpot}_bucket{{le="0.1",model_name="m"}} {n}',
                f'{engine}:inter_token_latency_seconds_sum{{model_name="m"}} {itl_sum}',
                f'{engine}:inter_token_latency_seconds_count{{model_name="m"}} {7 * n}',
            ]
        )

    for engine in ("vllm", "sglang"):
        before = telemetry.parse_prometheus(expo(10, 0.5, 3.5, engine))
        after = telemetry.parse_prometheus(expo(90, 4.5, 31.5, engine))  # 80 requests at 50 ms, 560 tokens at 50 ms
        delta = telemetry.counter_deltas(before, after)
        agree = server_side_latency(delta, {"tpot_mean_ms": 52.0, "itl_mean_ms": 49.0})
        assert agree["server_itl_mean_ms"] == pytest.approx(50.0)
        assert agree["server_client_warnings"] == []
        off = server_side_latency(delta, {"tpot_mean_ms": 50.0 * (1 + SERVER_CLIENT_BOUND) + 1, "itl_mean_ms": 0.5})
        if engine == "vllm":
            assert agree["server_tpot_mean_ms"] == pytest.approx(50.0)
            assert len(off["server_client_warnings"]) == 2 and "TPOT" in off["server_client_warnings"][0]
        else:  # SGLang declares no per-request TPOT histogram (its 0.5.16 exposition: tests/data): missing, not 0
            assert agree["server_tpot_mean_ms"] is None and "no such histogram" in agree["server_tpot_missing"]
            assert len(off["server_client_warnings"]) == 1 and "ITL" in off["server_client_warnings"][0]
    none = server_side_latency({}, {"tpot_mean_ms": 50.0})
    assert none["server_tpot_mean_ms"] is None and "no such histogram" in none["server_tpot_missing"]


def test_the_readiness_probe_and_the_client_send_the_api_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that wants a key: 401 without $OPENAI_API_KEY (one line naming it), ready with it."""
    from phase6.serving import server as servers

    key = "k-" + SECRET
    seen: list[str | None] = []

    class Keyed(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            ok = self.path == "/health" or self.headers.get("Authorization") == f"Bearer {key}"
            body = json.dumps({"data": [{"id": "m"}]} if ok else {"error": "unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(UserError, match=r"/v1/models 401 .*OPENAI_API_KEY is not set"):
            servers.Server("vllm", url).wait_ready(30)
        monkeypatch.setenv("OPENAI_API_KEY", key)
        s = servers.Server("vllm", url)
        s.wait_ready(30)
        assert s.model_id == "m" and seen[-1] == f"Bearer {key}"
        assert SECRET not in json.dumps(s.info())
    finally:
        srv.shutdown()


def test_report_keeps_the_failed_banner_and_the_refusal_advises_only_keys_the_job_has(tmp_path: Path) -> None:
    from phase6.launch import run_job
    from phase6.runrecord import RunRecord

    def fails(cfg: object) -> None:
        RunRecord(cfg, "cost")
        raise UserError("data.path: x.jsonl: line 4: not valid JSON")

    with pytest.raises(UserError):
        run_job("cost", [f"run.dir={tmp_path / 'F'}"], main=fails)
    assert cli("report", str(tmp_path / "F")).exit_code == 0
    md = (tmp_path / "F" / "results.md").read_text()
    assert "**FAILED**: data.path: x.jsonl: line 4" in md, md
    # a reused run dir: only pretrain has train.resume, so only pretrain's refusal suggests it
    for job, args in (("cost", []), ("serve-bench", ["experiment=smoke"]), ("dpo", ["experiment=smoke"])):
        r = cli(job, *args, f"run.dir={tmp_path / 'F'}")
        assert r.exit_code == 2 and "another run's records" in r.stderr and "train.resume" not in r.stderr, r.stderr
    r = cli("pretrain", "experiment=smoke", f"run.dir={tmp_path / 'F'}", "auto_prepare=false")
    assert r.exit_code == 2 and "train.resume=auto" in r.stderr, r.stderr


def test_resume_policy_refuses_what_would_invalidate_the_run_and_returns_the_rest() -> None:
    """The fast half of the resume check (the slow test runs it through pretrain): which keys may change."""
    from dataclasses import asdict

    from phase6.config.pretrain import resume_changes
    from phase6.launch import load_config

    saved = asdict(load_config("pretrain", ["experiment=smoke"]))
    new = asdict(load_config("pretrain", ["experiment=smoke", "train.max_steps=80", "train.val_every=5"]))
    new["run"]["dir"], new["train"]["resume"] = "/elsewhere", "auto"  # where/how it runs: never compared
    assert resume_changes(saved, new, "ck.pt") == {
        "train.max_steps": [saved["train"]["max_steps"], 80],
        "train.val_every": [saved["train"]["val_every"], 5],
    }
    for key, value in (("model.n_embd", 128), ("run.seed", 7), ("optim.algorithm", "muon"), ("data.out_dir", "x")):
        group, field = key.split(".")
        bad = asdict(load_config("pretrain", ["experiment=smoke"]))
        bad[group][field] = value
        with pytest.raises(ValueError, match=rf"^train.resume: ck.pt was trained with a different {key} "):
            resume_changes(saved, bad, "ck.pt")
