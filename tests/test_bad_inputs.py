"""Every job, every kind of bad input: one line `phase6: error: <what/where>: <why>` on stderr, exit 2, in seconds,
no traceback, and no half-written run directory (none at all, or one whose results.json says status: failed).

Table-driven: each case builds its bad input under tmp_path and names the job, the overrides and a fragment the
message must contain (the file or key). Runs in-process through the CLI (typer's runner) to stay fast."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phase6.cli import app
from phase6.data.shards import HEADER_BYTES


def dead_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared data dir (embedded corpus, byte tokenizer): the good copy every shard case corrupts."""
    out = tmp_path_factory.mktemp("shards") / "data"
    run = tmp_path_factory.mktemp("prep") / "run"
    result = CliRunner().invoke(app, ["prepare-data", f"data.out_dir={out}", f"run.dir={run}"])
    assert result.exit_code == 0, result.output
    return out


def copy_shards(shards: Path, tmp: Path) -> Path:
    d = tmp / "data"
    shutil.copytree(shards, d)
    return d


def flip_byte(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    last = sorted(d.glob("*_train_*.bin"))[-1]  # the last shard: the loader would meet it last
    data = bytearray(last.read_bytes())
    data[HEADER_BYTES + 10] ^= 0xFF
    last.write_bytes(bytes(data))
    return d


def corrupt_val(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    val = next(d.glob("*_val_*.bin"))
    data = bytearray(val.read_bytes())
    data[-1] ^= 0xFF
    val.write_bytes(bytes(data))
    return d


def truncate_shard(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    last = sorted(d.glob("*_train_*.bin"))[-1]
    last.write_bytes(last.read_bytes()[:-100])
    return d


def bad_manifest_json(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    (d / "manifest.json").write_text('{"format": "phase6-shards/1", ')
    return d


def wrong_manifest_count(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    m = json.loads((d / "manifest.json").read_text())
    m["shards"][-1]["num_tokens"] += 1
    m["num_tokens"] += 1  # the totals still add up: the shard's header disagrees
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def wrong_manifest_total(shards: Path, tmp: Path) -> Path:
    d = copy_shards(shards, tmp)
    m = json.loads((d / "manifest.json").read_text())
    m["num_tokens"] += 7
    (d / "manifest.json").write_text(json.dumps(m))
    return d


_KEEP: list[object] = []  # listening sockets and servers of the cases below, alive until the session ends


def silent_endpoint() -> int:
    """A port that accepts connections and never answers a byte (a hung server)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    _KEEP.append(s)
    return s.getsockname()[1]


def http_endpoint(status: int) -> int:
    """A port where an HTTP server answers every request with ``status`` (404: a wrong server; 401: one that wants
    an API key)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _KEEP.append(srv)
    return srv.server_address[1]


def busy_port() -> int:
    """A port another process-like listener holds (serve.port already in use)."""
    return silent_endpoint()


GOOD_PAIR = {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}


def dpo_file(tmp: Path, lines: list[bytes], name: str = "pairs.jsonl") -> Path:
    p = tmp / name
    body = b"\n".join([json.dumps(GOOD_PAIR).encode()] * 3 + lines) + b"\n"
    p.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    return p


MOONCAKE_ROW = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def trace_file(tmp: Path, rows: list[str]) -> Path:
    p = tmp / "trace.jsonl"
    p.write_text("\n".join(rows) + "\n")
    return p


@dataclass
class Case:
    id: str
    job: str
    args: Callable[[Path, Path], list[str]]
    """(tmp_path, good shards dir) -> CLI arguments after the job name."""
    expect: str
    """A fragment the one-line message must contain (the file, key or URL, or the reason)."""


def pretrain_data(make: Callable[[Path, Path], Path]) -> Callable[[Path, Path], list[str]]:
    def args(tmp: Path, shards: Path) -> list[str]:
        return ["experiment=smoke", f"data.out_dir={make(shards, tmp)}", "auto_prepare=false"]

    return args


def dpo_rows(lines: list[bytes], name: str = "pairs.jsonl") -> Callable[[Path, Path], list[str]]:
    return lambda t, s: ["experiment=smoke", "data=local", f"data.path={dpo_file(t, lines, name)}"]


CASES = [
    # --- pretrain: config, data integrity (before step 1), run directory
    Case("pretrain-lr-inf", "pretrain", lambda t, s: ["experiment=smoke", "optim.lr=inf"], "optim.lr"),
    Case("pretrain-lr-nan", "pretrain", lambda t, s: ["experiment=smoke", "optim.lr=nan"], "optim.lr"),
    Case("pretrain-flipped-byte", "pretrain", pretrain_data(flip_byte), "sha256"),
    Case("pretrain-truncated-shard", "pretrain", pretrain_data(truncate_shard), "truncated shard"),
    Case("pretrain-bad-manifest-json", "pretrain", pretrain_data(bad_manifest_json), "manifest.json: not valid JSON"),
    Case("pretrain-wrong-manifest-count", "pretrain", pretrain_data(wrong_manifest_count), "manifest mismatch"),
    Case("pretrain-wrong-manifest-total", "pretrain", pretrain_data(wrong_manifest_total), "num_tokens"),
    Case(
        "pretrain-missing-data-dir",
        "pretrain",
        lambda t, s: ["experiment=smoke", f"data.out_dir={t}/nope", "auto_prepare=false"],
        "data.out_dir",
    ),
    # --- prepare-data
    Case(
        "prepare-missing-local-file",
        "prepare-data",
        lambda t, s: ["data.source=local", f"data.local_path={t}/nope.jsonl", f"data.out_dir={t}/out"],
        "nope.jsonl",
    ),
    Case(
        "prepare-corrupt-existing-shards",
        "prepare-data",
        lambda t, s: [f"data.out_dir={flip_byte(s, t)}"],
        "sha256",
    ),
    # --- eval
    Case(
        "eval-missing-model-dir",
        "eval",
        lambda t, s: [f"model={t}/no_such_model", "tasks=[]", f"val_data={s}"],
        "no_such_model",
    ),
    Case(
        "eval-corrupt-val-shard",
        "eval",
        lambda t, s: ["model=gpt2", "tasks=[]", f"val_data={corrupt_val(s, t)}"],
        "sha256",
    ),
    # --- serve-bench: trace and endpoint checked before a model is built or a server started
    Case(
        "serve-missing-trace",
        "serve-bench",
        lambda t, s: ["experiment=smoke", "load.dataset=mooncake", f"load.path={t}/nope.jsonl", "load.arrival=trace"],
        "nope.jsonl",
    ),
    Case(
        "serve-bad-trace-row",
        "serve-bench",
        lambda t, s: [
            "experiment=smoke",
            "load.dataset=mooncake",
            f"load.path={trace_file(t, [json.dumps(MOONCAKE_ROW), '{oops'])}",
            "load.arrival=trace",
        ],
        "trace.jsonl:2",
    ),
    Case(
        "serve-dead-endpoint",
        "serve-bench",
        lambda t, s: ["experiment=smoke", f"--endpoint=http://127.0.0.1:{dead_port()}"],
        "serve.endpoint",
    ),
    Case(
        "serve-silent-endpoint",
        "serve-bench",
        lambda t, s: [
            "experiment=smoke",
            f"--endpoint=http://127.0.0.1:{silent_endpoint()}",
            "serve.ready_timeout_s=3",
            "serve.random_model=null",
        ],
        "not ready after 3 s",
    ),
    Case(
        "serve-endpoint-404",
        "serve-bench",
        lambda t, s: [
            "experiment=smoke",
            f"--endpoint=http://127.0.0.1:{http_endpoint(404)}",
            "serve.random_model=null",
        ],
        "not an OpenAI-compatible server",
    ),
    Case(
        "serve-endpoint-401",
        "serve-bench",
        lambda t, s: [
            "experiment=smoke",
            f"--endpoint=http://127.0.0.1:{http_endpoint(401)}",
            "serve.random_model=null",
        ],
        "OPENAI_API_KEY",
    ),
    Case(
        "serve-port-in-use", "serve-bench", lambda t, s: ["experiment=smoke", f"serve.port={busy_port()}"], "serve.port"
    ),
    Case(
        "serve-engine-refuses-a-flag",
        "serve-bench",
        lambda t, s: ["experiment=smoke", "+serve.engine_args.no-such-flag=1"],
        "No such option '--no-such-flag'",
    ),
    # --- dpo: malformed rows, checked before a model is built; a dead judge before training
    Case("dpo-bad-json", "dpo", dpo_rows([b"{not json"]), "pairs.jsonl: line 4"),
    Case("dpo-missing-field", "dpo", dpo_rows([b'{"prompt": "x", "chosen": "y"}']), "rejected"),
    Case("dpo-null-field", "dpo", dpo_rows([b'{"prompt": "x", "chosen": null, "rejected": "z"}']), "pairs.jsonl"),
    Case("dpo-empty-field", "dpo", dpo_rows([b'{"prompt": "x", "chosen": "", "rejected": "z"}']), "pairs.jsonl"),
    Case("dpo-non-utf8", "dpo", dpo_rows([b'{"prompt": "\xff\xfe"}']), "UTF-8"),
    Case(
        "dpo-lone-surrogate",
        "dpo",
        dpo_rows([b'{"prompt": "x", "chosen": "a\\ud800b", "rejected": "z"}']),
        "pairs.jsonl: line 4: field chosen",
    ),
    Case("dpo-bad-json-gz", "dpo", dpo_rows([b"{not json"], "pairs.jsonl.gz"), "pairs.jsonl.gz: line 4"),
    Case(
        "dpo-dead-judge",
        "dpo",
        lambda t, s: [
            "experiment=smoke",
            f"eval.judge.base_url=http://127.0.0.1:{dead_port()}/v1",
            "eval.judge.model=judge",
            "eval.judge.num_prompts=8",
        ],
        "eval.judge.base_url",
    ),
    # --- grpo
    Case(
        "grpo-missing-gsm8k-dir",
        "grpo",
        lambda t, s: ["experiment=smoke", "data=gsm8k_local", f"data.path={t}/no_gsm8k"],
        "no_gsm8k",
    ),
    Case("grpo-lr-inf", "grpo", lambda t, s: ["experiment=smoke", "grpo.learning_rate=inf"], "grpo.learning_rate"),
    # --- plan
    Case("plan-zero-gpus", "plan", lambda t, s: ["gpus=0"], "gpus"),
    Case("plan-missing-hf-config", "plan", lambda t, s: [f"model={t}/nope/config.json"], "nope"),
    # --- fleet
    Case(
        "fleet-missing-trace",
        "fleet",
        lambda t, s: ["workload=mooncake", f"workload.path={t}/nope.jsonl"],
        "nope.jsonl",
    ),
    Case(
        "fleet-bad-trace-row",
        "fleet",
        lambda t, s: ["workload=mooncake", f"workload.path={trace_file(t, [json.dumps(MOONCAKE_ROW), '[1, 2]'])}"],
        "trace.jsonl:2",
    ),
    # --- cost
    Case("cost-negative-hours", "cost", lambda t, s: ["hours=-1"], "hours"),
    Case("cost-infinite-hours", "cost", lambda t, s: ["hours=inf"], "hours"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2(case: Case, tmp_path: Path, shards: Path) -> None:
    run_dir = tmp_path / "run"
    args = [case.job, *case.args(tmp_path, shards), f"run.dir={run_dir}"]
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, args)
    seconds = time.perf_counter() - t0
    err = result.stderr.strip()
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output[-2000:]} {result.exception!r}"
    assert err.startswith("phase6: error: ") and "\n" not in err, err
    assert "Traceback" not in result.output
    assert case.expect in err, err
    assert seconds < 60, f"{seconds:.1f} s"  # generous for a loaded 2-core machine; typically 1-5 s
    # nothing half-written: no run directory, or one marked failed
    if run_dir.exists():
        res = json.loads((run_dir / "results.json").read_text())
        assert res["status"] == "failed" and res["error"], res
