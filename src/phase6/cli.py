"""The `phase6` command: one subcommand per job; trailing arguments are Hydra overrides.

phase6 pretrain model=gpt2_124m optim.lr=3e-4        # one run
phase6 dpo -m dpo.beta=0.01,0.05,0.1,0.3              # a sweep (Hydra's sweeper/launcher), + summary table
phase6 config pretrain experiment=smoke               # print the resolved, validated config
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from phase6.launch import EXIT_CONFIG_ERROR, ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="phase6: pretraining, serving, DPO and GRPO pipelines with predicted-vs-measured reports.",
)
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
NOTES: list[str] = []
"""One-line notes (an old flag spelling) printed after the command succeeds."""
MULTIRUN = typer.Option(False, "-m", "--multirun", help="Run a Hydra sweep over comma-separated override values.")


def fail(msg: str, code: int = EXIT_CONFIG_ERROR) -> None:
    """One line on stderr, then exit (2 for user mistakes in config or arguments); secrets in it are masked (a bad
    override is quoted back)."""
    from phase6.redact import redact_text

    typer.echo(f"phase6: error: {redact_text(msg)}", err=True)
    raise typer.Exit(code)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A ValueError from a command's own argument parsing or input checks becomes `fail`'s one line and exit 2."""
    try:
        yield
    except ValueError as e:
        NOTES.clear()  # a bad input stays one line
        fail(str(e))
    for note in NOTES:
        typer.echo(note, err=True)
    NOTES.clear()


def flag_args(tool: str, argv: list[str], run_dir_flag: str | None = None) -> list[str]:
    """Hydra-style arguments for the subcommands whose parser is argparse (plan validate/calibrate, the benches):
    ``key=value`` is ``--key=value`` (underscores as dashes; ``key=true`` a bare switch, ``key=false`` dropped) and
    ``run.dir=X`` is ``run_dir_flag`` formatted with X. The ``--flag`` spellings keep working, with a one-line note
    (printed by ``one_line_errors`` once the command succeeded, so a bad input stays one line)."""
    out: list[str] = []
    old = [a.split("=")[0] for a in argv if a.startswith("--") and a not in ("--help",)]
    for a in argv:
        key, eq, value = a.partition("=")
        if a.startswith("-") or not eq or "/" in key:  # a flag, a positional, or a path that holds '='
            out.append(a)
        elif key == "run.dir":
            if run_dir_flag is None:
                raise ValueError(f"run.dir: {tool} writes no run directory (README: the subcommands without one)")
            out.append(run_dir_flag.format(value))
        elif value.lower() == "true":
            out.append(f"--{key.replace('_', '-')}")
        elif value.lower() != "false":
            out.append(f"--{key.replace('_', '-')}={value}")
    if old:
        NOTES.append(
            f"phase6: note: {tool} takes key=value like every subcommand ({old[0]} X is {old[0][2:].replace('-', '_')}"
            f"=X{', --out X is run.dir=X' if run_dir_flag and '--out' in old else ''}); the --flag spelling still works"
        )
    return out


def run(job: str, overrides: list[str], multirun: bool = False) -> None:
    from phase6.launch import os_error, run_job

    try:
        run_job(job, overrides, multirun)
    except ConfigError as e:
        fail(str(e))
    except OSError as e:  # the disk, permissions or a port, before or after the job itself ran
        user = os_error(e)
        if user is None:
            raise
        fail(str(user))


