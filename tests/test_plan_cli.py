"""`phase6 plan` end to end: the scripted JSON interface, table/explain output, one-line errors, calibrate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phase6.cli import app
from phase6.plan.profile import build_profile, read_profile

runner = CliRunner()


def _plan(tmp_path: Path, *args: str):  # noqa: ANN202
    return runner.invoke(app, ["plan", *args, f"run.dir={tmp_path / 'run'}"])


def test_json_interface_exactly_as_documented(tmp_path: Path) -> None:
    r = _plan(tmp_path, "model=llama3.1-70b", "hardware=h100_sxm", "gpus=8", "workload=serve", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)  # stdout is one JSON object and nothing else
    assert out["params"] == 70_553_706_496
    assert out["weights_bytes"] == 2 * 70_553_706_496
    assert out["kv_cache_bytes_per_token"] == 327_680
    assert out["candidates"]
    for c in out["candidates"]:
        assert {"dp", "tp", "pp", "ep", "cp", "memory_gib_per_gpu", "fits", "decode_ms_per_token", "reason"} <= set(c)
        assert c["fits"] and c["tp"] >= 2
    assert (tmp_path / "run" / "results.json").is_file()


def test_train_json_has_step_time(tmp_path: Path) -> None:
    r = _plan(tmp_path, "model=llama3.1-8b", "gpus=16", "workload=train", "plan.seq_len=2048", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["candidates"] and all("step_time_s" in c for c in out["candidates"])
    assert out["cost"]["gpu_hours"] > 0


def test_explain_prints_the_derivation(tmp_path: Path) -> None:
    r = _plan(tmp_path, "model=llama3.1-70b", "gpus=8", "--explain")
    assert r.exit_code == 0, r.output
    assert "2*80*8*128*2 = 327,680 B" in r.stdout and "decode = max(memory, compute) + all-reduce" in r.stdout


def test_train_explain_says_why_and_what_micro_batch_means(tmp_path: Path) -> None:
    r = _plan(tmp_path, "model=llama3.1-8b", "gpus=8", "workload=train", "plan.seq_len=4096", "--explain")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "why this layout:" in out and "within 5% of the" in out and "fewer model-parallel dimensions" in out
    assert "plan.micro_batch_size = sequences per micro-batch per data-parallel replica" in out and "local_batch" in out
    assert "(micro-batch searched: the fastest that fits)" in out
    assert "GEMM" in out and "6 us per GEMM call" in out and "attention 4*L*H*Q*T/2 (causal fwd) x 3.5" in out


def test_hf_config_json_and_profile(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "num_hidden_layers": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = _plan(tmp_path, f"plan.hf_config={tmp_path / 'config.json'}", "gpus=2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"] == "config"


@pytest.mark.parametrize(
    "args,key",
    [
        (["model=llama9"], "model"),  # unknown preset
        (["gpus=8", "plan.tp=3"], "gpus"),  # not factorizable as asked
        (["model=qwen2.5-7b", "gpus=8", "plan.tp=8"], "gpus"),  # TP does not divide 28 heads
        (["workload=infer"], "workload"),
        (["plan.hf_config=/nonexistent/config.json"], "plan.hf_config"),
        (["workload=serve", "plan.cp=2"], "context parallelism is a training layout"),
        (["model=nope"], "unknown preset 'nope'; known: gpt2"),
        (["workload=train", "plan.seq_len=4096", "plan.global_batch_tokens=1000"], "less than one sequence"),
        (["model=gpt2", "workload=serve", "plan.context_len=4096"], "exceeds gpt2's max_position_embeddings 1024"),
        (["model=gpt2", "workload=train", "plan.seq_len=2048"], "plan.seq_len: 2048 exceeds"),
        (["workload=train", "plan.micro_batch_size=0"], "plan.micro_batch_size: must be >= 1, got 0"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], key: str) -> None:
    r = _plan(tmp_path, *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in (r.stderr or r.output).strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("phase6: error:") and key in lines[0], lines


def test_missing_config_field_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    r = _plan(tmp_path, f"plan.hf_config={tmp_path / 'config.json'}")
    assert r.exit_code == 2
    err = (r.stderr or r.output).strip()
    assert len(err.splitlines()) == 1 and "missing field num_hidden_layers" in err


def test_calibrate_on_cpu_gloo_writes_a_profile_predictions_use(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    r = runner.invoke(
        app,
        [
            "plan",
            "calibrate",
            "--nproc-per-node",
            "2",
            "--sizes",
            "1024,262144",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--matmul-size",
            "64",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    prof = read_profile(out)
    assert prof["world_size"] == 2 and prof["backend"] == "gloo" and prof["matmul"]["tflops"] > 0
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        pts = prof["collectives"][name]["points"]
        assert [p["bytes"] for p in pts] == [1024, 262144]
        assert all(p["time_us"] > 0 and p["busbw_gbps"] > 0 for p in pts)
    from phase6.config import HardwareConfig

    hw = build_profile(HardwareConfig(name="cpu"), str(out))
    assert hw.intra.bandwidth_gbps == pytest.approx(prof["collectives"]["all_reduce"]["busbw_gbps"])
    assert hw.source.startswith("calibrated")
    r = _plan(tmp_path, "model=gpt2", "hardware=cpu", "gpus=2", f"plan.profile={out}", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["assumptions"]["numbers_from"].startswith("calibrated")


def test_bad_profile_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"kind": "phase6.plan.profile", "world_size": 2, "nodes": 1, "collectives": {}}))
    with pytest.raises(ValueError, match="missing key 'all_reduce'"):
        read_profile(bad)
    r = _plan(tmp_path, f"plan.profile={bad}")
    assert r.exit_code == 2 and "all_reduce" in (r.stderr or r.output)
