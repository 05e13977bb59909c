"""Nothing lost, nothing leaked (issue 17): run-directory safety, checkpoint retention, redaction of every written
file, failed runs marked, pre-flight shard integrity, evaluations that degrade, compressed inputs, quick trace prompts.
The bad-input table over every job is tests/test_bad_inputs.py."""

from __future__ import annotations

import gzip
import http.server
import json
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