@app.command(context_settings=OVERRIDES)
def cost(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """GPU-hours and $ for GPUS x HOURS, $ per 1M tokens, next to API prices (hardware=..., gpus=, hours=, *_tokens=)."""
    run("cost", ctx.args, multirun)


@app.command(context_settings=OVERRIDES)
def dpo(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """6C LoRA-DPO (dpo.loss=sigmoid|ipo|orpo), margin/length diagnostics, lm-eval battery, verdict."""
    run("dpo", ctx.args, multirun)


def _grpo_vllm_preflight(overrides: list[str], multirun: bool) -> None:
    """engine=vllm: check the vLLM side before anything starts (one line, exit 2), and from a Python without vLLM
    run the same command with the vLLM environment's interpreter (``make setup-vllm``'s .venv-vllm or
    $PHASE6_VLLM_PYTHON; vLLM pins its own torch, so it has its own venv)."""
    import importlib.util
    import os
    import subprocess
    from pathlib import Path

    from phase6.launch import preflight

    try:
        members = [c for c in preflight("grpo", overrides, multirun) if c.engine.name == "vllm"]
    except ConfigError as e:
        fail(str(e))
    if not members:
        return
    if importlib.util.find_spec("vllm") is not None:
        from phase6.rollout.vllm import check_colocate_options

        for c in members:
            if c.engine.vllm_mode == "colocate":
                with one_line_errors():
                    check_colocate_options(dict(c.engine.vllm))
        return
    from phase6.serving.vllm_env import skip_reason, vllm_python

    py = vllm_python()
    if py is None:
        fail(f"engine=vllm: vLLM is not installed in this Python, and {skip_reason()}; or use engine=hf")
    if not Path(py).is_file():
        fail(f"engine=vllm: the vLLM environment's Python {py} does not exist (PHASE6_VLLM_PYTHON or .venv-vllm)")
    if os.environ.get("PHASE6_IN_VLLM_ENV"):
        fail(f"engine=vllm: the vLLM environment's Python ({sys.executable}) cannot import vllm; rerun make setup-vllm")
    src = str(Path(__file__).resolve().parents[1])  # this checkout's sources win in the child too
    env = {**os.environ, "PHASE6_IN_VLLM_ENV": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    typer.echo(f"phase6: engine=vllm: running in the vLLM environment ({py})", err=True)
    proc = subprocess.run([py, "-m", "phase6", "grpo", *(["-m"] if multirun else []), *overrides], env=env)
    raise typer.Exit(proc.returncode)


@app.command(context_settings=OVERRIDES)
def grpo(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """6D: GRPO on GSM8K with an instrumented rollout engine (engine=vllm|vllm_server|hf|verl, grpo.staleness=k)."""
    _grpo_vllm_preflight(ctx.args, multirun)
    run("grpo", ctx.args, multirun)


@app.command("prepare-data", context_settings=OVERRIDES)
def prepare_data(
    ctx: typer.Context,
    multirun: bool = MULTIRUN,
    check_tokenizer: bool = typer.Option(
        False, "--check-tokenizer", help="Round-trip an English page byte for byte; report bytes/token."
    ),
) -> None:
    """6A data: tokenize data=<preset> into llm.c shards (shard 0 = val) + manifest.json; rerun resumes a kill."""
    run("prepare_data", ctx.args + (["check_tokenizer=true"] if check_tokenizer else []), multirun)


@app.command(context_settings=OVERRIDES)
def pretrain(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """6A: GPT-2 pretraining (DDP/FSDP2, compile, bf16), predictions before step 1, measured after. torchrun-able."""
    run("pretrain", ctx.args, multirun)


@app.command("eval", context_settings=OVERRIDES)
def eval_cmd(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """6A eval: lm-eval (hellaswag, arc_easy, piqa) on model=<HF dir | hub id>, + val loss with val_data=<shards>."""
    run("eval", ctx.args, multirun)


@app.command(context_settings=OVERRIDES)
def plan(
    ctx: typer.Context,
    multirun: bool = MULTIRUN,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (the scripting interface)."),
    explain: bool = typer.Option(False, "--explain", help="Print the derivation with every number."),
) -> None:
    """Predict memory, comm, step time or serving latency; rank layouts. `phase6 plan calibrate -h` to measure,
    `phase6 plan validate` to hold the model against published runs."""
    if ctx.args[:1] == ["calibrate"]:
        from phase6.plan.calibrate import cli_main

        with one_line_errors():
            cli_main(flag_args("plan calibrate", ctx.args[1:], "--out={}/profile.json"))
        return
    if ctx.args[:1] == ["validate"]:
        from phase6.plan.validate import cli_main as validate_main

        with one_line_errors():
            validate_main(flag_args("plan validate", ctx.args[1:], "--out={}") + (["--json"] if json_out else []))
        return
    from phase6.plan.model import list_presets

    for arg in ctx.args:  # Hydra's own message ("Could not find 'model/x'") does not say what exists
        if arg.startswith("model=") and "," not in arg and arg[len("model=") :] not in list_presets():
            fail(
                f"model: unknown preset {arg[len('model=') :]!r}; known: {', '.join(list_presets())} "
                "(or pass plan.hf_config=PATH/config.json)"
            )
    output = ["plan.output=json"] if json_out else ["plan.output=explain"] if explain else []
    run("plan", ctx.args + output, multirun)


@app.command(context_settings=OVERRIDES)
def fleet(ctx: typer.Context, multirun: bool = MULTIRUN) -> None:
    """Simulate serving fleets on traces: goodput at SLO per policy/router, prefix hits, replicas, $, PD grid."""
    run("fleet", ctx.args, multirun)


@app.command("serve-bench", context_settings=OVERRIDES)
def serve_bench(
    ctx: typer.Context,
    multirun: bool = MULTIRUN,
    tp: int = typer.Option(None, "--tp", help="Tensor parallelism (same as serve.tp=N)."),
    endpoint: str = typer.Option(None, "--endpoint", help="Benchmark this running server (serve.endpoint=URL)."),
) -> None:
    """6B: launch vLLM/SGLang/transformers serve at TP=N, drive a seeded load, write one scaling-table row."""
    extra = ([f"serve.tp={tp}"] if tp is not None else []) + ([f"serve.endpoint={endpoint}"] if endpoint else [])
    run("serve_bench", ctx.args + extra, multirun)


@app.command("fleet-bench", context_settings=OVERRIDES)
def fleet_bench(ctx: typer.Context) -> None:
    """Fleet simulator speed on one core: simulated requests/s for 1M-request traces (--requests, --scenarios, --engines)."""
    from phase6.fleet.bench import main as bench_main

    with one_line_errors():
        bench_main(flag_args("fleet-bench", ctx.args))


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print a table (timing goals live here).")
app.add_typer(bench_app, name="bench")


@bench_app.command("pretrain", context_settings=OVERRIDES, add_help_option=False)
def bench_pretrain(ctx: typer.Context) -> None:
    """6A step throughput: phase6 GPT vs HF GPT2LMHeadModel on one GPU, 2-GPU DDP/FSDP2 scaling (flags: --help)."""
    from phase6.bench.pretrain import main as bench_main

    with one_line_errors():
        bench_main(flag_args("bench pretrain", ctx.args))


@bench_app.command("loss-parity", context_settings=OVERRIDES, add_help_option=False)
def bench_loss_parity(ctx: typer.Context) -> None:
    """6A numerics levers: val-loss curves of pretrain runs grouped by their numerics vs the default seeds (--help)."""
    from phase6.bench.loss_parity import main as parity_main

    with one_line_errors():
        parity_main(flag_args("bench loss-parity", ctx.args))


@app.command("config", context_settings=OVERRIDES)
def config_cmd(ctx: typer.Context, job: str = typer.Argument(..., help="job name, e.g. pretrain")) -> None:
    """Print the resolved and validated config of JOB with the given overrides."""
    from omegaconf import OmegaConf

    from phase6.launch import compose, load_config
    from phase6.redact import redact

    job = job.replace("-", "_")
    try:
        load_config(job, ctx.args)
        cfg = compose(job, ctx.args)
    except ConfigError as e:
        fail(str(e))
    typer.echo(OmegaConf.to_yaml(OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=True)))))


@app.command()
def report(
    run_dirs: list[str] = typer.Argument(..., help="run directories"),
    out: str = typer.Option(None, "--out", help="where the merged table goes (default: <common>/report)"),
) -> None:
    """Rebuild results.md and plots of RUN_DIRS; with several, merge their rows into one comparison table."""
    from phase6.report import main as report_main

    with one_line_errors():
        report_main(run_dirs, out)


def exit_on_sigterm() -> None:
    """SIGTERM (a scheduler's preemption, ``timeout``, a cancelled job) ends phase6 as ``SystemExit(143)``, so the
    ``finally`` blocks and ``atexit`` handlers run: an engine phase6 launched is stopped with its whole process
    group instead of being orphaned holding the GPUs (seen on the H200: a killed serve-bench left SGLang with 124 GiB).
    Python's default for SIGTERM is to die at once, running neither."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> Any:
    exit_on_sigterm()
    return app(args=argv if argv is not None else sys.argv[1:], prog_name="phase6")


if __name__ == "__main__":
    main()
