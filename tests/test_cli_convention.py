"""One CLI convention (issue 27): every subcommand takes key=value and writes where run.dir says, or is one of the
README's listed exceptions; the argparse tools' --flag spellings keep working with a one-line note."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from phase6.cli import NOTES, app, flag_args
from phase6.config import CONFIG_DIR, JOBS

README = CONFIG_DIR.parent / "README.md"


def subcommands() -> list[str]:
    """Every `phase6` subcommand, nested groups as 'bench pretrain'."""
    root = typer.main.get_command(app)
    out = []
    for name, cmd in root.commands.items():
        sub = getattr(cmd, "commands", None)
        out += [f"{name} {s}" for s in sub] if sub else [name]
    return out


def test_every_subcommand_is_a_hydra_job_or_a_listed_exception() -> None:
    table = README.read_text().split("The exceptions, exactly:", 1)[1].split("\n\n", 2)[1]
    exceptions = {
        x for row in table.splitlines()[2:] for x in re.findall(r"`([a-z-]+(?: [a-z-]+)?)", row.split("|")[1])
    }
    exceptions |= {"plan calibrate", "plan validate"}  # subcommands of `plan` (a Hydra job) by their first argument
    for name in subcommands():
        is_job = name.replace("-", "_") in JOBS
        assert is_job or name in exceptions, f"phase6 {name}: neither a Hydra job nor in the README's exceptions"


def test_flag_args_maps_key_value_to_the_tools_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run.dir=/r", "cases=c.yaml", "json=true", "quiet=false", "nproc_per_node=8", "runs/a=b"]
    assert flag_args("t", args, "--out={}") == [
        "--out=/r",
        "--cases=c.yaml",
        "--json",
        "--nproc-per-node=8",
        "runs/a=b",
    ]
    assert capsys.readouterr().err == "" and not NOTES
    with pytest.raises(ValueError, match=r"^run\.dir: fleet-bench writes no run directory"):
        flag_args("fleet-bench", ["run.dir=/r"])


def phase6(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phase6", *args], capture_output=True, text=True, timeout=120)


def test_plan_validate_takes_run_dir_and_its_old_out_flag(tmp_path: Path) -> None:
    new = phase6("plan", "validate", f"run.dir={tmp_path / 'a'}")
    assert new.returncode == 0, new.stderr
    assert new.stdout.strip().splitlines()[-1] == f"run dir: {tmp_path / 'a'}"
    assert json.loads((tmp_path / "a" / "results.json").read_text())["job"] == "plan_validate"
    assert "note" not in new.stderr
    old = phase6("plan", "validate", "--out", str(tmp_path / "b"))
    assert old.returncode == 0 and (tmp_path / "b" / "results.json").is_file(), old.stderr
    notes = [line for line in old.stderr.splitlines() if line.startswith("phase6: note:")]
    assert len(notes) == 1 and "run.dir=X" in notes[0], old.stderr
