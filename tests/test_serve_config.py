"""6B config: validation names the key, derived request counts, launch key, the `--tp` option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import phase6.cli as cli
from phase6.config.serve import LoadConfig, ServeConfig
from phase6.launch import ConfigError, load_config


@pytest.mark.parametrize(
    "override,key",
    [
        (["serve.engine=tgi"], "serve.engine"),
        (["serve.host=0.0.0.0"], "serve.host"),
        (["serve.tp=0"], "serve.tp"),
        (["serve=endpoint", "serve.endpoint=null"], "serve.endpoint"),
        (["load.arrival=poisson", "load.request_rate=null"], "load.request_rate"),
        (["load.concurrency=64", "load.num_requests=100"], "load.num_requests"),
        (["load.requests_per_slot=5"], "load.requests_per_slot"),
        (["load.arrival=trace"], "load.arrival"),
        (["load.dataset=csv"], "load.dataset"),
        (["load=synthetic", "load.prompt_dist.kind=zipf"], "load.prompt_dist.kind"),
        (["slo.ttft_ms=null", "slo.tpot_ms=null"], "slo"),
        (["slo.tbt_ms=50"], "slo.tbt_ms"),
        (["serve.max_model_len=1024"], "serve.max_model_len"),
    ],
)
def test_bad_values_fail_naming_the_key(override: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}\b"):
        load_config("serve_bench", override)


def test_derived_request_counts_and_warmup() -> None:
    load = LoadConfig(concurrency=1)
    assert [LoadConfig(concurrency=c).measured_requests() for c in (1, 16, 64)] == [200, 200, 640]
    assert load.warmup() == 1 and LoadConfig(arrival="poisson", request_rate=2, concurrency=None).warmup() == 4
    assert LoadConfig(concurrency=4, num_requests=40).measured_requests() == 40
    assert LoadConfig(dataset="mooncake", path="x", arrival="trace", concurrency=None).measured_requests(37) == 37


def test_launch_key_changes_only_with_the_server_command() -> None:
    a = ServeConfig(tp=2)
    assert a.launch_key() == ServeConfig(tp=2, ready_timeout_s=5).launch_key()
    assert a.launch_key() != ServeConfig(tp=4).launch_key()
    assert a.launch_key() != ServeConfig(tp=2, engine="sglang").launch_key()
    assert a.launch_key() != ServeConfig(tp=2, engine_args={"load-format": "dummy"}).launch_key()


def test_tp_option_maps_to_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(cli, "run", lambda job, args, multirun=False: seen.append((job, args, multirun)))
    result = CliRunner().invoke(cli.app, ["serve-bench", "--tp", "4", "load.concurrency=16"])
    assert result.exit_code == 0, result.output
    assert seen == [("serve_bench", ["load.concurrency=16", "serve.tp=4"], False)]
    result = CliRunner().invoke(cli.app, ["serve-bench", "--endpoint", "http://127.0.0.1:8000", "-m", "serve.tp=2,4"])
    assert result.exit_code == 0, result.output
    assert seen[1] == ("serve_bench", ["serve.tp=2,4", "serve.endpoint=http://127.0.0.1:8000"], True)


def test_smoke_and_table_presets_compose() -> None:
    smoke = load_config("serve_bench", ["experiment=smoke"])
    assert smoke.serve.engine == "transformers" and smoke.serve.random_model == "tiny"
    assert smoke.load.num_requests == 40 and smoke.hardware.name == "cpu"
    h200 = load_config("serve_bench", ["experiment=gpu_h200", "load.concurrency=64"])
    assert h200.serve.random_model == "llama3.1-8b" and h200.load.measured_requests() == 640
    assert load_config("serve_bench", ["load.concurrency=1"]).load.measured_requests() == 200
